//! Preparing a task (`preparing`): its agent's definition, its workspace (allocated by the
//! provider, with what its upstream tasks left it), its lease, and the agent's start spec —
//! here, or placed on another machine.

use crew_core::config::{AgentDef, ConfigDir};
use crew_core::model::{EventKind, RunEvent, TaskRecord, TaskStatus, WorkspaceRecord};
use crew_core::provider::{
    ProgressSink, TaskWorkspace, UpstreamWork, WorkspaceKind, WorkspaceRequest,
};
use crew_core::{AgentId, TaskId};
use crew_sandbox::sandbox::SandboxPlan;

use super::{PrepareError, RunContext};
use crate::agent::AgentSpec;
use crate::project::runner::{RunError, TaskActivity, blocking};

impl RunContext {
    /// The definition of agent `name` as the run started with it. One the run did not have
    /// (a file that did not parse then) is read now, for the user's own tasks; a task an agent
    /// submitted gets none (see [`RunContext::started_agent`]).
    pub(super) fn agent_definition(&self, task: &TaskRecord) -> Result<AgentDef, PrepareError> {
        let name = &task.agent;
        if let Some(refused) = self.refused_agents.get(name) {
            return Err(PrepareError::Refused(refused.clone()));
        }
        if let Some(found) = self.started_agent(name) {
            return Ok(found);
        }
        if task.parent.is_some() {
            return Err(PrepareError::Refused(format!(
                "the agent `{name}` was not defined when the run started; a task an agent submits runs only by a definition the run started with"
            )));
        }
        let definition = ConfigDir::new(self.runner.workspace.crew_dir()).load_agent(name)?;
        self.agents
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(name.to_owned(), definition.clone());
        Ok(definition)
    }

    /// Where the provider tells how the preparation of `task`'s workspace moves on.
    pub(super) fn progress_sink(&self, task: &TaskId) -> ProgressSink {
        let activity = self.runner.activity.clone();
        let (run_id, task_id) = (self.run_id.clone(), task.clone());
        ProgressSink::new(move |progress| {
            // Nobody watching is no error: progress is only for those who do.
            let _ = activity.send(TaskActivity {
                run_id: run_id.clone(),
                task_id: task_id.clone(),
                progress,
            });
        })
    }

    /// The workspace request of a task, with its upstream tasks' branches.
    pub(super) async fn workspace_request(
        &self,
        task: &TaskRecord,
        unconfined: bool,
    ) -> Result<WorkspaceRequest, RunError> {
        let depends_on = task.depends_on.clone();
        let upstream = self
            .runner
            .look(&self.run_id, move |manifest| {
                depends_on
                    .iter()
                    .filter_map(|dep| manifest.task(dep))
                    .map(|dep| UpstreamWork {
                        task_id: dep.id.clone(),
                        branch: dep
                            .teardown
                            .as_ref()
                            .and_then(|report| report.branch.clone()),
                    })
                    .collect()
            })
            .await?;
        Ok(WorkspaceRequest {
            workspace: self.runner.workspace.id().clone(),
            repo_root: self.runner.workspace.repo_root().map(Into::into),
            invocation_dir: self.invocation_dir.clone(),
            run_id: self.run_id.clone(),
            task_id: task.id.clone(),
            mode: task.workspace_mode,
            base: self.base.clone(),
            upstream,
            progress: Some(self.progress_sink(&task.id)),
            env: self
                .leases
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .get(&task.id)
                .map(|lease| lease.record.vars())
                .unwrap_or_default(),
            unconfined,
        })
    }

    pub(super) async fn allocate(
        &self,
        task: &TaskRecord,
        definition: &AgentDef,
    ) -> Result<TaskWorkspace, PrepareError> {
        let unconfined = self.runner.config.sandbox.mode.and(definition.sandbox.mode)
            == crew_core::config::SandboxMode::Off
            || crew_sandbox::sandbox::kernel_abi().is_none();
        let request = self.workspace_request(task, unconfined).await?;
        let provider = self.runner.provider.clone();
        let allocated = blocking(move || provider.allocate(&request)).await?;
        let record = WorkspaceRecord::of(&allocated);
        let warnings = allocated.warnings.clone();
        let task_id = task.id.clone();
        // The lease taken for it is recorded with it, in one write: until then the lease is
        // held by this process alone, and a crash lets go of both.
        let lease = self
            .leases
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(&task_id)
            .map(|lease| lease.record.clone());
        self.save_task(
            &format!("task {task_id}'s workspace"),
            &task_id,
            move |task| {
                if lease.is_some() {
                    task.lease = lease;
                }
                task.workspace = Some(record);
                for warning in warnings {
                    if !task.warnings.contains(&warning) {
                        task.warnings.push(warning);
                    }
                }
                Ok(())
            },
        )
        .await;
        Ok(allocated)
    }

    pub(super) fn agent_spec(
        &self,
        task: &TaskRecord,
        definition: AgentDef,
        workspace: &TaskWorkspace,
    ) -> AgentSpec {
        let store = &self.runner.store;
        let network = self.network_of(task, &definition);
        AgentSpec {
            agent_id: AgentId::new(self.run_id.clone(), task.id.clone()),
            workspace: self.runner.workspace.id().clone(),
            dir: workspace.dir.clone(),
            definition,
            prompt: task.prompt.clone(),
            timeout: task.timeout.map(|timeout| timeout.0),
            stop_grace: self.runner.config.run.stop_grace.0,
            unreachable_timeout: Some(self.runner.config.run.unreachable_timeout.0)
                .filter(|timeout| !timeout.is_zero()),
            output_log: store.output_log_path(&self.run_id, &task.id),
            output_log_limit: self.runner.config.run.max_output_log.0,
            socket: self.socket.clone(),
            sandbox: SandboxPlan {
                mode: self.runner.config.sandbox.mode,
                write: std::iter::once(workspace.root.clone())
                    .chain(workspace.writable.iter().cloned())
                    .collect(),
                read_only: workspace.read_only.clone(),
                private: workspace.private.clone(),
                // The project (and the repository's git directory, where it lies elsewhere);
                // its definition's and its tools' are added as it starts (`agent/confine.rs`).
                read: self.project_reads(),
                reads_in_part: true,
                network: network.mode,
                network_named: network.named,
                hosts: self
                    .runner
                    .config
                    .sandbox
                    .allow_hosts
                    .iter()
                    .map(|hosts| crew_core::config::HostList {
                        file: ".crew/config.toml".to_owned(),
                        hosts: hosts.clone(),
                    })
                    .chain(task.submitter_reach.iter().flat_map(|reach| {
                        reach.lists.iter().map(|list| crew_core::config::HostList {
                            file: list.file.clone(),
                            hosts: list.hosts.clone(),
                        })
                    }))
                    .collect(),
                allow_open_network: task.allow_open_network,
                locks: self.runner.agent_locks(),
                workspace: workspace.identity,
                caps: task.resources,
                allow_uncapped: task.allow_uncapped,
            },
            git_config: workspace.git_config.clone(),
            workspace_env: workspace_env(workspace)
                .into_iter()
                .chain(
                    self.leases
                        .lock()
                        .unwrap_or_else(|poisoned| poisoned.into_inner())
                        .get(&task.id)
                        .map(|lease| lease.record.vars())
                        .unwrap_or_default(),
                )
                .collect(),
            session_id: task.session_id.clone(),
            session_cost: task.usage.and_then(|usage| usage.cost_usd),
            parent: task.parent.clone(),
            placed: None,
            follow_ups: task.follow_ups.clone(),
            network_log: Some(self.network_log(&task.id)),
            spend: self
                .spend
                .caps(&task.id)
                .then(|| self.spend.meter(&task.id)),
        }
    }

    /// Where the proxy of `task`'s agent reports each request: an event of the run, written
    /// as it comes (an unwritten one is logged; the counts on the task still hold it).
    pub(super) fn network_log(&self, task: &TaskId) -> crew_sandbox::proxy::NetworkLog {
        let store = self.runner.store.clone();
        let (run_id, task) = (self.run_id.clone(), task.clone());
        crew_sandbox::proxy::NetworkLog::new(move |request| {
            let event = RunEvent::new(
                Some(task.clone()),
                EventKind::Network {
                    host: request.host,
                    port: request.port,
                    allowed: request.allowed,
                    reason: request.reason,
                },
            );
            if let Err(error) = store.append_event(&run_id, &event) {
                tracing::warn!(run = %run_id, "could not record a network request: {error}");
            }
        })
    }

    /// The spec of a task that runs on a placement: its agent runs there, and what this host
    /// supervises is the placement's transport (`crew shim`, or ssh to one), unconfined (it is
    /// crew's own; the agent is confined there). `None` with the reason it cannot run there.
    pub(super) fn placed_spec(
        &self,
        mut spec: AgentSpec,
        task: &TaskRecord,
        placement: &str,
    ) -> Result<AgentSpec, String> {
        let def = self
            .runner
            .config
            .placements
            .get(placement)
            .ok_or_else(|| {
                format!("the placement `{placement}` is no longer in .crew/config.toml")
            })?;
        let base = self.base.clone().ok_or_else(|| {
            format!("the run has no base commit to start from on the placement `{placement}`")
        })?;
        let repo_root = self.runner.workspace.repo_root().ok_or_else(|| {
            format!("the placement `{placement}` takes tasks of a git repository, and this project is not one")
        })?;
        let branch = format!(
            "{}/{}-{}",
            self.runner.config.worktree.branch_prefix,
            self.run_id,
            spec.agent_id.task_id()
        );
        // Confined there as here: the narrowest network of the project, the task and its
        // definition travels in the definition, with one list of hosts. Where both the
        // project and the definition list hosts, only the definition's entries the project
        // names too go (narrower than here, where wildcards of the project's cover more).
        let mut agent = spec.definition.clone();
        agent.sandbox.network = Some(spec.sandbox.network);
        // (The lists here are the project's and, for a sub-task, its submitter's: an entry goes
        // when every one of them names it.)
        let lists: Vec<&Vec<crew_core::config::HostPattern>> =
            spec.sandbox.hosts.iter().map(|list| &list.hosts).collect();
        let in_every =
            |entry: &crew_core::config::HostPattern| lists.iter().all(|list| list.contains(entry));
        agent.sandbox.allow_hosts = match (agent.sandbox.allow_hosts.take(), lists.first()) {
            (None, None) => None,
            (None, Some(first)) => Some(first.iter().filter(|e| in_every(e)).cloned().collect()),
            (Some(own), None) => Some(own),
            (Some(own), Some(_)) => Some(own.into_iter().filter(|e| in_every(e)).collect()),
        };
        let mut pass_env = vec![
            "SSH_AUTH_SOCK".to_owned(),
            "SSH_AGENT_PID".to_owned(),
            "KUBECONFIG".to_owned(),
            // `srun` finds its cluster by it where the machine's default is not the one.
            "SLURM_CONF".to_owned(),
        ];
        pass_env.extend(agent.pass_env.iter().cloned());
        let placed_task = crew_core::config::PlacedTask {
            project: self.runner.workspace.id().to_string(),
            run: self.run_id.to_string(),
            task: spec.agent_id.task_id().to_string(),
            // A pod's Secret carries these from the host's environment: its
            // credentials' variables too, for the crew there to hold by reference.
            pass_env: agent
                .pass_env
                .iter()
                .cloned()
                .chain(agent.sandbox.credentials.iter().flat_map(|credential| {
                    credential
                        .keys
                        .iter()
                        .flat_map(|key| key.sources().map(str::to_owned))
                        .chain(credential.base_url_env.clone())
                }))
                .collect(),
            resources: task.resources,
        };
        spec.definition = AgentDef {
            name: format!("{}@{placement}", agent.name),
            description: Some(format!("{} on the placement {placement}", agent.name)),
            command: def.transport("crew", &placed_task),
            steer: crew_core::config::SteerMode::Protocol,
            protocol: crew_core::config::Protocol::Shim,
            resume: None,
            env: std::collections::BTreeMap::new(),
            pass_env,
            sandbox: crew_core::config::AgentSandbox {
                mode: crew_core::config::SandboxMode::Off,
                network: Some(crew_core::config::NetworkMode::Open),
                allow_hosts: None,
                read: Vec::new(),
                write: Vec::new(),
                confined: Default::default(),
                credentials: Vec::new(),
            },
            prices: agent.prices,
            builtin: false,
        };
        // Taken up again after its work came back once: it goes on from that work, and its
        // branch moves on from there.
        let from = task
            .teardown
            .as_ref()
            .filter(|report| report.branch.as_deref() == Some(branch.as_str()))
            .and_then(|report| report.tip.clone());
        // Its caps hold where it runs, not on the transport here: sent with its start to the
        // shim, or its container's limits on Kubernetes (the transport's `--cpu`, `--memory`),
        // its job's on Slurm (`--cpus-per-task`, `--mem`).
        let mut caps = std::mem::take(&mut spec.sandbox.caps);
        if matches!(
            def.kind,
            crew_core::config::PlacementKind::Kubernetes | crew_core::config::PlacementKind::Slurm
        ) {
            caps = crew_core::config::Resources::default();
        }
        spec.placed = Some(crate::agent::placed::Placed {
            caps,
            allow_uncapped: task.allow_uncapped,
            name: placement.to_owned(),
            // A pod gets them from its Secret, never through the attach stream.
            send_env: def.kind != crew_core::config::PlacementKind::Kubernetes,
            agent,
            project: self.runner.workspace.id().to_string(),
            base,
            from,
            repo_root: repo_root.to_owned(),
            branch,
            provider: self.runner.provider.clone(),
            slurm_job: (def.kind == crew_core::config::PlacementKind::Slurm)
                .then(|| crew_core::config::slurm_job_name(&placed_task)),
        });
        Ok(spec)
    }

    /// The task's agent definition and workspace; a failure of either fails the task (recorded
    /// with the reason) and returns `None`.
    pub(super) async fn prepare(&self, task: &TaskRecord) -> Option<(AgentDef, TaskWorkspace)> {
        let mut definition = self.agent_definition(task);
        if let Ok(definition) = &mut definition
            && definition.sandbox.mode == crew_core::config::SandboxMode::Off
            && self.submitted_under_confinement(task).await
        {
            definition.sandbox.mode = crew_core::config::SandboxMode::Enforce;
            self.record_warning(
                &task.id,
                format!(
                    "sandbox: the agent `{}` would run unconfined, and the agent that submitted this task ran confined: it runs confined (a sub-task is never wider than its submitter)",
                    task.agent
                ),
            )
            .await;
        }
        if let Ok(definition) = &definition
            && definition.sandbox.allow_hosts.is_some()
            && self.network_of(task, definition).mode == crew_core::config::NetworkMode::Open
        {
            self.record_warning(
                &task.id,
                format!(
                    "network: `allow_hosts` of .crew/agents/{}.toml is unused: the agent's network is \"open\" (set `network = \"proxy\"` there for the list to apply)",
                    definition.name
                ),
            )
            .await;
        }
        if definition.is_ok()
            && let Err(reason) = self.lease(task).await
        {
            self.record_status(&task.id, TaskStatus::Failed, Some(reason))
                .await;
            return None;
        }
        let prepared = match definition {
            Ok(definition) => self
                .allocate(task, &definition)
                .await
                .map(|workspace| (definition, workspace)),
            Err(reason) => Err(reason),
        };
        match prepared {
            Ok(prepared) => Some(prepared),
            Err(error) => {
                self.release_lease(&task.id);
                self.record_status(&task.id, TaskStatus::Failed, Some(error.reason()))
                    .await;
                None
            }
        }
    }

    /// What of the project every agent of it reads, wherever it lies: the project folder, the
    /// repository around it and the repository's git directory (which a linked worktree or a
    /// submodule keeps elsewhere).
    fn project_reads(&self) -> Vec<camino::Utf8PathBuf> {
        let workspace = &self.runner.workspace;
        let repo = workspace.repo_root();
        let git_dir = repo.and_then(|repo| crew_core::git_exclude::common_git_dir(repo).ok());
        std::iter::once(workspace.root().to_owned())
            .chain(repo.map(ToOwned::to_owned))
            .chain(git_dir)
            .collect()
    }

    /// The network `task`'s agent (by `definition`) gets.
    fn network_of(&self, task: &TaskRecord, definition: &AgentDef) -> crew_core::config::Network {
        task.network_by(self.runner.config.sandbox.network, &definition.sandbox)
    }

    /// Takes `task`'s lease (its record's ports again on a resume, where free); the task's record
    /// gets it with its workspace ([`RunContext::allocate`]).
    pub(super) async fn lease(&self, task: &TaskRecord) -> Result<(), String> {
        let settings = self.runner.config.lease.clone();
        let (run, id, earlier) = (
            self.run_id.to_string(),
            task.id.to_string(),
            task.lease.clone(),
        );
        let lease = blocking(move || match crew_sandbox::lease::Leases::of_user() {
            Some(leases) => leases.acquire(&settings, &run, &id, earlier.as_ref()),
            // No state directory to lock leases in: a name, no ports.
            None => Ok(crew_sandbox::lease::Lease::unported(&run, &id, &settings)),
        })
        .await
        .map_err(|reason| format!("its lease: {reason}"))?;
        self.leases
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(task.id.clone(), lease);
        Ok(())
    }

    /// Releases the ports of `task`'s lease: it ended.
    pub(super) fn release_lease(&self, task: &TaskId) {
        // Dropped: its lock goes with it.
        self.leases
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .remove(task);
    }
}

/// What an agent's environment carries for its kind of workspace: in `temp` and `dedicated`
/// workspaces (which may lie inside the project, as `.crew/state/ws/…` does), git must not
/// climb above the workspace into a repository around it.
pub(super) fn workspace_env(workspace: &TaskWorkspace) -> Vec<(String, String)> {
    match (workspace.kind, workspace.root.parent()) {
        (WorkspaceKind::Temp | WorkspaceKind::Dedicated, Some(parent)) => vec![(
            crew_core::env_vars::GIT_CEILING_DIRECTORIES.to_owned(),
            parent.to_string(),
        )],
        _ => Vec::new(),
    }
}
