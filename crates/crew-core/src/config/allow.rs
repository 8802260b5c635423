//! Settings from the repository loosen nothing the user has not allowed.
//!
//! `.crew/` is checked in: a teammate's commit, a task branch someone merged, or (in `single`
//! mode, before crew kept it read-only) an agent can change it. A setting there may always
//! narrow confinement; one that loosens it — `[sandbox] mode = "off"` in `config.toml` or in an
//! agent definition, an agent's `[sandbox] write` paths — applies only once the user allowed
//! that exact content of that file, as `direnv allow` treats an `.envrc`. What was allowed is
//! recorded outside the repository, beneath the user's state directory
//! (`$XDG_STATE_HOME/crew/allowed`, else `~/.local/state/crew/allowed`): one small file per
//! allowed settings file, named by a hash of its path and holding a hash of its content. Any
//! change to the file needs allowing again (`crew sandbox allow`); until then crew refuses to
//! start what it would loosen, naming the file, the keys and that command.
//!
//! The network is measured twice. `network = "open"` is a loosening like `mode = "off"`:
//! what a file that names no mode gets is crew's proxy with no host beyond the lists, so the
//! machine's network named in a checked-in file applies only once its content was allowed.
//! The lists of hosts are measured against the past: crew remembers, per file, the network it
//! last ran by (`network/` beside the records: its `[sandbox] network` and `allow_hosts`). A
//! file first seen is run as it is and remembered; one whose network reaches further than that
//! (a wider mode, a host added, its list removed) is refused until allowed; one that narrows
//! is remembered narrower, so widening it back needs allowing too.

use camino::{Utf8Path, Utf8PathBuf};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::hosts::HostPattern;
use super::sandbox::{Network, NetworkMode, SandboxMode};
use super::settings::{AgentDef, ProjectConfig};
use crate::fsutil::{FileError, read_nofollow, write_atomic};

/// The command that allows the loosening settings of a project.
pub const ALLOW_COMMAND: &str = "crew sandbox allow";

/// Where a user's allowed settings are recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowList {
    dir: Utf8PathBuf,
}

/// A settings file that loosens confinement with content the user has not allowed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{file} loosens the sandbox ({}), and this content of it was not allowed on this machine: read it, then run `{ALLOW_COMMAND}` (any change to it, a teammate's or an agent's, needs allowing again)",
    keys.join("; ")
)]
pub struct NotAllowed {
    /// The settings file.
    pub file: Utf8PathBuf,
    /// What in it loosens confinement, as written there.
    pub keys: Vec<String>,
}

impl AllowList {
    /// The current user's, from `XDG_STATE_HOME` or `HOME`; `None` without either (then
    /// nothing is allowed).
    pub fn of_user() -> Option<Self> {
        let state = crate::env_vars::user_state_dir(|name| std::env::var(name).ok())?;
        Some(AllowList::at(state.join("allowed")))
    }

    /// The list kept in `dir`.
    pub fn at(dir: impl Into<Utf8PathBuf>) -> Self {
        AllowList { dir: dir.into() }
    }

    fn record_of(&self, file: &Utf8Path) -> Utf8PathBuf {
        self.dir
            .join(hex(&Sha256::digest(file.as_str().as_bytes())))
    }

    /// Whether `content` of `file` (an absolute path) was allowed.
    pub fn allows(&self, file: &Utf8Path, content: &[u8]) -> bool {
        read_nofollow(&self.record_of(file)).is_ok_and(|record| {
            String::from_utf8_lossy(&record).lines().next() == Some(&hex(&Sha256::digest(content)))
        })
    }

    /// Records `content` of `file` as allowed.
    pub fn allow(&self, file: &Utf8Path, content: &[u8]) -> Result<(), FileError> {
        crate::fsutil::ensure_real_dir(&self.dir).or_else(|_| {
            std::fs::create_dir_all(&self.dir)
                .map_err(|source| FileError::CreateDir {
                    path: self.dir.clone(),
                    source,
                })
                .and_then(|()| crate::fsutil::ensure_real_dir(&self.dir))
        })?;
        let record = format!("{}\n{file}\n", hex(&Sha256::digest(content)));
        write_atomic(&self.record_of(file), record.as_bytes())
    }

    fn network_record_of(&self, file: &Utf8Path) -> Utf8PathBuf {
        self.dir
            .join("network")
            .join(hex(&Sha256::digest(file.as_str().as_bytes())))
    }

    /// The network crew last ran `file` by, or the user allowed it; `None`: never seen. A
    /// record that cannot be read as one counts as no network at all, so that everything in
    /// the file needs allowing.
    pub fn network_before(&self, file: &Utf8Path) -> Option<NetworkGrant> {
        let record = read_nofollow(&self.network_record_of(file)).ok()?;
        Some(serde_json::from_slice(&record).unwrap_or(NetworkGrant {
            mode: NetworkMode::None,
            allow_hosts: Some(Vec::new()),
        }))
    }

    fn record_network(&self, file: &Utf8Path, grant: &NetworkGrant) -> Result<(), FileError> {
        let record = self.network_record_of(file);
        let dir = record.parent().unwrap_or(&self.dir);
        for dir in [self.dir.as_path(), dir] {
            crate::fsutil::ensure_real_dir(dir).or_else(|_| {
                std::fs::create_dir_all(dir)
                    .map_err(|source| FileError::CreateDir {
                        path: dir.to_owned(),
                        source,
                    })
                    .and_then(|()| crate::fsutil::ensure_real_dir(dir))
            })?;
        }
        let json = serde_json::to_vec(grant).unwrap_or_default();
        write_atomic(&record, &json)
    }

    /// Allows `file` as it is now: its content, and the network it grants.
    pub fn allow_file(&self, file: &SettingsFile) -> Result<(), FileError> {
        if !file.loosens.is_empty() {
            self.allow(&file.path, file.content.as_bytes())?;
        }
        self.record_network(&file.path, &file.network)
    }

    /// What of `file` loosens confinement and was not allowed: its loosening keys unless its
    /// content was allowed, and how its network reaches further than before.
    pub fn unallowed(list: Option<&AllowList>, file: &SettingsFile) -> Vec<String> {
        let mut keys = if list.is_some_and(|list| list.allows(&file.path, file.content.as_bytes()))
        {
            Vec::new()
        } else {
            file.loosens.clone()
        };
        if let Some(before) = list.and_then(|list| list.network_before(&file.path)) {
            keys.extend(file.network.widening_over(&before));
        }
        keys
    }

    /// `Ok` when `file` loosens nothing, or only as the user allowed; then the network it
    /// grants is remembered as what crew runs it by (first seen, or narrowed).
    pub fn check(list: Option<&AllowList>, file: &SettingsFile) -> Result<(), NotAllowed> {
        let keys = AllowList::unallowed(list, file);
        if !keys.is_empty() {
            return Err(NotAllowed {
                file: file.path.clone(),
                keys,
            });
        }
        if let Some(list) = list
            && list.network_before(&file.path).as_ref() != Some(&file.network)
        {
            // Not remembered, the last record stays: it only narrows what is refused.
            let _ = list.record_network(&file.path, &file.network);
        }
        Ok(())
    }
}

/// A settings file of the project, as the rules on loosening see it.
#[derive(Debug, Clone, PartialEq)]
pub struct SettingsFile {
    /// Its absolute path.
    pub path: Utf8PathBuf,
    /// Its content.
    pub content: String,
    /// What in it loosens confinement whatever ran before (`mode = "off"`, `write`), as
    /// written there: allowed by the exact content.
    pub loosens: Vec<String>,
    /// What it grants of the network: measured against what crew last ran it by.
    pub network: NetworkGrant,
}

/// What one settings file says of the network: its `[sandbox] network` and `allow_hosts`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkGrant {
    /// Its mode (crew's default, `proxy`, when it names none).
    pub mode: NetworkMode,
    /// Its list; `None`: it has none, and other lists decide.
    pub allow_hosts: Option<Vec<HostPattern>>,
}

impl NetworkGrant {
    /// What of this reaches further than `before`, as written in the file.
    pub fn widening_over(&self, before: &NetworkGrant) -> Vec<String> {
        let mut keys = Vec::new();
        // Ordered from the widest to the narrowest; `open` is a loosening of its own, allowed
        // by the file's content.
        if self.mode < before.mode && self.mode != NetworkMode::Open {
            keys.push(format!(
                "[sandbox] network = \"{}\" (it was \"{}\")",
                self.mode.as_str(),
                before.mode.as_str()
            ));
        }
        match (&self.allow_hosts, &before.allow_hosts) {
            (None, Some(_)) => {
                keys.push("[sandbox] allow_hosts removed (it had a list)".to_owned())
            }
            (Some(now), Some(before)) => {
                let added: Vec<String> = now
                    .iter()
                    .filter(|host| !before.contains(host))
                    .map(|host| format!("\"{host}\""))
                    .collect();
                if !added.is_empty() {
                    keys.push(format!("[sandbox] allow_hosts adds {}", added.join(", ")));
                }
            }
            (_, None) => {}
        }
        keys
    }
}

/// The network a project's `config.toml` grants.
pub fn network_in_config(config: &ProjectConfig) -> NetworkGrant {
    NetworkGrant {
        mode: config.sandbox.network.unwrap_or(Network::DEFAULT),
        allow_hosts: config.sandbox.allow_hosts.clone(),
    }
}

/// The network an agent definition grants.
pub fn network_in_agent(definition: &AgentDef) -> NetworkGrant {
    NetworkGrant {
        mode: definition.sandbox.network.unwrap_or(Network::DEFAULT),
        allow_hosts: definition.sandbox.allow_hosts.clone(),
    }
}

/// What of a project's `config.toml` loosens confinement, as written there.
pub fn loosening_in_config(config: &ProjectConfig) -> Vec<String> {
    let mut keys = Vec::new();
    if config.sandbox.mode == SandboxMode::Off {
        keys.push("[sandbox] mode = \"off\"".to_owned());
    }
    keys.extend(open_network(config.sandbox.network));
    keys
}

/// `network = "open"`, as written, where a file names it: the machine's network.
fn open_network(mode: Option<NetworkMode>) -> Option<String> {
    (mode == Some(NetworkMode::Open)).then(|| "[sandbox] network = \"open\"".to_owned())
}

/// What of an agent definition loosens confinement, as written there.
pub fn loosening_in_agent(definition: &AgentDef) -> Vec<String> {
    let mut keys = Vec::new();
    if definition.sandbox.mode == SandboxMode::Off {
        keys.push("[sandbox] mode = \"off\"".to_owned());
    }
    keys.extend(open_network(definition.sandbox.network));
    for (key, entries) in [
        ("read", &definition.sandbox.read),
        ("write", &definition.sandbox.write),
    ] {
        if !entries.is_empty() {
            let quoted: Vec<String> = entries.iter().map(|entry| format!("\"{entry}\"")).collect();
            keys.push(format!("[sandbox] {key} = [{}]", quoted.join(", ")));
        }
    }
    // A credential sends a secret of the user's to its upstream.
    for credential in &definition.sandbox.credentials {
        // Each key as the user would want to see it: and where its value is read from.
        let keys_held: Vec<String> = credential
            .keys
            .iter()
            .map(|key| match key.file() {
                Some((file, json)) => format!("{} (or `{json}` of {file})", key.variable()),
                None => key.variable().to_owned(),
            })
            .collect();
        keys.push(format!(
            "[[sandbox.credentials]] \"{}\" sends {} to {}",
            credential.name,
            keys_held.join(", "),
            credential.upstream
        ));
    }
    keys
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, content: &str, loosens: &[&str], network: NetworkGrant) -> SettingsFile {
        SettingsFile {
            path: path.into(),
            content: content.to_owned(),
            loosens: loosens.iter().map(|key| (*key).to_owned()).collect(),
            network,
        }
    }

    fn grant(mode: NetworkMode, hosts: Option<&[&str]>) -> NetworkGrant {
        NetworkGrant {
            mode,
            allow_hosts: hosts.map(|hosts| {
                hosts
                    .iter()
                    .map(|host| HostPattern::parse(host).unwrap())
                    .collect()
            }),
        }
    }

    fn list() -> (tempfile::TempDir, AllowList) {
        let dir = tempfile::tempdir().unwrap();
        let list = AllowList::at(Utf8Path::from_path(dir.path()).unwrap().join("allowed"));
        (dir, list)
    }

    #[test]
    fn allowed_content_is_allowed_and_any_change_is_not() {
        let (_dir, list) = list();
        let open = || grant(NetworkMode::Open, None);
        let off = "[sandbox]\nmode = \"off\"\n";
        let key = ["[sandbox] mode = \"off\""];
        let config = file("/p/.crew/config.toml", off, &key, open());
        assert!(AllowList::check(Some(&list), &config).is_err());
        assert!(AllowList::check(None, &file("/p/.crew/config.toml", off, &[], open())).is_ok());
        list.allow_file(&config).unwrap();
        assert!(AllowList::check(Some(&list), &config).is_ok());
        let changed = file(
            "/p/.crew/config.toml",
            "[sandbox]\nmode = \"off\"\n# more\n",
            &key,
            open(),
        );
        assert!(AllowList::check(Some(&list), &changed).is_err());
        let elsewhere = file("/q/.crew/config.toml", off, &key, open());
        assert!(AllowList::check(Some(&list), &elsewhere).is_err());
    }

    #[test]
    fn a_network_is_remembered_as_first_run_and_reaching_further_needs_allowing() {
        let (_dir, list) = list();
        let at = |network| file("/p/.crew/agents/a.toml", "", &[], network);
        let listed = grant(NetworkMode::Proxy, Some(&["api.example.com"]));
        let none = grant(NetworkMode::None, Some(&["api.example.com"]));
        assert!(
            AllowList::check(Some(&list), &at(none.clone())).is_ok(),
            "first seen"
        );
        let wider = [
            (
                grant(NetworkMode::Proxy, Some(&["api.example.com"])),
                "network = \"proxy\" (it was \"none\")",
            ),
            (
                grant(
                    NetworkMode::Proxy,
                    Some(&["api.example.com", "evil.example"]),
                ),
                "allow_hosts adds \"evil.example\"",
            ),
            (grant(NetworkMode::Proxy, None), "allow_hosts removed"),
        ];
        for (network, key) in wider {
            let refused = AllowList::check(Some(&list), &at(network.clone())).unwrap_err();
            assert!(refused.to_string().contains(key), "{refused}");
            list.allow_file(&at(network)).unwrap();
            list.allow_file(&at(none.clone())).unwrap();
        }
        list.allow_file(&at(listed.clone())).unwrap();
        // Narrowed, it is remembered narrower: back to what it was needs allowing.
        assert!(AllowList::check(Some(&list), &at(grant(NetworkMode::None, Some(&[])))).is_ok());
        assert!(AllowList::check(Some(&list), &at(listed.clone())).is_err());
        list.allow_file(&at(listed.clone())).unwrap();
        assert!(AllowList::check(Some(&list), &at(listed)).is_ok());
    }

    #[test]
    fn the_open_network_named_in_a_checked_in_file_is_a_loosening_to_allow() {
        let parse = |text: &str| -> AgentDef {
            crate::config::load::parse_agent(Utf8Path::new("a.toml"), text, "a").unwrap()
        };
        let open = parse("command = [\"true\"]\n[sandbox]\nnetwork = \"open\"\n");
        assert_eq!(
            loosening_in_agent(&open),
            vec!["[sandbox] network = \"open\"".to_owned()]
        );
        for narrow in ["", "[sandbox]\nnetwork = \"proxy\"\n"] {
            let definition = parse(&format!("command = [\"true\"]\n{narrow}"));
            assert!(loosening_in_agent(&definition).is_empty(), "{narrow}");
            assert_eq!(network_in_agent(&definition).mode, NetworkMode::Proxy);
        }
    }

    #[test]
    fn a_credential_is_a_loosening_that_names_its_keys_their_login_file_and_its_upstream() {
        let definition = crate::config::load::parse_agent(
            Utf8Path::new("a.toml"),
            "command = [\"true\"]\n[[sandbox.credentials]]\nname = \"model\"\nupstream = \"https://api.example.com\"\nbase_url_env = \"MODEL_BASE_URL\"\nkeys = [\"MODEL_KEY\", { env = \"MODEL_TOKEN\", file = \"~/.model/login.json\", json = \"token\" }]\n",
            "a",
        )
        .unwrap();
        assert_eq!(
            loosening_in_agent(&definition),
            vec![
                "[[sandbox.credentials]] \"model\" sends MODEL_KEY, MODEL_TOKEN (or `token` of ~/.model/login.json) to https://api.example.com"
                    .to_owned()
            ]
        );
    }
}
