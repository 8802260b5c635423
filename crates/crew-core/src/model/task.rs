//! A task's record in its run's manifest, and the records it holds: its workspace, its
//! sandbox, its lease, how its agent exited, its check, its overlaps, its attempts.

use std::fmt;

use camino::Utf8PathBuf;
use serde::{Deserialize, Deserializer, Serialize};

use crate::config::{HumanDuration, OnLimit, WorkspaceMode};
use crate::ids::{AgentId, RunId, TaskId};
use crate::model::status::{TaskStatus, Timestamp, TransitionError};
use crate::model::usage::{Usage, UsageLimit};
use crate::paths::DirIdentity;
use crate::provider::{TaskWorkspace, TeardownReport, WorkspaceKind};

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
    /// With caps, what it used, as its cgroup measured it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used: Option<ResourceUsage>,
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

/// What a task's agent and everything it started used, as the cgroup of its caps measured it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceUsage {
    /// The most memory held at once, in bytes: the highest of its starts.
    pub peak_memory: u64,
    /// CPU time, its starts together, in milliseconds.
    pub cpu_ms: u64,
    /// How many of its processes the kernel killed at the memory cap.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub oom_kills: u64,
    /// How many new processes the processes cap refused.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub processes_refused: u64,
}

impl ResourceUsage {
    /// This start's figures added to those of the starts before.
    pub fn and(self, later: ResourceUsage) -> ResourceUsage {
        ResourceUsage {
            peak_memory: self.peak_memory.max(later.peak_memory),
            cpu_ms: self.cpu_ms + later.cpu_ms,
            oom_kills: self.oom_kills + later.oom_kills,
            processes_refused: self.processes_refused + later.processes_refused,
        }
    }
}

fn is_zero(value: &u64) -> bool {
    *value == 0
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
    /// The directories it saw only in part (its user's home, every top-level one not the
    /// system's): covered, with only `kept` there beneath them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub partial: Vec<Utf8PathBuf>,
    /// Beneath those, what was there for it: its workspace, the repository, its reads, its
    /// places, its toolchains.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kept: Vec<Utf8PathBuf>,
    /// What it reached of the network (`none`: an empty network namespace of its own).
    #[serde(default, skip_serializing_if = "crate::config::NetworkMode::is_open")]
    pub network: crate::config::NetworkMode,
    /// The narrower network it asked for and this kernel could not give, when its run allowed
    /// the open one instead (`crew run --allow-open-network`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_unmet: Option<crate::config::NetworkMode>,
    /// The kind of cgroup its caps were held by (`cgroup v1`, `cgroup v2`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<String>,
    /// Why it ran without its caps, where no cgroup could be had and its run allowed that.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uncapped: Option<String>,
    /// The secrets its proxy held for it, `NAME for upstream`: the agent held stand-ins.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub by_reference: Vec<String>,
    /// The variables of its definition's credentials it held itself: its network did not go
    /// through crew's proxy (open, or unconfined).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub held_by_agent: Vec<String>,
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
    /// The network its team or itself narrowed it to: its agent never gets wider, at every
    /// start (see [`crate::config::Network`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<crate::config::NetworkMode>,
    /// Its caps: the narrowest of the project's, its team's, its own and its run's command
    /// line's (DESIGN §8c), held by the kernel at every start.
    #[serde(default, skip_serializing_if = "crate::config::Resources::is_empty")]
    pub resources: crate::config::Resources,
    /// Its run allowed it to run without caps where no cgroup can be had (`crew run
    /// --allow-uncapped`), at every start.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_uncapped: bool,
    /// What it used, as its caps' cgroup measured it over every start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used: Option<ResourceUsage>,
    /// The network its run's command line named (`crew run --network`): one of the settings
    /// whose narrowest its agent gets, with its definition's and the project's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub named_network: Option<crate::config::NetworkMode>,
    /// Its run allowed an open network where the narrower one cannot be had (`crew run
    /// --allow-open-network`), at every start.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_open_network: bool,
    /// For a task an agent submitted: what that agent could reach of the network, which this
    /// task never reaches beyond (at every start, whatever its own definition says).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submitter_reach: Option<Reach>,
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
    /// Its spend cap (`max_cost_usd`), and how much it may spend before it pauses again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost: Option<super::SpendCap>,
    /// The cap it is paused at, while it is: it goes on only when a person lets it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capped: Option<super::CapKind>,
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

    /// `passed`, `failed (exit 1)`, `timed out`, `stopped`, `not run`.
    pub fn verdict(&self) -> String {
        match (self.passed, self.timed_out) {
            (Some(true), _) => "passed".to_owned(),
            // Stopped by a person or a cancel: its signal is crew's, not a failed test's.
            (Some(false), _) if self.stopped => "stopped".to_owned(),
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

/// How the reason of a task begins when reconciliation finds its host gone while it ran.
pub const INTERRUPTED_REASON: &str = "interrupted: ";

impl TaskRecord {
    /// What this task's agent reaches of the network, by its definition's `[sandbox]` in a
    /// project whose `config.toml` names `project`: the narrowest of what they and the run's
    /// command line name (crew's default where none does), narrowed by its team or itself and
    /// by what its submitter reached.
    pub fn network_by(
        &self,
        project: Option<crate::config::NetworkMode>,
        definition: &crate::config::AgentSandbox,
    ) -> crate::config::Network {
        crate::config::Network::named([project, definition.network, self.named_network])
            .narrowed(self.network)
            .narrowed(self.submitter_reach.as_ref().map(|reach| reach.network))
    }

    /// Moves the task (of run `run_id`) to `next` at `now`, refused when its lifecycle does
    /// not allow it; its start and end times follow.
    pub fn set_status(
        &mut self,
        run_id: &RunId,
        next: TaskStatus,
        now: Timestamp,
    ) -> Result<(), TransitionError> {
        if !self.status.can_become(next) {
            return Err(TransitionError::Task {
                agent_id: AgentId::new(run_id.clone(), self.id.clone()),
                from: self.status,
                to: next,
            });
        }
        self.status = next;
        match next {
            TaskStatus::Preparing => {
                self.started_at = Some(now);
                self.finished_at = None;
            }
            TaskStatus::Pending => {
                self.finished_at = None;
            }
            status if status.is_finished() => self.finished_at = Some(now),
            _ => {}
        }
        Ok(())
    }

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
            named_network: None,
            resources: crate::config::Resources::default(),
            allow_uncapped: false,
            used: None,
            allow_open_network: false,
            submitter_reach: None,
            requests: None,
            lease: None,
            max_cost: None,
            capped: None,
            overlaps: Vec::new(),
            attempt_of: None,
            check: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::CheckRecord;

    #[test]
    fn a_stopped_check_says_stopped_not_failed() {
        let mut check = CheckRecord::pending("cargo test".to_owned());
        check.passed = Some(false);
        check.signal = Some(15);
        assert_eq!(check.verdict(), "failed (signal 15)");
        check.stopped = true;
        assert_eq!(check.verdict(), "stopped");
    }
}

/// What an agent could reach of the network: its mode, and with `proxy` every list of hosts
/// that applied to it (each with the file it came from, for the refusal's message).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reach {
    /// The narrowest mode that applied.
    pub network: crate::config::NetworkMode,
    /// The lists a request had to be in, as file and entries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lists: Vec<ReachList>,
}

/// One list of hosts of a [`Reach`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReachList {
    /// The file it was written in, as the user knows it.
    pub file: String,
    /// Its entries.
    pub hosts: Vec<crate::config::HostPattern>,
}
