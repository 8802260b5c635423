//! A prompt's turn: the team it asks for, the host that runs it in the session's folder, its
//! plan and lines as the run goes, a question the editor answers, and the summary that ends it.

use std::collections::HashMap;
use std::sync::Arc;

use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    ContentBlock, PermissionOption, PermissionOptionKind, Plan, PlanEntry, PlanEntryPriority,
    PlanEntryStatus, PromptRequest, RequestPermissionOutcome, RequestPermissionRequest, SessionId,
    SessionNotification, SessionUpdate, StopReason, ToolCallUpdate, ToolCallUpdateFields,
};
use agent_client_protocol::{Client, Error};
use crew_core::config::AdHocTeamError;
use crew_core::model::{RunManifest, TaskStatus};
use crew_core::{AgentId, Team};
use crew_live::{AgentEvent, Canceller, Host, HostEvent, HostOptions, RunSpec};

use super::{Shared, invalid, refused, say};
use crate::context::Context;

pub(super) fn plan_status(status: TaskStatus) -> PlanEntryStatus {
    match status {
        TaskStatus::Pending => PlanEntryStatus::Pending,
        status if status.is_finished() => PlanEntryStatus::Completed,
        _ => PlanEntryStatus::InProgress,
    }
}

/// Runs what the prompt asks in the session's folder, reporting as it goes; how the turn ended.
pub(super) async fn prompt(
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
pub(super) struct Question {
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
pub(super) fn team_for(ctx: &Context, text: &str) -> Result<Team, String> {
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
            AdHocTeamError::Tasks(error) => error.to_string(),
        })?;
    // An editor's prompt works beside the user's open files, not in them: in a worktree of
    // its own where the folder is a git repository (as `crew mcp` does), its work on a branch.
    if ctx.workspace().repo_root().is_some() {
        team.def.workspace_mode = Some(crew_core::WorkspaceMode::Worktree);
    }
    Ok(team)
}

/// The session's host, started on its first run.
pub(super) async fn host_of(
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

pub(super) fn set_running(sessions: &Shared, session_id: &SessionId, running: Option<Canceller>) {
    if let Some(session) = sessions
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .by_id
        .get_mut(session_id.0.as_ref())
    {
        session.running = running;
    }
}

pub(super) fn send_plan(
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
pub(super) fn summary_text(manifest: &RunManifest) -> String {
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
