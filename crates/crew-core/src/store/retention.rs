//! Runs whose host died marked interrupted, and finished runs pruned by the retention
//! settings, or removed one by one.

use std::time::{Duration, SystemTime};

use camino::Utf8Path;

use super::{PruneReport, StateError, StateStore};
use crate::config::RetentionSettings;
use crate::fsutil::real_dir_exists;
use crate::ids::{RunId, TaskId};
use crate::model::{
    EventKind, INTERRUPTED_REASON, MANIFEST_SCHEMA_VERSION, RunEvent, RunManifest, RunStatus,
    TaskRecord, TaskStatus, Timestamp,
};
use crate::paths::remove_contained;

/// When a task whose host died was last seen going on: the later of its run's last write or
/// its host's last sign of life (`last_written`) and its agent's last output, never before the task started nor after now
/// (an agent can set its log's time to anything). Its host died after that, when nobody
/// recorded.
fn last_seen(task: &TaskRecord, last_written: Timestamp, log: &Utf8Path) -> Timestamp {
    let output = std::fs::symlink_metadata(log)
        .and_then(|metadata| metadata.modified())
        .map(Timestamp);
    let seen = output.map_or(last_written, |output| output.max(last_written));
    let seen = task.started_at.map_or(seen, |started| seen.max(started));
    seen.min(Timestamp::now())
}

impl StateStore {
    /// Marks every `running` run of this workspace whose host process is gone as `interrupted`;
    /// its tasks that were preparing or running become `failed` with the reason. Runs of other
    /// workspaces are never looked at. Returns the runs it changed.
    pub fn reconcile(&self) -> Result<Vec<RunId>, StateError> {
        let mut interrupted = Vec::new();
        // Only the runs the index says are running: finished runs are never read.
        for run_id in self.running_run_ids()? {
            // Cheap check without the lock first: the run's status and host, not its tasks.
            let manifest = match self.glance_run(&run_id) {
                Ok(manifest) => manifest,
                Err(_) if !real_dir_exists(&self.run_dir(&run_id)).unwrap_or(true) => {
                    // The run is gone (removed by hand): so is its marker.
                    let _lock = self.lock()?;
                    self.remove_marker(&run_id)?;
                    continue;
                }
                Err(_) => continue,
            };
            if manifest.status != RunStatus::Running {
                // A marker a crash left behind: checked again under the lock, then removed.
                let _lock = self.lock()?;
                if self
                    .read_run(&run_id)
                    .is_ok_and(|manifest| manifest.status != RunStatus::Running)
                {
                    self.remove_marker(&run_id)?;
                }
                continue;
            }
            if manifest
                .host
                .as_ref()
                .is_some_and(|host| host.identity.is_alive())
            {
                continue;
            }
            let changed = self.update_run(&run_id, |manifest| {
                // Checked again under the lock: the host may have finished the run meanwhile.
                if manifest.status != RunStatus::Running || host_alive(manifest) {
                    return Ok(None);
                }
                let reason = match &manifest.host {
                    Some(host) => format!("host process {} is gone", host.identity.pid),
                    None => "the run has no recorded host".to_owned(),
                };
                let active: Vec<TaskId> = manifest
                    .tasks
                    .iter()
                    .filter(|task| {
                        matches!(task.status, TaskStatus::Preparing | TaskStatus::Running)
                    })
                    .map(|task| task.id.clone())
                    .collect();
                // The host died at a moment nobody recorded, maybe long before now: each task
                // and the run end when they were last seen, not when the death was noticed.
                // Its host's last sign of life, too: it marks the run alive every few
                // seconds, so an agent that printed nothing for an hour still ran that hour.
                let last_written = self
                    .marked_alive_at(&run_id)
                    .map_or(manifest.updated_at, |alive| alive.max(manifest.updated_at));
                let mut run_seen = last_written;
                for task_id in &active {
                    let log = self.output_log_path(&run_id, task_id);
                    let task = manifest.set_task_status(task_id, TaskStatus::Failed)?;
                    task.reason = Some(format!("{INTERRUPTED_REASON}{reason}"));
                    let seen = last_seen(task, last_written, &log);
                    run_seen = run_seen.max(seen);
                    task.finished_at = Some(seen);
                }
                manifest.set_status(RunStatus::Interrupted)?;
                // Stamped now by the change: the run, too, ended when it was last seen.
                manifest.finished_at = Some(run_seen.min(Timestamp::now()));
                manifest.reason = Some(reason.clone());
                Ok(Some((reason, active)))
            })?;
            if let Some((reason, active)) = changed {
                // The run's history says its host died, as it says everything else. The
                // manifest holds the same: an event that cannot be written loses nothing.
                let mut events: Vec<RunEvent> = active
                    .into_iter()
                    .map(|task_id| {
                        RunEvent::new(
                            Some(task_id),
                            EventKind::TaskStatus {
                                status: TaskStatus::Failed,
                                reason: Some(format!("{INTERRUPTED_REASON}{reason}")),
                            },
                        )
                    })
                    .collect();
                events.push(RunEvent::new(
                    None,
                    EventKind::RunStatus {
                        status: RunStatus::Interrupted,
                        reason: Some(reason),
                    },
                ));
                for event in &events {
                    // Events are a log for people; the run's record, written above, is the truth.
                    let _ = self.append_event(&run_id, event);
                }
                interrupted.push(run_id);
            }
        }
        Ok(interrupted)
    }

    /// Applies retention: finished runs beyond `max_kept_runs` (newest kept) or older than
    /// `max_run_age_days` are removed with their `dedicated` workspaces. Running runs, runs with
    /// a task waiting for an answer, and unreadable runs are never pruned.
    pub fn prune(
        &self,
        retention: &RetentionSettings,
        now: SystemTime,
        dry_run: bool,
    ) -> Result<PruneReport, StateError> {
        self.prune_where(retention, now, dry_run, |_| true)
    }

    /// [`StateStore::prune`] as crew does it by itself: only runs whose every task's work is
    /// on a branch, in the project itself, or was never there (a `dedicated` workspace, a
    /// preserved worktree or one never torn down keeps its run).
    pub fn prune_saved(
        &self,
        retention: &RetentionSettings,
        now: SystemTime,
    ) -> Result<PruneReport, StateError> {
        self.prune_where(retention, now, false, |manifest| {
            manifest.tasks.iter().all(TaskRecord::work_is_saved)
        })
    }

    /// Whether retention may have something to prune, from the runs' names alone (no manifest
    /// is read): more runs than `max_kept_runs`, or an oldest run older than
    /// `max_run_age_days`. What a run's end checks before it starts a prune.
    pub fn prune_due(&self, retention: &RetentionSettings, now: SystemTime) -> bool {
        let Ok(entries) = self.runs_dir().read_dir_utf8() else {
            return false;
        };
        let ids: Vec<RunId> = entries
            .flatten()
            .filter_map(|entry| RunId::parse(entry.file_name()).ok())
            .collect();
        if ids.len() > retention.max_kept_runs {
            return true;
        }
        let max_age = Duration::from_secs(retention.max_run_age_days.saturating_mul(86_400));
        ids.iter()
            .filter_map(RunId::created_millis)
            .min()
            .is_some_and(|oldest| {
                let created = SystemTime::UNIX_EPOCH + Duration::from_millis(oldest);
                now.duration_since(created).unwrap_or_default() > max_age
            })
    }

    pub(super) fn prune_where(
        &self,
        retention: &RetentionSettings,
        now: SystemTime,
        dry_run: bool,
        may_remove: impl Fn(&RunManifest) -> bool,
    ) -> Result<PruneReport, StateError> {
        let max_age = Duration::from_secs(retention.max_run_age_days.saturating_mul(86_400));
        let mut report = PruneReport::default();
        let mut finished_seen = 0usize;
        for listing in self.list_runs()? {
            let Ok(manifest) = listing.manifest else {
                report.kept += 1;
                continue;
            };
            let prunable = manifest.schema_version <= MANIFEST_SCHEMA_VERSION
                && manifest.status.is_finished()
                && !manifest
                    .tasks
                    .iter()
                    .any(|task| matches!(task.status, TaskStatus::Waiting | TaskStatus::Paused))
                && may_remove(&manifest);
            if !prunable {
                report.kept += 1;
                continue;
            }
            finished_seen += 1;
            let finished = manifest.finished_at.unwrap_or(manifest.updated_at).0;
            let too_old = now.duration_since(finished).unwrap_or_default() > max_age;
            if finished_seen <= retention.max_kept_runs && !too_old {
                report.kept += 1;
                continue;
            }
            if !dry_run {
                self.remove_run(&listing.run_id)?;
            }
            report.pruned.push(listing.run_id);
        }
        Ok(report)
    }

    /// Removes a run's directory and its `dedicated` workspaces, refusing anything outside
    /// `.crew/state`.
    pub fn remove_run(&self, run_id: &RunId) -> Result<(), StateError> {
        let _lock = self.lock()?;
        // A run of another crew's format is not this crew's to remove: a newer crew may still
        // need it, and its workspaces may hold what this crew cannot see.
        match self.glance_run(run_id) {
            Ok(glance) if glance.schema_version > MANIFEST_SCHEMA_VERSION => {
                return Err(StateError::NewerSchema {
                    path: self.manifest_path(run_id),
                    found: glance.schema_version,
                    supported: MANIFEST_SCHEMA_VERSION,
                });
            }
            Err(error @ (StateError::NewerSchema { .. } | StateError::OlderSchema { .. })) => {
                return Err(error);
            }
            _ => {}
        }
        let roots = [self.state_dir.as_path()];
        remove_contained(&self.dedicated_root().join(run_id.as_str()), &roots).map_err(
            |source| StateError::Remove {
                run_id: run_id.clone(),
                source,
            },
        )?;
        remove_contained(&self.run_dir(run_id), &roots).map_err(|source| StateError::Remove {
            run_id: run_id.clone(),
            source,
        })?;
        // A running run is never removed; a stale marker goes with its run.
        self.remove_marker(run_id)?;
        Ok(())
    }
}

pub(super) fn host_alive(manifest: &RunManifest) -> bool {
    manifest
        .host
        .as_ref()
        .is_some_and(|host| host.identity.is_alive())
}
