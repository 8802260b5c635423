//! What the configuration says: the project's settings (`config.toml`), agent and team
//! definitions, and the modes they choose between.

use std::collections::BTreeMap;
use std::fmt;
use std::num::NonZeroUsize;
use std::time::Duration;

use camino::Utf8PathBuf;
use serde::{Deserialize, Serialize};

use crate::ids::TaskId;

use super::BUILTIN_SHELL_AGENT;
use super::placements::PlacementDef;
use super::resources::Resources;
use super::sandbox::{AgentSandbox, NetworkMode, SandboxSettings};
use super::values::{ByteSize, HumanDuration, Parallelism};

/// Where a task works. See ARCHITECTURE.md, "Workspaces".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkspaceMode {
    /// The project root itself, shared by every task.
    #[default]
    Single,
    /// A git worktree on its own branch under `<repo-root>/.worktrees/<runId>/<taskId>`.
    Worktree,
    /// A fresh directory in the system temp dir, removed afterwards.
    Temp,
    /// `.crew/state/ws/<runId>/<taskId>`, kept until the run is pruned.
    Dedicated,
}

impl WorkspaceMode {
    /// Every mode, in the order help lists them.
    pub const ALL: [WorkspaceMode; 4] = [
        WorkspaceMode::Single,
        WorkspaceMode::Worktree,
        WorkspaceMode::Temp,
        WorkspaceMode::Dedicated,
    ];

    /// The name written in files and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            WorkspaceMode::Single => "single",
            WorkspaceMode::Worktree => "worktree",
            WorkspaceMode::Temp => "temp",
            WorkspaceMode::Dedicated => "dedicated",
        }
    }
}

impl fmt::Display for WorkspaceMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for WorkspaceMode {
    type Err = String;
    fn from_str(value: &str) -> Result<Self, Self::Err> {
        WorkspaceMode::ALL
            .into_iter()
            .find(|mode| mode.as_str() == value)
            .ok_or_else(|| {
                format!("unknown workspace mode `{value}`; use single, worktree, temp or dedicated")
            })
    }
}

/// How a running agent receives steering messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SteerMode {
    /// Each message is written to the agent's stdin as one line.
    StdinLines,
    /// Each message is written to stdin as one JSON object per line (Claude Code's
    /// `--input-format stream-json`).
    StdinJson,
    /// The agent cannot be steered while it runs; follow-ups resume it afterwards.
    #[default]
    None,
    /// Messages go in as the agent's protocol's own prompts (`protocol = "acp"`): a steer
    /// cancels the turn under way and sends the message as the next one.
    Protocol,
}

/// How crew reads what an agent prints, and how it talks to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Protocol {
    /// Plain lines of text: whatever the program prints is its output.
    #[default]
    Lines,
    /// Claude Code's `--output-format stream-json` (and `--input-format stream-json`): the
    /// prompt, follow-ups and steering go in as user messages; the session id, what the agent
    /// says and does, and each turn's tokens and cost come out.
    ClaudeStreamJson,
    /// Codex's `codex exec --json` event stream: the thread id (what `codex exec resume`
    /// takes up), what the agent says and runs, each turn's tokens, and why a turn failed.
    /// Codex reads no input while it runs: follow-ups resume it.
    CodexJson,
    /// The Agent Client Protocol (JSON-RPC on stdio), with crew as the client: a session per
    /// task in its workspace, prompts, cancel, the agent's permission requests as questions,
    /// its file requests confined to the workspace, and `session/load` to take up exactly the
    /// task's session again.
    Acp,
    /// The shim protocol (`crate::shim`), spoken with a placement's transport: crew sets it
    /// on the transport of a task that runs on a placement. An agent file cannot name it.
    Shim,
}

/// What a task does when its agent hits a usage or rate limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnLimit {
    /// The task fails, with the limit named (and when it lifts, when the agent said).
    #[default]
    Fail,
    /// The task is `paused` with its workspace kept, and its agent takes up its session again
    /// when the limit lifts (or on `crew agents resume`); the run waits for it.
    Pause,
}

impl OnLimit {
    /// Whether this is the default, which records leave out.
    pub fn is_fail(&self) -> bool {
        *self == OnLimit::Fail
    }
}

/// How `[worktree] link` paths reach a worktree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LinkMode {
    /// A symlink to the leader's directory: instant, shared. An agent's write inside it lands in
    /// the leader's (and a sandboxed agent may not write there at all).
    #[default]
    Symlink,
    /// A copy of the leader's directory (links inside kept as links): slower to make, the
    /// worktree's own.
    Copy,
}

/// What to do when a task's workspace mode cannot be had.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IsolationFallback {
    /// Fail the run before any agent starts.
    #[default]
    None,
    /// Use a temp directory instead and record a warning on the task.
    Temp,
}

/// The longest `stop_grace`: `crew agents stop` waits this long for an agent that ignores TERM.
pub const MAX_STOP_GRACE: HumanDuration = HumanDuration(Duration::from_secs(3600));

/// `.crew/config.toml`. Every key is optional.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProjectConfig {
    /// `[run]`: how runs go.
    pub run: RunSettings,
    /// `[worktree]`: where worktrees and their branches go, and the pool of ready ones.
    pub worktree: WorktreeSettings,
    /// `[isolation]`: what happens where a mode cannot be had.
    pub isolation: IsolationSettings,
    /// `[retention]`: which finished runs are pruned.
    pub retention: RetentionSettings,
    /// `[sandbox]`: whether agents are confined.
    pub sandbox: SandboxSettings,
    /// `[watch]`: the board of `crew watch`.
    pub watch: WatchSettings,
    /// `[lease]`: what each task gets of its own that is not a file (ports, names).
    pub lease: LeaseSettings,
    /// `[placements.<name>]`: where tasks that name a placement run, by name.
    pub placements: BTreeMap<String, PlacementDef>,
    /// `[resources]`: every task's caps, at most (a team and a task narrow them).
    #[serde(skip_serializing_if = "Resources::is_empty")]
    pub resources: Resources,
}

/// `[lease]`: what each task is given of its own, so that parallel tasks do not collide on
/// what is not a file: a block of free ports, a Compose project name, and names for what a
/// project names per environment (a database, a queue prefix).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct LeaseSettings {
    /// How many ports each task gets (`CREW_PORT` … `CREW_PORT` + this − 1); 0: none.
    pub ports: u16,
    /// The ports leases are taken from, both ends included.
    pub port_range: [u16; 2],
    /// Variables each set to the task's own name (`crew_<run>_<task>`, lowercase letters,
    /// digits and `_`): `["DATABASE_NAME", "QUEUE_PREFIX"]`.
    pub names: Vec<String>,
}

impl Default for LeaseSettings {
    fn default() -> Self {
        LeaseSettings {
            ports: 4,
            port_range: [20000, 29999],
            names: Vec::new(),
        }
    }
}

/// `[watch]`: the board of `crew watch`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct WatchSettings {
    /// Whether the board rings the terminal bell when an agent starts waiting or fails
    /// (`crew watch --no-bell` turns it off for one board).
    pub bell: bool,
}

impl Default for WatchSettings {
    fn default() -> Self {
        WatchSettings { bell: true }
    }
}

/// `[run]`
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct RunSettings {
    /// How many tasks run at once.
    pub max_parallel: Parallelism,
    /// How long a stopped agent has between TERM and KILL.
    pub stop_grace: HumanDuration,
    /// Default timeout of every task; none when absent.
    pub task_timeout: Option<HumanDuration>,
    /// The most a run may spend, its tasks together; a team's or `crew run --max-cost-usd`
    /// may name less.
    pub max_cost_usd: Option<super::CostCap>,
    /// The most each task may spend; a team or a task may name less.
    pub task_max_cost_usd: Option<super::CostCap>,
    /// How long every request an agent makes through crew's proxy may fail upstream (its
    /// model's host cannot be resolved or reached) with none getting through, before crew ends
    /// it and fails its task saying so; `0s`: never.
    pub unreachable_timeout: HumanDuration,
    /// Stop the other tasks as soon as one fails.
    pub fail_fast: bool,
    /// How large an agent's `output.log` may grow; past it the log starts over and keeps the
    /// part before as `output.log.1`, so the newest output is always there.
    pub max_output_log: ByteSize,
    /// What a run's end says when the branch it started from has moved on meanwhile.
    pub base_moved: BaseMoved,
    /// The agent of a task made from an editor's plain prompt (`crew serve`); none: such a
    /// prompt is refused with what to write instead.
    pub default_agent: Option<String>,
}

/// `[run] base_moved`: what to do when the branch a run started from gained commits (or was
/// rewritten) while it ran.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BaseMoved {
    /// Say so in the summary and `crew runs show`, with the command that catches a task up.
    #[default]
    Warn,
    /// The same, and `crew run` exits with an error (a gate for scripts and CI).
    Fail,
    /// Say nothing.
    Off,
}

impl Default for RunSettings {
    fn default() -> Self {
        RunSettings {
            max_parallel: Parallelism(NonZeroUsize::new(4).expect("4 is not zero")),
            stop_grace: HumanDuration(Duration::from_secs(10)),
            task_timeout: None,
            max_cost_usd: None,
            task_max_cost_usd: None,
            unreachable_timeout: HumanDuration(Duration::from_secs(120)),
            fail_fast: false,
            max_output_log: ByteSize(64 * 1024 * 1024),
            base_moved: BaseMoved::Warn,
            default_agent: None,
        }
    }
}

/// `[worktree]`
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct WorktreeSettings {
    /// Where worktrees live, relative to the repository root.
    pub dir: Utf8PathBuf,
    /// Task branches are `<branch_prefix>/<runId>-<taskId>`.
    pub branch_prefix: String,
    /// Refuse a worktree run while the leader has tracked changes.
    pub require_clean_leader: bool,
    /// Paths symlinked from the leader into each worktree when present there.
    pub link: Vec<Utf8PathBuf>,
    /// Whether `link` paths are symlinks to the leader's (shared) or copies (the worktree's own).
    pub link_mode: LinkMode,
    /// Paths copied from the leader into each worktree (ignored files such as `.env`).
    pub copy: Vec<Utf8PathBuf>,
    /// A command run in each new worktree before its agent starts, without a shell.
    pub setup: Option<Vec<String>>,
    /// How long `setup` may take.
    pub setup_timeout: HumanDuration,
    /// Ignored paths a recycled worktree keeps from its previous task (such as `target/`).
    pub keep_ignored: Vec<Utf8PathBuf>,
    /// Keep the ignored files an agent wrote (`.env`, `build/`) with its run, under
    /// `.crew/state/runs/<run>/tasks/<task>/ignored/`, until the run is pruned; `false` lets
    /// them go with the worktree. Either way the teardown names them.
    pub keep_agent_ignored: bool,
    /// How many finished worktrees crew keeps for recycling (0 turns recycling off).
    pub pool_size: usize,
    /// Pooled worktrees older than this are removed instead of recycled.
    pub pool_max_age: HumanDuration,
}

impl Default for WorktreeSettings {
    fn default() -> Self {
        WorktreeSettings {
            dir: Utf8PathBuf::from(".worktrees"),
            branch_prefix: "crew".to_owned(),
            require_clean_leader: true,
            link: vec![Utf8PathBuf::from("node_modules")],
            link_mode: LinkMode::Symlink,
            copy: Vec::new(),
            setup: None,
            setup_timeout: HumanDuration(Duration::from_secs(600)),
            keep_ignored: Vec::new(),
            keep_agent_ignored: true,
            pool_size: 4,
            pool_max_age: HumanDuration(Duration::from_secs(24 * 3600)),
        }
    }
}

/// `[isolation]`
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct IsolationSettings {
    /// What a task asking for `worktree` gets outside a git repository.
    pub fallback: IsolationFallback,
}

/// `[retention]`
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetentionSettings {
    /// Finished runs beyond this many (newest kept) are pruned.
    pub max_kept_runs: usize,
    /// Finished runs older than this are pruned.
    pub max_run_age_days: u64,
    /// Whether crew prunes by itself, in the background, when a run it hosted ends (only runs
    /// whose work is on a branch or in the project: see `StateStore::prune_saved`).
    pub automatic: bool,
}

impl Default for RetentionSettings {
    fn default() -> Self {
        RetentionSettings {
            max_kept_runs: 20,
            max_run_age_days: 7,
            automatic: true,
        }
    }
}

/// An agent definition, from `.crew/agents/<name>.toml` or built in. (Files are read through
/// their own checks; `Deserialize` is for a definition another crew sent, as a shim gets it.)
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentDef {
    /// The agent's name: its file's name, or the built-in's.
    pub name: String,
    /// What the agent is, for listings.
    pub description: Option<String>,
    /// argv template; never run through a shell.
    pub command: Vec<String>,
    /// How `crew agents steer` reaches the running agent.
    pub steer: SteerMode,
    /// How crew reads the agent's output and writes its input.
    pub protocol: Protocol,
    /// argv template used to resume a stopped or finished agent; `{message}` is the follow-up,
    /// `{session_id}` the session the agent's protocol reported.
    pub resume: Option<Vec<String>>,
    /// Variables set for the agent; values may hold the command's placeholders.
    pub env: BTreeMap<String, String>,
    /// Variables of the user's environment the agent may see, besides the always-passed ones.
    /// A trailing `*` matches a prefix (`LC_*`).
    pub pass_env: Vec<String>,
    /// What the agent may write besides its workspace, and whether it is confined at all.
    pub sandbox: AgentSandbox,
    /// What its tokens cost, where its program reports tokens and no cost (`[prices]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prices: Option<super::Prices>,
    /// Whether crew provides the agent itself (`shell`) rather than a file.
    pub builtin: bool,
}

impl AgentDef {
    /// The built-in `shell` agent: `sh -c {prompt}`, steered line by line on stdin.
    pub fn builtin_shell() -> Self {
        AgentDef {
            name: BUILTIN_SHELL_AGENT.to_owned(),
            description: Some("runs the prompt as a shell script".to_owned()),
            command: vec!["sh".into(), "-c".into(), "{prompt}".into()],
            steer: SteerMode::StdinLines,
            protocol: Protocol::Lines,
            resume: None,
            env: BTreeMap::new(),
            pass_env: Vec::new(),
            sandbox: AgentSandbox::default(),
            prices: None,
            builtin: true,
        }
    }

    /// Whose rate limits the agent meets: the name of its only credential (`anthropic`,
    /// `openai`), which tasks of other definitions holding the same key share; else its own
    /// name (a definition holding several keys, as aider's, or none).
    pub fn provider(&self) -> String {
        match &self.sandbox.credentials[..] {
            [only] => only.name.clone(),
            _ => self.name.clone(),
        }
    }
}

/// A team: the tasks of a run, from `.crew/teams/<name>.toml` or built ad hoc.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TeamDef {
    /// The team's name: its file's name, or the ad hoc team's.
    pub name: String,
    /// What the team does, for listings.
    pub description: Option<String>,
    /// The workspace mode of every task that names none of its own.
    pub workspace_mode: Option<WorkspaceMode>,
    /// How many tasks run at once.
    pub max_parallel: Option<Parallelism>,
    /// Whether a failed task cancels the rest of the run.
    pub fail_fast: Option<bool>,
    /// The check command of every task that names none of its own.
    pub check: Option<String>,
    /// What a task that names nothing of its own does when its agent hits a usage limit.
    pub on_limit: Option<OnLimit>,
    /// The placement of every task that names none of its own; none: tasks run here.
    pub placement: Option<String>,
    /// The network of every task, at most: narrows each agent's own (never widens it).
    pub network: Option<NetworkMode>,
    /// Every task's caps, at most (`[resources]` of the team file).
    pub resources: Resources,
    /// The most a run of the team may spend, its tasks together.
    pub max_cost_usd: Option<super::CostCap>,
    /// The most each task of the team may spend, where it names no less.
    pub task_max_cost_usd: Option<super::CostCap>,
    /// The tasks, in the order written.
    pub tasks: Vec<TaskDef>,
}

/// One task of a team.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TaskDef {
    /// The task's id, unique in its run.
    pub id: TaskId,
    /// The name of the agent that works on it.
    pub agent: String,
    /// What the agent is asked to do.
    pub prompt: String,
    /// Tasks that must succeed before this one starts.
    pub depends_on: Vec<TaskId>,
    /// How long the agent may work before it is stopped.
    pub timeout: Option<HumanDuration>,
    /// Where the task works, when not the team's mode.
    pub workspace_mode: Option<WorkspaceMode>,
    /// Run the task this many times, each attempt in its own worktree and branch (best of N).
    pub attempts: Option<u32>,
    /// Run with `sh -c` in the task's workspace once its agent finished: whether the result
    /// passes.
    pub check: Option<String>,
    /// What the task does when its agent hits a usage limit.
    pub on_limit: Option<OnLimit>,
    /// Where the task runs, when elsewhere: a `[placements.<name>]` of the project.
    pub placement: Option<String>,
    /// The task's network, at most: narrows its agent's own and the team's (never widens).
    pub network: Option<NetworkMode>,
    /// The task's caps (`[tasks.resources]`): narrow the team's and the project's.
    pub resources: Resources,
    /// The most the task may spend before it is paused and asks.
    pub max_cost_usd: Option<super::CostCap>,
}

impl TeamDef {
    /// A team of `tasks`, nothing else set.
    pub fn new(name: impl Into<String>, tasks: Vec<TaskDef>) -> Self {
        TeamDef {
            name: name.into(),
            description: None,
            workspace_mode: None,
            max_parallel: None,
            fail_fast: None,
            check: None,
            on_limit: None,
            placement: None,
            network: None,
            resources: Resources::default(),
            max_cost_usd: None,
            task_max_cost_usd: None,
            tasks,
        }
    }
}

impl TaskDef {
    /// A task of `agent` on `prompt`, depending on nothing, nothing else set.
    pub fn new(id: TaskId, agent: impl Into<String>, prompt: impl Into<String>) -> Self {
        TaskDef {
            id,
            agent: agent.into(),
            prompt: prompt.into(),
            depends_on: Vec::new(),
            timeout: None,
            workspace_mode: None,
            attempts: None,
            check: None,
            on_limit: None,
            placement: None,
            network: None,
            resources: Resources::default(),
            max_cost_usd: None,
        }
    }
}

/// A team with every agent its tasks name.
#[derive(Debug, Clone, PartialEq)]
pub struct Team {
    /// The team as written.
    pub def: TeamDef,
    /// Every agent its tasks name, by name.
    pub agents: BTreeMap<String, AgentDef>,
}

/// A task of a team made on the spot: what a lead agent may say about it, and no more (no
/// workspace mode, path or sandbox setting).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedTask {
    /// The task id the lead asked for.
    pub id: String,
    /// The agent's name.
    pub agent: String,
    /// What the agent is asked to do.
    pub prompt: String,
    /// Tasks of the same plan that must succeed first.
    pub depends_on: Vec<String>,
}
