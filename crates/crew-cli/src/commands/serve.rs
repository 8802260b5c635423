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
    LoadSessionRequest, LoadSessionResponse, NewSessionRequest, NewSessionResponse,
    PermissionOption, PermissionOptionKind, Plan, PlanEntry, PlanEntryPriority, PlanEntryStatus,
    PromptRequest, PromptResponse, RequestPermissionOutcome, RequestPermissionRequest,
    SessionCapabilities, SessionId, SessionInfo, SessionListCapabilities, SessionNotification,
    SessionUpdate, StopReason, TextContent, ToolCallUpdate, ToolCallUpdateFields,
};
use agent_client_protocol::{
    Agent, Client, Error, JsonRpcRequest, JsonRpcResponse, Responder, Stdio, V1,
    on_receive_notification, on_receive_request,
};
use crew_core::config::AdHocTeamError;
use crew_core::model::{RunManifest, TaskStatus};
use crew_core::{AgentId, CancelCause, CancelRecord, Team, Workspace};
use crew_live::{AgentEvent, Canceller, Host, HostEvent, HostOptions, RunSpec};
use serde::{Deserialize, Serialize};

use crate::context::Context;
use crate::ui::Ui;
use crate::{CliError, Outcome};

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

/// A session id that names a run of the folder: `run:<runId>`.
const RUN_SESSION_PREFIX: &str = "run:";

/// The runs of the folder `cwd` names, newest first, each a session `session/load` takes up.
fn list_sessions(request: &ListSessionsRequest, ui: Ui) -> Result<Vec<SessionInfo>, Error> {
    let Some(cwd) = &request.cwd else {
        return Ok(Vec::new());
    };
    let ctx = folder(cwd, ui)?;
    let root = ctx.workspace().root().to_owned();
    let manifests = ctx.manifests().map_err(|error| invalid(error.render()))?;
    Ok(manifests
        .into_iter()
        .map(|manifest| {
            let title = format!(
                "{} — {}",
                manifest.team.as_deref().unwrap_or("run"),
                manifest.status
            );
            SessionInfo::new(
                format!("{RUN_SESSION_PREFIX}{}", manifest.run_id),
                root.as_std_path(),
            )
            .title(title)
            .updated_at(manifest.updated_at.to_string())
        })
        .collect())
}

/// Takes up a run of the folder as a session: its plan and recorded events are replayed, and a
/// run still going is followed (the returned task) until it ends.
fn load_session(
    sessions: &Shared,
    request: &LoadSessionRequest,
    ui: Ui,
    cx: &ConnectionTo<Client>,
) -> Result<Option<impl std::future::Future<Output = Result<(), Error>> + Send + 'static>, Error> {
    let id = request.session_id.0.to_string();
    let ctx = folder(&request.cwd, ui)?;
    let run_id = id
        .strip_prefix(RUN_SESSION_PREFIX)
        .and_then(|run| crew_core::RunId::parse(run).ok())
        .ok_or_else(|| {
            invalid(format!(
                "unknown session {id}: crew's sessions to load are `run:<runId>`"
            ))
        })?;
    // Only this folder's runs are there to be found.
    let manifest = ctx
        .store()
        .read_run(&run_id)
        .map_err(|_| invalid(format!("no run {run_id} in {}", ctx.workspace().root())))?;
    let session_id = request.session_id.clone();
    let plan: Vec<(String, PlanEntryStatus)> = manifest
        .tasks
        .iter()
        .map(|task| (task.id.to_string(), plan_status(task.status)))
        .collect();
    send_plan(cx, &session_id, &plan)?;
    let (events, offset) = ctx
        .store()
        .read_events_since(&run_id, 0)
        .map_err(|error| invalid(error.to_string()))?;
    for event in &events {
        if let Some(line) = event_line(event) {
            say(cx, &session_id, line)?;
        }
    }
    let live = manifest.status == crew_core::RunStatus::Running;
    sessions
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .by_id
        .insert(
            id,
            Session {
                ctx: ctx.clone(),
                host: None,
                running: None,
            },
        );
    if !live {
        say(cx, &session_id, summary_text(&manifest))?;
        return Ok(None);
    }
    let cx = cx.clone();
    Ok(Some(async move {
        let mut events = ctx.project().follow_run(&run_id, offset);
        loop {
            match events.next().await {
                Ok(Some(batch)) => {
                    for event in &batch {
                        if let Some(line) = event_line(event) {
                            say(&cx, &session_id, line)?;
                        }
                    }
                }
                Ok(None) => break,
                // Its record cannot be read any more: nothing more to show.
                Err(_) => return Ok(()),
            }
        }
        if let Ok(manifest) = ctx.store().read_run(&run_id) {
            say(&cx, &session_id, summary_text(&manifest))?;
        }
        Ok(())
    }))
}

/// One recorded event as a line of the conversation; `None` for what is too fine for it (a
/// network request let through).
fn event_line(event: &crew_core::model::RunEvent) -> Option<String> {
    use crew_core::model::EventKind;
    let subject = event.task.as_ref().map_or("run", |task| task.as_str());
    let what = match &event.kind {
        EventKind::RunCreated => "created".to_owned(),
        EventKind::RunStatus { status, reason } => with_reason(status.as_str(), reason.as_deref()),
        EventKind::TaskStatus { status, reason } => with_reason(status.as_str(), reason.as_deref()),
        EventKind::Message { text } => text.clone(),
        EventKind::CancelRequested { by } => format!("cancel requested {by}"),
        EventKind::Usage { usage } => format!("usage: {usage}"),
        EventKind::Overlap { with, files } => {
            format!("would conflict with {with} in {}", files.join(", "))
        }
        EventKind::Network { allowed: true, .. } => return None,
        EventKind::Network {
            host, port, reason, ..
        } => format!(
            "network: {host}:{port} refused{}",
            reason
                .as_deref()
                .map(|reason| format!(" ({reason})"))
                .unwrap_or_default()
        ),
    };
    Some(format!("{subject} {what}\n"))
}

fn with_reason(status: &str, reason: Option<&str>) -> String {
    match reason {
        Some(reason) => format!("{status}: {reason}"),
        None => status.to_owned(),
    }
}

fn plan_status(status: TaskStatus) -> PlanEntryStatus {
    match status {
        TaskStatus::Pending => PlanEntryStatus::Pending,
        status if status.is_finished() => PlanEntryStatus::Completed,
        _ => PlanEntryStatus::InProgress,
    }
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

/// A session in the project folder the editor names.
fn new_session(sessions: &Shared, request: &NewSessionRequest, ui: Ui) -> Result<SessionId, Error> {
    let ctx = folder(&request.cwd, ui)?;
    let mut sessions = sessions
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    sessions.next += 1;
    let id = format!("crew-{}-{}", std::process::id(), sessions.next);
    sessions.by_id.insert(
        id.clone(),
        Session {
            ctx,
            host: None,
            running: None,
        },
    );
    Ok(SessionId::new(id))
}

/// Runs what the prompt asks in the session's folder, reporting as it goes; how the turn ended.
async fn prompt(
    sessions: &Shared,
    request: &PromptRequest,
    cx: &ConnectionTo<Client>,
) -> Result<StopReason, Error> {
    let session_id = request.session_id.clone();
    let text: String = request
        .prompt
        .iter()
        .filter_map(|block| match block {
            ContentBlock::Text(text) => Some(text.text.as_str()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n");
    let ctx = {
        let sessions = sessions
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let session = sessions
            .by_id
            .get(session_id.0.as_ref())
            .ok_or_else(|| invalid(format!("unknown session {}", session_id.0)))?;
        if session.running.is_some() {
            return Err(refused(
                agent_client_protocol::ErrorCode::INVALID_REQUEST,
                "this session's run is still going: cancel it or wait",
            ));
        }
        session.ctx.clone()
    };
    let say = |text: String| say(cx, &session_id, text);
    let team = match team_for(&ctx, text.trim()) {
        Ok(team) => team,
        Err(message) => {
            say(format!("{message}\n"))?;
            return Ok(StopReason::EndTurn);
        }
    };
    let host = host_of(sessions, &session_id, &ctx).await?;
    let manifest = host.create(&RunSpec::of(team)).await.map_err(|error| {
        Error::internal_error()
            .data(serde_json::json!({ "message": error.to_string(), "hint": error.hint() }))
    })?;
    let mut plan: Vec<(String, PlanEntryStatus)> = manifest
        .tasks
        .iter()
        .map(|task| (task.id.to_string(), PlanEntryStatus::Pending))
        .collect();
    send_plan(cx, &session_id, &plan)?;
    say(format!(
        "run {} started: {} task(s)\n",
        manifest.run_id,
        plan.len()
    ))?;
    let mut events = host.events();
    let running = host.start_run(&manifest.run_id, HashMap::new());
    set_running(sessions, &session_id, Some(running.canceller()));
    let mut finish = std::pin::pin!(running.finish());
    let finished = loop {
        tokio::select! {
            biased;
            Some(event) = events.next() => match event {
                Ok(HostEvent::Task(change)) if change.run_id == manifest.run_id => {
                    let status = plan_status(change.status);
                    if let Some(entry) = plan.iter_mut().find(|(id, _)| *id == change.task_id.as_str()) {
                        entry.1 = status;
                    }
                    send_plan(cx, &session_id, &plan)?;
                    if change.status == TaskStatus::Waiting {
                        // Asked away from the loop: the run's events go on meanwhile.
                        let question = Question {
                            cx: cx.clone(),
                            session_id: session_id.clone(),
                            host: host.clone(),
                            agent_id: AgentId::new(change.run_id.clone(), change.task_id.clone()),
                            text: change.reason.clone().unwrap_or_default(),
                        };
                        tokio::spawn(question.ask());
                    }
                    let reason = change.reason.map(|reason| format!(": {reason}")).unwrap_or_default();
                    say(format!("{} {}{reason}\n", change.task_id, change.status))?;
                }
                Ok(HostEvent::Agent(agent)) => {
                    if let AgentEvent::Output { agent_id, line, .. } = *agent
                        && agent_id.run_id() == &manifest.run_id
                    {
                        say(format!("[{}] {line}\n", agent_id.task_id()))?;
                    }
                }
                _ => {}
            },
            result = &mut finish => {
                crate::foreground::after_run(&ctx, result.as_ref().ok());
                break result;
            }
        }
    };
    set_running(sessions, &session_id, None);
    let finished = finished.map_err(|error| {
        Error::internal_error().data(serde_json::json!({ "message": error.to_string() }))
    })?;
    say(summary_text(&finished))?;
    Ok(
        if finished.cancelled_by.is_some() && finished.status == crew_core::RunStatus::Cancelled {
            StopReason::Cancelled
        } else {
            StopReason::EndTurn
        },
    )
}

/// A task's agent asked (`crew ask`): the editor is asked for permission, and the option the
/// person picks (`yes` or `no`) is the answer the agent resumes with. A request the editor
/// cancels leaves the agent waiting, as a question nobody answered.
struct Question {
    cx: ConnectionTo<Client>,
    session_id: SessionId,
    host: Arc<Host>,
    agent_id: AgentId,
    text: String,
}

impl Question {
    async fn ask(self) {
        let options = vec![
            PermissionOption::new("yes", "yes", PermissionOptionKind::AllowOnce),
            PermissionOption::new("no", "no", PermissionOptionKind::RejectOnce),
        ];
        let call = ToolCallUpdate::new(
            format!("ask-{}", self.agent_id),
            ToolCallUpdateFields::new().title(format!(
                "{} asks: {}",
                self.agent_id.task_id(),
                self.text
            )),
        );
        let request = RequestPermissionRequest::new(self.session_id.clone(), call, options);
        let Ok(response) = self.cx.send_request(request).block_task().await else {
            return;
        };
        let RequestPermissionOutcome::Selected(selected) = response.outcome else {
            return;
        };
        let answer = selected.option_id.0.to_string();
        if let Err(error) = self.host.follow_up(&self.agent_id, &answer).await {
            tracing::warn!(agent = %self.agent_id, %error, "the answer did not reach the agent");
        }
    }
}

/// The team a prompt asks for: `/run <team>`, `/task <id> <prompt>`, or plain text for the
/// default agent. The message says what to write instead.
fn team_for(ctx: &Context, text: &str) -> Result<Team, String> {
    let config = ctx.config_dir();
    if let Some(name) = text.strip_prefix("/run ") {
        return config
            .load_team(name.trim())
            .map_err(|error| error.to_string());
    }
    let (id, prompt, named) = match text.strip_prefix("/task ") {
        Some(rest) => match rest.trim().split_once(char::is_whitespace) {
            Some((id, prompt)) => (id.to_owned(), prompt.trim().to_owned(), true),
            None => return Err("write it as `/task <id> <prompt>`".to_owned()),
        },
        None => ("task".to_owned(), text.to_owned(), false),
    };
    // `/task <id> …` runs for the default agent, or, without one, for the agent `<id>` names
    // (`/task claude …`), as `crew run --agent <agent>` names its task after the agent.
    let agent = match (ctx.config().run.default_agent.clone(), named) {
        (Some(agent), _) => agent,
        (None, true) if config.load_agent(&id).is_ok() => id.clone(),
        (None, true) => return Err(format!("this project has no default agent and `{id}` names no agent: write `/task <agent> <prompt>`, or name a default with `[run] default_agent = \"<agent>\"` in .crew/config.toml")),
        (None, false) => return Err("this project has no default agent: name one with `[run] default_agent = \"<agent>\"` in .crew/config.toml, or write `/task <agent> <prompt>` or `/run <team>`".to_owned()),
    };
    let mut team = config
        .ad_hoc_team(&agent, vec![(id, prompt)])
        .map_err(|error| match error {
            AdHocTeamError::Agent(error) => error.to_string(),
            AdHocTeamError::Tasks(message) => message,
        })?;
    // An editor's prompt works beside the user's open files, not in them: in a worktree of
    // its own where the folder is a git repository (as `crew mcp` does), its work on a branch.
    if ctx.workspace().repo_root().is_some() {
        team.def.workspace_mode = Some(crew_core::WorkspaceMode::Worktree);
    }
    Ok(team)
}

/// The session's host, started on its first run.
async fn host_of(
    sessions: &Shared,
    session_id: &SessionId,
    ctx: &Context,
) -> Result<Arc<Host>, Error> {
    let existing = sessions
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .by_id
        .get(session_id.0.as_ref())
        .and_then(|session| session.host.clone());
    if let Some(host) = existing {
        return Ok(host);
    }
    let crew_dir = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(std::path::Path::to_path_buf));
    let host = Host::start(
        ctx.project(),
        HostOptions {
            label: "crew serve".to_owned(),
            crew_dir,
        },
    )
    .await
    .map(Arc::new)
    .map_err(|error| {
        Error::internal_error().data(serde_json::json!({ "message": error.to_string() }))
    })?;
    if let Some(session) = sessions
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .by_id
        .get_mut(session_id.0.as_ref())
    {
        session.host = Some(host.clone());
    }
    Ok(host)
}

fn set_running(sessions: &Shared, session_id: &SessionId, running: Option<Canceller>) {
    if let Some(session) = sessions
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .by_id
        .get_mut(session_id.0.as_ref())
    {
        session.running = running;
    }
}

fn send_plan(
    cx: &ConnectionTo<Client>,
    session_id: &SessionId,
    plan: &[(String, PlanEntryStatus)],
) -> Result<(), Error> {
    let entries = plan
        .iter()
        .map(|(id, status)| PlanEntry::new(id.clone(), PlanEntryPriority::Medium, status.clone()))
        .collect();
    cx.send_notification(SessionNotification::new(
        session_id.clone(),
        SessionUpdate::Plan(Plan::new(entries)),
    ))
}

/// Where each task's work is, as the end of the turn says it.
fn summary_text(manifest: &RunManifest) -> String {
    let mut text = format!("run {} {}\n", manifest.run_id, manifest.status);
    for task in &manifest.tasks {
        let place = task
            .teardown
            .as_ref()
            .and_then(|report| {
                report.branch.clone().or_else(|| {
                    report
                        .preserved
                        .as_ref()
                        .map(|kept| format!("kept at {kept}"))
                })
            })
            .unwrap_or_else(|| "no changes".to_owned());
        text.push_str(&format!("{}: {} — {place}\n", task.id, task.status));
    }
    text
}
