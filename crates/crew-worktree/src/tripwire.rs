//! The tripwire on what git runs or trusts on the user's behalf (ARCHITECTURE.md, "Agents are
//! untrusted").
//!
//! An agent that could write the shared git directory (its sandbox off or unsupported, or a
//! `single` task working in the leader itself) could plant a command there: `core.fsmonitor` in
//! `config` runs on the user's next `git status`, a `hooks/post-merge` on the `git merge` crew
//! suggests, `objects/info/alternates` feeds objects from elsewhere. So while tasks of a
//! repository run, crew keeps a copy of those files as they were before the first task started:
//!
//! - `config`, `objects/info/alternates`, everything under `hooks/` and `info/`;
//! - each submodule's `config` and `hooks/`, in `modules/` (the user's `git status` runs what
//!   they say too);
//! - each worktree task's own `config.worktree`.
//!
//! When a task ends, whatever differs is put back from the copy, the version the agent left is
//! kept under the task's state directory (nothing is lost, a change the user made meanwhile
//! included), and each change is reported as a security finding on the task.
//!
//! The copy is also written beside each run that armed it (`runs/<run>/tripwire.json`) while the
//! run's tasks are active: after its host is killed, `crew runs resume` and `crew runs clean`
//! check against the copy from before the agents, not against what an agent planted since.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;

use camino::{Utf8Path, Utf8PathBuf};
use crew_core::fsutil::{read_nofollow, write_atomic};
use crew_core::provider::SecurityFinding;
use serde::{Deserialize, Serialize};

/// Files directly watched, relative to the common git directory.
const WATCHED_FILES: &[&str] = &["config", "objects/info/alternates"];
/// Directories whose whole content is watched.
const WATCHED_DIRS: &[&str] = &["hooks", "info"];

/// One watched file as it was.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Entry {
    File {
        #[serde(with = "contents")]
        contents: Vec<u8>,
        mode: u32,
    },
    Link {
        target: Utf8PathBuf,
    },
}

/// A file's contents as the saved copy holds them: as text when they are (configs and hooks
/// are), else as bytes.
mod contents {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize, Deserialize)]
    #[serde(untagged)]
    enum Contents {
        Text(String),
        Bytes(Vec<u8>),
    }

    pub fn serialize<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        match std::str::from_utf8(bytes) {
            Ok(text) => Contents::Text(text.to_owned()),
            Err(_) => Contents::Bytes(bytes.to_vec()),
        }
        .serialize(serializer)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
        Ok(match Contents::deserialize(deserializer)? {
            Contents::Text(text) => text.into_bytes(),
            Contents::Bytes(bytes) => bytes,
        })
    }
}

/// The watched files of a repository (and of one worktree task), as they were.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Baseline {
    /// Keyed by absolute path; a path absent from the map did not exist.
    entries: BTreeMap<Utf8PathBuf, Entry>,
    /// The common git directory.
    common: Utf8PathBuf,
    /// The repository's refs and what each named, recorded once an unconfined agent is about
    /// to start (a confined one cannot write them): see [`Baseline::check_refs`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    refs: Option<BTreeMap<String, String>>,
    /// The object store as it was then, recorded with the refs: see
    /// [`Baseline::check_objects`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    objects: Option<ObjectsRecord>,
}

/// What an unconfined agent could rewrite of the object store: the loose objects whose file
/// changed since `since` are checked against their names, and each pack file that was there is
/// known by its identity (git never writes a pack over one of the same name).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct ObjectsRecord {
    /// When it was recorded (or last checked), as seconds and nanoseconds since the epoch.
    since: (i64, i64),
    /// Each pack file (`pack-<hash>.pack`) by its inode, size and change time.
    packs: BTreeMap<String, (u64, u64, i64, i64)>,
}

impl ObjectsRecord {
    fn now(common: &Utf8Path) -> Self {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        ObjectsRecord {
            since: (
                i64::try_from(now.as_secs()).unwrap_or(i64::MAX),
                i64::from(now.subsec_nanos()),
            ),
            packs: packs_of(common),
        }
    }
}

/// The pack files of the object store of `common`, by identity.
fn packs_of(common: &Utf8Path) -> BTreeMap<String, (u64, u64, i64, i64)> {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = common.join("objects/pack").read_dir_utf8() else {
        return BTreeMap::new();
    };
    entries
        .flatten()
        .filter(|entry| entry.file_name().ends_with(".pack"))
        .filter_map(|entry| {
            let metadata = entry.path().symlink_metadata().ok()?;
            Some((
                entry.file_name().to_owned(),
                (
                    metadata.ino(),
                    metadata.size(),
                    metadata.ctime(),
                    metadata.ctime_nsec(),
                ),
            ))
        })
        .collect()
}

/// Which of the loose object files `candidates` do not hold the object their name says: each
/// read by itself (an object store of those files alone, so that a pack holding the same object
/// cannot answer for it), inflated and hashed by libgit2, which refuses an object whose content
/// is not its name. A file that cannot be read as an object is one of them.
fn forged_loose_objects(
    candidates: Vec<(Utf8PathBuf, git2::Oid)>,
) -> Vec<(Utf8PathBuf, git2::Oid)> {
    if candidates.is_empty() {
        return candidates;
    }
    let Ok(dir) = tempfile::tempdir() else {
        // Nowhere to look at them alone: none is said to be forged.
        return Vec::new();
    };
    let Some(objects) = dir.path().to_str() else {
        return Vec::new();
    };
    let mut forged = Vec::new();
    let mut copied = Vec::new();
    for (path, oid) in candidates {
        let hex = oid.to_string();
        let fan = dir.path().join(&hex[..2]);
        // Opened with no link followed and without waiting: a link or a FIFO in its place
        // (never git's) holds no object, and whatever a link names is not read.
        let copy = std::fs::create_dir_all(&fan).and_then(|()| {
            let object = rustix::fs::open(
                path.as_std_path(),
                rustix::fs::OFlags::RDONLY
                    | rustix::fs::OFlags::NOFOLLOW
                    | rustix::fs::OFlags::NONBLOCK
                    | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )?;
            let mut object = std::fs::File::from(object);
            let mut copied = std::fs::File::create(fan.join(&hex[2..]))?;
            std::io::copy(&mut object, &mut copied)
        });
        match copy {
            Ok(_) => copied.push((path, oid)),
            Err(_) => forged.push((path, oid)),
        }
    }
    let Ok(odb) = git2::Odb::new().and_then(|odb| odb.add_disk_alternate(objects).map(|()| odb))
    else {
        return Vec::new();
    };
    for (path, oid) in copied {
        let holds = odb.read(oid).is_ok_and(|object| {
            git2::Oid::hash_object(object.kind(), object.data()).is_ok_and(|hashed| hashed == oid)
        });
        if !holds {
            forged.push((path, oid));
        }
    }
    forged
}

impl Baseline {
    /// Records the repository's refs, unless they are recorded already (the first unconfined
    /// agent's start: none before it could have changed them).
    pub fn record_refs(&mut self, repo: &git2::Repository) -> bool {
        if self.refs.is_some() {
            return false;
        }
        self.refs = Some(direct_refs(repo));
        self.objects = Some(ObjectsRecord::now(&self.common));
        true
    }

    /// What an unconfined agent may have rewritten of the object store since it was recorded:
    /// each loose object whose file changed since and no longer holds what its name says (the
    /// user's git would read the agent's content for it) is moved to `evidence` and reported,
    /// so that git refuses the missing object rather than hand out the forged one; each pack
    /// file written over in place is reported. The record then moves to now, so that each is
    /// said once.
    pub fn check_objects(&mut self, evidence: &Utf8Path) -> Vec<SecurityFinding> {
        use std::os::unix::fs::MetadataExt;
        let Some(record) = &mut self.objects else {
            return Vec::new();
        };
        let checked = ObjectsRecord::now(&self.common);
        let objects = self.common.join("objects");
        let mut findings = Vec::new();
        let mut candidates = Vec::new();
        let fans = objects.read_dir_utf8().into_iter().flatten().flatten();
        for fan in fans.filter(|fan| {
            fan.file_name().len() == 2 && fan.file_name().bytes().all(|b| b.is_ascii_hexdigit())
        }) {
            for entry in fan.path().read_dir_utf8().into_iter().flatten().flatten() {
                let Ok(metadata) = entry.path().symlink_metadata() else {
                    continue;
                };
                // Status changed since (a second's slack for coarse clocks): written, rewritten
                // or freshened meanwhile. What was there before and untouched is as it was.
                if (metadata.ctime() + 1, metadata.ctime_nsec()) < record.since {
                    continue;
                }
                if let Ok(oid) =
                    git2::Oid::from_str(&format!("{}{}", fan.file_name(), entry.file_name()))
                {
                    candidates.push((entry.path().to_owned(), oid));
                }
            }
        }
        for (path, oid) in forged_loose_objects(candidates) {
            let saved = keep_evidence(&path, evidence);
            // What is not a file (a FIFO, on which the user's `git fsck` would wait) goes too.
            let regular = std::fs::symlink_metadata(&path).is_ok_and(|metadata| metadata.is_file());
            let moved_aside = (saved.is_some() || !regular) && std::fs::remove_file(&path).is_ok();
            findings.push(SecurityFinding {
                path,
                change: format!(
                    "rewritten: it no longer holds the object {oid} its name says, so git would read the agent's content for it{}",
                    if moved_aside {
                        "; moved aside (`git fsck` names what is missing; a file of your checkout that still holds it goes back with `git hash-object -w <file>`)"
                    } else {
                        ""
                    }
                ),
                restored: false,
                saved,
                on_branch: false,
            });
        }
        for (name, was) in &record.packs {
            let path = objects.join("pack").join(name);
            if let Some(now) = checked.packs.get(name)
                && now != was
            {
                let index = path.with_extension("idx");
                findings.push(SecurityFinding {
                    path,
                    change: format!(
                        "written over in place (git never does): `git verify-pack -v {index}` checks it"
                    ),
                    restored: false,
                    saved: None,
                    on_branch: false,
                });
            }
        }
        *record = checked;
        findings
    }

    /// Whether the refs are recorded.
    pub fn has_refs(&self) -> bool {
        self.refs.is_some()
    }

    /// Crew's own move of a ref (a task branch taken at teardown): the record follows it.
    pub fn note_ref(&mut self, repo: &git2::Repository, name: &str) {
        if let Some(refs) = &mut self.refs {
            match repo
                .find_reference(name)
                .ok()
                .and_then(|reference| reference.target())
            {
                Some(id) => refs.insert(name.to_owned(), id.to_string()),
                None => refs.remove(name),
            };
        }
    }

    /// The recorded refs an unconfined agent may have changed: each one deleted since, moved to
    /// where it no longer contains what it named, or moved forward (onto commits of the
    /// agent's, which the user's next merge would take in unseen). Reported, not put back — the
    /// user may have moved it meanwhile — with where it was, so that nothing is lost; the record
    /// then follows, so that it is said once. `own` are the refs tasks of the repository may
    /// move (their branches) and the checkout's branch, where the user's own commits go.
    pub fn check_refs(&mut self, repo: &git2::Repository, own: &[String]) -> Vec<SecurityFinding> {
        let Some(recorded) = &mut self.refs else {
            return Vec::new();
        };
        let now = direct_refs(repo);
        let mut findings = Vec::new();
        for (name, was) in recorded.iter() {
            if own.contains(name) {
                continue;
            }
            let change = match now.get(name) {
                Some(id) if id == was => continue,
                Some(id) => {
                    let forward = git2::Oid::from_str(id)
                        .ok()
                        .zip(git2::Oid::from_str(was).ok())
                        .is_some_and(|(id, was)| {
                            repo.graph_descendant_of(id, was).unwrap_or(false)
                        });
                    if forward {
                        format!("moved forward (from {was} to {id})")
                    } else {
                        format!("moved (from {was}, which it no longer holds)")
                    }
                }
                None => format!("deleted (it was at {was})"),
            };
            findings.push(SecurityFinding {
                path: self.common.join(name),
                change,
                restored: false,
                saved: None,
                on_branch: false,
            });
        }
        *recorded = now;
        findings
    }

    /// Reads the watched files of the repository whose common git directory is `common`.
    pub fn of_repository(common: &Utf8Path) -> Self {
        let mut baseline = Baseline {
            entries: BTreeMap::new(),
            common: common.to_owned(),
            refs: None,
            objects: None,
        };
        for path in baseline.watched_now(&[]) {
            baseline.add_file(&path);
        }
        baseline
    }

    /// Writes the copy to `path` (a run's `tripwire.json`).
    pub fn save(&self, path: &Utf8Path) -> Result<(), String> {
        let json = serde_json::to_vec(self).map_err(|error| error.to_string())?;
        write_atomic(path, &json).map_err(|error| error.to_string())
    }

    /// The copy saved at `path`, for the repository whose common git directory is `common`
    /// (one saved for another is not taken).
    pub fn load(path: &Utf8Path, common: &Utf8Path) -> Option<Self> {
        let bytes = read_nofollow(path).ok()?;
        let baseline: Baseline = serde_json::from_slice(&bytes).ok()?;
        (baseline.common == common).then_some(baseline)
    }

    /// Adds one more file to watch (a task's `config.worktree`), as it is now.
    pub fn add_file(&mut self, path: &Utf8Path) {
        if let Some(entry) = read_entry(path) {
            self.entries.insert(path.to_owned(), entry);
        } else {
            self.entries.remove(path);
        }
    }

    /// Every path this baseline watches now: its files, and whatever is under its directories.
    fn watched_now(&self, extra: &[Utf8PathBuf]) -> Vec<Utf8PathBuf> {
        let mut paths: Vec<Utf8PathBuf> = self.entries.keys().cloned().collect();
        paths.extend(WATCHED_FILES.iter().map(|file| self.common.join(file)));
        for dir in WATCHED_DIRS {
            paths.extend(files_under(&self.common.join(dir)));
        }
        // A submodule's git directory runs what its `config` and `hooks/` say on the user's
        // `git status` in the project, as the project's own do.
        for module in module_git_dirs(&self.common) {
            paths.push(module.join("config"));
            paths.extend(files_under(&module.join("hooks")));
        }
        paths.extend(extra.iter().cloned());
        paths.sort();
        paths.dedup();
        paths
    }

    /// Puts every watched file that changed back as it was; the changed version goes to
    /// `evidence` (keeping its path below `/` as its name). `extra` are files watched for this
    /// task only (absent from the baseline when they did not exist).
    pub fn restore(&self, extra: &[Utf8PathBuf], evidence: &Utf8Path) -> Vec<SecurityFinding> {
        let mut findings = Vec::new();
        for path in self.watched_now(extra) {
            let before = self.entries.get(&path);
            let now = read_entry(&path);
            if before == now.as_ref() {
                continue;
            }
            let change = match (before, &now) {
                (None, _) => "added",
                (Some(_), None) => "removed",
                (Some(_), Some(_)) => "modified",
            };
            let saved = now.as_ref().and_then(|_| keep_evidence(&path, evidence));
            let restored = match before {
                Some(entry) => put_back(&path, entry),
                None => std::fs::remove_file(&path).is_ok(),
            };
            findings.push(SecurityFinding {
                path,
                change: change.to_owned(),
                restored,
                saved,
                on_branch: false,
            });
        }
        findings
    }
}

/// Every ref of the repository that names an object, beneath `refs/`.
fn direct_refs(repo: &git2::Repository) -> BTreeMap<String, String> {
    repo.references()
        .map(|references| {
            references
                .flatten()
                .filter_map(|reference| {
                    Some((
                        reference.name().ok()?.to_owned(),
                        reference.target()?.to_string(),
                    ))
                })
                .filter(|(name, _)| name.starts_with("refs/"))
                .collect()
        })
        .unwrap_or_default()
}

/// The git directories of the repository's submodules, `<common>/modules/…`, nested ones too
/// (a name with `/` is a directory of directories): never through a link, and never into a git
/// directory's objects.
fn module_git_dirs(common: &Utf8Path) -> Vec<Utf8PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![common.join("modules")];
    while let Some(current) = stack.pop() {
        let Ok(read) = current.read_dir_utf8() else {
            continue;
        };
        for entry in read.flatten() {
            if !entry.file_type().is_ok_and(|kind| kind.is_dir()) {
                continue;
            }
            let dir = entry.into_path();
            if std::fs::symlink_metadata(dir.join("HEAD")).is_ok_and(|metadata| metadata.is_file())
            {
                stack.push(dir.join("modules"));
                found.push(dir);
            } else {
                stack.push(dir);
            }
        }
    }
    found
}

/// The regular files and links under `dir`, never through a link.
fn files_under(dir: &Utf8Path) -> Vec<Utf8PathBuf> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(current) = stack.pop() {
        let Ok(read) = current.read_dir_utf8() else {
            continue;
        };
        for entry in read.flatten() {
            match entry.file_type() {
                Ok(kind) if kind.is_dir() => stack.push(entry.into_path()),
                Ok(_) => files.push(entry.into_path()),
                Err(_) => {}
            }
        }
    }
    files
}

fn read_entry(path: &Utf8Path) -> Option<Entry> {
    let metadata = std::fs::symlink_metadata(path).ok()?;
    if metadata.file_type().is_symlink() {
        let target = std::fs::read_link(path).ok()?;
        return Some(Entry::Link {
            target: Utf8PathBuf::from_path_buf(target).ok()?,
        });
    }
    if !metadata.is_file() {
        return None;
    }
    Some(Entry::File {
        contents: crew_core::fsutil::read_nofollow(path).ok()?,
        mode: metadata.permissions().mode() & 0o7777,
    })
}

/// Copies what is at `path` now into `evidence`, never following a link.
fn keep_evidence(path: &Utf8Path, evidence: &Utf8Path) -> Option<Utf8PathBuf> {
    let target = evidence.join(path.as_str().trim_start_matches('/'));
    std::fs::create_dir_all(target.parent()?).ok()?;
    match read_entry(path)? {
        Entry::File { contents, .. } => write_atomic(&target, &contents).ok()?,
        Entry::Link { target: link } => {
            // Whatever was kept there before makes way; if it cannot, the symlink call fails.
            let _ = std::fs::remove_file(&target);
            std::os::unix::fs::symlink(&link, &target).ok()?;
        }
    }
    Some(target)
}

/// Writes `entry` back at `path`, replacing whatever is there (a link is replaced, never
/// written through).
fn put_back(path: &Utf8Path, entry: &Entry) -> bool {
    if std::fs::symlink_metadata(path).is_ok_and(|metadata| !metadata.is_file()) {
        let removed = std::fs::remove_file(path).is_ok() || std::fs::remove_dir_all(path).is_ok();
        if !removed {
            return false;
        }
    }
    if let Some(parent) = path.parent()
        && std::fs::create_dir_all(parent).is_err()
    {
        return false;
    }
    match entry {
        Entry::File { contents, mode } => {
            write_atomic(path, contents).is_ok()
                && std::fs::set_permissions(path, std::fs::Permissions::from_mode(*mode)).is_ok()
        }
        Entry::Link { target } => std::os::unix::fs::symlink(target, path).is_ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_are_put_back_and_kept_as_evidence() {
        let dir = tempfile::tempdir().unwrap();
        let common = Utf8PathBuf::from_path_buf(dir.path().join("git")).unwrap();
        let evidence = Utf8PathBuf::from_path_buf(dir.path().join("evidence")).unwrap();
        std::fs::create_dir_all(common.join("hooks")).unwrap();
        std::fs::write(common.join("config"), "[core]\n").unwrap();
        std::fs::write(common.join("hooks/pre-commit.sample"), "#!/bin/sh\n").unwrap();
        let baseline = Baseline::of_repository(&common);
        assert!(baseline.restore(&[], &evidence).is_empty());

        std::fs::write(common.join("config"), "[core]\nfsmonitor = evil\n").unwrap();
        std::fs::write(common.join("hooks/post-merge"), "evil\n").unwrap();
        std::fs::remove_file(common.join("hooks/pre-commit.sample")).unwrap();
        std::fs::create_dir_all(common.join("info")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", common.join("info/attributes")).unwrap();
        let mut findings = baseline.restore(&[], &evidence);
        findings.sort_by(|a, b| a.path.cmp(&b.path));
        let summary: Vec<(&str, &str, bool)> = findings
            .iter()
            .map(|finding| {
                (
                    finding.path.strip_prefix(&common).unwrap().as_str(),
                    finding.change.as_str(),
                    finding.restored,
                )
            })
            .collect();
        assert_eq!(
            summary,
            [
                ("config", "modified", true),
                ("hooks/post-merge", "added", true),
                ("hooks/pre-commit.sample", "removed", true),
                ("info/attributes", "added", true),
            ]
        );
        assert_eq!(
            std::fs::read_to_string(common.join("config")).unwrap(),
            "[core]\n"
        );
        assert!(!common.join("hooks/post-merge").exists());
        assert!(common.join("hooks/pre-commit.sample").exists());
        assert!(std::fs::symlink_metadata(common.join("info/attributes")).is_err());
        let saved = findings[0].saved.as_ref().unwrap();
        assert_eq!(
            std::fs::read_to_string(saved).unwrap(),
            "[core]\nfsmonitor = evil\n"
        );
        assert!(baseline.restore(&[], &evidence).is_empty());
    }
}
