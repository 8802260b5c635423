//! Best of N: a task run several times at once, each attempt a task of the run of its own
//! (`<id>.1` … `<id>.N`, each in its own worktree and branch), and the check command each
//! result is held to.

use crate::ids::{InvalidIdError, TaskId};
use crate::model::AttemptOf;

use super::settings::{TaskDef, TeamDef};

/// The most attempts of one task a run makes.
pub const MAX_ATTEMPTS: u32 = 10;

/// A task as a run records it: a team's task, or one attempt of it, with its check command
/// (its own, else the team's).
#[derive(Debug, Clone, PartialEq)]
pub struct RunTask {
    /// The task as it runs: for an attempt, the team's task under the attempt's own id.
    pub def: TaskDef,
    /// Which task this is an attempt of, and its number; `None` for a task run once.
    pub attempt_of: Option<AttemptOf>,
}

/// Attempts asked for as a run cannot make them.
#[derive(Debug, Clone, thiserror::Error)]
pub enum AttemptsError {
    /// A count outside 1 ..= [`MAX_ATTEMPTS`].
    #[error("attempts must be from 1 to {MAX_ATTEMPTS}, not {count}")]
    Count {
        /// The count asked for.
        count: u32,
    },
    /// Attempts of a task another task depends on.
    #[error(
        "task `{dependent}` depends on `{task}`, which would run {count} attempts: crew cannot know which one it builds on; run `{task}` on its own, `crew pick` an attempt, then start `{dependent}` from its branch (`crew run --base`)"
    )]
    DependedOn {
        /// The task run several times.
        task: TaskId,
        /// A task that depends on it.
        dependent: TaskId,
        /// How many attempts.
        count: u32,
    },
    /// An attempt's id that is not a valid id.
    #[error("attempt {number} of task `{task}`: {source}")]
    InvalidId {
        /// The task run several times.
        task: TaskId,
        /// The attempt's number.
        number: u32,
        /// Why its id is not valid.
        source: InvalidIdError,
    },
    /// An attempt's id that another task of the team has.
    #[error(
        "attempt {number} of task `{task}` would be task `{id}`, but the team has a task `{taken}` already: rename one of them"
    )]
    Taken {
        /// The task run several times.
        task: TaskId,
        /// The attempt's number.
        number: u32,
        /// The attempt's id.
        id: TaskId,
        /// The task that has it.
        taken: TaskId,
    },
}

/// The tasks a run of `team` records. A task with `attempts` above 1 (its own, or `all`, which
/// overrides every task's) becomes `<id>.1` … `<id>.N`; the others stay as they are. Refused
/// with a message naming the task: a count out of range, a task others depend on run more than
/// once, an attempt's id that is not a valid id or is taken by another task.
pub fn run_tasks(team: &TeamDef, all: Option<u32>) -> Result<Vec<RunTask>, AttemptsError> {
    if let Some(count) = all
        && !(1..=MAX_ATTEMPTS).contains(&count)
    {
        return Err(AttemptsError::Count { count });
    }
    let mut tasks = Vec::new();
    for task in &team.tasks {
        let mut def = task.clone();
        def.check = task.check.clone().or_else(|| team.check.clone());
        def.on_limit = task.on_limit.or(team.on_limit);
        def.network = match (task.network, team.network) {
            (Some(task), Some(team)) => Some(task.and(team)),
            (task, team) => task.or(team),
        };
        def.placement = task.placement.clone().or_else(|| team.placement.clone());
        def.resources = task.resources.narrowed(team.resources);
        let count = all.or(task.attempts).unwrap_or(1);
        if count <= 1 {
            tasks.push(RunTask {
                def,
                attempt_of: None,
            });
            continue;
        }
        if let Some(dependent) = team
            .tasks
            .iter()
            .find(|other| other.depends_on.contains(&task.id))
        {
            return Err(AttemptsError::DependedOn {
                task: task.id.clone(),
                dependent: dependent.id.clone(),
                count,
            });
        }
        for number in 1..=count {
            let id = TaskId::parse(&format!("{}.{number}", task.id)).map_err(|source| {
                AttemptsError::InvalidId {
                    task: task.id.clone(),
                    number,
                    source,
                }
            })?;
            if let Some(taken) = team
                .tasks
                .iter()
                .find(|other| other.id.collision_key() == id.collision_key())
            {
                return Err(AttemptsError::Taken {
                    task: task.id.clone(),
                    number,
                    id,
                    taken: taken.id.clone(),
                });
            }
            let mut attempt = def.clone();
            attempt.id = id;
            attempt.attempts = None;
            tasks.push(RunTask {
                def: attempt,
                attempt_of: Some(AttemptOf {
                    task: task.id.clone(),
                    number,
                    of: count,
                    picked: false,
                }),
            });
        }
    }
    Ok(tasks)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(id: &str, depends_on: &[&str], attempts: Option<u32>) -> TaskDef {
        TaskDef {
            depends_on: depends_on
                .iter()
                .map(|dep| TaskId::parse(dep).unwrap())
                .collect(),
            attempts,
            ..TaskDef::new(TaskId::parse(id).unwrap(), "shell", "true")
        }
    }

    fn team(tasks: Vec<TaskDef>) -> TeamDef {
        TeamDef {
            check: Some("make test".to_owned()),
            ..TeamDef::new("t", tasks)
        }
    }

    fn ids(tasks: &[RunTask]) -> Vec<String> {
        tasks.iter().map(|task| task.def.id.to_string()).collect()
    }

    #[test]
    fn attempts_become_numbered_tasks_with_the_teams_check() {
        let mut own = task("docs", &[], None);
        own.check = Some("true".to_owned());
        let tasks = run_tasks(&team(vec![task("fix", &[], Some(3)), own]), None).unwrap();
        assert_eq!(ids(&tasks), ["fix.1", "fix.2", "fix.3", "docs"]);
        assert_eq!(
            tasks[1].attempt_of,
            Some(AttemptOf {
                task: TaskId::parse("fix").unwrap(),
                number: 2,
                of: 3,
                picked: false,
            })
        );
        assert_eq!(tasks[0].def.check.as_deref(), Some("make test"));
        assert_eq!(tasks[3].def.check.as_deref(), Some("true"));
        assert_eq!(tasks[3].attempt_of, None);
    }

    #[test]
    fn the_run_wide_count_overrides_and_one_changes_nothing() {
        let def = team(vec![task("a", &[], Some(4)), task("b", &[], None)]);
        assert_eq!(
            ids(&run_tasks(&def, Some(2)).unwrap()),
            ["a.1", "a.2", "b.1", "b.2"]
        );
        assert_eq!(ids(&run_tasks(&def, Some(1)).unwrap()), ["a", "b"]);
        assert!(
            run_tasks(&def, Some(0))
                .unwrap_err()
                .to_string()
                .contains("from 1 to 10")
        );
        assert!(
            run_tasks(&def, Some(11))
                .unwrap_err()
                .to_string()
                .contains("not 11")
        );
    }

    #[test]
    fn a_task_others_build_on_and_a_taken_id_are_refused() {
        let def = team(vec![task("a", &[], Some(2)), task("b", &["a"], None)]);
        let error = run_tasks(&def, None).unwrap_err().to_string();
        assert!(error.contains("task `b` depends on `a`"), "{error}");
        let def = team(vec![task("a", &[], Some(2)), task("A.2", &[], None)]);
        let error = run_tasks(&def, None).unwrap_err().to_string();
        assert!(error.contains("task `A.2` already"), "{error}");
    }
}
