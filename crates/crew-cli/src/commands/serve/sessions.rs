//! The editor's sessions: listed (one per run of the folder), loaded (a run's record and its
//! events replayed, then followed while it goes on) and made new.

use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    ListSessionsRequest, LoadSessionRequest, NewSessionRequest, PlanEntryStatus, SessionId,
    SessionInfo,
};
use agent_client_protocol::{Client, Error};

use super::turns::{plan_status, send_plan, summary_text};
use super::{Session, Shared, folder, invalid, say};
use crate::ui::Ui;

/// A session id that names a run of the folder: `run:<runId>`.
pub(super) const RUN_SESSION_PREFIX: &str = "run:";

/// The runs of the folder `cwd` names, newest first, each a session `session/load` takes up.
pub(super) fn list_sessions(
    request: &ListSessionsRequest,
    ui: Ui,
) -> Result<Vec<SessionInfo>, Error> {
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
pub(super) fn load_session(
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
pub(super) fn event_line(event: &crew_core::model::RunEvent) -> Option<String> {
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
            "network: {} refused{}",
            match host.is_empty() {
                true => "a request".to_owned(),
                false => format!("{host}:{port}"),
            },
            reason
                .as_deref()
                .map(|reason| format!(" ({reason})"))
                .unwrap_or_default()
        ),
    };
    Some(format!("{subject} {what}\n"))
}

pub(super) fn with_reason(status: &str, reason: Option<&str>) -> String {
    match reason {
        Some(reason) => format!("{status}: {reason}"),
        None => status.to_owned(),
    }
}

/// A session in the project folder the editor names.
pub(super) fn new_session(
    sessions: &Shared,
    request: &NewSessionRequest,
    ui: Ui,
) -> Result<SessionId, Error> {
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
