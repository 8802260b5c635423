//! What a run's tasks spent, against their spend caps (DESIGN §8c): each task's own, the
//! run's, and the user's of a day. Each turn's cost its agent reports is added here (and to
//! the user's ledger of the day); the first cap it reaches pauses the task before its next
//! turn, and a run or a day at its cap starts no new task. A person who lets a task go on
//! gives the cap it reached another cap's worth.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crew_core::TaskId;
use crew_core::config::DayLedger;
use crew_core::config::spend::dollars;
use crew_core::model::{CapKind, RunManifest, SpendCap};

use crate::agent::{OverCap, SpendMeter};

/// A run's spend, shared by its tasks' meters.
#[derive(Debug, Clone)]
pub(in crate::project::runner) struct SpendBook {
    book: Arc<Mutex<Book>>,
    ledger: Option<DayLedger>,
}

#[derive(Debug)]
struct Book {
    /// What each task spent over all its starts, and its own cap.
    tasks: HashMap<TaskId, (f64, Option<SpendCap>)>,
    run_spent: f64,
    run: Option<SpendCap>,
    day: Option<SpendCap>,
    /// Tasks paused at a cap, and which: the next start of their agent goes on past it.
    paused: HashMap<TaskId, CapKind>,
}

impl SpendBook {
    /// The book of `manifest`'s run, from what its tasks' records say they spent.
    pub(in crate::project::runner) fn of(manifest: &RunManifest) -> Self {
        let tasks: HashMap<TaskId, (f64, Option<SpendCap>)> = manifest
            .tasks
            .iter()
            .map(|task| {
                let spent = task.usage.and_then(|usage| usage.cost_usd).unwrap_or(0.0);
                (task.id.clone(), (spent, task.max_cost))
            })
            .collect();
        let run_spent = tasks.values().map(|(spent, _)| spent).sum();
        SpendBook {
            book: Arc::new(Mutex::new(Book {
                tasks,
                run_spent,
                run: manifest.max_cost,
                day: manifest.day_cap,
                paused: manifest
                    .tasks
                    .iter()
                    .filter_map(|task| Some((task.id.clone(), task.capped?)))
                    .collect(),
            })),
            ledger: manifest.day_cap.and_then(|_| DayLedger::of_user()),
        }
    }

    fn book(&self) -> std::sync::MutexGuard<'_, Book> {
        self.book
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Tasks added to the run since it started (submitted by an agent), with their caps.
    pub(in crate::project::runner) fn add(&self, task: &TaskId, cap: Option<SpendCap>) {
        self.book().tasks.entry(task.clone()).or_insert((0.0, cap));
    }

    /// Whether any cap holds `task` (its own, its run's, the day's).
    pub(in crate::project::runner) fn caps(&self, task: &TaskId) -> bool {
        let book = self.book();
        book.run.is_some()
            || book.day.is_some()
            || book.tasks.get(task).is_some_and(|(_, cap)| cap.is_some())
    }

    /// The meter of `task`'s agent: each turn's cost is added here.
    pub(in crate::project::runner) fn meter(&self, task: &TaskId) -> Arc<dyn SpendMeter> {
        Arc::new(TaskMeter {
            book: self.clone(),
            task: task.clone(),
        })
    }

    /// `task`'s turn cost `usd`: the cap it reached, if any.
    fn spent(&self, task: &TaskId, usd: f64) -> Option<OverCap> {
        if let Some(ledger) = &self.ledger
            && let Err(error) = ledger.add(usd)
        {
            tracing::warn!("the day's spend could not be recorded: {error}");
        }
        let mut book = self.book();
        book.run_spent += usd;
        let entry = book.tasks.entry(task.clone()).or_insert((0.0, None));
        entry.0 += usd;
        let (spent, cap) = *entry;
        if let Some(cap) = cap
            && cap.reached(spent)
        {
            return Some(OverCap {
                kind: CapKind::Task,
                reason: format!(
                    "it spent {} and its spend cap is {} (max_cost_usd)",
                    dollars(spent),
                    dollars(cap.cap_usd)
                ),
                stopped_short: false,
            });
        }
        drop(book);
        self.run_or_day_reached()
    }

    /// The run's or the day's cap, when what they spent reached it: no new task starts.
    pub(in crate::project::runner) fn run_or_day_reached(&self) -> Option<OverCap> {
        let book = self.book();
        if let Some(run) = book.run
            && run.reached(book.run_spent)
        {
            return Some(OverCap {
                kind: CapKind::Run,
                reason: format!(
                    "its run spent {} and the run's spend cap is {} (max_cost_usd)",
                    dollars(book.run_spent),
                    dollars(run.cap_usd)
                ),
                stopped_short: false,
            });
        }
        let day = book.day?;
        let today = self.ledger.as_ref()?.spent_today();
        day.reached(today).then(|| OverCap {
            kind: CapKind::Day,
            reason: format!(
                "every run of the day spent {} together and the day's spend cap is {} (max_cost_usd_per_day in your crew settings)",
                dollars(today),
                dollars(day.cap_usd)
            ),
            stopped_short: false,
        })
    }

    /// `task` is paused at `kind`: its agent's next start goes on past it.
    pub(in crate::project::runner) fn paused_at(&self, task: &TaskId, kind: CapKind) {
        self.book().paused.insert(task.clone(), kind);
    }

    /// The task's, the run's and the day's caps as they are now, to record.
    pub(in crate::project::runner) fn caps_of(
        &self,
        task: &TaskId,
    ) -> (Option<SpendCap>, Option<SpendCap>, Option<SpendCap>) {
        let book = self.book();
        let own = book.tasks.get(task).and_then(|(_, cap)| *cap);
        (own, book.run, book.day)
    }

    /// A person let `task`, paused at a cap, go on (its agent starts again): that cap allows
    /// another cap's worth past what it reached.
    fn go_on(&self, task: &TaskId) {
        let Some(kind) = self.book().paused.remove(task) else {
            return;
        };
        self.grant(task, kind);
    }

    /// `kind` allows another cap's worth past what it reached, for `task`.
    fn grant(&self, task: &TaskId, kind: CapKind) {
        let today = match kind {
            CapKind::Day => self.ledger.as_ref().map_or(0.0, DayLedger::spent_today),
            _ => 0.0,
        };
        let mut book = self.book();
        let run_spent = book.run_spent;
        match kind {
            CapKind::Task => {
                if let Some((spent, Some(cap))) = book.tasks.get_mut(task) {
                    cap.grant(*spent);
                }
            }
            CapKind::Run => {
                if let Some(cap) = &mut book.run {
                    cap.grant(run_spent);
                }
            }
            CapKind::Day => {
                if let Some(cap) = &mut book.day {
                    cap.grant(today);
                }
            }
        }
    }
}

/// One task's meter.
#[derive(Debug)]
struct TaskMeter {
    book: SpendBook,
    task: TaskId,
}

impl SpendMeter for TaskMeter {
    fn turn_cost(&self, usd: f64) -> Option<OverCap> {
        self.book.spent(&self.task, usd)
    }

    fn going_on(&self) {
        self.book.go_on(&self.task);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crew_core::config::CostCap;

    fn cap(usd: f64) -> Option<SpendCap> {
        Some(SpendCap::new(CostCap::new(usd).unwrap()))
    }

    fn book(task_cap: Option<SpendCap>, run: Option<SpendCap>) -> SpendBook {
        SpendBook {
            book: Arc::new(Mutex::new(Book {
                tasks: HashMap::from([(TaskId::parse("a").unwrap(), (0.0, task_cap))]),
                run_spent: 0.0,
                run,
                day: None,
                paused: HashMap::new(),
            })),
            ledger: None,
        }
    }

    #[test]
    fn a_task_reaches_its_cap_and_a_grant_allows_another_cap_s_worth() {
        let a = TaskId::parse("a").unwrap();
        let book = book(cap(0.01), None);
        let meter = book.meter(&a);
        assert_eq!(meter.turn_cost(0.005), None);
        let over = meter.turn_cost(0.0075).expect("$0.0125 reached $0.01");
        assert_eq!(over.kind, CapKind::Task);
        assert!(over.reason.contains("$0.0125"), "{}", over.reason);
        book.paused_at(&a, CapKind::Task);
        meter.going_on();
        let (own, _, _) = book.caps_of(&a);
        assert_eq!(own.unwrap().allowed_usd, 0.0125 + 0.01);
        // Only once: a later start is no new go-on.
        meter.going_on();
        assert_eq!(book.caps_of(&a).0.unwrap().allowed_usd, 0.0125 + 0.01);
        assert_eq!(meter.turn_cost(0.005), None);
        assert!(meter.turn_cost(0.005).is_some());
    }

    #[test]
    fn a_run_at_its_cap_holds_every_task_and_its_grant_lifts_it() {
        let (a, b) = (TaskId::parse("a").unwrap(), TaskId::parse("b").unwrap());
        let book = book(None, cap(1.0));
        book.add(&b, None);
        assert_eq!(book.meter(&a).turn_cost(0.6), None);
        let over = book.meter(&b).turn_cost(0.6).expect("the run spent $1.20");
        assert_eq!(over.kind, CapKind::Run);
        assert!(book.run_or_day_reached().is_some());
        assert!(
            book.meter(&a).turn_cost(0.0).is_some(),
            "the run's cap holds a too"
        );
        book.paused_at(&b, CapKind::Run);
        book.meter(&b).going_on();
        assert_eq!(book.run_or_day_reached(), None);
    }
}
