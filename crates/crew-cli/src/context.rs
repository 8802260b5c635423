//! What every command starts from: the workspace it acts on, its configuration and state, and
//! the live hosts of that workspace.

use std::sync::Arc;
use std::time::Duration;

use crew_core::config::{ConfigDir, LoadConfigError, ProjectConfig};
use crew_core::model::{HostRecord, RunManifest};
use crew_core::store::StateError;
use crew_core::{RunId, StateStore, Workspace};
use crew_live::control::{ControlError, Op, Response};
use crew_live::{AgentSnapshot, ControlClient};

use crate::CliError;
use crate::ui::Ui;

/// How long a request to a live host may take (a stop waits for the grace period).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// The workspace a command acts on.
#[derive(Debug, Clone)]
pub struct Context {
    pub workspace: Workspace,
    pub config: ProjectConfig,
    pub store: Arc<StateStore>,
    pub ui: Ui,
}

impl Context {
    /// Discovers the workspace from the current directory and loads its `config.toml`.
    pub fn discover(ui: Ui) -> Result<Self, CliError> {
        let cwd = current_dir()?;
        let workspace = Workspace::discover(&cwd).map_err(CliError::user)?;
        Self::for_workspace(workspace, ui)
    }

    pub fn for_workspace(workspace: Workspace, ui: Ui) -> Result<Self, CliError> {
        let config = ConfigDir::new(workspace.crew_dir())
            .load_project_config()
            .map_err(config_error)?;
        let store = Arc::new(StateStore::new(workspace.id(), workspace.repo_root()));
        Ok(Context {
            workspace,
            config,
            store,
            ui,
        })
    }

    pub fn config_dir(&self) -> ConfigDir {
        ConfigDir::new(self.workspace.crew_dir())
    }

    /// The run a user means by `prefix`.
    pub fn resolve_run(&self, prefix: &str) -> Result<RunId, CliError> {
        self.store.resolve_run(prefix).map_err(|error| {
            let hint = matches!(error, StateError::UnknownRun { .. })
                .then_some("`crew runs list` shows the runs of this workspace");
            let error = CliError::user(error);
            match hint {
                Some(hint) => error.with_hint(hint),
                None => error,
            }
        })
    }

    pub fn read_run(&self, run_id: &RunId) -> Result<RunManifest, CliError> {
        self.store.read_run(run_id).map_err(CliError::user)
    }

    /// Marks runs whose host died as interrupted (and kills what is left of their agents).
    pub fn reconcile(&self) -> Result<Vec<RunId>, CliError> {
        let interrupted =
            crew_live::runner::reconcile_workspace(&self.store).map_err(CliError::internal)?;
        // Their worktrees still claim to be in use by the dead host: say what became of them.
        if let Some(repo_root) = self.workspace.repo_root() {
            for run_id in &interrupted {
                let _ = crew_worktree::listing::mark_interrupted(
                    repo_root,
                    &self.config.worktree,
                    run_id,
                );
            }
        }
        Ok(interrupted)
    }

    /// The live hosts of this workspace, one per socket.
    pub fn live_hosts(&self) -> Vec<(RunId, HostRecord)> {
        dedup_hosts(crew_live::runner::live_hosts(&self.store))
    }

    /// The readable manifests of the workspace's runs, newest first.
    pub fn manifests(&self) -> Result<Vec<RunManifest>, CliError> {
        Ok(self
            .store
            .list_runs()
            .map_err(CliError::internal)?
            .into_iter()
            .filter_map(|listing| listing.manifest.ok())
            .collect())
    }

    /// Sends `op` to the host at `socket`, as this workspace.
    pub async fn call(&self, host: &HostRecord, op: Op) -> Result<Response, ControlError> {
        let socket = host.socket.as_deref().expect("live hosts serve a socket");
        let mut client = ControlClient::connect(socket).await?;
        client.call(self.workspace.id(), op, REQUEST_TIMEOUT).await
    }

    /// The live agents of this workspace across its hosts, with the host of each. The hosts
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
        let mut live = LiveAgents::default();
        let mut unpublished = Vec::new();
        for (run_id, host) in self.live_hosts() {
            let socket = host.socket.as_deref().expect("live hosts serve a socket");
            let path = crew_live::publish::listing_path(self.store.state_dir(), socket);
            match crew_live::publish::read_listing(&path, host.identity.pid) {
                Some(listed) => live
                    .agents
                    .extend(listed.into_iter().map(|agent| (agent, host.clone()))),
                None => unpublished.push((run_id, host)),
            }
        }
        if !unpublished.is_empty() {
            let asked = self.ask_hosts(unpublished).await;
            live.agents.extend(asked.agents);
            live.unanswered.extend(asked.unanswered);
        }
        live.agents = one_per_agent(live.agents);
        live
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
            if let Some(error) = response.error.filter(|_| !response.ok) {
                live.unanswered.push(format!(
                    "host pid {}: {} ({})",
                    host.identity.pid, error.message, error.code
                ));
                continue;
            }
            let Some(listed) = response
                .result
                .and_then(|value| serde_json::from_value::<Vec<serde_json::Value>>(value).ok())
            else {
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

/// The live agents found, and the hosts that did not answer (busy, too slow): their agents
/// are missing, and whoever shows the list must say so.
#[derive(Debug, Default)]
pub struct LiveAgents {
    pub agents: Vec<(AgentSnapshot, HostRecord)>,
    pub unanswered: Vec<String>,
}

/// The current directory, or an error that says what happened to it.
pub fn current_dir() -> Result<std::path::PathBuf, CliError> {
    std::env::current_dir().map_err(|error| {
        CliError::user(format!("cannot read the current directory: {error}")).with_hint(
            "it may have been deleted (a removed worktree?): cd into your project and run crew again",
        )
    })
}

/// Sorted by agent id, each agent once (a host serving several runs lists its agents once per
/// run it was asked for).
fn one_per_agent(mut agents: Vec<(AgentSnapshot, HostRecord)>) -> Vec<(AgentSnapshot, HostRecord)> {
    agents.sort_by(|a, b| a.0.agent_id.cmp(&b.0.agent_id));
    agents.dedup_by(|a, b| a.0.agent_id == b.0.agent_id);
    agents
}

/// One entry per socket: a host serving several runs is asked once.
fn dedup_hosts(mut hosts: Vec<(RunId, HostRecord)>) -> Vec<(RunId, HostRecord)> {
    hosts.sort_by(|a, b| a.1.socket.cmp(&b.1.socket));
    hosts.dedup_by(|a, b| a.1.socket == b.1.socket);
    hosts
}

/// A configuration problem is the user's to fix: exit code 2, with the hint when there is one.
pub fn config_error(error: LoadConfigError) -> CliError {
    let hint = error.hint();
    // Every problem of a file on a line of its own, each read like a single one.
    let error = match error {
        LoadConfigError::Several(problems) => CliError::user(
            problems
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("\nerror: "),
        ),
        error => CliError::user(error),
    };
    match hint {
        Some(hint) => error.with_hint(hint),
        None => error,
    }
}
