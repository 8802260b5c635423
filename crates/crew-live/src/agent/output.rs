//! Draining an agent's stdout and stderr: everything goes to `output.log`, and only the last few
//! lines (each capped) stay in memory for listings and events. A gigabyte without a newline
//! costs the host a few kilobytes, and the agent is never blocked on its pipes.

use std::collections::VecDeque;
use std::fs::File;
use std::io::Write;

use camino::{Utf8Path, Utf8PathBuf};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::{broadcast, mpsc};

use crew_core::AgentId;

use crew_core::config::Protocol;

use crate::agent::events::{AgentEvent, OutputStream, emit};
use crate::agent::protocol::{MessageLines, ProtocolEvent, is_json_rpc, read_line, shown_log};
use crate::agent::refusals::Refusals;

/// The longest line kept in memory; the rest of a longer line is only in `output.log`.
pub const MAX_LINE_BYTES: usize = 4096;
/// How many complete lines are kept in memory per agent.
pub const MAX_TAIL_LINES: usize = 20;
const READ_CHUNK: usize = 16 * 1024;

/// The last lines of an agent's output.
#[derive(Debug, Default)]
pub struct OutputTail {
    lines: VecDeque<String>,
    partial: Vec<u8>,
    partial_truncated: bool,
}

impl OutputTail {
    /// Adds a chunk; returns the lines it completed (capped at [`MAX_LINE_BYTES`]).
    pub fn push(&mut self, mut bytes: &[u8]) -> Vec<String> {
        let mut completed = Vec::new();
        while let Some(newline) = bytes.iter().position(|&b| b == b'\n') {
            self.append_partial(&bytes[..newline]);
            completed.push(self.take_partial());
            bytes = &bytes[newline + 1..];
        }
        self.append_partial(bytes);
        for line in &completed {
            if self.lines.len() == MAX_TAIL_LINES {
                self.lines.pop_front();
            }
            self.lines.push_back(line.clone());
        }
        completed
    }

    fn append_partial(&mut self, bytes: &[u8]) {
        let room = MAX_LINE_BYTES.saturating_sub(self.partial.len());
        if bytes.len() > room {
            self.partial_truncated = true;
        }
        self.partial
            .extend_from_slice(&bytes[..bytes.len().min(room)]);
    }

    fn take_partial(&mut self) -> String {
        let mut line = String::from_utf8_lossy(&self.partial).into_owned();
        if line.ends_with('\r') {
            line.pop();
        }
        if self.partial_truncated {
            line.push('…');
        }
        self.partial.clear();
        self.partial_truncated = false;
        line
    }

    /// The last complete lines, then the line in progress if any.
    pub fn last_lines(&self) -> Vec<String> {
        let mut lines: Vec<String> = self.lines.iter().cloned().collect();
        if !self.partial.is_empty() {
            let mut line = String::from_utf8_lossy(&self.partial).into_owned();
            if self.partial_truncated {
                line.push('…');
            }
            lines.push(line);
        }
        lines
    }

    /// Bytes held in memory, for tests of the bound.
    pub fn memory_bytes(&self) -> usize {
        self.partial.capacity() + self.lines.iter().map(String::capacity).sum::<usize>()
    }
}

/// The last non-empty line of the log at `path` (read from its end, at most
/// [`MAX_LINE_BYTES`]): what a listing shows for an agent that is no longer live. A protocol
/// message is shown as a person sees it live (see `protocol`).
pub fn last_line_of(path: &Utf8Path) -> Option<String> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = crew_core::fsutil::open_nofollow(path).ok()?;
    let length = file.metadata().ok()?.len();
    let start = length.saturating_sub(MAX_LINE_BYTES as u64);
    file.seek(SeekFrom::Start(start)).ok()?;
    let mut tail = Vec::new();
    file.take(MAX_LINE_BYTES as u64)
        .read_to_end(&mut tail)
        .ok()?;
    let text = String::from_utf8_lossy(&tail);
    let mut lines: Vec<&str> = text
        .lines()
        .map(|line| line.trim_end_matches('\r'))
        .filter(|line| !line.trim().is_empty())
        .collect();
    // The first line was cut where the read began, unless it is the only one.
    if start > 0 && lines.len() > 1 {
        lines.remove(0);
    }
    let last = (*lines.last()?).to_owned();
    // A log whose end shows nothing of itself (a session's start) is shown as it is.
    Some(shown_log(lines).pop().unwrap_or(last))
}

/// The suffix of the part of a log before its last rotation.
pub const ROTATED_SUFFIX: &str = ".1";

/// An agent's `output.log`, bounded: when the next write would take it past its limit, the log
/// becomes `output.log.1` (replacing the one before) and a new `output.log` starts with a line
/// saying so. The newest output is always kept, and the two files never hold much more than
/// twice the limit.
#[derive(Debug)]
pub struct LogWriter {
    file: File,
    path: Utf8PathBuf,
    written: u64,
    limit: u64,
}

impl LogWriter {
    /// Opens `path` to append (never through a link), counting what it already holds.
    pub fn open(path: &Utf8Path, limit: u64) -> Result<Self, crew_core::fsutil::FileError> {
        let file = crew_core::fsutil::open_append_nofollow(path)?;
        let written = file.metadata().map(|metadata| metadata.len()).unwrap_or(0);
        Ok(LogWriter {
            file,
            path: path.to_owned(),
            written,
            limit: limit.max(1),
        })
    }

    /// How many bytes the current file holds.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// The file the part before the last rotation went to.
    pub fn rotated_path(path: &Utf8Path) -> Utf8PathBuf {
        Utf8PathBuf::from(format!("{path}{ROTATED_SUFFIX}"))
    }

    /// Appends `chunk`, starting over (the part before kept as `output.log.1`) when the limit would be passed.
    pub fn write(&mut self, chunk: &[u8]) -> std::io::Result<()> {
        if self.written > 0 && self.written + chunk.len() as u64 > self.limit {
            self.rotate()?;
        }
        self.file.write_all(chunk)?;
        self.written += chunk.len() as u64;
        Ok(())
    }

    fn rotate(&mut self) -> std::io::Result<()> {
        let rotated = Self::rotated_path(&self.path);
        std::fs::rename(&self.path, &rotated)?;
        self.file = crew_core::fsutil::open_append_nofollow(&self.path)
            .map_err(|error| std::io::Error::other(error.to_string()))?;
        let marker = format!(
            "[crew: the log reached its limit of {}; the output before this line is in {}, and what came before that was dropped]\n",
            crew_core::config::ByteSize(self.limit),
            rotated.file_name().unwrap_or(ROTATED_SUFFIX)
        );
        self.file.write_all(marker.as_bytes())?;
        self.written = marker.len() as u64;
        Ok(())
    }
}

/// Where one agent's output goes.
#[derive(Debug, Clone)]
pub struct OutputSink {
    /// The agent.
    pub agent_id: AgentId,
    /// `output.log`, shared by both streams; `None` once writing to it failed.
    pub log: Arc<Mutex<Option<LogWriter>>>,
    /// The last lines, kept in memory for listings.
    pub tail: Arc<Mutex<OutputTail>>,
    /// Where each line goes as an event.
    pub events: broadcast::Sender<AgentEvent>,
    /// How stdout is read: plain lines, or the messages of a protocol.
    pub protocol: Protocol,
    /// Told what the agent's protocol says (for `lines` agents steered with `stdin-json`: each
    /// end of a turn).
    pub supervisor: Option<mpsc::UnboundedSender<ProtocolEvent>>,
    /// Where an `acp` agent's JSON-RPC lines go: its client connection (see `acp`).
    pub acp: Option<mpsc::UnboundedSender<String>>,
    /// A confined agent's: the writes it says it was refused (see `refusals`).
    pub refusals: Option<Arc<Mutex<Refusals>>>,
}

impl OutputSink {
    /// Shows `line` as the agent's output: in the in-memory tail and as an event.
    pub(crate) fn show(&self, stream: OutputStream, line: String) {
        if self.protocol == Protocol::Shim {
            let mut log = self
                .log
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            if let Some(writer) = log.as_mut()
                && writer.write(format!("{line}\n").as_bytes()).is_err()
            {
                *log = None;
            }
        }
        self.tail
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(format!("{line}\n").as_bytes());
        emit(
            &self.events,
            AgentEvent::Output {
                agent_id: self.agent_id.clone(),
                stream,
                line,
            },
        );
    }

    /// Reads `line` for a write the sandbox refused.
    fn scan(&self, line: &str) {
        if let Some(refusals) = &self.refusals {
            refusals
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .scan(line);
        }
    }

    pub(crate) fn tell(&self, event: ProtocolEvent) {
        if let Some(supervisor) = &self.supervisor {
            // Nobody to tell once the agent's supervisor is gone.
            let _ = supervisor.send(event);
        }
    }
}

/// Reads `pipe` to its end into the sink.
pub async fn drain(mut pipe: impl AsyncRead + Unpin, stream: OutputStream, sink: OutputSink) {
    let mut buffer = vec![0u8; READ_CHUNK];
    let mut messages = (stream == OutputStream::Stdout && sink.protocol != Protocol::Lines)
        .then(MessageLines::default);
    let mut told_not_protocol = false;
    loop {
        let read = match pipe.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(read) => read,
        };
        let chunk = &buffer[..read];
        // A placement's transport speaks the shim protocol on stdout (pack chunks among it):
        // its log holds what the task shows instead (see `show`).
        if !(stream == OutputStream::Stdout && sink.protocol == Protocol::Shim) {
            let mut log = sink
                .log
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            if let Some(writer) = log.as_mut()
                && writer.write(chunk).is_err()
            {
                // A full disk must not stop the agent: keep draining, stop logging.
                *log = None;
            }
        }
        let Some(messages) = messages.as_mut() else {
            let lines = sink
                .tail
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .push(chunk);
            for line in lines {
                sink.scan(&line);
                if is_turn_end(&line) {
                    sink.tell(ProtocolEvent::TurnEnded {
                        usage: None,
                        error: None,
                        limit: None,
                    });
                }
                emit(
                    &sink.events,
                    AgentEvent::Output {
                        agent_id: sink.agent_id.clone(),
                        stream,
                        line,
                    },
                );
            }
            continue;
        };
        for line in messages.push(chunk) {
            if let Ok(line) = &line {
                sink.scan(line);
            }
            // An `acp` agent's messages go to its client connection, which shows what they say.
            let line = match (&sink.acp, line) {
                (Some(acp), Ok(line)) if sink.protocol == Protocol::Shim || is_json_rpc(&line) => {
                    // Once the connection is over, what the agent still sends is only logged.
                    let _ = acp.send(line);
                    continue;
                }
                (_, line) => line,
            };
            let reading = line
                .as_deref()
                .ok()
                .and_then(|line| read_line(sink.protocol, line))
                .filter(|_| sink.acp.is_none());
            match reading {
                Some(reading) => {
                    for shown in reading.shown {
                        sink.show(stream, shown);
                    }
                    if let Some(event) = reading.event {
                        sink.tell(event);
                    }
                }
                None => {
                    // Degrade to plain lines: shown as they are (cut like any long line), and
                    // the task says so once.
                    let line = line.unwrap_or_else(|start| start);
                    if !told_not_protocol {
                        told_not_protocol = true;
                        let start: String = line.chars().take(80).collect();
                        sink.tell(ProtocolEvent::NotProtocol(start));
                    }
                    let mut tail = OutputTail::default();
                    for cut in tail.push(format!("{line}\n").as_bytes()) {
                        sink.show(stream, cut);
                    }
                }
            }
        }
    }
}

/// The line Claude Code's `stream-json` output prints when a turn is over (for an agent read
/// as plain lines but steered with `stdin-json`).
fn is_turn_end(line: &str) -> bool {
    line.trim_start().starts_with('{') && line.contains("\"type\":\"result\"")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_keeps_the_last_lines_and_caps_long_ones() {
        let mut tail = OutputTail::default();
        for index in 0..30 {
            tail.push(format!("line {index}\n").as_bytes());
        }
        let lines = tail.last_lines();
        assert_eq!(lines.len(), MAX_TAIL_LINES);
        assert_eq!(lines[0], "line 10");
        let huge = vec![b'x'; 10 * MAX_LINE_BYTES];
        for _ in 0..100 {
            tail.push(&huge);
        }
        assert!(tail.memory_bytes() < 4 * MAX_LINE_BYTES + MAX_TAIL_LINES * 64);
        let completed = tail.push(b"\xff\xfe tail\n");
        assert_eq!(completed.len(), 1);
        assert!(completed[0].ends_with('…'));
        assert_eq!(completed[0].len(), MAX_LINE_BYTES + '…'.len_utf8());
    }
}
