//! The live block `crew run` draws on a terminal: a header with counts, then one line per task
//! — its state, how long it has been at it, and what it is doing — redrawn in place and
//! rate-limited (indicatif). When the run ends the block is cleared and the summary takes its
//! place. Piped, quiet, `NO_COLOR` or `TERM=dumb`, `crew run` appends lines instead
//! (`foreground::print_progress`).

use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use crew_core::model::{TaskRecord, TaskStatus};
use crew_core::provider::Progress;
use crew_core::{RunId, TaskId};
use crew_live::{AgentEvent, HostEvent, HostEvents};

use crate::context::Context;
use crate::ui::{Style, sanitize, truncate};

/// How often the block may redraw, at most.
const REDRAWS_PER_SECOND: u8 = 10;
/// How often elapsed times move on when nothing else happens.
const TICK: Duration = Duration::from_secs(1);

/// What a task's line says after its state.
#[derive(Debug, Clone, PartialEq)]
enum Doing {
    Nothing,
    /// The agent's latest output line.
    Says(String),
    /// Its workspace's checkout has written `done` of `total` files.
    ChecksOut {
        done: u64,
        total: u64,
    },
    /// It asked, and waits for the user.
    Asks(String),
    /// Its agent exited: the work is being saved and the workspace taken away.
    Saving,
    /// Its agent finished, and this check command runs.
    Checks(String),
    /// How it ended: its branch and lines, or why it failed.
    Ended(String),
}

struct TaskLine {
    id: TaskId,
    bar: ProgressBar,
    status: TaskStatus,
    since: Instant,
    doing: Doing,
}

/// The block of one run.
pub struct Block {
    run_id: RunId,
    multi: MultiProgress,
    header: ProgressBar,
    tasks: Vec<TaskLine>,
    ctx: Context,
}

impl Block {
    fn new(ctx: Context, run_id: RunId, tasks: &[TaskRecord]) -> Self {
        let multi =
            MultiProgress::with_draw_target(ProgressDrawTarget::stdout_with_hz(REDRAWS_PER_SECOND));
        let header = multi.add(line_bar());
        let mut block = Block {
            run_id,
            multi,
            header,
            tasks: Vec::new(),
            ctx,
        };
        for task in tasks {
            block.line_of(&task.id).status = task.status;
        }
        block.redraw_all();
        block
    }

    /// The line of task `id`, added when the task is new (a lead agent's sub-task).
    fn line_of(&mut self, id: &TaskId) -> &mut TaskLine {
        let index = match self.tasks.iter().position(|line| &line.id == id) {
            Some(index) => index,
            None => {
                self.tasks.push(TaskLine {
                    id: id.clone(),
                    bar: self.multi.add(line_bar()),
                    status: TaskStatus::Pending,
                    since: Instant::now(),
                    doing: Doing::Nothing,
                });
                self.tasks.len() - 1
            }
        };
        &mut self.tasks[index]
    }

    fn on_event(&mut self, event: HostEvent) {
        match event {
            HostEvent::Task(change) if change.run_id == self.run_id => {
                let line = self.line_of(&change.task_id);
                if line.status != change.status {
                    line.since = Instant::now();
                }
                line.status = change.status;
                line.doing = match change.status {
                    TaskStatus::Waiting => Doing::Asks(change.reason.clone().unwrap_or_default()),
                    TaskStatus::Paused => Doing::Says(change.reason.clone().unwrap_or_default()),
                    status if status.is_finished() => Doing::Ended(ended(&change)),
                    TaskStatus::Running => match &line.doing {
                        Doing::Says(said) => Doing::Says(said.clone()),
                        _ => Doing::Nothing,
                    },
                    _ => Doing::Nothing,
                };
                let index = self.index_of(&change.task_id);
                self.redraw(index);
                self.redraw_header();
            }
            HostEvent::Activity(activity) if activity.run_id == self.run_id => {
                let line = self.line_of(&activity.task_id);
                line.doing = match (activity.progress, line.status) {
                    (Progress::Checkout { done, total }, TaskStatus::Preparing) => {
                        Doing::ChecksOut { done, total }
                    }
                    (Progress::Check { command }, TaskStatus::Running) => Doing::Checks(command),
                    _ => return,
                };
                let index = self.index_of(&activity.task_id);
                self.redraw(index);
            }
            HostEvent::Agent(event) if event.agent_id().run_id() == &self.run_id => {
                let task_id = event.agent_id().task_id().clone();
                let line = self.line_of(&task_id);
                match *event {
                    // While it waits, its question is what the user needs to see, not the
                    // lines that came with it (`crew ask` says it recorded the question).
                    AgentEvent::Output { .. } if matches!(line.doing, Doing::Asks(_)) => return,
                    AgentEvent::Output { line: said, .. } if !said.trim().is_empty() => {
                        line.doing = Doing::Says(said);
                    }
                    AgentEvent::Question { question, .. } => line.doing = Doing::Asks(question),
                    AgentEvent::Exited { .. } if line.status == TaskStatus::Running => {
                        line.doing = Doing::Saving;
                    }
                    _ => return,
                }
                let index = self.index_of(&task_id);
                self.redraw(index);
            }
            _ => {}
        }
    }

    fn index_of(&self, id: &TaskId) -> usize {
        self.tasks
            .iter()
            .position(|line| &line.id == id)
            .expect("every task has a line")
    }

    fn redraw_all(&self) {
        self.redraw_header();
        for index in 0..self.tasks.len() {
            self.redraw(index);
        }
    }

    fn redraw_header(&self) {
        let count = |wanted: &dyn Fn(TaskStatus) -> bool| {
            self.tasks.iter().filter(|line| wanted(line.status)).count()
        };
        let running =
            count(&|status| matches!(status, TaskStatus::Preparing | TaskStatus::Running));
        let waiting = count(&|status| status == TaskStatus::Waiting);
        let done = count(&|status| status == TaskStatus::Succeeded);
        let failed = count(&|status| status.is_finished() && status != TaskStatus::Succeeded);
        let ui = &self.ctx.ui;
        let waiting = if waiting > 0 {
            ui.paint(&format!("{waiting} waiting for you"), Style::Warn)
        } else {
            "0 waiting".to_owned()
        };
        self.header.set_message(format!(
            "  {running} running · {waiting} · {done} done · {failed} failed or stopped"
        ));
    }

    fn redraw(&self, index: usize) {
        let line = &self.tasks[index];
        let ui = &self.ctx.ui;
        let elapsed = if line.status == TaskStatus::Pending || line.status.is_finished() {
            String::new()
        } else {
            crate::ui::duration(line.since.elapsed())
        };
        let doing = match &line.doing {
            Doing::Nothing => String::new(),
            Doing::Says(said) => sanitize(said),
            Doing::Asks(question) => ui.paint(
                &format!("waiting for you: {}", sanitize(question)),
                Style::Warn,
            ),
            Doing::Saving => "saving work".to_owned(),
            Doing::Checks(command) => format!("check: {}", sanitize(command)),
            Doing::ChecksOut { done, total } => format!(
                "checkout {}% ({done} of {total} files)",
                (done * 100).checked_div(*total).unwrap_or(100)
            ),
            Doing::Ended(how) => ui.paint(how, Style::Dim),
        };
        line.bar.set_message(format!(
            "  {} {:<14} {:<10} {:>6}  {doing}",
            symbol(line.status),
            truncate(line.id.as_str(), 14),
            ui.task_status(line.status),
            elapsed
        ));
    }

    /// Clears the block: what comes next (the summary) takes its place.
    fn clear(&self) {
        // A terminal that went away has nothing left to clear.
        let _ = self.multi.clear();
    }
}

/// A bar that is only its message, cut to the terminal's width.
fn line_bar() -> ProgressBar {
    let bar = ProgressBar::new_spinner();
    bar.set_style(ProgressStyle::with_template("{wide_msg}").expect("a valid template"));
    bar
}

/// A task's state at a glance, not by colour alone.
fn symbol(status: TaskStatus) -> &'static str {
    match status {
        TaskStatus::Pending => "·",
        TaskStatus::Preparing | TaskStatus::Running => "▸",
        TaskStatus::Waiting => "?",
        TaskStatus::Paused => "=",
        TaskStatus::Succeeded => "✓",
        TaskStatus::Stopped | TaskStatus::Cancelled | TaskStatus::Skipped => "-",
        TaskStatus::Failed | TaskStatus::Interrupted => "✗",
    }
}

/// How a finished task ended, in a few words: its branch and lines, or why.
fn ended(change: &crew_live::project::runner::TaskProgress) -> String {
    let report = change.task.as_ref().and_then(|task| task.teardown.as_ref());
    let mut how = match report.and_then(|report| report.branch.as_ref()) {
        Some(branch) => {
            let stat = report
                .and_then(|report| report.diffstat)
                .map(|stat| format!(" (+{} -{})", stat.insertions, stat.deletions))
                .unwrap_or_default();
            format!("{branch}{stat}")
        }
        None => String::new(),
    };
    if let Some(reason) = change
        .reason
        .as_deref()
        .filter(|_| change.status != TaskStatus::Succeeded)
    {
        if !how.is_empty() {
            how.push_str("  ");
        }
        how.push_str(&sanitize(reason.lines().next().unwrap_or_default()));
    }
    how
}

/// Draws the block of `run_id` until `finish` says the run is over, then clears it.
pub async fn show(
    mut events: HostEvents,
    mut finish: tokio::sync::oneshot::Receiver<()>,
    ctx: Context,
    run_id: RunId,
    tasks: Vec<TaskRecord>,
) {
    let mut block = Block::new(ctx, run_id, &tasks);
    let mut tick = tokio::time::interval(TICK);
    loop {
        tokio::select! {
            biased;
            event = events.next() => match event {
                Some(Ok(event)) => block.on_event(event),
                // Missed events are made up by the next ones; a closed stream ends nothing.
                Some(Err(_)) => {}
                None => break,
            },
            _ = tick.tick() => block.redraw_all(),
            _ = &mut finish => break,
        }
    }
    block.clear();
}

/// Runs `work` off the async threads; on a live terminal a spinner says `what` is going on and
/// for how long, and is cleared when it is done. For long commands outside a run
/// (`crew worktrees prune`, `crew runs prune`).
pub async fn while_working<T: Send + 'static>(
    ui: &crate::ui::Ui,
    what: &str,
    work: impl FnOnce() -> T + Send + 'static,
) -> T {
    let spinner = ui.live.then(|| {
        let spinner = ProgressBar::with_draw_target(
            None,
            ProgressDrawTarget::stdout_with_hz(REDRAWS_PER_SECOND),
        );
        spinner.set_style(
            ProgressStyle::with_template("{spinner} {msg} {elapsed}").expect("a valid template"),
        );
        spinner.set_message(what.to_owned());
        spinner.enable_steady_tick(Duration::from_millis(100));
        spinner
    });
    let done = tokio::task::spawn_blocking(work)
        .await
        .expect("the work does not panic");
    if let Some(spinner) = spinner {
        spinner.finish_and_clear();
    }
    done
}
