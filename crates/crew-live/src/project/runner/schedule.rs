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
//!    or that wait for a usage limit to lift (paused);
//! 4. and when its provider allows: while a task of its provider waits for a limit to lift,
//!    no other task of that provider starts (it would meet the same limit); once none waits,
//!    the provider ramps back up, one task more than it has going, and one more each time one
//!    of its tasks succeeds, until `max_parallel` (see [`Limit`]).

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
    /// It reached a spend cap and waits for a person: no slot, the run waits for it, and its
    /// provider is not held for it.
    Capped,
    /// It goes on again.
    Going,
}

/// Where a provider's rate limit stands in a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Limit {
    /// A task of the provider waits for its limit to lift: none of its tasks starts.
    Holding,
    /// The limit has lifted: its tasks start while fewer than this many are going.
    Ramping(usize),
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
    /// Paused tasks that wait at a spend cap, not on their provider.
    capped: HashSet<TaskId>,
    /// The run or the day reached its spend cap: no task starts while anything is active
    /// (the one that starts with nothing else going pauses before it begins, and asks).
    spend_held: bool,
    /// Each task's provider (see `crew_core::config::AgentDef::provider`).
    providers: HashMap<TaskId, String>,
    /// The providers whose rate limit a task met, until they are back to `max_parallel`.
    limits: HashMap<String, Limit>,
    /// Providers held until a time the executor keeps (a task they refused before it began
    /// is queued again): no task waits on them, and they lift only when told.
    timed: HashSet<String>,
    max_parallel: usize,
    fail_fast: bool,
    cancelled: bool,
    failed_fast: bool,
}

impl Schedule {
    /// The schedule of `tasks`, each of the provider `provider` names.
    pub(super) fn new(
        tasks: &[TaskRecord],
        max_parallel: usize,
        fail_fast: bool,
        provider: &dyn Fn(&TaskRecord) -> String,
    ) -> Self {
        let mut schedule = Schedule {
            order: Vec::new(),
            depends: HashMap::new(),
            statuses: BTreeMap::new(),
            active: HashSet::new(),
            held: HashSet::new(),
            paused: HashSet::new(),
            capped: HashSet::new(),
            spend_held: false,
            providers: HashMap::new(),
            limits: HashMap::new(),
            timed: HashSet::new(),
            max_parallel: max_parallel.max(1),
            fail_fast,
            cancelled: false,
            failed_fast: false,
        };
        schedule.add(tasks, provider);
        schedule
    }

    /// Adds tasks (of a new run, or submitted by an agent) with their recorded status, each of
    /// the provider `provider` names.
    pub(super) fn add(&mut self, tasks: &[TaskRecord], provider: &dyn Fn(&TaskRecord) -> String) {
        for task in tasks {
            self.providers.insert(task.id.clone(), provider(task));
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
            if ready
                && self.active.len() - self.held.len() - self.paused.len() < self.max_parallel
                && self.provider_allows(&task)
                && (!self.spend_held || self.active.is_empty())
            {
                self.active.insert(task.clone());
                self.statuses.insert(task.clone(), TaskStatus::Preparing);
                steps.push(Step::Start(task));
            }
        }
        steps
    }

    /// Whether `task`'s provider lets one more of its tasks start (rule 4).
    fn provider_allows(&self, task: &TaskId) -> bool {
        let Some(provider) = self.providers.get(task) else {
            return true;
        };
        match self.limits.get(provider) {
            None => true,
            Some(Limit::Holding) => false,
            Some(Limit::Ramping(allowed)) => self.going_of(provider) < *allowed,
        }
    }

    /// How many tasks of `provider` are going: active, neither held nor paused.
    fn going_of(&self, provider: &str) -> usize {
        self.active
            .iter()
            .filter(|task| !self.held.contains(*task) && !self.paused.contains(*task))
            .filter(|task| self.providers.get(*task).is_some_and(|of| of == provider))
            .count()
    }

    /// The providers whose limit is held for a task that waits no more: ramping up from
    /// what they have going.
    fn lift_limits(&mut self) {
        let waiting: HashSet<&String> = self
            .paused
            .iter()
            .filter(|task| !self.capped.contains(*task))
            .filter_map(|task| self.providers.get(task))
            .collect();
        let lifted: Vec<String> = self
            .limits
            .iter()
            .filter(|(provider, limit)| {
                **limit == Limit::Holding
                    && !waiting.contains(provider)
                    && !self.timed.contains(*provider)
            })
            .map(|(provider, _)| provider.clone())
            .collect();
        for provider in lifted {
            let allowed = self.going_of(&provider) + 1;
            self.limits.insert(provider, Limit::Ramping(allowed));
        }
    }

    /// The provider of `task`, which it refused before it began (the task is queued again):
    /// held until [`Schedule::lift`].
    pub(super) fn hold_provider_of(&mut self, task: &TaskId) -> Option<String> {
        let provider = self.providers.get(task)?.clone();
        self.limits.insert(provider.clone(), Limit::Holding);
        self.timed.insert(provider.clone());
        Some(provider)
    }

    /// The time `provider` was held until has come: it ramps back up once no task of its
    /// waits.
    pub(super) fn lift(&mut self, provider: &str) {
        self.timed.remove(provider);
        self.lift_limits();
    }

    /// Where `provider`'s limit stands, if it met one.
    #[cfg(test)]
    fn limit_of(&self, provider: &str) -> Option<Limit> {
        self.limits.get(provider).copied()
    }

    /// A task ended with `status`. Returns `true` when this ending stops the run (the first
    /// failure with `fail_fast`): the executor cancels the tasks still going.
    pub(super) fn ended(&mut self, task: &TaskId, status: TaskStatus) -> bool {
        self.active.remove(task);
        self.held.remove(task);
        self.paused.remove(task);
        self.capped.remove(task);
        self.statuses.insert(task.clone(), status);
        // A provider ramping back up gets one task more for each that succeeds.
        if let Some(provider) = self.providers.get(task)
            && let Some(Limit::Ramping(allowed)) = self.limits.get(provider).copied()
            && status == TaskStatus::Succeeded
        {
            match allowed + 1 >= self.max_parallel {
                true => self.limits.remove(provider),
                false => self
                    .limits
                    .insert(provider.clone(), Limit::Ramping(allowed + 1)),
            };
        }
        self.lift_limits();
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
        self.capped.remove(task);
        if !self.active.contains(task) {
            return;
        }
        match hold {
            Hold::Stopped => self.held.insert(task.clone()),
            Hold::Paused => {
                if let Some(provider) = self.providers.get(task) {
                    self.limits.insert(provider.clone(), Limit::Holding);
                }
                self.paused.insert(task.clone())
            }
            Hold::Capped => {
                self.capped.insert(task.clone());
                self.paused.insert(task.clone())
            }
            Hold::Going => false,
        };
        self.lift_limits();
    }

    /// Whether the run or the day is at its spend cap (see `spend_held`).
    pub(super) fn spend_hold(&mut self, held: bool) {
        self.spend_held = held;
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

    use super::{Hold, Limit, Schedule, Step};

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

    /// A task of agent `agent` (its provider, here).
    fn task_of(id: &str, agent: &str) -> TaskRecord {
        let mut task = task(id, &[]);
        task.agent = agent.to_owned();
        task
    }

    fn agent(task: &TaskRecord) -> String {
        task.agent.clone()
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
        let mut schedule = Schedule::new(&tasks, 2, false, &agent);
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
        let mut schedule = Schedule::new(&tasks, 4, false, &agent);
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
        let mut schedule = Schedule::new(&tasks, 1, false, &agent);
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
        let tasks = [task("a", &[]), task_of("b", "other"), task("c", &[])];
        let mut schedule = Schedule::new(&tasks, 1, false, &agent);
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
    fn a_run_at_its_spend_cap_starts_one_task_only_when_nothing_else_is_going() {
        let tasks = [task("a", &[]), task("b", &[]), task("c", &[])];
        let mut schedule = Schedule::new(&tasks, 3, false, &agent);
        schedule.spend_hold(true);
        // Nothing going: one starts (it pauses before it begins, and asks).
        assert_eq!(started(&schedule.next_steps()), ["a"]);
        assert!(started(&schedule.next_steps()).is_empty());
        // Paused at the cap, it holds no slot and no provider; nothing more starts.
        schedule.hold(&id("a"), Hold::Capped);
        assert!(started(&schedule.next_steps()).is_empty());
        assert_eq!(schedule.limit_of("claude"), None);
        // A person let it go on: the cap lifts, and the rest start.
        schedule.hold(&id("a"), Hold::Going);
        schedule.spend_hold(false);
        assert_eq!(started(&schedule.next_steps()), ["b", "c"]);
    }

    #[test]
    fn fail_fast_stops_the_run_once_and_cancels_what_has_not_started() {
        let tasks = [task("a", &[]), task("b", &[]), task("c", &[])];
        let mut schedule = Schedule::new(&tasks, 2, true, &agent);
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
        let mut schedule = Schedule::new(&tasks, 1, false, &agent);
        assert_eq!(started(&schedule.next_steps()), ["a"]);
        assert!(!schedule.ended(&id("a"), TaskStatus::Failed));
        assert_eq!(started(&schedule.next_steps()), ["b"]);
    }

    #[test]
    fn a_cancelled_run_starts_nothing_more_and_ends_cancelled() {
        let tasks = [task("a", &[]), task("b", &["a"])];
        let mut schedule = Schedule::new(&tasks, 1, false, &agent);
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
        let mut schedule = Schedule::new(&[lead, failed], 1, false, &agent);
        assert_eq!(schedule.next_steps(), []);
        assert!(schedule.is_over());
        schedule.add(&[task("x", &["lead"]), task("y", &["x"])], &agent);
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
        let mut schedule = Schedule::new(&[waiting, task("b", &[])], 1, false, &agent);
        schedule.adopt(&id("asker"));
        assert_eq!(schedule.next_steps(), []);
        schedule.ended(&id("asker"), TaskStatus::Succeeded);
        assert_eq!(started(&schedule.next_steps()), ["b"]);
    }

    #[test]
    fn a_limited_provider_starts_nothing_until_its_limit_lifts_then_ramps_one_at_a_time() {
        let mut tasks: Vec<TaskRecord> = ["a", "b", "c", "d", "e", "f", "g", "h"]
            .iter()
            .map(|id| task_of(id, "anthropic"))
            .collect();
        tasks.push(task_of("o", "openai"));
        let mut schedule = Schedule::new(&tasks, 5, false, &agent);
        assert_eq!(started(&schedule.next_steps()), ["a", "b", "c", "d", "e"]);
        // Two meet the provider's limit and wait: their slots go to another provider's task.
        schedule.hold(&id("b"), Hold::Paused);
        schedule.hold(&id("c"), Hold::Paused);
        assert_eq!(schedule.limit_of("anthropic"), Some(Limit::Holding));
        assert_eq!(started(&schedule.next_steps()), ["o"]);
        schedule.ended(&id("d"), TaskStatus::Succeeded);
        schedule.ended(&id("e"), TaskStatus::Succeeded);
        assert_eq!(
            schedule.next_steps(),
            [],
            "slots are free, the limit is not"
        );
        // One goes on, one still waits: still held.
        schedule.hold(&id("b"), Hold::Going);
        assert_eq!(schedule.next_steps(), []);
        // None waits: one task more than the three going, then one more for each success.
        schedule.hold(&id("c"), Hold::Going);
        assert_eq!(schedule.limit_of("anthropic"), Some(Limit::Ramping(4)));
        assert_eq!(started(&schedule.next_steps()), ["f"]);
        assert_eq!(schedule.next_steps(), []);
        schedule.ended(&id("a"), TaskStatus::Succeeded);
        assert_eq!(schedule.limit_of("anthropic"), None, "back to max_parallel");
        assert_eq!(started(&schedule.next_steps()), ["g"]);
        schedule.ended(&id("b"), TaskStatus::Succeeded);
        assert_eq!(started(&schedule.next_steps()), ["h"]);
        assert_eq!(schedule.limit_of("openai"), None);
    }

    #[test]
    fn a_limit_whose_waiting_task_ends_lifts_and_a_failure_does_not_ramp() {
        let tasks: Vec<TaskRecord> = ["a", "b", "c", "d"]
            .iter()
            .map(|id| task_of(id, "anthropic"))
            .collect();
        let mut schedule = Schedule::new(&tasks, 4, false, &agent);
        assert_eq!(started(&schedule.next_steps()), ["a", "b", "c", "d"]);
        schedule.hold(&id("a"), Hold::Paused);
        schedule.hold(&id("b"), Hold::Paused);
        // A person stops one that waited, the other ends: nothing waits any more.
        schedule.ended(&id("a"), TaskStatus::Stopped);
        schedule.ended(&id("b"), TaskStatus::Failed);
        assert_eq!(schedule.limit_of("anthropic"), Some(Limit::Ramping(3)));
        schedule.ended(&id("c"), TaskStatus::Failed);
        assert_eq!(schedule.limit_of("anthropic"), Some(Limit::Ramping(3)));
    }

    #[test]
    fn a_task_refused_before_it_began_is_queued_again_and_its_provider_held_until_told() {
        let tasks: Vec<TaskRecord> = ["a", "b", "c"]
            .iter()
            .map(|id| task_of(id, "anthropic"))
            .collect();
        let mut schedule = Schedule::new(&tasks, 3, false, &agent);
        assert_eq!(started(&schedule.next_steps()), ["a", "b", "c"]);
        // c was refused at its first request: queued again, its provider held.
        schedule.ended(&id("c"), TaskStatus::Pending);
        assert_eq!(
            schedule.hold_provider_of(&id("c")).as_deref(),
            Some("anthropic")
        );
        assert_eq!(schedule.next_steps(), [], "held, though a slot is free");
        assert!(!schedule.is_over());
        // Nothing waits, but the hold is timed: a success does not lift it.
        schedule.ended(&id("a"), TaskStatus::Succeeded);
        assert_eq!(schedule.next_steps(), []);
        schedule.lift("anthropic");
        assert_eq!(schedule.limit_of("anthropic"), Some(Limit::Ramping(2)));
        assert_eq!(started(&schedule.next_steps()), ["c"]);
        schedule.ended(&id("b"), TaskStatus::Succeeded);
        schedule.ended(&id("c"), TaskStatus::Succeeded);
        assert!(schedule.is_over());
        assert_eq!(schedule.run_status(), RunStatus::Completed);
    }
}
