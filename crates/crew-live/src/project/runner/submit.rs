//! Task plans an agent submits to its own run (`crew submit`, a lead agent's `run_tasks`):
//! checked as a whole against the run's task graph, then added in the run's mode.

use crew_core::config::validate_plain_task_graph;
use crew_core::config::{AgentDef, SandboxMode, SandboxSettings};
use crew_core::model::{EventKind, Reach, ReachList, RunEvent, TaskRecord};
use crew_core::{AgentId, RunId};

use super::task::RunContext;
use super::{Runner, blocking};
use crate::control::{ErrorBody, ErrorCode, SubmittedTask};

impl Runner {
    /// Validates an agent-authored plan and adds its tasks to the run, in the run's mode.
    pub(super) async fn accept_submission(
        &self,
        run_id: &RunId,
        agent: &AgentId,
        submitted: Vec<SubmittedTask>,
        context: &RunContext,
    ) -> Result<Vec<TaskRecord>, ErrorBody> {
        let started_agent = |name: &str| context.started_agent(name);
        let started_names = || context.started_agent_names();
        let refuse = |message: String| ErrorBody {
            code: ErrorCode::InvalidTasks,
            message,
        };
        let manifest = self
            .read(run_id)
            .await
            .map_err(|error| refuse(error.to_string()))?;
        let Some(submitter) = manifest
            .task(agent.task_id())
            .filter(|_| agent.run_id() == run_id)
        else {
            return Err(refuse(format!(
                "agent {agent} is not a task of run {run_id}"
            )));
        };
        if submitted.is_empty() {
            return Err(refuse("no tasks submitted".into()));
        }
        let existing: Vec<&TaskRecord> = manifest.tasks.iter().collect();
        let graph: Vec<(String, Vec<String>)> = existing
            .iter()
            .map(|task| {
                (
                    task.id.to_string(),
                    task.depends_on.iter().map(ToString::to_string).collect(),
                )
            })
            .chain(
                submitted
                    .iter()
                    .map(|task| (task.id.clone(), task.depends_on.clone())),
            )
            .collect();
        let parsed =
            validate_plain_task_graph(&graph).map_err(|error| refuse(error.to_string()))?;
        let mut records = Vec::new();
        let reach = reach_of(
            &self.config.sandbox,
            started_agent(&submitter.agent).as_ref(),
            submitter,
        );
        for (task, (id, depends_on)) in submitted
            .iter()
            .zip(parsed.into_iter().skip(existing.len()))
        {
            let agent_name = task
                .agent
                .clone()
                .unwrap_or_else(|| submitter.agent.clone());
            // Only a definition the run started with: in `single` mode an agent can write
            // `.crew/agents/`, and what it writes there is nothing it may run.
            if let Some(refused) = context.refused_agent(&agent_name) {
                return Err(refuse(format!("task {id}: {refused}")));
            }
            if started_agent(&agent_name).is_none() {
                let known = started_names();
                return Err(refuse(format!(
                    "task {id}: the agent `{agent_name}` is not one the run started with ({}); a submitted task runs only by a definition the run had before any agent started",
                    known.join(", ")
                )));
            }
            let mut record = TaskRecord::new(
                id,
                agent_name,
                task.prompt.clone(),
                depends_on,
                manifest.workspace_mode,
            );
            record.timeout = self.config.run.task_timeout;
            record.max_cost = self
                .config
                .run
                .task_max_cost_usd
                .map(crew_core::model::SpendCap::new);
            record.parent = Some(agent.task_id().clone());
            record.submitter_reach = reach.clone();
            records.push(record);
        }
        let store = self.store.clone();
        let run = run_id.clone();
        let added = records.clone();
        blocking(move || {
            store.update_run(&run, |manifest| {
                manifest.tasks.extend(added);
                Ok(())
            })
        })
        .await
        .map_err(|error| refuse(error.to_string()))?;
        self.record_event(
            run_id,
            RunEvent::new(
                Some(agent.task_id().clone()),
                EventKind::Message {
                    text: format!(
                        "submitted tasks {}",
                        records
                            .iter()
                            .map(|task| task.id.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                },
            ),
        );
        Ok(records)
    }
}

/// What the agent of `submitter` (its definition `definition`) could reach of the network,
/// which a task it submits never reaches beyond: the narrowest mode of the project, its
/// definition, its task and its own submitter's, with every list of hosts that applied to it.
/// An agent that ran unconfined reached what its own submitter let it, if it had one.
fn reach_of(
    project: &SandboxSettings,
    definition: Option<&AgentDef>,
    submitter: &TaskRecord,
) -> Option<Reach> {
    let inherited = submitter.submitter_reach.clone();
    let definition = definition?;
    if project.mode.and(definition.sandbox.mode) != SandboxMode::Enforce {
        return inherited;
    }
    // What it reached, its own submitter's reach among it.
    let network = submitter
        .network_by(project.network, &definition.sandbox)
        .mode;
    let mut lists = Vec::new();
    if let Some(hosts) = &definition.sandbox.allow_hosts {
        lists.push(ReachList {
            file: format!(".crew/agents/{}.toml", definition.name),
            hosts: hosts.clone(),
        });
    }
    if let Some(inherited) = inherited {
        lists.extend(inherited.lists);
    }
    Some(Reach { network, lists })
}
