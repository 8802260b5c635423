//! One project folder opened: its configuration and state, the runs recorded there, and the
//! live agents of its hosts — only this folder's, whichever process hosts them.

use std::path::Path;
use std::sync::Arc;

use crew_core::config::{ConfigDir, LoadConfigError, ProjectConfig};
use crew_core::discovery::DiscoverWorkspaceError;
use crew_core::model::{HostRecord, RunManifest, TaskStatus};
use crew_core::provider::WorkspaceProvider;
use crew_core::store::StateError;
use crew_core::{AgentId, RunId, StateStore, TaskId, Workspace};

use crate::control::registry::AgentSnapshot;
use crate::control::{ControlClient, ControlError, ErrorCode, Op, REQUEST_TIMEOUT, Response};

/// One project folder.
#[derive(Debug, Clone)]
pub struct Project {
    workspace: Workspace,
    config: ProjectConfig,
    store: Arc<StateStore>,
    provider: Arc<dyn WorkspaceProvider>,
}

/// A project folder that could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenProjectError {
    /// The project folder could not be found.
    #[error(transparent)]
    Discover(#[from] DiscoverWorkspaceError),
    /// Its configuration could not be loaded.
    #[error(transparent)]
    Config(#[from] LoadConfigError),
}

/// An agent (or task) a person named could not be told apart or reached.
#[derive(Debug, thiserror::Error)]
pub enum FindAgentError {
    /// Several agents match.
    #[error("'{spec}' matches several agents: {}", candidates.join(", "))]
    Ambiguous {
        /// The agent as the caller named it.
        spec: String,
        /// The agents it matches.
        candidates: Vec<String>,
    },
    /// No agent matches among the hosts that answered, and some did not.
    #[error("no live agent '{spec}' found, but {} host(s) of this workspace did not answer: {}", unanswered.len(), unanswered.join("; "))]
    Unanswered {
        /// The agent as the caller named it.
        spec: String,
        /// The hosts that did not answer.
        unanswered: Vec<String>,
    },
    /// No agent matches among the hosts that answered, and some refused to list theirs to
    /// this caller (an agent, which may only ask and submit for itself).
    #[error("no live agent '{spec}' that this caller may see: {}", refused.join("; "))]
    Refused {
        /// The agent as the caller named it.
        spec: String,
        /// The hosts that refused, with their reasons.
        refused: Vec<String>,
    },
    /// The state directory could not be read.
    #[error(transparent)]
    State(#[from] StateError),
}

/// An operation on an agent that did not happen; the agent received nothing.
#[derive(Debug, thiserror::Error)]
pub enum ControlAgentError {
    /// The agent could not be found.
    #[error(transparent)]
    Find(#[from] FindAgentError),
    /// No live agent matches.
    #[error("no live agent '{spec}' in workspace {workspace}")]
    NotLive {
        /// The agent as the caller named it.
        spec: String,
        /// The project folder searched.
        workspace: crew_core::WorkspaceId,
        /// The task `spec` names, when it waits for an answer in a run no process hosts.
        waiting_in: Option<RunId>,
    },
    /// Its host could not be reached.
    #[error(transparent)]
    Host(#[from] ControlError),
    /// The host refused (see the code: `foreign_workspace`, `steer_unsupported`, …).
    #[error(transparent)]
    Refused(#[from] crate::project::verbs::refusal::Refusal),
}

/// The task `spec` names among the runs `manifests`, with its run.
fn find_task_in(
    manifests: Vec<RunManifest>,
    spec: &str,
) -> Result<Option<(RunManifest, TaskId)>, FindAgentError> {
    let mut tasks: Vec<(AgentId, RunManifest)> = Vec::new();
    for manifest in manifests {
        for task in &manifest.tasks {
            tasks.push((
                AgentId::new(manifest.run_id.clone(), task.id.clone()),
                manifest.clone(),
            ));
        }
    }
    Ok(resolve_spec(&tasks, |(id, _)| id, spec)?
        .map(|(id, manifest)| (manifest.clone(), id.task_id().clone())))
}

/// The one item `spec` names among `items`: `<runId>:<taskId>`, `<runPrefix>:<taskId>`, or a
/// bare `<taskId>` when only one run has it.
pub fn resolve_spec<'a, T>(
    items: &'a [T],
    id_of: impl Fn(&T) -> &AgentId,
    spec: &str,
) -> Result<Option<&'a T>, FindAgentError> {
    if let Some(exact) = items.iter().find(|item| id_of(item).to_string() == spec) {
        return Ok(Some(exact));
    }
    let (run_prefix, task) = match spec.split_once(':') {
        Some((run, task)) => (Some(run), task),
        None => (None, spec),
    };
    let matches: Vec<&T> = items
        .iter()
        .filter(|item| {
            let id = id_of(item);
            id.task_id().as_str() == task
                && run_prefix.is_none_or(|prefix| id.run_id().as_str().starts_with(prefix))
        })
        .collect();
    match matches.len() {
        0 => Ok(None),
        1 => Ok(Some(matches[0])),
        _ => Err(FindAgentError::Ambiguous {
            spec: spec.to_owned(),
            candidates: matches.iter().map(|item| id_of(item).to_string()).collect(),
        }),
    }
}

/// The live agents found, and the hosts that did not answer (busy, too slow): their agents
/// are missing, and whoever shows the list must say so.
#[derive(Debug, Default)]
pub struct LiveAgents {
    /// Each live agent, with the host that runs it.
    pub agents: Vec<(AgentSnapshot, HostRecord)>,
    /// Hosts that did not answer, each said in a sentence.
    pub unanswered: Vec<String>,
    /// Hosts that answered with a refusal (the caller is an agent, or another user): asking
    /// again would be refused again.
    pub refused: Vec<String>,
}

impl Project {
    /// The project folder `dir` belongs to (ARCHITECTURE.md, "Workspace identity"), with its
    /// configuration.
    /// `provider` gives the workspaces of its tasks, from that configuration.
    pub fn open(
        dir: &Path,
        provider: impl FnOnce(&ProjectConfig) -> Arc<dyn WorkspaceProvider>,
    ) -> Result<Self, OpenProjectError> {
        let workspace = Workspace::discover(dir)?;
        Ok(Self::for_workspace(workspace, provider)?)
    }

    /// [`Project::open`] for a workspace already discovered.
    pub fn for_workspace(
        workspace: Workspace,
        provider: impl FnOnce(&ProjectConfig) -> Arc<dyn WorkspaceProvider>,
    ) -> Result<Self, LoadConfigError> {
        let config = ConfigDir::new(workspace.crew_dir()).load_project_config()?;
        let store = Arc::new(StateStore::new(workspace.id(), workspace.repo_root()));
        let provider = provider(&config);
        Ok(Project {
            workspace,
            config,
            store,
            provider,
        })
    }

    /// The project folder.
    pub fn workspace(&self) -> &Workspace {
        &self.workspace
    }

    /// Its `.crew/config.toml`.
    pub fn config(&self) -> &ProjectConfig {
        &self.config
    }

    /// Its `.crew/` directory.
    pub fn config_dir(&self) -> ConfigDir {
        ConfigDir::new(self.workspace.crew_dir())
    }

    /// Its state store.
    pub fn store(&self) -> &Arc<StateStore> {
        &self.store
    }

    /// Where its tasks work.
    pub fn provider(&self) -> &Arc<dyn WorkspaceProvider> {
        &self.provider
    }

    /// Marks runs whose host died as interrupted (and kills what is left of their agents);
    /// their workspaces are told so through the provider.
    pub fn reconcile(&self) -> Result<Vec<RunId>, StateError> {
        let interrupted = crate::control::live_hosts::reconcile_workspace(&self.store)?;
        if let Some(repo_root) = self.workspace.repo_root() {
            for run_id in &interrupted {
                self.provider.run_interrupted(repo_root, run_id);
            }
        }
        Ok(interrupted)
    }

    /// Whether `run_id` is over: finished, or its host is gone (the run is then marked
    /// interrupted). What following a run (`crew events --follow`, an editor, a lead agent's
    /// `wait`) stops on.
    pub fn run_ended(&self, run_id: &RunId) -> Result<bool, StateError> {
        let glance = self.store.glance_run(run_id)?;
        if glance.status != crew_core::RunStatus::Running {
            return Ok(true);
        }
        let host_alive = glance
            .host
            .as_ref()
            .is_some_and(|host| host.identity.is_alive());
        if !host_alive {
            self.reconcile()?;
        }
        Ok(!host_alive)
    }

    /// The readable manifests of the project's runs, newest first.
    pub fn manifests(&self) -> Result<Vec<RunManifest>, StateError> {
        Ok(self
            .store
            .list_runs()?
            .into_iter()
            .filter_map(|listing| listing.manifest.ok())
            .collect())
    }

    /// One stream of what happens in the project from now on, across its hosts (see
    /// [`crate::project::watch`]), starting with the records of its `recent` newest runs.
    pub fn watch(
        &self,
        recent: usize,
    ) -> Result<crate::project::watch::ProjectWatch, crate::project::watch::WatchError> {
        crate::project::watch::start(self.store.clone(), self.workspace.id().clone(), recent)
    }

    /// The live hosts of this project, one per socket.
    pub fn live_hosts(&self) -> Vec<(RunId, HostRecord)> {
        let mut hosts = crate::control::live_hosts::live_hosts(&self.store);
        hosts.sort_by(|a, b| a.1.socket.cmp(&b.1.socket));
        hosts.dedup_by(|a, b| a.1.socket == b.1.socket);
        hosts
    }

    /// Sends `op` to the host at `socket`, as this project: the wire protocol, for crew's
    /// own verbs and for the tests that check what a host refuses. Programs use the verbs.
    #[doc(hidden)]
    pub async fn call(&self, host: &HostRecord, op: Op) -> Result<Response, ControlError> {
        let socket = host.socket.as_deref().expect("live hosts serve a socket");
        let mut client = ControlClient::connect(socket).await?;
        client.call(self.workspace.id(), op, REQUEST_TIMEOUT).await
    }

    /// The live agents of this project across its hosts, with the host of each. The hosts
    /// are asked at the same time.
    pub async fn live_agents(&self) -> LiveAgents {
        let mut live = self.ask_hosts(self.live_hosts()).await;
        live.agents = one_per_agent(live.agents);
        live
    }

    /// The live agents as their hosts last published them (within a second for output, at
    /// once for status changes), asking a host over its socket only when its listing cannot be
    /// read.
    pub async fn published_agents(&self) -> LiveAgents {
        let (mut live, unpublished) = self.read_published();
        if !unpublished.is_empty() {
            let asked = self.ask_hosts(unpublished).await;
            live.agents.extend(asked.agents);
            live.unanswered.extend(asked.unanswered);
            live.agents = one_per_agent(live.agents);
        }
        live
    }

    /// [`Project::published_agents`] without asking any host: `None` when a live host's
    /// listing cannot be read (only its socket would tell its agents). For a caller with no
    /// async runtime that answers at once or steps aside.
    pub fn published_agents_now(&self) -> Option<LiveAgents> {
        let (live, unpublished) = self.read_published();
        unpublished.is_empty().then_some(live)
    }

    /// The agents of the live hosts whose listings can be read, and the hosts whose cannot.
    /// A listing that names its writer is trusted while that host is alive and has an agent
    /// of a running run (the store's running index): no manifest is read for it. The running
    /// runs none of those listings has an agent of (a host of an older crew, a run whose
    /// agents have not started yet, a host that died) are found by their manifests, as before.
    fn read_published(&self) -> (LiveAgents, Vec<(RunId, HostRecord)>) {
        let mut live = LiveAgents::default();
        let state_dir = self.store.state_dir();
        // No listing at all: no host is live, and no run needs reading (a project with
        // thousands of finished runs answers at once).
        let Some(listings) = crate::control::publish::read_listings(state_dir) else {
            return (live, Vec::new());
        };
        let running = self.store.running_run_ids().unwrap_or_default();
        let mut sockets_read = Vec::new();
        for (path, published) in listings {
            let Some(host) = published.live_writer(state_dir, &path).cloned() else {
                continue;
            };
            if !published
                .agents
                .iter()
                .any(|agent| running.contains(&agent.run_id))
            {
                continue;
            }
            sockets_read.push(host.socket.clone());
            live.agents.extend(
                published
                    .agents
                    .into_iter()
                    .map(|agent| (agent, host.clone())),
            );
        }
        let uncovered: Vec<RunId> = running
            .into_iter()
            .filter(|run_id| !live.agents.iter().any(|(agent, _)| &agent.run_id == run_id))
            .collect();
        let mut unpublished = Vec::new();
        for (run_id, host) in crate::control::live_hosts::live_hosts_of(&self.store, &uncovered) {
            // One host may serve several runs: its listing is read once.
            if sockets_read.contains(&host.socket) {
                continue;
            }
            sockets_read.push(host.socket.clone());
            let socket = host.socket.as_deref().expect("live hosts serve a socket");
            let path = crate::control::publish::listing_path(state_dir, socket);
            match crate::control::publish::read_listing(&path, host.identity.pid) {
                Some(listed) => live
                    .agents
                    .extend(listed.into_iter().map(|agent| (agent, host.clone()))),
                None => unpublished.push((run_id, host)),
            }
        }
        live.agents = one_per_agent(live.agents);
        (live, unpublished)
    }

    /// The live agent `spec` names, with its host.
    pub async fn find_live(
        &self,
        spec: &str,
    ) -> Result<Option<(AgentSnapshot, HostRecord)>, FindAgentError> {
        let live = self.live_agents().await;
        let found = resolve_spec(&live.agents, |(agent, _)| &agent.agent_id, spec)?.cloned();
        if found.is_none() && !live.refused.is_empty() {
            return Err(FindAgentError::Refused {
                spec: spec.to_owned(),
                refused: live.refused,
            });
        }
        if found.is_none() && !live.unanswered.is_empty() {
            return Err(FindAgentError::Unanswered {
                spec: spec.to_owned(),
                unanswered: live.unanswered,
            });
        }
        Ok(found)
    }

    /// The task `spec` names among every run of the project, with its run.
    pub fn find_task(&self, spec: &str) -> Result<Option<(RunManifest, TaskId)>, FindAgentError> {
        find_task_in(self.manifests()?, spec)
    }

    /// The task an agent verb (`crew agents resume`, `follow-up`, `logs`) names when no live
    /// agent answers to `spec`: as [`Project::find_task`], but a bare task id that several
    /// runs have names the newest run's. So `crew agents stop sc` then `crew agents resume
    /// sc` act on the same agent, the one of the latest run, whether or not it is still live;
    /// an older run's is named with its run, `<runPrefix>:sc`.
    pub fn find_latest_task(
        &self,
        spec: &str,
    ) -> Result<Option<(RunManifest, TaskId)>, FindAgentError> {
        let manifests = self.manifests()?;
        if spec.contains(':') {
            return find_task_in(manifests, spec);
        }
        let newest = manifests
            .into_iter()
            .filter(|manifest| manifest.tasks.iter().any(|task| task.id.as_str() == spec))
            .max_by_key(|manifest| manifest.created_at);
        Ok(newest.map(|manifest| {
            let task_id = manifest
                .tasks
                .iter()
                .find(|task| task.id.as_str() == spec)
                .map(|task| task.id.clone())
                .expect("the newest run was chosen for having the task");
            (manifest, task_id)
        }))
    }

    /// The task with attempts (best of N) `spec` names, as `find_task` reads a spec, and the
    /// run it ran in: `fix`, `<run>:fix` for attempts `fix.1` … `fix.N`.
    pub fn find_attempted(
        &self,
        spec: &str,
    ) -> Result<Option<(RunManifest, TaskId)>, FindAgentError> {
        let mut tasks: Vec<(AgentId, RunManifest)> = Vec::new();
        for manifest in self.manifests()? {
            let mut named: Vec<&TaskId> = Vec::new();
            for task in &manifest.tasks {
                if let Some(attempt) = &task.attempt_of
                    && !named.contains(&&attempt.task)
                {
                    named.push(&attempt.task);
                }
            }
            let ids: Vec<AgentId> = named
                .into_iter()
                .map(|task| AgentId::new(manifest.run_id.clone(), task.clone()))
                .collect();
            for id in ids {
                tasks.push((id, manifest.clone()));
            }
        }
        Ok(resolve_spec(&tasks, |(id, _)| id, spec)?
            .map(|(id, manifest)| (manifest.clone(), id.task_id().clone())))
    }

    /// Sends `op` (made for the agent's exact id) to the host of the live agent `spec` names:
    /// the agent, the host that answered, and its answer (a refusal is an error). What the
    /// typed verbs ([`crate::project::verbs`]) are made of.
    pub(crate) async fn control(
        &self,
        spec: &str,
        op: impl FnOnce(String) -> Op,
    ) -> Result<(AgentSnapshot, HostRecord, Response), ControlAgentError> {
        let Some((agent, host)) = self.find_live(spec).await? else {
            let waiting_in = self
                .find_task(spec)?
                .filter(|(manifest, task_id)| {
                    manifest
                        .task(task_id)
                        .is_some_and(|task| task.status == TaskStatus::Waiting)
                })
                .map(|(manifest, _)| manifest.run_id);
            return Err(ControlAgentError::NotLive {
                spec: spec.to_owned(),
                workspace: self.workspace.id().clone(),
                waiting_in,
            });
        };
        let response = self.call(&host, op(agent.agent_id.to_string())).await?;
        if let Err(error) = &response.answer {
            return Err(ControlAgentError::Refused(error.clone().into()));
        }
        Ok((agent, host, response))
    }

    /// Asks each host for its agents over its socket, all at the same time.
    async fn ask_hosts(&self, hosts: Vec<(RunId, HostRecord)>) -> LiveAgents {
        let asked: Vec<_> = hosts
            .into_iter()
            .map(|(_, host)| {
                let workspace = self.workspace.id().clone();
                tokio::spawn(async move {
                    let socket = host.socket.clone().expect("live hosts serve a socket");
                    let response = async {
                        let mut client = ControlClient::connect(&socket).await?;
                        client.call(&workspace, Op::List, REQUEST_TIMEOUT).await
                    }
                    .await;
                    (host, response)
                })
            })
            .collect();
        let mut live = LiveAgents::default();
        for asked in asked {
            let Ok((host, response)) = asked.await else {
                continue;
            };
            let response = match response {
                Ok(response) => response,
                // Gone since its manifest was read: it has no agents to list.
                Err(ControlError::HostGone { .. }) => continue,
                Err(error) => {
                    live.unanswered
                        .push(format!("host pid {}: {error}", host.identity.pid));
                    continue;
                }
            };
            let result = match response.answer {
                Ok(result) => result,
                Err(error) => {
                    let said = format!("host pid {}: {}", host.identity.pid, error.message);
                    match error.code {
                        ErrorCode::Forbidden | ErrorCode::PermissionDenied => {
                            live.refused.push(said)
                        }
                        code => live.unanswered.push(format!("{said} ({code})")),
                    }
                    continue;
                }
            };
            let Ok(listed) = serde_json::from_value::<Vec<serde_json::Value>>(result) else {
                continue;
            };
            for value in listed {
                if let Ok(snapshot) = serde_json::from_value::<AgentSnapshot>(value) {
                    live.agents.push((snapshot, host.clone()));
                }
            }
        }
        live
    }
}

/// Sorted by agent id, each agent once (a host serving several runs lists its agents once per
/// run it was asked for).
fn one_per_agent(mut agents: Vec<(AgentSnapshot, HostRecord)>) -> Vec<(AgentSnapshot, HostRecord)> {
    agents.sort_by(|a, b| a.0.agent_id.cmp(&b.0.agent_id));
    agents.dedup_by(|a, b| a.0.agent_id == b.0.agent_id);
    agents
}
