//! Configuration: `.crew/config.toml`, `.crew/agents/<name>.toml`, `.crew/teams/<name>.toml`.
//!
//! Every file is checked completely before anything starts. Unknown keys, wrong types, invalid
//! or duplicate task ids, unknown agents, dependency cycles, zero parallelism and the like are
//! errors that point at the file, line, column and key. With no files at all, the built-in
//! defaults and the built-in agent `shell` still work.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::num::NonZeroUsize;
use std::ops::Range;
use std::time::Duration;

use camino::{Utf8Path, Utf8PathBuf};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use toml::Spanned;

use crate::fsutil::{FileError, read_nofollow};
use crate::ids::TaskId;
use crate::paths::normalize_lexically;

/// `config.toml`, relative to the crew directory.
pub const CONFIG_FILE: &str = "config.toml";
/// Agent definitions, relative to the crew directory.
pub const AGENTS_DIR: &str = "agents";
/// Team definitions, relative to the crew directory.
pub const TEAMS_DIR: &str = "teams";
/// The agent every crew knows without configuration: runs the prompt with `sh -c`.
pub const BUILTIN_SHELL_AGENT: &str = "shell";

/// Placeholders an agent's `command` template may use.
pub const COMMAND_PLACEHOLDERS: &[&str] = &["prompt", "workspace", "run_id", "task_id"];
/// Placeholders an agent's `resume` template may use.
pub const RESUME_PLACEHOLDERS: &[&str] = &["prompt", "workspace", "run_id", "task_id", "message"];

/// Where a task works. See DESIGN §5.
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
    pub const ALL: [WorkspaceMode; 4] = [
        WorkspaceMode::Single,
        WorkspaceMode::Worktree,
        WorkspaceMode::Temp,
        WorkspaceMode::Dedicated,
    ];

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

/// Whether the kernel confines an agent (DESIGN §8a).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SandboxMode {
    /// Confine every agent where the kernel can (Linux Landlock); say so where it cannot.
    #[default]
    Enforce,
    /// Do not confine: the tripwire and teardown checks still hold.
    Off,
}

impl SandboxMode {
    /// The mode when two settings apply (the project's and an agent's): off when either is.
    pub fn and(self, other: SandboxMode) -> SandboxMode {
        if self == SandboxMode::Off || other == SandboxMode::Off {
            SandboxMode::Off
        } else {
            SandboxMode::Enforce
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SandboxMode::Enforce => "enforce",
            SandboxMode::Off => "off",
        }
    }
}

/// A duration written as `"30m"`, `"1h 30m"`, `"10s"` or a number of seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct HumanDuration(pub Duration);

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Seconds(u64),
            Text(String),
        }
        let (duration, written) = match Raw::deserialize(deserializer)? {
            Raw::Seconds(seconds) => (Duration::from_secs(seconds), seconds.to_string()),
            Raw::Text(text) => match humantime::parse_duration(&text) {
                Ok(duration) => (duration, format!("`{text}`")),
                Err(error) => {
                    return Err(serde::de::Error::custom(format!(
                        "invalid duration `{text}` ({error}); write it like \"90s\", \"30m\" or \"1h 30m\""
                    )));
                }
            },
        };
        if duration.is_zero() || duration > HumanDuration::MAX.0 {
            return Err(serde::de::Error::custom(format!(
                "duration {written} is out of range: it must be longer than 0s and at most 365 days"
            )));
        }
        Ok(HumanDuration(duration))
    }
}

impl HumanDuration {
    /// The longest duration any setting takes: a year.
    pub const MAX: HumanDuration = HumanDuration(Duration::from_secs(365 * 86_400));
}

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", humantime::format_duration(self.0))
    }
}

impl Serialize for HumanDuration {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&humantime::format_duration(self.0).to_string())
    }
}

/// A size in bytes, written as a number of bytes or like `"64MiB"`, `"512KiB"`, `"2GB"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(pub u64);

impl ByteSize {
    /// The smallest `max_output_log`: below it a log would hold too little to read.
    pub const MIN_LOG: ByteSize = ByteSize(64 * 1024);
    /// The largest `max_output_log`.
    pub const MAX_LOG: ByteSize = ByteSize(64 * 1024 * 1024 * 1024);

    fn parse(text: &str) -> Option<u64> {
        let text = text.trim();
        let split = text
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len());
        let (digits, unit) = text.split_at(split);
        let number: u64 = digits.parse().ok()?;
        let multiplier: u64 = match unit.trim() {
            "" | "B" => 1,
            "KB" => 1000,
            "KiB" => 1 << 10,
            "MB" => 1000 * 1000,
            "MiB" => 1 << 20,
            "GB" => 1000 * 1000 * 1000,
            "GiB" => 1 << 30,
            _ => return None,
        };
        number.checked_mul(multiplier)
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [(u64, &str); 3] = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
        for (size, unit) in UNITS {
            if self.0 >= size && self.0.is_multiple_of(size) {
                return write!(f, "{}{unit}", self.0 / size);
            }
        }
        write!(f, "{}B", self.0)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Bytes(u64),
            Text(String),
        }
        let bytes = match Raw::deserialize(deserializer)? {
            Raw::Bytes(bytes) => bytes,
            Raw::Text(text) => ByteSize::parse(&text).ok_or_else(|| {
                serde::de::Error::custom(format!(
                    "invalid size `{text}`; write it like \"64MiB\", \"512KiB\" or \"1GiB\""
                ))
            })?,
        };
        let size = ByteSize(bytes);
        if size < ByteSize::MIN_LOG || size > ByteSize::MAX_LOG {
            return Err(serde::de::Error::custom(format!(
                "size {size} is out of range: it must be from {} to {}",
                ByteSize::MIN_LOG,
                ByteSize::MAX_LOG
            )));
        }
        Ok(size)
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.to_string())
    }
}

/// How many tasks may run at once: a whole number of at least 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct Parallelism(pub NonZeroUsize);

impl Parallelism {
    pub fn get(self) -> usize {
        self.0.get()
    }
}

impl Parallelism {
    /// More agents at once than any machine serves.
    pub const MAX: usize = 1000;
}

impl<'de> Deserialize<'de> for Parallelism {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = i64::deserialize(deserializer)?;
        usize::try_from(value)
            .ok()
            .filter(|value| *value <= Parallelism::MAX)
            .and_then(NonZeroUsize::new)
            .map(Parallelism)
            .ok_or_else(|| {
                serde::de::Error::custom(format!(
                    "parallelism must be a whole number from 1 to {}, not {value}",
                    Parallelism::MAX
                ))
            })
    }
}

/// The longest `stop_grace`: `crew agents stop` waits this long for an agent that ignores TERM.
pub const MAX_STOP_GRACE: HumanDuration = HumanDuration(Duration::from_secs(3600));

/// `.crew/config.toml`. Every key is optional.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProjectConfig {
    pub run: RunSettings,
    pub worktree: WorktreeSettings,
    pub isolation: IsolationSettings,
    pub retention: RetentionSettings,
    pub sandbox: SandboxSettings,
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
    pub fallback: IsolationFallback,
}

/// `[sandbox]` of `config.toml`: the project's word on confining agents.
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct SandboxSettings {
    /// `"off"` turns the sandbox off for every agent of the project.
    pub mode: SandboxMode,
}

/// `[sandbox]` of an agent definition: what its program needs to write besides its workspace
/// and its private temp dir.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct AgentSandbox {
    /// `"off"` turns the sandbox off for this agent.
    pub mode: SandboxMode,
    /// Absolute paths, or paths beneath the home directory written `~/…`, that the agent may
    /// write beneath. `~` is expanded with the `HOME` the agent sees.
    pub write: Vec<String>,
}

impl AgentSandbox {
    /// The `write` entries as absolute paths, `~` expanded with `home`; entries beneath a
    /// missing home are left out.
    pub fn write_paths(&self, home: Option<&Utf8Path>) -> Vec<Utf8PathBuf> {
        self.write
            .iter()
            .filter_map(|entry| match entry.strip_prefix('~') {
                Some(rest) => home.map(|home| home.join(rest.trim_start_matches('/'))),
                None => Some(Utf8PathBuf::from(entry)),
            })
            .collect()
    }
}

/// Checks one `[sandbox] write` entry: absolute or `~/…`, no `..`.
fn check_sandbox_path(entry: &str) -> Result<(), String> {
    let rest = if entry == "~" {
        ""
    } else if let Some(rest) = entry.strip_prefix("~/") {
        rest
    } else if let Some(rest) = entry.strip_prefix('/') {
        rest
    } else {
        return Err(format!(
            "`{entry}` must be an absolute path or start with `~/` (the agent's home directory)"
        ));
    };
    if rest.split('/').any(|segment| segment == "..") {
        return Err(format!("`{entry}` must not contain `..`"));
    }
    Ok(())
}

/// `[retention]`
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetentionSettings {
    /// Finished runs beyond this many (newest kept) are pruned.
    pub max_kept_runs: usize,
    /// Finished runs older than this are pruned.
    pub max_run_age_days: u64,
}

impl Default for RetentionSettings {
    fn default() -> Self {
        RetentionSettings {
            max_kept_runs: 20,
            max_run_age_days: 7,
        }
    }
}

/// An agent definition, from `.crew/agents/<name>.toml` or built in.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AgentDef {
    pub name: String,
    pub description: Option<String>,
    /// argv template; never run through a shell.
    pub command: Vec<String>,
    pub steer: SteerMode,
    /// argv template used to resume a stopped or finished agent; `{message}` is the follow-up.
    pub resume: Option<Vec<String>>,
    pub env: BTreeMap<String, String>,
    /// Variables of the user's environment the agent may see, besides the always-passed ones.
    /// A trailing `*` matches a prefix (`LC_*`).
    pub pass_env: Vec<String>,
    /// What the agent may write besides its workspace, and whether it is confined at all.
    pub sandbox: AgentSandbox,
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
            resume: None,
            env: BTreeMap::new(),
            pass_env: Vec::new(),
            sandbox: AgentSandbox::default(),
            builtin: true,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AgentFile {
    description: Option<String>,
    command: Spanned<Vec<String>>,
    #[serde(default)]
    steer: SteerMode,
    resume: Option<Spanned<Vec<String>>>,
    #[serde(default)]
    env: BTreeMap<Spanned<String>, String>,
    #[serde(default)]
    pass_env: Vec<Spanned<String>>,
    #[serde(default)]
    sandbox: AgentSandboxFile,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct AgentSandboxFile {
    #[serde(default)]
    mode: SandboxMode,
    #[serde(default)]
    write: Vec<Spanned<String>>,
}

/// A team: the tasks of a run, from `.crew/teams/<name>.toml` or built ad hoc.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TeamDef {
    pub name: String,
    pub description: Option<String>,
    pub workspace_mode: Option<WorkspaceMode>,
    pub max_parallel: Option<Parallelism>,
    pub fail_fast: Option<bool>,
    pub tasks: Vec<TaskDef>,
}

/// One task of a team.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TaskDef {
    pub id: TaskId,
    pub agent: String,
    pub prompt: String,
    pub depends_on: Vec<TaskId>,
    pub timeout: Option<HumanDuration>,
    pub workspace_mode: Option<WorkspaceMode>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TeamFile {
    description: Option<String>,
    workspace_mode: Option<WorkspaceMode>,
    max_parallel: Option<Parallelism>,
    fail_fast: Option<bool>,
    tasks: Spanned<Vec<TaskFile>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TaskFile {
    id: Spanned<String>,
    agent: Spanned<String>,
    prompt: Spanned<String>,
    #[serde(default)]
    depends_on: Vec<Spanned<String>>,
    timeout: Option<HumanDuration>,
    workspace_mode: Option<WorkspaceMode>,
}

/// A team with every agent its tasks name.
#[derive(Debug, Clone, PartialEq)]
pub struct Team {
    pub def: TeamDef,
    pub agents: BTreeMap<String, AgentDef>,
}

/// A task of a team made on the spot: what a lead agent may say about it, and no more (no
/// workspace mode, path or sandbox setting).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedTask {
    pub id: String,
    pub agent: String,
    pub prompt: String,
    pub depends_on: Vec<String>,
}

/// An ad hoc team that could not be made.
#[derive(Debug, thiserror::Error)]
pub enum AdHocTeamError {
    #[error(transparent)]
    Agent(#[from] LoadConfigError),
    /// The task ids break a rule; the message says which.
    #[error("{0}")]
    Tasks(String),
}

/// A configuration file that could not be used.
#[derive(Debug, thiserror::Error)]
pub enum LoadConfigError {
    #[error("failed to read {path}")]
    Read {
        path: Utf8PathBuf,
        #[source]
        source: FileError,
    },
    #[error("{path} is not valid UTF-8")]
    NotUtf8 { path: Utf8PathBuf },
    #[error("{}", render_invalid(path, *line, *column, key.as_deref(), message))]
    Invalid {
        path: Utf8PathBuf,
        line: usize,
        column: usize,
        key: Option<String>,
        message: String,
    },
    /// Every problem of one file, in the order they appear.
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
    Several(Vec<LoadConfigError>),
    #[error("unknown team `{name}`")]
    UnknownTeam {
        name: String,
        teams_dir: Utf8PathBuf,
        available: Vec<String>,
    },
    #[error("unknown agent `{name}`")]
    UnknownAgent {
        name: String,
        agents_dir: Utf8PathBuf,
        available: Vec<String>,
    },
    #[error("invalid {kind} name `{name}`: {rule}")]
    InvalidName {
        kind: &'static str,
        name: String,
        rule: &'static str,
    },
    #[error("failed to list {dir}")]
    ListDir {
        dir: Utf8PathBuf,
        #[source]
        source: std::io::Error,
    },
}

fn render_invalid(
    path: &Utf8Path,
    line: usize,
    column: usize,
    key: Option<&str>,
    message: &str,
) -> String {
    match key {
        Some(key) => format!("{path}:{line}:{column}: key `{key}`: {message}"),
        None => format!("{path}:{line}:{column}: {message}"),
    }
}

impl LoadConfigError {
    /// What the user can do about it, when there is something to say.
    pub fn hint(&self) -> Option<String> {
        match self {
            LoadConfigError::UnknownTeam {
                teams_dir,
                available,
                ..
            } => Some(if available.is_empty() {
                format!(
                    "no teams are defined; create {teams_dir}/<name>.toml (`crew init` writes an example)"
                )
            } else {
                format!("teams in {teams_dir}: {}", available.join(", "))
            }),
            LoadConfigError::UnknownAgent {
                agents_dir,
                available,
                ..
            } => Some(format!(
                "define it in {agents_dir}/<name>.toml; known agents: {}",
                available.join(", ")
            )),
            _ => None,
        }
    }
}

/// The configuration directory of a workspace (`<root>/.crew`), or any directory laid out the
/// same way (`.crew.example/`).
#[derive(Debug, Clone)]
pub struct ConfigDir {
    dir: Utf8PathBuf,
}

impl ConfigDir {
    pub fn new(dir: impl Into<Utf8PathBuf>) -> Self {
        ConfigDir { dir: dir.into() }
    }

    pub fn path(&self) -> &Utf8Path {
        &self.dir
    }

    /// `config.toml`, or the defaults when it does not exist.
    pub fn load_project_config(&self) -> Result<ProjectConfig, LoadConfigError> {
        let path = self.dir.join(CONFIG_FILE);
        let Some(source) = read_optional(&path)? else {
            return Ok(ProjectConfig::default());
        };
        parse_toml_checked(&path, &source, validate_project_config)
    }

    /// The agent `name`: its file when present, else a built-in agent of that name.
    pub fn load_agent(&self, name: &str) -> Result<AgentDef, LoadConfigError> {
        check_name("agent", name)?;
        let path = self.dir.join(AGENTS_DIR).join(format!("{name}.toml"));
        match read_optional(&path)? {
            Some(source) => parse_agent(&path, &source, name),
            None if name == BUILTIN_SHELL_AGENT => Ok(AgentDef::builtin_shell()),
            None => Err(LoadConfigError::UnknownAgent {
                name: name.to_owned(),
                agents_dir: self.dir.join(AGENTS_DIR),
                available: self.agent_names()?,
            }),
        }
    }

    /// Names of the agents defined in files plus the built-in ones, sorted.
    pub fn agent_names(&self) -> Result<Vec<String>, LoadConfigError> {
        let mut names = list_toml_stems(&self.dir.join(AGENTS_DIR))?;
        if !names.iter().any(|name| name == BUILTIN_SHELL_AGENT) {
            names.push(BUILTIN_SHELL_AGENT.to_owned());
        }
        names.sort();
        Ok(names)
    }

    /// A team made on the spot: each `(id, prompt)` a task of agent `agent_name`, none
    /// depending on another (`crew run --agent`, an editor's prompt).
    pub fn ad_hoc_team(
        &self,
        agent_name: &str,
        tasks: Vec<(String, String)>,
    ) -> Result<Team, AdHocTeamError> {
        let planned = tasks
            .into_iter()
            .map(|(id, prompt)| PlannedTask {
                id,
                agent: agent_name.to_owned(),
                prompt,
                depends_on: Vec::new(),
            })
            .collect();
        self.planned_team(&format!("adhoc-{agent_name}"), planned)
    }

    /// A team from tasks planned elsewhere than a file (a lead agent over MCP): each with its
    /// agent and dependencies, checked by the same rules as a team file.
    pub fn planned_team(
        &self,
        name: &str,
        tasks: Vec<PlannedTask>,
    ) -> Result<Team, AdHocTeamError> {
        let mut agents = BTreeMap::new();
        for task in &tasks {
            if !agents.contains_key(&task.agent) {
                agents.insert(task.agent.clone(), self.load_agent(&task.agent)?);
            }
        }
        let graph: Vec<(String, Vec<String>)> = tasks
            .iter()
            .map(|task| (task.id.clone(), task.depends_on.clone()))
            .collect();
        let ids = validate_plain_task_graph(&graph).map_err(AdHocTeamError::Tasks)?;
        let tasks = ids
            .into_iter()
            .zip(tasks)
            .map(|((id, depends_on), task)| TaskDef {
                id,
                agent: task.agent,
                prompt: task.prompt,
                depends_on,
                timeout: None,
                workspace_mode: None,
            })
            .collect();
        Ok(Team {
            def: TeamDef {
                name: name.to_owned(),
                description: None,
                workspace_mode: None,
                max_parallel: None,
                fail_fast: None,
                tasks,
            },
            agents,
        })
    }

    /// Names of the teams defined in files, sorted.
    pub fn team_names(&self) -> Result<Vec<String>, LoadConfigError> {
        list_toml_stems(&self.dir.join(TEAMS_DIR))
    }

    /// The team `name` with every agent it uses, fully validated.
    pub fn load_team(&self, name: &str) -> Result<Team, LoadConfigError> {
        check_name("team", name)?;
        let path = self.dir.join(TEAMS_DIR).join(format!("{name}.toml"));
        let Some(source) = read_optional(&path)? else {
            return Err(LoadConfigError::UnknownTeam {
                name: name.to_owned(),
                teams_dir: self.dir.join(TEAMS_DIR),
                available: self.team_names()?,
            });
        };
        let file: TeamFile = parse_toml(&path, &source)?;
        let invalid = |span: Range<usize>, key: String, message: String| {
            invalid_at(&path, &source, span, Some(key), message)
        };
        // Every problem of the file at once: unknown agents, then the task graph's.
        let mut problems = Vec::new();
        let mut agents = BTreeMap::new();
        let mut unknown: Vec<&String> = Vec::new();
        for (index, task) in file.tasks.get_ref().iter().enumerate() {
            let agent_name = task.agent.get_ref();
            if agents.contains_key(agent_name) || unknown.contains(&agent_name) {
                continue;
            }
            match self.load_agent(agent_name) {
                Ok(agent) => {
                    agents.insert(agent_name.clone(), agent);
                }
                Err(LoadConfigError::UnknownAgent {
                    agents_dir,
                    available,
                    ..
                }) => {
                    unknown.push(agent_name);
                    problems.push(invalid(
                        task.agent.span(),
                        format!("tasks[{index}].agent"),
                        format!(
                            "unknown agent `{agent_name}`; define it in {agents_dir}/{agent_name}.toml or use one of: {}",
                            available.join(", ")
                        ),
                    ));
                }
                Err(LoadConfigError::InvalidName { rule, .. }) => {
                    unknown.push(agent_name);
                    problems.push(invalid(
                        task.agent.span(),
                        format!("tasks[{index}].agent"),
                        format!("invalid agent name `{agent_name}`: {rule}"),
                    ));
                }
                Err(other) => return Err(other),
            }
        }
        let specs = file
            .tasks
            .get_ref()
            .iter()
            .enumerate()
            .map(|(index, task)| TaskSpec {
                index,
                id: task.id.clone(),
                depends_on: task.depends_on.clone(),
            })
            .collect::<Vec<_>>();
        let ids = match validate_task_graph(&specs) {
            Ok(ids) => ids,
            Err(errors) => {
                problems.extend(
                    errors
                        .into_iter()
                        .map(|error| invalid(error.span, error.key, error.message)),
                );
                Vec::new()
            }
        };
        if !problems.is_empty() {
            return Err(several(problems));
        }
        if ids.is_empty() {
            return Err(invalid(
                file.tasks.span(),
                "tasks".to_owned(),
                "a team needs at least one task".to_owned(),
            ));
        }
        let tasks = file
            .tasks
            .into_inner()
            .into_iter()
            .zip(ids)
            .map(|(task, (id, depends_on))| TaskDef {
                id,
                agent: task.agent.into_inner(),
                prompt: task.prompt.into_inner(),
                depends_on,
                timeout: task.timeout,
                workspace_mode: task.workspace_mode,
            })
            .collect();
        Ok(Team {
            def: TeamDef {
                name: name.to_owned(),
                description: file.description,
                workspace_mode: file.workspace_mode,
                max_parallel: file.max_parallel,
                fail_fast: file.fail_fast,
                tasks,
            },
            agents,
        })
    }
}

/// A task's id and dependencies as written, for graph validation.
#[derive(Debug, Clone)]
pub struct TaskSpec {
    pub index: usize,
    pub id: Spanned<String>,
    pub depends_on: Vec<Spanned<String>>,
}

/// A task graph that breaks a rule, located at the offending value.
#[derive(Debug, Clone)]
pub struct GraphError {
    pub span: Range<usize>,
    pub key: String,
    pub message: String,
}

/// Checks ids (rules, case-insensitive uniqueness), dependencies (known, not twice) and cycles.
/// Returns each task's parsed id and dependencies, in order, or every problem found (a cycle is
/// looked for only in a graph without other problems).
pub fn validate_task_graph(
    tasks: &[TaskSpec],
) -> Result<Vec<(TaskId, Vec<TaskId>)>, Vec<GraphError>> {
    let mut errors = Vec::new();
    let mut seen: HashMap<String, &str> = HashMap::new();
    let mut ids: Vec<Option<TaskId>> = Vec::with_capacity(tasks.len());
    for task in tasks {
        let key = format!("tasks[{}].id", task.index);
        match TaskId::parse(task.id.get_ref()) {
            Ok(id) => {
                if let Some(first) = seen.insert(id.collision_key(), task.id.get_ref()) {
                    errors.push(GraphError {
                        span: task.id.span(),
                        key,
                        message: format!(
                            "duplicate task id `{}`: task `{first}` already uses it (task ids must be unique ignoring case)",
                            task.id.get_ref()
                        ),
                    });
                }
                ids.push(Some(id));
            }
            Err(error) => {
                errors.push(GraphError {
                    span: task.id.span(),
                    key,
                    message: error.to_string(),
                });
                ids.push(None);
            }
        }
    }
    let position: HashMap<&str, usize> = tasks
        .iter()
        .enumerate()
        .map(|(index, task)| (task.id.get_ref().as_str(), index))
        .collect();
    let mut edges: Vec<Vec<usize>> = Vec::with_capacity(tasks.len());
    for task in tasks {
        let mut deps = Vec::new();
        for (dep_index, dep) in task.depends_on.iter().enumerate() {
            let key = format!("tasks[{}].depends_on[{dep_index}]", task.index);
            let id = task.id.get_ref();
            let Some(&target) = position.get(dep.get_ref().as_str()) else {
                errors.push(GraphError {
                    span: dep.span(),
                    key,
                    message: format!(
                        "task `{id}` depends on `{}`, which is not a task of this team",
                        dep.get_ref()
                    ),
                });
                continue;
            };
            if deps.contains(&target) {
                errors.push(GraphError {
                    span: dep.span(),
                    key,
                    message: format!("task `{id}` lists `{}` twice", dep.get_ref()),
                });
                continue;
            }
            deps.push(target);
        }
        edges.push(deps);
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    let ids: Vec<TaskId> = ids.into_iter().flatten().collect();
    if let Some(cycle) = find_cycle(&edges) {
        let first = cycle[0];
        let closing = cycle[1 % cycle.len()];
        let dep_index = tasks[first]
            .depends_on
            .iter()
            .position(|dep| position.get(dep.get_ref().as_str()) == Some(&closing))
            .expect("a cycle follows existing edges");
        let path = cycle
            .iter()
            .chain(std::iter::once(&first))
            .map(|&index| ids[index].as_str())
            .collect::<Vec<_>>()
            .join(" -> ");
        return Err(vec![GraphError {
            span: tasks[first].depends_on[dep_index].span(),
            key: format!("tasks[{}].depends_on[{dep_index}]", tasks[first].index),
            message: format!("dependency cycle: {path}"),
        }]);
    }
    Ok(tasks
        .iter()
        .zip(&ids)
        .zip(&edges)
        .map(|((_, id), deps)| {
            (
                id.clone(),
                deps.iter().map(|&dep| ids[dep].clone()).collect(),
            )
        })
        .collect())
}

/// [`validate_task_graph`] for tasks that come from elsewhere than a file (submitted by an
/// agent, given on the command line): same rules, messages without a location.
pub fn validate_plain_task_graph(
    tasks: &[(String, Vec<String>)],
) -> Result<Vec<(TaskId, Vec<TaskId>)>, String> {
    let specs: Vec<TaskSpec> = tasks
        .iter()
        .enumerate()
        .map(|(index, (id, depends_on))| TaskSpec {
            index,
            id: Spanned::new(0..0, id.clone()),
            depends_on: depends_on
                .iter()
                .map(|dep| Spanned::new(0..0, dep.clone()))
                .collect(),
        })
        .collect();
    validate_task_graph(&specs).map_err(|errors| {
        errors
            .into_iter()
            .map(|error| error.message)
            .collect::<Vec<_>>()
            .join("; ")
    })
}

/// A cycle in the graph, as the list of nodes along it, when there is one.
fn find_cycle(edges: &[Vec<usize>]) -> Option<Vec<usize>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        Active,
        Done,
    }
    let mut marks = vec![Mark::New; edges.len()];
    for start in 0..edges.len() {
        if marks[start] != Mark::New {
            continue;
        }
        // Iterative depth-first search: (node, next edge to follow).
        let mut stack = vec![(start, 0usize)];
        marks[start] = Mark::Active;
        while let Some(&mut (node, ref mut next)) = stack.last_mut() {
            if let Some(&target) = edges[node].get(*next) {
                *next += 1;
                match marks[target] {
                    Mark::New => {
                        marks[target] = Mark::Active;
                        stack.push((target, 0));
                    }
                    Mark::Active => {
                        let from = stack
                            .iter()
                            .position(|&(n, _)| n == target)
                            .expect("an active node is on the stack");
                        return Some(stack[from..].iter().map(|&(n, _)| n).collect());
                    }
                    Mark::Done => {}
                }
            } else {
                marks[node] = Mark::Done;
                stack.pop();
            }
        }
    }
    None
}

fn check_name(kind: &'static str, name: &str) -> Result<(), LoadConfigError> {
    TaskId::parse(name)
        .map(drop)
        .map_err(|error| LoadConfigError::InvalidName {
            kind,
            name: name.to_owned(),
            rule: error.rule,
        })
}

fn read_optional(path: &Utf8Path) -> Result<Option<String>, LoadConfigError> {
    match read_nofollow(path) {
        Ok(bytes) => String::from_utf8(bytes)
            .map(Some)
            .map_err(|_| LoadConfigError::NotUtf8 {
                path: path.to_owned(),
            }),
        Err(FileError::Read { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            Ok(None)
        }
        Err(source) => Err(LoadConfigError::Read {
            path: path.to_owned(),
            source,
        }),
    }
}

fn list_toml_stems(dir: &Utf8Path) -> Result<Vec<String>, LoadConfigError> {
    let entries = match dir.read_dir_utf8() {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(LoadConfigError::ListDir {
                dir: dir.to_owned(),
                source,
            });
        }
    };
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| LoadConfigError::ListDir {
            dir: dir.to_owned(),
            source,
        })?;
        if let Some(stem) = entry.file_name().strip_suffix(".toml") {
            names.push(stem.to_owned());
        }
    }
    names.sort();
    Ok(names)
}

/// Reads a TOML file into `T`. When it does not fit, every key that fails on its own is
/// named, not only the first.
fn parse_toml<T: serde::de::DeserializeOwned>(
    path: &Utf8Path,
    source: &str,
) -> Result<T, LoadConfigError> {
    parse_toml_checked(path, source, |_, _, _| Vec::new())
}

/// Reads a TOML file into `T` and runs `check` (whose problems are placed by key in the
/// source) on it. When some keys do not fit, `check` still runs on the rest of the file, so
/// that every problem is named at once.
fn parse_toml_checked<T: serde::de::DeserializeOwned>(
    path: &Utf8Path,
    source: &str,
    check: impl Fn(&Utf8Path, &str, &T) -> Vec<LoadConfigError>,
) -> Result<T, LoadConfigError> {
    let error = match toml::from_str(source) {
        Ok(value) => {
            let problems = check(path, source, &value);
            return if problems.is_empty() {
                Ok(value)
            } else {
                Err(several(problems))
            };
        }
        Err(error) => error,
    };
    let span = error.span().unwrap_or(0..0);
    let key = key_at(source, span.start);
    let first = invalid_at(
        path,
        source,
        span,
        key.clone(),
        error.message().trim_end().to_owned(),
    );
    let mut problems = problems_by_key::<T>(path, source);
    if let Some(rest) = without_keys::<T>(source, &problems) {
        problems.extend(check(path, source, &rest));
    }
    if problems.len() <= 1 {
        return Err(first);
    }
    // The first problem as the parser saw it, with its exact place.
    problems.retain(
        |problem| !matches!(problem, LoadConfigError::Invalid { key: other, .. } if *other == key),
    );
    problems.push(first);
    Err(several(problems))
}

/// Each key of `source` (each key of a table, one level down) read into `T` on its own: the
/// problems of those that do not fit, placed at their key. Arrays of tables are read whole by
/// the caller's first pass only; a file that is not TOML at all has no keys to try.
fn problems_by_key<T: serde::de::DeserializeOwned>(
    path: &Utf8Path,
    source: &str,
) -> Vec<LoadConfigError> {
    let Ok(table) = source.parse::<toml::Table>() else {
        return Vec::new();
    };
    let alone = |key: &str, value: toml::Value| toml::Table::from_iter([(key.to_owned(), value)]);
    let mut entries = Vec::new();
    for (key, value) in table {
        match value {
            toml::Value::Table(inner) => {
                for (sub, value) in inner {
                    let dotted = format!("{key}.{sub}");
                    entries.push((dotted, alone(&key, toml::Value::Table(alone(&sub, value)))));
                }
            }
            toml::Value::Array(items) if items.iter().any(toml::Value::is_table) => {}
            value => entries.push((key.clone(), alone(&key, value))),
        }
    }
    let mut problems = Vec::new();
    for (dotted, entry) in entries {
        let Ok(text) = toml::to_string(&entry) else {
            continue;
        };
        let Err(error) = toml::from_str::<T>(&text) else {
            continue;
        };
        let message = error.message().trim_end();
        // Alone, a key misses the file's other required keys: not its problem.
        if message.starts_with("missing field") {
            continue;
        }
        let offset = find_key_offset(source, &dotted);
        problems.push(invalid_at(
            path,
            source,
            offset..offset,
            Some(dotted),
            message.to_owned(),
        ));
    }
    problems
}

/// `source` read into `T` without the keys `problems` name; `None` when even that fails.
fn without_keys<T: serde::de::DeserializeOwned>(
    source: &str,
    problems: &[LoadConfigError],
) -> Option<T> {
    let mut table = source.parse::<toml::Table>().ok()?;
    for problem in problems {
        let LoadConfigError::Invalid { key: Some(key), .. } = problem else {
            continue;
        };
        match key.split_once('.') {
            Some((outer, inner)) => {
                if let Some(toml::Value::Table(outer)) = table.get_mut(outer) {
                    outer.remove(inner);
                }
            }
            None => {
                table.remove(key);
            }
        }
    }
    toml::from_str(&toml::to_string(&table).ok()?).ok()
}

/// One error for a file's problems, in the order they appear in it.
fn several(mut problems: Vec<LoadConfigError>) -> LoadConfigError {
    problems.sort_by_key(|problem| match problem {
        LoadConfigError::Invalid { line, column, .. } => (*line, *column),
        _ => (usize::MAX, usize::MAX),
    });
    if problems.len() == 1 {
        problems.remove(0)
    } else {
        LoadConfigError::Several(problems)
    }
}

fn invalid_at(
    path: &Utf8Path,
    source: &str,
    span: Range<usize>,
    key: Option<String>,
    message: String,
) -> LoadConfigError {
    let (line, column) = line_column(source, span.start);
    LoadConfigError::Invalid {
        path: path.to_owned(),
        line,
        column,
        key,
        message,
    }
}

/// 1-based line and column (in characters) of a byte offset.
fn line_column(source: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(source.len());
    let before = &source[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |newline| newline + 1);
    let column = before[line_start..].chars().count() + 1;
    (line, column)
}

/// The dotted key a byte offset belongs to, from the `key = value` line it is on and the table
/// headers above it (`tasks[1].agent`). `None` when the offset is not on a key line.
fn key_at(source: &str, offset: usize) -> Option<String> {
    let offset = offset.min(source.len());
    let mut table: Option<String> = None;
    let mut array_counts: HashMap<String, usize> = HashMap::new();
    let mut key = None;
    let mut line_start = 0;
    for line in source.split_inclusive('\n') {
        let line_end = line_start + line.len();
        let trimmed = line.trim();
        if let Some(name) = trimmed
            .strip_prefix("[[")
            .and_then(|rest| rest.split_once("]]"))
            .map(|(name, _)| name.trim().to_owned())
        {
            let count = array_counts.entry(name.clone()).or_insert(0);
            table = Some(format!("{name}[{count}]"));
            *count += 1;
        } else if let Some(name) = trimmed
            .strip_prefix('[')
            .and_then(|rest| rest.split_once(']'))
            .map(|(name, _)| name.trim().to_owned())
        {
            table = Some(name);
        }
        if offset < line_end || line_end == source.len() {
            key = trimmed
                .split_once('=')
                .map(|(name, _)| name.trim().trim_matches('"').to_owned())
                .filter(|name| {
                    !name.is_empty()
                        && name
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
                });
            break;
        }
        line_start = line_end;
    }
    match (table, key) {
        (Some(table), Some(key)) => Some(format!("{table}.{key}")),
        (None, Some(key)) => Some(key),
        (Some(table), None) => Some(table),
        (None, None) => None,
    }
}

fn validate_project_config(
    path: &Utf8Path,
    source: &str,
    config: &ProjectConfig,
) -> Vec<LoadConfigError> {
    // The values have no spans once deserialized; locate the offending key in the text.
    let mut problems = Vec::new();
    let mut invalid = |key: &str, message: String| {
        let offset = find_key_offset(source, key);
        problems.push(invalid_at(
            path,
            source,
            offset..offset,
            Some(key.to_owned()),
            message,
        ));
    };
    if config.run.stop_grace > MAX_STOP_GRACE {
        invalid(
            "run.stop_grace",
            format!(
                "a stop grace of {} is too long: it must be at most {MAX_STOP_GRACE} (an agent that ignores TERM is killed only after it)",
                config.run.stop_grace
            ),
        );
    }
    let worktree = &config.worktree;
    if let Err(rule) = check_relative_path(&worktree.dir) {
        invalid("worktree.dir", format!("`{}` {rule}", worktree.dir));
    } else if worktree.dir == Utf8Path::new(".git") || worktree.dir.starts_with(".git") {
        invalid(
            "worktree.dir",
            "worktrees cannot live inside `.git`".to_owned(),
        );
    }
    if let Err(rule) = check_branch_prefix(&worktree.branch_prefix) {
        invalid(
            "worktree.branch_prefix",
            format!("`{}` {rule}", worktree.branch_prefix),
        );
    }
    for (key, list) in [
        ("worktree.link", &worktree.link),
        ("worktree.copy", &worktree.copy),
        ("worktree.keep_ignored", &worktree.keep_ignored),
    ] {
        for entry in list {
            if let Err(rule) = check_relative_path(entry) {
                invalid(key, format!("`{entry}` {rule}"));
            }
        }
    }
    if let Some(setup) = &worktree.setup
        && setup.first().is_none_or(|program| program.is_empty())
    {
        invalid(
            "worktree.setup",
            "the setup command needs a program: write it as [\"npm\", \"ci\"]".to_owned(),
        );
    }
    problems
}

/// The byte offset of `table.key` in a TOML source, or 0 when it cannot be found.
fn find_key_offset(source: &str, dotted: &str) -> usize {
    let (table, key) = dotted.rsplit_once('.').unwrap_or(("", dotted));
    let mut in_table = table.is_empty();
    let mut offset = 0;
    for line in source.split_inclusive('\n') {
        let trimmed = line.trim();
        if trimmed.starts_with('[') {
            in_table = trimmed.trim_start_matches('[').trim_end_matches(']').trim() == table;
        } else if in_table
            && trimmed
                .split_once('=')
                .is_some_and(|(name, _)| name.trim().trim_matches('"') == key)
        {
            return offset + (line.len() - line.trim_start().len());
        }
        offset += line.len();
    }
    0
}

/// A path from configuration must stay inside the repository: relative, no `..`, not empty.
fn check_relative_path(path: &Utf8Path) -> Result<(), &'static str> {
    if path.as_str().is_empty() {
        return Err("must not be empty");
    }
    if path.is_absolute() {
        return Err("must be relative to the repository root");
    }
    if path
        .components()
        .any(|c| matches!(c, camino::Utf8Component::ParentDir))
    {
        return Err("must not contain `..`");
    }
    if normalize_lexically(path).as_str().is_empty() {
        return Err("must name a path below the repository root");
    }
    Ok(())
}

/// Branch prefixes become part of ref names: letters, digits, `.`, `_`, `-` and `/` between
/// segments, following git's ref rules.
fn check_branch_prefix(prefix: &str) -> Result<(), &'static str> {
    if prefix.is_empty() {
        return Err("must not be empty");
    }
    if !prefix
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/'))
    {
        return Err("may only contain letters, digits, `.`, `_`, `-` and `/`");
    }
    for segment in prefix.split('/') {
        if segment.is_empty() {
            return Err("must not start or end with `/` or contain `//`");
        }
        if segment.starts_with('.') || segment.starts_with('-') {
            return Err("segments must not start with `.` or `-`");
        }
        if segment.ends_with(".lock") || segment.ends_with('.') {
            return Err("segments must not end with `.lock` or `.`");
        }
    }
    let first = prefix.split('/').next().unwrap_or_default();
    if first == "HEAD" || first == "refs" {
        return Err(
            "must not start with `HEAD` or `refs`: branches would read like git's own names",
        );
    }
    if prefix.contains("..") {
        return Err("must not contain `..`");
    }
    Ok(())
}

fn parse_agent(path: &Utf8Path, source: &str, name: &str) -> Result<AgentDef, LoadConfigError> {
    let file: AgentFile = parse_toml(path, source)?;
    let mut problems = Vec::new();
    let mut invalid = |span: Range<usize>, key: &str, message: String| {
        problems.push(invalid_at(
            path,
            source,
            span,
            Some(key.to_owned()),
            message,
        ));
    };
    if let Err(message) = check_template(file.command.get_ref(), COMMAND_PLACEHOLDERS) {
        invalid(file.command.span(), "command", message);
    }
    if let Some(resume) = &file.resume
        && let Err(message) = check_template(resume.get_ref(), RESUME_PLACEHOLDERS)
    {
        invalid(resume.span(), "resume", message);
    }
    let mut env = BTreeMap::new();
    for (key, value) in file.env {
        if let Err(message) = check_env_name(key.get_ref(), false) {
            invalid(key.span(), "env", message);
        } else if value.contains('\0') {
            invalid(
                key.span(),
                "env",
                format!(
                    "the value of `{}` holds a NUL byte, which no environment can carry",
                    key.get_ref()
                ),
            );
        }
        env.insert(key.into_inner(), value);
    }
    let mut pass_env = Vec::new();
    for entry in file.pass_env {
        if let Err(message) = check_env_name(entry.get_ref(), true) {
            invalid(entry.span(), "pass_env", message);
        }
        pass_env.push(entry.into_inner());
    }
    let mut sandbox = AgentSandbox {
        mode: file.sandbox.mode,
        write: Vec::new(),
    };
    for entry in file.sandbox.write {
        if let Err(message) = check_sandbox_path(entry.get_ref()) {
            invalid(entry.span(), "sandbox.write", message);
        }
        sandbox.write.push(entry.into_inner());
    }
    if !problems.is_empty() {
        return Err(several(problems));
    }
    Ok(AgentDef {
        name: name.to_owned(),
        description: file.description,
        command: file.command.into_inner(),
        steer: file.steer,
        resume: file.resume.map(Spanned::into_inner),
        env,
        pass_env,
        sandbox,
        builtin: false,
    })
}

/// Checks an argv template: a program, and only known `{placeholders}`.
fn check_template(argv: &[String], allowed: &[&str]) -> Result<(), String> {
    if argv.first().is_none_or(|program| program.is_empty()) {
        return Err(
            "needs a program as its first element, e.g. [\"claude\", \"-p\", \"{prompt}\"]"
                .to_owned(),
        );
    }
    for arg in argv {
        if arg.contains('\0') {
            return Err(format!(
                "argument {arg:?} holds a NUL byte, which no program argument can carry"
            ));
        }
        for placeholder in placeholders(arg) {
            if !allowed.contains(&placeholder) {
                return Err(format!(
                    "unknown placeholder `{{{placeholder}}}`; available: {}",
                    allowed
                        .iter()
                        .map(|name| format!("{{{name}}}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
        }
    }
    Ok(())
}

/// The `{name}` placeholders in a template argument.
pub fn placeholders(arg: &str) -> impl Iterator<Item = &str> {
    arg.split('{').skip(1).filter_map(|rest| {
        let (name, _) = rest.split_once('}')?;
        let is_name =
            !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        is_name.then_some(name)
    })
}

/// Fills `{name}` placeholders of one template argument. Each argument stays one argument: a
/// prompt with spaces or quotes is never split or interpreted.
pub fn fill_template(arg: &str, values: &[(&str, &str)]) -> String {
    let mut out = String::with_capacity(arg.len());
    let mut rest = arg;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let replaced = after.split_once('}').and_then(|(name, tail)| {
            values
                .iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| (*value, tail))
        });
        match replaced {
            Some((value, tail)) => {
                out.push_str(value);
                rest = tail;
            }
            None => {
                out.push('{');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// Variables that locate or redirect a git repository. They never reach an agent: an agent must
/// work on the repository of its own workspace.
pub const GIT_LOCATION_VARIABLES: &[&str] = &[
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_INDEX_FILE",
    "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_COMMON_DIR",
    "GIT_NAMESPACE",
    "GIT_CEILING_DIRECTORIES",
    "GIT_DISCOVERY_ACROSS_FILESYSTEM",
    "GIT_PREFIX",
];

/// git's variables that say who commits and when, not where: an agent may have them (through
/// `pass_env` or `env`), so that its own `git commit` works where the identity lives only in
/// the environment. Globs may name them too (`GIT_AUTHOR_*`).
pub const GIT_IDENTITY_VARIABLES: &[&str] = &[
    "GIT_AUTHOR_NAME",
    "GIT_AUTHOR_EMAIL",
    "GIT_AUTHOR_DATE",
    "GIT_COMMITTER_NAME",
    "GIT_COMMITTER_EMAIL",
    "GIT_COMMITTER_DATE",
];

/// Whether `name` (or the glob `prefix*`) names only git identity variables.
fn is_git_identity(name: &str) -> bool {
    match name.strip_suffix('*') {
        Some(prefix) => prefix == "GIT_AUTHOR_" || prefix == "GIT_COMMITTER_",
        None => GIT_IDENTITY_VARIABLES.contains(&name),
    }
}

fn check_env_name(name: &str, allow_prefix_glob: bool) -> Result<(), String> {
    let base = if allow_prefix_glob {
        name.strip_suffix('*').unwrap_or(name)
    } else {
        name
    };
    let valid = !base.is_empty()
        && !base.starts_with(|c: char| c.is_ascii_digit())
        && base.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid {
        return Err(format!(
            "`{name}` is not a valid environment variable name (letters, digits and `_`, not starting with a digit)"
        ));
    }
    let names_git = base.starts_with("GIT_")
        || (allow_prefix_glob && name.ends_with('*') && "GIT_".starts_with(base));
    if names_git && !is_git_identity(name) {
        return Err(format!(
            "`{name}`: git's own variables never reach an agent, so each agent works on the repository of its workspace (only its identity may: GIT_AUTHOR_NAME, GIT_AUTHOR_EMAIL, GIT_COMMITTER_NAME, … or GIT_AUTHOR_*, GIT_COMMITTER_*)"
        ));
    }
    if base.starts_with("CREW_") {
        return Err(format!(
            "`{name}`: CREW_ variables are set by crew for each agent"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_fill_each_argument_separately() {
        let values = [("prompt", "say \"hi\"; rm -rf /"), ("task_id", "api")];
        assert_eq!(fill_template("{prompt}", &values), "say \"hi\"; rm -rf /");
        assert_eq!(fill_template("--task={task_id}", &values), "--task=api");
        assert_eq!(fill_template("{unknown} {", &values), "{unknown} {");
        assert_eq!(placeholders("a{b}c{d}").collect::<Vec<_>>(), ["b", "d"]);
    }

    #[test]
    fn key_at_names_array_tables() {
        let source =
            "description = \"x\"\n[[tasks]]\nid = \"a\"\n[[tasks]]\nid = \"b\"\nagent = 3\n";
        let offset = source.find("agent = 3").unwrap() + 8;
        assert_eq!(key_at(source, offset).as_deref(), Some("tasks[1].agent"));
        assert_eq!(key_at(source, 3).as_deref(), Some("description"));
    }

    #[test]
    fn cycles_are_found() {
        assert_eq!(
            find_cycle(&[vec![1], vec![2], vec![0]]),
            Some(vec![0, 1, 2])
        );
        assert_eq!(find_cycle(&[vec![], vec![0], vec![0, 1]]), None);
        assert_eq!(find_cycle(&[vec![0]]), Some(vec![0]));
    }

    #[test]
    fn sizes_read_like_people_write_them() {
        assert_eq!(ByteSize::parse("64MiB"), Some(64 << 20));
        assert_eq!(ByteSize::parse("2 GB"), Some(2_000_000_000));
        assert_eq!(ByteSize::parse("512"), Some(512));
        assert_eq!(ByteSize::parse("1TiB"), None);
        assert_eq!(ByteSize::parse("MiB"), None);
        assert_eq!(ByteSize(64 << 20).to_string(), "64MiB");
        assert_eq!(ByteSize(1500).to_string(), "1500B");
    }

    #[test]
    fn sandbox_paths_are_absolute_or_home() {
        for good in ["/var/cache/x", "~", "~/.claude", "~/a/b"] {
            assert!(check_sandbox_path(good).is_ok(), "{good:?}");
        }
        for bad in ["", "rel", "~user/x", "~/../etc", "/a/../b", "./x"] {
            assert!(check_sandbox_path(bad).is_err(), "{bad:?}");
        }
        let sandbox = AgentSandbox {
            mode: SandboxMode::Enforce,
            write: vec!["~/.claude".into(), "/opt/cache".into(), "~".into()],
        };
        assert_eq!(
            sandbox.write_paths(Some(Utf8Path::new("/home/u"))),
            ["/home/u/.claude", "/opt/cache", "/home/u"]
        );
        assert_eq!(sandbox.write_paths(None), ["/opt/cache"]);
    }

    #[test]
    fn branch_prefix_rules() {
        assert!(check_branch_prefix("crew").is_ok());
        assert!(check_branch_prefix("team/crew").is_ok());
        for bad in [
            "",
            "/x",
            "x/",
            "a//b",
            "a..b",
            ".x",
            "x.lock",
            "a b",
            "-x",
            "HEAD",
            "refs/tags/x",
        ] {
            assert!(check_branch_prefix(bad).is_err(), "{bad:?}");
        }
    }
}
