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

use camino::{Utf8Path, Utf8PathBuf};
use sha2::{Digest, Sha256};

use super::settings::{AgentDef, ProjectConfig, SandboxMode};
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

    /// `Ok` when `content` of `file` loosens nothing, or was allowed.
    pub fn check(
        list: Option<&AllowList>,
        file: &Utf8Path,
        content: &[u8],
        keys: Vec<String>,
    ) -> Result<(), NotAllowed> {
        if keys.is_empty() || list.is_some_and(|list| list.allows(file, content)) {
            return Ok(());
        }
        Err(NotAllowed {
            file: file.to_owned(),
            keys,
        })
    }
}

/// What of a project's `config.toml` loosens confinement, as written there.
pub fn loosening_in_config(config: &ProjectConfig) -> Vec<String> {
    match config.sandbox.mode {
        SandboxMode::Off => vec!["[sandbox] mode = \"off\"".to_owned()],
        SandboxMode::Enforce => Vec::new(),
    }
}

/// What of an agent definition loosens confinement, as written there.
pub fn loosening_in_agent(definition: &AgentDef) -> Vec<String> {
    let mut keys = Vec::new();
    if definition.sandbox.mode == SandboxMode::Off {
        keys.push("[sandbox] mode = \"off\"".to_owned());
    }
    if !definition.sandbox.write.is_empty() {
        keys.push(format!(
            "[sandbox] write = [{}]",
            definition
                .sandbox
                .write
                .iter()
                .map(|path| format!("\"{path}\""))
                .collect::<Vec<_>>()
                .join(", ")
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

    #[test]
    fn allowed_content_is_allowed_and_any_change_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let list = AllowList::at(Utf8Path::from_path(dir.path()).unwrap().join("allowed"));
        let file = Utf8Path::new("/p/.crew/config.toml");
        let keys = || vec!["[sandbox] mode = \"off\"".to_owned()];
        let content = b"[sandbox]\nmode = \"off\"\n";
        assert!(AllowList::check(Some(&list), file, content, keys()).is_err());
        assert!(AllowList::check(None, file, content, Vec::new()).is_ok());
        list.allow(file, content).unwrap();
        assert!(AllowList::check(Some(&list), file, content, keys()).is_ok());
        let changed = b"[sandbox]\nmode = \"off\"\n# more\n";
        assert!(AllowList::check(Some(&list), file, changed, keys()).is_err());
        let elsewhere = Utf8Path::new("/q/.crew/config.toml");
        assert!(AllowList::check(Some(&list), elsewhere, content, keys()).is_err());
    }
}
