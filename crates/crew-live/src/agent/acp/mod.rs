//! Agents that speak the Agent Client Protocol: crew is their client.
//!
//! One driver per process of such an agent, a tokio task that holds the client side of the
//! connection (the `agent-client-protocol` crate's `Client` role, over the process's stdin and
//! the JSON-RPC lines of its stdout):
//!
//! 1. `initialize`, offering file reads and writes and terminals, all confined to the task's
//!    workspace (`files`, `terminals`).
//! 2. `session/new` in the task's workspace, or `session/load` of the task's recorded session
//!    when the agent is started again and supports it: a resume takes up exactly that session.
//! 3. A prompt turn per message (`session/prompt`): the task's prompt, then each follow-up the
//!    supervisor hands over when a turn ends. A steer cancels the turn under way
//!    (`session/cancel`) and goes in as the next prompt.
//! 4. What the agent sends meanwhile: `session/update` notifications become the lines a person
//!    sees (what it says, line by line; `→ <tool call>`); its cost (`usage_update`) and the
//!    turn's tokens count on the task; a `session/request_permission` becomes the task's
//!    question, answered by whoever answers crew's questions (`crew agents follow-up`, the board,
//!    an editor); `fs/write_text_file` is offered, and it and `fs/read_text_file` (not
//!    offered: an agent reads files itself) are served beneath the workspace only, by the
//!    kernel's `RESOLVE_BENEATH`.
//! 5. When the supervisor has nothing more to say, the driver ends the connection: the agent's
//!    input closes and it exits.
//!
//! The supervisor hears of all this as [`ProtocolEvent`]s, as it does for the line protocols.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::schema::{
    CancelNotification, ClientCapabilities, ContentBlock, CreateTerminalRequest,
    FileSystemCapabilities, Implementation, InitializeRequest, KillTerminalRequest,
    LoadSessionRequest, NewSessionRequest, PermissionOption, PermissionOptionKind, PromptRequest,
    PromptResponse, ReadTextFileRequest, ReleaseTerminalRequest, RequestPermissionOutcome,
    RequestPermissionRequest, RequestPermissionResponse, SelectedPermissionOutcome, SessionId,
    SessionNotification, SessionUpdate, StopReason, TerminalOutputRequest, TextContent,
    ToolCallStatus, WaitForTerminalExitRequest, WriteTextFileRequest,
};
use agent_client_protocol::{Client, Lines, on_receive_notification, on_receive_request};
use camino::Utf8PathBuf;
use crew_core::model::Usage;
use crew_sandbox::spawn::AgentInput;
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::agent::events::OutputStream;
use crate::agent::output::{MAX_LINE_BYTES, OutputSink};
use crate::agent::protocol::ProtocolEvent;

mod files;
mod terminals;

pub(crate) use terminals::Terminals;

/// What the supervisor tells a running ACP agent.
#[derive(Debug)]
pub(crate) enum AcpInput {
    /// The next prompt turn (a follow-up, when the last turn ended).
    Prompt(String),
    /// Cancel the turn under way and send this as the next one.
    Steer(String),
    /// The answer to the agent's pending permission request.
    Answer(String),
    /// Nothing more to say: end the session, so that the agent exits.
    End,
}

/// One start of an ACP agent.
#[derive(Debug)]
pub(crate) struct AcpStart {
    /// The task's workspace: the session's `cwd`, and the only place its file requests reach.
    pub workspace: Utf8PathBuf,
    /// The first prompt: the task's prompt, or the message it was resumed with.
    pub first: String,
    /// The session to take up (`session/load`), when the agent is started again.
    pub resume: Option<String>,
    /// The task's prompt: the first prompt of a new session when that one cannot be loaded.
    pub prompt: String,
    /// What that session cost before, as crew counted it: the agent's running total starts
    /// there.
    pub resume_cost: Option<f64>,
    /// Where the commands it asks crew to run go.
    pub terminals: Terminals,
}

/// The supervisor's end of a driver.
#[derive(Debug)]
pub(crate) struct AcpLink {
    pub inputs: mpsc::UnboundedSender<AcpInput>,
    pub driver: JoinHandle<()>,
}

/// Starts the client side of the connection with a freshly started agent: `stdin` is its
/// input, `lines` the JSON-RPC lines of its stdout (the output drain sends them on), `sink`
/// where what it says is shown and the supervisor told.
pub(crate) fn start(
    start: AcpStart,
    stdin: AgentInput,
    lines: mpsc::UnboundedReceiver<String>,
    sink: OutputSink,
) -> AcpLink {
    let (inputs, receiver) = mpsc::unbounded_channel();
    let driver = tokio::spawn(drive(start, stdin, lines, receiver, sink));
    AcpLink { inputs, driver }
}

/// What the connection's handlers and its main flow share.
struct Shared {
    sink: OutputSink,
    workspace: PathBuf,
    /// What the agent said that no newline has ended yet.
    said: Mutex<String>,
    /// The permission request waiting for an answer.
    permission: Mutex<Option<oneshot::Sender<String>>>,
    /// The session's cost so far, in US dollars, as its last `usage_update` said.
    cost: Mutex<Option<f64>>,
    /// A loaded session's history is being replayed: not shown again.
    replaying: Mutex<bool>,
}

impl Shared {
    fn show(&self, line: String) {
        self.sink.show(OutputStream::Stdout, line);
    }

    /// Shows what the agent said up to its last newline (everything, when `all`). A line
    /// longer than a listing keeps is shown as it grows, a piece at a time, so that an agent
    /// that never ends its line costs the host no more than one piece.
    fn show_said(&self, all: bool) {
        let lines: Vec<String> = {
            let mut said = self.said.lock().unwrap_or_else(|e| e.into_inner());
            let end = match said.rfind('\n') {
                _ if all => said.len(),
                Some(newline) => newline + 1,
                None if said.len() > MAX_LINE_BYTES => said.len(),
                None => return,
            };
            let done: String = said.drain(..end).collect();
            done.lines()
                .filter(|line| !line.trim().is_empty())
                .map(
                    |line| match line.char_indices().find(|(at, _)| *at >= MAX_LINE_BYTES) {
                        // Cut as the output tail cuts a long line.
                        Some((at, _)) => format!("{}…", &line[..at]),
                        None => line.to_owned(),
                    },
                )
                .collect()
        };
        for line in lines {
            self.show(line);
        }
    }

    fn heard(&self, notification: SessionNotification) {
        let replaying = *self.replaying.lock().unwrap_or_else(|e| e.into_inner());
        match notification.update {
            SessionUpdate::UsageUpdate(update) => {
                if let Some(cost) = update.cost.filter(|cost| cost.currency == "USD") {
                    *self.cost.lock().unwrap_or_else(|e| e.into_inner()) = Some(cost.amount);
                }
            }
            _ if replaying => {}
            SessionUpdate::AgentMessageChunk(chunk) => {
                if let ContentBlock::Text(text) = chunk.content {
                    self.said
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push_str(&text.text);
                    self.show_said(false);
                }
            }
            SessionUpdate::ToolCall(call) => {
                self.show_said(true);
                self.show(format!("→ {}", call.title));
            }
            SessionUpdate::ToolCallUpdate(update)
                if update.fields.status == Some(ToolCallStatus::Failed) =>
            {
                let what = update
                    .fields
                    .title
                    .unwrap_or_else(|| update.tool_call_id.0.to_string());
                self.show(format!("  ({what} failed)"));
            }
            // Thoughts, plans, commands, modes and what newer agents send: not shown.
            _ => {}
        }
    }

    /// Hands `answer` to the pending permission request, if there is one.
    fn answer(&self, answer: String) {
        let pending = self
            .permission
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(pending) = pending {
            // The request's responder is gone only with the connection: nobody left to answer.
            let _ = pending.send(answer);
        }
    }

    /// Cancels the pending permission request (the turn is being cancelled).
    fn cancel_permission(&self) {
        // Dropping the sender answers the request `cancelled`.
        drop(
            self.permission
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take(),
        );
    }
}

async fn drive(
    mut start: AcpStart,
    stdin: AgentInput,
    lines: mpsc::UnboundedReceiver<String>,
    mut inputs: mpsc::UnboundedReceiver<AcpInput>,
    sink: OutputSink,
) {
    let shared = Arc::new(Shared {
        sink: sink.clone(),
        workspace: start.workspace.clone().into_std_path_buf(),
        said: Mutex::new(String::new()),
        permission: Mutex::new(None),
        cost: Mutex::new(None),
        replaying: Mutex::new(false),
    });
    let outgoing = futures::sink::unfold(stdin, |mut stdin, line: String| async move {
        stdin.write_all(format!("{line}\n").as_bytes()).await?;
        stdin.flush().await?;
        Ok::<_, std::io::Error>(stdin)
    });
    let incoming = futures::stream::unfold(lines, |mut lines| async move {
        lines.recv().await.map(|line| (Ok(line), lines))
    });
    let (on_update, on_permission, on_read, on_write, flow) = (
        shared.clone(),
        shared.clone(),
        shared.clone(),
        shared.clone(),
        shared.clone(),
    );
    let terminals = Arc::new(start.terminals);
    let (on_create, on_output, on_wait, on_kill, on_release) = (
        terminals.clone(),
        terminals.clone(),
        terminals.clone(),
        terminals.clone(),
        terminals,
    );
    let result = Client
        .v1()
        .name("crew")
        .on_receive_notification(
            async move |notification: SessionNotification, _cx| {
                on_update.heard(notification);
                Ok(())
            },
            on_receive_notification!(),
        )
        .on_receive_request(
            async move |request: RequestPermissionRequest, responder, cx| {
                let (sender, answer) = oneshot::channel();
                *on_permission
                    .permission
                    .lock()
                    .unwrap_or_else(|e| e.into_inner()) = Some(sender);
                on_permission.show_said(true);
                on_permission
                    .sink
                    .tell(ProtocolEvent::Asked(question(&request)));
                let shared = on_permission.clone();
                cx.spawn(async move {
                    let outcome = match answer.await {
                        Ok(answer) => choose(&answer, &request.options),
                        Err(_) => RequestPermissionOutcome::Cancelled,
                    };
                    // A newer request that replaced this one is the question now.
                    if shared
                        .permission
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .is_none()
                    {
                        shared.sink.tell(ProtocolEvent::Answered);
                    }
                    responder.respond(RequestPermissionResponse::new(outcome))
                })
            },
            on_receive_request!(),
        )
        .on_receive_request(
            async move |request: ReadTextFileRequest, responder, _cx| {
                responder.respond_with_result(files::read_file(&on_read.workspace, &request))
            },
            on_receive_request!(),
        )
        .on_receive_request(
            async move |request: WriteTextFileRequest, responder, _cx| {
                responder.respond_with_result(files::write_file(&on_write.workspace, &request))
            },
            on_receive_request!(),
        )
        .on_receive_request(
            async move |request: CreateTerminalRequest, responder, cx| {
                let terminals = on_create.clone();
                cx.spawn(
                    async move { responder.respond_with_result(terminals.create(&request).await) },
                )
            },
            on_receive_request!(),
        )
        .on_receive_request(
            async move |request: TerminalOutputRequest, responder, _cx| {
                responder.respond_with_result(on_output.output(&request.terminal_id))
            },
            on_receive_request!(),
        )
        .on_receive_request(
            async move |request: WaitForTerminalExitRequest, responder, cx| {
                let terminals = on_wait.clone();
                cx.spawn(async move {
                    responder.respond_with_result(terminals.wait(&request.terminal_id).await)
                })
            },
            on_receive_request!(),
        )
        .on_receive_request(
            async move |request: KillTerminalRequest, responder, _cx| {
                responder.respond_with_result(on_kill.kill(&request.terminal_id))
            },
            on_receive_request!(),
        )
        .on_receive_request(
            async move |request: ReleaseTerminalRequest, responder, _cx| {
                responder.respond_with_result(on_release.release(&request.terminal_id))
            },
            on_receive_request!(),
        )
        .connect_with(Lines::new(outgoing, incoming), async |cx| {
            let version = env!("CARGO_PKG_VERSION");
            let initialized = cx
                .send_request(
                    InitializeRequest::new(ProtocolVersion::V1)
                        .client_capabilities(
                            ClientCapabilities::new()
                                // Reads are the agent's own (crew has no unsaved
                                // buffers to show it, and reading is open in its sandbox):
                                // its own read of a missing file says ENOENT, which a
                                // client's "not found" does not to every agent.
                                .fs(FileSystemCapabilities::new()
                                    .read_text_file(false)
                                    .write_text_file(true))
                                .terminal(true),
                        )
                        .client_info(Implementation::new("crew", version)),
                )
                .block_task()
                .await?;
            let cwd = start.workspace.as_std_path();
            let session = match start
                .resume
                .filter(|_| initialized.agent_capabilities.load_session)
            {
                Some(session) => {
                    let session = SessionId::new(session);
                    // What it reports while replaying the session says better.
                    *flow.cost.lock().unwrap_or_else(|e| e.into_inner()) = start.resume_cost;
                    *flow.replaying.lock().unwrap_or_else(|e| e.into_inner()) = true;
                    let loaded = cx
                        .send_request(LoadSessionRequest::new(session.clone(), cwd))
                        .block_task()
                        .await;
                    *flow.replaying.lock().unwrap_or_else(|e| e.into_inner()) = false;
                    match loaded {
                        Ok(_) => session,
                        // The conversation is lost to the agent, the work is not: a new
                        // session starts on the task's prompt, with what it was resumed for.
                        Err(error) => {
                            let warning = format!(
                                "its session {session} could not be loaded ({}): it went on in a new session, given the task's prompt again",
                                error.message
                            );
                            flow.sink.show(OutputStream::Stdout, format!("[{warning}]"));
                            flow.sink.tell(ProtocolEvent::Warning(warning));
                            *flow.cost.lock().unwrap_or_else(|e| e.into_inner()) = Some(0.0);
                            start.first = format!("{}\n\n{}", start.prompt, start.first);
                            cx.send_request(NewSessionRequest::new(cwd))
                                .block_task()
                                .await?
                                .session_id
                        }
                    }
                }
                None => {
                    // A new session has cost nothing yet.
                    *flow.cost.lock().unwrap_or_else(|e| e.into_inner()) = Some(0.0);
                    cx.send_request(NewSessionRequest::new(cwd))
                        .block_task()
                        .await?
                        .session_id
                }
            };
            flow.sink
                .tell(ProtocolEvent::Session(session.0.to_string()));
            let mut next = Some(start.first);
            // The usage of turns a steer cut short counts with the turn that follows.
            let mut carried: Option<Usage> = None;
            loop {
                let text = match next.take() {
                    Some(text) => text,
                    None => match inputs.recv().await {
                        Some(AcpInput::Prompt(text) | AcpInput::Steer(text)) => text,
                        Some(AcpInput::Answer(answer)) => {
                            flow.answer(answer);
                            continue;
                        }
                        Some(AcpInput::End) | None => break,
                    },
                };
                let cost_before = *flow.cost.lock().unwrap_or_else(|e| e.into_inner());
                let prompt = cx.send_request(PromptRequest::new(
                    session.clone(),
                    vec![ContentBlock::Text(TextContent::new(text))],
                ));
                let response = prompt.block_task();
                tokio::pin!(response);
                let mut steered: Option<String> = None;
                let mut ending = false;
                let outcome = loop {
                    tokio::select! {
                        outcome = &mut response => break outcome,
                        input = inputs.recv(), if !ending => match input {
                            Some(AcpInput::Steer(text) | AcpInput::Prompt(text)) => {
                                steered = Some(match steered.take() {
                                    Some(earlier) => format!("{earlier}\n\n{text}"),
                                    None => text,
                                });
                                flow.cancel_permission();
                                cx.send_notification(CancelNotification::new(session.clone()))?;
                            }
                            Some(AcpInput::Answer(answer)) => flow.answer(answer),
                            Some(AcpInput::End) | None => {
                                ending = true;
                                flow.cancel_permission();
                                cx.send_notification(CancelNotification::new(session.clone()))?;
                            }
                        },
                    }
                };
                flow.show_said(true);
                let cost_after = *flow.cost.lock().unwrap_or_else(|e| e.into_inner());
                let (usage, error) = match outcome {
                    Ok(response) => (
                        turn_usage(&response, cost_before, cost_after),
                        stop_error(response.stop_reason),
                    ),
                    Err(error) => (
                        None,
                        Some(format!("the prompt failed: {}", error_text(&error))),
                    ),
                };
                let limit = error.as_deref().and_then(crate::agent::protocol::usage_limit);
                if let Some(usage) = usage {
                    carried = Some(carried.map_or(usage, |sum| sum.plus(usage)));
                }
                if ending {
                    break;
                }
                if let Some(text) = steered {
                    next = Some(text);
                    continue;
                }
                flow.sink.tell(ProtocolEvent::TurnEnded {
                    usage: carried.take(),
                    error,
                    limit,
                });
            }
            if let Some(usage) = carried {
                flow.sink.tell(ProtocolEvent::TurnEnded {
                    usage: Some(usage),
                    error: None,
                    limit: None,
                });
            }
            Ok(())
        })
        .await;
    shared.show_said(true);
    if let Err(error) = result {
        shared.show(format!(
            "[crew: the Agent Client Protocol connection failed: {error}]"
        ));
        sink.tell(ProtocolEvent::Failed(error.to_string()));
    }
}

/// The task's question for a permission request: what the agent wants to do, and the answers
/// that pick each option.
fn question(request: &RequestPermissionRequest) -> String {
    let what = request
        .tool_call
        .fields
        .title
        .clone()
        .unwrap_or_else(|| request.tool_call.tool_call_id.0.to_string());
    let options: Vec<String> = request
        .options
        .iter()
        .map(|option| format!("{} ({})", option.option_id.0, option.name))
        .collect();
    format!(
        "allow {what}? answer yes or no, or one of: {}",
        options.join(", ")
    )
}

/// The option an answer picks: its id or its name, else a yes or a no by the options' kinds
/// (the narrower one first). An answer that picks nothing rejects, once.
fn choose(answer: &str, options: &[PermissionOption]) -> RequestPermissionOutcome {
    let answer = answer.trim();
    let picked = options
        .iter()
        .find(|option| {
            option.option_id.0.eq_ignore_ascii_case(answer)
                || option.name.eq_ignore_ascii_case(answer)
        })
        .or_else(|| {
            let word = answer
                .split(|c: char| !c.is_alphanumeric())
                .next()
                .unwrap_or_default()
                .to_ascii_lowercase();
            use PermissionOptionKind::{AllowAlways, AllowOnce, RejectAlways, RejectOnce};
            let kinds: &[PermissionOptionKind] = match word.as_str() {
                "yes" | "y" | "allow" | "ok" | "okay" | "approve" | "sure" | "go" => {
                    &[AllowOnce, AllowAlways]
                }
                "always" => &[AllowAlways, AllowOnce],
                "never" => &[RejectAlways, RejectOnce],
                _ => &[RejectOnce, RejectAlways],
            };
            kinds
                .iter()
                .find_map(|kind| options.iter().find(|option| option.kind == *kind))
        });
    match picked {
        Some(option) => RequestPermissionOutcome::Selected(SelectedPermissionOutcome::new(
            option.option_id.clone(),
        )),
        None => RequestPermissionOutcome::Cancelled,
    }
}

/// An error from the agent as a person reads it: its message, and its data when that is text.
fn error_text(error: &agent_client_protocol::Error) -> String {
    match error.data.as_ref().and_then(|data| data.as_str()) {
        Some(data) => format!("{}: {data}", error.message),
        None => error.message.clone(),
    }
}

/// Why a turn that did not end normally ended.
fn stop_error(reason: StopReason) -> Option<String> {
    match reason {
        StopReason::EndTurn | StopReason::Cancelled => None,
        StopReason::MaxTokens => Some("max_tokens: the model's token limit".to_owned()),
        StopReason::MaxTurnRequests => {
            Some("max_turn_requests: the agent's limit of requests in a turn".to_owned())
        }
        StopReason::Refusal => Some("refusal: the agent refused to go on".to_owned()),
        other => Some(format!("{other:?}")),
    }
}

/// What one turn cost: its tokens when the agent said (`usage` on the prompt's response), and
/// its share of the session's cost when the agent reports a cost in US dollars before and
/// after. `None` when it said neither.
fn turn_usage(
    response: &PromptResponse,
    cost_before: Option<f64>,
    cost_after: Option<f64>,
) -> Option<Usage> {
    // A session total that did not move during the turn is no report of its cost (an agent
    // that never reports one would read as $0 a turn).
    let cost = match (cost_before, cost_after) {
        (Some(before), Some(after)) if after != before => Some((after - before).max(0.0)),
        _ => None,
    };
    let tokens = response.usage.as_ref();
    if tokens.is_none() && cost.is_none() {
        return None;
    }
    let mut usage = Usage {
        cost_usd: cost,
        turns: 1,
        tokens_unknown: tokens.is_none(),
        ..Usage::default()
    };
    if let Some(tokens) = tokens {
        usage.cache_read_input_tokens = tokens.cached_read_tokens.unwrap_or(0);
        usage.cache_creation_input_tokens = tokens.cached_write_tokens.unwrap_or(0);
        usage.input_tokens = tokens.input_tokens;
        usage.output_tokens = tokens.output_tokens;
    }
    Some(usage)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> Vec<PermissionOption> {
        vec![
            PermissionOption::new("allow", "Allow once", PermissionOptionKind::AllowOnce),
            PermissionOption::new("always", "Always allow", PermissionOptionKind::AllowAlways),
            PermissionOption::new("reject", "Reject", PermissionOptionKind::RejectOnce),
        ]
    }

    fn picked(answer: &str) -> Option<String> {
        match choose(answer, &options()) {
            RequestPermissionOutcome::Selected(selected) => Some(selected.option_id.0.to_string()),
            _ => None,
        }
    }

    #[test]
    fn what_an_agent_says_is_shown_in_whole_lines_and_a_line_without_end_in_pieces() {
        let (events, mut heard) = tokio::sync::broadcast::channel(64);
        let shared = Shared {
            sink: OutputSink {
                agent_id: crew_core::AgentId::new(
                    crew_core::RunId::generate(),
                    crew_core::TaskId::parse("t").unwrap(),
                ),
                log: Arc::new(Mutex::new(None)),
                tail: Arc::default(),
                events,
                protocol: crew_core::config::Protocol::Acp,
                supervisor: None,
                acp: None,
                refusals: None,
            },
            workspace: PathBuf::from("/nowhere"),
            said: Mutex::new(String::new()),
            permission: Mutex::new(None),
            cost: Mutex::new(None),
            replaying: Mutex::new(false),
        };
        let mut shown = || {
            let mut lines = Vec::new();
            while let Ok(crate::agent::events::AgentEvent::Output { line, .. }) = heard.try_recv() {
                lines.push(line);
            }
            lines
        };
        let say = |text: &str| {
            shared.said.lock().unwrap().push_str(text);
            shared.show_said(false);
        };
        say("Hel");
        say("lo\nwor");
        assert_eq!(shown(), ["Hello"]);
        say(&"x".repeat(MAX_LINE_BYTES + 10));
        let long = shown();
        assert_eq!(long.len(), 1);
        assert!(long[0].starts_with("worxxx") && long[0].ends_with('…'));
        assert_eq!(long[0].len(), MAX_LINE_BYTES + '…'.len_utf8());
        assert!(shared.said.lock().unwrap().is_empty());
        say("end\n");
        assert_eq!(shown(), ["end"]);
    }

    #[test]
    fn an_answer_picks_an_option_by_id_name_or_a_yes_or_no() {
        assert_eq!(picked("yes").as_deref(), Some("allow"));
        assert_eq!(picked("Yes, go ahead").as_deref(), Some("allow"));
        assert_eq!(picked("always").as_deref(), Some("always"));
        assert_eq!(picked("Always allow").as_deref(), Some("always"));
        assert_eq!(picked("no").as_deref(), Some("reject"));
        assert_eq!(picked("something else").as_deref(), Some("reject"));
        assert!(matches!(
            choose("yes", &[]),
            RequestPermissionOutcome::Cancelled
        ));
    }

    #[test]
    fn a_turn_that_reports_nothing_has_no_usage_and_a_cost_alone_leaves_tokens_unknown() {
        let quiet = PromptResponse::new(agent_client_protocol::v1::schema::StopReason::EndTurn);
        // The session's total (0 at its start) never moved: no report, not a $0 turn.
        assert_eq!(turn_usage(&quiet, Some(0.0), Some(0.0)), None);
        assert_eq!(turn_usage(&quiet, None, None), None);
        let costed = turn_usage(&quiet, Some(0.0), Some(0.5)).unwrap();
        assert_eq!(costed.cost_usd, Some(0.5));
        assert!(costed.tokens_unknown);
        assert_eq!(
            costed.to_string(),
            "tokens not reported, $0.5000, 1 turn(s)"
        );
    }
}
