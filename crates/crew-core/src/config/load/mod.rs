//! Reading a configuration directory: every file parsed and checked completely, every problem
//! reported with its file, line, column and key.

use std::collections::BTreeMap;

use camino::{Utf8Path, Utf8PathBuf};
use serde::Deserialize;
use toml::Spanned;

use crate::fsutil::{FileError, read_nofollow};

use super::allow::{
    AllowList, NotAllowed, SettingsFile, loosening_in_agent, loosening_in_config, network_in_agent,
    network_in_config,
};
use super::checks::check_name;
use super::hosts::HostPattern;
use super::locate::parse_toml_checked;
use super::sandbox::{NetworkMode, SandboxMode};
use super::settings::{AgentDef, OnLimit, ProjectConfig, Protocol, SteerMode, WorkspaceMode};
use super::values::{HumanDuration, Parallelism};
use super::{AGENTS_DIR, BUILTIN_SHELL_AGENT, CONFIG_FILE};

mod parse;
mod teams;

pub(super) use parse::{parse_agent, validate_project_config};

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
    prices: Option<Spanned<super::Prices>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct AgentSandboxFile {
    #[serde(default)]
    mode: SandboxMode,
    #[serde(default)]
    network: Option<NetworkMode>,
    #[serde(default)]
    allow_hosts: Option<Vec<HostPattern>>,
    #[serde(default)]
    read: Vec<Spanned<String>>,
    #[serde(default)]
    write: Vec<Spanned<String>>,
    #[serde(default)]
    confined: ConfinedFile,
    #[serde(default)]
    credentials: Vec<Spanned<crate::config::credentials::Credential>>,
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
    resources: Option<Spanned<crate::config::Resources>>,
    max_cost_usd: Option<super::CostCap>,
    task_max_cost_usd: Option<super::CostCap>,
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
    resources: Option<Spanned<crate::config::Resources>>,
    max_cost_usd: Option<super::CostCap>,
}

/// An ad hoc team that could not be made.
#[derive(Debug, thiserror::Error)]
pub enum AdHocTeamError {
    /// An agent of the team could not be loaded.
    #[error(transparent)]
    Agent(#[from] LoadConfigError),
    /// The tasks' ids or dependencies break a rule: each problem says which.
    #[error(transparent)]
    Tasks(#[from] crate::config::graph::PlainGraphError),
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
