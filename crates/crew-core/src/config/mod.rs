//! Configuration: `.crew/config.toml`, `.crew/agents/<name>.toml`, `.crew/teams/<name>.toml`.
//!
//! Every file is checked completely before anything starts. Unknown keys, wrong types, invalid
//! or duplicate task ids, unknown agents, dependency cycles, zero parallelism and the like are
//! errors that point at the file, line, column and key. With no files at all, the built-in
//! defaults and the built-in agent `shell` still work.
//!
//! One idea per file: `settings` (what the files say), `values` (durations, sizes,
//! parallelism), `load` (`ConfigDir`: reading and checking a directory), `graph` (task graphs),
//! `locate` (where in a TOML file a problem is), `template` (agent command templates), `checks`
//! (the rules single values follow), `attempts` (best of N: a task run several times), `allow`
//! (checked-in settings that loosen confinement apply only as the user allowed them), `hosts`
//! (the hosts a proxied agent reaches), `spend` (spend caps and prices), `placements` (where
//! else tasks run, and how each kind is reached).

pub mod allow;
mod attempts;
mod checks;
pub mod credentials;
mod graph;
pub mod hosts;
mod load;
mod locate;
mod placements;
pub mod resources;
mod sandbox;
mod settings;
pub mod spend;
mod template;
mod values;

pub use allow::{ALLOW_COMMAND, AllowList, NetworkGrant, NotAllowed, SettingsFile};
pub use attempts::{AttemptsError, MAX_ATTEMPTS, RunTask, run_tasks};
pub use checks::{GIT_IDENTITY_VARIABLES, GIT_LOCATION_VARIABLES};
pub use graph::{
    GraphError, PlainGraphError, TaskSpec, validate_plain_task_graph, validate_task_graph,
};
pub use hosts::{HostList, HostPattern, Verdict};
pub use load::{AdHocTeamError, ConfigDir, LoadConfigError};
pub use placements::{PlacedTask, PlacementDef, PlacementKind, slurm_job_name};
pub use resources::{Cpus, Resources};
pub use sandbox::{AgentSandbox, Confined, Network, NetworkMode, SandboxMode, SandboxSettings};
pub use settings::{
    AgentDef, BaseMoved, IsolationFallback, IsolationSettings, LeaseSettings, LinkMode,
    MAX_STOP_GRACE, OnLimit, PlannedTask, ProjectConfig, Protocol, RetentionSettings, RunSettings,
    SteerMode, TaskDef, Team, TeamDef, WatchSettings, WorkspaceMode, WorktreeSettings,
};
pub use spend::{CostCap, DayLedger, Prices, UserConfig};
pub use template::{COMMAND_PLACEHOLDERS, RESUME_PLACEHOLDERS, fill_template, placeholders};
pub use values::{ByteSize, HumanDuration, Parallelism};

/// `config.toml`, relative to the crew directory.
pub const CONFIG_FILE: &str = "config.toml";
/// Agent definitions, relative to the crew directory.
pub const AGENTS_DIR: &str = "agents";
/// Team definitions, relative to the crew directory.
pub const TEAMS_DIR: &str = "teams";
/// The agent every crew knows without configuration: runs the prompt with `sh -c`.
pub const BUILTIN_SHELL_AGENT: &str = "shell";
