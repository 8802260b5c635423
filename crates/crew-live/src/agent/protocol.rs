//! Agents that speak a protocol of their own on stdout: what their messages mean to crew.
//!
//! `claude-stream-json` is Claude Code's `--output-format stream-json --verbose`: one JSON
//! object per line, as its documentation ("Run Claude Code programmatically", output formats;
//! the Agent SDK's message types) describes them:
//! - `{"type":"system","subtype":"init","session_id":…,"model":…}` when a session starts or is
//!   taken up again;
//! - `{"type":"assistant","message":{"content":[{"type":"text","text":…},
//!   {"type":"tool_use","name":…,"input":{…}}]},"session_id":…}` for what the model says and
//!   does;
//! - `{"type":"user","message":{"content":[{"type":"tool_result",…}]}}` for tool results;
//! - `{"type":"result","subtype":"success"|"error_max_turns"|"error_during_execution",
//!   "is_error":…,"num_turns":…,"result":…,"session_id":…,"total_cost_usd":…,
//!   "usage":{"input_tokens":…,"output_tokens":…,"cache_read_input_tokens":…,
//!   "cache_creation_input_tokens":…}}` when a turn (one user message) is over.
//!
//! `codex-json` is Codex's `codex exec --json` event stream, as its documentation
//! ("Non-interactive mode": JSON output) describes it:
//! - `{"type":"thread.started","thread_id":…}`: the thread `codex exec resume <id>` takes up;
//! - `{"type":"turn.started"}`, then `item.started` / `item.updated` / `item.completed` with an
//!   `item` of type `agent_message` (`text`), `reasoning`, `command_execution` (`command`,
//!   `exit_code`, `status`), `file_change` (`changes`: `path`, `kind`), `mcp_tool_call`,
//!   `web_search`, `todo_list` or `error` (`message`);
//! - `{"type":"turn.completed","usage":{"input_tokens":…,"cached_input_tokens":…,
//!   "output_tokens":…}}` or `{"type":"turn.failed","error":{"message":…}}`;
//! - `{"type":"error","message":…}` for a failure outside a turn.
//!
//! Codex reports tokens, never a cost: its cost stays unknown.
//!
//! Each message gives the lines a person sees (the raw line always goes to `output.log`) and at
//! most one [`ProtocolEvent`] for the supervisor. A line that is not such a message is shown as
//! it is, and the task says its output was not all protocol.

use crew_core::config::Protocol;
use crew_core::model::{Usage, UsageLimit};
use serde::Deserialize;
use serde_json::Value;
use std::time::Duration;

/// The longest message line read as a message; a longer one is shown cut, as plain text.
pub const MAX_MESSAGE_BYTES: usize = 4 << 20;
/// How much of a tool's input a line about it shows.
const TOOL_INPUT_SHOWN: usize = 120;

/// What a protocol message tells the agent's supervisor.
#[derive(Debug, Clone, PartialEq)]
pub enum ProtocolEvent {
    /// The agent's session: recorded on the task, and what a resume takes up.
    Session(String),
    /// A turn is over (the agent answered one message): the next follow-up may go in.
    TurnEnded {
        /// What the turn cost, when the agent said.
        usage: Option<Usage>,
        /// Why the turn failed, when it did.
        error: Option<String>,
        /// The usage or rate limit the turn hit, when that is why it failed.
        limit: Option<UsageLimit>,
    },
    /// Tool calls of the turn under way came back: how many succeeded, the words of each
    /// that failed, and whether a failed one was a change to files.
    ToolsDone {
        /// Calls that succeeded.
        succeeded: u32,
        /// What each failed call said, cut short.
        failed: Vec<String>,
        /// A failed call was a file change (Codex's `file_change`).
        change_failed: bool,
    },
    /// The program tries the model's API again by itself (Claude Code's `api_retry`), after
    /// `wait`: the API's own `retry-after` when it said one. `status`: what the API answered.
    ApiRetry {
        /// The HTTP status of the failure, when there was an answer.
        status: Option<u16>,
        /// How long the program waits before it tries again.
        wait: Duration,
    },
    /// A line that was not a message of the protocol (the first one only).
    NotProtocol(String),
    /// Something the task should say of how its agent went on (a session that could not be
    /// loaded).
    Warning(String),
    /// The agent asks for permission and waits, alive, for the answer (`acp`).
    Asked(String),
    /// Its permission request was answered or withdrawn.
    Answered,
    /// The protocol connection failed (`acp`): the agent's input is closed.
    Failed(String),
    /// A placed task's connection to its placement ended before its work came back: the
    /// task is `interrupted`, for this reason (where its work is). `before_start`: it ended
    /// before the task started there, so what the transport said last is the real reason.
    Lost {
        /// Where the work is, or that it never started.
        reason: String,
        /// The task never started on the placement.
        before_start: bool,
    },
    /// A placed task's work came back, was checked, and its branch here holds it.
    Landed {
        /// The branch.
        branch: String,
        /// Its tip.
        tip: String,
    },
}

/// One stdout line of a protocol agent, read.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Reading {
    /// What a person sees for it, one entry per line.
    pub shown: Vec<String>,
    /// What the line means for the task, if anything.
    pub event: Option<ProtocolEvent>,
}

/// Reads one stdout line of an agent speaking `protocol`. `None` when it is not a message of
/// it (and for `lines`, which has none).
pub fn read_line(protocol: Protocol, line: &str) -> Option<Reading> {
    match protocol {
        Protocol::Lines => None,
        Protocol::ClaudeStreamJson => read_claude_line(line),
        Protocol::CodexJson => read_codex_line(line),
        Protocol::Acp => read_acp_line(line),
        // A placement's transport: its driver reads every line (see `placed`).
        Protocol::Shim => None,
    }
}

/// Every line a person would have seen live for one line of an agent's log: what a message of
/// any protocol shows (nothing for one that shows nothing, as a session's start), else the
/// line itself.
pub fn shown_lines(line: &str) -> Vec<String> {
    let readings: Vec<Reading> = [
        Protocol::ClaudeStreamJson,
        Protocol::CodexJson,
        Protocol::Acp,
    ]
    .into_iter()
    .filter_map(|protocol| read_line(protocol, line))
    .collect();
    if readings.is_empty() {
        return vec![line.to_owned()];
    }
    // A message another protocol also parses shows what the protocol that knows it says.
    readings
        .into_iter()
        .map(|reading| reading.shown)
        .find(|shown| !shown.is_empty())
        .unwrap_or_default()
}

/// Reads one line of Claude Code's stream-json output. `None` when it is not such a message.
pub fn read_claude_line(line: &str) -> Option<Reading> {
    let message: Message = serde_json::from_str(line.trim()).ok()?;
    let mut reading = Reading::default();
    match message.kind.as_str() {
        "system" if message.subtype.as_deref() == Some("api_retry") => {
            // The program retries the model's API by itself: say so, or the task looks silent
            // until it gives up.
            reading.shown.push(api_retry_line(&message));
            reading.event = Some(ProtocolEvent::ApiRetry {
                status: message.error_status,
                wait: Duration::from_millis(message.retry_delay_ms.unwrap_or(0)),
            });
        }
        "system" => {
            if let Some(session) = message
                .session_id
                .filter(|_| message.subtype.as_deref() == Some("init"))
            {
                let model = message
                    .model
                    .map(|model| format!(", model {model}"))
                    .unwrap_or_default();
                reading.shown.push(format!("[session {session}{model}]"));
                reading.event = Some(ProtocolEvent::Session(session));
            }
        }
        "assistant" => {
            for block in message.message.map(|body| body.content).unwrap_or_default() {
                match block {
                    Block::Text { text } => reading.shown.extend(
                        text.lines()
                            .filter(|line| !line.trim().is_empty())
                            .map(str::to_owned),
                    ),
                    Block::ToolUse { name, input } => {
                        reading
                            .shown
                            .push(format!("→ {name} {}", tool_summary(&input)));
                    }
                    Block::ToolResult { .. } | Block::Other => {}
                }
            }
        }
        "result" => {
            let usage = message.usage.map(|usage| Usage {
                input_tokens: usage.input_tokens,
                output_tokens: usage.output_tokens,
                cache_read_input_tokens: usage.cache_read_input_tokens,
                cache_creation_input_tokens: usage.cache_creation_input_tokens,
                cost_usd: message.total_cost_usd,
                turns: message.num_turns.unwrap_or(0),
                tokens_unknown: false,
            });
            let subtype = message.subtype.unwrap_or_else(|| "success".to_owned());
            // An error whose subtype still says "success" (an API error) is told by its words.
            let error = (message.is_error || subtype != "success").then(|| {
                let result = message
                    .result
                    .as_deref()
                    .filter(|result| !result.is_empty());
                match (result, subtype.as_str()) {
                    (Some(result), "success") => result.to_owned(),
                    (Some(result), _) => format!("{subtype}: {result}"),
                    (None, _) => subtype.clone(),
                }
            });
            // A limit the words name, or the API's 429 the program gave up on.
            let limit = message
                .result
                .as_deref()
                .filter(|_| error.is_some())
                .and_then(|result| {
                    usage_limit(result).or_else(|| {
                        (message.api_error_status == Some(429)).then(|| UsageLimit {
                            message: result.to_owned(),
                            resets_at: None,
                            retry_at: None,
                            provider: None,
                        })
                    })
                });
            let cost = message
                .total_cost_usd
                .map(|cost| format!(", ${cost:.4}"))
                .unwrap_or_default();
            reading.shown.push(format!(
                "[turn over: {subtype}, {} model turn(s){cost}]",
                message.num_turns.unwrap_or(0)
            ));
            reading.event = Some(ProtocolEvent::TurnEnded {
                usage,
                error,
                limit,
            });
        }
        // Its tools' results: counted, for a turn whose every call failed.
        "user" => {
            let mut succeeded = 0;
            let mut failed = Vec::new();
            for block in message.message.map(|body| body.content).unwrap_or_default() {
                if let Block::ToolResult { is_error, content } = block {
                    if is_error {
                        failed.push(cut(&result_text(&content)));
                    } else {
                        succeeded += 1;
                    }
                }
            }
            if succeeded > 0 || !failed.is_empty() {
                reading.event = Some(ProtocolEvent::ToolsDone {
                    succeeded,
                    failed,
                    change_failed: false,
                });
            }
        }
        // Message types newer than this reader: nothing to show.
        _ => {}
    }
    Some(reading)
}

/// Reads one line of `codex exec --json` output. `None` when it is not such an event.
pub fn read_codex_line(line: &str) -> Option<Reading> {
    let event: CodexEvent = serde_json::from_str(line.trim()).ok()?;
    let mut reading = Reading::default();
    match event.kind.as_str() {
        "thread.started" | "thread.resumed" => {
            let thread = event.thread_id?;
            reading.shown.push(format!("[thread {thread}]"));
            reading.event = Some(ProtocolEvent::Session(thread));
        }
        "item.started" => {
            if let Some(CodexItem::CommandExecution { command, .. }) = event.item {
                reading.shown.push(format!("→ $ {}", cut(&command)));
            }
        }
        "item.completed" => match event.item {
            Some(CodexItem::AgentMessage { text }) => reading.shown.extend(
                text.lines()
                    .filter(|line| !line.trim().is_empty())
                    .map(str::to_owned),
            ),
            Some(CodexItem::CommandExecution {
                command,
                exit_code,
                status,
                aggregated_output,
            }) => {
                let failed = match exit_code {
                    Some(0) => None,
                    Some(code) => {
                        reading.shown.push(format!("  (exit {code})"));
                        Some(format!("`{}` exited {code}", cut(&command)))
                    }
                    None => (status == "failed").then(|| format!("`{}` failed", cut(&command))),
                };
                reading.event = Some(tools_done(
                    failed.map(|failed| with_output(failed, &aggregated_output)),
                    false,
                ));
            }
            Some(CodexItem::FileChange { changes, status }) => {
                let paths: Vec<String> = changes
                    .into_iter()
                    .map(|change| format!("{} {}", change.kind, change.path))
                    .collect();
                let what = cut(&paths.join(", "));
                reading.shown.push(format!("→ {what}"));
                let failed = (status == "failed").then(|| {
                    reading.shown.push("  (failed)".to_owned());
                    format!("the change {what} failed")
                });
                reading.event = Some(tools_done(failed, true));
            }
            Some(CodexItem::Error { message }) => reading.shown.push(format!("error: {message}")),
            _ => {}
        },
        "turn.completed" | "turn.failed" => {
            let usage = event.usage.map(|usage| Usage {
                // Codex counts cached input inside its input; crew keeps them apart.
                input_tokens: usage.input_tokens.saturating_sub(usage.cached_input_tokens),
                cache_read_input_tokens: usage.cached_input_tokens,
                output_tokens: usage.output_tokens,
                cache_creation_input_tokens: 0,
                cost_usd: None,
                turns: 1,
                tokens_unknown: false,
            });
            let error = event.error.map(|error| error.message);
            reading.shown.push(match &error {
                Some(message) => format!("[turn failed: {message}]"),
                None => "[turn over]".to_owned(),
            });
            let limit = error.as_deref().and_then(usage_limit);
            reading.event = Some(ProtocolEvent::TurnEnded {
                usage,
                error,
                limit,
            });
        }
        "error" => reading
            .shown
            .push(format!("error: {}", event.message.unwrap_or_default())),
        // `turn.started`, item updates, and event types newer than this reader.
        _ => {}
    }
    Some(reading)
}

/// Reads one line of an Agent Client Protocol agent's stdout, as a log is read back: what its
/// `session/update` notifications showed (a message chunk's lines, `→ <tool call>`). Live, the
/// `acp` driver shows whole lines and tells the supervisor; this reader never does.
pub fn read_acp_line(line: &str) -> Option<Reading> {
    let message: JsonRpc = serde_json::from_str(line.trim()).ok()?;
    if message.jsonrpc != "2.0" {
        return None;
    }
    let mut reading = Reading::default();
    let update = message
        .params
        .filter(|_| message.method.as_deref() == Some("session/update"))
        .and_then(|params| params.update);
    match update {
        Some(AcpUpdate::AgentMessageChunk {
            content: AcpContent::Text { text },
        }) => reading.shown.extend(
            text.lines()
                .filter(|line| !line.trim().is_empty())
                .map(str::to_owned),
        ),
        Some(AcpUpdate::ToolCall { title }) => reading.shown.push(format!("→ {title}")),
        _ => {}
    }
    // The answer to a prompt: the turn is over.
    if let Some(stop) = message.result.and_then(|result| result.stop_reason) {
        reading.shown.push(format!("[turn over: {stop}]"));
    }
    Some(reading)
}

/// Whether a line is a JSON-RPC 2.0 message (what an `acp` agent's stdout carries): the
/// version read, the rest only checked to be JSON, nothing else kept.
pub fn is_json_rpc(line: &str) -> bool {
    #[derive(Deserialize)]
    struct Version<'a> {
        #[serde(borrow)]
        jsonrpc: std::borrow::Cow<'a, str>,
    }
    serde_json::from_str::<Version>(line.trim()).is_ok_and(|message| message.jsonrpc == "2.0")
}

/// The text of an ACP agent's message chunk, when `line` is one.
fn acp_chunk(line: &str) -> Option<String> {
    let message: JsonRpc = serde_json::from_str(line.trim()).ok()?;
    match message.params?.update? {
        AcpUpdate::AgentMessageChunk {
            content: AcpContent::Text { text },
        } if message.method.as_deref() == Some("session/update") => Some(text),
        _ => None,
    }
}

/// The lines of an agent's log as a person saw them live: each line as [`shown_lines`] reads
/// it, with an ACP agent's message chunks joined into whole lines first.
pub fn shown_log<'a>(lines: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let mut shown = Vec::new();
    let mut said = String::new();
    let flush = |said: &mut String, shown: &mut Vec<String>| {
        shown.extend(
            said.lines()
                .filter(|line| !line.trim().is_empty())
                .map(str::to_owned),
        );
        said.clear();
    };
    for line in lines {
        if let Some(text) = acp_chunk(line) {
            said.push_str(&text);
            if let Some(newline) = said.rfind('\n') {
                let rest = said.split_off(newline + 1);
                flush(&mut said, &mut shown);
                said = rest;
            }
            continue;
        }
        flush(&mut said, &mut shown);
        shown.extend(shown_lines(line));
    }
    flush(&mut said, &mut shown);
    shown
}

#[derive(Deserialize)]
struct JsonRpc {
    jsonrpc: String,
    #[serde(default)]
    method: Option<String>,
    #[serde(default)]
    params: Option<AcpParams>,
    #[serde(default)]
    result: Option<AcpResult>,
}

#[derive(Deserialize)]
struct AcpResult {
    #[serde(default, rename = "stopReason")]
    stop_reason: Option<String>,
}

#[derive(Deserialize)]
struct AcpParams {
    #[serde(default)]
    update: Option<AcpUpdate>,
}

#[derive(Deserialize)]
#[serde(tag = "sessionUpdate", rename_all = "snake_case")]
enum AcpUpdate {
    AgentMessageChunk {
        content: AcpContent,
    },
    ToolCall {
        title: String,
    },
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum AcpContent {
    Text {
        text: String,
    },
    #[serde(other)]
    Other,
}

pub use crate::agent::limits::usage_limit;

/// A line cut to what a listing shows of a tool's input.
fn cut(text: &str) -> String {
    let line = text.lines().next().unwrap_or_default();
    match line.char_indices().nth(TOOL_INPUT_SHOWN) {
        Some((cut, _)) => format!("{}…", &line[..cut]),
        None => line.to_owned(),
    }
}

#[derive(Deserialize)]
struct CodexEvent {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    thread_id: Option<String>,
    #[serde(default)]
    item: Option<CodexItem>,
    #[serde(default)]
    usage: Option<CodexTokens>,
    #[serde(default)]
    error: Option<CodexError>,
    #[serde(default)]
    message: Option<String>,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum CodexItem {
    AgentMessage {
        #[serde(default)]
        text: String,
    },
    CommandExecution {
        #[serde(default)]
        command: String,
        #[serde(default)]
        exit_code: Option<i64>,
        #[serde(default)]
        status: String,
        #[serde(default)]
        aggregated_output: String,
    },
    FileChange {
        #[serde(default)]
        changes: Vec<CodexChange>,
        #[serde(default)]
        status: String,
    },
    Error {
        #[serde(default)]
        message: String,
    },
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
struct CodexChange {
    path: String,
    #[serde(default)]
    kind: String,
}

#[derive(Deserialize)]
struct CodexTokens {
    #[serde(default)]
    input_tokens: u64,
    #[serde(default)]
    cached_input_tokens: u64,
    #[serde(default)]
    output_tokens: u64,
}

#[derive(Deserialize)]
struct CodexError {
    message: String,
}

/// Claude Code's `api_retry` message as one line: what the API answered, and when the next of
/// how many tries comes.
fn api_retry_line(message: &Message) -> String {
    let status = message
        .error_status
        .map(|status| format!("HTTP {status}"))
        .unwrap_or_else(|| "no answer".to_owned());
    let error = message
        .error
        .as_ref()
        .and_then(Value::as_str)
        .map(|error| format!(" {error}"))
        .unwrap_or_default();
    let attempt = message.attempt.unwrap_or(0);
    let of = message
        .max_retries
        .map(|max| format!(" of {max}"))
        .unwrap_or_default();
    let delay = Duration::from_millis(message.retry_delay_ms.unwrap_or(0)).as_secs_f64();
    format!("[the model's API failed ({status}{error}): retry {attempt}{of} in {delay:.1} s]")
}

/// One tool call's end, as a `ToolsDone` event.
fn tools_done(failed: Option<String>, change: bool) -> ProtocolEvent {
    ProtocolEvent::ToolsDone {
        succeeded: u32::from(failed.is_none()),
        change_failed: change && failed.is_some(),
        failed: failed.into_iter().collect(),
    }
}

/// A failure's words with the first line of what the command printed.
fn with_output(failed: String, output: &str) -> String {
    match output.lines().find(|line| !line.trim().is_empty()) {
        Some(line) => format!("{failed}: {}", cut(line.trim())),
        None => failed,
    }
}

/// The text of a Claude Code tool result: a string, or its text blocks.
fn result_text(content: &Value) -> String {
    match content {
        Value::String(text) => text.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .filter_map(|block| block["text"].as_str())
            .collect::<Vec<_>>()
            .join(" "),
        _ => String::new(),
    }
}

/// A tool's input in a few words: the command, the file, or the input cut short.
fn tool_summary(input: &Value) -> String {
    let text = ["command", "file_path", "path", "pattern", "url"]
        .iter()
        .find_map(|key| input.get(key)?.as_str().map(str::to_owned))
        .unwrap_or_else(|| input.to_string());
    cut(&text)
}

#[derive(Deserialize)]
struct Message {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    subtype: Option<String>,
    #[serde(default)]
    session_id: Option<String>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    message: Option<Body>,
    #[serde(default)]
    is_error: bool,
    #[serde(default)]
    num_turns: Option<u32>,
    #[serde(default)]
    result: Option<String>,
    #[serde(default)]
    total_cost_usd: Option<f64>,
    #[serde(default)]
    usage: Option<Tokens>,
    /// `api_retry`: the try that failed, of how many, the wait before the next.
    #[serde(default)]
    attempt: Option<u32>,
    #[serde(default)]
    max_retries: Option<u32>,
    #[serde(default)]
    retry_delay_ms: Option<u64>,
    #[serde(default)]
    error_status: Option<u16>,
    /// `result`: the HTTP status of the model API's error the turn ended on.
    #[serde(default)]
    api_error_status: Option<u16>,
    /// Any shape: only a string is shown.
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Deserialize)]
struct Body {
    #[serde(default)]
    content: Vec<Block>,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Block {
    Text {
        text: String,
    },
    ToolUse {
        name: String,
        #[serde(default)]
        input: Value,
    },
    ToolResult {
        #[serde(default)]
        is_error: bool,
        #[serde(default)]
        content: Value,
    },
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
struct Tokens {
    #[serde(default)]
    input_tokens: u64,
    #[serde(default)]
    output_tokens: u64,
    #[serde(default)]
    cache_read_input_tokens: u64,
    #[serde(default)]
    cache_creation_input_tokens: u64,
}

/// Splits a stream into whole lines of at most [`MAX_MESSAGE_BYTES`]: a protocol message must
/// be read whole, where the in-memory tail keeps only the start of a long line.
#[derive(Debug, Default)]
pub struct MessageLines {
    partial: Vec<u8>,
    overlong: bool,
}

impl MessageLines {
    /// Adds a chunk; returns the lines it completed, `Err` with the start of a line that was
    /// longer than a message may be.
    pub fn push(&mut self, mut bytes: &[u8]) -> Vec<Result<String, String>> {
        let mut completed = Vec::new();
        while let Some(newline) = bytes.iter().position(|&b| b == b'\n') {
            self.append(&bytes[..newline]);
            let line = String::from_utf8_lossy(&self.partial).into_owned();
            completed.push(if self.overlong { Err(line) } else { Ok(line) });
            self.partial.clear();
            self.overlong = false;
            bytes = &bytes[newline + 1..];
        }
        self.append(bytes);
        completed
    }

    fn append(&mut self, bytes: &[u8]) {
        let room = MAX_MESSAGE_BYTES.saturating_sub(self.partial.len());
        if bytes.len() > room {
            self.overlong = true;
        }
        self.partial
            .extend_from_slice(&bytes[..bytes.len().min(room)]);
    }
}

#[cfg(test)]
#[path = "protocol_tests.rs"]
mod tests;
