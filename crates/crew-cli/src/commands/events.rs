//! `crew events`

use std::io::Write as _;

use crew_core::model::{EventKind, RunEvent};

use crate::context::Context;
use crate::ui::{Ui, sanitize};
use crate::{CliError, Outcome};

/// What happened in a run, in order (`--follow` as it happens, `--json` for scripts).
///
/// Its status, each task's status changes (with the reason), cancel requests and messages.
/// Without --run, the newest run of this workspace. With --follow, new events are printed as
/// they are recorded until the run ends.
#[derive(Debug, clap::Args)]
pub struct EventsArgs {
    /// The run id, or a unique prefix of it.
    #[arg(long)]
    pub run: Option<String>,
    /// Keep printing events as they come, until the run ends.
    #[arg(long, short)]
    pub follow: bool,
    /// One JSON object a line: the recorded event, with its `run_id`.
    #[arg(long)]
    pub json: bool,
}

pub async fn cmd_events(args: EventsArgs, ui: Ui) -> Result<Outcome, CliError> {
    let ctx = Context::discover(ui)?;
    ctx.reconcile()?;
    let run_id = match &args.run {
        Some(prefix) => ctx.resolve_run(prefix)?,
        None => ctx.store().run_ids()?.into_iter().next().ok_or_else(|| {
            CliError::user("this workspace has no runs yet").with_hint("start one with `crew run`")
        })?,
    };
    let mut events = if args.follow {
        ctx.project().follow_run(&run_id, 0)
    } else {
        ctx.project().run_events(&run_id)
    };
    let mut stdout = std::io::stdout().lock();
    while let Some(batch) = events.next().await? {
        for event in &batch {
            let line = if args.json {
                let mut value = serde_json::to_value(event)?;
                value["run_id"] = serde_json::Value::String(run_id.to_string());
                value.to_string()
            } else {
                human(event)
            };
            if writeln!(stdout, "{line}").is_err() {
                // The reader went away (`| head`): nothing more to say.
                return Ok(Outcome::Success);
            }
        }
        // A reader gone stops the next write, which ends the command.
        let _ = stdout.flush();
    }
    Ok(Outcome::Success)
}

fn with_reason(status: &str, reason: &Option<String>) -> String {
    match reason {
        Some(reason) => format!("{status}  {}", sanitize(reason)),
        None => status.to_owned(),
    }
}

/// `12:03:04.567  api  running`, `12:03:09.001  run  completed`.
fn human(event: &RunEvent) -> String {
    let at = event.at.to_string();
    let time = at.split('T').nth(1).unwrap_or(&at).trim_end_matches('Z');
    let subject = event.task.as_ref().map_or("run", |task| task.as_str());
    let what = match &event.kind {
        EventKind::RunCreated => "created".to_owned(),
        EventKind::RunStatus { status, reason } => with_reason(status.as_str(), reason),
        EventKind::TaskStatus { status, reason } => with_reason(status.as_str(), reason),
        EventKind::Message { text } => sanitize(text),
        EventKind::CancelRequested { by } => format!("cancel requested {by}"),
        EventKind::Usage { usage } => format!("usage: {usage}"),
        EventKind::Overlap { with, files } => format!(
            "would conflict with {} in {}",
            sanitize(with),
            sanitize(&files.join(", "))
        ),
        EventKind::Network {
            host,
            port,
            allowed,
            reason,
        } => format!(
            "network: {} {}{}",
            match host.is_empty() {
                // A request the proxy could not read names no host.
                true => "a request".to_owned(),
                false => format!("{}:{port}", sanitize(host)),
            },
            if *allowed { "allowed" } else { "refused" },
            reason
                .as_deref()
                .map(|reason| format!(" ({})", sanitize(reason)))
                .unwrap_or_default()
        ),
    };
    format!("{time}  {subject:<14}  {what}")
}
