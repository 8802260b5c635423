//! What confines one process of an agent (its first, a restart, its check, an ACP terminal):
//! its sandbox ruleset and its private temp dir.

use std::os::unix::fs::DirBuilderExt as _;

use camino::{Utf8Path, Utf8PathBuf};
use crew_core::model::SandboxState;
use crew_sandbox::sandbox;
use crew_sandbox::temp_dirs::AgentTempDir;

use crate::agent::error::SpawnAgentError;
use crate::agent::spec::{AgentSpec, Launcher};
use crate::agent::toolchains;
use crate::agent::toolchains::ToolchainCaches;

/// The ruleset of one start of the agent (or of its check): the plan, narrowed by its
/// definition's mode, plus its definition's paths, its private temp dir and, confined, its
/// project's toolchain caches (returned with it, for its environment).
pub(super) fn confinement(
    spec: &AgentSpec,
    launcher: &Launcher,
    temp_path: Utf8PathBuf,
    own_connection: bool,
) -> Result<(sandbox::Prepared, Option<ToolchainCaches>), sandbox::BuildSandboxError> {
    let home = launcher
        .env
        .get("HOME")
        .and_then(|home| home.to_str())
        .map(Utf8Path::new);
    // A state directory the definition declares (`~/.claude/`) is made when missing, before
    // the sandbox: a first run in a fresh home keeps its state. One that cannot be made stays
    // missing, and the record says so.
    let mut unmade = Vec::new();
    for dir in spec.definition.sandbox.declared_dirs(home) {
        if std::fs::symlink_metadata(&dir).is_err()
            && let Err(error) = std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&dir)
        {
            unmade.push(format!("{dir} ({error})"));
        }
    }
    let mut extra_writes = spec.definition.sandbox.write_paths(home);
    extra_writes.push(temp_path);
    let mut plan = spec.sandbox.clone();
    plan.mode = plan.mode.and(spec.definition.sandbox.mode);
    // What it reads besides what it writes: where it works (a library's plan may name it
    // apart), its definition's, its tools'.
    plan.read.push(spec.dir.clone());
    if let Some(home) = home {
        plan.read
            .extend(spec.definition.sandbox.read_paths(Some(home)));
        let path_var = launcher.env.get("PATH").and_then(|path| path.to_str());
        // Its program, and crew, which it runs to ask and submit (put first on its `PATH`).
        let crew = std::env::current_exe()
            .ok()
            .and_then(|exe| Utf8PathBuf::from_path_buf(exe).ok());
        let programs: Vec<&str> = spec
            .definition
            .command
            .iter()
            .map(String::as_str)
            .chain(crew.as_deref().map(Utf8Path::as_str))
            .collect();
        plan.read
            .extend(toolchains::reads(home, path_var, &programs));
        plan.read.extend(toolchains::named_homes(home, |name| {
            launcher
                .env
                .get(name)
                .and_then(|value| value.to_str())
                .map(str::to_owned)
        }));
    }
    // Narrowed by its definition, where the plan is wider (a library's own plan).
    if let Some(network) = spec.definition.sandbox.network
        && network > plan.network
    {
        plan.network = network;
        plan.network_named = true;
    }
    if let Some(hosts) = &spec.definition.sandbox.allow_hosts {
        plan.hosts.push(crew_core::config::HostList {
            file: format!(".crew/agents/{}.toml", spec.definition.name),
            hosts: hosts.clone(),
        });
    }
    // Confined, its toolchains build with the project's caches, which it may write.
    let caches = (plan.mode == crew_core::config::SandboxMode::Enforce)
        .then(|| project_caches(spec, launcher))
        .flatten();
    if let Some(caches) = &caches {
        extra_writes.push(caches.dir.clone());
    }
    let own_socket = spec.socket.as_deref().filter(|_| own_connection);
    let mut prepared = sandbox::prepare(&plan, &extra_writes, own_socket)?;
    if prepared.record.state == SandboxState::Enforced {
        prepared.record.unmade = unmade;
    }
    let caches = caches.filter(|_| prepared.record.state == SandboxState::Enforced);
    Ok((prepared, caches))
}

/// The toolchain caches of the agent's project, made for this start (see `toolchains`).
fn project_caches(spec: &AgentSpec, launcher: &Launcher) -> Option<ToolchainCaches> {
    let var = |name: &str| {
        launcher
            .env
            .get(name)
            .and_then(|value| value.to_str())
            .map(str::to_owned)
    };
    let dir = toolchains::cache_dir(spec.workspace.as_path(), var)?;
    let home = Utf8PathBuf::from(var("HOME").filter(|home| home.starts_with('/'))?);
    let user_cargo = var("CARGO_HOME")
        .filter(|path| path.starts_with('/'))
        .map(Utf8PathBuf::from)
        .unwrap_or_else(|| home.join(".cargo"));
    toolchains::prepare(&dir, &home, &user_cargo)
}

/// A temp dir of the agent's own (mode 0700) in the host's temp directory: its `TMPDIR`, and
/// the one place outside its workspace the sandbox lets every agent write (see `temp_dirs`).
pub(super) fn private_temp_dir(spec: &AgentSpec) -> Result<AgentTempDir, SpawnAgentError> {
    AgentTempDir::new(
        &std::env::temp_dir(),
        &crew_core::safe_segment(spec.agent_id.task_id().as_str()),
    )
    .map_err(|source| SpawnAgentError::TempDir {
        agent_id: spec.agent_id.clone(),
        source,
    })
}
