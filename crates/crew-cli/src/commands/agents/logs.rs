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
            ctx.workspace().id()
        ))
        .with_hint("`crew agents list --all-runs` shows the agents of this workspace"));
    };
    let path = ctx.store().output_log_path(&manifest.run_id, &task_id);
    let rotated = crew_live::agent::output::LogWriter::rotated_path(&path);
    // The part before the log's last rotation first, when it was kept.
    print_from(&rotated, 0, ui.terminal, true)?;
    let mut offset = 0u64;
    loop {
        // A log shorter than what was printed of it started over: the rest of what was being
        // followed is now the rotated part.
        let length = std::fs::metadata(&path)
            .map(|metadata| metadata.len())
            .unwrap_or(0);
        if length < offset {
            print_from(&rotated, offset, ui.terminal, true)?;
            offset = 0;
        }
        offset = print_from(&path, offset, ui.terminal, !args.follow)?;
        if !args.follow {
            break;
        }
        let finished = ctx
            .store()
            .read_run(&manifest.run_id)
            .ok()
            .and_then(|manifest| {
                manifest
                    .task(&task_id)
                    .map(|task| task.status.is_finished())
            })
            .unwrap_or(true);
        if finished {
            print_from(&path, offset, ui.terminal, true)?;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(Outcome::Success)
}

/// Prints the log from `offset` on, a chunk at a time; returns the offset of the first byte not
/// printed. On a terminal a character cut by the end of a read waits for its other bytes
/// (unless this is the last look, `at_end`), so it is never shown as two `�`.
fn print_from(
    path: &camino::Utf8Path,
    mut offset: u64,
    terminal: bool,
    at_end: bool,
) -> Result<u64, CliError> {
    let Ok(mut file) = crew_core::fsutil::open_nofollow(path) else {
        return Ok(offset);
    };
    file.seek(SeekFrom::Start(offset))?;
    let mut stdout = std::io::stdout().lock();
    let mut buffer = vec![0u8; 64 * 1024];
    let mut pending: Vec<u8> = Vec::new();
    loop {
        let read = file.read(&mut buffer)?;
        if read == 0 && (pending.is_empty() || !at_end) {
            break;
        }
        let mut bytes = std::mem::take(&mut pending);
        bytes.extend_from_slice(&buffer[..read]);
        let printable = if terminal && read > 0 {
            complete_characters(&bytes)
        } else {
            bytes.len()
        };
        let (shown, rest) = bytes.split_at(printable);
        let written = if terminal {
            // Control characters become `�`; newlines stay.
            let text = String::from_utf8_lossy(shown);
            let lines: Vec<String> = text.split('\n').map(sanitize).collect();
            stdout.write_all(lines.join("\n").as_bytes())
        } else {
            stdout.write_all(shown)
        };
        if written.is_err() {
            // The reader went away (a closed pipe): nothing more to print.
            break;
        }
        offset += printable as u64;
        pending = rest.to_vec();
        if read == 0 {
            break;
        }
    }
    // A reader gone stops the next write, which ends the command.
    let _ = stdout.flush();
    Ok(offset)
}

/// How many of `bytes` end on a character boundary: all, unless they end inside a UTF-8
/// sequence that more bytes would complete.
fn complete_characters(bytes: &[u8]) -> usize {
    match std::str::from_utf8(bytes) {
        Err(error) if error.error_len().is_none() => error.valid_up_to(),
        _ => bytes.len(),
    }
}

#[cfg(test)]
mod tests {
    use super::complete_characters;

    #[test]
    fn a_character_cut_by_a_read_waits_for_its_end() {
        let text = "naïve 日本".as_bytes();
        assert_eq!(complete_characters(text), text.len());
        assert_eq!(complete_characters(&text[..text.len() - 1]), text.len() - 3);
        assert_eq!(complete_characters(&text[..3]), 2);
        assert_eq!(complete_characters(b"\xff\xfe"), 2);
    }
}
