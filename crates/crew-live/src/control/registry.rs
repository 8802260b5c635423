//! The live registry: every agent a host supervises, keyed by `AgentId`, and the operations on
//! them. Every operation takes the caller's workspace; an agent of another workspace is never
//! listed, and steering, following up, stopping or resuming it is refused before it receives
//! anything.
//!
//! Handles are cheap to clone (a control sender and a status watch). No map guard is ever held
//! across an `.await`: a handle is cloned out, the guard dropped, then the operation awaited.

use std::sync::{Arc, Mutex};

use camino::Utf8PathBuf;
use dashmap::DashMap;
use serde::Serialize;
use tokio::sync::{mpsc, oneshot, watch};

use crew_core::model::{ExitRecord, Timestamp};
use crew_core::{AgentId, RunId, TaskId, WorkspaceId};

use crate::agent::error::AgentOpError;
use crate::agent::output::OutputTail;
use crate::agent::{AgentState, AgentStatus, Control, FollowUpOutcome, StopOutcome};

/// What never changes about a live agent.
#[derive(Debug)]
pub(crate) struct AgentInfo {
    pub agent_id: AgentId,
    pub workspace: WorkspaceId,
    pub agent: String,
    pub dir: Utf8PathBuf,
    pub parent: Option<TaskId>,
}

/// A cheap handle on a live agent.
#[derive(Debug, Clone)]
pub struct AgentHandle {
    pub(crate) info: Arc<AgentInfo>,
    pub(crate) control: mpsc::Sender<Control>,
    pub(crate) status: watch::Receiver<AgentStatus>,
    pub(crate) tail: Arc<Mutex<OutputTail>>,
}

/// An agent as a listing shows it (and as the control socket sends it).
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct AgentSnapshot {
    /// The agent's id.
    pub agent_id: AgentId,
    /// Its run.
    pub run_id: RunId,
    /// Its task.
    pub task_id: TaskId,
    /// The project folder it belongs to.
    pub workspace: WorkspaceId,
    /// The agent definition it runs (`claude`, `shell`, …).
    pub agent: String,
    /// Where it works.
    pub dir: Utf8PathBuf,
    /// Whether its process is alive.
    pub state: AgentState,
    /// Its process group's id.
    pub pid: Option<u32>,
    /// Which start of the agent this is, from 1.
    pub attempt: u32,
    /// When its latest process started.
    pub started_at: Timestamp,
    /// How its latest process ended.
    pub exit: Option<ExitRecord>,
    /// The question it waits on.
    pub question: Option<String>,
    /// Follow-ups waiting for the end of its turn.
    pub queued_follow_ups: usize,
    /// The last lines of its output (each capped).
    pub last_lines: Vec<String>,
    /// Whether the kernel confined its latest process.
    #[serde(default)]
    pub sandbox: Option<crew_core::SandboxState>,
    /// The task whose agent submitted this one (a lead agent's sub-task), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<TaskId>,
    /// What it is doing, as far as crew can tell.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activity: Option<crate::agent::Activity>,
    /// Tokens and cost of its starts in this host, when its protocol reports them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<crew_core::model::Usage>,
    /// With caps, what its process holds now: memory in bytes, CPU time in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub using: Option<Using>,
}

/// What a capped agent's cgroup holds now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Using {
    /// Memory, in bytes.
    pub memory: u64,
    /// CPU time of its latest process so far, in milliseconds.
    pub cpu_ms: u64,
}

impl AgentHandle {
    /// The agent's id.
    pub fn agent_id(&self) -> &AgentId {
        &self.info.agent_id
    }

    /// The project folder it belongs to.
    pub fn workspace(&self) -> &WorkspaceId {
        &self.info.workspace
    }

    /// The status now.
    pub fn status(&self) -> AgentStatus {
        self.status.borrow().clone()
    }

    /// A watch on the status, for hosts that follow it.
    pub fn watch(&self) -> watch::Receiver<AgentStatus> {
        self.status.clone()
    }

    /// The agent as a listing shows it now.
    pub fn snapshot(&self) -> AgentSnapshot {
        let status = self.status();
        let activity = status.activity();
        let last_lines = self
            .tail
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .last_lines();
        AgentSnapshot {
            agent_id: self.info.agent_id.clone(),
            run_id: self.info.agent_id.run_id().clone(),
            task_id: self.info.agent_id.task_id().clone(),
            workspace: self.info.workspace.clone(),
            agent: self.info.agent.clone(),
            dir: self.info.dir.clone(),
            state: status.state,
            pid: status.live_pid(),
            attempt: status.attempt,
            started_at: status.started_at,
            exit: status.exit,
            question: status.question,
            queued_follow_ups: status.queued_follow_ups,
            last_lines,
            sandbox: status.sandbox.map(|record| record.state),
            parent: self.info.parent.clone(),
            activity,
            using: status
                .meter
                .as_ref()
                .filter(|_| status.state == AgentState::Running)
                .and_then(|meter| meter.now())
                .map(|(memory, cpu_ms)| Using { memory, cpu_ms }),
            usage: status.usage,
        }
    }

    /// Waits until the agent's process has exited for good (queued follow-ups are delivered
    /// first) and returns the status then.
    pub async fn wait_exited(&self) -> AgentStatus {
        let mut status = self.status.clone();
        let result = status.wait_for(AgentStatus::is_exited).await;
        match result {
            Ok(status) => status.clone(),
            // The supervisor is gone: its last status is final.
            Err(_) => self.status(),
        }
    }

    /// Waits until the agent is started again after attempt `attempt` (by a resume or a
    /// follow-up). Counting attempts, not watching the state, sees a restart even when the new
    /// process has already exited again. `None` when the supervisor is gone.
    pub async fn wait_restarted(&self, attempt: u32) -> Option<AgentStatus> {
        let mut status = self.status.clone();
        status
            .wait_for(|status| status.attempt > attempt)
            .await
            .ok()
            .map(|status| status.clone())
    }

    /// Waits until a person asked more than `asked` times to stop the agent while it was not
    /// running. `None` when the supervisor is gone.
    pub async fn wait_stop_asked(&self, asked: u32) -> Option<AgentStatus> {
        let mut status = self.status.clone();
        status
            .wait_for(|status| status.stops_asked > asked)
            .await
            .ok()
            .map(|status| status.clone())
    }

    /// Waits until whether the running agent waits on a question of its own (an `acp`
    /// permission request) is other than `asking`. `None` when the supervisor is gone.
    pub async fn wait_asking(&self, asking: bool) -> Option<AgentStatus> {
        let mut status = self.status.clone();
        status
            .wait_for(|status| status.asks_alive != asking)
            .await
            .ok()
            .map(|status| status.clone())
    }

    async fn request<T>(
        &self,
        build: impl FnOnce(oneshot::Sender<T>) -> Control,
    ) -> Result<T, AgentOpError> {
        let gone = || AgentOpError::Gone {
            agent_id: self.info.agent_id.clone(),
        };
        let (reply, answer) = oneshot::channel();
        self.control.send(build(reply)).await.map_err(|_| gone())?;
        answer.await.map_err(|_| gone())
    }

    /// Sends a message to the running agent now, through its steer mode.
    pub async fn steer(&self, message: &str) -> Result<(), AgentOpError> {
        let message = message.to_owned();
        self.request(|reply| Control::Steer { message, reply })
            .await?
    }

    /// Queues a message for after the current turn, or resumes an exited agent with it.
    pub async fn follow_up(&self, message: &str) -> Result<FollowUpOutcome, AgentOpError> {
        let message = message.to_owned();
        self.request(|reply| Control::FollowUp { message, reply })
            .await?
    }

    /// Runs the task's check command in the exited agent's workspace, confined like the
    /// agent, its output to `log`, stopped after `timeout` — or by [`AgentHandle::stop`],
    /// as the agent would be.
    pub async fn check(
        &self,
        command: &str,
        log: &camino::Utf8Path,
        timeout: std::time::Duration,
    ) -> Result<crew_core::model::CheckRecord, AgentOpError> {
        let (command, log) = (command.to_owned(), log.to_owned());
        self.request(|reply| Control::Check {
            command,
            log,
            timeout,
            reply,
        })
        .await
    }

    /// Stops the agent (TERM, grace, KILL; a second stop kills at once) and reports how it
    /// ended, once it has. While its task's check runs, it stops the check.
    pub async fn stop(&self) -> Result<StopOutcome, AgentOpError> {
        self.request(|reply| Control::Stop { reply }).await
    }

    /// Restarts a stopped or finished agent in its workspace. Returns the new pid.
    pub async fn resume(&self, message: Option<&str>) -> Result<u32, AgentOpError> {
        let message = message.map(str::to_owned);
        self.request(|reply| Control::Resume { message, reply })
            .await?
    }

    /// Records a question the agent asks; the agent then waits for a follow-up.
    pub async fn ask(&self, question: &str) -> Result<(), AgentOpError> {
        let question = question.to_owned();
        self.request(|reply| Control::Ask { question, reply })
            .await?
    }

    /// Marks an exited agent as closed (its workspace is being torn down): it can no longer be
    /// resumed here. `false` when the agent runs again, in which case nothing changed.
    pub async fn close(&self) -> bool {
        self.request(|reply| Control::Close { reply })
            .await
            .unwrap_or(true)
    }
}

/// How long a question from an agent the registry does not know yet waits for it to be
/// registered: its process starts before the host records it.
const REGISTRATION_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// Every live agent of a host, across the workspaces it serves.
#[derive(Debug, Default)]
pub struct Registry {
    agents: DashMap<AgentId, AgentHandle>,
}

impl Registry {
    /// Registers an agent; `false` when one of the same id is live. A closed one (its task
    /// finished, and is now started again) gives way.
    pub(crate) fn insert(&self, handle: AgentHandle) -> bool {
        match self.agents.entry(handle.info.agent_id.clone()) {
            dashmap::mapref::entry::Entry::Occupied(mut slot) => {
                if !slot.get().status().closed {
                    return false;
                }
                slot.insert(handle);
                true
            }
            dashmap::mapref::entry::Entry::Vacant(slot) => {
                slot.insert(handle);
                true
            }
        }
    }

    /// Whether an agent of this id is registered and not closed.
    pub(crate) fn is_live(&self, agent_id: &AgentId) -> bool {
        self.agents
            .get(agent_id)
            .is_some_and(|handle| !handle.status().closed)
    }

    /// Forgets an agent (after its task is done). Its supervisor ends once it has exited.
    pub fn remove(&self, agent_id: &AgentId) -> Option<AgentHandle> {
        self.agents.remove(agent_id).map(|(_, handle)| handle)
    }

    /// The agents of `workspace`, by id. Agents of other workspaces are never listed.
    pub fn list(&self, workspace: &WorkspaceId) -> Vec<AgentSnapshot> {
        let mut handles: Vec<AgentHandle> = self
            .agents
            .iter()
            .filter(|entry| &entry.info.workspace == workspace)
            .map(|entry| entry.value().clone())
            .collect();
        handles.sort_by(|a, b| a.info.agent_id.cmp(&b.info.agent_id));
        handles.iter().map(AgentHandle::snapshot).collect()
    }

    /// How the agent `agent_id` is now, if it is registered for `workspace`.
    pub fn snapshot_in(
        &self,
        workspace: &WorkspaceId,
        agent_id: &AgentId,
    ) -> Option<AgentSnapshot> {
        let handle = self.agents.get(agent_id)?.value().clone();
        (&handle.info.workspace == workspace).then(|| handle.snapshot())
    }

    /// Every handle, whatever its workspace: for the host itself (shutdown), never for a
    /// caller acting on behalf of a workspace.
    pub fn all(&self) -> Vec<AgentHandle> {
        self.agents
            .iter()
            .map(|entry| entry.value().clone())
            .collect()
    }

    /// How many agents are registered.
    pub fn len(&self) -> usize {
        self.agents.len()
    }

    /// The agent whose latest process runs under the warden `pid`.
    pub fn agent_with_pid(&self, pid: u32) -> Option<AgentId> {
        self.agents
            .iter()
            .find(|entry| entry.status.borrow().pid == Some(pid))
            .map(|entry| entry.key().clone())
    }

    /// [`Registry::agent_with_pid`], waiting a moment for an agent that is not registered yet
    /// (its process starts before the host records it).
    pub async fn agent_with_pid_soon(&self, pid: u32) -> Option<AgentId> {
        let deadline = tokio::time::Instant::now() + REGISTRATION_GRACE;
        loop {
            if let Some(agent_id) = self.agent_with_pid(pid) {
                return Some(agent_id);
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    /// Whether no agent is registered.
    pub fn is_empty(&self) -> bool {
        self.agents.is_empty()
    }

    /// The agent the caller of `workspace` means by `spec`: `<runId>:<taskId>`,
    /// `<runPrefix>:<taskId>`, or `<taskId>` when only one run of the workspace has it.
    pub fn resolve(
        &self,
        workspace: &WorkspaceId,
        spec: &str,
    ) -> Result<AgentHandle, AgentOpError> {
        if let Ok(agent_id) = AgentId::parse(spec)
            && let Some(handle) = self
                .agents
                .get(&agent_id)
                .map(|entry| entry.value().clone())
        {
            return if &handle.info.workspace == workspace {
                Ok(handle)
            } else {
                Err(AgentOpError::ForeignWorkspace {
                    agent_id,
                    workspace: workspace.clone(),
                })
            };
        }
        let (run_prefix, task) = match spec.split_once(':') {
            Some((run, task)) => (Some(run), task),
            None => (None, spec),
        };
        let mut candidates: Vec<AgentHandle> = self
            .agents
            .iter()
            .filter(|entry| {
                let id = &entry.info.agent_id;
                &entry.info.workspace == workspace
                    && id.task_id().as_str() == task
                    && run_prefix.is_none_or(|prefix| id.run_id().as_str().starts_with(prefix))
            })
            .map(|entry| entry.value().clone())
            .collect();
        match candidates.len() {
            0 => Err(AgentOpError::NotFound {
                spec: spec.to_owned(),
                workspace: workspace.clone(),
            }),
            1 => Ok(candidates.remove(0)),
            _ => {
                let mut ids: Vec<AgentId> = candidates
                    .into_iter()
                    .map(|handle| handle.info.agent_id.clone())
                    .collect();
                ids.sort();
                Err(AgentOpError::Ambiguous {
                    spec: spec.to_owned(),
                    candidates: ids,
                })
            }
        }
    }

    /// Delivers `message` to the running agent `spec` of `workspace` now.
    pub async fn steer(
        &self,
        workspace: &WorkspaceId,
        spec: &str,
        message: &str,
    ) -> Result<AgentId, AgentOpError> {
        let handle = self.resolve(workspace, spec)?;
        handle.steer(message).await?;
        Ok(handle.info.agent_id.clone())
    }

    /// Queues `message` for the end of the turn of agent `spec` of `workspace`, or resumes it with the message when it exited.
    pub async fn follow_up(
        &self,
        workspace: &WorkspaceId,
        spec: &str,
        message: &str,
    ) -> Result<(AgentId, FollowUpOutcome), AgentOpError> {
        let handle = self.resolve(workspace, spec)?;
        let outcome = handle.follow_up(message).await?;
        Ok((handle.info.agent_id.clone(), outcome))
    }

    /// Stops agent `spec` of `workspace`: TERM, then KILL after its grace period.
    pub async fn stop(
        &self,
        workspace: &WorkspaceId,
        spec: &str,
    ) -> Result<(AgentId, StopOutcome), AgentOpError> {
        let handle = self.resolve(workspace, spec)?;
        let outcome = handle.stop().await?;
        Ok((handle.info.agent_id.clone(), outcome))
    }

    /// Starts agent `spec` of `workspace` again in its workspace, with `message` if given.
    pub async fn resume(
        &self,
        workspace: &WorkspaceId,
        spec: &str,
        message: Option<&str>,
    ) -> Result<(AgentId, u32), AgentOpError> {
        let handle = self.resolve(workspace, spec)?;
        let pid = handle.resume(message).await?;
        Ok((handle.info.agent_id.clone(), pid))
    }

    /// An agent asks a question: only the agent itself may (the id must be exact).
    pub async fn ask(
        &self,
        workspace: &WorkspaceId,
        agent_id: &AgentId,
        question: &str,
    ) -> Result<(), AgentOpError> {
        // Only an agent's own process asks, and it may ask the moment it starts: a little
        // before its host has registered it. An agent not known yet is looked up again.
        let deadline = tokio::time::Instant::now() + REGISTRATION_GRACE;
        let agent = agent_id.to_string();
        let handle = loop {
            match self.resolve(workspace, &agent) {
                Ok(handle) => break handle,
                Err(AgentOpError::NotFound { .. }) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
                Err(error) => return Err(error),
            }
        };
        handle.ask(question).await
    }
}
