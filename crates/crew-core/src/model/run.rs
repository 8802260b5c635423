//! A run's manifest, its host, who cancelled it, and the glance at it a listing reads.

use std::fmt;

use camino::Utf8PathBuf;
use serde::{Deserialize, Serialize};

use crate::config::WorkspaceMode;
use crate::host::HostIdentity;
use crate::ids::{RunId, TaskId, WorkspaceId};
use crate::model::status::{
    MANIFEST_SCHEMA_VERSION, RunStatus, TaskStatus, Timestamp, TransitionError,
};
use crate::model::task::{LeaseRecord, TaskRecord};
use crate::model::usage::Usage;

/// Where the host of a run can be reached.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostRecord {
    /// Who the host is: pid, start time and boot id.
    #[serde(flatten)]
    pub identity: HostIdentity,
    /// The control socket of the host, when it serves one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket: Option<Utf8PathBuf>,
    /// Who hosts the run (`crew run`, an editor), for listings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
}

/// `runs/<runId>/manifest.json`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunManifest {
    /// The manifest's format; a newer one is read-only to this crew.
    pub schema_version: u32,
    /// The run's id.
    pub run_id: RunId,
    /// The workspace the run belongs to.
    pub cwd: WorkspaceId,
    /// Where in the workspace the run was started, relative to the repository root.
    #[serde(default)]
    pub invocation_dir: Utf8PathBuf,
    /// The team it runs, when it runs one (not an ad hoc run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
    /// The workspace mode of every task that names none of its own.
    pub workspace_mode: WorkspaceMode,
    /// Where it stands: see [`RunStatus`].
    pub status: RunStatus,
    /// Why it ended as it did, when that needs saying.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// When it was created.
    pub created_at: Timestamp,
    /// When its manifest was last written.
    pub updated_at: Timestamp,
    /// When it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Timestamp>,
    /// The process hosting it while it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<HostRecord>,
    /// The commit or ref worktree tasks start from; the leader's HEAD when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
    /// The branch `base` was the tip of when the run started (`main`), when it was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_branch: Option<String>,
    /// How many tasks run at once.
    pub max_parallel: usize,
    /// Whether a failed task cancels the rest.
    #[serde(default)]
    pub fail_fast: bool,
    /// Who cancelled the run and why: the first request, when there were several.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancelled_by: Option<CancelRecord>,
    /// Its tasks, in the order they were planned (attempts after their task).
    pub tasks: Vec<TaskRecord>,
    /// While it runs: which generation of its task journal (`changes.jsonl`, beside the
    /// manifest) goes with this manifest. A change to one task is appended there rather than
    /// written with the whole manifest; the store reads it back with the manifest, and folds
    /// it in at the next whole write (`StateStore`). Absent once the run ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub journal: Option<u64>,
    /// The run of the crew host this run works for, when it is a placement's (`crew shim`):
    /// the commits crew makes of its tasks' work name that run, not this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placed_for: Option<RunId>,
    /// The run's spend cap (`max_cost_usd`), its tasks together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost: Option<super::SpendCap>,
    /// The user's cap of a day (`max_cost_usd_per_day`), as this run holds it: what every run
    /// of the day spent, together, pauses its tasks there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub day_cap: Option<super::SpendCap>,
}

/// Who asked for a run to be cancelled, from where, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CancelRecord {
    /// Why.
    pub cause: CancelCause,
    /// The process that asked (for a signal: the host that received it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// The user id of the process that asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// Whether it asked from another terminal session than the host's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub other_session: Option<bool>,
    /// `crew runs cancel --force`.
    #[serde(default)]
    pub forced: bool,
    /// The task whose failure cancelled the run (`fail_fast`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<TaskId>,
    /// When.
    pub at: Timestamp,
}

/// Why a run was cancelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CancelCause {
    /// Ctrl-C (SIGINT) in the host's terminal.
    Interrupt,
    /// SIGTERM to the host.
    Terminate,
    /// `crew runs cancel`, through the host's socket.
    RunsCancel,
    /// A task failed and the run has `fail_fast`.
    FailFast,
    /// `crew runs cancel` of a run whose host was gone.
    HostGone,
    /// The editor's `session/cancel` (`crew serve`).
    Editor,
    /// `crew shim`: the connection to the crew host that asked for the run was lost.
    TransportLost,
    /// The program hosting the run closed (or dropped) its host: an editor closing the
    /// folder.
    HostClosed,
}

impl CancelRecord {
    /// A request for `cause`, nothing else known yet.
    pub fn new(cause: CancelCause) -> Self {
        CancelRecord {
            cause,
            pid: None,
            uid: None,
            other_session: None,
            forced: false,
            task: None,
            at: Timestamp::now(),
        }
    }

    /// Asked by this process.
    pub fn by_this_process(cause: CancelCause) -> Self {
        CancelRecord {
            pid: Some(std::process::id()),
            uid: Some(rustix::process::getuid().as_raw()),
            ..CancelRecord::new(cause)
        }
    }
}

impl fmt::Display for CancelRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.cause {
            CancelCause::Interrupt => f.write_str("by Ctrl-C in the host's terminal")?,
            CancelCause::Terminate => f.write_str("by a TERM signal to the host")?,
            CancelCause::RunsCancel if self.forced => {
                f.write_str("by `crew runs cancel --force`")?
            }
            CancelCause::RunsCancel => f.write_str("by `crew runs cancel`")?,
            CancelCause::FailFast => match &self.task {
                Some(task) => write!(f, "because task {task} failed (fail_fast)")?,
                None => f.write_str("because a task failed (fail_fast)")?,
            },
            CancelCause::HostGone => {
                f.write_str("by `crew runs cancel` after its host was gone")?
            }
            CancelCause::Editor => f.write_str("by the editor (session/cancel)")?,
            CancelCause::TransportLost => {
                f.write_str("because the connection to its host was lost")?
            }
            CancelCause::HostClosed => f.write_str("because the program hosting it closed")?,
        }
        let mut who = Vec::new();
        if let Some(pid) = self.pid {
            who.push(format!("pid {pid}"));
        }
        if let Some(uid) = self.uid {
            who.push(format!("uid {uid}"));
        }
        match self.other_session {
            Some(true) => who.push("from another session".to_owned()),
            Some(false) => who.push("from the host's session".to_owned()),
            None => {}
        }
        if !who.is_empty() {
            write!(f, " ({})", who.join(", "))?;
        }
        write!(f, " at {}", self.at)
    }
}

/// The part of a run manifest that says whether the run is live and who hosts it, read without
/// the tasks: what finding the live hosts of a workspace needs from every run, finished ones
/// included.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct RunGlance {
    /// The manifest's format.
    pub schema_version: u32,
    /// The run's id.
    pub run_id: RunId,
    /// The project folder the run belongs to.
    pub cwd: WorkspaceId,
    /// Whether it runs.
    pub status: RunStatus,
    /// The process hosting it, while it runs.
    #[serde(default)]
    pub host: Option<HostRecord>,
}

/// `items` with each one's children right after it (in their order), and how deep each is.
/// `id` names an item, `parent` the item it is a child of; an item whose parent is not among
/// `items` stands at the top.
pub fn family_order<T, K: PartialEq>(
    items: &[T],
    id: impl Fn(&T) -> K,
    parent: impl Fn(&T) -> Option<K>,
) -> Vec<(&T, usize)> {
    let ids: Vec<K> = items.iter().map(&id).collect();
    let parents: Vec<Option<usize>> = items
        .iter()
        .map(|item| {
            let parent = parent(item)?;
            ids.iter().position(|id| *id == parent)
        })
        .collect();
    let mut ordered = Vec::with_capacity(items.len());
    let mut placed = vec![false; items.len()];
    // Depth first from the top items; an item is placed once even if the ids repeat.
    let mut stack: Vec<(usize, usize)> = (0..items.len())
        .rev()
        .filter(|&index| parents[index].is_none())
        .map(|index| (index, 0))
        .collect();
    while let Some((index, depth)) = stack.pop() {
        if std::mem::replace(&mut placed[index], true) {
            continue;
        }
        ordered.push((&items[index], depth));
        stack.extend(
            (0..items.len())
                .rev()
                .filter(|&child| parents[child] == Some(index) && child != index)
                .map(|child| (child, depth + 1)),
        );
    }
    // Items whose parents name each other in a circle have no top: they stand at it.
    ordered.extend(
        (0..items.len())
            .filter(|&index| !placed[index])
            .map(|index| (&items[index], 0)),
    );
    ordered
}

impl RunManifest {
    /// The lease `task` holds: a task that may go on holds its own while its run goes on; once
    /// the run has ended, its host gave every lease back.
    pub fn held_lease<'a>(&self, task: &'a TaskRecord) -> Option<&'a LeaseRecord> {
        (!self.status.is_finished())
            .then(|| task.held_lease())
            .flatten()
    }

    /// The workspace mode as a person reads it: the tasks' one mode, or `mixed` with each
    /// mode they use (`mixed (single, worktree)`) when they differ. [`Self::workspace_mode`]
    /// stays the default of the tasks that name none.
    pub fn mode_label(&self) -> String {
        let mut modes: Vec<WorkspaceMode> = Vec::new();
        for task in &self.tasks {
            if !modes.contains(&task.workspace_mode) {
                modes.push(task.workspace_mode);
            }
        }
        match modes.as_slice() {
            [] => self.workspace_mode.to_string(),
            [one] => one.to_string(),
            several => {
                let mut names: Vec<String> = several.iter().map(ToString::to_string).collect();
                names.sort();
                format!("mixed ({})", names.join(", "))
            }
        }
    }

    /// The tasks with each one's sub-tasks right after it, and how deep each is (0: submitted
    /// by nobody).
    pub fn family_order(&self) -> Vec<(&TaskRecord, usize)> {
        family_order(
            &self.tasks,
            |task| task.id.clone(),
            |task| task.parent.clone(),
        )
    }

    /// The tokens and cost of every task that reports them, and how many do.
    pub fn usage(&self) -> (Option<Usage>, usize) {
        let known: Vec<Usage> = self.tasks.iter().filter_map(|task| task.usage).collect();
        let count = known.len();
        (Usage::sum(known), count)
    }

    /// A new `running` run of `cwd` with `tasks`, created now, hosted by nobody yet.
    pub fn new(
        run_id: RunId,
        cwd: WorkspaceId,
        workspace_mode: WorkspaceMode,
        tasks: Vec<TaskRecord>,
    ) -> Self {
        let now = Timestamp::now();
        RunManifest {
            schema_version: MANIFEST_SCHEMA_VERSION,
            run_id,
            cwd,
            invocation_dir: Utf8PathBuf::new(),
            team: None,
            workspace_mode,
            status: RunStatus::Running,
            reason: None,
            created_at: now,
            updated_at: now,
            finished_at: None,
            host: None,
            base: None,
            base_branch: None,
            max_parallel: 1,
            fail_fast: false,
            cancelled_by: None,
            tasks,
            journal: None,
            placed_for: None,
            max_cost: None,
            day_cap: None,
        }
    }

    /// `(task id, branch)` of each task whose work is on a branch, in task order.
    pub fn task_branches(&self) -> Vec<(String, String)> {
        self.tasks
            .iter()
            .filter_map(|task| Some((task.id.to_string(), task.work_range()?.1)))
            .collect()
    }

    /// Whether tasks `a` and `b` are attempts of one task: alternatives, of which at most one
    /// lands, so never in conflict with each other.
    pub fn rivals(&self, a: &str, b: &str) -> bool {
        let task_of = |name: &str| {
            self.tasks
                .iter()
                .find(|task| task.id.as_str() == name)
                .and_then(|task| task.attempt_of.as_ref())
                .map(|attempt| attempt.task.clone())
        };
        a != b && task_of(a).is_some_and(|task| Some(task) == task_of(b))
    }

    /// The attempts of `task` (best of N), in order: empty when it is not a task with attempts.
    pub fn attempts_of(&self, task: &TaskId) -> Vec<&TaskRecord> {
        self.tasks
            .iter()
            .filter(|record| {
                record
                    .attempt_of
                    .as_ref()
                    .is_some_and(|attempt| &attempt.task == task)
            })
            .collect()
    }

    /// The task of that id.
    pub fn task(&self, id: &TaskId) -> Option<&TaskRecord> {
        self.tasks.iter().find(|task| &task.id == id)
    }

    /// The task of that id, to change; an error names the run when it has none.
    pub fn task_mut(&mut self, id: &TaskId) -> Result<&mut TaskRecord, TransitionError> {
        let run_id = self.run_id.clone();
        self.tasks
            .iter_mut()
            .find(|task| &task.id == id)
            .ok_or_else(|| TransitionError::UnknownTask {
                run_id,
                task_id: id.clone(),
            })
    }

    /// Moves the run to `next`, refusing transitions the model does not allow.
    pub fn set_status(&mut self, next: RunStatus) -> Result<(), TransitionError> {
        if !self.status.can_become(next) {
            return Err(TransitionError::Run {
                run_id: self.run_id.clone(),
                from: self.status,
                to: next,
            });
        }
        self.status = next;
        let now = Timestamp::now();
        self.updated_at = now;
        self.finished_at = next.is_finished().then_some(now);
        Ok(())
    }

    /// Moves task `id` to `next`, refusing transitions the model does not allow, and stamps
    /// its start and finish times.
    pub fn set_task_status(
        &mut self,
        id: &TaskId,
        next: TaskStatus,
    ) -> Result<&mut TaskRecord, TransitionError> {
        let run_id = self.run_id.clone();
        let now = Timestamp::now();
        self.updated_at = now;
        let task = self.task_mut(id)?;
        task.set_status(&run_id, next, now)?;
        Ok(task)
    }
}
