//! How a task ends: its check, its workspace's teardown (the work saved first, in every
//! outcome), the conflict radar against the other tasks' work, and its final status
//! ([`outcome`]).

use std::time::Duration;

use crew_core::TaskId;
use crew_core::model::{
    CheckRecord, EventKind, ExitRecord, RunEvent, TaskOverlap, TaskRecord, TaskStatus, Timestamp,
    Usage, UsageLimit,
};
use crew_core::provider::{Progress, TaskWorkspace, TeardownRequest};

use super::{RunContext, STOPPED_BY_REQUEST};
use crate::control::registry::AgentHandle;
use crate::project::runner::{CancelLevel, blocking};

impl RunContext {
    /// Runs the task's check command in its workspace, confined like its agent (by the agent's
    /// supervisor, so that `crew agents stop` stops it), and records how it ended. A cancel of
    /// the run stops it as it would the agent. The task's status stays what its agent's exit
    /// made it.
    pub(super) async fn check(&self, task: &TaskRecord, command: &str, handle: &AgentHandle) {
        self.progress_sink(&task.id).tell(Progress::Check {
            command: command.to_owned(),
        });
        let log = self.runner.store.check_log_path(&self.run_id, &task.id);
        let timeout = task.timeout.map_or(CHECK_TIMEOUT, |timeout| timeout.0);
        let mut cancel = self.cancel.subscribe();
        let check = handle.check(command, &log, timeout);
        tokio::pin!(check);
        let mut stop_requests = 0;
        let record = loop {
            let level = *cancel.borrow_and_update();
            stop_as_cancelled(handle, level, &mut stop_requests).await;
            tokio::select! {
                record = &mut check => break record,
                changed = cancel.changed() => {
                    if changed.is_err() {
                        break (&mut check).await;
                    }
                }
            }
        };
        let record = record.unwrap_or_else(|error| CheckRecord {
            passed: Some(false),
            error: Some(error.to_string()),
            ..CheckRecord::pending(command.to_owned())
        });
        let task_id = task.id.clone();
        self.save_task(&format!("task {task_id}'s check"), &task_id, move |task| {
            task.check = Some(record);
            Ok(())
        })
        .await;
    }

    /// Tears the workspace down and records the report. A teardown error is recorded as a
    /// warning; it never replaces the task's outcome.
    pub(super) async fn teardown(&self, task_id: &TaskId, workspace: &TaskWorkspace, keep: bool) {
        self.teardown_then(task_id, workspace, keep, None).await;
    }

    /// Tears the workspace down, then records the report and the task's final `status` (with
    /// its reason) in one write.
    pub(super) async fn finish(
        &self,
        task_id: &TaskId,
        workspace: &TaskWorkspace,
        status: TaskStatus,
        reason: Option<String>,
    ) {
        self.teardown_then(task_id, workspace, false, Some((status, reason)))
            .await;
    }

    pub(super) async fn teardown_then(
        &self,
        task_id: &TaskId,
        workspace: &TaskWorkspace,
        keep: bool,
        finish: Option<(TaskStatus, Option<String>)>,
    ) {
        let provider = self.runner.provider.clone();
        let request = TeardownRequest {
            workspace: self.runner.workspace.id().clone(),
            repo_root: self.runner.workspace.repo_root().map(Into::into),
            run_id: self.run_id.clone(),
            task_id: task_id.clone(),
            agent_alive: false,
            keep,
            placed_for: self.placed_for.clone(),
        };
        let allocated = workspace.clone();
        let mut result = blocking(move || {
            provider
                .teardown(&allocated, &request)
                .map_err(|error| (error.message.clone(), error.partial))
        })
        .await;
        let landed = self
            .landed
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .remove(task_id);
        // A placed task's work started from the run's base, as a worktree task's does: its
        // record says so, so that its work can be diffed and landed like theirs.
        let placed_base = landed.as_ref().and(self.base.clone());
        if let (Ok(report), Some((branch, tip))) = (&mut result, landed) {
            // A placed task: its work is on its branch here, checked as it came back; what it
            // changes is counted here, as a worktree's teardown counts it.
            if let (Some(base), Some(repo_root)) =
                (placed_base.clone(), self.runner.workspace.repo_root())
            {
                let (provider, repo_root, counted) = (
                    self.runner.provider.clone(),
                    repo_root.to_owned(),
                    branch.clone(),
                );
                report.diffstat = blocking(move || {
                    Ok::<_, std::convert::Infallible>(
                        provider.branch_diffstat(&repo_root, &base, &counted),
                    )
                })
                .await
                .unwrap_or_else(|never| match never {});
            }
            report.merge_hint = Some(format!("git merge {branch}"));
            report.branch = Some(branch);
            report.tip = Some(tip);
        }
        let saved_at = match &result {
            Ok(report) => report
                .branch
                .clone()
                .or(report.preserved.as_ref().map(ToString::to_string)),
            Err((_, partial)) => Some(workspace.dir.to_string()).filter(|_| !partial.removed),
        };
        if let Some(saved_at) = saved_at.filter(|_| !keep) {
            self.saved
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .push(format!("{task_id} in {saved_at}"));
        }
        // Ended, it lets go of its ports; a task kept for a resume keeps them (its host's
        // lease files name a host that will be gone, and a resume takes them again).
        if finish.is_some() {
            self.release_lease(task_id);
        }
        let task = task_id.clone();
        let radar_turn = self.radar.lock().await;
        let finishing = finish.clone();
        let run_id = self.run_id.clone();
        let saved = self
            .save_task(
                &format!("task {task_id}'s teardown"),
                &task,
                move |record| {
                    if let (Some(base), Some(workspace)) = (placed_base, record.workspace.as_mut())
                    {
                        workspace.base_commit.get_or_insert(base);
                    }
                    match result {
                        Ok(report) => {
                            record.warnings.extend(
                                report
                                    .warnings
                                    .iter()
                                    .map(|warning| format!("teardown: {warning}")),
                            );
                            record.teardown = Some(report);
                        }
                        Err((message, partial)) => {
                            record.warnings.push(format!("teardown: {message}"));
                            record.warnings.extend(
                                partial
                                    .warnings
                                    .iter()
                                    .map(|warning| format!("teardown: {warning}")),
                            );
                            record.teardown = Some(*partial);
                        }
                    }
                    // A refused status never costs the report its record.
                    let finished = finishing.map(|(status, why)| {
                        record
                            .set_status(&run_id, status, Timestamp::now())
                            .map(|()| {
                                if why.is_some() {
                                    record.reason = why;
                                }
                                record.clone()
                            })
                    });
                    Ok(finished)
                },
            )
            .await;
        // The other tasks' branches as they are now, read with the radar's turn still held.
        let branches = match saved {
            Some(_) => {
                let task = task_id.clone();
                self.runner
                    .look(&self.run_id, move |manifest| {
                        let branches = manifest
                            .task_branches()
                            .into_iter()
                            .filter(|(other, _)| !manifest.rivals(task.as_str(), other))
                            .collect::<Vec<_>>();
                        (branches, manifest.base_branch.clone())
                    })
                    .await
                    .ok()
            }
            None => None,
        };
        drop(radar_turn);
        if let Some((status, reason)) = finish {
            let record = match saved.flatten() {
                Some(Ok(record)) => Some(record),
                Some(Err(refused)) => {
                    self.runner.unrecorded(
                        &self.run_id,
                        &format!("task {task_id} {status}"),
                        &refused,
                    );
                    None
                }
                None => None,
            };
            self.runner
                .announce(&self.run_id, task_id, status, reason, record);
        }
        if let Some((branches, target)) = branches {
            self.radar(task_id, branches, target).await;
        }
    }

    /// The conflict radar, when a task's branch appears: which other task branches of the run,
    /// and the branch the run started from, its work would conflict with. Each overlap is
    /// recorded on both tasks and as an event of this one.
    pub(super) async fn radar(
        &self,
        task_id: &TaskId,
        branches: Vec<(String, String)>,
        target: Option<String>,
    ) {
        let Some(repo_root) = self.runner.workspace.repo_root().map(ToOwned::to_owned) else {
            return;
        };
        let name = task_id.to_string();
        let Some(own) = branches
            .iter()
            .find(|(task, _)| *task == name)
            .map(|(_, branch)| branch.clone())
        else {
            return;
        };
        let others: Vec<(String, String)> = branches
            .into_iter()
            .filter(|(task, _)| *task != name)
            .collect();
        let provider = self.runner.provider.clone();
        let found = blocking(move || {
            Ok::<_, std::convert::Infallible>(provider.overlaps(
                &repo_root,
                &own,
                &others,
                target.as_deref(),
            ))
        })
        .await
        .unwrap_or_else(|never| match never {});
        if found.is_empty() {
            return;
        }
        let task = task_id.clone();
        let recorded = found.clone();
        self.save(&format!("task {task_id}'s overlaps"), move |manifest| {
            for overlap in recorded {
                let mine = TaskOverlap {
                    with: overlap.with.clone(),
                    files: overlap.files.clone(),
                };
                let record = manifest.task_mut(&task)?;
                if !record.overlaps.contains(&mine) {
                    record.overlaps.push(mine);
                }
                // The other side learns of it too, when it is a task of the run.
                if let Ok(other) = TaskId::parse(&overlap.with)
                    && let Ok(record) = manifest.task_mut(&other)
                {
                    let theirs = TaskOverlap {
                        with: task.to_string(),
                        files: overlap.files,
                    };
                    if !record.overlaps.contains(&theirs) {
                        record.overlaps.push(theirs);
                    }
                }
            }
            Ok(())
        })
        .await;
        for overlap in found {
            self.runner.record_event(
                &self.run_id,
                RunEvent::new(
                    Some(task_id.clone()),
                    EventKind::Overlap {
                        with: overlap.with,
                        files: overlap.files,
                    },
                ),
            );
        }
    }
}

/// What an agent's protocol reported, as its task records it.
pub(super) struct AgentReport {
    session_id: Option<String>,
    /// The task's usage before this host's starts, plus theirs.
    pub(super) usage: Option<Usage>,
    warning: Option<String>,
    limit: Option<UsageLimit>,
    pub(super) refused_writes: Vec<String>,
    refused_hosts: Vec<String>,
}

impl AgentReport {
    pub(super) fn of(handle: &AgentHandle, prior: Option<Usage>) -> Self {
        let status = handle.status();
        AgentReport {
            session_id: status.session_id,
            usage: Usage::sum(prior.into_iter().chain(status.usage)),
            warning: status.protocol_warning,
            limit: status.limit,
            refused_writes: status.refused_writes,
            refused_hosts: status.refused_hosts,
        }
    }

    pub(super) fn apply(self, record: &mut TaskRecord) {
        if self.session_id.is_some() {
            record.session_id = self.session_id;
        }
        if self.usage.is_some() {
            record.usage = self.usage;
        }
        // The last start's: a limit that lifted and let a resume finish is no longer there.
        record.limit = self.limit;
        let refused = (!self.refused_writes.is_empty())
            .then(|| crate::agent::refusals::note(&self.refused_writes, &record.agent));
        let refused_hosts = (!self.refused_hosts.is_empty()).then(|| {
            format!(
                "crew's proxy refused its agent's requests: {}",
                self.refused_hosts.join("; ")
            )
        });
        for warning in self.warning.into_iter().chain(refused).chain(refused_hosts) {
            if !record.warnings.contains(&warning) {
                record.warnings.push(warning);
            }
        }
    }
}

/// How long a check command may run when its task has no timeout of its own: long enough for
/// a real test suite, short enough that a hung one does not hold the run for half an hour.
pub(super) const CHECK_TIMEOUT: Duration = Duration::from_secs(10 * 60);

/// The task status an exit means, and why.
pub(super) fn outcome(
    exit: &ExitRecord,
    cancelled: bool,
    timeout: Option<Duration>,
) -> (TaskStatus, Option<String>) {
    if cancelled {
        return (
            TaskStatus::Cancelled,
            Some("the run was cancelled".to_owned()),
        );
    }
    if exit.timed_out {
        let limit = timeout.map_or_else(String::new, |timeout| {
            format!(" after {}", crew_core::config::HumanDuration(timeout))
        });
        return (TaskStatus::Failed, Some(format!("timed out{limit}")));
    }
    if exit.stopped_by.is_some() {
        return (TaskStatus::Stopped, Some(STOPPED_BY_REQUEST.to_owned()));
    }
    if exit.ended_after_session {
        return (TaskStatus::Succeeded, None);
    }
    match (exit.code, exit.signal) {
        (Some(0), _) => (TaskStatus::Succeeded, None),
        (Some(code), _) => (
            TaskStatus::Failed,
            Some(format!("the agent exited with code {code}")),
        ),
        (None, Some(signal)) => (
            TaskStatus::Failed,
            Some(format!("the agent was killed by signal {signal}")),
        ),
        (None, None) => (
            TaskStatus::Failed,
            Some("the agent ended without a status".to_owned()),
        ),
    }
}

/// Sends the agent (or its check) as many stops as the run's cancel `level` asks, beyond the
/// `sent` ones: Graceful one (TERM, grace, KILL), Kill a second at once. Each goes from a task
/// of its own, as a stop is answered only once the agent has ended.
pub(super) async fn stop_as_cancelled(handle: &AgentHandle, level: CancelLevel, sent: &mut u32) {
    let wanted = match level {
        CancelLevel::None => 0,
        CancelLevel::Graceful => 1,
        CancelLevel::Kill => 2,
    };
    while *sent < wanted {
        *sent += 1;
        let handle = handle.clone();
        tokio::spawn(async move { handle.stop().await });
        // The second comes after the first, as a second stop.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
