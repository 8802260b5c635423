//! Reading a configuration directory: every file parsed and checked completely, every problem
//! reported with its file, line, column and key.

use std::collections::BTreeMap;
use std::ops::Range;

use camino::{Utf8Path, Utf8PathBuf};
use serde::Deserialize;
use toml::Spanned;

use crate::fsutil::{FileError, read_nofollow};

use super::allow::{
    AllowList, NotAllowed, SettingsFile, loosening_in_agent, loosening_in_config, network_in_agent,
    network_in_config,
};
use super::attempts::MAX_ATTEMPTS;
use super::checks::{
    check_branch_prefix, check_env_name, check_name, check_relative_path, check_sandbox_path,
};
use super::graph::{TaskSpec, validate_plain_task_graph, validate_task_graph};
use super::hosts::HostPattern;
use super::locate::{find_key_offset, invalid_at, parse_toml, parse_toml_checked, several};
use super::settings::{
    AgentDef, AgentSandbox, Confined, MAX_STOP_GRACE, NetworkMode, OnLimit, PlacementKind,
    PlannedTask, ProjectConfig, Protocol, SandboxMode, SteerMode, TaskDef, Team, TeamDef,
    WorkspaceMode,
};
use super::template::{COMMAND_PLACEHOLDERS, RESUME_PLACEHOLDERS, check_template, placeholders};
use super::values::{HumanDuration, Parallelism};
use super::{AGENTS_DIR, BUILTIN_SHELL_AGENT, CONFIG_FILE, TEAMS_DIR};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct AgentFile {
    description: Option<String>,
    command: Spanned<Vec<String>>,
    steer: Option<Spanned<SteerMode>>,
    #[serde(default)]
    protocol: Protocol,
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
pub(super) struct AgentSandboxFile {
    #[serde(default)]
    mode: SandboxMode,
    #[serde(default)]
    network: NetworkMode,
    #[serde(default)]
    allow_hosts: Option<Vec<HostPattern>>,
    #[serde(default)]
    write: Vec<Spanned<String>>,
    #[serde(default)]
    confined: ConfinedFile,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct ConfinedFile {
    #[serde(default)]
    args: Vec<Spanned<String>>,
    #[serde(default)]
    env: BTreeMap<Spanned<String>, String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TeamFile {
    description: Option<String>,
    workspace_mode: Option<WorkspaceMode>,
    max_parallel: Option<Parallelism>,
    fail_fast: Option<bool>,
    check: Option<Spanned<String>>,
    on_limit: Option<OnLimit>,
    placement: Option<String>,
    network: Option<NetworkMode>,
    tasks: Spanned<Vec<TaskFile>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TaskFile {
    id: Spanned<String>,
    agent: Spanned<String>,
    prompt: Spanned<String>,
    #[serde(default)]
    depends_on: Vec<Spanned<String>>,
    timeout: Option<HumanDuration>,
    workspace_mode: Option<WorkspaceMode>,
    attempts: Option<Spanned<u32>>,
    check: Option<Spanned<String>>,
    on_limit: Option<OnLimit>,
    placement: Option<String>,
    network: Option<NetworkMode>,
}

/// An ad hoc team that could not be made.
#[derive(Debug, thiserror::Error)]
pub enum AdHocTeamError {
    /// An agent of the team could not be loaded.
    #[error(transparent)]
    Agent(#[from] LoadConfigError),
    /// The task ids break a rule; the message says which.
    #[error("{0}")]
    Tasks(String),
}

/// A configuration file that could not be used.
#[derive(Debug, thiserror::Error)]
pub enum LoadConfigError {
    /// A file could not be read.
    #[error("failed to read {path}")]
    Read {
        /// The file.
        path: Utf8PathBuf,
        /// Why it could not be read.
        #[source]
        source: FileError,
    },
    /// A file is not UTF-8.
    #[error("{path}:{line}:{column}: not valid UTF-8 (byte 0x{byte:02x}): save the file as UTF-8")]
    NotUtf8 {
        /// The file.
        path: Utf8PathBuf,
        /// The line of the first byte that is not UTF-8, from 1.
        line: usize,
        /// Its column, in characters from 1.
        column: usize,
        /// That byte.
        byte: u8,
    },
    /// A value breaks a rule, located in its file.
    #[error("{}", render_invalid(path, *line, *column, key.as_deref(), message))]
    Invalid {
        /// The file.
        path: Utf8PathBuf,
        /// The line, from 1.
        line: usize,
        /// The column, from 1.
        column: usize,
        /// The key that holds the value, e.g. `tasks[0].agent`, when one is known.
        key: Option<String>,
        /// What is wrong.
        message: String,
    },
    /// Every problem of one file, in the order they appear.
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
    Several(Vec<LoadConfigError>),
    /// No team file has the name.
    #[error("unknown team `{name}`")]
    UnknownTeam {
        /// The name asked for.
        name: String,
        /// Where team files are.
        teams_dir: Utf8PathBuf,
        /// The teams there are.
        available: Vec<String>,
    },
    /// No agent file has the name, and no built-in agent either.
    #[error("unknown agent `{name}`")]
    UnknownAgent {
        /// The name asked for.
        name: String,
        /// Where agent files are.
        agents_dir: Utf8PathBuf,
        /// The agents there are.
        available: Vec<String>,
    },
    /// A team or agent name breaks the naming rule.
    #[error("invalid {kind} name `{name}`: {rule}")]
    InvalidName {
        /// `team`, `agent` or `placement`.
        kind: &'static str,
        /// The name given.
        name: String,
        /// The rule it breaks.
        rule: &'static str,
    },
    /// A configuration directory could not be listed.
    #[error("failed to list {dir}")]
    ListDir {
        /// The directory.
        dir: Utf8PathBuf,
        /// Why it could not be listed.
        #[source]
        source: std::io::Error,
    },
}

pub(super) fn render_invalid(
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
    /// The configuration in `dir` (a project's `.crew/`); nothing is read yet.
    pub fn new(dir: impl Into<Utf8PathBuf>) -> Self {
        ConfigDir { dir: dir.into() }
    }

    /// The directory.
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

    /// `config.toml` loosens no confinement, or only as the user allowed (see
    /// [`super::allow`]). A file that cannot be read or parsed is another error's to report.
    pub fn check_config_allowed(&self, list: Option<&AllowList>) -> Result<(), NotAllowed> {
        match self.config_settings_file() {
            Ok(Some(file)) => AllowList::check(list, &file),
            _ => Ok(()),
        }
    }

    /// The definition file of agent `name` loosens no confinement, or only as the user
    /// allowed. A built-in agent has no file and loosens nothing.
    pub fn check_agent_allowed(
        &self,
        name: &str,
        list: Option<&AllowList>,
    ) -> Result<(), NotAllowed> {
        if check_name("agent", name).is_err() {
            return Ok(());
        }
        match self.agent_settings_file(name) {
            Ok(Some(file)) => AllowList::check(list, &file),
            _ => Ok(()),
        }
    }

    fn config_settings_file(&self) -> Result<Option<SettingsFile>, LoadConfigError> {
        let path = self.dir.join(CONFIG_FILE);
        let Some(content) = read_optional(&path)? else {
            return Ok(None);
        };
        let config = parse_toml_checked(&path, &content, validate_project_config)?;
        Ok(Some(SettingsFile {
            loosens: loosening_in_config(&config),
            network: network_in_config(&config),
            path,
            content,
        }))
    }

    fn agent_settings_file(&self, name: &str) -> Result<Option<SettingsFile>, LoadConfigError> {
        let path = self.dir.join(AGENTS_DIR).join(format!("{name}.toml"));
        let Some(content) = read_optional(&path)? else {
            return Ok(None);
        };
        let definition = parse_agent(&path, &content, name)?;
        Ok(Some(SettingsFile {
            loosens: loosening_in_agent(&definition),
            network: network_in_agent(&definition),
            path,
            content,
        }))
    }

    /// Every settings file of the project that can loosen confinement (`config.toml`, the
    /// agent definitions), with what in it does: what `crew sandbox allow` allows.
    pub fn settings_files(&self) -> Result<Vec<SettingsFile>, LoadConfigError> {
        let mut found: Vec<SettingsFile> = self.config_settings_file()?.into_iter().collect();
        for name in list_toml_stems(&self.dir.join(AGENTS_DIR))? {
            found.extend(self.agent_settings_file(&name)?);
        }
        Ok(found)
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
                attempts: None,
                check: None,
                on_limit: None,
                placement: None,
                network: None,
            })
            .collect();
        Ok(Team {
            def: TeamDef {
                name: name.to_owned(),
                description: None,
                workspace_mode: None,
                max_parallel: None,
                fail_fast: None,
                check: None,
                on_limit: None,
                placement: None,
                network: None,
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
        problems.extend(
            attempts_problems(&file)
                .into_iter()
                .map(|(span, key, message)| invalid(span, key, message)),
        );
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
                attempts: task.attempts.map(Spanned::into_inner),
                check: task.check.map(Spanned::into_inner),
                on_limit: task.on_limit,
                placement: task.placement,
                network: task.network,
            })
            .collect();
        Ok(Team {
            def: TeamDef {
                name: name.to_owned(),
                description: file.description,
                workspace_mode: file.workspace_mode,
                max_parallel: file.max_parallel,
                fail_fast: file.fail_fast,
                check: file.check.map(Spanned::into_inner),
                on_limit: file.on_limit,
                placement: file.placement,
                network: file.network,
                tasks,
            },
            agents,
        })
    }
}

/// What a team file's `attempts` and `check` values break: a count out of range, a task
/// others build on run more than once (which attempt would they build on?), an empty check.
fn attempts_problems(file: &TeamFile) -> Vec<(Range<usize>, String, String)> {
    let mut problems = Vec::new();
    let tasks = file.tasks.get_ref();
    if let Some(check) = &file.check
        && check.get_ref().trim().is_empty()
    {
        problems.push((
            check.span(),
            "check".to_owned(),
            "an empty check command: give one (`check = \"cargo test\"`) or leave the key out"
                .to_owned(),
        ));
    }
    for (index, task) in tasks.iter().enumerate() {
        if let Some(check) = &task.check
            && check.get_ref().trim().is_empty()
        {
            problems.push((
                check.span(),
                format!("tasks[{index}].check"),
                "an empty check command: give one or leave the key out".to_owned(),
            ));
        }
        let Some(attempts) = &task.attempts else {
            continue;
        };
        let key = format!("tasks[{index}].attempts");
        let count = *attempts.get_ref();
        if !(1..=MAX_ATTEMPTS).contains(&count) {
            problems.push((
                attempts.span(),
                key,
                format!("attempts must be from 1 to {MAX_ATTEMPTS}, not {count}"),
            ));
            continue;
        }
        if count == 1 {
            continue;
        }
        let id = task.id.get_ref();
        if let Some(dependent) = tasks
            .iter()
            .find(|other| other.depends_on.iter().any(|dep| dep.get_ref() == id))
        {
            problems.push((
                attempts.span(),
                key,
                format!(
                    "task `{}` depends on `{id}`, which would run {count} attempts: crew cannot know which one it builds on; run `{id}` on its own, `crew pick` an attempt, then start `{}` from its branch (`crew run --base`)",
                    dependent.id.get_ref(),
                    dependent.id.get_ref()
                ),
            ));
        }
    }
    problems
}

pub(super) fn read_optional(path: &Utf8Path) -> Result<Option<String>, LoadConfigError> {
    match read_nofollow(path) {
        Ok(bytes) => String::from_utf8(bytes).map(Some).map_err(|error| {
            let valid = &error.as_bytes()[..error.utf8_error().valid_up_to()];
            let text = std::str::from_utf8(valid).expect("the prefix is valid UTF-8");
            let line_start = text.rfind('\n').map_or(0, |newline| newline + 1);
            LoadConfigError::NotUtf8 {
                path: path.to_owned(),
                line: text.matches('\n').count() + 1,
                column: text[line_start..].chars().count() + 1,
                byte: error.as_bytes()[valid.len()],
            }
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

pub(super) fn list_toml_stems(dir: &Utf8Path) -> Result<Vec<String>, LoadConfigError> {
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

pub(super) fn validate_project_config(
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
    let lease = &config.lease;
    let [low, high] = lease.port_range;
    if low < 1024 || low > high {
        invalid(
            "lease.port_range",
            format!(
                "[{low}, {high}] is not a range of ports to lease: write [first, last] with 1024 ≤ first ≤ last, such as [20000, 29999]"
            ),
        );
    } else if lease.ports > 64 || u32::from(lease.ports) * 4 > u32::from(high - low) + 1 {
        invalid(
            "lease.ports",
            format!(
                "{} ports for each task leave room for fewer than 4 tasks in [{low}, {high}]: lease at most 64 a task, and widen `port_range` for more",
                lease.ports
            ),
        );
    }
    for name in &lease.names {
        const CREWS: &[&str] = &[
            "PATH",
            "HOME",
            "TMPDIR",
            "COMPOSE_PROJECT_NAME",
            "XDG_RUNTIME_DIR",
        ];
        if let Err(problem) = check_env_name(name, false) {
            invalid("lease.names", problem);
        } else if CREWS.contains(&name.as_str()) {
            invalid(
                "lease.names",
                format!(
                    "`{name}` is set by crew for each agent: name a variable of your project's"
                ),
            );
        }
    }
    for (name, placement) in &config.placements {
        let key = format!("placements.{name}");
        if let Err(problem) = check_name("placement", name) {
            invalid(&key, problem.to_string());
        }
        if !(placement.dir.starts_with('/') || placement.dir.starts_with("~/")) {
            invalid(
                &format!("{key}.dir"),
                format!(
                    "`{}` must be an absolute path or start with `~/` (on the shim's machine)",
                    placement.dir
                ),
            );
        }
        match (placement.kind, &placement.host) {
            (PlacementKind::Ssh, None) => invalid(
                &key,
                "an ssh placement needs `host` (a name from your ssh configuration, or user@host)"
                    .to_owned(),
            ),
            (PlacementKind::Ssh, Some(host)) if host.is_empty() || host.starts_with('-') => {
                invalid(&format!("{key}.host"), format!("`{host}` is not a host"));
            }
            (PlacementKind::Local, Some(_)) => invalid(
                &format!("{key}.host"),
                "a local placement has no host (it runs on this machine)".to_owned(),
            ),
            (PlacementKind::Local, None) if !placement.ssh_args.is_empty() => invalid(
                &format!("{key}.ssh_args"),
                "a local placement uses no ssh".to_owned(),
            ),
            (PlacementKind::Kubernetes, Some(_)) => invalid(
                &format!("{key}.host"),
                "a kubernetes placement has no host: its Jobs go to the cluster your kubeconfig names"
                    .to_owned(),
            ),
            _ => {}
        }
        match (placement.kind, &placement.image) {
            (PlacementKind::Kubernetes, None) => invalid(
                &key,
                "a kubernetes placement needs `image`: one with git, crew and the agent's program"
                    .to_owned(),
            ),
            (PlacementKind::Local | PlacementKind::Ssh, Some(_)) => invalid(
                &format!("{key}.image"),
                "only a kubernetes placement runs an image".to_owned(),
            ),
            _ => {}
        }
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
    // A linked build directory is one directory for every worktree: tasks on different
    // branches would build into it at once.
    const BUILD_OUTPUTS: &[&str] = &["target", ".next", "dist", "build", ".venv", "__pycache__"];
    if worktree.link_mode == super::settings::LinkMode::Symlink {
        for entry in &worktree.link {
            if BUILD_OUTPUTS.contains(&entry.as_str()) {
                invalid(
                    "worktree.link",
                    format!(
                        "`{entry}` is build output: linked, every worktree would share the one in your checkout, and tasks on different branches would build into it at once; keep it per worktree with `keep_ignored = [\"{entry}\"]` (warm in recycled worktrees), or set `link_mode = \"copy\"`"
                    ),
                );
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

pub(super) fn parse_agent(
    path: &Utf8Path,
    source: &str,
    name: &str,
) -> Result<AgentDef, LoadConfigError> {
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
    // A stream-json agent takes its prompt, follow-ups and steering as JSON messages; a
    // `codex exec` agent reads nothing while it runs.
    let required = match file.protocol {
        Protocol::Lines => None,
        Protocol::ClaudeStreamJson => Some((
            SteerMode::StdinJson,
            "protocol = \"claude-stream-json\" steers with stream-json messages: leave `steer` out, or set it to \"stdin-json\"",
        )),
        Protocol::CodexJson => Some((
            SteerMode::None,
            "protocol = \"codex-json\" reads no input while the agent runs (follow-ups resume it): leave `steer` out, or set it to \"none\"",
        )),
        Protocol::Acp => Some((
            SteerMode::Protocol,
            "protocol = \"acp\" steers with the protocol's own prompts: leave `steer` out, or set it to \"protocol\"",
        )),
        Protocol::Shim => {
            let offset = find_key_offset(source, "protocol");
            invalid(
                offset..offset,
                "protocol",
                "\"shim\" is crew's own protocol with a placement, not an agent's: to run this agent elsewhere, give its task a `placement`".to_owned(),
            );
            None
        }
    };
    let steer = match (required, file.steer) {
        (None, steer) => steer.map_or_else(SteerMode::default, Spanned::into_inner),
        (Some((mode, _)), None) => mode,
        (Some((mode, why)), Some(steer)) => {
            if *steer.get_ref() != mode {
                invalid(steer.span(), "steer", why.to_owned());
            }
            mode
        }
    };
    let mut env = BTreeMap::new();
    for (key, value) in file.env {
        if let Err(message) = check_env_entry(key.get_ref(), &value) {
            invalid(key.span(), "env", message);
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
        network: file.sandbox.network,
        allow_hosts: file.sandbox.allow_hosts,
        write: Vec::new(),
        confined: Confined::default(),
    };
    for arg in file.sandbox.confined.args {
        if arg.get_ref().contains('\0') {
            invalid(
                arg.span(),
                "sandbox.confined.args",
                format!(
                    "argument {:?} holds a NUL byte, which no program argument can carry",
                    arg.get_ref()
                ),
            );
        } else if let Some(name) = placeholders(arg.get_ref()).next() {
            invalid(
                arg.span(),
                "sandbox.confined.args",
                format!(
                    "these arguments take no placeholders (`{{{name}}}`): they are the same at every start"
                ),
            );
        }
        sandbox.confined.args.push(arg.into_inner());
    }
    for (key, value) in file.sandbox.confined.env {
        if let Err(message) = check_env_entry(key.get_ref(), &value) {
            invalid(key.span(), "sandbox.confined.env", message);
        }
        sandbox.confined.env.insert(key.into_inner(), value);
    }
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
        steer,
        protocol: file.protocol,
        resume: file.resume.map(Spanned::into_inner),
        env,
        pass_env,
        sandbox,
        builtin: false,
    })
}

/// One variable an agent definition sets: a name an agent may be given, a value without NUL.
fn check_env_entry(name: &str, value: &str) -> Result<(), String> {
    check_env_name(name, false)?;
    if value.contains('\0') {
        return Err(format!(
            "the value of `{name}` holds a NUL byte, which no environment can carry"
        ));
    }
    Ok(())
}
