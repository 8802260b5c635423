//! What the agent's layer holds, read without following a link: its entries (files it wrote,
//! whiteouts for what it removed, opaque directories it replaced), and the refs as its view
//! holds them, its loose refs over the repository's over the packed ones.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::{FileTypeExt, MetadataExt};

use camino::{Utf8Path, Utf8PathBuf};
use crew_core::fsutil::read_nofollow;
use git2::Oid;

/// One entry of the layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Layer {
    /// A file (or a link) the agent wrote.
    File,
    /// What the agent removed (a whiteout: a character device 0/0).
    Removed,
    /// A directory the agent removed and made again: nothing beneath it in the repository
    /// shows through.
    Replaced,
}

/// The refs as the agent's view holds them: its layer's loose refs over the repository's (but
/// those it removed, or hid by replacing a directory), over the packed refs (its layer's, once
/// it rewrote them).
pub(super) struct View<'a> {
    real: &'a Utf8Path,
    upper: &'a Utf8Path,
    layer: BTreeMap<Utf8PathBuf, Layer>,
    packed: BTreeMap<String, Oid>,
}

impl<'a> View<'a> {
    pub(super) fn of(real: &'a Utf8Path, upper: &'a Utf8Path) -> Self {
        let layer: BTreeMap<Utf8PathBuf, Layer> = layer_entries(upper).into_iter().collect();
        let packed_path = Utf8Path::new("packed-refs");
        let packed = match layer.get(packed_path) {
            Some(Layer::File) => packed_refs(&upper.join(packed_path)),
            Some(Layer::Removed | Layer::Replaced) => BTreeMap::new(),
            // Not read unless the agent touched a ref.
            None if layer.keys().any(|path| path.starts_with("refs")) => {
                packed_refs(&real.join(packed_path))
            }
            None => BTreeMap::new(),
        };
        View {
            real,
            upper,
            layer,
            packed,
        }
    }

    /// The refs the agent wrote, removed, or hid (beneath a directory it replaced, or in the
    /// packed refs it rewrote).
    pub(super) fn touched(&self) -> BTreeSet<String> {
        let mut names = BTreeSet::new();
        for (path, kind) in &self.layer {
            if !path.starts_with("refs") {
                continue;
            }
            match kind {
                Layer::File | Layer::Removed => {
                    names.insert(path.to_string());
                    if *kind == Layer::Removed {
                        names.extend(self.beneath(path));
                    }
                }
                Layer::Replaced => names.extend(self.beneath(path)),
            }
        }
        if self.layer.contains_key(Utf8Path::new("packed-refs")) {
            names.extend(self.packed.keys().cloned());
            names.extend(packed_refs(&self.real.join("packed-refs")).into_keys());
        }
        names
    }

    /// The repository's refs beneath `path`, loose and packed.
    pub(super) fn beneath(&self, path: &Utf8Path) -> Vec<String> {
        let mut names: Vec<String> = layer_entries(&self.real.join(path))
            .into_iter()
            .filter(|(_, kind)| *kind == Layer::File)
            .map(|(relative, _)| path.join(relative).to_string())
            .collect();
        let prefix = format!("{path}/");
        names.extend(
            packed_refs(&self.real.join("packed-refs"))
                .into_keys()
                .filter(|name| name.starts_with(&prefix)),
        );
        names
    }

    /// What `name` names in the view (`None`: no ref there, or a symbolic one).
    pub(super) fn value(&self, name: &str) -> Option<Oid> {
        let path = Utf8Path::new(name);
        if self.layer.get(path) == Some(&Layer::File) {
            return read_ref(&self.upper.join(path));
        }
        // A loose ref of the repository's, unless the agent removed it or a directory above.
        let hidden = path.ancestors().any(|prefix| match self.layer.get(prefix) {
            Some(Layer::Removed) => true,
            Some(Layer::Replaced) => prefix != path,
            _ => false,
        });
        if !hidden && let Some(id) = read_ref(&self.real.join(path)) {
            return Some(id);
        }
        self.packed.get(name).copied()
    }
}

/// A `packed-refs` file's refs (its peeled lines left out).
pub(super) fn packed_refs(path: &Utf8Path) -> BTreeMap<String, Oid> {
    let Ok(bytes) = read_nofollow(path) else {
        return BTreeMap::new();
    };
    String::from_utf8_lossy(&bytes)
        .lines()
        .filter(|line| !line.starts_with('#') && !line.starts_with('^'))
        .filter_map(|line| {
            let (id, name) = line.split_once(' ')?;
            Some((name.to_owned(), Oid::from_str(id).ok()?))
        })
        .collect()
}

/// A ref file's commit: `None` for a symbolic ref or anything else.
pub(super) fn read_ref(path: &Utf8Path) -> Option<Oid> {
    let bytes = read_nofollow(path).ok()?;
    Oid::from_str(std::str::from_utf8(&bytes).ok()?.trim()).ok()
}

/// Every entry of an overlay's upper layer beneath `root`, relative to it, never through a
/// link: files and links the agent wrote, what it removed (whiteouts), and directories it
/// replaced (opaque: nothing beneath them in the lower layer shows, and their own entries
/// follow).
pub(super) fn layer_entries(root: &Utf8Path) -> Vec<(Utf8PathBuf, Layer)> {
    let mut entries = Vec::new();
    let mut stack = vec![Utf8PathBuf::new()];
    while let Some(relative) = stack.pop() {
        let Ok(read) = root.join(&relative).read_dir_utf8() else {
            continue;
        };
        for entry in read.flatten() {
            let path = relative.join(entry.file_name());
            let Ok(metadata) = std::fs::symlink_metadata(entry.path()) else {
                continue;
            };
            let kind = metadata.file_type();
            if kind.is_dir() {
                if is_opaque(entry.path()) {
                    entries.push((path.clone(), Layer::Replaced));
                }
                stack.push(path);
            } else if kind.is_char_device() && metadata.rdev() == 0 {
                entries.push((path, Layer::Removed));
            } else {
                entries.push((path, Layer::File));
            }
        }
    }
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    entries
}

/// Whether an upper layer's directory is opaque (`userxattr` overlays mark it in `user.`).
pub(super) fn is_opaque(path: &Utf8Path) -> bool {
    let mut value = [0u8; 1];
    rustix::fs::lgetxattr(path.as_std_path(), "user.overlay.opaque", &mut value)
        .is_ok_and(|length| length == 1 && value[0] == b'y')
}
