//! The repository lock, and what crew deletes under it: moved out of the way there (a rename
//! into `<worktrees>/.trash`), deleted once the lock is released. Deleting a checkout takes
//! seconds (20,000 files), and other tasks' worktrees must not wait on it: before, `crew
//! worktrees prune` held the lock for 0.6 s to empty a pool of four 10,000-file worktrees here,
//! and a task's teardown held it for as long as it evicted the oldest pooled worktree.

use std::cell::RefCell;
use std::time::SystemTime;

use camino::{Utf8Path, Utf8PathBuf};
use crew_core::config::WorktreeSettings;
use crew_core::fsutil::{FileLock, LockError, rename_beneath};
use crew_core::paths::remove_contained;

use crate::names::{TRASH_DIR, worktrees_dir};

/// How long a worktree mutation waits for another one on the same repository.
pub const REPO_LOCK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// The repository lock (see [`repo_lock`]). Released when dropped; then what this thread put
/// in the trash while holding it ([`discard`]) is deleted.
#[derive(Debug)]
pub struct RepoLock {
    lock: Option<FileLock>,
}

impl Drop for RepoLock {
    fn drop(&mut self) {
        drop(self.lock.take());
        for doomed in DOOMED.with(|doomed| std::mem::take(&mut *doomed.borrow_mut())) {
            // Nothing in the trash is anyone's work; what cannot be deleted now,
            // `crew worktrees prune` deletes.
            let _ = remove_contained(&doomed.path, &[&doomed.within]);
        }
    }
}

/// The file serializing worktree mutations of one repository, across threads and processes.
pub fn repo_lock(common: &Utf8Path) -> Result<RepoLock, LockError> {
    FileLock::acquire(&repo_lock_path(common), REPO_LOCK_TIMEOUT)
        .map(|lock| RepoLock { lock: Some(lock) })
}

/// Where the repository lock of the git directory `common` is.
pub fn repo_lock_path(common: &Utf8Path) -> Utf8PathBuf {
    common.join("crew-worktrees.lock")
}

/// Something in the trash, and the directory it must lie within.
struct Doomed {
    path: Utf8PathBuf,
    within: Utf8PathBuf,
}

thread_local! {
    /// What this thread put in the trash under the repository lock it holds.
    static DOOMED: RefCell<Vec<Doomed>> = const { RefCell::new(Vec::new()) };
}

/// Takes `path` (beneath the worktrees directory; nobody's work: it was saved, or never was)
/// out of the way: renamed into the trash, deleted when this thread releases the repository
/// lock it holds. Where the rename fails, deleted in place then. Absent: nothing to do.
pub fn discard(repo_root: &Utf8Path, settings: &WorktreeSettings, path: &Utf8Path) {
    if std::fs::symlink_metadata(path).is_err() {
        return;
    }
    let worktrees = worktrees_dir(repo_root, settings);
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos());
    let name = path.file_name().unwrap_or("discarded");
    let trash = worktrees
        .join(TRASH_DIR)
        .join(format!("{name}-{nanos}-discarded"));
    let doomed = match rename_beneath(repo_root, path, &trash) {
        Ok(()) => trash,
        Err(_) => path.to_owned(),
    };
    DOOMED.with(|list| {
        list.borrow_mut().push(Doomed {
            path: doomed,
            within: worktrees,
        });
    });
}

/// Deletes, once this thread releases the repository lock it holds, what is already in the
/// trash (left there by a deletion that did not end).
pub fn empty_later(repo_root: &Utf8Path, settings: &WorktreeSettings) {
    let worktrees = worktrees_dir(repo_root, settings);
    let Ok(entries) = worktrees.join(TRASH_DIR).read_dir_utf8() else {
        return;
    };
    let found: Vec<Doomed> = entries
        .flatten()
        .map(|entry| Doomed {
            path: entry.path().to_owned(),
            within: worktrees.clone(),
        })
        .collect();
    DOOMED.with(|list| list.borrow_mut().extend(found));
}
