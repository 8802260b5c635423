//! The board of `crew watch`: what it knows of the project's agents ([`Board`]), what a key
//! does to it ([`Board::key`]), and how it is drawn ([`view`]).
//!
//! The board is built from what the library's watch hears ([`Watched`]): the records of the
//! runs, the live agents of each host, output lines and task changes. Keys change the board or
//! ask for an [`Action`] (steer, stop, …), which the command carries out through the front door
//! and reports back with [`Board::done`].

mod keys;
pub mod view;

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::SystemTime;

use crew_core::model::{RunManifest, TaskRecord, TaskStatus};
use crew_core::{AgentId, RunId, TaskId};
use crew_live::{AgentSnapshot, WatchEvent, Watched};

use crate::ui::sanitize;

/// How many lines of each agent's output the board keeps, and how many bytes at most: 200
/// agents printing long lines stay within a few tens of megabytes.
const TAIL_LINES: usize = 2000;
const TAIL_BYTES: usize = 128 * 1024;
/// How many runs the board shows (the live ones always).
pub const RECENT_RUNS: usize = 10;

/// An agent's state as the board draws it: each has a symbol of its own, not a colour alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RowState {
    /// It asked a question and waits for the answer.
    Waiting,
    /// It failed, and nobody has looked yet.
    FailedUnread,
    /// It finished, and nobody has looked at its work yet.
    DoneUnread,
    /// It finished but its check failed, and nobody has looked yet.
    CheckFailedUnread,
    Working,
    /// Its agent finished and its task's check runs.
    Checking,
    /// Alive between turns, waiting for a message.
    Idle,
    /// Its agent hit a usage limit and goes on when it lifts.
    Paused,
    /// It reached a spend cap and asks whether to go on (`r`) or end (`s`).
    AtCap,
    /// Not started yet (its dependencies, its workspace being prepared).
    Queued,
    Failed,
    /// It finished but its check failed.
    CheckFailed,
    Done,
    Stopped,
    Skipped,
}

impl RowState {
    /// Whether the agent needs the user: `n` jumps to these, and they come first.
    pub fn needs_you(self) -> bool {
        matches!(
            self,
            RowState::Waiting
                | RowState::AtCap
                | RowState::FailedUnread
                | RowState::CheckFailedUnread
                | RowState::DoneUnread
        )
    }

    pub fn label(self) -> &'static str {
        match self {
            RowState::Waiting => "waiting",
            RowState::FailedUnread | RowState::Failed => "failed",
            RowState::DoneUnread => "done*",
            RowState::CheckFailedUnread | RowState::CheckFailed => "chk-fail",
            RowState::Checking => "checking",
            RowState::Done => "done",
            RowState::Working => "working",
            RowState::Idle => "idle",
            RowState::Paused => "paused",
            RowState::AtCap => "at cap",
            RowState::Queued => "queued",
            RowState::Stopped => "stopped",
            RowState::Skipped => "skipped",
        }
    }
}

/// One row: an agent of a run the board shows.
#[derive(Debug, Clone)]
pub struct Row {
    pub agent_id: AgentId,
    pub agent: String,
    pub state: RowState,
    pub branch: Option<String>,
    /// Lines added and removed, once its work is on its branch.
    pub lines: Option<(usize, usize)>,
    pub started_at: Option<SystemTime>,
    pub last_line: String,
    /// How many lead agents up it was submitted (0: a task of the run's own).
    pub depth: usize,
    /// The ports of its lease while it holds them (`20000–20003`).
    pub ports: Option<String>,
    /// What its capped agent holds now, while it runs.
    pub using: Option<crew_live::control::registry::Using>,
}

/// What the lower part of the screen shows for the selected agent.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Pane {
    #[default]
    None,
    /// Its output, following.
    Output,
    /// Its question.
    Question,
    /// Its work against its base; `None` while it is being computed.
    Diff {
        agent_id: AgentId,
        text: Option<Vec<String>>,
        scroll: usize,
    },
    Help,
}

/// A line the user is typing, and what it is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prompt {
    Answer(AgentId),
    Steer(AgentId),
    FollowUp(AgentId),
    Filter,
    /// `y` stops the agent; anything else does not.
    ConfirmStop(AgentId),
}

impl Prompt {
    pub fn label(&self) -> String {
        match self {
            Prompt::Answer(agent) => format!("answer {agent}: "),
            Prompt::Steer(agent) => format!("steer {agent}: "),
            Prompt::FollowUp(agent) => format!("follow up {agent}: "),
            Prompt::Filter => "filter: ".to_owned(),
            Prompt::ConfirmStop(agent) => format!("stop {agent}? (y/n) "),
        }
    }
}

/// Something the board asks the command to do.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    Answer(AgentId, String),
    Steer(AgentId, String),
    FollowUp(AgentId, String),
    Stop(AgentId),
    Resume(AgentId),
    /// Compute the diff of this task (its record says where its work is).
    Diff(AgentId, Box<TaskRecord>),
    /// Read the end of this agent's output log: all the pane holds when its output pane
    /// opens, a glance for its last line when it is shown finished with nothing heard.
    ReadTail(AgentId, Glance),
    Quit,
}

/// How much of a log to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Glance {
    /// Enough for the last line.
    LastLine,
    /// What the output pane holds.
    Pane,
}

/// A key, as the board understands it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    Char(char),
    Enter,
    Esc,
    Backspace,
    Up,
    Down,
    PageUp,
    PageDown,
    /// Ctrl-C: quits like `q` (never stops an agent).
    Interrupt,
}

/// Everything the board knows.
#[derive(Debug, Default)]
pub struct Board {
    /// The runs shown, newest first.
    runs: Vec<RunManifest>,
    live: HashMap<AgentId, AgentSnapshot>,
    tails: HashMap<AgentId, Tail>,
    /// Finished tasks nobody has looked at yet: finished while the board watched, or finished
    /// before with no one having looked (their run's record of who looked says so).
    unread: HashSet<AgentId>,
    /// Tasks whose outcome someone looked at, as their runs record it and as opened here.
    seen: HashSet<AgentId>,
    /// Opened here since the last [`Board::newly_seen`]: for the run's record.
    newly_seen: Vec<AgentId>,
    /// Agents whose output log was read into their tail.
    logs_read: HashSet<AgentId>,
    /// Finished agents whose last line was looked up in their log.
    glanced: HashSet<AgentId>,
    selected: Option<AgentId>,
    pub pane: Pane,
    pub prompt: Option<Prompt>,
    pub input: String,
    pub filter: String,
    /// What the last action gave, for the status line.
    pub status: Option<String>,
    /// An agent started waiting or failed since the last draw.
    pub bell: bool,
    /// Output lines the hosts dropped because the board fell behind.
    pub missed: u64,
}

impl Board {
    /// What the run `run_id` records of the tasks someone looked at: told before its record
    /// is heard, so that finished work nobody looked at shows as such.
    pub fn know_seen(&mut self, run_id: &RunId, tasks: impl IntoIterator<Item = TaskId>) {
        for task in tasks {
            self.seen.insert(AgentId::new(run_id.clone(), task));
        }
    }

    /// The tasks opened here since the last call, for their runs to record.
    pub fn newly_seen(&mut self) -> Vec<AgentId> {
        std::mem::take(&mut self.newly_seen)
    }

    /// Takes in what the watch heard.
    pub fn hear(&mut self, watched: Watched) {
        match watched {
            Watched::Run(manifest) => self.set_run(*manifest),
            Watched::Agents(agents) => {
                for agent in agents {
                    self.set_agent(agent);
                }
            }
            Watched::Event(WatchEvent::Agent { agent }) => self.set_agent(*agent),
            Watched::Event(WatchEvent::Output { agent_id, line }) => {
                self.push_line(&agent_id, &line);
            }
            Watched::Event(WatchEvent::Task {
                run_id,
                task_id,
                status,
                task,
            }) => {
                let agent_id = AgentId::new(run_id.clone(), task_id.clone());
                let before = self.state_of(&agent_id);
                let Some(run) = self.runs.iter_mut().find(|run| run.run_id == run_id) else {
                    return;
                };
                match (task, run.tasks.iter_mut().find(|t| t.id == task_id)) {
                    (Some(task), Some(slot)) => *slot = *task,
                    (Some(task), None) => run.tasks.push(*task),
                    (None, Some(slot)) => slot.status = status,
                    (None, None) => {}
                }
                if matches!(status, TaskStatus::Succeeded | TaskStatus::Failed) {
                    self.unread.insert(agent_id.clone());
                }
                self.note_change(&agent_id, before);
            }
            Watched::Event(WatchEvent::Lagged { missed }) => self.missed += missed,
        }
    }

    fn set_run(&mut self, manifest: RunManifest) {
        let changed: Vec<(AgentId, Option<RowState>)> = manifest
            .tasks
            .iter()
            .map(|task| {
                let id = AgentId::new(manifest.run_id.clone(), task.id.clone());
                let before = self.state_of(&id);
                (id, before)
            })
            .collect();
        match self
            .runs
            .iter_mut()
            .find(|run| run.run_id == manifest.run_id)
        {
            Some(run) => *run = manifest,
            None => {
                self.runs.push(manifest);
                self.runs
                    .sort_by_key(|run| std::cmp::Reverse(run.created_at.0));
                // A board left open for days keeps only what it shows.
                let mut at = 0;
                self.runs.retain(|run| {
                    at += 1;
                    at <= RECENT_RUNS || goes_on(run)
                });
            }
        }
        for (agent_id, before) in changed {
            // A task that was seen running and is now finished is news, and so is one that
            // finished before with nobody having looked at it.
            let finished = self.state_of(&agent_id).is_some_and(is_finished);
            let news = before.is_some_and(|state| !is_finished(state))
                || (before.is_none() && !self.seen.contains(&agent_id));
            if finished && news {
                self.unread.insert(agent_id.clone());
            }
            self.note_change(&agent_id, before);
        }
    }

    fn set_agent(&mut self, agent: AgentSnapshot) {
        let agent_id = agent.agent_id.clone();
        let before = self.state_of(&agent_id);
        let tail = self.tails.entry(agent_id.clone()).or_default();
        if tail.lines.is_empty() {
            for line in &agent.last_lines {
                tail.push(sanitize(line));
            }
        }
        self.live.insert(agent_id.clone(), agent);
        self.note_change(&agent_id, before);
    }

    fn push_line(&mut self, agent_id: &AgentId, line: &str) {
        self.tails
            .entry(agent_id.clone())
            .or_default()
            .push(sanitize(line));
    }

    /// Rings the bell when a shown agent has just started waiting or failed.
    fn note_change(&mut self, agent_id: &AgentId, before: Option<RowState>) {
        let alarming = |state: Option<RowState>| {
            matches!(
                state,
                Some(RowState::Waiting | RowState::FailedUnread | RowState::CheckFailedUnread)
            )
        };
        if before.is_some() && !alarming(before) && alarming(self.state_of(agent_id)) {
            self.bell = true;
        }
    }

    /// The output lines the board holds for an agent (the end of its log once read).
    pub fn tail(&self, agent_id: &AgentId) -> Option<&VecDeque<String>> {
        self.tails.get(agent_id).map(|tail| &tail.lines)
    }

    /// Puts the end of an agent's output log before the lines heard since.
    pub fn set_log_tail(&mut self, agent_id: &AgentId, lines: Vec<String>) {
        let heard = self.tails.remove(agent_id).unwrap_or_default().lines;
        let mut tail = Tail::default();
        for line in &lines {
            tail.push(sanitize(line));
        }
        // The log holds what was heard before it was read: only lines heard after the log's
        // last line are added.
        let overlap = heard
            .iter()
            .rposition(|line| tail.lines.back() == Some(line))
            .map_or(0, |at| at + 1);
        for line in heard.into_iter().skip(overlap) {
            tail.push(line);
        }
        self.tails.insert(agent_id.clone(), tail);
    }

    fn task(&self, agent_id: &AgentId) -> Option<&TaskRecord> {
        self.runs
            .iter()
            .find(|run| &run.run_id == agent_id.run_id())?
            .tasks
            .iter()
            .find(|task| &task.id == agent_id.task_id())
    }

    fn state_of(&self, agent_id: &AgentId) -> Option<RowState> {
        let task = self.task(agent_id)?;
        Some(self.state(agent_id, task))
    }

    fn state(&self, agent_id: &AgentId, task: &TaskRecord) -> RowState {
        let live = self.live.get(agent_id);
        let unread = self.unread.contains(agent_id);
        match task.status {
            TaskStatus::Waiting => RowState::Waiting,
            TaskStatus::Paused if task.capped.is_some() => RowState::AtCap,
            TaskStatus::Paused => RowState::Paused,
            TaskStatus::Running if live.is_some_and(|agent| agent.question.is_some()) => {
                RowState::Waiting
            }
            TaskStatus::Running
                if live.is_some_and(|agent| agent.activity == Some(crew_live::Activity::Idle)) =>
            {
                RowState::Idle
            }
            TaskStatus::Running
                if live
                    .is_some_and(|agent| agent.activity == Some(crew_live::Activity::Checking)) =>
            {
                RowState::Checking
            }
            TaskStatus::Running => RowState::Working,
            // Its agent's first events may come before the task's change to running.
            TaskStatus::Pending | TaskStatus::Preparing
                if live.is_some_and(|agent| agent.state == crew_live::AgentState::Running) =>
            {
                RowState::Working
            }
            TaskStatus::Pending | TaskStatus::Preparing => RowState::Queued,
            // A failed check does not make a success of it on the board.
            TaskStatus::Succeeded if check_failed(task) && unread => RowState::CheckFailedUnread,
            TaskStatus::Succeeded if check_failed(task) => RowState::CheckFailed,
            TaskStatus::Succeeded if unread => RowState::DoneUnread,
            TaskStatus::Succeeded => RowState::Done,
            // An interrupted task needs its user as a failed one does (`crew runs resume`).
            TaskStatus::Failed | TaskStatus::Interrupted if unread => RowState::FailedUnread,
            TaskStatus::Failed | TaskStatus::Interrupted => RowState::Failed,
            TaskStatus::Stopped | TaskStatus::Cancelled => RowState::Stopped,
            TaskStatus::Skipped => RowState::Skipped,
        }
    }

    /// The rows in the order drawn: those that need the user first (waiting, then failed,
    /// then finished work to review), then the rest by run (newest first) and task.
    pub fn rows(&self) -> Vec<Row> {
        self.rows_matching(&self.filter.to_lowercase())
    }

    /// The providers whose limit a task of a run going on waits for, each with when the
    /// first of its waiting tasks goes on (`None`: when resumed): no other task of theirs
    /// starts meanwhile. For the header.
    pub fn limits(&self) -> Vec<(String, Option<crew_core::model::Timestamp>)> {
        let mut limits: Vec<(String, Option<crew_core::model::Timestamp>)> = Vec::new();
        let paused = self
            .runs
            .iter()
            .filter(|run| goes_on(run))
            .flat_map(|run| &run.tasks)
            .filter(|task| task.status == TaskStatus::Paused && task.capped.is_none());
        for task in paused {
            let limit = task.limit.as_ref();
            let provider = limit
                .and_then(|limit| limit.provider.clone())
                .unwrap_or_else(|| task.agent.clone());
            let at = limit.and_then(crew_core::model::UsageLimit::continues_at);
            match limits.iter_mut().find(|(known, _)| *known == provider) {
                Some((_, first)) => {
                    *first = match (*first, at) {
                        (Some(first), Some(at)) => Some(first.min(at)),
                        (first, at) => first.or(at),
                    }
                }
                None => limits.push((provider, at)),
            }
        }
        limits.sort_by(|a, b| a.0.cmp(&b.0));
        limits
    }

    /// Every row, the `/` filter aside: what the header counts.
    pub fn all_rows(&self) -> Vec<Row> {
        self.rows_matching("")
    }

    fn rows_matching(&self, filter: &str) -> Vec<Row> {
        let mut rows: Vec<Row> = Vec::new();
        // The newest runs, and any older one that still goes on.
        let shown = self
            .runs
            .iter()
            .enumerate()
            .filter(|(at, run)| *at < RECENT_RUNS || goes_on(run))
            .map(|(_, run)| run);
        for run in shown {
            // A lead agent's sub-tasks right after it.
            for (task, depth) in run.family_order() {
                let agent_id = AgentId::new(run.run_id.clone(), task.id.clone());
                let state = self.state(&agent_id, task);
                let branch = task
                    .teardown
                    .as_ref()
                    .and_then(|teardown| teardown.branch.clone())
                    .or_else(|| task.workspace.as_ref()?.branch.clone());
                let lines = task
                    .teardown
                    .as_ref()
                    .and_then(|teardown| teardown.diffstat.as_ref())
                    .map(|stat| (stat.insertions, stat.deletions));
                // Work that would conflict says so before any output line.
                let conflict = (!task.overlaps.is_empty()).then(|| {
                    let with: Vec<&str> = task
                        .overlaps
                        .iter()
                        .map(|overlap| overlap.with.as_str())
                        .collect();
                    sanitize(&format!("would conflict with {}", with.join(", ")))
                });
                let last_line = conflict
                    .or_else(|| failed_check_line(task))
                    .or_else(|| refused_network_line(task))
                    .or_else(|| {
                        self.tails
                            .get(&agent_id)
                            .and_then(|tail| {
                                tail.lines.iter().rev().find(|line| !line.trim().is_empty())
                            })
                            .cloned()
                            .or_else(|| task.reason.as_deref().map(sanitize))
                    })
                    .unwrap_or_default();
                let using = self
                    .live
                    .get(&agent_id)
                    .filter(|agent| agent.state == crew_live::AgentState::Running)
                    .and_then(|agent| agent.using);
                let row = Row {
                    agent_id,
                    agent: task.agent.clone(),
                    state,
                    branch,
                    lines,
                    started_at: task.started_at.map(|at| at.0),
                    last_line,
                    depth,
                    ports: run.held_lease(task).and_then(|lease| lease.port_range()),
                    using,
                };
                if filter.is_empty() || row_matches(&row, filter) {
                    rows.push(row);
                }
            }
        }
        // Stable: within a group, runs and tasks keep their order.
        rows.sort_by_key(|row| match row.state {
            RowState::Waiting => 0,
            RowState::FailedUnread | RowState::CheckFailedUnread => 1,
            RowState::DoneUnread => 2,
            _ => 3,
        });
        rows
    }

    /// The selected row's agent: the one chosen, or the first row.
    pub fn selected(&self, rows: &[Row]) -> Option<AgentId> {
        match &self.selected {
            Some(selected) if rows.iter().any(|row| &row.agent_id == selected) => {
                Some(selected.clone())
            }
            _ => rows.first().map(|row| row.agent_id.clone()),
        }
    }

    /// Reads of the last line of shown agents that finished before anything of theirs was
    /// heard (each asked for once).
    pub fn glances(&mut self) -> Vec<Action> {
        let wanted: Vec<AgentId> = self
            .rows()
            .into_iter()
            .filter(|row| is_finished(row.state) && !self.tails.contains_key(&row.agent_id))
            .map(|row| row.agent_id)
            .filter(|agent_id| !self.glanced.contains(agent_id))
            .collect();
        wanted
            .into_iter()
            .map(|agent_id| {
                self.glanced.insert(agent_id.clone());
                Action::ReadTail(agent_id, Glance::LastLine)
            })
            .collect()
    }

    /// The question the agent waits on.
    pub fn question(&self, agent_id: &AgentId) -> Option<String> {
        self.live
            .get(agent_id)
            .and_then(|agent| agent.question.clone())
            .or_else(|| self.task(agent_id)?.question.clone())
            .or_else(|| self.at_cap(agent_id))
    }

    /// What capped agents hold now (from the hosts' listings): kept on their live snapshots.
    pub fn set_using(
        &mut self,
        using: Vec<(AgentId, Option<crew_live::control::registry::Using>)>,
    ) {
        for (agent_id, using) in using {
            if let Some(agent) = self.live.get_mut(&agent_id) {
                agent.using = using;
            }
        }
    }

    /// Whether any agent runs (what it holds moves).
    pub fn has_running(&self) -> bool {
        self.live
            .values()
            .any(|agent| agent.state == crew_live::AgentState::Running)
    }

    /// What a task paused at a spend cap asks: what it spent against which cap.
    pub fn at_cap(&self, agent_id: &AgentId) -> Option<String> {
        let task = self.task(agent_id)?;
        task.capped?;
        task.reason.clone()
    }

    /// The diff of an agent, computed.
    pub fn set_diff(&mut self, agent_id: &AgentId, text: String) {
        if let Pane::Diff {
            agent_id: shown,
            text: slot,
            ..
        } = &mut self.pane
            && shown == agent_id
        {
            *slot = Some(text.lines().map(sanitize).collect());
        }
    }

    /// What an action gave.
    pub fn done(&mut self, message: String) {
        self.status = Some(sanitize(&message));
    }
}

/// The newest output lines of an agent, at most [`TAIL_LINES`] and [`TAIL_BYTES`].
#[derive(Debug, Default)]
struct Tail {
    lines: VecDeque<String>,
    bytes: usize,
}

impl Tail {
    fn push(&mut self, line: String) {
        self.bytes += line.len();
        self.lines.push_back(line);
        while self.lines.len() > TAIL_LINES || (self.bytes > TAIL_BYTES && self.lines.len() > 1) {
            self.bytes -= self.lines.pop_front().map_or(0, |line| line.len());
        }
    }
}

/// A finished task whose agent's proxy refused requests says so before its output: the hosts
/// it could not reach are what to look at first.
fn refused_network_line(task: &crew_core::model::TaskRecord) -> Option<String> {
    let requests = task.requests.filter(|requests| requests.refused > 0)?;
    task.status.is_finished().then(|| {
        format!(
            "network: {} request(s) refused by crew's proxy (see its warnings)",
            requests.refused
        )
    })
}

/// What a failed check says in the row: its command and how it ended.
fn failed_check_line(task: &TaskRecord) -> Option<String> {
    let check = task.check.as_ref().filter(|_| check_failed(task))?;
    let how = match (check.stopped, check.timed_out, check.code, &check.error) {
        (true, _, _, _) => "stopped".to_owned(),
        (_, true, _, _) => "timed out".to_owned(),
        (_, _, _, Some(error)) => error.clone(),
        (_, _, Some(code), _) => format!("exit {code}"),
        _ => "killed".to_owned(),
    };
    Some(sanitize(&format!(
        "check failed ({how}): {}",
        check.command
    )))
}

/// Whether the task's check ran and failed.
fn check_failed(task: &TaskRecord) -> bool {
    task.check.as_ref().and_then(|check| check.passed) == Some(false)
}

/// Whether a run has a task that is not finished.
fn goes_on(run: &RunManifest) -> bool {
    run.tasks.iter().any(|task| !task.status.is_finished())
}

fn is_finished(state: RowState) -> bool {
    !matches!(
        state,
        RowState::Waiting
            | RowState::Working
            | RowState::Checking
            | RowState::Idle
            | RowState::Paused
            | RowState::AtCap
            | RowState::Queued
    )
}

fn row_matches(row: &Row, filter: &str) -> bool {
    [
        row.agent_id.to_string(),
        row.agent.clone(),
        row.branch.clone().unwrap_or_default(),
        row.state.label().to_owned(),
    ]
    .iter()
    .any(|field| field.to_lowercase().contains(filter))
}

#[cfg(test)]
mod tests;
