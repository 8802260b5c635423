//! `crew sandbox`

use camino::Utf8PathBuf;
use crew_core::config::{AgentDef, SandboxMode};
use serde::Serialize;

use crate::context::Context;
use crate::ui::{Style, Ui};
use crate::{CliError, Outcome};

#[derive(Debug, clap::Subcommand)]
// Built only when invoked, as the other subcommands are (see `commands::Command`).
#[command(defer = true)]
pub enum SandboxCommand {
    /// Say whether this machine confines agents (tried with a real process) and what each
    /// agent of this project may write.
    Check(CheckArgs),
    /// Allow this project's checked-in settings that loosen the sandbox, as they are now.
    Allow(AllowArgs),
}

/// Allow this project's checked-in settings that loosen the sandbox, as they are now.
///
/// A setting in `.crew/` may always narrow the sandbox; one that loosens it (`[sandbox] mode =
/// "off"` in config.toml or an agent definition, an agent's `[sandbox] write` paths) applies
/// only once you allowed that exact content of its file, on this machine. The record is kept
/// outside the repository (`$XDG_STATE_HOME/crew/allowed`, else `~/.local/state/crew/allowed`);
/// any change to the file — a teammate's commit, an agent's branch you merged — needs allowing
/// again. Read the files first: this prints what each loosens.
#[derive(Debug, clap::Args)]
pub struct AllowArgs {
    /// Only list what loosens the sandbox and whether it is allowed; allow nothing.
    #[arg(long)]
    pub list: bool,
}

/// Say whether this machine confines agents and what each agent may write.
///
/// An agent may write beneath its workspace, its private temp dir, its own git directory in a
/// worktree, and its definition's `[sandbox] write` paths; everything else is read-only to it.
/// What it reaches of the network is the narrower of its `[sandbox] network` and the project's:
/// `open`, `proxy` (the hosts every `allow_hosts` list that applies names, through crew's
/// proxy) or `none`.
#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    /// The agents to show (default: every agent of the project and `shell`).
    pub agents: Vec<String>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// `crew sandbox check --json`.
#[derive(Debug, Serialize)]
struct Report {
    /// The kernel's Landlock ABI version; null without Landlock.
    landlock_abi: Option<u32>,
    /// A confined process wrote inside its directory and was refused beside it.
    confines: bool,
    /// What holds tasks' caps (`[resources]`): `cgroup v1` or `cgroup v2`; null where no
    /// cgroup can be had (`caps_unavailable` says why).
    cgroup: Option<&'static str>,
    /// Why no cgroup can be had here, and what to do.
    #[serde(skip_serializing_if = "Option::is_none")]
    caps_unavailable: Option<String>,
    /// The project's `[sandbox] mode`.
    project_mode: SandboxMode,
    agents: Vec<AgentReport>,
    /// Where tasks may run besides here (`[placements.<name>]`): what each needs there.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    placements: Vec<PlacementReport>,
}

#[derive(Debug, Serialize)]
struct PlacementReport {
    name: String,
    kind: crew_core::config::PlacementKind,
    /// The program here that reaches it (`srun`, `ssh` …), and whether it is on the PATH.
    transport: String,
    transport_found: bool,
    /// What its machines need, and what confinement its agents get there.
    needs: String,
}

#[derive(Debug, Serialize)]
struct AgentReport {
    agent: String,
    /// `enforced`, `off` or `unsupported`.
    sandbox: crew_core::SandboxState,
    /// Besides the workspace and its private temp dir.
    write: Vec<PathReport>,
    /// What it reaches of the network: `open`, `proxy` or `none`.
    network: crew_core::config::NetworkMode,
    /// A setting names it; `false`: crew's default (`proxy`, no host without a list), which
    /// gives way to the open network where this kernel cannot give it.
    network_named: bool,
    /// Whether this machine can give it that (`none` and `proxy` need unprivileged user
    /// namespaces).
    network_enforced: bool,
    /// With `proxy`, each list of hosts that applies (a request must be in every one).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    allow_hosts: Vec<HostsReport>,
    /// The user's secret stores in the home that are not there for it (confined, with
    /// namespaces).
    hidden_secrets: Vec<Utf8PathBuf>,
    /// Confined, with namespaces: the directories it sees only in part (the home, every
    /// top-level one not the system's); empty where it reads what the user can.
    partial: Vec<Utf8PathBuf>,
    /// What it reads there besides its project, its workspace and its places: its
    /// definition's `read`, its toolchains, its `PATH`, its program.
    read: Vec<Utf8PathBuf>,
    /// The keys of its definition's credentials you have, `NAME for upstream`: held by
    /// reference behind crew's proxy (the agent gets stand-ins), by the agent itself otherwise.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    credentials: Vec<String>,
    /// Whether its credentials are held by reference (its network goes through crew's proxy).
    by_reference: bool,
}

#[derive(Debug, Serialize)]
struct HostsReport {
    /// Where the list is written.
    file: String,
    hosts: Vec<crew_core::config::HostPattern>,
}

#[derive(Debug, Serialize)]
struct PathReport {
    path: Utf8PathBuf,
    /// A path that does not exist when the agent starts is not granted.
    exists: bool,
}

pub async fn run(command: SandboxCommand, ui: Ui) -> Result<Outcome, CliError> {
    match command {
        SandboxCommand::Check(args) => cmd_sandbox_check(args, ui).await,
        SandboxCommand::Allow(args) => cmd_sandbox_allow(args, ui),
    }
}

fn cmd_sandbox_allow(args: AllowArgs, ui: Ui) -> Result<Outcome, CliError> {
    let ctx = Context::discover(ui)?;
    let Some(list) = crew_core::config::AllowList::of_user() else {
        return Err(CliError::user(
            "there is no home directory to keep what you allow in: set HOME (or XDG_STATE_HOME)",
        ));
    };
    let mut loosening = 0;
    for file in ctx.config_dir().settings_files()? {
        let unallowed = crew_core::config::AllowList::unallowed(Some(&list), &file);
        if file.loosens.is_empty() && unallowed.is_empty() {
            continue;
        }
        loosening += 1;
        let was = unallowed.is_empty();
        if !args.list && !was {
            list.allow_file(&file).map_err(CliError::internal)?;
        }
        if !ctx.ui.quiet {
            let keys = if was { &file.loosens } else { &unallowed };
            let state = match (was, args.list) {
                (true, _) => "allowed already",
                (false, true) => "NOT allowed",
                (false, false) => "allowed now",
            };
            say!("{}: {} — {state}", file.path, keys.join("; "));
        }
    }
    if loosening == 0 && !ctx.ui.quiet {
        say!("nothing in .crew/ loosens the sandbox: nothing to allow");
    }
    Ok(Outcome::Success)
}

pub async fn cmd_sandbox_check(args: CheckArgs, ui: Ui) -> Result<Outcome, CliError> {
    let ctx = Context::discover(ui)?;
    let config = ctx.config_dir();
    let names = if args.agents.is_empty() {
        let mut names = config.agent_names()?;
        if !names
            .iter()
            .any(|name| name == crew_core::config::BUILTIN_SHELL_AGENT)
        {
            names.push(crew_core::config::BUILTIN_SHELL_AGENT.to_owned());
        }
        names
    } else {
        args.agents.clone()
    };
    let definitions: Vec<AgentDef> = names
        .iter()
        .map(|name| config.load_agent(name))
        .collect::<Result<_, _>>()?;
    let probe = tokio::task::spawn_blocking(crew_live::sandbox::probe).await??;
    let home = std::env::var("HOME").ok().map(Utf8PathBuf::from);
    // Confined with namespaces of its own: the home and the other directories in part.
    let sees_in_part = |definition: &AgentDef| {
        ctx.config().sandbox.mode.and(definition.sandbox.mode) == SandboxMode::Enforce
            && probe.confines()
            && crew_live::sandbox::namespaces_work()
    };
    let network = |definition: &AgentDef| {
        crew_core::config::Network::named([
            ctx.config().sandbox.network,
            definition.sandbox.network,
        ])
    };
    let agents = definitions
        .iter()
        .map(|definition| AgentReport {
            agent: definition.name.clone(),
            sandbox: match (
                ctx.config().sandbox.mode.and(definition.sandbox.mode),
                probe.confines(),
            ) {
                (SandboxMode::Off, _) => crew_core::SandboxState::Off,
                (SandboxMode::Enforce, true) => crew_core::SandboxState::Enforced,
                (SandboxMode::Enforce, false) => crew_core::SandboxState::Unsupported,
            },
            network: network(definition).mode,
            network_named: network(definition).named,
            network_enforced: network(definition).mode == crew_core::config::NetworkMode::Open
                || crew_live::sandbox::namespaces_work(),
            allow_hosts: if network(definition).mode == crew_core::config::NetworkMode::Proxy {
                let project = ctx
                    .config()
                    .sandbox
                    .allow_hosts
                    .as_ref()
                    .map(|hosts| (".crew/config.toml".to_owned(), hosts.clone()));
                let own = definition.sandbox.allow_hosts.as_ref().map(|hosts| {
                    (
                        format!(".crew/agents/{}.toml", definition.name),
                        hosts.clone(),
                    )
                });
                project
                    .into_iter()
                    .chain(own)
                    .map(|(file, hosts)| HostsReport { file, hosts })
                    .collect()
            } else {
                Vec::new()
            },
            write: definition
                .sandbox
                .write_paths(home.as_deref())
                .into_iter()
                .map(|path| PathReport {
                    exists: std::fs::symlink_metadata(&path).is_ok(),
                    path,
                })
                .collect(),
            credentials: crew_live::agent::by_reference(
                definition,
                &crew_live::agent::env::BaseEnv::from_process(),
            ),
            by_reference: network(definition).mode == crew_core::config::NetworkMode::Proxy
                && crew_live::sandbox::namespaces_work()
                && ctx.config().sandbox.mode.and(definition.sandbox.mode) == SandboxMode::Enforce,
            partial: if sees_in_part(definition) {
                crew_live::sandbox::partial_directories(home.as_deref())
            } else {
                Vec::new()
            },
            read: match &home {
                Some(home) if sees_in_part(definition) => {
                    let words: Vec<&str> = definition.command.iter().map(String::as_str).collect();
                    let mut read = definition.sandbox.read_paths(Some(home));
                    read.extend(crew_live::agent::toolchains::reads(
                        home,
                        std::env::var("PATH").ok().as_deref(),
                        &words,
                    ));
                    read.extend(crew_live::agent::toolchains::named_homes(home, |name| {
                        std::env::var(name).ok()
                    }));
                    // What lies in part only (the system is there whole), none within another.
                    let partial = crew_live::sandbox::partial_directories(Some(home));
                    read.retain(|path| partial.iter().any(|dir| path.starts_with(dir)));
                    let all = read.clone();
                    read.retain(|path| {
                        !all.iter()
                            .any(|other| path.starts_with(other) && path != other)
                    });
                    read
                }
                _ => Vec::new(),
            },
            hidden_secrets: match (
                &home,
                ctx.config().sandbox.mode.and(definition.sandbox.mode),
            ) {
                (Some(home), SandboxMode::Enforce)
                    if probe.confines() && crew_live::sandbox::namespaces_work() =>
                {
                    crew_live::sandbox::secret_stores(
                        home,
                        &definition.sandbox.write_paths(Some(home)),
                    )
                    .into_iter()
                    .map(|hidden| hidden.path().to_owned())
                    .collect()
                }
                _ => Vec::new(),
            },
        })
        .collect();
    let placements = ctx
        .config()
        .placements
        .iter()
        .map(|(name, placement)| placement_report(name, placement))
        .collect();
    let cgroups = crew_live::caps::Cgroups::find();
    let report = Report {
        landlock_abi: probe.abi,
        cgroup: cgroups.as_ref().ok().map(|found| found.kind().as_str()),
        caps_unavailable: cgroups.err(),
        confines: probe.confines(),
        project_mode: ctx.config().sandbox.mode,
        agents,
        placements,
    };
    if args.json {
        say!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(Outcome::Success);
    }
    say!(no_newline: "{}", render(&ctx, &report));
    Ok(Outcome::Success)
}

fn render(ctx: &Context, report: &Report) -> String {
    let ui = &ctx.ui;
    let mut out = String::new();
    match (report.landlock_abi, report.confines) {
        (Some(abi), true) => out.push_str(&format!(
            "kernel: Landlock ABI {abi}: {}\n",
            ui.paint("agents are confined", Style::Good)
        )),
        (Some(abi), false) => out.push_str(&format!(
            "kernel: Landlock ABI {abi}, but {}\n",
            ui.paint(
                "a confined test process could write outside its directory",
                Style::Bad
            )
        )),
        (None, _) => out.push_str(&format!(
            "kernel: no Landlock: {}\n",
            ui.paint(
                "agents are NOT contained (crew's checks on git files and workspaces still hold)",
                Style::Bad
            )
        )),
    }
    match (report.cgroup, &report.caps_unavailable) {
        (Some(kind), _) => out.push_str(&format!(
            "caps: {} hold each task's [resources] (memory, CPUs, processes)\n",
            ui.paint(kind, Style::Good)
        )),
        (None, why) => out.push_str(&format!(
            "caps: {}: {}\n",
            ui.paint("no cgroup can be had", Style::Warn),
            why.as_deref().unwrap_or_default()
        )),
    }
    if report.project_mode == SandboxMode::Off {
        out.push_str(&format!(
            "project: {}\n",
            ui.paint("[sandbox] mode = \"off\" in .crew/config.toml", Style::Warn)
        ));
    }
    for agent in &report.agents {
        out.push_str(&format!("\nagent {} ({})\n", agent.agent, agent.sandbox));
        if agent.sandbox != crew_core::SandboxState::Enforced {
            out.push_str("  may write anywhere you can\n");
            continue;
        }
        out.push_str("  may write beneath:\n");
        out.push_str("    its workspace (a worktree, a temp or dedicated dir, or the project itself in single mode)\n");
        out.push_str("    its private temp dir (its TMPDIR)\n");
        out.push_str("    for a worktree: its own git directory (.git/worktrees/<id>/agent), none of the repository's objects or refs\n");
        for path in &agent.write {
            let note = if path.exists {
                String::new()
            } else {
                format!(
                    "  {}",
                    ui.paint("(missing: not granted until it exists)", Style::Warn)
                )
            };
            out.push_str(&format!("    {}{note}\n", path.path));
        }
        let granted: Vec<Utf8PathBuf> = agent.write.iter().map(|path| path.path.clone()).collect();
        let own_shared_memory = crew_live::sandbox::gets_own_shared_memory(&granted);
        let devices: Vec<String> = crew_live::sandbox::DEVICE_FILES
            .iter()
            .map(|device| match *device {
                crew_live::sandbox::SHARED_MEMORY if own_shared_memory => {
                    format!("{device} (its own, not yours)")
                }
                _ => (*device).to_owned(),
            })
            .collect();
        out.push_str(&format!("    {}\n", devices.join(", ")));
        out.push_str("  everything else is read-only to it\n");
        if !agent.partial.is_empty() {
            let shown: Vec<String> = agent.partial.iter().map(|path| tilde(path)).collect();
            out.push_str(&format!(
                "  reads the system, its project and its workspace; of {} only what it may reach:\n",
                shown.join(", ")
            ));
            for path in &agent.read {
                out.push_str(&format!("    {}\n", tilde(path)));
            }
            out.push_str("    (widen it with `[sandbox] read = [\"~/docs/\"]`)\n");
        }
        if !agent.hidden_secrets.is_empty() {
            let shown: Vec<String> = agent
                .hidden_secrets
                .iter()
                .map(|path| tilde(path))
                .collect();
            out.push_str(&format!(
                "  not there for it, your secret stores: {}\n",
                shown.join(", ")
            ));
        }
        out.push_str(
            "  it keeps no capability, and the kernel's keyrings are closed to it (what your login keeps there stays yours)\n",
        );
        if !agent.credentials.is_empty() {
            out.push_str(&if agent.by_reference {
                format!(
                    "  credentials, {} (it holds stand-ins; crew's proxy adds the real values): {}\n",
                    ui.paint("by reference", Style::Good),
                    agent.credentials.join(", ")
                )
            } else {
                let variables: Vec<&str> = agent
                    .credentials
                    .iter()
                    .filter_map(|held| held.split(' ').next())
                    .collect();
                format!(
                    "  credentials: {} (its network does not go through crew's proxy)\n",
                    ui.paint(
                        &format!("it holds {} itself", variables.join(", ")),
                        Style::Warn
                    )
                )
            });
        }
        match (agent.network, agent.network_enforced) {
            (crew_core::config::NetworkMode::Open, _) => out.push_str(
                "  network: open (set `[sandbox] network = \"proxy\"` with `allow_hosts`, or \"none\", to narrow it)\n",
            ),
            (crew_core::config::NetworkMode::Proxy, true) => {
                out.push_str(&format!(
                    "  network: {}{} (a network namespace of its own; only crew's proxy reaches out, to these hosts)\n",
                    ui.paint("proxy", Style::Good),
                    if agent.network_named { "" } else { ", crew's default: no setting names a mode" }
                ));
                if agent.allow_hosts.is_empty() {
                    out.push_str(&format!(
                        "    {}\n",
                        ui.paint(
                            "no host: no `allow_hosts` applies (add one to the agent's definition, or set `network = \"open\"` there for the machine's network)",
                            Style::Warn
                        )
                    ));
                }
                for list in &agent.allow_hosts {
                    let hosts: Vec<String> =
                        list.hosts.iter().map(ToString::to_string).collect();
                    out.push_str(&format!(
                        "    {}: {}\n",
                        list.file,
                        if hosts.is_empty() {
                            "(empty: no host)".to_owned()
                        } else {
                            hosts.join(", ")
                        }
                    ));
                }
                if agent.allow_hosts.len() > 1 {
                    out.push_str("    a request must be in every list\n");
                }
            }
            (crew_core::config::NetworkMode::Proxy, false) if !agent.network_named => out.push_str(&format!(
                "  network: {} (crew's default, proxy, needs unprivileged user namespaces, which this kernel refuses: its tasks run with the network open, said on each; name `network = \"proxy\"` in its definition to refuse them instead)\n",
                ui.paint("open", Style::Warn)
            )),
            (crew_core::config::NetworkMode::Proxy | crew_core::config::NetworkMode::None, false) => out.push_str(&format!(
                "  network: {}, {}\n",
                agent.network.as_str(),
                ui.paint(
                    "which this kernel cannot give (no unprivileged user namespaces): its tasks refuse to start",
                    Style::Bad
                )
            )),
            (crew_core::config::NetworkMode::None, true) => out.push_str(&format!(
                "  network: {} (a network namespace of its own: its own loopback, no host, none of your local servers)\n",
                ui.paint("none", Style::Good)
            )),
        }
    }
    for placement in &report.placements {
        let found = match placement.transport_found {
            true => ui.paint("found here", Style::Good),
            false => ui.paint("not found on this PATH", Style::Bad),
        };
        out.push_str(&format!(
            "\nplacement {} ({}): reached through `{}`, {found}\n  {}\n",
            placement.name,
            placement.kind.as_str(),
            placement.transport,
            placement.needs
        ));
    }
    out.push_str("\nwiden an agent's sandbox with `[sandbox] write = [\"~/.my-tool/\"]` in .crew/agents/<name>.toml\n");
    out
}

/// What a placement needs where its tasks run, and whether this machine has its transport.
fn placement_report(name: &str, placement: &crew_core::config::PlacementDef) -> PlacementReport {
    use crew_core::config::PlacementKind;
    let crew = placement.crew.as_deref().unwrap_or("crew");
    let (transport, needs) = match placement.kind {
        PlacementKind::Local => (
            "crew".to_owned(),
            format!(
                "its clones in {} on this machine; its agents are confined as here",
                placement.dir
            ),
        ),
        PlacementKind::Ssh => (
            "ssh".to_owned(),
            format!(
                "on {}: git, `{crew}` and each agent's program, its clones in {}; its agents are confined by the crew there, as its kernel allows (Landlock, user namespaces, cgroups for caps)",
                placement.host.as_deref().unwrap_or("its host"),
                placement.dir
            ),
        ),
        PlacementKind::Kubernetes => (
            format!("{crew}-kube-transport"),
            format!(
                "its image ({}): git, `{crew}` and each agent's program; caps are the container's limits, and its agents are confined by the crew in the pod as the node's kernel allows",
                placement.image.as_deref().unwrap_or("none named")
            ),
        ),
        PlacementKind::Slurm => (
            "srun".to_owned(),
            format!(
                "on its nodes{}: git, `{crew}` and each agent's program, its clones in {} (its work comes back over srun, not through a shared file system); caps are the job's (--mem, --cpus-per-task), and its agents are confined by the crew on the node as its kernel allows",
                placement
                    .partition
                    .as_deref()
                    .map(|partition| format!(" (partition {partition})"))
                    .unwrap_or_default(),
                placement.dir
            ),
        ),
    };
    let program = transport.clone();
    let transport_found = std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(&program).is_file()))
        || (placement.kind == PlacementKind::Local);
    PlacementReport {
        name: name.to_owned(),
        kind: placement.kind,
        transport,
        transport_found,
        needs,
    }
}

/// `path` with the home written `~`.
fn tilde(path: &camino::Utf8Path) -> String {
    let home = std::env::var("HOME").unwrap_or_default();
    match path.as_str().strip_prefix(home.as_str()) {
        Some(rest) if !home.is_empty() && (rest.is_empty() || rest.starts_with('/')) => {
            format!("~{rest}")
        }
        _ => path.to_string(),
    }
}
