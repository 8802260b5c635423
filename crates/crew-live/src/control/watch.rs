//! The host's side of watching a project: `Op::Watch` on the control socket answers with the
//! caller's workspace's live agents, then streams [`WatchEvent`] lines — agents as they change,
//! their output, task changes of the runs the host executes — until the watcher hangs up. The
//! client side, merging every host's stream, is the front door's (`project::watch`).

use std::collections::HashMap;

use crew_core::model::{TaskRecord, TaskStatus};
use crew_core::{AgentId, RunId, TaskId, WorkspaceId};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::sync::broadcast;
use tokio::sync::broadcast::error::RecvError;

use crate::agent::events::AgentEvent;
use crate::control::agents::AgentHost;
use crate::control::registry::AgentSnapshot;
use crate::control::wire::{PROTOCOL_VERSION, Response};

/// A task changed status: what a host shows while a run goes on.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskProgress {
    /// The run.
    pub run_id: RunId,
    /// The task.
    pub task_id: TaskId,
    /// Its new status.
    pub status: TaskStatus,
    /// Why, when that needs saying.
    pub reason: Option<String>,
    /// The task's record as this change left it (its pid, workspace, teardown), so that a
    /// listener need not read the manifest, which may already have moved on. `None` when the
    /// change could not be saved.
    pub task: Option<TaskRecord>,
}

/// Something a host streams to a watcher, one JSON object a line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum WatchEvent {
    /// An agent started, asked, changed state or exited: how it is now.
    Agent {
        /// The agent as listings show it.
        agent: Box<AgentSnapshot>,
    },
    /// A line of an agent's output.
    Output {
        /// The agent.
        agent_id: AgentId,
        /// The line.
        line: String,
    },
    /// A task changed status: its record as the change left it.
    Task {
        /// The run.
        run_id: RunId,
        /// The task.
        task_id: TaskId,
        /// Its new status.
        status: TaskStatus,
        /// Its record as the change left it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        task: Option<Box<TaskRecord>>,
    },
    /// The watcher fell behind and missed this many events (output lines, mostly).
    Lagged {
        /// How many.
        missed: u64,
    },
}

/// A line of the stream: the protocol version and the event.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct WatchLine {
    pub(crate) v: u32,
    #[serde(flatten)]
    pub(crate) event: WatchEvent,
}

/// The task changes of the runs a host executes, for watchers of its workspace.
#[derive(Debug, Clone)]
pub(crate) struct TaskFeed {
    pub(crate) workspace: WorkspaceId,
    pub(crate) changes: broadcast::Sender<TaskProgress>,
}

/// How many events a host writes to a watcher in one go.
const BATCH: usize = 256;

/// Serves `Op::Watch` on a connection: answers with the workspace's live agents, then streams
/// [`WatchEvent`]s until the watcher hangs up or the host goes away.
pub(crate) async fn serve_watch(
    stream: UnixStream,
    host: AgentHost,
    tasks: Option<TaskFeed>,
    workspace: WorkspaceId,
    id: Option<u64>,
) {
    // Subscribed before the listing is taken: nothing happens between the two unseen.
    let mut agents = host.subscribe();
    let mut changes = tasks
        .filter(|feed| feed.workspace == workspace)
        .map(|feed| feed.changes.subscribe());
    let listing = host.registry().list(&workspace);
    let mut ours: HashMap<AgentId, bool> = listing
        .iter()
        .map(|agent| (agent.agent_id.clone(), true))
        .collect();
    let (mut read, mut write) = stream.into_split();
    let first = Response::ok(id, serde_json::json!({ "agents": listing }));
    let mut out = serde_json::to_vec(&first).unwrap_or_default();
    out.push(b'\n');
    if write.write_all(&out).await.is_err() {
        return;
    }
    let mut ignored = [0u8; 256];
    loop {
        out.clear();
        let first = tokio::select! {
            read = read.read(&mut ignored) => match read {
                // The watcher hung up. Anything it sends after its request is not read.
                Ok(0) | Err(_) => return,
                Ok(_) => continue,
            },
            event = agents.recv() => agent_line(&host, &workspace, &mut ours, event),
            change = next_change(&mut changes) => change,
        };
        let Some(first) = first else { return };
        push_line(&mut out, first);
        // What is already queued goes out with it, in one write.
        for _ in 0..BATCH {
            let event = match agents.try_recv() {
                Ok(event) => agent_line(&host, &workspace, &mut ours, Ok(event)),
                Err(broadcast::error::TryRecvError::Lagged(missed)) => {
                    agent_line(&host, &workspace, &mut ours, Err(RecvError::Lagged(missed)))
                }
                Err(_) => break,
            };
            match event {
                Some(event) => push_line(&mut out, event),
                None => return,
            }
        }
        if write.write_all(&out).await.is_err() {
            return;
        }
    }
}

/// The next task change (`Some(None)` once the runner is gone), or never when the host
/// executes no runs of this workspace.
async fn next_change(
    changes: &mut Option<broadcast::Receiver<TaskProgress>>,
) -> Option<Option<WatchEvent>> {
    let Some(receiver) = changes else {
        return std::future::pending().await;
    };
    match receiver.recv().await {
        Ok(change) => Some(Some(WatchEvent::Task {
            run_id: change.run_id,
            task_id: change.task_id,
            status: change.status,
            task: change.task.map(Box::new),
        })),
        Err(RecvError::Lagged(missed)) => Some(Some(WatchEvent::Lagged { missed })),
        Err(RecvError::Closed) => {
            // No more task changes; agents may still be watched.
            *changes = None;
            Some(None)
        }
    }
}

/// What an agent event becomes for a watcher of `workspace`: `Some(None)` when it is not for
/// them, `None` when the host is gone.
fn agent_line(
    host: &AgentHost,
    workspace: &WorkspaceId,
    ours: &mut HashMap<AgentId, bool>,
    event: Result<AgentEvent, RecvError>,
) -> Option<Option<WatchEvent>> {
    let event = match event {
        Ok(event) => event,
        Err(RecvError::Lagged(missed)) => return Some(Some(WatchEvent::Lagged { missed })),
        Err(RecvError::Closed) => return None,
    };
    let agent_id = event.agent_id().clone();
    let snapshot = || host.registry().snapshot_in(workspace, &agent_id);
    Some(match event {
        AgentEvent::Output { line, .. } => {
            let belongs = *ours
                .entry(agent_id.clone())
                .or_insert_with(|| snapshot().is_some());
            belongs.then_some(WatchEvent::Output { agent_id, line })
        }
        _ => {
            let agent = snapshot();
            ours.insert(agent_id, agent.is_some());
            agent.map(|agent| WatchEvent::Agent {
                agent: Box::new(agent),
            })
        }
    })
}

fn push_line(out: &mut Vec<u8>, event: Option<WatchEvent>) {
    let Some(event) = event else { return };
    let line = WatchLine {
        v: PROTOCOL_VERSION,
        event,
    };
    if serde_json::to_writer(&mut *out, &line).is_ok() {
        out.push(b'\n');
    }
}
