//! What a confined agent sees of the directories that are not the system's: each covered by
//! a small empty file system, and beneath it only the places the agent may reach, bound back
//! (see [`PartialView`]). Worked out on the host at each start, from as few system calls as
//! the answer allows: a start's cost is the user's wait.

use camino::{Utf8Path, Utf8PathBuf};

/// The top-level directories of the machine that hold its programs, libraries and
/// configuration (and the kernel's own), which an agent sees whole. Every other directory at
/// the top (`/home`, `/root`, `/srv`, `/mnt`, `/tmp`, a `/work` or `/data` of the user's) is
/// seen only in part: what the agent may reach beneath it (see [`PartialView`]).
const SYSTEM_DIRECTORIES: &[&str] = &[
    "bin", "boot", "dev", "etc", "lib", "lib32", "lib64", "libx32", "opt", "proc", "run", "sbin",
    "sys", "usr", "var", "nix", "snap", "gnu",
];

/// Whether `path` lies in one of the system's top-level directories, which an agent sees
/// whole (see [`partial_directories`]; the home, where it lies there, is seen in part all the
/// same).
pub fn in_system(path: &Utf8Path) -> bool {
    path.components()
        .nth(1)
        .is_some_and(|top| SYSTEM_DIRECTORIES.contains(&top.as_str()))
}

/// The directories a confined agent sees only in part, outermost first: every top-level one
/// that is not the system's, and the user's `home` (DESIGN §8a: an agent reads its workspace,
/// the repository, the system's programs and libraries, and what its definition names; the
/// rest of the home and other projects are not there for it).
pub fn partial_directories(home: Option<&Utf8Path>) -> Vec<Utf8PathBuf> {
    let mut dirs = top_directories();
    if let Some(home) = home.and_then(resolve) {
        dirs.push(home);
    }
    dirs.sort();
    dirs.dedup();
    dirs
}

/// The top-level directories that are not the system's, read again only when `/` has changed
/// since they were (see [`Unchanged`]): every start asks, few starts see a change.
fn top_directories() -> Vec<Utf8PathBuf> {
    static LAST: std::sync::Mutex<Option<(Unchanged, Vec<Utf8PathBuf>)>> =
        std::sync::Mutex::new(None);
    // Taken before the listing: a change made while it is read leaves a key the next start
    // no longer matches.
    let key = std::fs::metadata("/")
        .ok()
        .and_then(|root| Unchanged::of(&root));
    let mut last = LAST
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let (Some(key), Some((seen, dirs))) = (&key, last.as_ref())
        && seen == key
    {
        return dirs.clone();
    }
    let dirs: Vec<Utf8PathBuf> = Utf8Path::new("/")
        .read_dir_utf8()
        .map(|listing| {
            listing
                .flatten()
                .filter(|entry| entry.file_type().is_ok_and(|kind| kind.is_dir()))
                .filter(|entry| !SYSTEM_DIRECTORIES.contains(&entry.file_name()))
                .map(|entry| entry.into_path())
                .collect()
        })
        .unwrap_or_default();
    *last = key.map(|key| (key, dirs.clone()));
    dirs
}

/// A directory as it was when crew last read it: what was read then still holds while these
/// are the same. A directory's change times move with every entry made, removed or renamed in
/// it; but a kernel may stamp them only to its clock's tick (a few milliseconds), so a change
/// within the tick of the last one could leave them as they were: a directory changed less
/// than [`Unchanged::SETTLED`] ago has no key, and is read again at every start until it has
/// settled.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Unchanged {
    dev: u64,
    ino: u64,
    modified: (i64, i64),
    changed: (i64, i64),
}

impl Unchanged {
    const SETTLED: std::time::Duration = std::time::Duration::from_millis(200);

    fn of(metadata: &std::fs::Metadata) -> Option<Unchanged> {
        use std::os::unix::fs::MetadataExt;
        let key = Unchanged {
            dev: metadata.dev(),
            ino: metadata.ino(),
            modified: (metadata.mtime(), metadata.mtime_nsec()),
            changed: (metadata.ctime(), metadata.ctime_nsec()),
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .ok()?;
        let settled = |(seconds, nanos): (i64, i64)| {
            let at =
                std::time::Duration::new(u64::try_from(seconds).ok()?, u32::try_from(nanos).ok()?);
            Some(at + Unchanged::SETTLED < now)
        };
        (settled(key.modified)? && settled(key.changed)?).then_some(key)
    }
}

/// A directory as a confined agent sees it: a small empty file system over it, read-only,
/// and beneath it only what the agent may reach, each bound back from the directory beneath
/// the cover with the mounts beneath it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartialView {
    /// The directory, as the kernel names it (links resolved): what is covered.
    pub dir: Utf8PathBuf,
    /// What is there beneath it, relative to it, none beneath another.
    pub kept: Vec<Kept>,
}

impl PartialView {
    /// Whether `path` is one of the places it binds back (a directory or a file, not a link).
    pub fn binds(&self, path: &Utf8Path) -> bool {
        path.strip_prefix(&self.dir).is_ok_and(|beneath| {
            self.kept.iter().any(|kept| match kept {
                Kept::Directory(place) | Kept::File(place) => place == beneath,
                Kept::Link(..) => false,
            })
        })
    }

    /// Whether `path` is gone from the agent's namespace with this view: beneath its
    /// directory and on none of its places (nor through a link it makes again, which may lead
    /// anywhere).
    pub fn hides(&self, path: &Utf8Path) -> bool {
        path.strip_prefix(&self.dir).is_ok_and(|beneath| {
            !beneath.as_str().is_empty()
                && !self.kept.iter().any(|kept| match kept {
                    Kept::Directory(place) | Kept::File(place) | Kept::Link(place, _) => {
                        beneath.starts_with(place)
                    }
                })
        })
    }

    /// Its places as absolute paths, for the record.
    pub fn places(&self) -> Vec<Utf8PathBuf> {
        self.kept
            .iter()
            .map(|kept| match kept {
                Kept::Directory(path) | Kept::File(path) | Kept::Link(path, _) => {
                    self.dir.join(path)
                }
            })
            .collect()
    }
}

/// One place of a [`PartialView`], relative to its directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kept {
    /// A directory, bound back with what is mounted beneath it.
    Directory(Utf8PathBuf),
    /// A file, bound back.
    File(Utf8PathBuf),
    /// A link made again as it was (`~/.cargo` → `/data/cargo`), and where it leads.
    Link(Utf8PathBuf, Utf8PathBuf),
}

/// Where `path` leads, links resolved, as the kernel names it: opened (`O_PATH`) and named
/// by its descriptor, three calls where resolving it a part at a time (`realpath(3)`) costs a
/// call for each part; `None` where it is not there.
pub(super) fn resolve(path: &Utf8Path) -> Option<Utf8PathBuf> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH)
        .open(path)
        .ok()?;
    let named = std::fs::read_link(format!("/proc/self/fd/{}", opened.as_raw_fd())).ok()?;
    let named = Utf8PathBuf::from_path_buf(named).ok()?;
    // A path the kernel cannot name from the root (a deleted directory) is not there.
    named.is_absolute().then_some(named)
}

/// Where paths lead, links resolved, as the kernel names them (see [`resolve`]): each part
/// of a path looked at once (`lstat`) and remembered for the paths after it, so that the
/// twenty places of an agent beneath four directories cost a call each; a link, or a path
/// not plainly absolute, is resolved whole.
#[derive(Default)]
struct Places {
    seen: std::collections::HashMap<Utf8PathBuf, Option<Place>>,
}

/// Where a path leads, and what is there.
#[derive(Clone)]
struct Place {
    path: Utf8PathBuf,
    metadata: std::fs::Metadata,
}

impl Places {
    fn place(&mut self, path: &Utf8Path) -> Option<Place> {
        if let Some(known) = self.seen.get(path) {
            return known.clone();
        }
        let plain = path.is_absolute()
            && path
                .components()
                .skip(1)
                .all(|part| matches!(part, camino::Utf8Component::Normal(_)));
        let whole = |path: &Utf8Path| {
            let place = resolve(path)?;
            let metadata = std::fs::metadata(&place).ok()?;
            Some(Place {
                path: place,
                metadata,
            })
        };
        let found = match (path.parent(), path.file_name()) {
            (Some(parent), Some(name)) if plain => self
                .place(parent)
                .filter(|parent| parent.metadata.is_dir())
                .and_then(|parent| {
                    let metadata = std::fs::symlink_metadata(path).ok()?;
                    match metadata.is_symlink() {
                        true => whole(path),
                        false => Some(Place {
                            path: parent.path.join(name),
                            metadata,
                        }),
                    }
                }),
            _ => whole(path),
        };
        self.seen.insert(path.to_owned(), found.clone());
        found
    }
}

/// Whether the directory `place` holds anything: its first entries read into a small buffer
/// (a `/tmp` of thousands of entries is not read whole to learn that it holds one), and the
/// answer kept for the next start while the directory is [`Unchanged`].
fn holds_something(place: &Place) -> bool {
    type Seen = std::collections::HashMap<Utf8PathBuf, (Unchanged, bool)>;
    static SEEN: std::sync::Mutex<Option<Seen>> = std::sync::Mutex::new(None);
    let key = Unchanged::of(&place.metadata);
    let mut seen = SEEN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let seen = seen.get_or_insert_with(Default::default);
    if let (Some(key), Some((known, holds))) = (&key, seen.get(&place.path))
        && known == key
    {
        return *holds;
    }
    let holds = first_entry(&place.path);
    match key {
        Some(key) => seen.insert(place.path.clone(), (key, holds)),
        None => seen.remove(&place.path),
    };
    holds
}

/// Whether the directory `dir` has an entry other than `.` and `..`.
fn first_entry(dir: &Utf8Path) -> bool {
    use rustix::fs::{Mode, OFlags, RawDir};
    let Ok(opened) = rustix::fs::open(
        dir.as_std_path(),
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) else {
        return false;
    };
    let mut buffer = [std::mem::MaybeUninit::uninit(); 1024];
    let mut entries = RawDir::new(&opened, &mut buffer);
    while let Some(entry) = entries.next() {
        match entry {
            Ok(entry) if matches!(entry.file_name().to_bytes(), b"." | b"..") => continue,
            // An entry too long for the buffer is an entry all the same.
            Ok(_) | Err(rustix::io::Errno::INVAL) => return true,
            Err(_) => return false,
        }
    }
    false
}

/// The views of `dirs` (see [`partial_directories`]) for an agent that may reach `reach`
/// (its reads, its writes, its read-only places, its views). A directory within what it may
/// reach (a project at the home itself) is not covered, nor an empty one (nothing to hide);
/// one of `dirs` within another is kept in the outer one's view, to be covered in its turn.
///
/// Each place is taken where the kernel finds it (links resolved) and kept there; one given
/// through a link (`~/.cargo` → `~/dotfiles/cargo`) gets that link too. A place that is not
/// there is left out: a mount needs something to bind. Each path is resolved once, whatever
/// the number of directories.
pub fn partial_views(dirs: &[Utf8PathBuf], reach: &[Utf8PathBuf]) -> Vec<PartialView> {
    let mut places = Places::default();
    // Each path as given, where it leads, and whether a directory is there.
    let resolved: Vec<(&Utf8PathBuf, Utf8PathBuf, bool)> = reach
        .iter()
        .filter_map(|path| {
            let place = places.place(path)?;
            Some((path, place.path, place.metadata.is_dir()))
        })
        .collect();
    // A directory holding one of those holds something; only the others are read.
    let dirs: Vec<Utf8PathBuf> = dirs
        .iter()
        .filter_map(|dir| places.place(dir))
        .filter(|dir| {
            dir.metadata.is_dir()
                && (resolved
                    .iter()
                    .any(|(_, place, _)| place.starts_with(&dir.path) && *place != dir.path)
                    || holds_something(dir))
        })
        .map(|place| place.path)
        .filter(|dir| dir.parent().is_some())
        .collect();
    dirs.iter()
        .filter(|dir| !resolved.iter().any(|(_, place, _)| dir.starts_with(place)))
        .map(|dir| {
            let inner = dirs
                .iter()
                .filter(|other| other.starts_with(dir) && *other != dir)
                .map(|inner| (inner, inner.clone(), true));
            let mut kept: Vec<Kept> = Vec::new();
            for (given, place, is_dir) in resolved
                .iter()
                .map(|(given, place, is_dir)| (*given, place.clone(), *is_dir))
                .chain(inner)
            {
                // Given through a link beneath the directory, as the agent will name it.
                if given != &place
                    && let Ok(beneath) = given.strip_prefix(dir)
                    && std::fs::symlink_metadata(given).is_ok_and(|metadata| metadata.is_symlink())
                    && let Ok(target) = given.read_link_utf8()
                {
                    kept.push(Kept::Link(beneath.to_owned(), target));
                }
                if let Ok(beneath) = place.strip_prefix(dir) {
                    kept.push(match is_dir {
                        true => Kept::Directory(beneath.to_owned()),
                        false => Kept::File(beneath.to_owned()),
                    });
                }
            }
            PartialView {
                dir: dir.clone(),
                kept: outermost(kept),
            }
        })
        .collect()
}

/// `kept` sorted, none twice, and none within a directory kept: it is there with it, and a
/// second mount on the way would be made inside that directory, which is the user's own.
fn outermost(mut kept: Vec<Kept>) -> Vec<Kept> {
    let path_of = |kept: &Kept| match kept {
        Kept::Directory(path) | Kept::File(path) | Kept::Link(path, _) => path.clone(),
    };
    let directories: Vec<Utf8PathBuf> = kept
        .iter()
        .filter_map(|kept| match kept {
            Kept::Directory(path) => Some(path.clone()),
            _ => None,
        })
        .collect();
    kept.retain(|place| {
        let path = path_of(place);
        !directories
            .iter()
            .any(|directory| path.starts_with(directory) && path != *directory)
    });
    kept.sort_by_key(path_of);
    kept.dedup_by_key(|place| path_of(place));
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utf8(path: &std::path::Path) -> Utf8PathBuf {
        Utf8PathBuf::from_path_buf(path.to_owned()).unwrap()
    }

    #[test]
    fn places_are_resolved_through_a_link_at_any_part() {
        let temp = tempfile::tempdir().unwrap();
        let root = resolve(&utf8(temp.path())).unwrap();
        std::fs::create_dir_all(root.join("real/sub")).unwrap();
        std::fs::write(root.join("real/sub/file"), "x").unwrap();
        std::os::unix::fs::symlink(root.join("real"), root.join("link")).unwrap();
        let mut places = Places::default();
        let through = places.place(&root.join("link/sub/file")).unwrap();
        assert_eq!(through.path, root.join("real/sub/file"));
        assert!(through.metadata.is_file());
        let dir = places.place(&root.join("link/sub")).unwrap();
        assert_eq!(dir.path, root.join("real/sub"));
        assert!(dir.metadata.is_dir());
        // Not plainly absolute: resolved whole, as the kernel does.
        let dotted = places.place(&root.join("real/sub/../sub/file")).unwrap();
        assert_eq!(dotted.path, root.join("real/sub/file"));
        assert!(places.place(&root.join("link/missing")).is_none());
        // Each agrees with the kernel's own answer.
        for path in ["link/sub/file", "link/sub", "real/sub/../sub/file"] {
            assert_eq!(
                places.place(&root.join(path)).map(|place| place.path),
                resolve(&root.join(path)),
                "{path}"
            );
        }
    }

    #[test]
    fn a_directory_filled_after_it_was_seen_empty_is_seen_holding_it() {
        let temp = tempfile::tempdir().unwrap();
        let dir = resolve(&utf8(temp.path())).unwrap().join("d");
        std::fs::create_dir(&dir).unwrap();
        let place = |dir: &Utf8Path| Places::default().place(dir).unwrap();
        assert!(!holds_something(&place(&dir)));
        // Within the clock's tick of the last change and long after it: seen at once.
        std::fs::write(dir.join("secret"), "x").unwrap();
        assert!(holds_something(&place(&dir)));
        std::fs::remove_file(dir.join("secret")).unwrap();
        assert!(!holds_something(&place(&dir)));
        std::thread::sleep(Unchanged::SETTLED * 2);
        assert!(!holds_something(&place(&dir)));
        std::fs::write(dir.join("secret"), "x").unwrap();
        assert!(holds_something(&place(&dir)));
        // A settled directory's answer is kept: the same key, the same answer.
        std::thread::sleep(Unchanged::SETTLED * 2);
        let settled = place(&dir);
        assert!(Unchanged::of(&settled.metadata).is_some());
        assert!(holds_something(&settled));
        assert!(holds_something(&settled));
    }

    #[test]
    fn a_view_keeps_its_places_and_hides_the_rest() {
        let temp = tempfile::tempdir().unwrap();
        let root = resolve(&utf8(temp.path())).unwrap();
        let (home, empty, other) = (root.join("home"), root.join("empty"), root.join("other"));
        for dir in [
            home.join(".cargo/bin"),
            home.join("dotfiles/config"),
            empty.clone(),
            other.join("x"),
        ] {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(home.join(".netrc"), "secret").unwrap();
        std::os::unix::fs::symlink(home.join("dotfiles/config"), home.join(".config")).unwrap();
        let views = partial_views(
            &[home.clone(), empty.clone(), other.clone()],
            &[
                home.join(".cargo/bin"),
                home.join(".cargo"),
                home.join(".config"),
            ],
        );
        // The empty directory has nothing to hide; the other one hides all it holds.
        assert_eq!(views.len(), 2, "{views:#?}");
        let view = views.iter().find(|view| view.dir == home).unwrap();
        assert_eq!(
            view.kept,
            [
                Kept::Directory(".cargo".into()),
                Kept::Link(".config".into(), home.join("dotfiles/config")),
                Kept::Directory("dotfiles/config".into()),
            ]
        );
        assert!(view.binds(&home.join(".cargo")));
        assert!(!view.binds(&home.join(".cargo/bin")));
        assert!(view.hides(&home.join(".netrc")));
        assert!(view.hides(&home.join("dotfiles/other")));
        assert!(!view.hides(&home.join(".cargo/credentials.toml")));
        assert!(!view.hides(&home.join(".config/gh")));
        assert!(!view.hides(&home));
        assert!(!view.hides(&other.join("x")));
        let other = views.iter().find(|view| view.dir == other).unwrap();
        assert!(other.kept.is_empty());
    }
}
