//! `crew agents list`

use serde::Serialize;

use crew_core::model::{ExitRecord, Timestamp};
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
    /// Print JSON (an array of agents; see the README for the schema).
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
    /// `running`, `stopping` or `exited` for a live agent; the task status otherwise.
    pub state: String,
    pub task_status: Option<String>,
    pub pid: Option<u32>,
    pub dir: Option<String>,
    pub started_at: Option<Timestamp>,
    pub question: Option<String>,
    pub exit: Option<ExitRecord>,
    pub last_line: Option<String>,
}

pub async fn cmd_agents_list(args: ListArgs, ui: crate::ui::Ui) -> Result<Outcome, CliError> {
    let ctx = Context::discover(ui)?;
    let rows = rows(&ctx, args.all_runs).await?;
    print(&ctx, &rows, args.json)?;
    Ok(Outcome::Success)
}

pub async fn rows(ctx: &Context, all_runs: bool) -> Result<Vec<AgentRow>, CliError> {
    let manifests = ctx.manifests()?;
    let live = ctx.published_agents_among(&manifests).await;
    let mut rows: Vec<AgentRow> = Vec::new();
    let mut statuses = std::collections::HashMap::new();
    for manifest in &manifests {
        for task in &manifest.tasks {
            statuses.insert(
                AgentId::new(manifest.run_id.clone(), task.id.clone()),
                (task.clone(), manifest.run_id.clone()),
            );
        }
    }
    for (agent, _) in &live {
        let task = statuses.get(&agent.agent_id).map(|(task, _)| task);
        rows.push(AgentRow {
            agent_id: agent.agent_id.clone(),
            run_id: agent.run_id.clone(),
            task_id: agent.task_id.clone(),
            agent: agent.agent.clone(),
            live: true,
            state: match agent.state {
                crew_live::AgentState::Running => "running",
                crew_live::AgentState::Stopping => "stopping",
                crew_live::AgentState::Exited => "exited",
            }
            .to_owned(),
            task_status: task.map(|task| task.status.to_string()),
            pid: agent.pid,
            dir: Some(agent.dir.to_string()),
            started_at: Some(agent.started_at),
            question: agent.question.clone(),
            exit: agent.exit.clone(),
            last_line: agent.last_lines.last().cloned(),
        });
    }
    if all_runs {
        let mut others: Vec<_> = statuses
            .into_iter()
            .filter(|(id, _)| !live.iter().any(|(agent, _)| &agent.agent_id == id))
            .collect();
        others.sort_by(|a, b| {
            b.0.run_id()
                .cmp(a.0.run_id())
                .then(a.0.task_id().cmp(b.0.task_id()))
        });
        for (agent_id, (task, run_id)) in others {
            rows.push(AgentRow {
                run_id,
                task_id: task.id.clone(),
                agent_id,
                agent: task.agent.clone(),
                live: false,
                state: task.status.to_string(),
                task_status: Some(task.status.to_string()),
                pid: None,
                dir: task
                    .workspace
                    .as_ref()
                    .map(|workspace| workspace.dir.to_string()),
                started_at: task.started_at,
                question: task.question.clone(),
                exit: task.exit.clone(),
                last_line: None,
            });
        }
    }
    Ok(rows)
}

#[allow(clippy::print_stdout)]
fn print(ctx: &Context, rows: &[AgentRow], json: bool) -> Result<(), CliError> {
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(rows).map_err(CliError::internal)?
        );
        return Ok(());
    }
    if rows.is_empty() {
        println!("no live agents in {}", ctx.workspace.id());
        return Ok(());
    }
    let mut table = Table::new(&["AGENT", "STATUS", "PID", "AGE", "CMD", "LAST"]);
    for row in rows {
        let status = row.task_status.as_deref().and_then(|status| {
            serde_json::from_value::<crew_core::model::TaskStatus>(serde_json::Value::String(
                status.into(),
            ))
            .ok()
        });
        let shown_status = match (&row.question, status) {
            (Some(_), _) => styled("waiting", Style::Warn),
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
        table.row(vec![
            cell(row.agent_id.to_string()),
            shown_status,
            cell(row.pid.map_or_else(|| "-".into(), |pid| pid.to_string())),
            cell(between(row.started_at, None).map_or_else(|| "-".into(), duration)),
            cell(row.agent.clone()),
            cell(truncate(&last, 60)),
        ]);
    }
    print!("{}", table.render(&ctx.ui));
    Ok(())
}
