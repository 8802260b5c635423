//! The tripwire: while tasks run, a copy of what an agent could change in the shared git
//! directory (config, hooks, info, alternates, submodules' configs) and of the repository's
//! refs for unconfined agents; at teardown, what changed is put back and reported.

use std::collections::HashSet;
use std::collections::hash_map::Entry;

use camino::{Utf8Path, Utf8PathBuf};
use crew_core::provider::{
    SecurityFinding, TaskWorkspace, TeardownRequest, WorkspaceKind, WorkspaceRequest,
};
use crew_core::{RunId, StateStore, TaskId};

use super::{CrewWorkspaces, repository_common_dir};
use crate::tripwire::Baseline;

impl CrewWorkspaces {
    /// Starts watching the repository's git files for this task: a fresh copy of them when no
    /// other task of the repository is active in this process, the copy already taken
    /// otherwise (it must predate every agent that could have changed them) — or, for a run
    /// taken up again after its host died, the copy saved beside it then. The copy is saved
    /// beside the run while its tasks are active.
    pub(super) fn arm_tripwire(&self, request: &WorkspaceRequest, kind: WorkspaceKind) {
        let Some(repo_root) = request.repo_root.as_deref() else {
            return;
        };
        // An agent the kernel confines to a workspace of its own cannot write the shared git
        // directory: what changes there meanwhile is the user's (a `git config`, a hook, what
        // `git gc` writes), never put back or reported on its account. A `single` task works
        // in the project itself, its git directory included.
        if !request.unconfined && kind != WorkspaceKind::Single {
            self.beyond_reach()
                .insert((request.run_id.clone(), request.task_id.clone()));
            return;
        }
        let saved = tripwire_file(&request.workspace, repo_root, &request.run_id);
        let mut tripwires = self.tripwires();
        let tripwire = match tripwires.entry(repo_root.to_owned()) {
            Entry::Occupied(entry) => {
                let tripwire = entry.into_mut();
                if tripwire.active.is_empty() {
                    tripwire.baseline = Baseline::load(&saved, &tripwire.common)
                        .unwrap_or_else(|| Baseline::of_repository(&tripwire.common));
                }
                tripwire
            }
            Entry::Vacant(entry) => {
                let Some(common) = repository_common_dir(repo_root) else {
                    return;
                };
                entry.insert(Tripwire {
                    baseline: Baseline::load(&saved, &common)
                        .unwrap_or_else(|| Baseline::of_repository(&common)),
                    common,
                    active: HashSet::new(),
                })
            }
        };
        let run_active = tripwire
            .active
            .iter()
            .any(|(run_id, _)| *run_id == request.run_id);
        // An agent that will run unconfined can write the refs itself: they are recorded
        // before it starts, to say what it destroyed.
        let recorded = request.unconfined
            && git2::Repository::open(repo_root)
                .is_ok_and(|repo| tripwire.baseline.record_refs(&repo));
        if recorded || (!run_active && !saved.is_file()) {
            // Not fatal: without it, a teardown after the host died has no copy to check.
            let _ = tripwire.baseline.save(&saved);
        }
        tripwire
            .active
            .insert((request.run_id.clone(), request.task_id.clone()));
    }

    /// Puts back what changed since the tripwire was armed, keeps the changed versions in the
    /// task's state directory, and reports each change.
    pub(super) fn check_tripwire(
        &self,
        workspace: &TaskWorkspace,
        request: &TeardownRequest,
    ) -> Vec<SecurityFinding> {
        let Some(repo_root) = request.repo_root.as_deref() else {
            return Vec::new();
        };
        let saved = tripwire_file(&request.workspace, repo_root, &request.run_id);
        let key = (request.run_id.clone(), request.task_id.clone());
        {
            let mut beyond_reach = self.beyond_reach();
            if beyond_reach.contains(&key) {
                if !request.keep {
                    beyond_reach.remove(&key);
                }
                return Vec::new();
            }
        }
        let mut tripwires = self.tripwires();
        let armed = tripwires
            .get(repo_root)
            .is_some_and(|tripwire| tripwire.active.contains(&key));
        let common = match tripwires.get(repo_root) {
            Some(tripwire) => tripwire.common.clone(),
            None => match repository_common_dir(repo_root) {
                Some(common) => common,
                None => return Vec::new(),
            },
        };
        // A worktree's own config, which crew never writes: any is the agent's.
        let own = match workspace.kind {
            WorkspaceKind::Worktree => {
                let names = crate::names::TaskNames::new(
                    repo_root,
                    &self.settings,
                    &request.run_id,
                    &request.task_id,
                );
                vec![
                    common
                        .join("worktrees")
                        .join(names.admin)
                        .join("config.worktree"),
                ]
            }
            _ => Vec::new(),
        };
        let evidence = StateStore::new(&request.workspace, request.repo_root.as_deref())
            .task_dir(&request.run_id, &request.task_id)
            .join("tripwire");
        let Some(tripwire) = tripwires.get_mut(repo_root).filter(|_| armed) else {
            // Not armed in this process: a teardown after the host died, checked against the
            // copy saved beside the run then.
            return Baseline::load(&saved, &common)
                .map(|mut baseline| {
                    let mut findings = baseline.restore(&own, &evidence);
                    findings.extend(self.check_refs(&mut baseline, repo_root, [&key]));
                    findings.extend(baseline.check_objects(&evidence));
                    findings
                })
                .unwrap_or_default();
        };
        let mut findings = tripwire.baseline.restore(&own, &evidence);
        let active: Vec<(RunId, TaskId)> = tripwire.active.iter().cloned().collect();
        findings.extend(self.check_refs(&mut tripwire.baseline, repo_root, active.iter()));
        findings.extend(tripwire.baseline.check_objects(&evidence));
        if !request.keep {
            tripwire.active.remove(&key);
            if !tripwire
                .active
                .iter()
                .any(|(run_id, _)| *run_id == request.run_id)
            {
                // A copy left behind is read by no one once its run is gone; the next arm writes
                // over it.
                let _ = std::fs::remove_file(&saved);
            }
        }
        findings
    }

    /// What an unconfined agent destroyed of the refs recorded before it started (see
    /// [`Baseline::check_refs`]), but for the branches the `tasks` may move and the checkout's.
    pub(super) fn check_refs<'a>(
        &self,
        baseline: &mut Baseline,
        repo_root: &Utf8Path,
        tasks: impl IntoIterator<Item = &'a (RunId, TaskId)>,
    ) -> Vec<SecurityFinding> {
        if !baseline.has_refs() {
            return Vec::new();
        }
        let Ok(repo) = git2::Repository::open(repo_root) else {
            return Vec::new();
        };
        let mut own: Vec<String> = tasks
            .into_iter()
            .map(|(run_id, task_id)| {
                crate::names::TaskNames::new(repo_root, &self.settings, run_id, task_id)
                    .branch_ref()
            })
            .collect();
        if let Some(head) = repo
            .find_reference("HEAD")
            .ok()
            .and_then(|head| head.symbolic_target().ok().flatten().map(str::to_owned))
        {
            own.push(head);
        }
        baseline.check_refs(&repo, &own)
    }

    /// After crew moved (or deleted) a task's branch at its teardown: the tripwire's record of
    /// the refs follows.
    pub(super) fn note_task_branch(&self, request: &TeardownRequest) {
        let Some(repo_root) = request.repo_root.as_deref() else {
            return;
        };
        let mut tripwires = self.tripwires();
        let Some(tripwire) = tripwires.get_mut(repo_root) else {
            return;
        };
        if !tripwire.baseline.has_refs() {
            return;
        }
        let Ok(repo) = git2::Repository::open(repo_root) else {
            return;
        };
        let branch = crate::names::TaskNames::new(
            repo_root,
            &self.settings,
            &request.run_id,
            &request.task_id,
        )
        .branch_ref();
        tripwire.baseline.note_ref(&repo, &branch);
    }
}

/// The files a repository's tasks must not change, as they were before the first of the tasks
/// now active started.
#[derive(Debug)]
pub(super) struct Tripwire {
    /// The repository's common git directory.
    common: Utf8PathBuf,
    baseline: Baseline,
    active: HashSet<(RunId, TaskId)>,
}

/// Where the tripwire's copy is saved beside a run while its tasks are active.
pub(super) fn tripwire_file(
    workspace: &crew_core::WorkspaceId,
    repo_root: &Utf8Path,
    run_id: &RunId,
) -> Utf8PathBuf {
    StateStore::new(workspace, Some(repo_root))
        .run_dir(run_id)
        .join("tripwire.json")
}
