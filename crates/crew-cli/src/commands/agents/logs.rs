//! `crew agents logs`

use std::io::{Read, Seek, SeekFrom, Write};
use std::time::Duration;

use crate::context::Context;
use crate::ui::{Ui, sanitize};
use crate::{CliError, Outcome};

/// Print an agent's output (stdout and stderr, as they came).
///
/// Works for live agents and for agents of finished runs. On a terminal, control characters
/// are shown as `�`; piped, the bytes are passed through unchanged.
#[derive(Debug, clap::Args)]
pub struct LogsArgs {
    /// The agent: <runId>:<taskId>, <runPrefix>:<taskId>, or <taskId> when unambiguous.
    pub agent: String,
    /// Keep printing new output until the agent's task has finished.
    #[arg(short, long)]
    pub follow: bool,
}

pub async fn cmd_agents_logs(args: LogsArgs, ui: Ui) -> Result<Outcome, CliError> {
    let ctx = Context::discover(ui)?;
    let Some((manifest, task_id)) = super::find_task(&ctx, &args.agent)? else {
        return Err(CliError::user(format!(
            "no agent '{}' in workspace {}",
            args.agent,
            ctx.workspace.id()
        ))
        .with_hint("`crew agents list --all-runs` shows the agents of this workspace"));
    };
    let path = ctx.store.output_log_path(&manifest.run_id, &task_id);
    let mut offset = 0u64;
    loop {
        offset = print_from(&path, offset, ui.terminal)?;
        if !args.follow {
            break;
        }
        let finished = ctx
            .store
            .read_run(&manifest.run_id)
            .ok()
            .and_then(|manifest| {
                manifest
                    .task(&task_id)
                    .map(|task| task.status.is_finished())
            })
            .unwrap_or(true);
        if finished {
            print_from(&path, offset, ui.terminal)?;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(Outcome::Success)
}

/// Prints the log from `offset` on, a chunk at a time; returns the new offset.
fn print_from(path: &camino::Utf8Path, mut offset: u64, terminal: bool) -> Result<u64, CliError> {
    let Ok(mut file) = crew_core::fsutil::open_nofollow(path) else {
        return Ok(offset);
    };
    file.seek(SeekFrom::Start(offset))
        .map_err(CliError::internal)?;
    let mut stdout = std::io::stdout().lock();
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let read = file.read(&mut buffer).map_err(CliError::internal)?;
        if read == 0 {
            break;
        }
        let chunk = &buffer[..read];
        let written = if terminal {
            // Control characters become `�`; newlines stay.
            let text = String::from_utf8_lossy(chunk);
            let shown: Vec<String> = text.split('\n').map(sanitize).collect();
            stdout.write_all(shown.join("\n").as_bytes())
        } else {
            stdout.write_all(chunk)
        };
        if written.is_err() {
            // The reader went away (a closed pipe): nothing more to print.
            break;
        }
        offset += read as u64;
    }
    let _ = stdout.flush();
    Ok(offset)
}
