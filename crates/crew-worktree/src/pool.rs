//! Recycling worktrees.
//!
//! Creating a checkout costs at least the creation of every file, and deleting one makes the
//! next creations slower for minutes. A worktree whose task ended with its work safely on its
//! branch is therefore not deleted but returned to a pool crew owns,
//! `<repo-root>/.worktrees/.pool/<id>`: cleaned of everything but the ignored paths
//! `[worktree] keep_ignored` names, HEAD detached, locked "crew: pooled", hidden from listings.
//! The next task takes one: it is moved to `.worktrees/<runId>/<taskId>`, put on the task's
//! branch, and switched to the task's base with a forced checkout that also removes anything
//! untracked — a tenth of the cost of a fresh checkout. The pool is bounded in size and age;
//! `crew worktrees prune` empties it.

use std::time::{Duration, SystemTime};

use camino::{Utf8Path, Utf8PathBuf};
use crew_core::config::WorktreeSettings;
use crew_core::paths::remove_contained;
use git2::{Oid, Repository, StatusOptions};

use crate::admin;
use crate::names::{POOL_DIR, TaskNames, admin_prefix, worktrees_dir};
use crate::trash;

/// The lock reason of a pooled worktree.
pub const POOLED: &str = "crew: pooled (a recycled worktree)";

/// The lock reason of a worktree `refill` is checking out for the pool, with its process.
const FILLING: &str = "crew: filling the pool";

/// `<repo-root>/<dir>/.pool`
pub fn pool_dir(repo_root: &Utf8Path, settings: &WorktreeSettings) -> Utf8PathBuf {
    worktrees_dir(repo_root, settings).join(POOL_DIR)
}

fn pool_prefix(settings: &WorktreeSettings) -> String {
    format!("{}-pool-", admin_prefix(settings))
}

/// A pooled worktree.
#[derive(Debug, Clone)]
pub struct Pooled {
    /// Its admin entry's name.
    pub admin: String,
    /// Its directory.
    pub path: Utf8PathBuf,
    /// When it went to the pool.
    pub pooled_at: SystemTime,
}

/// The valid pooled worktrees, newest first.
pub fn pooled(common: &Utf8Path, repo_root: &Utf8Path, settings: &WorktreeSettings) -> Vec<Pooled> {
    let dir = pool_dir(repo_root, settings);
    let prefix = pool_prefix(settings);
    let mut found: Vec<Pooled> = admin::read_entries(common)
        .into_iter()
        .filter(|entry| {
            // A worktree still being filled (`refill`) is not there to take yet.
            entry.name.starts_with(&prefix)
                && entry.locked.as_deref() == Some(POOLED)
                && entry.is_valid()
        })
        .filter_map(|entry| {
            let path = entry.worktree.clone()?;
            if path.parent() != Some(dir.as_path()) {
                return None;
            }
            let pooled_at = std::fs::metadata(entry.dir.join("locked"))
                .and_then(|metadata| metadata.modified())
                .unwrap_or(SystemTime::UNIX_EPOCH);
            Some(Pooled {
                admin: entry.name,
                path,
                pooled_at,
            })
        })
        .collect();
    found.sort_by_key(|entry| std::cmp::Reverse(entry.pooled_at));
    found
}

/// Removes a pooled worktree: its directory to the trash (deleted once the lock is released,
/// see [`trash`]), then its admin entry. Under the repository lock.
pub fn evict(
    common: &Utf8Path,
    repo_root: &Utf8Path,
    settings: &WorktreeSettings,
    pooled: &Pooled,
) -> bool {
    trash::discard(repo_root, settings, &pooled.path);
    admin::remove_entry(common, &pooled.admin).is_ok()
}

/// Removes every pooled worktree, and any directory left in the pool by a crash (to the trash:
/// see [`evict`]). Returns how many went.
pub fn empty(common: &Utf8Path, repo_root: &Utf8Path, settings: &WorktreeSettings) -> usize {
    let mut removed = evict_abandoned(common, repo_root, settings);
    for entry in pooled(common, repo_root, settings) {
        removed += usize::from(evict(common, repo_root, settings, &entry));
    }
    removed + discard_unnamed(repo_root, settings, &[])
}

/// Puts in the trash each directory of the pool not in `named`: pooled worktrees hold no work
/// (it was committed before pooling), so a leftover directory there is crew's own. Returns how
/// many.
fn discard_unnamed(
    repo_root: &Utf8Path,
    settings: &WorktreeSettings,
    named: &[Utf8PathBuf],
) -> usize {
    let Ok(entries) = pool_dir(repo_root, settings).read_dir_utf8() else {
        return 0;
    };
    let mut discarded = 0;
    for entry in entries.flatten() {
        if !named.iter().any(|path| path == entry.path()) {
            trash::discard(repo_root, settings, entry.path());
            discarded += 1;
        }
    }
    discarded
}

/// Takes the newest pooled worktree for a task, under the repository lock: evicts entries
/// older than the pool's age limit, then moves the chosen one to the task's place and admin
/// name, locked "crew: initializing". `None` when the pool is empty.
pub fn take(
    common: &Utf8Path,
    repo_root: &Utf8Path,
    settings: &WorktreeSettings,
    names: &TaskNames,
) -> Option<()> {
    if settings.pool_size == 0 {
        return None;
    }
    let now = SystemTime::now();
    let mut candidates = pooled(common, repo_root, settings);
    candidates.retain(|entry| {
        let too_old = now
            .duration_since(entry.pooled_at)
            .unwrap_or(Duration::ZERO)
            > settings.pool_max_age.0;
        if too_old {
            evict(common, repo_root, settings, entry);
        }
        !too_old
    });
    // One that kept build output (`keep_ignored`) first: a worktree the background refill
    // checked out starts cold, one a task's teardown recycled holds its `target/`.
    candidates.sort_by_key(|entry| {
        !settings
            .keep_ignored
            .iter()
            .any(|kept| entry.path.join(kept).exists())
    });
    let chosen = candidates.into_iter().next()?;
    admin::set_lock(common, &chosen.admin, Some(admin::INITIALIZING)).ok()?;
    admin::relocate(
        common,
        &chosen.admin,
        &names.admin,
        (&chosen.path, &names.root),
        repo_root,
    )
    .ok()?;
    admin::set_head(
        common,
        &names.admin,
        &format!("ref: {}", names.branch_ref()),
    )
    .ok()?;
    Some(())
}

/// Switches a recycled worktree to `commit`: files that differ are rewritten, anything
/// untracked is removed, ignored paths outside `keep_ignored` are removed, and the index
/// follows. HEAD already names the task's branch, at `commit`.
///
/// One pass over the worktree finds what differs from HEAD (in the index or in the files),
/// what is untracked and what is ignored; only those paths are checked out, so a worktree that
/// left the pool as it entered it costs one status, not a status and a checkout of every file.
///
/// A switch that fails where the last task left directories read-only (`chmod 555`) is tried
/// once more after their owner has them back.
pub fn switch(
    root: &Utf8Path,
    commit: Oid,
    settings: &WorktreeSettings,
) -> Result<(), git2::Error> {
    match switch_once(root, commit, settings) {
        // `root` as the caller holds it: the worktree's held directory (`/proc/self/fd/<n>`).
        Err(_)
            if std::fs::File::open(root)
                .and_then(|dir| crew_core::paths::give_owner_access_below(&dir))
                .is_ok_and(|given| given > 0) =>
        {
            switch_once(root, commit, settings)
        }
        switched => switched,
    }
}

fn switch_once(
    root: &Utf8Path,
    commit: Oid,
    settings: &WorktreeSettings,
) -> Result<(), git2::Error> {
    let repo = Repository::open(root)?;
    let tree = repo.find_commit(commit)?.tree()?;
    let on_commit = repo.head().ok().and_then(|head| head.target()) == Some(commit);
    let Some(found) = on_commit
        .then(|| Differences::read(&repo))
        .transpose()?
        .flatten()
    else {
        // HEAD elsewhere, or a name that is not UTF-8: the whole worktree is checked out.
        return switch_all(root, &repo, &tree, settings);
    };
    remove_ignored_paths(root, settings, &found.ignored)?;
    for path in &found.untracked {
        let path = root.join(path.trim_end_matches('/'));
        remove_contained(&path, &[root])
            .map_err(|error| git2::Error::from_str(&format!("could not remove {path}: {error}")))?;
    }
    if !found.changed.is_empty() {
        let mut checkout = git2::build::CheckoutBuilder::new();
        checkout
            .force()
            .remove_untracked(true)
            .disable_pathspec_match(true);
        for path in &found.changed {
            checkout.path(path.as_str());
        }
        repo.checkout_tree(tree.as_object(), Some(&mut checkout))?;
    }
    sync_index(&repo, &tree)
}

/// What a status pass found different from HEAD in a worktree, by kind.
struct Differences {
    /// Paths whose index entry or file differs from HEAD.
    changed: Vec<String>,
    /// Untracked paths (a directory once, with a trailing `/`).
    untracked: Vec<String>,
    /// Ignored paths (a directory once, with a trailing `/`).
    ignored: Vec<String>,
}

impl Differences {
    /// `None` when a path is not UTF-8 and cannot be named to the checkout.
    fn read(repo: &Repository) -> Result<Option<Self>, git2::Error> {
        let mut options = StatusOptions::new();
        options
            .include_untracked(true)
            .recurse_untracked_dirs(false)
            .include_ignored(true)
            .recurse_ignored_dirs(false)
            .exclude_submodules(true);
        let mut found = Differences {
            changed: Vec::new(),
            untracked: Vec::new(),
            ignored: Vec::new(),
        };
        for entry in repo.statuses(Some(&mut options))?.iter() {
            let Ok(path) = std::str::from_utf8(entry.path_bytes()) else {
                return Ok(None);
            };
            let status = entry.status();
            let kind = if status.is_ignored() {
                &mut found.ignored
            } else if status == git2::Status::WT_NEW {
                &mut found.untracked
            } else if status.is_empty() {
                continue;
            } else {
                &mut found.changed
            };
            kind.push(path.to_owned());
        }
        Ok(Some(found))
    }
}

/// The switch without knowing what differs: every ignored path is looked at and every file
/// checked out.
fn switch_all(
    root: &Utf8Path,
    repo: &Repository,
    tree: &git2::Tree<'_>,
    settings: &WorktreeSettings,
) -> Result<(), git2::Error> {
    let mut options = StatusOptions::new();
    options
        .include_untracked(false)
        .include_ignored(true)
        .recurse_ignored_dirs(false);
    let mut ignored = Vec::new();
    for entry in repo.statuses(Some(&mut options))?.iter() {
        if entry.status().is_ignored() {
            let path = std::str::from_utf8(entry.path_bytes()).map_err(|_| {
                git2::Error::from_str(&format!(
                    "{root}: the ignored file {} has a name that is not UTF-8; remove it, or `crew worktrees prune` to empty the pool",
                    String::from_utf8_lossy(entry.path_bytes())
                ))
            })?;
            ignored.push(path.to_owned());
        }
    }
    remove_ignored_paths(root, settings, &ignored)?;
    repo.checkout_tree(
        tree.as_object(),
        Some(
            git2::build::CheckoutBuilder::new()
                .force()
                .remove_untracked(true),
        ),
    )?;
    sync_index(repo, tree)
}

/// The index must describe the new commit even where no file changed.
fn sync_index(repo: &Repository, tree: &git2::Tree<'_>) -> Result<(), git2::Error> {
    let mut index = repo.index()?;
    if index.write_tree()? != tree.id() {
        index.read_tree(tree)?;
        index.write()?;
    }
    Ok(())
}

/// Removes the ignored `paths` of the worktree at `root` (as a status pass named them; crew's
/// own links and copies included), except those `keep_ignored` names. Fails at the first that
/// cannot be removed.
pub(crate) fn remove_ignored_paths(
    root: &Utf8Path,
    settings: &WorktreeSettings,
    paths: &[String],
) -> Result<(), git2::Error> {
    for path in paths {
        let relative = path.trim_end_matches('/');
        let kept = settings
            .keep_ignored
            .iter()
            .any(|keep| Utf8Path::new(relative).starts_with(keep));
        if !kept {
            // A worktree still holding them would hand them to the next task: fail, and the
            // worktree is not pooled.
            let path = root.join(relative);
            remove_contained(&path, &[root]).map_err(|error| {
                git2::Error::from_str(&format!("could not remove {path}: {error}"))
            })?;
        }
    }
    Ok(())
}

/// Whether any process works inside `root` (its current directory is there): a worktree one
/// of the previous task's processes still uses is never handed to the next task.
pub fn has_live_process(root: &Utf8Path) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return false;
    };
    entries
        .flatten()
        .filter(|entry| {
            entry
                .file_name()
                .to_str()
                .is_some_and(|name| name.bytes().all(|b| b.is_ascii_digit()))
        })
        .filter_map(|entry| std::fs::read_link(entry.path().join("cwd")).ok())
        .any(|cwd| cwd.starts_with(root.as_std_path()))
}

/// Returns a finished task's worktree to the pool, under the repository lock: the worktree is
/// clean (its work was committed and verified), so only ignored files may be left, and they
/// were removed by the caller. HEAD is detached at `commit` so that the task branch is free.
/// `false` when the pool is off or the move failed (the caller removes the worktree instead).
pub fn give_back(
    common: &Utf8Path,
    repo_root: &Utf8Path,
    settings: &WorktreeSettings,
    names: &TaskNames,
    commit: Oid,
) -> bool {
    if settings.pool_size == 0 || has_live_process(&names.root) {
        return false;
    }
    let mut existing = pooled(common, repo_root, settings);
    while existing.len() >= settings.pool_size {
        let oldest = existing.pop().expect("the pool is not empty");
        evict(common, repo_root, settings, &oldest);
    }
    let dir = pool_dir(repo_root, settings);
    if crew_core::fsutil::ensure_real_dir(&dir).is_err() {
        return false;
    }
    let id = uuid_like();
    let pooled_admin = format!("{}{id}", pool_prefix(settings));
    let pooled_path = dir.join(&id);
    let moved = admin::set_head(common, &names.admin, &commit.to_string())
        .and_then(|()| {
            admin::relocate(
                common,
                &names.admin,
                &pooled_admin,
                (&names.root, &pooled_path),
                repo_root,
            )
        })
        .and_then(|()| admin::set_lock(common, &pooled_admin, Some(POOLED)));
    moved.is_ok()
}

/// How many worktrees the pool lacks to hold `pool_size`.
pub fn missing(common: &Utf8Path, repo_root: &Utf8Path, settings: &WorktreeSettings) -> usize {
    settings
        .pool_size
        .saturating_sub(pooled(common, repo_root, settings).len())
}

/// [`missing`] for the repository at `repo_root`; 0 when it cannot be read.
pub fn missing_at(repo_root: &Utf8Path, settings: &WorktreeSettings) -> usize {
    Repository::open(repo_root).map_or(0, |repo| {
        missing(&crate::leader::common_dir(&repo), repo_root, settings)
    })
}

/// [`refill`] of the repository at `repo_root` with its HEAD's commit.
pub fn refill_at_head(
    repo_root: &Utf8Path,
    settings: &WorktreeSettings,
    stop: impl Fn() -> bool,
) -> Result<usize, git2::Error> {
    let repo = Repository::open(repo_root)?;
    let commit = repo.head()?.peel_to_commit()?.id();
    refill(
        &crate::leader::common_dir(&repo),
        repo_root,
        settings,
        commit,
        stop,
    )
}

/// Fills the pool up to `pool_size` with fresh checkouts of `commit` (HEAD detached), one
/// after the other, so that the next run's first tasks start recycled. Each is checked out
/// outside the repository lock, locked as filling with this process's id meanwhile, and only
/// then pooled; `stop` is asked before each. A worktree left half-filled by a refill that was
/// stopped (or died) is removed by the next refill or `crew worktrees prune`. Returns how many
/// were added.
pub fn refill(
    common: &Utf8Path,
    repo_root: &Utf8Path,
    settings: &WorktreeSettings,
    commit: Oid,
    stop: impl Fn() -> bool,
) -> Result<usize, git2::Error> {
    let lock_error =
        |error: crew_core::fsutil::LockError| git2::Error::from_str(&error.to_string());
    let file_error =
        |error: crew_core::fsutil::FileError| git2::Error::from_str(&error.to_string());
    {
        let _lock = crate::create::repo_lock(common).map_err(lock_error)?;
        evict_abandoned(common, repo_root, settings);
    }
    let mut added = 0;
    while !stop() {
        let filling = {
            let _lock = crate::create::repo_lock(common).map_err(lock_error)?;
            if missing(common, repo_root, settings) == 0 {
                break;
            }
            crate::create::ensure_worktrees_dir(repo_root, settings)
                .map_err(|error| git2::Error::from_str(&error.to_string()))?;
            // Not fatal: without it `git status` in the leader is merely noisier.
            let _ = crew_core::git_exclude::ensure_excluded(
                repo_root,
                &[format!("/{}/", settings.dir)],
            );
            let dir = pool_dir(repo_root, settings);
            crew_core::fsutil::ensure_real_dir(&dir).map_err(file_error)?;
            crew_core::fsutil::spread_apart(&dir);
            let id = uuid_like();
            let name = format!("{}{id}", pool_prefix(settings));
            // Made and filled through handles from the repository root down: a level swapped
            // for a link meanwhile is refused, never followed out of the repository.
            let mut parents: Vec<&str> = settings
                .dir
                .components()
                .map(|component| component.as_str())
                .collect();
            parents.push(POOL_DIR);
            let (path, held) = crew_core::fsutil::create_dir_beneath(repo_root, &parents, &id)
                .map_err(file_error)?;
            let registered = admin::write_entry(common, &name, (&path, &held.path()), "HEAD")
                .and_then(|_| admin::set_head(common, &name, &commit.to_string()))
                .and_then(|()| admin::set_lock(common, &name, Some(&filling_reason())));
            if let Err(error) = registered {
                // A fresh checkout with nobody's work in it: what is left of it is swept by
                // the next refill or `crew worktrees prune`, and the error returned says why.
                let _ = remove_contained(&path, &[&dir]);
                // As above: what is left is the next refill's or prune's to remove.
                let _ = admin::remove_entry(common, &name);
                return Err(file_error(error));
            }
            (
                Pooled {
                    admin: name,
                    path,
                    pooled_at: SystemTime::now(),
                },
                held,
            )
        };
        let (filling, held) = filling;
        let filled = crate::checkout::populate(&held.path(), common, commit, None);
        let _lock = crate::create::repo_lock(common).map_err(lock_error)?;
        match filled
            .map_err(|error| error.message().to_owned())
            .and_then(|()| {
                admin::set_lock(common, &filling.admin, Some(POOLED))
                    .map_err(|error| error.to_string())
            }) {
            Ok(()) => added += 1,
            Err(message) => {
                evict(common, repo_root, settings, &filling);
                return Err(git2::Error::from_str(&message));
            }
        }
    }
    Ok(added)
}

/// `crew: filling the pool (pid N)`
fn filling_reason() -> String {
    format!("{FILLING} (pid {})", std::process::id())
}

/// Removes what a refill that was stopped or died left in the pool: entries still locked as
/// it registers them ([`admin::INITIALIZING`]: every step between happens under the lock, so
/// under it such an entry is abandoned) or [`FILLING`] by a process that is gone, and
/// directories no entry names. Under the repository lock; nothing there holds work. Returns
/// how many went.
fn evict_abandoned(common: &Utf8Path, repo_root: &Utf8Path, settings: &WorktreeSettings) -> usize {
    let prefix = pool_prefix(settings);
    let dir = pool_dir(repo_root, settings);
    let mut removed = 0;
    let mut named = Vec::new();
    for entry in admin::read_entries(common) {
        if !entry.name.starts_with(&prefix) {
            continue;
        }
        let abandoned = match entry.locked.as_deref() {
            Some(admin::INITIALIZING) => true,
            Some(reason) => filling_pid(reason).is_some_and(|pid| {
                rustix::process::Pid::from_raw(pid)
                    .is_none_or(|pid| rustix::process::test_kill_process(pid).is_err())
            }),
            None => false,
        };
        let inside = entry
            .worktree
            .clone()
            .filter(|path| path.parent() == Some(dir.as_path()));
        if !abandoned {
            named.extend(inside);
            continue;
        }
        if let Some(path) = &inside {
            // An abandoned fill holds no work.
            trash::discard(repo_root, settings, path);
        }
        if admin::remove_entry(common, &entry.name).is_ok() {
            removed += 1;
        }
    }
    removed + discard_unnamed(repo_root, settings, &named)
}

/// The process a [`FILLING`] lock reason names.
fn filling_pid(reason: &str) -> Option<i32> {
    reason
        .strip_prefix(FILLING)?
        .trim()
        .strip_prefix("(pid ")?
        .strip_suffix(')')?
        .parse()
        .ok()
}

fn uuid_like() -> String {
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|elapsed| elapsed.as_nanos())
        .unwrap_or(0);
    format!("{:x}{:x}", nanos, std::process::id())
}
