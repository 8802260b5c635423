//! Runs and tasks: their records in the manifest, their statuses and the transitions between
//! them. A transition not listed here is an error, never applied.

use std::fmt;
use std::time::SystemTime;

use camino::Utf8PathBuf;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::config::{HumanDuration, OnLimit, WorkspaceMode};
use crate::host::HostIdentity;
use crate::ids::{AgentId, RunId, TaskId, WorkspaceId};
use crate::paths::DirIdentity;
use crate::provider::{TaskWorkspace, TeardownReport, WorkspaceKind};

/// The manifest format this crew writes. A newer manifest is read-only to this crew.
pub const MANIFEST_SCHEMA_VERSION: u32 = 1;

/// A point in time, stored as RFC 3339 with milliseconds (`2026-11-29T22:40:15.123Z`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(pub SystemTime);

impl Timestamp {
    /// The current time.
    pub fn now() -> Self {
        Timestamp(SystemTime::now())
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", humantime::format_rfc3339_millis(self.0))
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        humantime::parse_rfc3339_weak(&text)
            .map(Timestamp)
            .map_err(serde::de::Error::custom)
    }
}

/// `running → completed | failed | cancelled | interrupted`, and back to `running` when a run is
/// resumed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunStatus {
    /// Its host is working on it.
    Running,
    /// Every task that was to run succeeded.
    Completed,
    /// A task failed, or the run could not go on.
    Failed,
    /// Someone cancelled it.
    Cancelled,
    /// Set by reconciliation: the process hosting the run is gone.
    Interrupted,
}

impl RunStatus {
    /// Whether the run has ended (interrupted counts: nothing works on it).
    pub fn is_finished(self) -> bool {
        !matches!(self, RunStatus::Running)
    }

    /// Whether a run may go from this status to `next`.
    pub fn can_become(self, next: RunStatus) -> bool {
        use RunStatus::*;
        match (self, next) {
            (Running, Completed | Failed | Cancelled | Interrupted) => true,
            // Resuming a run that did not complete, or one whose agent gets a follow-up.
            (Completed | Failed | Cancelled | Interrupted, Running) => true,
            // Cancelling a run whose host is gone.
            (Interrupted, Cancelled) => true,
            _ => false,
        }
    }

    /// The name written in manifests and listings.
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Running => "running",
            RunStatus::Completed => "completed",
            RunStatus::Failed => "failed",
            RunStatus::Cancelled => "cancelled",
            RunStatus::Interrupted => "interrupted",
        }
    }
}

/// `pending → preparing → running (⇄ waiting) → succeeded | failed | stopped | cancelled |
/// skipped | interrupted`; a finished task goes back to `pending` or `preparing` when it is resumed, and a
/// stopped one whose workspace its run still holds back to `running`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskStatus {
    /// Waiting for its dependencies or a free slot.
    Pending,
    /// Its workspace is being made.
    Preparing,
    /// Its agent is working.
    Running,
    /// The agent asked a question and waits for the answer.
    Waiting,
    /// The agent hit a usage limit: the task keeps its workspace, and its agent takes up its
    /// session again when the limit lifts (`on_limit = "pause"`).
    Paused,
    /// Its agent finished with success (and its check passed, when it has one).
    Succeeded,
    /// Its agent failed, could not start, or its check failed.
    Failed,
    /// Someone stopped its agent (or its timeout did).
    Stopped,
    /// Its run was cancelled before or while it ran.
    Cancelled,
    /// A task it depends on did not succeed, so it never ran.
    Skipped,
    /// Its placement's connection was lost before its work came back: the work is there (its
    /// reason says where), and `crew runs resume` takes the task up from it.
    Interrupted,
}

impl TaskStatus {
    /// Whether the task has ended: nothing works on it until it is resumed.
    pub fn is_finished(self) -> bool {
        matches!(
            self,
            TaskStatus::Succeeded
                | TaskStatus::Failed
                | TaskStatus::Stopped
                | TaskStatus::Cancelled
                | TaskStatus::Skipped
                | TaskStatus::Interrupted
        )
    }

    /// A task whose agent process may be alive.
    pub fn is_active(self) -> bool {
        matches!(
            self,
            TaskStatus::Preparing | TaskStatus::Running | TaskStatus::Waiting
        )
    }

    /// Whether a task may go from this status to `next`.
    pub fn can_become(self, next: TaskStatus) -> bool {
        use TaskStatus::*;
        match (self, next) {
            (Pending, Preparing | Cancelled | Skipped) => true,
            (Preparing, Running | Failed | Cancelled | Stopped) => true,
            (Running, Waiting | Succeeded | Failed | Stopped | Cancelled | Interrupted) => true,
            (Waiting, Running | Succeeded | Failed | Stopped | Cancelled | Interrupted) => true,
            (Running, Paused) => true,
            (Paused, Running | Failed | Stopped | Cancelled) => true,
            // A stopped agent resumed in the workspace its task kept while the run went on.
            (Stopped, Running) => true,
            // Resume: a finished task is prepared again, or queued again with its run.
            (
                Succeeded | Failed | Stopped | Cancelled | Skipped | Interrupted,
                Pending | Preparing,
            ) => true,
            _ => false,
        }
    }

    /// The name written in manifests and listings.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskStatus::Pending => "pending",
            TaskStatus::Preparing => "preparing",
            TaskStatus::Running => "running",
            TaskStatus::Waiting => "waiting",
            TaskStatus::Paused => "paused",
            TaskStatus::Succeeded => "succeeded",
            TaskStatus::Failed => "failed",
            TaskStatus::Stopped => "stopped",
            TaskStatus::Cancelled => "cancelled",
            TaskStatus::Skipped => "skipped",
            TaskStatus::Interrupted => "interrupted",
        }
    }
}

impl fmt::Display for RunStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for TaskStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A status change that the model does not allow.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransitionError {
    /// A run status change the lifecycle does not allow.
    #[error("run {run_id} cannot go from {from} to {to}")]
    Run {
        /// The run.
        run_id: RunId,
        /// Its status.
        from: RunStatus,
        /// The status asked for.
        to: RunStatus,
    },
    /// A task status change the lifecycle does not allow.
    #[error("task {agent_id} cannot go from {from} to {to}")]
    Task {
        /// The task's agent.
        agent_id: AgentId,
        /// Its status.
        from: TaskStatus,
        /// The status asked for.
        to: TaskStatus,
    },
    /// The run has no task of that id.
    #[error("run {run_id} has no task {task_id}")]
    UnknownTask {
        /// The run.
        run_id: RunId,
        /// The id asked for.
        task_id: TaskId,
    },
}

/// The signal a stop needed to end an agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StopSignal {
    /// It exited after TERM, within its grace.
    Term,
    /// It needed KILL.
    Kill,
}

/// How an agent process ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitRecord {
    /// The exit code, when the process exited on its own.
    pub code: Option<i32>,
    /// The signal that ended it, when one did.
    pub signal: Option<i32>,
    /// How a stop ended it: `term` (exited after TERM), `kill` (needed KILL), or none. Like
    /// every field of an exit, always written: the JSON output promises them.
    #[serde(default)]
    pub stopped_by: Option<StopSignal>,
    /// How many processes the agent left behind when it exited (in its group, daemons that
    /// left it, holders of its output), all killed by crew. Records written before counts were
    /// kept say `true` (read as 1).
    #[serde(default, deserialize_with = "count_or_flag")]
    pub leaked_processes: u32,
    /// The agent was stopped because it ran longer than its timeout.
    #[serde(default)]
    pub timed_out: bool,
    /// Its session was over (its last turn ended, and crew ended the connection) and it did
    /// not exit, so crew ended it: how it then ended is no failure of its task.
    #[serde(default)]
    pub ended_after_session: bool,
    /// With `network = "proxy"`, the requests its proxy let through and refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkCounts>,
}

/// What a task was given of its own (`[lease]`), as its agent, its check and its setup see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRecord {
    /// The first of its ports (`CREW_PORT`), when it has any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// How many ports, from `port` on (`CREW_PORTS`).
    #[serde(default)]
    pub ports: u16,
    /// Its own name (`COMPOSE_PROJECT_NAME`, and each variable of `[lease] names`).
    pub name: String,
    /// The variables of `[lease] names` it was given, each set to `name`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub names: Vec<String>,
}

impl LeaseRecord {
    /// The variables the lease sets, for the task's agent, check and setup.
    pub fn vars(&self) -> Vec<(String, String)> {
        let mut vars = Vec::new();
        if let Some(port) = self.port {
            vars.push(("CREW_PORT".to_owned(), port.to_string()));
            vars.push(("CREW_PORTS".to_owned(), self.ports.to_string()));
        }
        vars.push(("COMPOSE_PROJECT_NAME".to_owned(), self.name.clone()));
        for name in &self.names {
            vars.push((name.clone(), self.name.clone()));
        }
        vars
    }

    /// Its ports as people read them: `20000–20003`, or `20000` alone; `None` without ports.
    pub fn port_range(&self) -> Option<String> {
        let port = self.port?;
        Some(match self.ports {
            0 | 1 => port.to_string(),
            ports => format!("{port}–{}", port.saturating_add(ports - 1)),
        })
    }

    /// The task's own name: `crew_<run>_<task>`, lowercase letters, digits and `_`, at most
    /// 63 characters (what Postgres takes for a name), a hash of the whole kept when cut.
    pub fn name_of(run: &str, task: &str) -> String {
        let raw = format!("crew_{run}_{task}");
        let mut name: String = raw
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '_'
                }
            })
            .collect();
        if name.len() > 63 {
            let hash = raw.bytes().fold(0xcbf29ce484222325u64, |hash, byte| {
                (hash ^ u64::from(byte)).wrapping_mul(0x100000001b3)
            });
            name.truncate(46);
            name.push_str(&format!("_{hash:016x}"));
        }
        name
    }
}

/// How many requests an agent's proxy let through and refused (`network = "proxy"`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkCounts {
    /// Let through by the rules (reached or not).
    pub allowed: u64,
    /// Refused by the rules.
    pub refused: u64,
}

impl NetworkCounts {
    /// The sum of `counts`, `None` when there are none.
    pub fn sum(counts: impl IntoIterator<Item = NetworkCounts>) -> Option<NetworkCounts> {
        counts.into_iter().reduce(|a, b| NetworkCounts {
            allowed: a.allowed.saturating_add(b.allowed),
            refused: a.refused.saturating_add(b.refused),
        })
    }
}

fn count_or_flag<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u32, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum CountOrFlag {
        Count(u32),
        Flag(bool),
    }
    Ok(match CountOrFlag::deserialize(deserializer)? {
        CountOrFlag::Count(count) => count,
        CountOrFlag::Flag(flag) => u32::from(flag),
    })
}

impl ExitRecord {
    /// Whether the agent exited with code 0.
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
}

/// Where a task worked, as recorded once its workspace was allocated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkspaceRecord {
    /// Which of the four modes made it.
    pub kind: WorkspaceKind,
    /// The top of the allocated directory (the worktree root, the temp dir).
    #[serde(default)]
    pub root: Utf8PathBuf,
    /// Where the agent works: `root` plus the run's invocation subdirectory.
    pub dir: Utf8PathBuf,
    /// The task's branch (`worktree` mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
    /// The commit the workspace started from, when it is a git checkout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_commit: Option<String>,
    /// Whether it was a recycled worktree from the pool.
    #[serde(default)]
    pub reused: bool,
    /// Which directory `root` was when crew made it (device and inode): teardown acts on
    /// nothing else.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<DirIdentity>,
    /// Besides `root`, what the agent was allowed to write (the shared git parts a commit needs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub writable: Vec<Utf8PathBuf>,
    /// Beneath `root`, what the agent was kept from writing (see `TaskWorkspace::read_only`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub read_only: Vec<Utf8PathBuf>,
}

impl WorkspaceRecord {
    /// The record of an allocated workspace.
    pub fn of(workspace: &TaskWorkspace) -> Self {
        WorkspaceRecord {
            kind: workspace.kind,
            root: workspace.root.clone(),
            dir: workspace.dir.clone(),
            branch: workspace.branch.clone(),
            base_commit: workspace.base_commit.clone(),
            reused: workspace.reused,
            identity: workspace.identity,
            writable: workspace.writable.clone(),
            read_only: workspace.read_only.clone(),
        }
    }

    /// The workspace as its provider described it, for a teardown after the host is gone.
    pub fn to_task_workspace(&self) -> TaskWorkspace {
        TaskWorkspace {
            kind: self.kind,
            root: self.root.clone(),
            dir: self.dir.clone(),
            branch: self.branch.clone(),
            base_commit: self.base_commit.clone(),
            reused: self.reused,
            warnings: Vec::new(),
            identity: self.identity,
            writable: self.writable.clone(),
            read_only: self.read_only.clone(),
            private: Vec::new(),
            git_config: Vec::new(),
        }
    }
}

/// Whether an agent's processes were confined by the kernel (ARCHITECTURE.md, "Agents are
/// untrusted").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SandboxState {
    /// Landlock confined it: it could write only what [`SandboxRecord::write`] lists.
    Enforced,
    /// The agent definition or the project turned the sandbox off.
    Off,
    /// The kernel cannot confine agents (no Landlock): it ran unconfined.
    Unsupported,
}

impl SandboxState {
    /// The name written in manifests and listings.
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxState::Enforced => "enforced",
            SandboxState::Off => "off",
            SandboxState::Unsupported => "unsupported",
        }
    }
}

impl fmt::Display for SandboxState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How an agent was confined, as recorded on its task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxRecord {
    /// Whether the agent was confined, and if not, why.
    pub state: SandboxState,
    /// The Landlock ABI version of the kernel, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub abi: Option<u32>,
    /// Everything the agent could write beneath (when enforced).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub write: Vec<Utf8PathBuf>,
    /// Paths its definition allows that did not exist when it started, so were not granted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub missing: Vec<Utf8PathBuf>,
    /// Beneath what it could write, what was mounted read-only for it (`single` mode: the
    /// project's `.crew/` and git's `config`, `hooks/`, `info/`, `packed-refs`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub read_only: Vec<Utf8PathBuf>,
    /// What it saw a private view of, its changes kept apart (`single` mode: the repository's
    /// git directory).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub private: Vec<Utf8PathBuf>,
    /// What its definition's `[sandbox.confined]` gave the program because crew confined it
    /// (its own sandbox or permission prompts standing down): arguments, then `NAME=value`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stood_down: Vec<String>,
    /// Its terminal devices were a private instance (`/dev/pts`, `/dev/ptmx`): pseudo-terminals
    /// of its own, and none of the user's.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub private_terminals: bool,
    /// It reached its host by a connection of its own (`CREW_SOCKET=@…`, an abstract socket
    /// only its sandbox may connect to), the host's socket hidden from it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub own_connection: bool,
    /// The state directories its definition declares (`~/.claude/`) that crew could not make
    /// for it, each with why: the agent cannot keep its state there.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unmade: Vec<String>,
    /// The user's own servers' socket places hidden from it (covered in its namespace).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hidden: Vec<Utf8PathBuf>,
    /// What it reached of the network (`none`: an empty network namespace of its own).
    #[serde(default, skip_serializing_if = "crate::config::NetworkMode::is_open")]
    pub network: crate::config::NetworkMode,
    /// The narrower network it asked for and this kernel could not give, when its run allowed
    /// the open one instead (`crew run --allow-open-network`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_unmet: Option<crate::config::NetworkMode>,
}

/// A task of a run, with everything that happened to it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskRecord {
    /// The task's id, unique in its run.
    pub id: TaskId,
    /// The name of its agent.
    pub agent: String,
    /// What its agent was asked to do.
    pub prompt: String,
    /// Tasks that must succeed before it starts.
    #[serde(default)]
    pub depends_on: Vec<TaskId>,
    /// The task whose agent submitted this one (a lead agent's sub-task), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<TaskId>,
    /// How long its agent may work before it is stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<HumanDuration>,
    /// The mode asked for: the run's mode unless the team overrides it for this task.
    pub workspace_mode: WorkspaceMode,
    /// Where it stands: see [`TaskStatus`].
    pub status: TaskStatus,
    /// Why the task is in its status, when that needs saying (the upstream that failed, the
    /// timeout that stopped it, the error that failed it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// When its agent started (the latest start, after a resume).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Timestamp>,
    /// When it last finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Timestamp>,
    /// Its agent's process id while it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// How its agent's process ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit: Option<ExitRecord>,
    /// Where it works, once that was allocated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<WorkspaceRecord>,
    /// What went wrong without failing it, in the order it happened.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// What teardown did with its workspace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub teardown: Option<TeardownReport>,
    /// The question the agent asked and waits on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub question: Option<String>,
    /// Follow-ups sent to its agent and not delivered when it was stopped, oldest first: the
    /// agent gets them when it is resumed, whichever process hosts it then.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub follow_ups: Vec<String>,
    /// How many times the agent was started.
    #[serde(default)]
    pub attempts: u32,
    /// How the kernel confined the agent's latest start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<SandboxRecord>,
    /// The session the agent's protocol reported: what a resume takes up again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// Tokens and cost, summed over every turn of every start, when the agent's protocol
    /// reports them. Unknown stays unknown: absent, never zero.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// The usage or rate limit the agent last reported hitting, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<UsageLimit>,
    /// What the task does when its agent hits a usage limit.
    #[serde(default, skip_serializing_if = "OnLimit::is_fail")]
    pub on_limit: OnLimit,
    /// The placement it runs on (`[placements.<name>]`), when not here: its agent works in
    /// the placement's clone, and its work comes back as its branch here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<String>,
    /// The network its team, itself or its run's command line narrowed it to (`crew run
    /// --network`): its agent gets the narrower of this and its own settings, at every start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<crate::config::NetworkMode>,
    /// Its run allowed an open network where the narrower one cannot be had (`crew run
    /// --allow-open-network`), at every start.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_open_network: bool,
    /// With `network = "proxy"`, the requests its agent's proxy let through and refused, over
    /// every start (each is also an event of the run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests: Option<NetworkCounts>,
    /// What it was given of its own besides files (`[lease]`): kept across resumes, released
    /// when it ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<LeaseRecord>,
    /// Other tasks of the run (or the branch it started from) whose work would conflict with
    /// this task's if both were merged, found when their branches are there (the radar).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub overlaps: Vec<TaskOverlap>,
    /// Which attempt of which task this is, when the task runs several times (best of N).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt_of: Option<AttemptOf>,
    /// The check command its result is held to, and how it ended once it ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check: Option<CheckRecord>,
}

/// One of several attempts at the same task: the task as the team names it, which attempt,
/// and of how many.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptOf {
    /// The task this is an attempt of.
    pub task: TaskId,
    /// The attempt's number, from 1.
    pub number: u32,
    /// How many attempts the task makes.
    pub of: u32,
    /// `crew pick` kept this attempt as the task's result.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub picked: bool,
}

/// A task's check command (run with `sh -c` in its workspace once its agent finished, confined
/// like the agent) and its outcome: `passed` is absent until it ran, and stays absent when the
/// agent did not finish successfully.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckRecord {
    /// The command, run with `sh -c` in the task's workspace.
    pub command: String,
    /// Whether it passed; `None` until it ran, or when it could not run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub passed: Option<bool>,
    /// Its exit code.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<i32>,
    /// The signal that ended it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// Whether it ran out of time and was killed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub timed_out: bool,
    /// Whether it was stopped before it ended (a person's `crew agents stop`, the run's
    /// cancel): a stopped check did not pass.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stopped: bool,
    /// How long it ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// The end of what it printed (stdout and stderr as they came); the whole is in the task's
    /// `check.log`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub output_tail: String,
    /// Why it could not run (the workspace was gone, the shell would not start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl CheckRecord {
    /// A check to run, not run yet.
    pub fn pending(command: String) -> Self {
        CheckRecord {
            command,
            passed: None,
            code: None,
            signal: None,
            timed_out: false,
            stopped: false,
            duration_ms: None,
            output_tail: String::new(),
            error: None,
        }
    }

    /// `passed`, `failed (exit 1)`, `timed out`, `not run`.
    pub fn verdict(&self) -> String {
        match (self.passed, self.timed_out) {
            (Some(true), _) => "passed".to_owned(),
            (Some(false), true) => "timed out".to_owned(),
            (Some(false), false) => match (self.code, self.signal, &self.error) {
                (Some(code), _, _) => format!("failed (exit {code})"),
                (None, Some(signal), _) => format!("failed (signal {signal})"),
                (None, None, Some(_)) => "could not run".to_owned(),
                (None, None, None) => "failed".to_owned(),
            },
            (None, _) => "not run".to_owned(),
        }
    }
}

/// Work that would conflict with a task's: whose (a task id, or the branch the run started
/// from), and in which files.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskOverlap {
    /// The other task's id, or the branch the run started from.
    pub with: String,
    /// The files both change.
    pub files: Vec<String>,
}

/// Tokens and cost of an agent's turns, as its protocol reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    /// Tokens read, not counting the cache.
    #[serde(default)]
    pub input_tokens: u64,
    /// Tokens written.
    #[serde(default)]
    pub output_tokens: u64,
    /// Tokens read from the prompt cache.
    #[serde(default)]
    pub cache_read_input_tokens: u64,
    /// Tokens written to the prompt cache.
    #[serde(default)]
    pub cache_creation_input_tokens: u64,
    /// In US dollars; `None` when any turn counted here did not say.
    #[serde(default)]
    pub cost_usd: Option<f64>,
    /// Turns of the agent's session.
    #[serde(default)]
    pub turns: u32,
    /// No turn counted here said its tokens (an agent that reports only its cost): the token
    /// counts are not zero, they are unknown.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tokens_unknown: bool,
}

/// A usage or rate limit an agent reported hitting: what it said, and when the limit lifts,
/// when it said that too.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageLimit {
    /// What the agent said about the limit.
    pub message: String,
    /// When the limit lifts, when the agent said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resets_at: Option<Timestamp>,
    /// When crew tries again a task paused on it, where the agent said nothing of when it
    /// lifts (a backoff from a minute to an hour).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_at: Option<Timestamp>,
}

impl UsageLimit {
    /// When a task paused on it goes on by itself: when it lifts, or crew's next try.
    pub fn continues_at(&self) -> Option<Timestamp> {
        self.resets_at.or(self.retry_at)
    }
}

impl fmt::Display for UsageLimit {
    /// `a usage limit, which lifts at <time>: <what the agent said>`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.resets_at {
            Some(at) => write!(f, "a usage limit, which lifts at {at}: {}", self.message),
            None => write!(f, "a usage limit: {}", self.message),
        }
    }
}

impl fmt::Display for Usage {
    /// `12.3k tokens in, 4.5k out, $0.0123, 3 turns` (cache reads count as input).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.tokens_unknown {
            f.write_str("tokens not reported")?;
        } else {
            write!(
                f,
                "{} tokens in, {} out",
                Usage::count(self.input_total()),
                Usage::count(self.output_tokens)
            )?;
        }
        if let Some(cost) = self.cost_usd {
            write!(f, ", {}", Usage::dollars(cost))?;
        }
        write!(f, ", {} turn(s)", self.turns)
    }
}

impl Usage {
    /// Every input token: fresh, read from the cache, and written to it.
    pub fn input_total(&self) -> u64 {
        self.input_tokens + self.cache_read_input_tokens + self.cache_creation_input_tokens
    }

    /// A cost as people read it: `$0.0123`, `$1.25`.
    pub fn dollars(cost: f64) -> String {
        if cost < 1.0 {
            format!("${cost:.4}")
        } else {
            format!("${cost:.2}")
        }
    }

    fn count(tokens: u64) -> String {
        match tokens {
            0..1_000 => tokens.to_string(),
            1_000..1_000_000 => format!("{:.1}k", tokens as f64 / 1e3),
            _ => format!("{:.1}M", tokens as f64 / 1e6),
        }
    }

    /// Both counted together. The cost is known only when both knew it.
    pub fn plus(self, other: Usage) -> Usage {
        Usage {
            input_tokens: self.input_tokens + other.input_tokens,
            output_tokens: self.output_tokens + other.output_tokens,
            cache_read_input_tokens: self.cache_read_input_tokens + other.cache_read_input_tokens,
            cache_creation_input_tokens: self.cache_creation_input_tokens
                + other.cache_creation_input_tokens,
            cost_usd: self.cost_usd.zip(other.cost_usd).map(|(a, b)| a + b),
            turns: self.turns + other.turns,
            // Known as soon as one of them said (the others counted nothing).
            tokens_unknown: self.tokens_unknown && other.tokens_unknown,
        }
    }

    /// Every usage of `usages` counted together; `None` when there is none.
    pub fn sum(usages: impl IntoIterator<Item = Usage>) -> Option<Usage> {
        usages.into_iter().reduce(Usage::plus)
    }
}

/// How the reason of a task begins when reconciliation finds its host gone while it ran.
pub const INTERRUPTED_REASON: &str = "interrupted: ";

impl TaskRecord {
    /// Its lease while it holds it: while the task may go on (a finished task's ports went
    /// back).
    pub fn held_lease(&self) -> Option<&LeaseRecord> {
        self.lease.as_ref().filter(|_| {
            !matches!(
                self.status,
                TaskStatus::Succeeded
                    | TaskStatus::Failed
                    | TaskStatus::Cancelled
                    | TaskStatus::Skipped
            )
        })
    }

    /// Its agent had exited cleanly (code 0, not stopped, not timed out) when its host died,
    /// before the task was torn down: its work is done and only needs finishing.
    pub fn finished_before_its_host_died(&self) -> bool {
        self.reason
            .as_deref()
            .is_some_and(|reason| reason.starts_with(INTERRUPTED_REASON))
            && self.exit_was_clean()
    }

    /// Its agent's recorded exit is code 0, not stopped, not timed out.
    pub fn exit_was_clean(&self) -> bool {
        self.exit.as_ref().is_some_and(|exit| {
            exit.code == Some(0) && exit.stopped_by.is_none() && !exit.timed_out
        })
    }

    /// Whether nothing of the task's work is only in its workspace: it never had one, worked
    /// in the project itself or a temp dir, or its workspace was torn down with its work saved
    /// to its branch. A `dedicated` workspace, a preserved worktree, or one not torn down yet
    /// hold work of their own.
    pub fn work_is_saved(&self) -> bool {
        let Some(workspace) = &self.workspace else {
            return true;
        };
        match workspace.kind {
            WorkspaceKind::Single | WorkspaceKind::Temp => true,
            WorkspaceKind::Dedicated => false,
            WorkspaceKind::Worktree => self.teardown.as_ref().is_some_and(|report| {
                report.preserved.is_none() && (report.removed || report.recycled)
            }),
        }
    }

    /// The commit the task started from and the branch holding its work, when its work is on
    /// a branch: what `git diff <base>..<branch>` shows.
    pub fn work_range(&self) -> Option<(String, String)> {
        let base = self.workspace.as_ref()?.base_commit.clone()?;
        let branch = self.teardown.as_ref()?.branch.clone()?;
        Some((base, branch))
    }

    /// Whether this is an attempt (best of N) that is not the task's result: none was
    /// picked yet, or another one was.
    pub fn is_unpicked_attempt(&self) -> bool {
        self.attempt_of
            .as_ref()
            .is_some_and(|attempt| !attempt.picked)
    }

    /// A task that has not started, with nothing recorded yet.
    pub fn new(
        id: TaskId,
        agent: String,
        prompt: String,
        depends_on: Vec<TaskId>,
        workspace_mode: WorkspaceMode,
    ) -> Self {
        TaskRecord {
            id,
            agent,
            prompt,
            depends_on,
            parent: None,
            timeout: None,
            workspace_mode,
            status: TaskStatus::Pending,
            reason: None,
            started_at: None,
            finished_at: None,
            pid: None,
            exit: None,
            workspace: None,
            warnings: Vec::new(),
            teardown: None,
            question: None,
            follow_ups: Vec::new(),
            attempts: 0,
            sandbox: None,
            session_id: None,
            usage: None,
            limit: None,
            on_limit: OnLimit::Fail,
            placement: None,
            network: None,
            allow_open_network: false,
            requests: None,
            lease: None,
            overlaps: Vec::new(),
            attempt_of: None,
            check: None,
        }
    }
}

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
        if !task.status.can_become(next) {
            return Err(TransitionError::Task {
                agent_id: AgentId::new(run_id, id.clone()),
                from: task.status,
                to: next,
            });
        }
        task.status = next;
        match next {
            TaskStatus::Preparing => {
                task.started_at = Some(now);
                task.finished_at = None;
            }
            TaskStatus::Pending => {
                task.finished_at = None;
            }
            status if status.is_finished() => task.finished_at = Some(now),
            _ => {}
        }
        Ok(task)
    }
}

/// One line of `events.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunEvent {
    /// The event's format.
    pub schema_version: u32,
    /// When it happened.
    pub at: Timestamp,
    /// The task it is about, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<TaskId>,
    /// What happened.
    #[serde(flatten)]
    pub kind: EventKind,
}

impl RunEvent {
    /// An event that happens now.
    pub fn new(task: Option<TaskId>, kind: EventKind) -> Self {
        RunEvent {
            schema_version: MANIFEST_SCHEMA_VERSION,
            at: Timestamp::now(),
            task,
            kind,
        }
    }
}

/// What happened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum EventKind {
    /// The run was created.
    RunCreated,
    /// The run's status changed.
    RunStatus {
        /// The new status.
        status: RunStatus,
        /// Why, when that needs saying.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// A task's status changed.
    TaskStatus {
        /// The new status.
        status: TaskStatus,
        /// Why, when that needs saying.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// Something a user should read, not a change of status.
    Message {
        /// The text.
        text: String,
    },
    /// Someone asked for the run to be cancelled.
    CancelRequested {
        /// The request.
        by: CancelRecord,
    },
    /// A task's tokens and cost so far, when its agent's protocol reports them.
    Usage {
        /// The usage.
        usage: Usage,
    },
    /// A request of the task's agent to its proxy (`network = "proxy"`), let through or
    /// refused.
    Network {
        /// The host asked for.
        host: String,
        /// Its port.
        port: u16,
        /// Whether the rules (`allow_hosts`) let it through.
        allowed: bool,
        /// Why it was refused, or why an allowed one could not be reached (no such name,
        /// nobody listening).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// The task's work would conflict with another's (a task id, or the branch the run
    /// started from), in these files: the radar found it when the task's branch was there.
    Overlap {
        /// The other task's id, or the branch.
        with: String,
        /// The files both change.
        files: Vec<String>,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest() -> RunManifest {
        RunManifest::new(
            RunId::generate(),
            WorkspaceId::from_canonical("/w".into()),
            WorkspaceMode::Single,
            vec![TaskRecord::new(
                TaskId::parse("api").unwrap(),
                "shell".into(),
                "true".into(),
                vec![],
                WorkspaceMode::Single,
            )],
        )
    }

    #[test]
    fn children_follow_their_parent_in_their_order() {
        let items = [
            ("lead", None),
            ("other", None),
            ("sub1", Some("lead")),
            ("deep", Some("sub1")),
            ("sub2", Some("lead")),
            ("orphan", Some("gone")),
            ("x", Some("y")),
            ("y", Some("x")),
        ];
        let ordered: Vec<(&str, usize)> = family_order(&items, |item| item.0, |item| item.1)
            .into_iter()
            .map(|(item, depth)| (item.0, depth))
            .collect();
        assert_eq!(
            ordered,
            [
                ("lead", 0),
                ("sub1", 1),
                ("deep", 2),
                ("sub2", 1),
                ("other", 0),
                ("orphan", 0),
                ("x", 0),
                ("y", 0),
            ]
        );
    }

    #[test]
    fn task_lifecycle_follows_the_model() {
        let mut run = manifest();
        let api = TaskId::parse("api").unwrap();
        run.set_task_status(&api, TaskStatus::Preparing).unwrap();
        run.set_task_status(&api, TaskStatus::Running).unwrap();
        run.set_task_status(&api, TaskStatus::Waiting).unwrap();
        run.set_task_status(&api, TaskStatus::Running).unwrap();
        let task = run.set_task_status(&api, TaskStatus::Succeeded).unwrap();
        assert!(task.finished_at.is_some());
        let error = run.set_task_status(&api, TaskStatus::Failed).unwrap_err();
        assert!(
            error
                .to_string()
                .ends_with("cannot go from succeeded to failed"),
            "{error}"
        );
        assert_eq!(run.task(&api).unwrap().status, TaskStatus::Succeeded);
    }

    #[test]
    fn invalid_transitions_are_errors() {
        use TaskStatus::*;
        for (from, to) in [
            (Pending, Succeeded),
            (Pending, Running),
            (Preparing, Succeeded),
            (Running, Pending),
            (Succeeded, Running),
            (Skipped, Failed),
        ] {
            assert!(!from.can_become(to), "{from} -> {to} must be refused");
        }
        assert!(!RunStatus::Completed.can_become(RunStatus::Failed));
        assert!(!RunStatus::Running.can_become(RunStatus::Running));
        let mut run = manifest();
        run.set_status(RunStatus::Completed).unwrap();
        assert!(run.set_status(RunStatus::Interrupted).is_err());
    }

    #[test]
    fn timestamps_round_trip() {
        let now = Timestamp::now();
        let json = serde_json::to_string(&now).unwrap();
        let back: Timestamp = serde_json::from_str(&json).unwrap();
        let delta = now.0.duration_since(back.0).unwrap_or_default();
        assert!(delta < std::time::Duration::from_millis(1));
    }
}
