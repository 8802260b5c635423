//! Landing task branches on a target branch, all or nothing.
//!
//! 1. Each task's result is made in memory on top of the result before it (the target's tip for
//!    the first): a merge commit, one squashed commit, or its commits replayed (rebase). A task
//!    built on one that landed before it in the same call brings that one's commits along;
//!    squashed or rebased they are on the target in another shape, so its change is taken from
//!    that task's tip (its own work alone), and no commit of it is replayed twice. Nothing is
//!    checked out, and no ref moves while this goes on.
//! 2. The first task that would conflict stops the landing: the target is left as it was, and
//!    the error names the task and the files. When the task names a branch for it, a commit
//!    holding both sides (the result so far and the task's work as parents, the conflicting
//!    files with git's conflict markers) is put there: what an agent resolves as a new task.
//! 3. Only when every task landed cleanly does the target move, from the tip it was read at (a
//!    target that moved meanwhile is not overwritten). When the target is checked out in the
//!    repository's own working tree, it moves only when that tree holds no uncommitted change,
//!    and its files are brought up to date, as `git merge --ff-only` would.

use camino::Utf8Path;
use git2::{BranchType, Commit, Oid, Repository, Sort};

use crate::leader::{crew_signature, dirty_paths};

pub use crew_core::provider::land::{LandError, LandMode, Landed, Landing};

/// What can stop a landing inside: one of its own refusals, or git failing.
enum Stop {
    Refused(LandError),
    Git(git2::Error),
}

impl From<LandError> for Stop {
    fn from(error: LandError) -> Self {
        Stop::Refused(error)
    }
}

impl From<git2::Error> for Stop {
    fn from(error: git2::Error) -> Self {
        Stop::Git(error)
    }
}

impl From<Stop> for LandError {
    fn from(stop: Stop) -> Self {
        match stop {
            Stop::Refused(error) => error,
            Stop::Git(error) => LandError::Failed(Box::new(error)),
        }
    }
}

/// Lands `tasks`, in this order, on the local branch `target` of the repository at
/// `repo_root`: all of them, or none.
pub fn land(
    repo_root: &Utf8Path,
    target: &str,
    tasks: &[Landing],
    mode: LandMode,
) -> Result<Landed, LandError> {
    land_with_git(repo_root, target, tasks, mode).map_err(LandError::from)
}

fn land_with_git(
    repo_root: &Utf8Path,
    target: &str,
    tasks: &[Landing],
    mode: LandMode,
) -> Result<Landed, Stop> {
    let repo = Repository::open(repo_root)?;
    let target_ref = repo
        .find_branch(target, BranchType::Local)?
        .into_reference();
    let start = target_ref
        .target()
        .ok_or_else(|| LandError::Failed(format!("{target} points at no commit").into()))?;
    let checked_out = repo
        .head()
        .ok()
        .and_then(|head| head.name().ok().map(str::to_owned))
        .is_some_and(|head| Some(head.as_str()) == target_ref.name().ok())
        && !repo.is_bare();
    if checked_out {
        let paths =
            dirty_paths(&repo, repo_root).map_err(|error| LandError::Failed(Box::new(error)))?;
        if !paths.is_empty() {
            return Err(LandError::DirtyCheckout {
                target: target.to_owned(),
                path: repo_root.to_string(),
                paths,
            }
            .into());
        }
    }
    let signature = crew_signature()?;
    let mut tip = start;
    // The branch tips landed so far: a task built on one of them (a dependency) brings that
    // work along, which is on the target already, in another shape when squashed or rebased.
    let mut landed_tips: Vec<Oid> = Vec::new();
    for task in tasks {
        let branch_tip = repo
            .find_branch(&task.branch, BranchType::Local)?
            .get()
            .peel_to_commit()?;
        let onto = repo.find_commit(tip)?;
        let upstream = landed_upstream(&repo, &landed_tips, &branch_tip)?;
        landed_tips.push(branch_tip.id());
        tip = match mode {
            LandMode::Merge | LandMode::Squash => {
                // From the upstream's tip, the task's change is its own work alone: what the
                // target lacks. Otherwise git's merge base, as `git merge` would.
                let mut index = match upstream {
                    Some(upstream) => repo.merge_trees(
                        &repo.find_commit(upstream)?.tree()?,
                        &onto.tree()?,
                        &branch_tip.tree()?,
                        None,
                    )?,
                    None => repo.merge_commits(&onto, &branch_tip, None)?,
                };
                if index.has_conflicts() {
                    let mut error = conflict(&index, task, target);
                    if let (Some(branch), LandError::Conflict { both_sides, .. }) =
                        (&task.conflict_branch, &mut error)
                    {
                        *both_sides = Some(both_sides_branch(
                            &repo,
                            &mut index,
                            &onto,
                            &branch_tip,
                            task,
                            branch,
                        )?);
                    }
                    return Err(error.into());
                }
                let tree = repo.find_tree(index.write_tree_to(&repo)?)?;
                if tree.id() == onto.tree_id() {
                    // Nothing of it is missing from the target (landed before): skip it.
                    continue;
                }
                let (message, parents): (String, Vec<&Commit>) = match mode {
                    LandMode::Merge => (
                        format!("Merge {} ({})", task.branch, task.name),
                        vec![&onto, &branch_tip],
                    ),
                    _ => (
                        format!("{} (squashed from {})", task.name, task.branch),
                        vec![&onto],
                    ),
                };
                repo.commit(None, &signature, &signature, &message, &tree, &parents)?
            }
            LandMode::Rebase => replay(&repo, &onto, &branch_tip, upstream, task, target)?,
        };
    }
    if tip == start {
        return Ok(Landed {
            target: target.to_owned(),
            from: start.to_string(),
            to: start.to_string(),
            checkout_updated: false,
        });
    }
    let mut checkout_updated = false;
    if checked_out {
        // The files first (only what differs; a clean tree has nothing to lose), then the ref.
        let tree = repo.find_commit(tip)?.tree()?;
        let mut options = git2::build::CheckoutBuilder::new();
        options.safe();
        repo.checkout_tree(tree.as_object(), Some(&mut options))?;
        checkout_updated = true;
    }
    let message = format!("crew land: {} task(s)", tasks.len());
    repo.reference_matching(
        target_ref.name().unwrap_or_default(),
        tip,
        true,
        start,
        &message,
    )
    .map_err(|_| LandError::TargetMoved {
        target: target.to_owned(),
        expected: start.to_string(),
    })?;
    Ok(Landed {
        target: target.to_owned(),
        from: start.to_string(),
        to: tip.to_string(),
        checkout_updated,
    })
}

/// The newest of the tips landed before that `branch_tip` descends from (the task it was built
/// on, landed in the same call), if any.
fn landed_upstream(
    repo: &Repository,
    landed_tips: &[Oid],
    branch_tip: &Commit,
) -> Result<Option<Oid>, Stop> {
    let mut upstream: Option<Oid> = None;
    for &landed in landed_tips {
        let below =
            landed == branch_tip.id() || repo.graph_descendant_of(branch_tip.id(), landed)?;
        // Of two upstreams, the one that descends from the other holds more of the work.
        let newer = match upstream {
            None => true,
            Some(found) => landed != found && repo.graph_descendant_of(landed, found)?,
        };
        if below && newer {
            upstream = Some(landed);
        }
    }
    Ok(upstream)
}

/// The task's commits (from where it left the target's history, or from the tip of the task it
/// was built on when that landed just before) replayed onto `onto`. A commit that changes
/// nothing there any more is dropped, as `git rebase` drops it.
fn replay(
    repo: &Repository,
    onto: &Commit,
    branch_tip: &Commit,
    upstream: Option<Oid>,
    task: &Landing,
    target: &str,
) -> Result<Oid, Stop> {
    let base = repo.merge_base(onto.id(), branch_tip.id())?;
    let mut walk = repo.revwalk()?;
    walk.push(branch_tip.id())?;
    walk.hide(base)?;
    if let Some(upstream) = upstream {
        walk.hide(upstream)?;
    }
    walk.set_sorting(Sort::TOPOLOGICAL | Sort::REVERSE)?;
    let mut tip = onto.clone();
    for oid in walk {
        let commit = repo.find_commit(oid?)?;
        let mut index = repo.cherrypick_commit(&commit, &tip, 0, None)?;
        if index.has_conflicts() {
            return Err(conflict(&index, task, target).into());
        }
        let tree = repo.find_tree(index.write_tree_to(repo)?)?;
        if tree.id() == tip.tree_id() {
            continue;
        }
        let id = repo.commit(
            None,
            &commit.author(),
            &crew_signature()?,
            commit.message().unwrap_or_default(),
            &tree,
            &[&tip],
        )?;
        tip = repo.find_commit(id)?;
    }
    Ok(tip.id())
}

/// Puts a commit holding both sides of `task`'s conflict on `branch`: the result so far and the
/// task's tip as parents, every file as the merge left it, the conflicting ones with conflict
/// markers. An existing `branch` is moved only when it is one of these (a merge of the same
/// task's work): never onto someone's work.
fn both_sides_branch(
    repo: &Repository,
    index: &mut git2::Index,
    onto: &Commit,
    task_tip: &Commit,
    task: &Landing,
    branch: &str,
) -> Result<String, Stop> {
    let conflicts: Vec<git2::IndexConflict> = index.conflicts()?.collect::<Result<_, _>>()?;
    for conflict in conflicts {
        let sides = [&conflict.ancestor, &conflict.our, &conflict.their];
        let Some(any) = sides.iter().find_map(|side| side.as_ref()) else {
            continue;
        };
        let path = any.path.clone();
        let content = match (&conflict.ancestor, &conflict.our, &conflict.their) {
            (Some(ancestor), Some(ours), Some(theirs)) => {
                let mut options = git2::MergeFileOptions::new();
                options
                    .our_label("the result so far")
                    .their_label(&task.branch);
                repo.merge_file_from_index(ancestor, ours, theirs, Some(&mut options))?
                    .content()
                    .to_vec()
            }
            // Changed on one side, deleted on the other: the changed side, for the agent to
            // keep or delete.
            (_, Some(side), None) | (_, None, Some(side)) => {
                repo.find_blob(side.id)?.content().to_vec()
            }
            _ => Vec::new(),
        };
        let entry = git2::IndexEntry {
            ctime: any.ctime,
            mtime: any.mtime,
            dev: 0,
            ino: 0,
            mode: any.mode,
            uid: 0,
            gid: 0,
            file_size: content.len() as u32,
            id: repo.blob(&content)?,
            // Stage 0: no longer a conflict.
            flags: any.flags & !0x3000,
            flags_extended: 0,
            path: path.clone(),
        };
        index.conflict_remove(std::path::Path::new(
            std::str::from_utf8(&path).unwrap_or_default(),
        ))?;
        index.add(&entry)?;
    }
    let tree = repo.find_tree(index.write_tree_to(repo)?)?;
    let signature = crew_signature()?;
    let message = format!(
        "Both sides of {} on the result so far, with conflict markers\n\nResolve the markers; then land this branch.",
        task.branch
    );
    let commit = repo.commit(
        None,
        &signature,
        &signature,
        &message,
        &tree,
        &[onto, task_tip],
    )?;
    if let Ok(existing) = repo.find_branch(branch, BranchType::Local) {
        let ours = existing
            .get()
            .peel_to_commit()
            .is_ok_and(|tip| tip.parent_id(1).ok() == Some(task_tip.id()));
        if !ours {
            return Err(LandError::Failed(
                format!(
                    "{branch} exists and is not a conflict branch crew made for {}",
                    task.branch
                )
                .into(),
            )
            .into());
        }
    }
    repo.branch(branch, &repo.find_commit(commit)?, true)?;
    Ok(branch.to_owned())
}

fn conflict(index: &git2::Index, task: &Landing, target: &str) -> LandError {
    let mut files: Vec<String> = index
        .conflicts()
        .map(|conflicts| {
            conflicts
                .flatten()
                .filter_map(|conflict| {
                    let entry = conflict.our.or(conflict.their).or(conflict.ancestor)?;
                    Some(String::from_utf8_lossy(&entry.path).into_owned())
                })
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files.dedup();
    LandError::Conflict {
        task: task.name.clone(),
        target: target.to_owned(),
        files,
        both_sides: None,
    }
}
