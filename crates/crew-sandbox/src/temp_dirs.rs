//! An agent's private temp dir, and the sweep of those a dead host left behind.
//!
//! Each agent (and each terminal an ACP agent opens, and each `crew sandbox check` probe) gets
//! a directory of its own in the host's temp directory, mode 0700: its `TMPDIR` and
//! `XDG_RUNTIME_DIR`, removed when the host is done with it. A host that dies first (killed, a
//! crash, the machine's power) would leave it behind, with whatever the agent wrote there:
//! after a few months of such ends, gigabytes of package caches and build trees in `/tmp`.
//!
//! So the host holds a lock (`flock(2)`) on each dir for as long as it keeps it, and the
//! kernel lets go of the lock when the host dies, however it dies. The first host of a process
//! sweeps the temp directory on a thread of its own (no start waits for it): a dir of crew's
//! naming, owned by this user, not a symbolic link, unchanged for a minute (a dir is made a
//! moment before it is locked) and locked by nobody is a dead host's, and is removed.

use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, SystemTime};

use rustix::fs::{FlockOperation, Mode, OFlags};

/// What the names of crew's agent temp dirs begin with: `crew-tmp-<task>-<random>`.
const PREFIX: &str = "crew-tmp-";

/// How long an unlocked dir must have been left unchanged before a sweep takes it: far longer
/// than a host takes between making a dir and locking it.
const STALE_AFTER: Duration = Duration::from_secs(60);

/// An agent's private temp dir, removed when dropped, locked while it lives.
#[derive(Debug)]
pub struct AgentTempDir {
    dir: tempfile::TempDir,
    /// The dir opened and locked: the lock says a live host still has it. Dropped after the
    /// dir is removed (fields drop in order).
    _held: OwnedFd,
}

impl AgentTempDir {
    /// A new dir for `task` (a name safe as a path segment) in `base`.
    pub fn new(base: &Path, task: &str) -> io::Result<AgentTempDir> {
        let dir = tempfile::Builder::new()
            .prefix(&format!("{PREFIX}{task}-"))
            .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .tempdir_in(base)?;
        let held = open_dir(dir.path())?;
        rustix::fs::flock(&held, FlockOperation::NonBlockingLockExclusive)?;
        Ok(AgentTempDir { dir, _held: held })
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// Sweeps the process's temp directory once, on a thread of its own.
pub fn sweep_once() {
    static SWEPT: std::sync::Once = std::sync::Once::new();
    SWEPT.call_once(|| {
        let base = std::env::temp_dir();
        // Best effort: a process that cannot start a thread leaves the dirs for the next one.
        let _ = std::thread::Builder::new()
            .name("crew-tmp-sweep".into())
            .spawn(move || sweep(&base));
    });
}

/// Removes the agent temp dirs in `base` that no live host holds; how many it removed.
pub fn sweep(base: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(base) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        if !entry.file_name().as_bytes().starts_with(PREFIX.as_bytes()) {
            continue;
        }
        let path = entry.path();
        // Held locked while it is removed: a second sweep passes it by.
        let Some(_held) = left_behind(&path) else {
            continue;
        };
        // `remove_dir_all` follows no symbolic link inside the dir.
        if std::fs::remove_dir_all(&path).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// `path` opened and locked, if it is a dir a dead host left behind.
fn left_behind(path: &Path) -> Option<OwnedFd> {
    // Not followed if it is a link: a link is never crew's.
    let dir = open_dir(path).ok()?;
    let stat = rustix::fs::fstat(&dir).ok()?;
    if stat.st_uid != rustix::process::geteuid().as_raw() {
        return None;
    }
    let changed = SystemTime::UNIX_EPOCH
        + Duration::new(
            u64::try_from(stat.st_mtime).ok()?,
            u32::try_from(stat.st_mtime_nsec).ok()?,
        );
    if SystemTime::now().duration_since(changed).ok()? < STALE_AFTER {
        return None;
    }
    rustix::fs::flock(&dir, FlockOperation::NonBlockingLockExclusive).ok()?;
    Some(dir)
}

fn open_dir(path: &Path) -> io::Result<OwnedFd> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    Ok(rustix::fs::open(path, flags, Mode::empty())?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sets `path`'s modification time two minutes back, as a dir left since then.
    fn age(path: &Path) {
        let then = SystemTime::now() - STALE_AFTER * 2;
        std::fs::File::open(path)
            .unwrap()
            .set_modified(then)
            .unwrap();
    }

    /// A dir as a host killed outright leaves it: its lock gone with the host, the dir kept.
    fn left_by_a_dead_host(base: &Path, task: &str) -> std::path::PathBuf {
        let made = AgentTempDir::new(base, task).unwrap();
        std::fs::write(made.path().join("cache"), "an agent's scratch").unwrap();
        let AgentTempDir { dir, _held } = made;
        drop(_held);
        let path = dir.keep();
        age(&path);
        path
    }

    #[test]
    fn a_sweep_removes_what_a_dead_host_left_and_nothing_a_live_one_holds() {
        let base = tempfile::tempdir().unwrap();
        let dead = left_by_a_dead_host(base.path(), "t1");
        let live = AgentTempDir::new(base.path(), "t2").unwrap();
        std::fs::write(live.path().join("cache"), "in use").unwrap();
        age(live.path());
        // Unlocked but just made: a host between making and locking it.
        let fresh = tempfile::Builder::new()
            .prefix(PREFIX)
            .tempdir_in(base.path())
            .unwrap();
        // Not crew's, however old.
        let other = base.path().join("someone-else");
        std::fs::create_dir(&other).unwrap();
        age(&other);
        // A link of crew's naming to a dir of the user's is not followed.
        let victim = tempfile::tempdir().unwrap();
        std::fs::write(victim.path().join("keep"), "the user's").unwrap();
        age(victim.path());
        let link = base.path().join(format!("{PREFIX}link"));
        std::os::unix::fs::symlink(victim.path(), &link).unwrap();

        assert_eq!(sweep(base.path()), 1);
        assert!(!dead.exists(), "a dead host's dir stayed");
        assert!(
            live.path().join("cache").exists(),
            "a live host's dir was swept"
        );
        assert!(fresh.path().exists(), "a dir just made was swept");
        assert!(other.exists(), "a dir not of crew's naming was swept");
        assert!(victim.path().join("keep").exists(), "a link was followed");
        drop(live);
    }

    #[test]
    fn a_dir_is_locked_while_its_host_keeps_it_and_removed_when_dropped() {
        let base = tempfile::tempdir().unwrap();
        let made = AgentTempDir::new(base.path(), "t1").unwrap();
        let path = made.path().to_owned();
        let other = open_dir(&path).unwrap();
        assert!(
            rustix::fs::flock(&other, FlockOperation::NonBlockingLockExclusive).is_err(),
            "a held dir could be locked again"
        );
        drop(made);
        assert!(!path.exists());
    }
}
