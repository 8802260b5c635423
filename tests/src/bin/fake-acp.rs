//! A stand-in agent that speaks the Agent Client Protocol, built with the protocol's Rust SDK
//! (`agent-client-protocol`, its `Agent` role), for tests of `protocol = "acp"`. It knows
//! nothing of crew: it is driven only through the protocol.
//!
//! - `initialize` says it can load sessions; `session/new` starts `acp-<pid>`; `session/load`
//!   takes up a session it saved under `$FAKE_ACP_STATE` (its prompts so far), replaying them
//!   as `user_message_chunk`s, or fails when it has none.
//! - Each prompt turn reads the prompt's lines as commands, says what it does as message
//!   chunks (cut mid-line, as a streaming model does) and tool calls, and ends `end_turn` with
//!   tokens (100 in, 20 out, 50 cache reads) after a `usage_update` that puts the session's
//!   cost up by $0.01:
//!   - `write <path> <text>`: `fs/write_text_file` through the client (a relative path is
//!     taken beneath the session's `cwd`);
//!   - `read <path>`: `fs/read_text_file` through the client;
//!   - `touch <file>`: writes the file itself, in its `cwd`;
//!   - `hoard <n>`: opens `n` terminals running `sleep 600.4242` (a length no other test uses) and never
//!     releases them;
//!   - `run <shell command>`: runs `sh -c <command>` in a terminal of the client
//!     (`terminal/create`, `wait_for_exit`, `output`, `release`) and says how it ended and what
//!     it printed; `run-in <dir> <shell command>` asks for that working directory;
//!   - `ask <what>`: `session/request_permission` (allow once, allow always, reject once);
//!     `<what>.allowed` is written when allowed, and the outcome said;
//!   - `wait`: waits for `session/cancel` and ends the turn `cancelled`;
//!   - `history`: says the session's prompts so far;
//!   - `exit <code>`: exits at once, mid-turn;
//!   - `limit <seconds>`: the prompt fails with `Usage limit reached|<unix seconds>`, the
//!     reset that many seconds on (no ACP agent's limit error is documented; this is Claude
//!     Code's form);
//!   - `fail`: the program exits 1 when its input ends;
//!   - anything else: `working on: <line>`.
//! - `--garbage` prints a line that is not JSON-RPC before it serves.
//! - `--linger`: does not exit when its input ends (as claude-code-acp does not), until a
//!   signal ends it.
//! - `--no-sessions`: `session/new` fails (authentication required, as Gemini CLI's without a
//!   key), and the program exits 0 when its input ends.

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    clippy::unwrap_used,
    clippy::expect_used
)]

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    AgentCapabilities, CancelNotification, ContentBlock, ContentChunk, Cost, CreateTerminalRequest,
    EnvVariable, InitializeRequest, InitializeResponse, LoadSessionRequest, LoadSessionResponse,
    NewSessionRequest, NewSessionResponse, PermissionOption, PermissionOptionKind, PromptRequest,
    PromptResponse, ReadTextFileRequest, ReleaseTerminalRequest, RequestPermissionOutcome,
    RequestPermissionRequest, SessionId, SessionNotification, SessionUpdate, StopReason,
    TerminalOutputRequest, TextContent, ToolCall, ToolCallUpdate, ToolCallUpdateFields, Usage,
    UsageUpdate, WaitForTerminalExitRequest, WriteTextFileRequest,
};
use agent_client_protocol::{
    Agent, Client, Error, Stdio, on_receive_notification, on_receive_request,
};
use tokio::sync::Notify;

#[derive(Default)]
struct State {
    /// The session's cost so far.
    cost: f64,
    cwd: PathBuf,
    /// Told when the client cancels the turn.
    cancelled: Arc<Notify>,
}

type Shared = Arc<Mutex<State>>;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    if std::env::args().any(|arg| arg == "--garbage") {
        println!("this line is not JSON-RPC");
    }
    let no_sessions = std::env::args().any(|arg| arg == "--no-sessions");
    let state: Shared = Arc::default();
    let (on_new, on_load, on_prompt, on_cancel) =
        (state.clone(), state.clone(), state.clone(), state.clone());
    let result = Agent
        .v1()
        .name("fake-acp")
        .on_receive_request(
            async |request: InitializeRequest, responder, _cx| {
                responder.respond(
                    InitializeResponse::new(request.protocol_version)
                        .agent_capabilities(AgentCapabilities::new().load_session(true)),
                )
            },
            on_receive_request!(),
        )
        .on_receive_request(
            async move |request: NewSessionRequest, responder, _cx| {
                if no_sessions {
                    return responder.respond_with_error(
                        Error::auth_required().data(serde_json::json!("no API key")),
                    );
                }
                on_new.lock().unwrap().cwd = request.cwd.clone();
                let session = format!("acp-{}", std::process::id());
                save_history(&session, &[]);
                responder.respond(NewSessionResponse::new(session))
            },
            on_receive_request!(),
        )
        .on_receive_request(
            async move |request: LoadSessionRequest, responder, cx| {
                let Some(history) = history(&request.session_id.0) else {
                    return responder.respond_with_error(
                        Error::invalid_params().data(serde_json::json!("no such session")),
                    );
                };
                {
                    let mut state = on_load.lock().unwrap();
                    state.cwd = request.cwd.clone();
                    state.cost = 0.01 * history.len() as f64;
                }
                for prompt in &history {
                    notify(
                        &cx,
                        &request.session_id,
                        SessionUpdate::UserMessageChunk(text(prompt)),
                    )?;
                    notify(
                        &cx,
                        &request.session_id,
                        SessionUpdate::AgentMessageChunk(text(&format!("(replayed) {prompt}\n"))),
                    )?;
                }
                responder.respond(LoadSessionResponse::new())
            },
            on_receive_request!(),
        )
        .on_receive_notification(
            async move |_notification: CancelNotification, _cx| {
                on_cancel.lock().unwrap().cancelled.notify_one();
                Ok(())
            },
            on_receive_notification!(),
        )
        .on_receive_request(
            async move |request: PromptRequest, responder, cx| {
                let state = on_prompt.clone();
                let connection = cx.clone();
                cx.spawn(async move {
                    let stop = match turn(&state, &connection, &request).await {
                        Ok(stop) => stop,
                        // The prompt fails; the session goes on.
                        Err(error) => return responder.respond_with_error(error),
                    };
                    let cost = {
                        let mut state = state.lock().unwrap();
                        state.cost += 0.01;
                        state.cost
                    };
                    notify(
                        &connection,
                        &request.session_id,
                        SessionUpdate::UsageUpdate(
                            UsageUpdate::new(1000, 200_000).cost(Cost::new(cost, "USD")),
                        ),
                    )?;
                    responder.respond(
                        PromptResponse::new(stop)
                            .usage(Usage::new(170, 100, 20).cached_read_tokens(50)),
                    )
                })
            },
            on_receive_request!(),
        )
        .connect_to(Stdio::new())
        .await;
    if let Err(error) = result {
        eprintln!("fake-acp: {error}");
        std::process::exit(2);
    }
    if std::env::args().any(|arg| arg == "--linger") {
        loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
    }
    if FAIL.load(std::sync::atomic::Ordering::SeqCst) {
        std::process::exit(1);
    }
}

/// A turn asked to fail: the program exits 1 when its input ends.
static FAIL: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

async fn turn(
    state: &Shared,
    cx: &ConnectionTo<Client>,
    request: &PromptRequest,
) -> Result<StopReason, Error> {
    let session = &request.session_id;
    let prompt: String = request
        .prompt
        .iter()
        .filter_map(|block| match block {
            ContentBlock::Text(text) => Some(text.text.as_str()),
            _ => None,
        })
        .collect();
    let mut prompts = history(&session.0).unwrap_or_default();
    prompts.push(prompt.replace('\n', " / "));
    save_history(&session.0, &prompts);
    let cwd = state.lock().unwrap().cwd.clone();
    let say = |said: String| -> Result<(), Error> {
        // Cut mid-line, as a model's stream is.
        let cut = said.char_indices().nth(3).map_or(said.len(), |(at, _)| at);
        notify(
            cx,
            session,
            SessionUpdate::AgentMessageChunk(text(&said[..cut])),
        )?;
        notify(
            cx,
            session,
            SessionUpdate::AgentMessageChunk(text(&format!("{}\n", &said[cut..]))),
        )
    };
    for line in prompt
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
    {
        let (command, rest) = line.split_once(' ').unwrap_or((line, ""));
        match command {
            "write" => {
                let (path, content) = rest.split_once(' ').unwrap_or((rest, ""));
                call(cx, session, &format!("Write {path}"))?;
                let written = cx
                    .send_request(WriteTextFileRequest::new(
                        session.clone(),
                        absolute(&cwd, path),
                        content,
                    ))
                    .block_task()
                    .await;
                say(match written {
                    Ok(_) => format!("wrote {path}"),
                    Err(error) => format!("refused {path}: {}", error_text(&error)),
                })?;
            }
            "read" => {
                call(cx, session, &format!("Read {rest}"))?;
                let read = cx
                    .send_request(ReadTextFileRequest::new(
                        session.clone(),
                        absolute(&cwd, rest),
                    ))
                    .block_task()
                    .await;
                say(match read {
                    Ok(read) => format!("read {rest}: {}", read.content.trim_end()),
                    Err(error) => format!("refused {rest}: {}", error_text(&error)),
                })?;
            }
            "run" | "run-in" => {
                let (dir, script) = match command {
                    "run-in" => {
                        let (dir, script) = rest.split_once(' ').unwrap_or((rest, ""));
                        (Some(absolute(&cwd, dir)), script)
                    }
                    _ => (None, rest),
                };
                call(cx, session, &format!("Run {script}"))?;
                say(format!(
                    "ran `{script}`: {}",
                    run_in_terminal(cx, session, dir, script).await
                ))?;
            }
            "hoard" => {
                // Terminals never released: the client says how many it holds.
                let mut refusal = None;
                for _ in 0..rest.parse::<usize>().unwrap_or(1) {
                    let create = CreateTerminalRequest::new(session.clone(), "sleep")
                        .args(vec!["600.4242".to_owned()]);
                    if let Err(error) = cx.send_request(create).block_task().await {
                        refusal = Some(error_text(&error));
                        break;
                    }
                }
                say(format!(
                    "hoarded: {}",
                    refusal.unwrap_or_else(|| "all".to_owned())
                ))?;
            }
            "touch" => {
                std::fs::write(cwd.join(rest), "touched by the agent\n").unwrap();
                say(format!("touched {rest}"))?;
            }
            "ask" => {
                call(cx, session, &format!("Ask {rest}"))?;
                say(format!("about to {rest}"))?;
                let options = vec![
                    PermissionOption::new("allow", "Allow once", PermissionOptionKind::AllowOnce),
                    PermissionOption::new(
                        "always",
                        "Allow always",
                        PermissionOptionKind::AllowAlways,
                    ),
                    PermissionOption::new("reject", "Reject", PermissionOptionKind::RejectOnce),
                ];
                let call = ToolCallUpdate::new(
                    format!("ask-{rest}"),
                    ToolCallUpdateFields::new().title(rest.to_owned()),
                );
                let answered = cx
                    .send_request(RequestPermissionRequest::new(
                        session.clone(),
                        call,
                        options,
                    ))
                    .block_task()
                    .await?;
                let outcome = match answered.outcome {
                    RequestPermissionOutcome::Selected(selected) => {
                        selected.option_id.0.to_string()
                    }
                    _ => "cancelled".to_owned(),
                };
                if outcome == "allow" || outcome == "always" {
                    std::fs::write(cwd.join(format!("{rest}.allowed")), format!("{outcome}\n"))
                        .unwrap();
                }
                say(format!("permission for {rest}: {outcome}"))?;
                if outcome == "cancelled" {
                    return Ok(StopReason::Cancelled);
                }
            }
            "wait" => {
                say("waiting for a steer".to_owned())?;
                let cancelled = state.lock().unwrap().cancelled.clone();
                cancelled.notified().await;
                return Ok(StopReason::Cancelled);
            }
            "history" => say(format!("history: {}", prompts.join(" | ")))?,
            "exit" => std::process::exit(rest.parse().unwrap_or(1)),
            "limit" => {
                let resets = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_secs()
                    + rest.parse::<u64>().unwrap_or(3600);
                return Err(Error::internal_error()
                    .data(serde_json::json!(format!("Usage limit reached|{resets}"))));
            }
            "fail" => {
                FAIL.store(true, std::sync::atomic::Ordering::SeqCst);
                say("will fail when the session ends".to_owned())?;
            }
            _ => say(format!("working on: {line}"))?,
        }
    }
    Ok(StopReason::EndTurn)
}

/// Runs `sh -c <script>` in a terminal of the client: how it ended and what it printed, or why
/// the client refused.
async fn run_in_terminal(
    cx: &ConnectionTo<Client>,
    session: &SessionId,
    dir: Option<PathBuf>,
    script: &str,
) -> String {
    let create = CreateTerminalRequest::new(session.clone(), "sh")
        .args(vec!["-c".to_owned(), script.to_owned()])
        .env(vec![EnvVariable::new("FAKE_ACP_TERMINAL", "yes")])
        .cwd(dir);
    let terminal = match cx.send_request(create).block_task().await {
        Ok(created) => created.terminal_id,
        Err(error) => return format!("refused: {}", error_text(&error)),
    };
    let exited = cx
        .send_request(WaitForTerminalExitRequest::new(
            session.clone(),
            terminal.clone(),
        ))
        .block_task()
        .await
        .unwrap();
    let output = cx
        .send_request(TerminalOutputRequest::new(
            session.clone(),
            terminal.clone(),
        ))
        .block_task()
        .await
        .unwrap();
    cx.send_request(ReleaseTerminalRequest::new(session.clone(), terminal))
        .block_task()
        .await
        .unwrap();
    let how = match (exited.exit_status.exit_code, exited.exit_status.signal) {
        (Some(code), _) => format!("exit {code}"),
        (None, Some(signal)) => signal,
        (None, None) => "unknown".to_owned(),
    };
    format!("{how}: {}", output.output.trim_end().replace('\n', " / "))
}

fn text(text: &str) -> ContentChunk {
    ContentChunk::new(ContentBlock::Text(TextContent::new(text)))
}

fn notify(
    cx: &ConnectionTo<Client>,
    session: &SessionId,
    update: SessionUpdate,
) -> Result<(), Error> {
    cx.send_notification(SessionNotification::new(session.clone(), update))
}

fn call(cx: &ConnectionTo<Client>, session: &SessionId, title: &str) -> Result<(), Error> {
    notify(
        cx,
        session,
        SessionUpdate::ToolCall(ToolCall::new(format!("call-{title}"), title)),
    )
}

fn absolute(cwd: &Path, path: &str) -> PathBuf {
    if Path::new(path).is_absolute() {
        PathBuf::from(path)
    } else {
        cwd.join(path)
    }
}

fn error_text(error: &Error) -> String {
    error
        .data
        .as_ref()
        .and_then(|data| data.as_str())
        .map_or_else(|| error.message.clone(), str::to_owned)
}

fn state_file(session: &str) -> PathBuf {
    let dir = std::env::var("FAKE_ACP_STATE").expect("FAKE_ACP_STATE names where sessions go");
    Path::new(&dir).join(session)
}

fn history(session: &str) -> Option<Vec<String>> {
    let text = std::fs::read_to_string(state_file(session)).ok()?;
    Some(text.lines().map(str::to_owned).collect())
}

fn save_history(session: &str, prompts: &[String]) {
    let text: String = prompts.iter().map(|prompt| format!("{prompt}\n")).collect();
    std::fs::write(state_file(session), text).unwrap();
}
