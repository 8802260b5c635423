//! Environment variables crew reads or sets, declared once.

/// Set for every agent: the run it belongs to.
pub const CREW_RUN_ID: &str = "CREW_RUN_ID";
/// Set (to `1`) for a task's check command, which otherwise gets its agent's variables.
pub const CREW_CHECK: &str = "CREW_CHECK";
/// Set for every agent: its task id.
pub const CREW_TASK_ID: &str = "CREW_TASK_ID";
/// Set for every agent: `<runId>:<taskId>`. Also the marker by which crew finds processes an
/// agent left behind.
pub const CREW_AGENT_ID: &str = "CREW_AGENT_ID";
/// Set for every agent: the directory it works in.
pub const CREW_WORKSPACE: &str = "CREW_WORKSPACE";
/// Set for every agent: the workspace (project root) its run belongs to.
pub const CREW_PROJECT_ROOT: &str = "CREW_PROJECT_ROOT";
/// Set for every agent: the control socket of its host, for `crew ask`.
pub const CREW_SOCKET: &str = "CREW_SOCKET";
/// Set (to `enforced`) for an agent, and for a check, that crew's sandbox confines: a program
/// it starts (a `crew` inside an agent, a tool with a sandbox of its own) knows it is
/// confined already.
pub const CREW_SANDBOX: &str = "CREW_SANDBOX";

/// Variables every agent receives from the user's environment, besides its `pass_env`.
/// A trailing `*` matches a prefix.
pub const ALWAYS_PASSED: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LC_*",
    "TERM",
    "TMPDIR",
    // Where the user's toolchains are, when not at their usual place in the home: the agent's
    // tools find them there (and it reads them, see `TOOLCHAIN_VARIABLES`).
    "RUSTUP_HOME",
    "NVM_DIR",
    "VOLTA_HOME",
    "PYENV_ROOT",
    "GOROOT",
    "SDKMAN_DIR",
    "BUN_INSTALL",
];

/// The variables that name where a toolchain is installed (a subset of [`ALWAYS_PASSED`]): a
/// confined agent reads what they name, as it reads the toolchains' usual homes.
pub const TOOLCHAIN_VARIABLES: &[&str] = &[
    "RUSTUP_HOME",
    "NVM_DIR",
    "VOLTA_HOME",
    "PYENV_ROOT",
    "GOROOT",
    "SDKMAN_DIR",
    "BUN_INSTALL",
];

/// Turns colored output off, whatever the terminal (<https://no-color.org>).
pub const NO_COLOR: &str = "NO_COLOR";
/// Log filter for crew's own diagnostics (`crew=debug`), as understood by `tracing`.
pub const CREW_LOG: &str = "CREW_LOG";
/// Set for an agent resumed with a follow-up: the message. Agents without a `resume` template
/// are restarted with their `command`, and find the message here.
pub const CREW_MESSAGE: &str = "CREW_MESSAGE";
/// Set for every agent: its private temp dir, the one place outside its workspace it may
/// always write.
pub const TMPDIR: &str = "TMPDIR";
/// Set for every agent to its private temp dir too: where programs keep their per-user
/// sockets and locks (pnpm's store locks), the user's own being out of an agent's reach.
pub const XDG_RUNTIME_DIR: &str = "XDG_RUNTIME_DIR";
/// Set for agents in `temp` and `dedicated` workspaces: the directory above the workspace, so
/// that git run there never climbs up into a repository around it (the project's own).
pub const GIT_CEILING_DIRECTORIES: &str = "GIT_CEILING_DIRECTORIES";

/// Where crew keeps what is the user's rather than a project's (what they allowed, the
/// projects' toolchain caches, leased ports): `$XDG_STATE_HOME/crew`, else
/// `~/.local/state/crew`, from the variables `env_var` gives; `None` without either.
pub fn user_state_dir(env_var: impl Fn(&str) -> Option<String>) -> Option<camino::Utf8PathBuf> {
    let state = env_var("XDG_STATE_HOME")
        .filter(|dir| dir.starts_with('/'))
        .map(camino::Utf8PathBuf::from)
        .or_else(|| {
            env_var("HOME")
                .filter(|home| home.starts_with('/'))
                .map(|home| camino::Utf8PathBuf::from(home).join(".local/state"))
        })?;
    Some(state.join("crew"))
}
