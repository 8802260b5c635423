//! [`AgentHost`]: what a process hosting agents holds — the registry, the spawner thread and
//! the event stream. `crew run` has one; an editor integration has one for all its project
//! folders.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast;

use crate::agent::env::BaseEnv;
use crate::agent::error::SpawnAgentError;
use crate::agent::events::{AgentEvent, emit};
use crate::agent::{self, AgentSpec, Launcher, StopOutcome};
use crate::control::registry::{AgentHandle, AgentInfo, Registry};
use crew_sandbox::spawn::Spawner;

/// How many events a slow subscriber may fall behind before it misses some.
const EVENT_CAPACITY: usize = 4096;

/// The agents a process hosts. Cloning is cheap and shares everything. When the last clone is
/// dropped, every agent it started is killed with its process group.
#[derive(Debug, Clone)]
pub struct AgentHost {
    inner: Arc<HostInner>,
}

#[derive(Debug)]
struct HostInner {
    registry: Registry,
    launcher: Launcher,
}

impl AgentHost {
    /// Serves the own connections of the agents this host starts from now on (see
    /// [`crate::agent::OwnConnections`]): set once, by the control server that binds first.
    pub(crate) fn serve_own_connections(&self, connections: Arc<dyn crate::agent::OwnConnections>) {
        let _first_stays = self.inner.launcher.own_connections.set(connections);
    }

    /// A host whose agents draw from this process's environment. Must be called inside a
    /// tokio runtime; the spawner thread belongs to that runtime.
    pub fn new() -> std::io::Result<Self> {
        Self::with_env(BaseEnv::from_process())
    }

    /// A host whose agents draw from `env` instead.
    pub fn with_env(env: BaseEnv) -> std::io::Result<Self> {
        crew_sandbox::open_files::raise();
        crew_sandbox::temp_dirs::sweep_once();
        let spawner = Spawner::start(tokio::runtime::Handle::current())?;
        let (events, _) = broadcast::channel(EVENT_CAPACITY);
        Ok(AgentHost {
            inner: Arc::new(HostInner {
                registry: Registry::default(),
                launcher: Launcher {
                    spawner,
                    env: Arc::new(env),
                    events,
                    own_connections: Arc::default(),
                },
            }),
        })
    }

    /// Starts an agent and registers it. A program that cannot be started fails this agent
    /// only.
    pub async fn start(&self, spec: AgentSpec) -> Result<AgentHandle, SpawnAgentError> {
        if self.inner.registry.is_live(&spec.agent_id) {
            return Err(SpawnAgentError::Duplicate {
                agent_id: spec.agent_id,
            });
        }
        let info = Arc::new(AgentInfo {
            agent_id: spec.agent_id.clone(),
            workspace: spec.workspace.clone(),
            agent: spec.definition.name.clone(),
            dir: spec.dir.clone(),
            parent: spec.parent.clone(),
        });
        let started = agent::start(spec, self.inner.launcher.clone()).await?;
        let handle = AgentHandle {
            info,
            control: started.control,
            status: started.status,
            tail: started.tail,
        };
        if !self.inner.registry.insert(handle.clone()) {
            // Started twice at once under the same id: this one goes, however its stop ends.
            let _ = handle.stop().await;
            return Err(SpawnAgentError::Duplicate {
                agent_id: handle.info.agent_id.clone(),
            });
        }
        emit(
            &self.inner.launcher.events,
            AgentEvent::Started {
                agent_id: handle.info.agent_id.clone(),
                pid: handle.status().pid.unwrap_or_default(),
                attempt: 1,
            },
        );
        Ok(handle)
    }

    /// Registers an agent whose process is not running (it waits for an answer, or its host
    /// went away): it starts again in its workspace on the next follow-up or resume.
    pub fn adopt(
        &self,
        spec: AgentSpec,
        question: Option<String>,
        attempt: u32,
    ) -> Result<AgentHandle, SpawnAgentError> {
        let info = Arc::new(AgentInfo {
            agent_id: spec.agent_id.clone(),
            workspace: spec.workspace.clone(),
            agent: spec.definition.name.clone(),
            dir: spec.dir.clone(),
            parent: spec.parent.clone(),
        });
        let started = agent::start_idle(spec, self.inner.launcher.clone(), question, attempt);
        let handle = AgentHandle {
            info,
            control: started.control,
            status: started.status,
            tail: started.tail,
        };
        if self.inner.registry.insert(handle.clone()) {
            Ok(handle)
        } else {
            Err(SpawnAgentError::Duplicate {
                agent_id: handle.info.agent_id.clone(),
            })
        }
    }

    /// The agents this host runs.
    pub fn registry(&self) -> &Registry {
        &self.inner.registry
    }

    /// Status changes and output lines of every agent of this host.
    pub fn subscribe(&self) -> broadcast::Receiver<AgentEvent> {
        self.inner.launcher.events.subscribe()
    }

    /// Stops every agent of the host at once (TERM, grace, KILL) and waits for them all.
    pub async fn stop_all(&self) -> Vec<(crew_core::AgentId, StopOutcome)> {
        let handles = self.inner.registry.all();
        let stops = handles.into_iter().map(|handle| async move {
            let outcome = handle.stop().await.unwrap_or(StopOutcome::AlreadyExited);
            (handle.agent_id().clone(), outcome)
        });
        let mut outcomes = Vec::new();
        let joined: Vec<_> = stops.map(tokio::spawn).collect();
        for task in joined {
            if let Ok(outcome) = task.await {
                outcomes.push(outcome);
            }
        }
        outcomes
    }

    /// Kills every agent of the host at once: a second stop for each.
    pub async fn kill_all(&self) {
        for handle in self.inner.registry.all() {
            let handle = handle.clone();
            tokio::spawn(async move {
                // How each stop ends (stopped, already exited) changes nothing: all go.
                let _ = handle.stop().await;
            });
        }
        // The first stop sent TERM; a second one turns it into KILL.
        tokio::time::sleep(Duration::from_millis(10)).await;
        for handle in self.inner.registry.all() {
            tokio::spawn(async move {
                // How each stop ends (stopped, already exited) changes nothing: all go.
                let _ = handle.stop().await;
            });
        }
    }
}
