//! A project's `config.toml` and an agent definition parsed and checked: each problem
//! named with its file, its line and what to write instead.

use std::collections::BTreeMap;
use std::ops::Range;

use camino::Utf8Path;
use toml::Spanned;

use super::{AgentFile, LoadConfigError};
use crate::config::PlacementKind;
use crate::config::checks::{
    check_branch_prefix, check_env_name, check_name, check_relative_path, check_sandbox_path,
};
use crate::config::locate::{find_key_offset, invalid_at, parse_toml, several};
use crate::config::sandbox::{AgentSandbox, Confined};
use crate::config::settings::{AgentDef, MAX_STOP_GRACE, ProjectConfig, Protocol, SteerMode};
use crate::config::template::{
    COMMAND_PLACEHOLDERS, RESUME_PLACEHOLDERS, check_template, placeholders,
};
use crate::config::values::ByteSize;

pub(in crate::config) fn validate_project_config(
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
    let log = config.run.max_output_log;
    if log < ByteSize::MIN_LOG || log > ByteSize::MAX_LOG {
        invalid(
            "run.max_output_log",
            format!(
                "size {log} is out of range: it must be from {} to {}",
                ByteSize::MIN_LOG,
                ByteSize::MAX_LOG
            ),
        );
    }
    if let Err(message) = config.resources.check() {
        invalid("resources", message);
    }
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
            (PlacementKind::Local | PlacementKind::Ssh | PlacementKind::Slurm, Some(_)) => invalid(
                &format!("{key}.image"),
                "only a kubernetes placement runs an image".to_owned(),
            ),
            _ => {}
        }
        if placement.pod_template.is_some() && placement.kind != PlacementKind::Kubernetes {
            invalid(
                &format!("{key}.pod_template"),
                "only a kubernetes placement runs a pod".to_owned(),
            );
        }
        if placement.kind == PlacementKind::Slurm {
            if placement.host.is_some() {
                invalid(
                    &format!("{key}.host"),
                    "a slurm placement has no host: its jobs go where `srun` sends them (name a `partition`)".to_owned(),
                );
            }
            if !placement.ssh_args.is_empty() {
                invalid(
                    &format!("{key}.ssh_args"),
                    "a slurm placement uses no ssh: give `srun` options as `srun_args`".to_owned(),
                );
            }
            if placement.cpus == Some(0) {
                invalid(
                    &format!("{key}.cpus"),
                    "a job needs at least one CPU".to_owned(),
                );
            }
        } else {
            let slurm_only = [
                ("partition", placement.partition.is_some()),
                ("time_limit", placement.time_limit.is_some()),
                ("cpus", placement.cpus.is_some()),
                ("account", placement.account.is_some()),
                ("qos", placement.qos.is_some()),
                ("srun_args", !placement.srun_args.is_empty()),
            ];
            for (field, set) in slurm_only {
                if set {
                    invalid(
                        &format!("{key}.{field}"),
                        format!("`{field}` is a slurm placement's (kind = \"slurm\")"),
                    );
                }
            }
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
    if worktree.link_mode == crate::config::settings::LinkMode::Symlink {
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

pub(in crate::config) fn parse_agent(
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
    // What a credential reads from the user's environment (its keys, the gateway its requests
    // go to) is never written in the file: a checked-in definition would otherwise point the
    // user's key at a host of its choosing.
    let credential_variables: Vec<(String, String)> = file
        .sandbox
        .credentials
        .iter()
        .flat_map(|credential| {
            let credential = credential.get_ref();
            credential
                .keys
                .iter()
                .flat_map(|key| key.sources().map(str::to_owned))
                .chain(credential.base_url_env.clone())
                .map(|variable| (variable, credential.name.clone()))
                .collect::<Vec<_>>()
        })
        .collect();
    for (key, value) in file.env {
        if let Err(message) = check_env_entry(key.get_ref(), &value) {
            invalid(key.span(), "env", message);
        } else if let Some((_, credential)) = credential_variables
            .iter()
            .find(|(variable, _)| variable == key.get_ref())
        {
            invalid(
                key.span(),
                "env",
                format!(
                    "`{}` is read from your environment by the credential `{credential}`: it cannot be set in the definition (set it in your environment)",
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
        network: file.sandbox.network,
        allow_hosts: file.sandbox.allow_hosts,
        read: Vec::new(),
        write: Vec::new(),
        confined: Confined::default(),
        credentials: Vec::new(),
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
    for entry in file.sandbox.read {
        if let Err(message) = check_sandbox_path(entry.get_ref()) {
            invalid(entry.span(), "sandbox.read", message);
        }
        sandbox.read.push(entry.into_inner());
    }
    for entry in file.sandbox.write {
        if let Err(message) = check_sandbox_path(entry.get_ref()) {
            invalid(entry.span(), "sandbox.write", message);
        }
        sandbox.write.push(entry.into_inner());
    }
    for credential in file.sandbox.credentials {
        let span = credential.span();
        let credential = credential.into_inner();
        if let Err(message) = crate::config::credentials::check_credential(&credential) {
            invalid(span, "sandbox.credentials", message);
        } else if sandbox
            .credentials
            .iter()
            .any(|other| other.name == credential.name)
        {
            invalid(
                span,
                "sandbox.credentials",
                format!(
                    "two credentials are named `{}`: each names its own endpoint",
                    credential.name
                ),
            );
        }
        sandbox.credentials.push(credential);
    }
    if let Some(prices) = &file.prices
        && let Err(message) = prices.get_ref().check()
    {
        problems.push(invalid_at(
            path,
            source,
            prices.span(),
            Some("prices".to_owned()),
            message,
        ));
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
        prices: file.prices.map(Spanned::into_inner),
        builtin: false,
    })
}

/// One variable an agent definition sets: a name an agent may be given, a value without NUL.
pub(super) fn check_env_entry(name: &str, value: &str) -> Result<(), String> {
    check_env_name(name, false)?;
    if value.contains('\0') {
        return Err(format!(
            "the value of `{name}` holds a NUL byte, which no environment can carry"
        ));
    }
    Ok(())
}
