//! Task graphs: ids, dependencies and cycles, checked for team files and for plans agents
//! submit.

use std::collections::HashMap;
use std::ops::Range;

use toml::Spanned;

use crate::ids::TaskId;

/// A task's id and dependencies as written, for graph validation.
#[derive(Debug, Clone)]
pub struct TaskSpec {
    /// Where the task stands in its file's `tasks` list.
    pub index: usize,
    /// The task's id, with where it is written.
    pub id: Spanned<String>,
    /// The ids it depends on, each with where it is written.
    pub depends_on: Vec<Spanned<String>>,
}

/// A task graph that breaks a rule, located at the offending value.
#[derive(Debug, Clone)]
pub struct GraphError {
    /// The bytes of the file the error points at.
    pub span: Range<usize>,
    /// The key that holds them, e.g. `tasks[2].depends_on`.
    pub key: String,
    /// What is wrong, in a sentence.
    pub message: String,
}

/// Checks ids (rules, case-insensitive uniqueness), dependencies (known, not twice) and cycles.
/// Returns each task's parsed id and dependencies, in order, or every problem found (a cycle is
/// looked for only in a graph without other problems).
pub fn validate_task_graph(
    tasks: &[TaskSpec],
) -> Result<Vec<(TaskId, Vec<TaskId>)>, Vec<GraphError>> {
    let mut errors = Vec::new();
    let mut seen: HashMap<String, &str> = HashMap::new();
    let mut ids: Vec<Option<TaskId>> = Vec::with_capacity(tasks.len());
    for task in tasks {
        let key = format!("tasks[{}].id", task.index);
        match TaskId::parse(task.id.get_ref()) {
            Ok(id) => {
                if let Some(first) = seen.insert(id.collision_key(), task.id.get_ref()) {
                    errors.push(GraphError {
                        span: task.id.span(),
                        key,
                        message: format!(
                            "duplicate task id `{}`: task `{first}` already uses it (task ids must be unique ignoring case)",
                            task.id.get_ref()
                        ),
                    });
                }
                ids.push(Some(id));
            }
            Err(error) => {
                errors.push(GraphError {
                    span: task.id.span(),
                    key,
                    message: error.to_string(),
                });
                ids.push(None);
            }
        }
    }
    let position: HashMap<&str, usize> = tasks
        .iter()
        .enumerate()
        .map(|(index, task)| (task.id.get_ref().as_str(), index))
        .collect();
    let mut edges: Vec<Vec<usize>> = Vec::with_capacity(tasks.len());
    for task in tasks {
        let mut deps = Vec::new();
        for (dep_index, dep) in task.depends_on.iter().enumerate() {
            let key = format!("tasks[{}].depends_on[{dep_index}]", task.index);
            let id = task.id.get_ref();
            let Some(&target) = position.get(dep.get_ref().as_str()) else {
                errors.push(GraphError {
                    span: dep.span(),
                    key,
                    message: format!(
                        "task `{id}` depends on `{}`, which is not a task of this team",
                        dep.get_ref()
                    ),
                });
                continue;
            };
            if deps.contains(&target) {
                errors.push(GraphError {
                    span: dep.span(),
                    key,
                    message: format!("task `{id}` lists `{}` twice", dep.get_ref()),
                });
                continue;
            }
            deps.push(target);
        }
        edges.push(deps);
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    let ids: Vec<TaskId> = ids.into_iter().flatten().collect();
    if let Some(cycle) = find_cycle(&edges) {
        let first = cycle[0];
        let closing = cycle[1 % cycle.len()];
        let dep_index = tasks[first]
            .depends_on
            .iter()
            .position(|dep| position.get(dep.get_ref().as_str()) == Some(&closing))
            .expect("a cycle follows existing edges");
        let path = cycle
            .iter()
            .chain(std::iter::once(&first))
            .map(|&index| ids[index].as_str())
            .collect::<Vec<_>>()
            .join(" -> ");
        return Err(vec![GraphError {
            span: tasks[first].depends_on[dep_index].span(),
            key: format!("tasks[{}].depends_on[{dep_index}]", tasks[first].index),
            message: format!("dependency cycle: {path}"),
        }]);
    }
    Ok(tasks
        .iter()
        .zip(&ids)
        .zip(&edges)
        .map(|((_, id), deps)| {
            (
                id.clone(),
                deps.iter().map(|&dep| ids[dep].clone()).collect(),
            )
        })
        .collect())
}

/// What is wrong with a task graph that came from elsewhere than a file (submitted by an
/// agent, given on the command line): every problem, each with the key it is at.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}", self.messages().join("; "))]
pub struct PlainGraphError {
    /// The problems, in the order of the tasks.
    pub problems: Vec<GraphError>,
}

impl PlainGraphError {
    /// What each problem says, in order.
    pub fn messages(&self) -> Vec<&str> {
        self.problems
            .iter()
            .map(|problem| problem.message.as_str())
            .collect()
    }
}

/// [`validate_task_graph`] for tasks that come from elsewhere than a file (submitted by an
/// agent, given on the command line): same rules, messages without a location.
pub fn validate_plain_task_graph(
    tasks: &[(String, Vec<String>)],
) -> Result<Vec<(TaskId, Vec<TaskId>)>, PlainGraphError> {
    let specs: Vec<TaskSpec> = tasks
        .iter()
        .enumerate()
        .map(|(index, (id, depends_on))| TaskSpec {
            index,
            id: Spanned::new(0..0, id.clone()),
            depends_on: depends_on
                .iter()
                .map(|dep| Spanned::new(0..0, dep.clone()))
                .collect(),
        })
        .collect();
    validate_task_graph(&specs).map_err(|problems| PlainGraphError { problems })
}

/// A cycle in the graph, as the list of nodes along it, when there is one.
pub(super) fn find_cycle(edges: &[Vec<usize>]) -> Option<Vec<usize>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        Active,
        Done,
    }
    let mut marks = vec![Mark::New; edges.len()];
    for start in 0..edges.len() {
        if marks[start] != Mark::New {
            continue;
        }
        // Iterative depth-first search: (node, next edge to follow).
        let mut stack = vec![(start, 0usize)];
        marks[start] = Mark::Active;
        while let Some(&mut (node, ref mut next)) = stack.last_mut() {
            if let Some(&target) = edges[node].get(*next) {
                *next += 1;
                match marks[target] {
                    Mark::New => {
                        marks[target] = Mark::Active;
                        stack.push((target, 0));
                    }
                    Mark::Active => {
                        let from = stack
                            .iter()
                            .position(|&(n, _)| n == target)
                            .expect("an active node is on the stack");
                        return Some(stack[from..].iter().map(|&(n, _)| n).collect());
                    }
                    Mark::Done => {}
                }
            } else {
                marks[node] = Mark::Done;
                stack.pop();
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cycles_are_found() {
        assert_eq!(
            find_cycle(&[vec![1], vec![2], vec![0]]),
            Some(vec![0, 1, 2])
        );
        assert_eq!(find_cycle(&[vec![], vec![0], vec![0, 1]]), None);
        assert_eq!(find_cycle(&[vec![0]]), Some(vec![0]));
    }
}
