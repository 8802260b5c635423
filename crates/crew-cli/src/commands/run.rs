//! `crew run`

use std::collections::HashMap;

use crew_core::config::{
    AdHocTeamError, ConfigDir, NetworkMode, OnLimit, Parallelism, WorkspaceMode,
};
use crew_core::{RunId, Team};
use crew_live::RunSpec;

use crate::context::Context;
use crate::foreground::{DETACHED_HOST_LABEL, Detached, start_host};
use crate::summary::{SummaryFor, outcome, summary};
use crate::ui::Ui;
use crate::{CliError, Outcome};

/// Run a team of agents, each task in its own workspace.
///
/// `crew run TEAM` runs `.crew/teams/TEAM.toml`. Ad hoc: `crew run --agent NAME "prompt"` runs
/// one task; add `--fan-out N` to give the same prompt to N agents, or use repeated
/// `--task ID=PROMPT` for several tasks. Progress is printed as it happens, then a summary with
/// each task's branch and the commands to inspect or merge it.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// The team to run, or with --agent the prompt.
    pub target: Option<String>,
    /// Run this agent ad hoc (an agent of `.crew/agents/` or the built-in `shell`).
    #[arg(long)]
    pub agent: Option<String>,
    /// An ad hoc task `ID=PROMPT` for --agent; repeat for several tasks.
    #[arg(long = "task", value_name = "ID=PROMPT")]
    pub tasks: Vec<String>,
    /// Give the prompt to N agents at once (tasks `<agent>-1` … `<agent>-N`).
    #[arg(long, value_name = "N")]
    pub fan_out: Option<usize>,
    /// Where tasks work: single (the project root), worktree (a git worktree per task), temp or
    /// dedicated. Overrides the team file.
    #[arg(long, value_name = "MODE")]
    pub workspace_mode: Option<WorkspaceMode>,
    /// How many tasks run at once.
    #[arg(long, value_name = "N")]
    pub max_parallel: Option<usize>,
    /// The commit or ref worktree tasks start from (default: HEAD).
    #[arg(long, value_name = "REF")]
    pub base: Option<String>,
    /// Stop the other tasks as soon as one fails.
    #[arg(long, conflicts_with = "keep_going")]
    pub fail_fast: bool,
    /// Let the other tasks go on when one fails (only its dependents are skipped).
    #[arg(long)]
    pub keep_going: bool,
    /// Name the run: its id, so that branches read `crew/<name>-<task>` and agents
    /// `<name>:<task>`. Lowercase letters, digits and `-`; unique in the project.
    #[arg(long, value_name = "NAME", value_parser = parse_run_name)]
    pub name: Option<RunId>,
    /// Run each task N times, each attempt in its own worktree and branch (`<task>.1` …
    /// `<task>.N`); compare them with `crew compare`, keep one with `crew pick`.
    #[arg(long, value_name = "N")]
    pub attempts: Option<u32>,
    /// A command run (`sh -c`, confined like the agent) in each task's workspace once its
    /// agent finished; its exit says whether the result passes. Overrides the team's `check`.
    #[arg(long, value_name = "COMMAND")]
    pub check: Option<String>,
    /// What a task does when its agent hits a usage or rate limit: `fail` (the limit is named)
    /// or `pause` (its workspace is kept and its session goes on when the limit lifts).
    /// Overrides the team's `on_limit`.
    #[arg(long, value_name = "fail|pause", value_parser = parse_on_limit)]
    pub on_limit: Option<OnLimit>,
    /// Run every task on this placement (a `[placements.<name>]` of .crew/config.toml): in a
    /// clone the placement's shim keeps, its work coming back as its branch here.
    #[arg(long, value_name = "NAME")]
    pub placement: Option<String>,
    /// What every task's agent reaches of the network: `none`, `proxy` (the hosts of its
    /// `allow_hosts` only) or `open`. An agent gets the narrowest of this, the project's and its
    /// definition's; `open` here gives the machine's network to agents whose files name none.
    #[arg(long, value_name = "none|proxy|open", value_parser = NetworkMode::parse)]
    pub network: Option<NetworkMode>,
    /// Where the kernel cannot give an agent the narrower network it asks for (it refuses
    /// unprivileged user namespaces, or has no Landlock), run it with the network open — said
    /// on the task — instead of refusing it.
    #[arg(long)]
    pub allow_open_network: bool,
    /// The most memory every task's agent and all it starts may hold (`2GiB`, `512MiB`): the
    /// kernel stops it there. The narrowest of this, the project's, the team's and the task's
    /// `[resources]` applies.
    #[arg(long, value_name = "SIZE", value_parser = parse_memory)]
    pub memory: Option<crew_core::config::ByteSize>,
    /// How many CPUs' worth of time every task's agent may use (`1.5`).
    #[arg(long, value_name = "CPUS", value_parser = parse_cpus)]
    pub cpus: Option<crew_core::config::Cpus>,
    /// How many processes and threads every task's agent may have at once (`256`).
    #[arg(long, value_name = "COUNT")]
    pub processes: Option<u32>,
    /// Where no cgroup can be had, run a task that has caps without them — said on the task —
    /// instead of refusing it.
    #[arg(long)]
    pub allow_uncapped: bool,
    /// The most the run may spend, its tasks together, in US dollars (`5`, `0.50`): at it, each
    /// task pauses before its next turn and asks whether to go on. The narrowest of this, the
    /// team's and the project's `max_cost_usd` applies.
    #[arg(long, value_name = "USD", value_parser = parse_cost)]
    pub max_cost_usd: Option<crew_core::config::CostCap>,
    /// Print the run id at once and keep the run going in the background.
    #[arg(long)]
    pub detach: bool,
    /// Print the final run manifest as JSON instead of the summary.
    #[arg(long)]
    pub json: bool,
}

fn parse_on_limit(value: &str) -> Result<OnLimit, String> {
    match value {
        "fail" => Ok(OnLimit::Fail),
        "pause" => Ok(OnLimit::Pause),
        other => Err(format!("`{other}` is neither `fail` nor `pause`")),
    }
}

fn parse_run_name(value: &str) -> Result<RunId, String> {
    RunId::named(value).map_err(|error| error.to_string())
}

pub async fn cmd_run(args: RunArgs, ui: Ui) -> Result<Outcome, CliError> {
    let ctx = Context::discover(ui)?;
    let team = build_team(&args, &ctx.config_dir())?;
    if let Some(parallel) = args.max_parallel
        && !(1..=Parallelism::MAX).contains(&parallel)
    {
        return Err(CliError::user(format!(
            "--max-parallel must be from 1 to {}, not {parallel}",
            Parallelism::MAX
        )));
    }
    if args
        .check
        .as_deref()
        .is_some_and(|check| check.trim().is_empty())
    {
        return Err(CliError::user(
            "--check needs a command, such as --check \"cargo test\"",
        ));
    }
    ctx.reconcile()?;
    crate::commands::worktrees::warn_attention(&ctx, None);
    let spec = RunSpec {
        team,
        mode: args.workspace_mode,
        max_parallel: args.max_parallel,
        base: args.base.clone(),
        fail_fast: if args.fail_fast {
            Some(true)
        } else if args.keep_going {
            Some(false)
        } else {
            None
        },
        name: args.name.clone(),
        attempts: args.attempts,
        check: args.check.clone(),
        on_limit: args.on_limit,
        placement: args.placement.clone(),
        network: args.network,
        allow_open_network: args.allow_open_network,
        resources: crew_core::config::Resources {
            memory: args.memory,
            cpus: args.cpus,
            processes: args.processes,
        },
        allow_uncapped: args.allow_uncapped,
        max_cost_usd: args.max_cost_usd,
        placed_for: None,
    };
    if args.detach {
        return detach(&ctx, &spec).await;
    }
    let host = start_host(&ctx, "crew run").await?;
    let manifest = host.create(&spec).await?;
    if !ctx.ui.quiet && !args.json {
        print_header(&ctx, &manifest);
    }
    let manifest = crate::foreground::run_here(
        &ctx,
        &host,
        &manifest.run_id,
        HashMap::new(),
        !ctx.ui.quiet && !args.json,
    )
    .await?;
    print_result(&ctx, &manifest, args.json)?;
    check_base_moved(&ctx, &manifest)?;
    Ok(outcome(&manifest))
}

/// With `[run] base_moved = "fail"`, a run whose starting branch moved on ends in an error, so
/// that a script or CI does not take work made against an old base.
fn check_base_moved(ctx: &Context, manifest: &crew_core::RunManifest) -> Result<(), CliError> {
    if ctx.config().run.base_moved != crew_core::config::BaseMoved::Fail {
        return Ok(());
    }
    let Some((branch, moved)) = ctx.project().base_movement(manifest) else {
        return Ok(());
    };
    let how = if moved.diverged {
        "was rewritten".to_owned()
    } else {
        format!("gained {} commit(s)", moved.gained)
    };
    // The run made its branches: this is the run's failure, not a refused request.
    Err(CliError::failure(format!(
        "{branch} {how} while run {} went on ([run] base_moved = \"fail\")",
        manifest.run_id
    ))
    .with_hint(format!(
        "bring the task branches up to date (`git rebase {branch} <branch>`, listed above) before merging them"
    )))
}

fn print_header(ctx: &Context, manifest: &crew_core::RunManifest) {
    let placed = manifest
        .tasks
        .iter()
        .filter(|task| task.placement.is_some())
        .count();
    let elsewhere = match placed {
        0 => String::new(),
        placed if placed == manifest.tasks.len() => " (all on placements)".to_owned(),
        placed => format!(" ({placed} on placements)"),
    };
    // A team whose tasks use several modes says each with its count.
    let local: Vec<_> = manifest
        .tasks
        .iter()
        .filter(|task| task.placement.is_none())
        .map(|task| task.workspace_mode)
        .collect();
    let mut modes: Vec<(crew_core::config::WorkspaceMode, usize)> = Vec::new();
    for mode in &local {
        match modes.iter_mut().find(|(seen, _)| seen == mode) {
            Some((_, count)) => *count += 1,
            None => modes.push((*mode, 1)),
        }
    }
    let mode = match modes.as_slice() {
        [] | [_] => format!(
            "{} mode",
            modes
                .first()
                .map_or(manifest.workspace_mode, |(mode, _)| *mode)
        ),
        several => several
            .iter()
            .map(|(mode, count)| format!("{count} in {mode} mode"))
            .collect::<Vec<_>>()
            .join(", "),
    };
    out!(
        "crew: run {} — {} task(s){elsewhere}, {mode}, up to {} at once",
        manifest.run_id,
        manifest.tasks.len(),
        manifest.max_parallel
    );
    if let Some(reason) = &manifest.reason {
        out!("  {}", ctx.ui.paint(reason, crate::ui::Style::Warn));
    }
    if let Some(warning) = sandbox_warning(ctx) {
        out!("  {}", ctx.ui.paint(&warning, crate::ui::Style::Warn));
    }
}

/// Said once per run when agents will not be confined by the kernel.
pub fn sandbox_warning(ctx: &Context) -> Option<String> {
    if ctx.config().sandbox.mode == crew_core::config::SandboxMode::Off {
        return Some(
            "agents are NOT sandboxed: [sandbox] mode = \"off\" in .crew/config.toml; crew still checks git's files and workspaces after each task".to_owned(),
        );
    }
    crew_live::sandbox::kernel_abi().is_none().then(|| {
        "agents are NOT contained: this kernel has no Landlock, so an agent can write anywhere you can; crew still checks git's files and workspaces after each task".to_owned()
    })
}

pub fn print_result(
    ctx: &Context,
    manifest: &crew_core::RunManifest,
    json: bool,
) -> Result<(), CliError> {
    if json {
        out!("{}", serde_json::to_string_pretty(manifest)?);
    } else if !ctx.ui.quiet {
        out!(no_newline: "{}", summary(ctx, manifest, SummaryFor::RunEnd));
        looked_at(ctx, manifest);
    }
    Ok(())
}

/// Records that the user read the outcome of every finished task of `manifest` (its summary
/// went to their terminal): the board shows them as seen (`done`, not `done*`). A summary
/// read by a script is no one's look.
pub fn looked_at(ctx: &Context, manifest: &crew_core::RunManifest) {
    if !ctx.ui.terminal {
        return;
    }
    let finished: Vec<crew_core::TaskId> = manifest
        .tasks
        .iter()
        .filter(|task| task.status.is_finished())
        .map(|task| task.id.clone())
        .collect();
    // Not recorded, the board shows them as news: nothing worse.
    let _ = ctx.store().mark_seen(&manifest.run_id, &finished);
}

/// The team to run: a team file, or one built from `--agent`.
fn build_team(args: &RunArgs, config_dir: &ConfigDir) -> Result<Team, CliError> {
    let Some(agent_name) = &args.agent else {
        if !args.tasks.is_empty() || args.fan_out.is_some() {
            return Err(
                CliError::user("--task and --fan-out need --agent").with_hint(
                    "for example: crew run --agent shell --task a=\"echo a\" --task b=\"echo b\"",
                ),
            );
        }
        let Some(team) = &args.target else {
            let teams = config_dir.team_names()?;
            let hint = if teams.is_empty() {
                "`crew init` writes example teams; or run ad hoc: crew run --agent shell \"echo hello\"".to_owned()
            } else {
                format!("teams here: {}", teams.join(", "))
            };
            return Err(CliError::user(
                "which team? `crew run TEAM`, or `crew run --agent NAME \"prompt\"`",
            )
            .with_hint(hint));
        };
        return Ok(config_dir.load_team(team)?);
    };
    let mut tasks: Vec<(String, String)> = Vec::new();
    for task in &args.tasks {
        let Some((id, prompt)) = task.split_once('=') else {
            return Err(CliError::user(format!(
                "--task {task:?} is not of the form ID=PROMPT"
            )));
        };
        tasks.push((id.to_owned(), prompt.to_owned()));
    }
    if let Some(prompt) = &args.target {
        let copies = args.fan_out.unwrap_or(1);
        if copies == 0 {
            return Err(CliError::user("--fan-out must be at least 1"));
        }
        if copies == 1 && tasks.is_empty() {
            tasks.push((agent_name.clone(), prompt.clone()));
        } else {
            for index in 1..=copies {
                tasks.push((format!("{agent_name}-{index}"), prompt.clone()));
            }
        }
    }
    if tasks.is_empty() {
        return Err(CliError::user(format!(
            "what should {agent_name} do? Give a prompt: crew run --agent {agent_name} \"…\""
        )));
    }
    config_dir
        .ad_hoc_team(agent_name, tasks)
        .map_err(|error| match error {
            AdHocTeamError::Agent(error) => CliError::from(error),
            AdHocTeamError::Tasks(error) => CliError::user(format!("--task: {error}")),
        })
}

/// Creates the run here (so that a refusal reaches the user), then hands it to a background
/// host and prints its id as soon as that host has taken it.
async fn detach(ctx: &Context, spec: &RunSpec) -> Result<Outcome, CliError> {
    let host = start_host(ctx, DETACHED_HOST_LABEL).await?;
    let manifest = host.create_for_handover(spec).await?;
    drop(host);
    let run_id = manifest.run_id.clone();
    let pid = crate::foreground::host_detached(ctx, &run_id, Detached::Run, None).await?;
    out!("{run_id}");
    if !ctx.ui.quiet && ctx.ui.terminal {
        out!(
            "  running in the background (pid {pid}); follow it with `crew agents list` and `crew runs show {run_id}`"
        );
    }
    Ok(Outcome::Success)
}

/// `crew host RUN` (hidden): the background host of a detached run.
#[derive(Debug, clap::Args)]
pub struct HostArgs {
    pub run: RunId,
    /// Who handed the run over: `run` (`crew run --detach`) or `mcp` (`crew mcp`).
    #[arg(long, default_value = "run")]
    pub from: Detached,
    /// The run has ended: take it up again for this task (the board's `r`).
    #[arg(long)]
    pub resume: Option<crew_core::TaskId>,
}

pub async fn cmd_host(args: HostArgs, ui: Ui) -> Result<Outcome, CliError> {
    // A session of its own: no terminal, so neither Ctrl-C nor a closed terminal reaches it;
    // `crew runs cancel` knows it by its label and cancels it without --force.
    let _ = rustix::process::setsid();
    let ctx = Context::discover(ui)?;
    let host = start_host(&ctx, args.from.label()).await?;
    let resumes = match args.resume {
        Some(task) => {
            host.prepare_follow_up(&args.run, &task).await?;
            HashMap::from([(task, None)])
        }
        None => {
            host.take_over(&args.run).await?;
            HashMap::new()
        }
    };
    let manifest = crate::foreground::run_here(&ctx, &host, &args.run, resumes, true).await?;
    print_result(&ctx, &manifest, false)?;
    Ok(outcome(&manifest))
}

/// `--memory`: a size, as `[resources] memory` takes it.
fn parse_memory(text: &str) -> Result<crew_core::config::ByteSize, String> {
    let size: crew_core::config::ByteSize = text.parse()?;
    crew_core::config::Resources {
        memory: Some(size),
        ..Default::default()
    }
    .check()
    .map(|()| size)
}

/// `--max-cost-usd`: US dollars, as `max_cost_usd` takes them.
fn parse_cost(text: &str) -> Result<crew_core::config::CostCap, String> {
    let value: f64 =
        text.trim().trim_start_matches('$').parse().map_err(|_| {
            format!("`{text}` is not an amount: write it in US dollars, as 5 or 0.50")
        })?;
    crew_core::config::CostCap::new(value)
}

/// `--cpus`: a share of CPUs, as `[resources] cpus` takes it.
fn parse_cpus(text: &str) -> Result<crew_core::config::Cpus, String> {
    let value: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("`{text}` is not a number: write it as 1.5 (one and a half CPUs)"))?;
    crew_core::config::Cpus::parse(value)
}
