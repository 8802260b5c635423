//! Finding crew's worktrees and task branches, and pruning the ones that hold no work.
//!
//! A crew worktree lives at `<repo-root>/<dir>/<runId>/<taskId>`; a task branch is
//! `<prefix>/<runId>-<taskId>`. Worktrees crew did not create, worktrees locked by the user,
//! and branches outside the prefix are never touched.

use std::collections::{BTreeMap, HashMap};

use camino::{Utf8Path, Utf8PathBuf};
use crew_core::config::WorktreeSettings;
use crew_core::model::{RunStatus, TaskStatus};
use crew_core::{RunId, StateStore, TaskId};
use git2::{BranchType, Oid, Repository};
use serde::Serialize;

use crate::admin::{self, AdminEntry};
use crate::create::repo_lock;
use crate::error::ListWorktreesError;
use crate::leader;
use crate::names::{POOL_DIR, TaskNames, admin_prefix, parse_task_branch, worktrees_dir};
use crate::teardown::{crew_links, uncommitted};

/// Where a crew worktree stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WorktreeState {
    /// Its task is running in a live run.
    Active,
    /// Its task waits for an answer; it is kept until the run is cleaned.
    Waiting,
    /// Kept after its task ended (work that could not be saved safely, or a run that was
    /// interrupted).
    Preserved,
    /// Registered with git, but the directory is gone.
    MissingDirectory,
    /// Registered, but no run of this workspace knows it.
    UnknownRun,
    /// Its preparation never finished (the host making it died): nothing of an agent's is in
    /// it, and its files may be any part of a checkout. Made again when its run is resumed;
    /// removed by prune.
    Unfinished,
    /// A directory under the worktrees directory that git does not know as a worktree.
    Unregistered,
}

/// One crew worktree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CrewWorktree {
    /// The worktree's directory.
    pub path: Utf8PathBuf,
    /// Its run.
    pub run_id: RunId,
    /// Its task.
    pub task_id: TaskId,
    /// The branch it has checked out.
    pub branch: Option<String>,
    /// What it holds, for prune.
    pub state: WorktreeState,
    /// The lock reason, when locked.
    pub locked: Option<String>,
    /// Uncommitted paths in it (tracked changes and untracked files), when it could be read.
    pub uncommitted: Option<usize>,
}

/// One task branch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TaskBranch {
    /// The branch's name.
    pub name: String,
    /// Its run.
    pub run_id: RunId,
    /// Its task.
    pub task_id: TaskId,
    /// Its tip commit.
    pub tip: String,
    /// Its tip is already contained in the leader's HEAD: deleting it loses nothing.
    pub merged: bool,
    /// A worktree has it checked out.
    pub checked_out: bool,
}

/// crew's worktrees and branches in a repository.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct WorktreeListing {
    /// Crew's worktrees, pooled ones left out.
    pub worktrees: Vec<CrewWorktree>,
    /// Crew's task branches.
    pub branches: Vec<TaskBranch>,
    /// Worktrees in crew's recycling pool, hidden from the listings above.
    pub pooled: usize,
}

impl WorktreeListing {
    /// Worktrees kept after their task (with work or not: a clean one still takes room until
    /// `crew worktrees prune`), and task branches whose work is not merged: what the one-line
    /// warning at the start of `crew run` names.
    pub fn needs_attention(&self) -> (Vec<&CrewWorktree>, Vec<&TaskBranch>) {
        let worktrees = self
            .worktrees
            .iter()
            .filter(|worktree| {
                matches!(
                    worktree.state,
                    WorktreeState::Preserved
                        | WorktreeState::Waiting
                        | WorktreeState::UnknownRun
                        | WorktreeState::Unfinished
                )
            })
            .collect();
        let branches = self
            .branches
            .iter()
            .filter(|branch| !branch.merged && !branch.checked_out)
            .collect();
        (worktrees, branches)
    }
}

/// What `prune` removed or would remove, and what it kept and why.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct WorktreePruneReport {
    /// Worktree directories removed.
    pub removed_worktrees: Vec<Utf8PathBuf>,
    /// Recycled worktrees removed from crew's pool (and leftovers of interrupted deletions).
    pub emptied_pool: usize,
    /// Admin entries under `.git/worktrees/` removed.
    pub removed_admin_entries: Vec<String>,
    /// Task branches deleted (merged or empty).
    pub deleted_branches: Vec<String>,
    /// What was kept, each with why.
    pub kept: Vec<(String, String)>,
    /// Whether nothing was removed, only reported.
    pub dry_run: bool,
}

#[derive(Debug, Clone, Copy)]
struct TaskInfo {
    run_live: bool,
    waiting: bool,
}

/// What the tasks of the runs that have worktrees are doing, read run by run as worktrees
/// name them: finished runs without a worktree (nearly all of a long history) are never read.
struct KnownTasks<'a> {
    store: &'a StateStore,
    runs: HashMap<RunId, HashMap<TaskId, TaskInfo>>,
}

impl<'a> KnownTasks<'a> {
    fn new(store: &'a StateStore) -> Self {
        KnownTasks {
            store,
            runs: HashMap::new(),
        }
    }

    /// The task's state, `None` when its run is not recorded (or cannot be read).
    fn get(&mut self, run_id: &RunId, task_id: &TaskId) -> Option<TaskInfo> {
        self.of_run(run_id).get(task_id).copied()
    }

    /// The run's tasks (none when it is not recorded, or cannot be read).
    fn of_run(&mut self, run_id: &RunId) -> &HashMap<TaskId, TaskInfo> {
        let store = self.store;
        self.runs.entry(run_id.clone()).or_insert_with(|| {
            let Ok(manifest) = store.read_run(run_id) else {
                return HashMap::new();
            };
            let run_live = manifest.status == RunStatus::Running
                && manifest
                    .host
                    .as_ref()
                    .is_some_and(|host| host.identity.is_alive());
            manifest
                .tasks
                .iter()
                .map(|task| {
                    let info = TaskInfo {
                        run_live,
                        waiting: task.status == TaskStatus::Waiting,
                    };
                    (task.id.clone(), info)
                })
                .collect()
        })
    }
}

/// After a run's host died, its worktrees still say they are "in use by run … (pid …)" of a
/// process that is gone: each one crew locked for the run now says what became of it and what
/// to do. A lock the user set is left as it is.
pub fn mark_interrupted(
    repo_root: &Utf8Path,
    settings: &WorktreeSettings,
    run_id: &RunId,
) -> Result<usize, ListWorktreesError> {
    let repo = leader::open(Some(repo_root), repo_root)?;
    let common = leader::common_dir(&repo);
    let prefix = format!("{}-{run_id}-", admin_prefix(settings));
    let _lock = repo_lock(&common).map_err(ListWorktreesError::Lock)?;
    let reason = format!(
        "crew: kept after run {run_id} was interrupted (its host died); `crew runs resume {run_id}` goes on, `crew runs clean {run_id}` saves the work and removes it"
    );
    let mut marked = 0;
    for entry in admin::read_entries(&common) {
        let crews_lock = entry.locked.as_deref().is_some_and(|locked| {
            locked.starts_with(&format!("crew: in use by run {run_id} task "))
        });
        if entry.name.starts_with(&prefix)
            && crews_lock
            && admin::set_lock(&common, &entry.name, Some(&reason)).is_ok()
        {
            marked += 1;
        }
    }
    Ok(marked)
}

/// Which task branches a listing reads and judges (whether their work is merged costs a merge
/// of trees each, and a project's history may hold thousands).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BranchScope<'a> {
    /// None: worktrees only.
    None,
    /// The branches of these runs.
    OfRuns(&'a [RunId]),
    /// Every task branch.
    All,
}

/// Lists crew's worktrees and, as far as `scope` says, the task branches of the repository
/// holding the workspace of `store`.
pub fn list(
    repo_root: &Utf8Path,
    settings: &WorktreeSettings,
    store: &StateStore,
    scope: BranchScope<'_>,
) -> Result<WorktreeListing, ListWorktreesError> {
    let repo = leader::open(Some(repo_root), repo_root)?;
    let common = leader::common_dir(&repo);
    let mut tasks = KnownTasks::new(store);
    // The runs' names (their directories), for telling task branches apart: listed only once
    // a branch under crew's prefix is met, and no manifest is read for them.
    let mut runs: Option<Vec<RunId>> = None;
    let root = worktrees_dir(repo_root, settings);
    let prefix = format!("{}-", admin_prefix(settings));

    let mut found: BTreeMap<Utf8PathBuf, CrewWorktree> = BTreeMap::new();
    let (entries, users): (Vec<AdminEntry>, Vec<AdminEntry>) = admin::read_entries(&common)
        .into_iter()
        .partition(|entry| entry.name.starts_with(&prefix));
    // The user's own worktrees (registered by another name), wherever they are: never crew's,
    // nor is anything inside one.
    let users: Vec<Utf8PathBuf> = users
        .into_iter()
        .filter_map(|entry| entry.worktree)
        .collect();
    let inside_the_users = |path: &Utf8Path| users.iter().any(|own| path.starts_with(own));
    for entry in &entries {
        let Some(path) = entry.worktree.clone() else {
            continue;
        };
        let Some((run_id, task_id)) = ids_from_path(&root, &path) else {
            continue;
        };
        let info = tasks.get(&run_id, &task_id);
        let state = if !path.exists() {
            WorktreeState::MissingDirectory
        } else {
            match info {
                Some(info) if info.waiting => WorktreeState::Waiting,
                Some(info) if info.run_live => WorktreeState::Active,
                // No live host is preparing it: the one that was died.
                _ if crate::unfinished::is_unfinished(entry.locked.as_deref()) => {
                    WorktreeState::Unfinished
                }
                None => WorktreeState::UnknownRun,
                Some(_) => WorktreeState::Preserved,
            }
        };
        // What an unfinished checkout lacks is no one's change.
        let counted = !matches!(
            state,
            WorktreeState::MissingDirectory | WorktreeState::Unfinished
        );
        let uncommitted = counted
            .then(|| count_uncommitted(&path, settings, repo_root))
            .flatten();
        found.insert(
            path.clone(),
            CrewWorktree {
                path,
                run_id,
                task_id,
                branch: entry.branch.clone(),
                state,
                locked: entry.locked.clone(),
                uncommitted,
            },
        );
    }
    let mut pooled = 0;
    for (run_dir, run_id) in subdirs(&root) {
        if run_id == POOL_DIR {
            pooled = subdirs(&run_dir).len();
            continue;
        }
        let Ok(run_id) = RunId::parse(&run_id) else {
            continue;
        };
        // A run's directory holds task worktrees; one that is a checkout itself is not crew's.
        if inside_the_users(&run_dir) || std::fs::symlink_metadata(run_dir.join(".git")).is_ok() {
            continue;
        }
        for (path, task_id) in subdirs(&run_dir) {
            let Ok(task_id) = TaskId::parse(&task_id) else {
                continue;
            };
            if inside_the_users(&path) {
                continue;
            }
            found.entry(path.clone()).or_insert(CrewWorktree {
                path,
                run_id: run_id.clone(),
                task_id,
                branch: None,
                state: WorktreeState::Unregistered,
                locked: None,
                uncommitted: None,
            });
        }
    }

    let head = repo.head().ok().and_then(|head| head.target());
    let mut branches = Vec::new();
    // Each task branch under crew's prefix, by name with its tip: for a few runs, looked up by
    // the names their tasks give (no other branch is read); else every local branch.
    let mut candidates: Vec<(String, Oid)> = Vec::new();
    match scope {
        BranchScope::None => {}
        BranchScope::OfRuns(wanted) => {
            for run_id in wanted {
                let task_ids: Vec<TaskId> = tasks.of_run(run_id).keys().cloned().collect();
                for task_id in task_ids {
                    let name = TaskNames::new(repo_root, settings, run_id, &task_id).branch;
                    if let Some(tip) = repo
                        .find_reference(&format!("refs/heads/{name}"))
                        .ok()
                        .and_then(|reference| reference.target())
                    {
                        candidates.push((name, tip));
                    }
                }
            }
        }
        BranchScope::All => {
            let all = repo.branches(Some(BranchType::Local));
            for (branch, _) in all.into_iter().flatten().flatten() {
                if let (Ok(Some(name)), Some(tip)) = (branch.name(), branch.get().target())
                    && name.starts_with(&format!("{}/", settings.branch_prefix))
                {
                    candidates.push((name.to_owned(), tip));
                }
            }
        }
    }
    candidates.sort();
    candidates.dedup();
    for (name, tip) in candidates {
        // Among the runs asked for; or (every branch) the runs' names, listed once.
        let runs: &[RunId] = match scope {
            BranchScope::OfRuns(wanted) => wanted,
            _ => runs.get_or_insert_with(|| store.run_ids().unwrap_or_default()),
        };
        let Some((run_id, task_id)) = parse_task_branch(settings, &name, runs) else {
            continue;
        };
        // The pattern said which run it may be; its ids say which it is.
        if let BranchScope::OfRuns(wanted) = scope
            && !wanted.contains(&run_id)
        {
            continue;
        }
        let checked_out = entries
            .iter()
            .any(|entry| entry.branch.as_deref() == Some(name.as_str()));
        // A worktree still holding uncommitted work on the branch (or whose status cannot
        // be read): never merged. One whose directory is gone holds nothing.
        let unsaved = found.values().any(|worktree| {
            worktree.branch.as_deref() == Some(name.as_str())
                && worktree.state != WorktreeState::MissingDirectory
                && worktree.uncommitted != Some(0)
        });
        let merged = !unsaved && head.is_some_and(|head| is_merged(&repo, head, tip));
        branches.push(TaskBranch {
            name,
            run_id,
            task_id,
            tip: tip.to_string(),
            merged,
            checked_out,
        });
    }
    branches.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(WorktreeListing {
        worktrees: found.into_values().collect(),
        branches,
        pooled,
    })
}

/// Whether the changes of the branch at `tip` are all in `head`: merged (`head` contains `tip`),
/// or squashed or rebased in (merging `tip` into `head` would change nothing: every path the
/// branch changed since its merge base is in `head` as the branch has it). Read only: no tree
/// is written, and only the paths the branch changed are looked at.
fn is_merged(repo: &Repository, head: Oid, tip: Oid) -> bool {
    if head == tip {
        return true;
    }
    let changes_in_head = || -> Result<bool, git2::Error> {
        // One walk: `head` contains `tip` exactly when `tip` is their merge base.
        let base = repo.merge_base(head, tip)?;
        if base == tip {
            return Ok(true);
        }
        let entry = |id: Oid| -> Result<Entry, git2::Error> {
            let tree = repo.find_commit(id)?.tree_id();
            Ok(Some((tree, i32::from(git2::FileMode::Tree))))
        };
        applied(repo, entry(base)?, entry(tip)?, entry(head)?)
    };
    changes_in_head().unwrap_or(false)
}

/// A tree entry's id and mode; `None` where there is none.
type Entry = Option<(Oid, i32)>;

/// Whether what the branch changed between `base` and `theirs` is in `ours` as `theirs` has
/// it: subtrees are entered only where the branch changed something and `ours` differs.
fn applied(
    repo: &Repository,
    base: Entry,
    theirs: Entry,
    ours: Entry,
) -> Result<bool, git2::Error> {
    if base == theirs || theirs == ours {
        return Ok(true);
    }
    let tree_mode = i32::from(git2::FileMode::Tree);
    let subtree = |entry: Entry| -> Result<Option<git2::Tree<'_>>, git2::Error> {
        match entry {
            Some((id, mode)) if mode == tree_mode => repo.find_tree(id).map(Some),
            _ => Ok(None),
        }
    };
    let (Some(theirs), Some(ours)) = (subtree(theirs)?, subtree(ours)?) else {
        return Ok(false);
    };
    let base = subtree(base)?;
    let child = |tree: Option<&git2::Tree<'_>>, name: &[u8]| -> Entry {
        let entry = tree?.get_name_bytes(name)?;
        Some((entry.id(), entry.filemode()))
    };
    let mut names: Vec<Vec<u8>> = theirs
        .iter()
        .chain(base.iter().flat_map(|base| base.iter()))
        .map(|entry| entry.name_bytes().to_vec())
        .collect();
    names.sort();
    names.dedup();
    for name in names {
        let (base, theirs, ours) = (
            child(base.as_ref(), &name),
            child(Some(&theirs), &name),
            child(Some(&ours), &name),
        );
        if !applied(repo, base, theirs, ours)? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Removes what holds no work: admin entries of vanished directories; worktrees of finished
/// or unknown runs that are unlocked (or locked by crew) and have nothing uncommitted; empty
/// unregistered directories; task branches already merged into the leader's HEAD and not
/// checked out. Everything else is kept and said why. A dry run changes nothing.
pub fn prune(
    repo_root: &Utf8Path,
    settings: &WorktreeSettings,
    store: &StateStore,
    dry_run: bool,
) -> Result<WorktreePruneReport, ListWorktreesError> {
    let listing = list(repo_root, settings, store, BranchScope::All)?;
    let repo = leader::open(Some(repo_root), repo_root)?;
    let common = leader::common_dir(&repo);
    let mut report = WorktreePruneReport {
        dry_run,
        ..WorktreePruneReport::default()
    };
    let _lock = if dry_run {
        None
    } else {
        Some(repo_lock(&common).map_err(ListWorktreesError::Lock)?)
    };
    let mut freed_branches = Vec::new();
    // What it removes goes to the trash under the lock, and is deleted once the lock is
    // released (see [`crate::trash`]): other tasks' worktrees do not wait on the deletions.
    report.emptied_pool = if dry_run {
        listing.pooled
    } else {
        // Work was saved before a worktree went to the trash: nothing there is work, and what
        // cannot be removed now is tried again by the next prune.
        crate::trash::empty_later(repo_root, settings);
        crate::pool::empty(&common, repo_root, settings)
    };
    for worktree in &listing.worktrees {
        let names = TaskNames::new(repo_root, settings, &worktree.run_id, &worktree.task_id);
        let user_locked = worktree
            .locked
            .as_deref()
            .is_some_and(|reason| !reason.starts_with("crew"));
        let keep = |report: &mut WorktreePruneReport, why: &str| {
            report
                .kept
                .push((worktree.path.to_string(), why.to_owned()));
        };
        if user_locked {
            keep(&mut report, "locked by its user");
            continue;
        }
        match worktree.state {
            WorktreeState::Active => keep(&mut report, "its task is running"),
            WorktreeState::Waiting => keep(&mut report, "its task waits for an answer"),
            WorktreeState::MissingDirectory => {
                if !dry_run && let Err(error) = admin::remove_entry(&common, &names.admin) {
                    keep(
                        &mut report,
                        &format!("git's entry could not be removed: {error}"),
                    );
                    continue;
                }
                report.removed_admin_entries.push(names.admin.clone());
                freed_branches.extend(worktree.branch.clone());
            }
            WorktreeState::Unregistered => {
                let empty = worktree
                    .path
                    .read_dir_utf8()
                    .is_ok_and(|mut entries| entries.next().is_none());
                if !empty {
                    keep(&mut report, "not a registered worktree and not empty");
                } else {
                    if !dry_run && let Err(error) = std::fs::remove_dir(&worktree.path) {
                        keep(&mut report, &format!("could not be removed: {error}"));
                        continue;
                    }
                    report.removed_worktrees.push(worktree.path.clone());
                }
            }
            WorktreeState::Preserved | WorktreeState::UnknownRun | WorktreeState::Unfinished => {
                match (worktree.state, worktree.uncommitted) {
                    (WorktreeState::Unfinished, _) | (_, Some(0)) => {
                        if !dry_run {
                            crate::trash::discard(repo_root, settings, &worktree.path);
                            if let Err(error) = admin::remove_entry(&common, &names.admin) {
                                keep(
                                    &mut report,
                                    &format!("removed, but git's entry could not be: {error}"),
                                );
                            }
                            if let Some(parent) = worktree.path.parent() {
                                // Only when empty: the run's other worktrees may be there.
                                let _ = std::fs::remove_dir(parent);
                            }
                        }
                        report.removed_worktrees.push(worktree.path.clone());
                        freed_branches.extend(worktree.branch.clone());
                    }
                    (_, Some(count)) => keep(&mut report, &format!("{count} uncommitted path(s)")),
                    (_, None) => keep(&mut report, "its status could not be read"),
                }
            }
        }
    }
    for branch in &listing.branches {
        let checked_out = branch.checked_out && !freed_branches.contains(&branch.name);
        if checked_out {
            continue;
        }
        if !branch.merged {
            report.kept.push((
                branch.name.clone(),
                format!(
                    "unmerged work: `git merge {}` or `git branch -D {}`",
                    branch.name, branch.name
                ),
            ));
            continue;
        }
        if !dry_run
            && let Ok(mut found) = repo.find_branch(&branch.name, BranchType::Local)
            && let Err(error) = found.delete()
        {
            report.kept.push((
                branch.name.clone(),
                format!("could not be deleted: {}", error.message()),
            ));
            continue;
        }
        report.deleted_branches.push(branch.name.clone());
    }
    Ok(report)
}

/// `(run, task)` of a path `<root>/<run>/<task>`.
fn ids_from_path(root: &Utf8Path, path: &Utf8Path) -> Option<(RunId, TaskId)> {
    let relative = path.strip_prefix(root).ok()?;
    let mut components = relative.components();
    let run = RunId::parse(components.next()?.as_str()).ok()?;
    let task = TaskId::parse(components.next()?.as_str()).ok()?;
    components.next().is_none().then_some((run, task))
}

/// The real directories directly below `dir`, with their names.
fn subdirs(dir: &Utf8Path) -> Vec<(Utf8PathBuf, String)> {
    let Ok(entries) = dir.read_dir_utf8() else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|entry| entry.file_type().is_ok_and(|kind| kind.is_dir()))
        .map(|entry| (entry.path().to_owned(), entry.file_name().to_owned()))
        .collect()
}

/// How many paths of the worktree hold uncommitted work, by crew's own status options and
/// without crew's links into the leader.
fn count_uncommitted(
    path: &Utf8Path,
    settings: &WorktreeSettings,
    repo_root: &Utf8Path,
) -> Option<usize> {
    let repo = Repository::open(path).ok()?;
    let links = crew_links(settings, repo_root, path);
    uncommitted(&repo, path, &links)
        .ok()
        .map(|paths| paths.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A commit on `parent` (or a root commit) whose tree is `files` (path → content).
    fn commit(repo: &Repository, parent: Option<Oid>, files: &[(&str, &str)]) -> Oid {
        let mut index = git2::Index::new().unwrap();
        for (path, content) in files {
            let blob = repo.blob(content.as_bytes()).unwrap();
            let mut entry = git2::IndexEntry {
                ctime: git2::IndexTime::new(0, 0),
                mtime: git2::IndexTime::new(0, 0),
                dev: 0,
                ino: 0,
                mode: 0o100_644,
                uid: 0,
                gid: 0,
                file_size: 0,
                id: blob,
                flags: 0,
                flags_extended: 0,
                path: path.as_bytes().to_vec(),
            };
            entry.flags = (path.len() as u16) & 0xfff;
            index.add(&entry).unwrap();
        }
        let tree = repo.find_tree(index.write_tree_to(repo).unwrap()).unwrap();
        let signature = git2::Signature::now("t", "t@example.com").unwrap();
        let parents: Vec<git2::Commit<'_>> = parent
            .map(|id| repo.find_commit(id).unwrap())
            .into_iter()
            .collect();
        let parents: Vec<&git2::Commit<'_>> = parents.iter().collect();
        repo.commit(None, &signature, &signature, "c", &tree, &parents)
            .unwrap()
    }

    #[test]
    fn merged_means_every_change_of_the_branch_is_in_head_as_the_branch_has_it() {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init(dir.path()).unwrap();
        let base_files = [("a/deep/x.txt", "x"), ("a/y.txt", "y"), ("z.txt", "z")];
        let base = commit(&repo, None, &base_files);
        // The branch changes a deep file, deletes one and adds one.
        let tip = commit(
            &repo,
            Some(base),
            &[("a/deep/x.txt", "x2"), ("z.txt", "z"), ("new/n.txt", "n")],
        );
        assert!(is_merged(&repo, tip, tip));
        assert!(!is_merged(&repo, base, tip), "head has none of it");
        // Head moved on elsewhere, then took all of the branch's changes (a squash).
        let squashed = commit(
            &repo,
            Some(base),
            &[
                ("a/deep/x.txt", "x2"),
                ("z.txt", "z"),
                ("new/n.txt", "n"),
                ("other.txt", "o"),
            ],
        );
        assert!(is_merged(&repo, squashed, tip));
        // Part of it: the deletion is missing, or a file differs.
        let partial = commit(
            &repo,
            Some(base),
            &[
                ("a/deep/x.txt", "x2"),
                ("a/y.txt", "y"),
                ("z.txt", "z"),
                ("new/n.txt", "n"),
            ],
        );
        assert!(!is_merged(&repo, partial, tip));
        let different = commit(
            &repo,
            Some(base),
            &[("a/deep/x.txt", "x3"), ("z.txt", "z"), ("new/n.txt", "n")],
        );
        assert!(!is_merged(&repo, different, tip));
        // What the branch did not touch may differ in head.
        let unrelated = commit(
            &repo,
            Some(squashed),
            &[("a/deep/x.txt", "x2"), ("z.txt", "z2"), ("new/n.txt", "n")],
        );
        assert!(is_merged(&repo, unrelated, tip));
    }
}
