//! What the configuration says of the sandbox: whether the kernel confines agents
//! (`[sandbox]`, an agent's `[sandbox]`), what they may reach of the files and the network, and
//! how a project's settings and an agent's combine.

use std::collections::BTreeMap;

use camino::{Utf8Path, Utf8PathBuf};
use serde::{Deserialize, Serialize};

use super::hosts::HostPattern;

/// Whether the kernel confines an agent (ARCHITECTURE.md, "Agents are untrusted").
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

    /// The name written in files.
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxMode::Enforce => "enforce",
            SandboxMode::Off => "off",
        }
    }
}

/// `[sandbox]` of `config.toml`: the project's word on confining agents.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct SandboxSettings {
    /// `"off"` turns the sandbox off for every agent of the project.
    pub mode: SandboxMode,
    /// What the project's confined agents reach of the network: with an agent definition's
    /// and the command line's, one of the settings that name it (see [`Network::named`]);
    /// `None`: this file names none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkMode>,
    /// With `network = "proxy"` (here or in an agent's definition), the hosts every agent of
    /// the project may reach at most (see [`super::hosts`]); unset, the definitions decide.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow_hosts: Option<Vec<HostPattern>>,
}

/// What a confined agent reaches of the network (`[sandbox] network`).
///
/// Ordered from the widest to the narrowest.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum NetworkMode {
    /// The machine's network, as any program of the user (agents call their model's API).
    #[default]
    Open,
    /// The hosts of `allow_hosts` only, through a proxy crew runs for the agent (HTTP
    /// `CONNECT` and plain HTTP): the agent's own network namespace holds nothing but its
    /// loopback and the proxy's port, so a program that ignores the proxy variables reaches
    /// nothing.
    Proxy,
    /// No network at all: an empty network namespace of its own, with a loopback of its own
    /// — no TCP, UDP or raw socket reaches a host, the user's local servers included, and no
    /// abstract unix socket outside its sandbox.
    None,
}

impl NetworkMode {
    /// The mode when two settings apply (the project's and an agent's): the narrower.
    pub fn and(self, other: NetworkMode) -> NetworkMode {
        self.max(other)
    }

    /// The name written in files.
    pub fn as_str(self) -> &'static str {
        match self {
            NetworkMode::Open => "open",
            NetworkMode::Proxy => "proxy",
            NetworkMode::None => "none",
        }
    }

    /// Parses the name written in files and on the command line.
    pub fn parse(name: &str) -> Result<NetworkMode, String> {
        match name {
            "open" => Ok(NetworkMode::Open),
            "proxy" => Ok(NetworkMode::Proxy),
            "none" => Ok(NetworkMode::None),
            _ => Err(format!(
                "`{name}` is not a network mode: write \"none\", \"proxy\" or \"open\""
            )),
        }
    }

    /// Whether this is the default (`open`), left out of records.
    pub fn is_open(&self) -> bool {
        *self == NetworkMode::Open
    }
}

/// What an agent reaches of the network, and whether a setting named it.
///
/// The settings that may name a mode are the agent's definition, the project's `config.toml`
/// (both checked in: `open` there applies once the user allowed it, see [`super::allow`]) and
/// the command line (`crew run --network`): the narrowest named applies. Where none names one
/// the agent gets `proxy` — the hosts the lists that apply name, none without a list — never
/// the machine's network (DESIGN §8a). A team, a task and an agent that submitted the task
/// then only narrow it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Network {
    /// The mode the agent gets.
    pub mode: NetworkMode,
    /// A setting named it, or narrowed it: where the kernel cannot give it, the start is
    /// refused. Unnamed, crew's default gives way to the open network where the kernel cannot
    /// give it, and says so on the task.
    pub named: bool,
}

impl Network {
    /// The mode crew gives an agent whose settings name none.
    pub const DEFAULT: NetworkMode = NetworkMode::Proxy;

    /// The narrowest of the modes `settings` name; [`Network::DEFAULT`] where none does.
    pub fn named(settings: impl IntoIterator<Item = Option<NetworkMode>>) -> Network {
        match settings.into_iter().flatten().max() {
            Some(mode) => Network { mode, named: true },
            None => Network {
                mode: Network::DEFAULT,
                named: false,
            },
        }
    }

    /// This narrowed to `cap` (a team's, a task's, a submitter's); `None`: no cap.
    pub fn narrowed(self, cap: Option<NetworkMode>) -> Network {
        match cap {
            Some(cap) if cap > self.mode => Network {
                mode: cap,
                named: true,
            },
            _ => self,
        }
    }
}

/// `[sandbox]` of an agent definition: what its program needs to write besides its workspace
/// and its private temp dir.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AgentSandbox {
    /// `"off"` turns the sandbox off for this agent.
    pub mode: SandboxMode,
    /// `"none"`: this agent reaches no network; `"proxy"`: the hosts of `allow_hosts` only
    /// (see [`NetworkMode`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkMode>,
    /// The hosts its program needs (its vendor's API), for `network = "proxy"`; `None`: the
    /// definition names none, and other lists decide.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_hosts: Option<Vec<HostPattern>>,
    /// Absolute paths, or paths beneath the home directory written `~/…`, that the agent may
    /// read beneath besides its workspace, the system and the toolchains: the rest of the
    /// home is not there for it (what it may write it may read too). `~` is expanded with
    /// the `HOME` the agent sees.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub read: Vec<String>,
    /// Absolute paths, or paths beneath the home directory written `~/…`, that the agent may
    /// write beneath. `~` is expanded with the `HOME` the agent sees.
    pub write: Vec<String>,
    /// What the program is given when crew's sandbox confines it: the way its own sandbox and
    /// permission prompts stand down, crew's sandbox being the boundary.
    #[serde(default, skip_serializing_if = "Confined::is_empty")]
    pub confined: Confined,
    /// The secrets its program needs, used by reference (see [`super::credentials`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub credentials: Vec<super::credentials::Credential>,
}

/// `[sandbox.confined]` of an agent definition: arguments added after its command (and its
/// resume) and variables set for it, only when crew's sandbox confines it. A program whose own
/// sandbox cannot start inside crew's, or that asks before each command it runs, is told here
/// in its own documented way that it runs sandboxed from outside.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Confined {
    /// Arguments appended to the filled `command` and `resume` templates.
    pub args: Vec<String>,
    /// Variables set for the agent, over its definition's `env`.
    pub env: BTreeMap<String, String>,
}

impl Confined {
    /// Whether the definition says nothing for a confined start.
    pub fn is_empty(&self) -> bool {
        self.args.is_empty() && self.env.is_empty()
    }

    /// The record of what was given, for the task's sandbox record: the arguments, then each
    /// variable as `NAME=value`.
    pub fn given(&self) -> Vec<String> {
        self.args
            .iter()
            .cloned()
            .chain(
                self.env
                    .iter()
                    .map(|(name, value)| format!("{name}={value}")),
            )
            .collect()
    }
}

impl AgentSandbox {
    /// The `write` entries as absolute paths, `~` expanded with `home`; entries beneath a
    /// missing home are left out.
    pub fn write_paths(&self, home: Option<&Utf8Path>) -> Vec<Utf8PathBuf> {
        self.write
            .iter()
            .filter_map(|entry| expand(entry, home))
            .collect()
    }

    /// The `read` entries as absolute paths, expanded as [`AgentSandbox::write_paths`].
    pub fn read_paths(&self, home: Option<&Utf8Path>) -> Vec<Utf8PathBuf> {
        self.read
            .iter()
            .filter_map(|entry| expand(entry, home))
            .collect()
    }

    /// The `write` entries beneath the home that end in `/` (`~/.claude/`): directories the
    /// agent keeps its state in, which crew makes when they are missing (a first run in a fresh
    /// home), so that they can be granted. Only beneath the home: a definition is no way to
    /// make directories elsewhere on the machine. Expanded as [`AgentSandbox::write_paths`].
    pub fn declared_dirs(&self, home: Option<&Utf8Path>) -> Vec<Utf8PathBuf> {
        self.write
            .iter()
            .filter(|entry| entry.starts_with("~/") && entry.len() > 2 && entry.ends_with('/'))
            .filter_map(|entry| expand(entry, home))
            .collect()
    }
}

/// A `write` entry as an absolute path (a trailing `/` dropped), `~` expanded with `home`.
fn expand(entry: &str, home: Option<&Utf8Path>) -> Option<Utf8PathBuf> {
    let path = match entry.strip_prefix('~') {
        Some(rest) => home?.join(rest.trim_start_matches('/')),
        None => Utf8PathBuf::from(entry),
    };
    Some(match path.as_str().strip_suffix('/') {
        Some(trimmed) if !trimmed.is_empty() => Utf8PathBuf::from(trimmed),
        _ => path,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_directories_beneath_the_home_are_made_and_a_trailing_slash_is_dropped() {
        let sandbox = AgentSandbox {
            mode: SandboxMode::Enforce,
            network: Default::default(),
            allow_hosts: None,
            read: Vec::new(),
            write: ["~/.state/", "~/.file", "/etc/cron.d/", "~/", "/var/cache/x"]
                .map(str::to_owned)
                .to_vec(),
            confined: Confined::default(),
            credentials: Vec::new(),
        };
        let home = Utf8Path::new("/home/me");
        assert_eq!(
            sandbox.declared_dirs(Some(home)),
            [Utf8PathBuf::from("/home/me/.state")]
        );
        assert_eq!(
            sandbox.write_paths(Some(home)),
            [
                "/home/me/.state",
                "/home/me/.file",
                "/etc/cron.d",
                "/home/me",
                "/var/cache/x"
            ]
            .map(Utf8PathBuf::from)
        );
        assert!(sandbox.declared_dirs(None).is_empty());
    }
}
