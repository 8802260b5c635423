//! Teams: a team file loaded and checked (its tasks, their graph, attempts, checks,
//! placements), and teams made on the spot (`crew run --agent`, a lead agent's plan).

use std::collections::BTreeMap;
use std::ops::Range;

use toml::Spanned;

use super::{AdHocTeamError, ConfigDir, LoadConfigError, TeamFile, list_toml_stems, read_optional};
use crate::config::TEAMS_DIR;
use crate::config::attempts::MAX_ATTEMPTS;
use crate::config::checks::check_name;
use crate::config::graph::{TaskSpec, validate_plain_task_graph, validate_task_graph};
use crate::config::locate::{invalid_at, parse_toml, several};
use crate::config::settings::{PlannedTask, TaskDef, Team, TeamDef};

impl ConfigDir {
    /// A team made on the spot: each `(id, prompt)` a task of agent `agent_name`, none
    /// depending on another (`crew run --agent`, an editor's prompt).
    pub fn ad_hoc_team(
        &self,
        agent_name: &str,
        tasks: Vec<(String, String)>,
    ) -> Result<Team, AdHocTeamError> {
        let planned = tasks
            .into_iter()
            .map(|(id, prompt)| PlannedTask {
                id,
                agent: agent_name.to_owned(),
                prompt,
                depends_on: Vec::new(),
            })
            .collect();
        self.planned_team(&format!("adhoc-{agent_name}"), planned)
    }

    /// A team from tasks planned elsewhere than a file (a lead agent over MCP): each with its
    /// agent and dependencies, checked by the same rules as a team file.
    pub fn planned_team(
        &self,
        name: &str,
        tasks: Vec<PlannedTask>,
    ) -> Result<Team, AdHocTeamError> {
        let mut agents = BTreeMap::new();
        for task in &tasks {
            if !agents.contains_key(&task.agent) {
                agents.insert(task.agent.clone(), self.load_agent(&task.agent)?);
            }
        }
        let graph: Vec<(String, Vec<String>)> = tasks
            .iter()
            .map(|task| (task.id.clone(), task.depends_on.clone()))
            .collect();
        let ids = validate_plain_task_graph(&graph).map_err(AdHocTeamError::Tasks)?;
        let tasks = ids
            .into_iter()
            .zip(tasks)
            .map(|((id, depends_on), task)| TaskDef {
                id,
                agent: task.agent,
                prompt: task.prompt,
                depends_on,
                timeout: None,
                workspace_mode: None,
                attempts: None,
                check: None,
                on_limit: None,
                placement: None,
                network: None,
                resources: crate::config::Resources::default(),
                max_cost_usd: None,
            })
            .collect();
        Ok(Team {
            def: TeamDef {
                name: name.to_owned(),
                description: None,
                workspace_mode: None,
                max_parallel: None,
                fail_fast: None,
                check: None,
                on_limit: None,
                placement: None,
                network: None,
                resources: crate::config::Resources::default(),
                max_cost_usd: None,
                task_max_cost_usd: None,
                tasks,
            },
            agents,
        })
    }

    /// Names of the teams defined in files, sorted.
    pub fn team_names(&self) -> Result<Vec<String>, LoadConfigError> {
        list_toml_stems(&self.dir.join(TEAMS_DIR))
    }

    /// The team `name` with every agent it uses, fully validated.
    pub fn load_team(&self, name: &str) -> Result<Team, LoadConfigError> {
        check_name("team", name)?;
        let path = self.dir.join(TEAMS_DIR).join(format!("{name}.toml"));
        let Some(source) = read_optional(&path)? else {
            return Err(LoadConfigError::UnknownTeam {
                name: name.to_owned(),
                teams_dir: self.dir.join(TEAMS_DIR),
                available: self.team_names()?,
            });
        };
        let file: TeamFile = parse_toml(&path, &source)?;
        let invalid = |span: Range<usize>, key: String, message: String| {
            invalid_at(&path, &source, span, Some(key), message)
        };
        // Every problem of the file at once: unknown agents, then the task graph's.
        let mut problems = Vec::new();
        let mut agents = BTreeMap::new();
        let mut unknown: Vec<&String> = Vec::new();
        for (index, task) in file.tasks.get_ref().iter().enumerate() {
            let agent_name = task.agent.get_ref();
            if agents.contains_key(agent_name) || unknown.contains(&agent_name) {
                continue;
            }
            match self.load_agent(agent_name) {
                Ok(agent) => {
                    agents.insert(agent_name.clone(), agent);
                }
                Err(LoadConfigError::UnknownAgent {
                    agents_dir,
                    available,
                    ..
                }) => {
                    unknown.push(agent_name);
                    problems.push(invalid(
                        task.agent.span(),
                        format!("tasks[{index}].agent"),
                        format!(
                            "unknown agent `{agent_name}`; define it in {agents_dir}/{agent_name}.toml or use one of: {}",
                            available.join(", ")
                        ),
                    ));
                }
                Err(LoadConfigError::InvalidName { rule, .. }) => {
                    unknown.push(agent_name);
                    problems.push(invalid(
                        task.agent.span(),
                        format!("tasks[{index}].agent"),
                        format!("invalid agent name `{agent_name}`: {rule}"),
                    ));
                }
                Err(other) => return Err(other),
            }
        }
        let specs = file
            .tasks
            .get_ref()
            .iter()
            .enumerate()
            .map(|(index, task)| TaskSpec {
                index,
                id: task.id.clone(),
                depends_on: task.depends_on.clone(),
            })
            .collect::<Vec<_>>();
        let ids = match validate_task_graph(&specs) {
            Ok(ids) => ids,
            Err(errors) => {
                problems.extend(
                    errors
                        .into_iter()
                        .map(|error| invalid(error.span, error.key, error.message)),
                );
                Vec::new()
            }
        };
        let caps = file
            .resources
            .iter()
            .map(|caps| ("resources".to_owned(), caps))
            .chain(
                file.tasks
                    .get_ref()
                    .iter()
                    .enumerate()
                    .filter_map(|(index, task)| {
                        Some((
                            format!("tasks[{index}].resources"),
                            task.resources.as_ref()?,
                        ))
                    }),
            );
        for (key, caps) in caps {
            if let Err(message) = caps.get_ref().check() {
                problems.push(invalid(caps.span(), key, message));
            }
        }
        problems.extend(
            attempts_problems(&file)
                .into_iter()
                .map(|(span, key, message)| invalid(span, key, message)),
        );
        if !problems.is_empty() {
            return Err(several(problems));
        }
        if ids.is_empty() {
            return Err(invalid(
                file.tasks.span(),
                "tasks".to_owned(),
                "a team needs at least one task".to_owned(),
            ));
        }
        let tasks = file
            .tasks
            .into_inner()
            .into_iter()
            .zip(ids)
            .map(|(task, (id, depends_on))| TaskDef {
                id,
                agent: task.agent.into_inner(),
                prompt: task.prompt.into_inner(),
                depends_on,
                timeout: task.timeout,
                workspace_mode: task.workspace_mode,
                attempts: task.attempts.map(Spanned::into_inner),
                check: task.check.map(Spanned::into_inner),
                on_limit: task.on_limit,
                placement: task.placement,
                network: task.network,
                resources: task.resources.map(Spanned::into_inner).unwrap_or_default(),
                max_cost_usd: task.max_cost_usd,
            })
            .collect();
        Ok(Team {
            def: TeamDef {
                name: name.to_owned(),
                description: file.description,
                workspace_mode: file.workspace_mode,
                max_parallel: file.max_parallel,
                fail_fast: file.fail_fast,
                check: file.check.map(Spanned::into_inner),
                on_limit: file.on_limit,
                placement: file.placement,
                network: file.network,
                resources: file.resources.map(Spanned::into_inner).unwrap_or_default(),
                max_cost_usd: file.max_cost_usd,
                task_max_cost_usd: file.task_max_cost_usd,
                tasks,
            },
            agents,
        })
    }
}

/// What a team file's `attempts` and `check` values break: a count out of range, a task
/// others build on run more than once (which attempt would they build on?), an empty check.
pub(super) fn attempts_problems(file: &TeamFile) -> Vec<(Range<usize>, String, String)> {
    let mut problems = Vec::new();
    let tasks = file.tasks.get_ref();
    if let Some(check) = &file.check
        && check.get_ref().trim().is_empty()
    {
        problems.push((
            check.span(),
            "check".to_owned(),
            "an empty check command: give one (`check = \"cargo test\"`) or leave the key out"
                .to_owned(),
        ));
    }
    for (index, task) in tasks.iter().enumerate() {
        if let Some(check) = &task.check
            && check.get_ref().trim().is_empty()
        {
            problems.push((
                check.span(),
                format!("tasks[{index}].check"),
                "an empty check command: give one or leave the key out".to_owned(),
            ));
        }
        let Some(attempts) = &task.attempts else {
            continue;
        };
        let key = format!("tasks[{index}].attempts");
        let count = *attempts.get_ref();
        if !(1..=MAX_ATTEMPTS).contains(&count) {
            problems.push((
                attempts.span(),
                key,
                format!("attempts must be from 1 to {MAX_ATTEMPTS}, not {count}"),
            ));
            continue;
        }
        if count == 1 {
            continue;
        }
        let id = task.id.get_ref();
        if let Some(dependent) = tasks
            .iter()
            .find(|other| other.depends_on.iter().any(|dep| dep.get_ref() == id))
        {
            problems.push((
                attempts.span(),
                key,
                format!(
                    "task `{}` depends on `{id}`, which would run {count} attempts: crew cannot know which one it builds on; run `{id}` on its own, `crew pick` an attempt, then start `{}` from its branch (`crew run --base`)",
                    dependent.id.get_ref(),
                    dependent.id.get_ref()
                ),
            ));
        }
    }
    problems
}
