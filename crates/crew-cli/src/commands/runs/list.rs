//! `crew runs list`

use std::collections::BTreeMap;

use serde::Serialize;

use crew_core::RunId;
use crew_core::model::{RunStatus, TaskStatus, Timestamp};

use crate::context::Context;
use crate::ui::{Style, Table, cell, run_style, sanitize, styled, truncate};
use crate::{CliError, Outcome};

/// List the runs of this workspace, newest first.
///
/// The newest 20 unless told otherwise: only the runs shown are read.
#[derive(Debug, clap::Args)]
pub struct ListArgs {
    /// Print JSON (an array of runs; see docs/commands.md for the schema).
    #[arg(long)]
    pub json: bool,
    /// Show the N newest runs.
    #[arg(long, value_name = "N", default_value_t = 20, conflicts_with = "all")]
    pub limit: usize,
    /// Show every run.
    #[arg(long)]
    pub all: bool,
}

/// One run as `crew runs list --json` prints it.
#[derive(Debug, Serialize)]
pub struct RunRow {
    pub run_id: RunId,
    /// `null` when the manifest could not be read; `error` says why.
    pub status: Option<RunStatus>,
    pub team: Option<String>,
    pub workspace_mode: Option<String>,
    pub created_at: Option<Timestamp>,
    pub finished_at: Option<Timestamp>,
    /// How many tasks are in each status.
    pub tasks: BTreeMap<String, usize>,
    /// How many tasks' checks ran and failed (a task whose check failed may have succeeded).
    #[serde(skip_serializing_if = "is_zero")]
    pub checks_failed: usize,
    /// When the first of its tasks a usage limit paused goes on (`null` when none is paused,
    /// or when none of their limits said when they lift).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub continues_at: Option<Timestamp>,
    pub host_pid: Option<u32>,
    pub host_alive: bool,
    pub error: Option<String>,
    /// The manifest was written by a newer crew: this one only reads it.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub newer_schema: bool,
}

pub async fn cmd_runs_list(args: ListArgs, ui: crate::ui::Ui) -> Result<Outcome, CliError> {
    let ctx = Context::discover(ui)?;
    ctx.reconcile()?;
    let limit = if args.all { usize::MAX } else { args.limit };
    let (listings, total) = ctx.store().list_newest_runs(limit)?;
    if !args.json {
        let shown: Vec<RunId> = listings
            .iter()
            .map(|listing| listing.run_id.clone())
            .collect();
        crate::commands::worktrees::warn_attention(&ctx, Some(&shown));
    }
    let shown = listings.len();
    let mut rows = Vec::new();
    for listing in listings {
        rows.push(match listing.manifest {
            Ok(manifest) => {
                let mut tasks = BTreeMap::new();
                for task in &manifest.tasks {
                    *tasks.entry(task.status.to_string()).or_insert(0) += 1;
                }
                RunRow {
                    run_id: listing.run_id,
                    status: Some(manifest.status),
                    team: manifest.team.clone(),
                    workspace_mode: Some(manifest.mode_label()),
                    created_at: Some(manifest.created_at),
                    finished_at: manifest.finished_at,
                    tasks,
                    checks_failed: manifest
                        .tasks
                        .iter()
                        .filter(|task| {
                            task.check.as_ref().and_then(|check| check.passed) == Some(false)
                        })
                        .count(),
                    continues_at: manifest
                        .tasks
                        .iter()
                        .filter(|task| task.status == TaskStatus::Paused)
                        .filter_map(|task| task.limit.as_ref()?.continues_at())
                        .min(),
                    host_pid: manifest.host.as_ref().map(|host| host.identity.pid),
                    host_alive: manifest
                        .host
                        .as_ref()
                        .is_some_and(|host| host.identity.is_alive()),
                    error: None,
                    newer_schema: manifest.schema_version
                        > crew_core::model::MANIFEST_SCHEMA_VERSION,
                }
            }
            Err(error) => RunRow {
                error: Some(
                    if ctx.project().never_written(&listing.run_id) {
                        format!(
                            "never written (its creation was interrupted): `crew runs clean {}` removes it",
                            listing.run_id
                        )
                    } else {
                        error.to_string()
                    },
                ),
                run_id: listing.run_id,
                status: None,
                team: None,
                workspace_mode: None,
                created_at: None,
                finished_at: None,
                tasks: BTreeMap::new(),
                checks_failed: 0,
                continues_at: None,
                host_pid: None,
                host_alive: false,
                newer_schema: matches!(error, crew_core::store::StateError::NewerSchema { .. }),
            },
        });
    }
    if args.json {
        say!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(Outcome::Success);
    }
    if rows.is_empty() {
        say!("no runs in {}", ctx.workspace().id());
        return Ok(Outcome::Success);
    }
    let mut table = Table::new(&["RUN", "STATUS", "TEAM", "MODE", "CREATED", "TASKS"]);
    for row in &rows {
        let status = match (row.status, row.newer_schema) {
            (Some(status), true) => styled(format!("{status} (newer crew)"), Style::Warn),
            (Some(status), false) => styled(status.as_str(), run_style(status)),
            (None, true) => styled("newer crew", Style::Warn),
            (None, false) => styled("unreadable", Style::Bad),
        };
        let tasks = match &row.error {
            Some(error) => truncate(&sanitize(error), 70),
            None => {
                let counts = row
                    .tasks
                    .iter()
                    .map(|(status, count)| format!("{count} {status}"))
                    .collect::<Vec<_>>()
                    .join(", ");
                let counts = match row.checks_failed {
                    0 => counts,
                    failed => format!("{counts}; {failed} check(s) failed"),
                };
                match (row.continues_at, row.tasks.contains_key("paused")) {
                    (Some(at), _) => format!("{counts} (goes on at {})", table_time(at)),
                    (None, true) => format!("{counts} (goes on when resumed)"),
                    (None, false) => counts,
                }
            }
        };
        table.row(vec![
            cell(row.run_id.to_string()),
            status,
            cell(row.team.clone().unwrap_or_else(|| "-".into())),
            cell(row.workspace_mode.clone().unwrap_or_else(|| "-".into())),
            cell(row.created_at.map_or_else(|| "-".into(), table_time)),
            cell(tasks),
        ]);
    }
    say!(no_newline: "{}", table.render(&ctx.ui));
    if shown < total {
        err!(
            "(the {shown} newest of {total} runs; `--all` lists every one, `--limit N` the N newest)"
        );
    }
    Ok(Outcome::Success)
}

fn is_zero(count: &usize) -> bool {
    *count == 0
}

/// A time as the table shows it: `2026-12-01 10:30:00` (UTC, to the second).
fn table_time(at: Timestamp) -> String {
    at.to_string()[..19].replace('T', " ")
}
