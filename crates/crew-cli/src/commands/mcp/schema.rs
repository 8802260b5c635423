//! What the tools take and give, as the lead agent sees them (each type's JSON schema is what
//! `tools/list` shows): the arguments, checked as they arrive, and the reports.

use crew_core::model::{RunManifest, TaskStatus};
use rmcp::schemars;
use serde::{Deserialize, Serialize};

/// One task of `run_tasks`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct TaskArg {
    /// The task's id: letters, digits, `.`, `_`, `-`; unique in the run.
    pub(super) id: String,
    /// What the agent is asked to do.
    pub(super) prompt: String,
    /// The agent definition (`.crew/agents/<name>.toml`, or `shell`); default: the project's
    /// `[run] default_agent`.
    #[serde(default)]
    pub(super) agent: Option<String>,
    /// Ids of tasks of this call that must succeed first.
    #[serde(default)]
    pub(super) depends_on: Vec<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RunTasksArgs {
    /// The tasks to run, each in its own isolated workspace.
    #[serde(default)]
    pub(super) tasks: Vec<TaskArg>,
    /// Instead of `tasks`: a team of `.crew/teams/`.
    #[serde(default)]
    pub(super) team: Option<String>,
    /// Return only when the run has ended (or a task asks a question).
    #[serde(default)]
    pub(super) wait: bool,
    /// Run each task this many times at once, each attempt in its own worktree and branch
    /// (best of N): the tasks are `<id>.1` … `<id>.N`.
    #[serde(default)]
    #[schemars(schema_with = "positive_schema")]
    pub(super) attempts: Option<u32>,
    /// A shell command run in each task's workspace once its agent finished, confined like
    /// the agent: its exit says whether the result passes (`check_passed`).
    #[serde(default)]
    pub(super) check: Option<String>,
    /// What a task does when its agent hits a usage limit: `fail` (the default) or `pause`
    /// (its workspace kept, its session taken up again when the limit lifts).
    #[serde(default)]
    pub(super) on_limit: Option<LimitArg>,
}

/// `run_tasks`'s `on_limit`.
#[derive(Debug, Clone, Copy, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub(super) enum LimitArg {
    Fail,
    Pause,
}

impl From<LimitArg> for crew_core::config::OnLimit {
    fn from(limit: LimitArg) -> Self {
        match limit {
            LimitArg::Fail => crew_core::config::OnLimit::Fail,
            LimitArg::Pause => crew_core::config::OnLimit::Pause,
        }
    }
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct StatusArgs {
    /// A run id or a unique prefix; default: the newest runs of the folder.
    #[serde(default)]
    pub(super) run: Option<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct WaitArgs {
    /// A run id or a unique prefix.
    pub(super) run: String,
    /// How long to wait at most, in seconds (default 600).
    #[serde(default)]
    #[schemars(schema_with = "positive_schema")]
    pub(super) timeout_s: Option<u64>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct TaskRef {
    /// A run id or a unique prefix.
    pub(super) run: String,
    /// The task's id.
    pub(super) task: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct MessageArgs {
    /// A run id or a unique prefix.
    pub(super) run: String,
    /// The task's id.
    pub(super) task: String,
    /// The answer (`answer`) or message (`steer`).
    pub(super) message: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct LandArgs {
    /// A run id or a unique prefix.
    pub(super) run: String,
    /// The tasks to land; default: every task of the run with work on a branch.
    #[serde(default)]
    pub(super) tasks: Option<Vec<String>>,
    /// The branch to land on; default: the branch the run started from.
    #[serde(default)]
    pub(super) into: Option<String>,
    /// `merge` (a merge commit per task, the default), `squash` (one commit per task) or
    /// `rebase` (each task's commits replayed).
    #[serde(default)]
    pub(super) mode: Option<LandModeArg>,
    /// Land tasks whose check failed too (default false: such a landing is refused, and
    /// `problem` names them).
    #[serde(default)]
    pub(super) force: bool,
}

#[derive(Debug, Clone, Copy, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub(super) enum LandModeArg {
    Merge,
    Squash,
    Rebase,
}

/// What a landing did, or why nothing landed.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub(super) struct LandReport {
    /// Every task landed; when `false`, the target did not move at all.
    pub(super) landed: bool,
    /// The branch landed on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) into: Option<String>,
    /// The tasks, in the order they landed.
    pub(super) tasks: Vec<String>,
    /// The target's commit before and after.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) from: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) to: Option<String>,
    /// The user's checkout of the target was brought up to date.
    pub(super) checkout_updated: bool,
    /// Why nothing landed (a conflict names the task and the files), and what to do.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) problem: Option<String>,
}

/// A run as the tools report it.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub(super) struct RunReport {
    pub(super) run_id: String,
    pub(super) status: String,
    pub(super) tasks: Vec<TaskReport>,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub(super) struct TaskReport {
    pub(super) id: String,
    pub(super) status: String,
    /// Where its work is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) branch: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "count_schema")]
    pub(super) lines_added: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "count_schema")]
    pub(super) lines_removed: Option<usize>,
    /// The question it waits on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) question: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) reason: Option<String>,
    /// Tokens in (cache reads included) and out, when the task's agent reports them.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "count_schema")]
    pub(super) tokens_in: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "count_schema")]
    pub(super) tokens_out: Option<u64>,
    /// What the task cost in US dollars, when its agent reports it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) cost_usd: Option<f64>,
    /// Whether its check passed, once it ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) check_passed: Option<bool>,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub(super) struct StatusReport {
    pub(super) runs: Vec<RunReport>,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub(super) struct DoneReport {
    pub(super) agent_id: String,
    /// What the host did (`queued`, `resumed`, `terminated`, …).
    pub(super) result: String,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub(super) struct DiffReport {
    pub(super) agent_id: String,
    pub(super) branch: String,
    pub(super) base: String,
    pub(super) patch: String,
    /// Whether `patch` was cut at 64 KiB.
    pub(super) truncated: bool,
}

/// A count of lines: a plain non-negative integer (no `format`, which clients' validators may
/// not know).
pub(super) fn count_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({ "type": "integer", "minimum": 0 })
}

/// An optional count given as an argument: a plain integer from 1, not `["integer", "null"]`,
/// which clients that fill arguments from their schema's type (the MCP Inspector's CLI) cannot
/// give. Left out, it is `None`.
pub(super) fn positive_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({ "type": "integer", "minimum": 1 })
}

pub(super) fn report(manifest: &RunManifest) -> RunReport {
    RunReport {
        run_id: manifest.run_id.to_string(),
        status: manifest.status.to_string(),
        tasks: manifest
            .tasks
            .iter()
            .map(|task| {
                let teardown = task.teardown.as_ref();
                TaskReport {
                    id: task.id.to_string(),
                    status: task.status.to_string(),
                    branch: teardown.and_then(|report| report.branch.clone()),
                    lines_added: teardown
                        .and_then(|report| report.diffstat)
                        .map(|stat| stat.insertions),
                    lines_removed: teardown
                        .and_then(|report| report.diffstat)
                        .map(|stat| stat.deletions),
                    question: task
                        .question
                        .clone()
                        .filter(|_| task.status == TaskStatus::Waiting),
                    reason: task.reason.clone(),
                    tokens_in: task
                        .usage
                        .filter(|usage| !usage.tokens_unknown)
                        .map(|usage| usage.input_total()),
                    tokens_out: task
                        .usage
                        .filter(|usage| !usage.tokens_unknown)
                        .map(|usage| usage.output_tokens),
                    cost_usd: task.usage.and_then(|usage| usage.cost_usd),
                    check_passed: task.check.as_ref().and_then(|check| check.passed),
                }
            })
            .collect(),
    }
}
