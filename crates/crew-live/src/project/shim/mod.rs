//! The shim: the other side of a placement (docs/distributed.md), serving the shim protocol
//! (`crew_core::shim`: `ToShim`/`FromShim`, one JSON object a line) on a connection — `crew
//! shim --stdio DIR` gives it its stdin and stdout, which a crew host elsewhere reaches
//! through ssh, a pod's attach stream, or as a child process.
//!
//! The shim is a crew host of its own in a clone it keeps under its root, one per project:
//! each `start` is a one-task run there, in a worktree of the clone on a branch of its own,
//! under crew's supervisor and sandbox as any local task. Its status changes and output lines
//! go back as they happen; steer, follow-up and stop reach its agent through the registry.
//! When the run ends, the task's branch (the teardown committed whatever the agent left) is
//! sent as a pack with its claim, and kept in the clone until the host says `release`. When
//! the connection's input closes, every run still going is cancelled gracefully: its work
//! stays on its branch in the clone. The git side of the clones is a
//! [`CloneStore`](crew_core::shim::CloneStore) (crew-worktree's), so that this crate names no
//! git. `work.rs` holds the work going both ways, `session.rs` what a session holds.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crew_core::config::{TaskDef, TeamDef};
use crew_core::model::TaskStatus;
use crew_core::shim::{FromShim, SHIM_PROTOCOL, ToShim};
use crew_core::{AgentDef, CancelCause, CancelRecord, RunId, TaskId, Team, WorkspaceMode};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::agent::events::AgentEvent;
use crate::project::host::{Canceller, Host, HostEvent, HostOptions};
use crate::project::open::Project;
use crate::project::runner::RunSpec;

mod session;
mod work;

use session::{Ended, Held, Out, Session, Tasks, refuse, unknown};
pub use session::{ProviderFor, ShimOptions};
use work::{PackBuffer, earlier_work, release, send_work};

/// Serves the shim protocol on `input` and `output` until `input` ends and every task it
/// ran has ended; each cause `cancel` receives (a TERM, a Ctrl-C) cancels the runs still going
/// (gracefully the first time, their work still sent). Whether every task it ran succeeded
/// and was released.
pub async fn serve(
    options: ShimOptions,
    input: impl AsyncRead + Unpin + Send + 'static,
    output: impl AsyncWrite + Unpin + Send + 'static,
    mut cancel: mpsc::UnboundedReceiver<CancelCause>,
) -> bool {
    let root = options.root.clone();
    let failed = Arc::new(AtomicBool::new(false));
    let (out, receive) = mpsc::unbounded_channel();
    let writer = tokio::spawn(write_messages(receive, output));
    let tasks: Tasks = Arc::default();
    let mut session: Option<Session> = None;
    let mut pack = PackBuffer::default();
    let mut lines = tokio::io::BufReader::new(input).lines();
    let mut finishing = Vec::new();
    let mut failures = 0usize;
    let stop_signals = {
        let tasks = tasks.clone();
        tokio::spawn(async move {
            while let Some(cause) = cancel.recv().await {
                cancel_all(&tasks, cause).await;
            }
        })
    };
    loop {
        let Ok(Some(line)) = lines.next_line().await else {
            break;
        };
        if line.trim().is_empty() {
            continue;
        }
        let message = match serde_json::from_str::<ToShim>(&line) {
            Ok(message) => message,
            Err(error) => {
                refuse(
                    &out,
                    None,
                    "protocol",
                    format!("not a shim message: {error}"),
                );
                continue;
            }
        };
        match message {
            ToShim::Hello { v, project } => {
                if v != SHIM_PROTOCOL {
                    refuse(
                        &out,
                        None,
                        "protocol",
                        format!("this shim speaks version {SHIM_PROTOCOL}, not {v}"),
                    );
                    continue;
                }
                let clone = root.join(clone_name(&project));
                match options.clones.open_clone(&clone) {
                    Ok(()) => {
                        // The writer ends only with the connection: no one to tell.
                        let _ = out.send(FromShim::Hello {
                            v: SHIM_PROTOCOL,
                            clone: clone.to_string(),
                        });
                        session = Some(Session {
                            clone,
                            options: options.clone(),
                            failed: failed.clone(),
                            host: None,
                            project: None,
                            ended: Ended::default(),
                        });
                    }
                    Err(error) => {
                        failures += 1;
                        refuse(
                            &out,
                            None,
                            "protocol",
                            crate::agent::error::with_causes(&*error),
                        );
                    }
                }
            }
            message => {
                let Some(session) = session.as_mut() else {
                    refuse(&out, None, "protocol", "say hello first".to_owned());
                    continue;
                };
                if let Some(finish) = handle(session, message, &out, &tasks, &mut pack).await {
                    finishing.push(finish);
                }
            }
        }
    }
    // The host is gone: its runs stop gracefully, and their work stays in the clone.
    cancel_all(&tasks, CancelCause::TransportLost).await;
    for finish in finishing {
        // A finish task that panicked sent nothing more; the count below says it failed.
        let _ = finish.await;
    }
    stop_signals.abort();
    drop(out);
    // The writer ends when the last sender goes; a closed output has nothing more to take.
    let _ = writer.await;
    // Every task it ran succeeded and was released: the host's transport says so by its exit.
    let unfinished = tasks
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .len();
    failures == 0 && unfinished == 0 && !failed.load(Ordering::Relaxed)
}

/// Cancels every run still going, for `cause`: gracefully the first time, at once after
/// (their work is committed in the clone either way).
async fn cancel_all(tasks: &Tasks, cause: CancelCause) {
    let cancellers: Vec<Canceller> = tasks
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .values()
        .filter_map(|held| held.canceller.clone())
        .collect();
    for canceller in cancellers {
        canceller.cancel(CancelRecord::by_this_process(cause)).await;
    }
}

/// One message after `hello`; a run it starts is awaited through the handle it returns.
async fn handle(
    session: &mut Session,
    message: ToShim,
    out: &Out,
    tasks: &Tasks,
    pack: &mut PackBuffer,
) -> Option<tokio::task::JoinHandle<()>> {
    match message {
        ToShim::Hello { .. } => unreachable!("answered by the caller"),
        ToShim::Pack { data } => {
            if let Err(message) = pack.push(&session.clone, &data) {
                refuse(out, None, "base", message);
            }
            None
        }
        ToShim::Base { commit } => {
            let result = pack.take().and_then(|file| {
                let imported = session
                    .options
                    .clones
                    .import_base(&session.clone, &file, &commit)
                    .map_err(|error| crate::agent::error::with_causes(&*error));
                // Its objects are in the clone's store now (or were refused): the file is spent.
                let _ = std::fs::remove_file(&file);
                imported
            });
            if let Err(message) = result {
                refuse(out, None, "base", message);
            }
            None
        }
        ToShim::Start {
            task,
            run,
            agent,
            prompt,
            base,
            from,
            env,
            resources,
            allow_uncapped,
        } => match start(
            session,
            out,
            tasks,
            task.clone(),
            run,
            // The host's values of what the agent passes: set for it here.
            AgentDef {
                env: agent.env.into_iter().chain(env).collect(),
                ..*agent
            },
            prompt,
            (base, from),
            (resources, allow_uncapped),
        )
        .await
        {
            Ok(finish) => finish,
            Err(message) => {
                refuse(out, Some(task), "start", message);
                None
            }
        },
        ToShim::Steer { task, message } => {
            control(session, out, tasks, task, Control::Steer(message)).await;
            None
        }
        ToShim::FollowUp { task, message } => {
            control(session, out, tasks, task, Control::FollowUp(message)).await;
            None
        }
        ToShim::Stop { task } => {
            control(session, out, tasks, task, Control::Stop).await;
            None
        }
        ToShim::Release { task } => {
            release(session, out, tasks, task);
            None
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn start(
    session: &mut Session,
    out: &Out,
    tasks: &Tasks,
    task: TaskId,
    run: RunId,
    agent: AgentDef,
    prompt: String,
    (base, from): (String, Option<String>),
    (resources, allow_uncapped): (crew_core::config::Resources, bool),
) -> Result<Option<tokio::task::JoinHandle<()>>, String> {
    if tasks
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .contains_key(&task)
    {
        return Err(format!("task {task} is already here; release it first"));
    }
    // The base's history, or that of the earlier work the host holds, which includes it.
    let needed = from.as_deref().unwrap_or(&base);
    let has = session.options.clones.has_commit(&session.clone, needed);
    if !has.map_err(|error| crate::agent::error::with_causes(&*error))? {
        // The writer ends only with the connection: no one to tell.
        let _ = out.send(FromShim::NeedBase {
            commit: needed.to_owned(),
        });
        return Ok(None);
    }
    let host = host_of(session, out).await?;
    let prior = match &from {
        Some(_) => None,
        None => earlier_work(session, &host, &run, &task).await?,
    };
    let start_at = from
        .clone()
        .or_else(|| prior.as_ref().map(|(_, tip)| tip.clone()))
        .unwrap_or_else(|| base.clone());
    let mut def = TeamDef::new(
        format!("shim-{run}"),
        vec![TaskDef::new(task.clone(), agent.name.clone(), prompt)],
    );
    def.workspace_mode = Some(WorkspaceMode::Worktree);
    let given: HashMap<String, AgentDef> = [(agent.name.clone(), agent.clone())].into();
    let team = Team {
        def,
        agents: [(agent.name.clone(), agent)].into_iter().collect(),
    };
    let spec = RunSpec {
        mode: Some(WorkspaceMode::Worktree),
        base: Some(start_at),
        placed_for: Some(run.clone()),
        resources,
        allow_uncapped,
        ..RunSpec::of(team)
    };
    let manifest = host
        .create(&spec)
        .await
        .map_err(|error| error.to_string())?;
    // The agent as the crew host defined it, not as a file of the clone might.
    host.runner().give_agents(&manifest.run_id, given);
    let running = host.start_run(&manifest.run_id, HashMap::new());
    tasks
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .insert(
            task.clone(),
            Held {
                run: manifest.run_id.clone(),
                canceller: Some(running.canceller()),
                kept: None,
                prior,
            },
        );
    let (out, tasks, clone) = (out.clone(), tasks.clone(), session.clone.clone());
    let (failed, clones) = (session.failed.clone(), session.options.clones.clone());
    let forwarded = session
        .ended
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .entry((manifest.run_id.clone(), task.clone()))
        .or_default()
        .clone();
    Ok(Some(tokio::spawn(async move {
        let ended = running.finish().await;
        // Its status changes and output lines first (bounded: a forwarder that lost events
        // to lag must not hold the work back).
        let _ = tokio::time::timeout(Duration::from_secs(5), forwarded.notified()).await;
        let manifest = match ended {
            Ok(manifest) => manifest,
            Err(error) => {
                failed.store(true, Ordering::Relaxed);
                refuse(&out, Some(task), "work", error.to_string());
                return;
            }
        };
        let Some(record) = manifest.task(&task) else {
            return;
        };
        if record.status != TaskStatus::Succeeded {
            failed.store(true, Ordering::Relaxed);
        }
        // The writer ends only with the connection: no one to tell.
        let _ = out.send(FromShim::Finished {
            task: task.clone(),
            status: record.status,
            reason: record.reason.clone(),
            exit: record.exit.clone(),
        });
        let kept = record
            .teardown
            .as_ref()
            .and_then(|teardown| teardown.branch.clone().zip(teardown.tip.clone()));
        let sent = send_work(&clones, &clone, &out, &task, &base, kept.as_ref()).await;
        if let Some(held) = tasks
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get_mut(&task)
        {
            held.canceller = None;
            held.kept = kept;
        }
        if let Err(message) = sent {
            failed.store(true, Ordering::Relaxed);
            refuse(&out, Some(task), "work", message);
        }
    })))
}

/// The host of the session's clone, started at the first task: it forwards what happens to
/// each task (status changes, output lines) as it happens.
async fn host_of(session: &mut Session, out: &Out) -> Result<Arc<Host>, String> {
    if let Some(host) = &session.host {
        return Ok(host.clone());
    }
    let provider = session.options.provider.clone();
    let project = Project::open(session.clone.as_std_path(), |config| provider(config))
        .map_err(|error| error.to_string())?;
    let host = Host::start(
        &project,
        HostOptions {
            label: "crew shim".to_owned(),
            crew_dir: session.options.crew_dir.clone(),
        },
    )
    .await
    .map(Arc::new)
    .map_err(|error| error.to_string())?;
    let mut events = host.events();
    // Weak: the host lives as long as the process, and the writer must see the last sender go.
    let out = out.downgrade();
    let ended = session.ended.clone();
    tokio::spawn(async move {
        while let Some(event) = events.next().await {
            let Ok(event) = event else { continue };
            let Some(out) = out.upgrade() else { break };
            let over = forward(&out, event);
            if let Some((run, task)) = over {
                // Whatever the agent printed was queued before its task ended: it goes out
                // before `finished`, which waits for this.
                while let Some(event) = events.try_next() {
                    forward(&out, event);
                }
                ended
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .entry((run, task))
                    .or_default()
                    .notify_one();
            }
        }
    });
    session.host = Some(host.clone());
    session.project = Some(project);
    Ok(host)
}

/// Sends what `event` says of a task; the run and task whose status it ended, if it did.
fn forward(out: &Out, event: HostEvent) -> Option<(RunId, TaskId)> {
    match event {
        HostEvent::Task(change) => {
            if change.status == TaskStatus::Running
                && let Some(workspace) = change
                    .task
                    .as_ref()
                    .and_then(|task| task.workspace.as_ref())
            {
                // The writer ends only with the connection: no one to tell.
                let _ = out.send(FromShim::Started {
                    task: change.task_id.clone(),
                    run: change.run_id.clone(),
                    dir: workspace.dir.to_string(),
                    branch: workspace.branch.clone(),
                });
            }
            let over = change
                .status
                .is_finished()
                .then(|| (change.run_id.clone(), change.task_id.clone()));
            // The writer ends only with the connection: no one to tell.
            let _ = out.send(FromShim::Status {
                task: change.task_id,
                status: change.status,
                reason: change.reason,
            });
            over
        }
        HostEvent::Agent(agent) => {
            if let AgentEvent::Output { agent_id, line, .. } = *agent {
                // The writer ends only with the connection: no one to tell.
                let _ = out.send(FromShim::Output {
                    task: agent_id.task_id().clone(),
                    line,
                });
            }
            None
        }
        HostEvent::Activity(_) => None,
    }
}

enum Control {
    Steer(String),
    FollowUp(String),
    Stop,
}

async fn control(session: &Session, out: &Out, tasks: &Tasks, task: TaskId, what: Control) {
    let run = tasks
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .get(&task)
        .map(|held| held.run.clone());
    let (Some(run), Some(host)) = (run, session.host.as_ref()) else {
        unknown(out, &task);
        return;
    };
    let registry = host.runner().host().registry();
    let workspace = host.runner().store().workspace().clone();
    let agent = format!("{run}:{task}");
    // A task whose agent is starting is not in the registry yet (its first lines may already
    // have gone out): the message waits for it a little, as a user's would.
    let started_by = tokio::time::Instant::now() + Duration::from_secs(10);
    let done = loop {
        let done = match &what {
            Control::Steer(message) => registry
                .steer(&workspace, &agent, message)
                .await
                .map(|_| ()),
            Control::FollowUp(message) => registry
                .follow_up(&workspace, &agent, message)
                .await
                .map(|_| ()),
            Control::Stop => registry.stop(&workspace, &agent).await.map(|_| ()),
        };
        let starting = matches!(
            done,
            Err(crate::agent::error::AgentOpError::NotFound { .. })
        ) && tasks
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(&task)
            .is_some_and(|held| held.canceller.is_some());
        if !starting || tokio::time::Instant::now() > started_by {
            break done;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    if let Err(error) = done {
        refuse(out, Some(task), "control", error.to_string());
    }
}

/// The directory of a project's clone under the shim's root: readable, and distinct for
/// distinct project ids (an FNV-1a hash of the whole id follows the folder's name).
fn clone_name(project: &str) -> String {
    let hash = crew_core::ids::stable_hash(project);
    let name = project
        .rsplit('/')
        .find(|part| !part.is_empty())
        .unwrap_or("project");
    format!("{}-{hash:016x}", crew_core::safe_segment(name))
}

async fn write_messages(
    mut receive: mpsc::UnboundedReceiver<FromShim>,
    mut stdout: impl AsyncWrite + Unpin,
) {
    while let Some(message) = receive.recv().await {
        let mut line = serde_json::to_vec(&message).expect("a shim message serializes");
        line.push(b'\n');
        if stdout.write_all(&line).await.is_err() || stdout.flush().await.is_err() {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::clone_name;

    #[test]
    fn each_project_gets_a_clone_of_its_own() {
        let a = clone_name("/home/u/app");
        assert!(a.starts_with("app-"), "{a}");
        assert_ne!(a, clone_name("/srv/app"));
        assert_eq!(a, clone_name("/home/u/app"));
        assert!(!clone_name("/").contains('/'));
    }
}
