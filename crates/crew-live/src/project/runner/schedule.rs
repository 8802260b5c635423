//! Which task of a run starts next, which never will, and how the run ends.
//!
//! The schedule does no I/O: the executor (`execute.rs`) tells it what happened (a task ended,
//! a person stopped or resumed an agent, the run was cancelled, tasks were added) and carries
//! out the [`Step`]s it returns. Unit tests drive it without processes.
//!
//! The rules, in the order [`Schedule::next_steps`] applies them to each pending task:
//! 1. once the run is stopping (cancelled, or a failure with `fail_fast`), a pending task is
//!    cancelled;
//! 2. a task one of whose upstream tasks ended without succeeding is skipped, naming it;
//! 3. a task whose upstream tasks all succeeded starts when a slot is free: at most
//!    `max_parallel` tasks are active, not counting those whose agent a person stopped (held)
//!    or that wait for a usage limit to lift (paused).

use std::collections::{BTreeMap, HashMap, HashSet};

use crew_core::TaskId;
use crew_core::model::{RunStatus, TaskRecord, TaskStatus};

/// What the executor does next for one task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Step {
    /// Start the task: allocate its workspace and start its agent.
    Start(TaskId),
    /// Record that a pending task ends without starting, with this status and reason.
    Finish {
        task: TaskId,
        status: TaskStatus,
        reason: String,
    },
}

/// What became of an active task's agent, as far as its slot goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Hold {
    /// A person stopped it: no slot, and the run goes on for it only while something else does.
    Stopped,
    /// It waits for a usage limit to lift: no slot, and the run waits for it.
    Paused,
    /// It goes on again.
    Going,
}

/// The scheduling state of one run.
#[derive(Debug)]
pub(super) struct Schedule {
    /// Tasks in the order they were defined (or submitted): the order they are considered in.
    order: Vec<TaskId>,
    depends: HashMap<TaskId, Vec<TaskId>>,
    statuses: BTreeMap<TaskId, TaskStatus>,
    /// Tasks started and not yet ended.
    active: HashSet<TaskId>,
    /// Active tasks whose agent a person stopped: they take no slot, and keep the run going
    /// only while something else is.
    held: HashSet<TaskId>,
    /// Active tasks that wait for a usage limit to lift: they take no slot, and the run waits
    /// for them.
    paused: HashSet<TaskId>,
    max_parallel: usize,
    fail_fast: bool,
    cancelled: bool,
    failed_fast: bool,
}

impl Schedule {
    pub(super) fn new(tasks: &[TaskRecord], max_parallel: usize, fail_fast: bool) -> Self {
        let mut schedule = Schedule {
            order: Vec::new(),
            depends: HashMap::new(),
            statuses: BTreeMap::new(),
            active: HashSet::new(),
            held: HashSet::new(),
            paused: HashSet::new(),
            max_parallel: max_parallel.max(1),
            fail_fast,
            cancelled: false,
            failed_fast: false,
        };
        schedule.add(tasks);
        schedule
    }

    /// Adds tasks (of a new run, or submitted by an agent) with their recorded status.
    pub(super) fn add(&mut self, tasks: &[TaskRecord]) {
        for task in tasks {
            self.order.push(task.id.clone());
            self.depends
                .insert(task.id.clone(), task.depends_on.clone());
            self.statuses.insert(task.id.clone(), task.status);
        }
    }

    /// A task that is already going without a slot of its own being decided here (a task
    /// waiting for an answer, taken up again when the run resumes).
    pub(super) fn adopt(&mut self, task: &TaskId) {
        self.active.insert(task.clone());
    }

    /// The steps to take now; the schedule counts them as taken.
    pub(super) fn next_steps(&mut self) -> Vec<Step> {
        let mut steps = Vec::new();
        for task in self.order.clone() {
            if self.statuses[&task] != TaskStatus::Pending {
                continue;
            }
            if self.stopping() {
                self.statuses.insert(task.clone(), TaskStatus::Cancelled);
                steps.push(Step::Finish {
                    task,
                    status: TaskStatus::Cancelled,
                    reason: "the run was cancelled before the task started".to_owned(),
                });
                continue;
            }
            let depends = &self.depends[&task];
            if let Some((blocker, status)) = depends.iter().find_map(|upstream| {
                let status = *self.statuses.get(upstream)?;
                (status.is_finished() && status != TaskStatus::Succeeded)
                    .then_some((upstream, status))
            }) {
                let reason = format!("upstream task {blocker} did not succeed ({status})");
                self.statuses.insert(task.clone(), TaskStatus::Skipped);
                steps.push(Step::Finish {
                    task,
                    status: TaskStatus::Skipped,
                    reason,
                });
                continue;
            }
            let ready = depends
                .iter()
                .all(|upstream| self.statuses.get(upstream) == Some(&TaskStatus::Succeeded));
            if ready && self.active.len() - self.held.len() - self.paused.len() < self.max_parallel
            {
                self.active.insert(task.clone());
                self.statuses.insert(task.clone(), TaskStatus::Preparing);
                steps.push(Step::Start(task));
            }
        }
        steps
    }

    /// A task ended with `status`. Returns `true` when this ending stops the run (the first
    /// failure with `fail_fast`): the executor cancels the tasks still going.
    pub(super) fn ended(&mut self, task: &TaskId, status: TaskStatus) -> bool {
        self.active.remove(task);
        self.held.remove(task);
        self.paused.remove(task);
        self.statuses.insert(task.clone(), status);
        let fails_fast = self.fail_fast
            && !self.failed_fast
            && matches!(status, TaskStatus::Failed | TaskStatus::Stopped);
        self.failed_fast |= fails_fast;
        fails_fast
    }

    /// A person stopped a task's agent, a usage limit paused it, or it goes on again.
    pub(super) fn hold(&mut self, task: &TaskId, hold: Hold) {
        self.held.remove(task);
        self.paused.remove(task);
        if !self.active.contains(task) {
            return;
        }
        match hold {
            Hold::Stopped => self.held.insert(task.clone()),
            Hold::Paused => self.paused.insert(task.clone()),
            Hold::Going => false,
        };
    }

    /// The run was cancelled: no task starts any more.
    pub(super) fn cancel(&mut self) {
        self.cancelled = true;
    }

    /// A finished task is to run again (a resume in a live run).
    pub(super) fn requeue(&mut self, task: &TaskId) {
        self.statuses.insert(task.clone(), TaskStatus::Pending);
    }

    /// Whether the run takes no new work: it was cancelled, or failed fast.
    pub(super) fn stopping(&self) -> bool {
        self.cancelled || self.failed_fast
    }

    pub(super) fn is_active(&self, task: &TaskId) -> bool {
        self.active.contains(task)
    }

    /// Nothing is going but tasks whose agent a person stopped: they let go of their
    /// workspaces, and the run ends.
    pub(super) fn only_held_left(&self) -> bool {
        !self.active.is_empty() && self.active.is_subset(&self.held)
    }

    /// Nothing is going and nothing is pending: the run is over.
    pub(super) fn is_over(&self) -> bool {
        self.active.is_empty()
            && !self
                .statuses
                .values()
                .any(|status| *status == TaskStatus::Pending)
    }

    /// How the run ended. Nothing failed but a person stopped some of it: `cancelled`, as
    /// the person ended that work, not `failed`.
    pub(super) fn run_status(&self) -> RunStatus {
        let all =
            |wanted: &[TaskStatus]| self.statuses.values().all(|status| wanted.contains(status));
        if self.cancelled {
            RunStatus::Cancelled
        } else if all(&[TaskStatus::Succeeded]) {
            RunStatus::Completed
        } else if all(&[TaskStatus::Succeeded, TaskStatus::Stopped]) {
            RunStatus::Cancelled
        } else {
            RunStatus::Failed
        }
    }
}

#[cfg(test)]
mod tests {
    use crew_core::TaskId;
    use crew_core::config::WorkspaceMode;
    use crew_core::model::{RunStatus, TaskRecord, TaskStatus};

    use super::{Hold, Schedule, Step};

    fn task(id: &str, depends_on: &[&str]) -> TaskRecord {
        TaskRecord::new(
            TaskId::parse(id).unwrap(),
            "shell".to_owned(),
            "work".to_owned(),
            depends_on
                .iter()
                .map(|dep| TaskId::parse(dep).unwrap())
                .collect(),
            WorkspaceMode::Worktree,
        )
    }

    fn id(id: &str) -> TaskId {
        TaskId::parse(id).unwrap()
    }

    fn started(steps: &[Step]) -> Vec<&str> {
        steps
            .iter()
            .filter_map(|step| match step {
                Step::Start(task) => Some(task.as_str()),
                Step::Finish { .. } => None,
            })
            .collect()
    }

    #[test]
    fn at_most_max_parallel_tasks_run_and_a_freed_slot_starts_the_next() {
        let tasks = [task("a", &[]), task("b", &[]), task("c", &[])];
        let mut schedule = Schedule::new(&tasks, 2, false);
        assert_eq!(started(&schedule.next_steps()), ["a", "b"]);
        assert_eq!(schedule.next_steps(), []);
        assert!(!schedule.ended(&id("b"), TaskStatus::Succeeded));
        assert_eq!(started(&schedule.next_steps()), ["c"]);
        schedule.ended(&id("a"), TaskStatus::Succeeded);
        assert!(!schedule.is_over());
        schedule.ended(&id("c"), TaskStatus::Succeeded);
        assert!(schedule.is_over());
        assert_eq!(schedule.run_status(), RunStatus::Completed);
    }

    #[test]
    fn a_task_waits_for_its_upstream_and_is_skipped_when_it_fails() {
        let tasks = [task("a", &[]), task("b", &["a"]), task("c", &["b"])];
        let mut schedule = Schedule::new(&tasks, 4, false);
        assert_eq!(started(&schedule.next_steps()), ["a"]);
        schedule.ended(&id("a"), TaskStatus::Failed);
        // The skip of b skips c in the same pass.
        assert_eq!(
            schedule.next_steps(),
            [
                Step::Finish {
                    task: id("b"),
                    status: TaskStatus::Skipped,
                    reason: "upstream task a did not succeed (failed)".to_owned(),
                },
                Step::Finish {
                    task: id("c"),
                    status: TaskStatus::Skipped,
                    reason: "upstream task b did not succeed (skipped)".to_owned(),
                },
            ]
        );
        assert!(schedule.is_over());
        assert_eq!(schedule.run_status(), RunStatus::Failed);
    }

    #[test]
    fn a_stopped_agent_frees_its_slot_and_alone_lets_the_run_end() {
        let tasks = [task("a", &[]), task("b", &[])];
        let mut schedule = Schedule::new(&tasks, 1, false);
        assert_eq!(started(&schedule.next_steps()), ["a"]);
        schedule.hold(&id("a"), Hold::Stopped);
        assert!(schedule.only_held_left());
        assert_eq!(started(&schedule.next_steps()), ["b"]);
        assert!(!schedule.only_held_left());
        // Resumed: a takes its slot again, and b's end leaves it running.
        schedule.hold(&id("a"), Hold::Going);
        schedule.ended(&id("b"), TaskStatus::Succeeded);
        assert!(!schedule.only_held_left());
        schedule.hold(&id("a"), Hold::Stopped);
        assert!(schedule.only_held_left());
        // A hold for a task that is not going changes nothing.
        schedule.hold(&id("b"), Hold::Stopped);
        schedule.ended(&id("a"), TaskStatus::Stopped);
        assert!(!schedule.only_held_left());
        assert!(schedule.is_over());
        // Nothing failed: a person stopped what is not done.
        assert_eq!(schedule.run_status(), RunStatus::Cancelled);
    }

    #[test]
    fn a_paused_task_frees_its_slot_and_the_run_waits_for_it() {
        let tasks = [task("a", &[]), task("b", &[]), task("c", &[])];
        let mut schedule = Schedule::new(&tasks, 1, false);
        assert_eq!(started(&schedule.next_steps()), ["a"]);
        schedule.hold(&id("a"), Hold::Paused);
        assert_eq!(started(&schedule.next_steps()), ["b"]);
        schedule.ended(&id("b"), TaskStatus::Succeeded);
        // Only the paused task is left: the run neither lets it go nor ends.
        assert!(!schedule.only_held_left());
        assert!(!schedule.is_over());
        // Going again, it takes its slot back: c waits for it.
        schedule.hold(&id("a"), Hold::Going);
        assert!(started(&schedule.next_steps()).is_empty());
        schedule.ended(&id("a"), TaskStatus::Succeeded);
        assert_eq!(started(&schedule.next_steps()), ["c"]);
    }

    #[test]
    fn fail_fast_stops_the_run_once_and_cancels_what_has_not_started() {
        let tasks = [task("a", &[]), task("b", &[]), task("c", &[])];
        let mut schedule = Schedule::new(&tasks, 2, true);
        assert_eq!(started(&schedule.next_steps()), ["a", "b"]);
        assert!(schedule.ended(&id("a"), TaskStatus::Failed));
        assert!(schedule.stopping());
        assert_eq!(
            schedule.next_steps(),
            [Step::Finish {
                task: id("c"),
                status: TaskStatus::Cancelled,
                reason: "the run was cancelled before the task started".to_owned(),
            }]
        );
        // The second failure does not stop the run again.
        assert!(!schedule.ended(&id("b"), TaskStatus::Stopped));
        assert!(schedule.is_over());
        // Failing fast is a failure, not a cancel.
        assert_eq!(schedule.run_status(), RunStatus::Failed);
    }

    #[test]
    fn without_fail_fast_a_failure_stops_nothing() {
        let tasks = [task("a", &[]), task("b", &[])];
        let mut schedule = Schedule::new(&tasks, 1, false);
        assert_eq!(started(&schedule.next_steps()), ["a"]);
        assert!(!schedule.ended(&id("a"), TaskStatus::Failed));
        assert_eq!(started(&schedule.next_steps()), ["b"]);
    }

    #[test]
    fn a_cancelled_run_starts_nothing_more_and_ends_cancelled() {
        let tasks = [task("a", &[]), task("b", &["a"])];
        let mut schedule = Schedule::new(&tasks, 1, false);
        assert_eq!(started(&schedule.next_steps()), ["a"]);
        schedule.cancel();
        let steps = schedule.next_steps();
        assert!(
            matches!(&steps[..], [Step::Finish { task, status: TaskStatus::Cancelled, .. }] if task.as_str() == "b"),
            "{steps:?}"
        );
        assert!(!schedule.is_over());
        schedule.ended(&id("a"), TaskStatus::Succeeded);
        assert!(schedule.is_over());
        assert_eq!(schedule.run_status(), RunStatus::Cancelled);
    }

    #[test]
    fn submitted_and_requeued_tasks_are_scheduled_like_the_others() {
        let mut lead = task("lead", &[]);
        lead.status = TaskStatus::Succeeded;
        let mut failed = task("old", &[]);
        failed.status = TaskStatus::Failed;
        let mut schedule = Schedule::new(&[lead, failed], 1, false);
        assert_eq!(schedule.next_steps(), []);
        assert!(schedule.is_over());
        schedule.add(&[task("x", &["lead"]), task("y", &["x"])]);
        assert_eq!(started(&schedule.next_steps()), ["x"]);
        schedule.requeue(&id("old"));
        // One slot, taken by x: old waits for it.
        assert_eq!(schedule.next_steps(), []);
        schedule.ended(&id("x"), TaskStatus::Succeeded);
        assert_eq!(started(&schedule.next_steps()), ["old"]);
        assert!(schedule.is_active(&id("old")));
        schedule.ended(&id("old"), TaskStatus::Succeeded);
        assert_eq!(started(&schedule.next_steps()), ["y"]);
        schedule.ended(&id("y"), TaskStatus::Succeeded);
        assert_eq!(schedule.run_status(), RunStatus::Completed);
    }

    #[test]
    fn a_task_taken_up_while_waiting_holds_a_slot() {
        let mut waiting = task("asker", &[]);
        waiting.status = TaskStatus::Waiting;
        let mut schedule = Schedule::new(&[waiting, task("b", &[])], 1, false);
        schedule.adopt(&id("asker"));
        assert_eq!(schedule.next_steps(), []);
        schedule.ended(&id("asker"), TaskStatus::Succeeded);
        assert_eq!(started(&schedule.next_steps()), ["b"]);
    }
}
