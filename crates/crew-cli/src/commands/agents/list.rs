//! `crew agents list`

use serde::Serialize;

use crew_core::model::{ExitRecord, RunManifest, TaskRecord, Timestamp, Usage};
use crew_core::{AgentId, RunId, TaskId};

use crate::context::Context;
use crate::ui::{Style, Table, between, cell, duration, sanitize, styled, task_style, truncate};
use crate::{CliError, Outcome};

/// List the agents of this workspace.
///
/// Live agents by default: those of every run of this workspace whose host is alive. Agents of
/// other workspaces are never shown.
#[derive(Debug, clap::Args)]
pub struct ListArgs {
    /// Also show the tasks of finished and interrupted runs.
    #[arg(long)]
    pub all_runs: bool,
    /// Print JSON (an array of agents; see docs/commands.md for the schema).
    #[arg(long)]
    pub json: bool,
}

/// One agent as `crew agents list --json` prints it.
#[derive(Debug, Clone, Serialize)]
pub struct AgentRow {
    pub agent_id: AgentId,
    pub run_id: RunId,
    pub task_id: TaskId,
    /// The agent definition it runs.
    pub agent: String,
    /// A live host supervises it now.
    pub live: bool,
    /// `running`, `stopping`, `checking` (its task's check runs) or `exited` for a live
    /// agent; the task status otherwise.
    pub state: String,
    pub task_status: Option<String>,
    /// Whether its task's check passed, once it ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub check_passed: Option<bool>,
    pub pid: Option<u32>,
    pub dir: Option<String>,
    pub started_at: Option<Timestamp>,
    pub question: Option<String>,
    pub exit: Option<ExitRecord>,
    pub last_line: Option<String>,
    /// `enforced`, `off` or `unsupported`: whether the kernel confined it.
    pub sandbox: Option<crew_core::SandboxState>,
    /// The task whose agent submitted this one (a lead agent's sub-task), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<TaskId>,
    /// `working`, `waiting_for_input` or `idle`, for a live agent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub activity: Option<crew_live::agent::Activity>,
    /// Tokens and cost, when its agent's protocol reports them (for a live agent: its starts
    /// in its current host).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// With caps, what it holds now (memory in bytes, CPU time in milliseconds).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub using: Option<crew_live::control::registry::Using>,
    /// Other tasks (or the branch the run started from) its work would conflict with, once
    /// its branch is there (the conflict radar).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub overlaps: Vec<crew_core::model::TaskOverlap>,
    /// Its task's lease (`[lease]`: its ports and name), as its record holds it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease: Option<crew_core::model::LeaseRecord>,
}

pub async fn cmd_agents_list(args: ListArgs, ui: crate::ui::Ui) -> Result<Outcome, CliError> {
    // The hosts refuse an agent's listing; their published listings say the same. (What the
    // agent's sandbox lets it read is what holds a hostile one back.)
    if let Ok(agent) = std::env::var(crew_core::env_vars::CREW_AGENT_ID) {
        return Err(CliError::user(format!(
            "`crew agents list` runs inside agent {agent}: listing agents takes the user's own `crew`"
        ))
        .with_hint(
            "a lead agent reads the tasks it started through `crew mcp` (its `status` and `wait` tools)",
        ));
    }
    let ctx = Context::discover(ui)?;
    let (rows, unanswered) = rows(&ctx, args.all_runs, args.json).await?;
    print(&ctx, &rows, args.json)?;
    for host in unanswered {
        ctx.ui.warn(&format!(
            "a host did not answer, so its agents are not listed: {host}"
        ));
    }
    Ok(Outcome::Success)
}

/// The rows to list. Live agents come from their hosts' listings; task records are read from
/// the manifests only where they show: every run with `all_runs`, the runs of the listed agents
/// for JSON (`task_status`), and otherwise only the runs with an exited agent, whose status is
/// its task's.
pub async fn rows(
    ctx: &Context,
    all_runs: bool,
    json: bool,
) -> Result<(Vec<AgentRow>, Vec<String>), CliError> {
    rows_of(ctx, ctx.published_agents().await, all_runs, json)
}

/// [`rows`] of the live agents given (asked of their hosts rather than read from their
/// listings, for a caller that must see a change of a moment ago).
pub fn rows_of(
    ctx: &Context,
    published: crew_live::LiveAgents,
    all_runs: bool,
    json: bool,
) -> Result<(Vec<AgentRow>, Vec<String>), CliError> {
    let live = published.agents;
    let manifests: Vec<RunManifest> = if all_runs {
        ctx.manifests()?
    } else {
        let mut wanted: Vec<&RunId> = live
            .iter()
            .filter(|(agent, _)| json || agent.state == crew_live::AgentState::Exited)
            .map(|(agent, _)| &agent.run_id)
            .collect();
        wanted.sort();
        wanted.dedup();
        wanted
            .into_iter()
            .filter_map(|run_id| ctx.read_run(run_id).ok())
            .collect()
    };
    let task_of = |agent_id: &AgentId| {
        manifests
            .iter()
            .find(|manifest| &manifest.run_id == agent_id.run_id())
            .and_then(|manifest| {
                manifest
                    .tasks
                    .iter()
                    .find(|task| &task.id == agent_id.task_id())
            })
    };
    let mut rows: Vec<AgentRow> = Vec::new();
    for (agent, _) in &live {
        let task = task_of(&agent.agent_id);
        rows.push(AgentRow {
            agent_id: agent.agent_id.clone(),
            run_id: agent.run_id.clone(),
            task_id: agent.task_id.clone(),
            agent: agent.agent.clone(),
            live: true,
            state: match (agent.state, agent.activity) {
                (_, Some(crew_live::Activity::Checking)) => "checking",
                (crew_live::AgentState::Running, _) => "running",
                (crew_live::AgentState::Stopping, _) => "stopping",
                (crew_live::AgentState::Exited, _) => "exited",
            }
            .to_owned(),
            check_passed: task.and_then(check_passed),
            task_status: task.map(|task| task.status.to_string()),
            pid: agent.pid,
            dir: Some(agent.dir.to_string()),
            started_at: Some(agent.started_at),
            question: agent.question.clone(),
            exit: agent.exit.clone(),
            last_line: agent.last_lines.last().cloned(),
            parent: agent.parent.clone(),
            activity: agent.activity,
            usage: agent.usage,
            using: agent.using,
            overlaps: task.map(|task| task.overlaps.clone()).unwrap_or_default(),
            lease: task.and_then(|task| task.lease.clone()),
            sandbox: agent.sandbox.or_else(|| {
                task.and_then(|task| task.sandbox.as_ref())
                    .map(|sandbox| sandbox.state)
            }),
        });
    }
    if all_runs {
        let mut others: Vec<(&RunId, &TaskRecord)> = manifests
            .iter()
            .flat_map(|manifest| manifest.tasks.iter().map(|task| (&manifest.run_id, task)))
            .filter(|(run_id, task)| {
                !live
                    .iter()
                    .any(|(agent, _)| &agent.run_id == *run_id && agent.task_id == task.id)
            })
            .collect();
        others.sort_by(|a, b| b.0.cmp(a.0).then(a.1.id.cmp(&b.1.id)));
        for (run_id, task) in others {
            rows.push(AgentRow {
                agent_id: AgentId::new(run_id.clone(), task.id.clone()),
                run_id: run_id.clone(),
                task_id: task.id.clone(),
                agent: task.agent.clone(),
                live: false,
                state: task.status.to_string(),
                task_status: Some(task.status.to_string()),
                check_passed: check_passed(task),
                pid: None,
                dir: task
                    .workspace
                    .as_ref()
                    .map(|workspace| workspace.dir.to_string()),
                started_at: task.started_at,
                question: task.question.clone(),
                exit: task.exit.clone(),
                last_line: crew_live::agent::output::last_line_of(
                    &ctx.store().output_log_path(run_id, &task.id),
                ),
                sandbox: task.sandbox.as_ref().map(|sandbox| sandbox.state),
                parent: task.parent.clone(),
                activity: None,
                usage: task.usage,
                using: None,
                overlaps: task.overlaps.clone(),
                lease: task.lease.clone(),
            });
        }
    }
    Ok((rows, published.unanswered))
}

pub(crate) fn print(ctx: &Context, rows: &[AgentRow], json: bool) -> Result<(), CliError> {
    if json {
        say!("{}", serde_json::to_string_pretty(rows)?);
        return Ok(());
    }
    if rows.is_empty() {
        say!("no live agents in {}", ctx.workspace().id());
        return Ok(());
    }
    // The cost and conflict columns show only when an agent has something in them.
    let costs = rows.iter().any(|row| row.usage.is_some());
    let capped = rows.iter().any(|row| row.using.is_some());
    let conflicts = rows.iter().any(|row| !row.overlaps.is_empty());
    let headers: Vec<&str> = ["AGENT", "STATUS", "PID", "AGE", "CMD"]
        .into_iter()
        .chain(capped.then_some("MEM"))
        .chain(capped.then_some("CPU"))
        .chain(costs.then_some("COST"))
        .chain(conflicts.then_some("CONFLICTS"))
        .chain(["LAST"])
        .collect();
    let mut table = Table::new(&headers);
    for (row, depth) in family_order(rows) {
        let status = row.task_status.as_deref().and_then(|status| {
            serde_json::from_value::<crew_core::model::TaskStatus>(serde_json::Value::String(
                status.into(),
            ))
            .ok()
        });
        let shown_status = match (&row.question, status) {
            (Some(_), _) => styled("waiting", Style::Warn),
            // Its turn is over and it waits, alive, for a message.
            _ if row.activity == Some(crew_live::Activity::Idle) => styled("idle", Style::Warn),
            // A finished task whose check failed is not shown as a plain success.
            (None, Some(status))
                if (!row.live || row.state == "exited") && row.check_passed == Some(false) =>
            {
                styled(format!("{status}, check failed"), Style::Bad)
            }
            (None, Some(status)) if !row.live || row.state == "exited" => {
                styled(status.as_str(), task_style(status))
            }
            _ => styled(
                row.state.clone(),
                if row.state == "running" {
                    Style::Good
                } else {
                    Style::Warn
                },
            ),
        };
        let last = match (&row.question, &row.last_line) {
            (Some(question), _) => format!("asks: {}", sanitize(question)),
            (None, Some(line)) => sanitize(line),
            _ => String::new(),
        };
        table.row(
            vec![
                cell(crate::ui::nested(&row.agent_id.to_string(), depth)),
                shown_status,
                cell(row.pid.map_or_else(|| "-".into(), |pid| pid.to_string())),
                cell(between(row.started_at, None).map_or_else(|| "-".into(), duration)),
                cell(row.agent.clone()),
            ]
            .into_iter()
            .chain(capped.then(|| {
                cell(
                    row.using
                        .map_or_else(|| "-".into(), |using| format!("{} MiB", using.memory >> 20)),
                )
            }))
            .chain(capped.then(|| {
                cell(row.using.map_or_else(
                    || "-".into(),
                    |using| format!("{:.1}s", using.cpu_ms as f64 / 1000.0),
                ))
            }))
            .chain(costs.then(|| {
                cell(
                    row.usage
                        .and_then(|usage| usage.cost_usd)
                        .map_or_else(|| "-".into(), Usage::dollars),
                )
            }))
            .chain(conflicts.then(|| {
                let with: Vec<String> = row
                    .overlaps
                    .iter()
                    .map(|overlap| sanitize(&overlap.with))
                    .collect();
                cell(if with.is_empty() {
                    "-".to_owned()
                } else {
                    truncate(&with.join(", "), 30)
                })
            }))
            .chain([cell(truncate(&last, 60))])
            .collect(),
        );
    }
    say!(no_newline: "{}", table.render(&ctx.ui));
    Ok(())
}

/// The rows with each agent's sub-tasks right after it, and how deep each is.
fn family_order(rows: &[AgentRow]) -> Vec<(&AgentRow, usize)> {
    crew_core::model::family_order(
        rows,
        |row| (row.run_id.clone(), row.task_id.clone()),
        |row| Some((row.run_id.clone(), row.parent.clone()?)),
    )
}

/// Whether the task's check passed, once it ran.
fn check_passed(task: &TaskRecord) -> Option<bool> {
    task.check.as_ref().and_then(|check| check.passed)
}
