//! `crew serve --stdio`: crew as an Agent Client Protocol agent, for editors.
//!
//! Each ACP session is one project folder (the editor's `cwd`): its prompts start runs there,
//! and it never sees another folder's runs or agents. A prompt is `/run <team>`, `/task <id>
//! <prompt>` or plain text (one task of `[run] default_agent`); the run's tasks are the
//! session's plan, their status changes and output lines stream as agent message chunks, and
//! the prompt ends with the run (`cancelled` after `session/cancel`, which stops it gracefully
//! with the work saved). stdout carries protocol messages only; logs go to stderr.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    AgentCapabilities, CancelNotification, ContentBlock, ContentChunk, Implementation,
    InitializeRequest, InitializeResponse, ListSessionsRequest, ListSessionsResponse,
    LoadSessionRequest, LoadSessionResponse, NewSessionRequest, NewSessionResponse, PromptRequest,
    PromptResponse, SessionCapabilities, SessionId, SessionListCapabilities, SessionNotification,
    SessionUpdate, TextContent,
};
use agent_client_protocol::{
    Agent, Client, Error, JsonRpcRequest, JsonRpcResponse, Responder, Stdio, V1,
    on_receive_notification, on_receive_request,
};
use crew_core::{CancelCause, CancelRecord, Workspace};
use crew_live::{Canceller, Host};
use serde::{Deserialize, Serialize};

use crate::context::Context;
use crate::ui::Ui;
use crate::{CliError, Outcome};

mod sessions;
mod turns;

use sessions::{list_sessions, load_session, new_session};
use turns::prompt;

/// Serve the Agent Client Protocol on stdio, for editors.
///
/// Zed, JetBrains IDEs and Neovim clients run it as an agent.
///
/// Each session works in the project folder the editor names; prompts are `/run <team>`,
/// `/task <id> <prompt>`, or plain text for `[run] default_agent`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Speak ACP on stdin and stdout (the only transport so far).
    #[arg(long, required = true)]
    pub stdio: bool,
}

/// `_crew/agents`: the live agents of the session's folder (never another folder's).
#[derive(Debug, Clone, Serialize, Deserialize, JsonRpcRequest)]
#[request(method = "_crew/agents", response = CrewResult)]
#[serde(rename_all = "camelCase")]
struct ListAgents {
    session_id: String,
}

/// `_crew/steer`, `_crew/follow_up`, `_crew/stop`, `_crew/resume`: one of the folder's agents
/// (`<run>:<task>`, `<runPrefix>:<task>`, or `<task>`), with a message where it takes one.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct AgentOp {
    session_id: String,
    agent: String,
    #[serde(default)]
    message: Option<String>,
}

macro_rules! agent_op_method {
    ($name:ident, $method:literal) => {
        #[derive(Debug, Clone, Serialize, Deserialize, JsonRpcRequest)]
        #[request(method = $method, response = CrewResult)]
        #[serde(transparent)]
        struct $name(AgentOp);
    };
}
agent_op_method!(Steer, "_crew/steer");
agent_op_method!(FollowUp, "_crew/follow_up");
agent_op_method!(Stop, "_crew/stop");
agent_op_method!(Resume, "_crew/resume");

/// `_crew/diff`: the work of one of the folder's tasks, as `git diff <base>..<branch>` prints it.
#[derive(Debug, Clone, Serialize, Deserialize, JsonRpcRequest)]
#[request(method = "_crew/diff", response = CrewResult)]
#[serde(rename_all = "camelCase")]
struct Diff {
    session_id: String,
    agent: String,
}

/// What a `_crew/…` method answers: the same JSON as `crew agents … --json` and the control
/// socket.
#[derive(Debug, Clone, Serialize, Deserialize, JsonRpcResponse)]
#[serde(transparent)]
struct CrewResult(serde_json::Value);

/// A session: one project folder, at most one run at a time.
struct Session {
    ctx: Context,
    host: Option<Arc<Host>>,
    running: Option<Canceller>,
}

#[derive(Default)]
struct Sessions {
    next: u64,
    by_id: HashMap<String, Session>,
}

type Shared = Arc<Mutex<Sessions>>;

pub async fn cmd_serve(args: ServeArgs, ui: Ui) -> Result<Outcome, CliError> {
    // `--stdio` is the only transport: the flag says so, and asks nothing.
    let _ = args.stdio;
    let sessions: Shared = Arc::default();
    let on_new = sessions.clone();
    let on_prompt = sessions.clone();
    let on_cancel = sessions.clone();
    Agent
        .v1()
        .name("crew")
        .on_receive_request(
            async |request: InitializeRequest, responder, _cx| {
                responder.respond(
                    InitializeResponse::new(request.protocol_version)
                        .agent_capabilities(
                            AgentCapabilities::new()
                                .load_session(true)
                                .session_capabilities(
                                    SessionCapabilities::new().list(SessionListCapabilities::new()),
                                ),
                        )
                        .agent_info(Implementation::new("crew", env!("CARGO_PKG_VERSION"))),
                )
            },
            on_receive_request!(),
        )
        .on_receive_request(
            async move |request: NewSessionRequest, responder, _cx| match new_session(
                &on_new, &request, ui,
            ) {
                Ok(id) => responder.respond(NewSessionResponse::new(id)),
                Err(error) => responder.respond_with_error(error),
            },
            on_receive_request!(),
        )
        .on_receive_request(
            async move |request: ListSessionsRequest, responder, _cx| match list_sessions(
                &request, ui,
            ) {
                Ok(sessions) => responder.respond(ListSessionsResponse::new(sessions)),
                Err(error) => responder.respond_with_error(error),
            },
            on_receive_request!(),
        )
        .on_receive_request(
            {
                let sessions = sessions.clone();
                async move |request: LoadSessionRequest, responder, cx| match load_session(
                    &sessions, &request, ui, &cx,
                ) {
                    Ok(follow) => {
                        responder.respond(LoadSessionResponse::new())?;
                        if let Some(follow) = follow {
                            cx.spawn(follow)?;
                        }
                        Ok(())
                    }
                    Err(error) => responder.respond_with_error(error),
                }
            },
            on_receive_request!(),
        )
        .on_receive_request(
            async move |request: PromptRequest, responder, cx| {
                let sessions = on_prompt.clone();
                let connection = cx.clone();
                cx.spawn(async move {
                    match prompt(&sessions, &request, &connection).await {
                        Ok(stop) => responder.respond(PromptResponse::new(stop)),
                        Err(error) => responder.respond_with_error(error),
                    }
                })
            },
            on_receive_request!(),
        )
        .on_receive_notification(
            async move |notification: CancelNotification, _cx| {
                let canceller = on_cancel
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .by_id
                    .get(notification.session_id.0.as_ref())
                    .and_then(|session| session.running.clone());
                if let Some(canceller) = canceller {
                    tokio::spawn(async move {
                        canceller
                            .cancel(CancelRecord::by_this_process(CancelCause::Editor))
                            .await
                    });
                }
                Ok(())
            },
            on_receive_notification!(),
        )
        .on_receive_request(
            {
                let sessions = sessions.clone();
                async move |request: ListAgents, responder, cx| {
                    let ctx = session_context(&sessions, &request.session_id);
                    cx.spawn(async move {
                        // The same rows as `crew agents list --json`, of the agents as their
                        // hosts say now (a listing file may trail by a moment).
                        let listed = match ctx {
                            Ok(ctx) => {
                                let live = ctx.live_agents().await;
                                crate::commands::agents::list::rows_of(&ctx, live, false, true)
                                    .map_err(|error| invalid(error.render()))
                            }
                            Err(error) => Err(error),
                        };
                        match listed {
                            Ok((agents, unanswered)) => {
                                responder.respond(CrewResult(serde_json::json!({
                                    "agents": agents,
                                    "unanswered": unanswered,
                                })))
                            }
                            Err(error) => responder.respond_with_error(error),
                        }
                    })
                }
            },
            on_receive_request!(),
        )
        .on_receive_request(
            {
                let sessions = sessions.clone();
                async move |Steer(request), responder, cx| {
                    spawn_agent_op(&sessions, &cx, request, responder, Verb::Steer)
                }
            },
            on_receive_request!(),
        )
        .on_receive_request(
            {
                let sessions = sessions.clone();
                async move |FollowUp(request), responder, cx| {
                    spawn_agent_op(&sessions, &cx, request, responder, Verb::FollowUp)
                }
            },
            on_receive_request!(),
        )
        .on_receive_request(
            {
                let sessions = sessions.clone();
                async move |Stop(request), responder, cx| {
                    spawn_agent_op(&sessions, &cx, request, responder, Verb::Stop)
                }
            },
            on_receive_request!(),
        )
        .on_receive_request(
            {
                let sessions = sessions.clone();
                async move |Resume(request), responder, cx| {
                    spawn_agent_op(&sessions, &cx, request, responder, Verb::Resume)
                }
            },
            on_receive_request!(),
        )
        .on_receive_request(
            {
                let sessions = sessions.clone();
                async move |request: Diff, responder, _cx| match session_context(
                    &sessions,
                    &request.session_id,
                )
                .and_then(|ctx| task_diff(&ctx, &request.agent))
                {
                    Ok(diff) => responder.respond(CrewResult(diff)),
                    Err(error) => responder.respond_with_error(error),
                }
            },
            on_receive_request!(),
        )
        .connect_to(Stdio::new())
        .await
        .map_err(|error| CliError::internal(format!("the ACP connection failed: {error}")))?;
    Ok(Outcome::Success)
}

/// Sends a line of text to the session's conversation.
fn say(cx: &ConnectionTo<Client>, session_id: &SessionId, text: String) -> Result<(), Error> {
    cx.send_notification(SessionNotification::new(
        session_id.clone(),
        SessionUpdate::AgentMessageChunk(ContentChunk::new(ContentBlock::Text(TextContent::new(
            text,
        )))),
    ))
}

/// The project folder `cwd` belongs to.
fn folder(cwd: &std::path::Path, ui: Ui) -> Result<Context, Error> {
    if !cwd.is_absolute() {
        return Err(invalid(format!(
            "cwd {} is not an absolute path (ACP sessions name their folder absolutely)",
            cwd.display()
        )));
    }
    let workspace = Workspace::discover(cwd)
        .map_err(|error| invalid(format!("cwd {}: {error}", cwd.display())))?;
    Context::for_workspace(workspace, ui).map_err(|error| invalid(error.render()))
}

/// A request refused for what it asked (`-32602`), the reason in the error's message, where
/// editors show it, and in `data.message`.
fn invalid(message: impl Into<String>) -> Error {
    refused(agent_client_protocol::ErrorCode::INVALID_PARAMS, message)
}

fn refused(code: agent_client_protocol::ErrorCode, message: impl Into<String>) -> Error {
    let message: String = message.into();
    let message = message.trim_end();
    Error::new(code, message).data(serde_json::json!({ "message": message }))
}

/// `{agent_id, branch, base, patch}` of the task `spec` names in the session's folder; a task
/// whose work is on no branch says so.
fn task_diff(ctx: &Context, spec: &str) -> Result<serde_json::Value, Error> {
    let (manifest, task_id) = ctx
        .project()
        .find_task(spec)
        .map_err(|error| invalid(error.to_string()))?
        .ok_or_else(|| invalid(format!("no task '{spec}' in {}", ctx.workspace().root())))?;
    let task = manifest.task(&task_id).expect("found in this manifest");
    let found = crate::commands::diff::task_patch(ctx, &manifest, task).map_err(invalid)?;
    Ok(serde_json::json!({
        "agent_id": found.agent_id,
        "branch": found.branch,
        "base": found.base,
        "patch": found.patch,
    }))
}

/// The folder of session `id`.
fn session_context(sessions: &Shared, id: &str) -> Result<Context, Error> {
    sessions
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .by_id
        .get(id)
        .map(|session| session.ctx.clone())
        .ok_or_else(|| invalid(format!("unknown session {id}")))
}

/// What an editor does to one of its session folder's agents (`_crew/steer`, …).
#[derive(Debug, Clone, Copy)]
enum Verb {
    Steer,
    FollowUp,
    Stop,
    Resume,
}

/// Does `verb` to the agent `spec` names; the outcome as the editor gets it.
async fn act(
    project: &crew_live::Project,
    verb: Verb,
    spec: &str,
    message: Option<String>,
) -> Result<serde_json::Value, crew_live::ControlAgentError> {
    let said = message.clone().unwrap_or_default();
    let outcome = match verb {
        Verb::Steer => serde_json::to_value(project.steer(spec, said).await?),
        Verb::FollowUp => serde_json::to_value(project.follow_up(spec, said).await?),
        Verb::Stop => serde_json::to_value(project.stop(spec).await?),
        Verb::Resume => serde_json::to_value(project.resume(spec, message).await?),
    };
    Ok(outcome.unwrap_or_default())
}

/// Does `verb` to one of the session folder's agents, answering from a task of its own (a
/// stop waits out the grace period).
fn spawn_agent_op(
    sessions: &Shared,
    cx: &ConnectionTo<Client>,
    request: AgentOp,
    responder: Responder<CrewResult, V1>,
    verb: Verb,
) -> Result<(), Error> {
    let ctx = session_context(sessions, &request.session_id);
    cx.spawn(async move {
        let ctx = match ctx {
            Ok(ctx) => ctx,
            Err(error) => return responder.respond_with_error(error),
        };
        match act(ctx.project(), verb, &request.agent, request.message).await {
            Ok(outcome) => responder.respond(CrewResult(outcome)),
            Err(error) => responder.respond_with_error(invalid(error.to_string())),
        }
    })
}
