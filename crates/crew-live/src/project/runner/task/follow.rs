//! Following a started agent to its end: questions (`waiting`), stops by a person
//! (`stopped`, held for a resume), usage limits (`paused` until they lift), restarts, and
//! the run's cancel — what `follow_through` waits on, and how each ends the task.

use std::time::Duration;

use crew_core::TaskId;
use crew_core::config::OnLimit;
use crew_core::model::{
    CapKind, EventKind, ExitRecord, RunEvent, TaskRecord, TaskStatus, Timestamp, Usage, UsageLimit,
};
use crew_core::provider::TaskWorkspace;

use super::ending::{AgentReport, outcome, stop_as_cancelled};
use super::{Phase, RunContext, STOPPED_BY_REQUEST};
use crate::agent::OverCap;
use crate::control::registry::AgentHandle;
use crate::project::runner::CancelLevel;
use crate::project::runner::schedule::Hold;

impl RunContext {
    /// Waits for the agent through questions, stops and restarts, then tears down and records
    /// the outcome.
    pub(super) async fn follow_through(
        &self,
        task: TaskRecord,
        workspace: TaskWorkspace,
        handle: AgentHandle,
        from: Phase,
        waiting_since: u32,
    ) -> TaskStatus {
        let task_id = task.id.clone();
        let mut cancel = self.cancel.subscribe();
        let mut release = self.release.subscribe();
        let mut stop_requests = 0;
        let mut phase = from;
        // The attempt that last exited (asked, or was stopped): any later attempt goes on.
        let mut exited_attempt = waiting_since;
        // The running agent waits on a question of its own (an `acp` permission request).
        let mut asking = false;
        // How often crew has tried again after a limit that said nothing of when it lifts.
        let mut limit_tries = 0;
        // How often its agent hit a limit in this run.
        let mut limits_hit = 0u32;
        // Stops a person asked for while the agent was not running: one more ends the task.
        let stops_asked = handle.status().stops_asked;
        let ending = loop {
            match phase {
                Phase::Running => {
                    // Checked on every turn, not only on a change: a cancel may have come
                    // before this task was listening.
                    let level = *cancel.borrow_and_update();
                    stop_as_cancelled(&handle, level, &mut stop_requests).await;
                    tokio::select! {
                        status = handle.wait_exited() => {
                            exited_attempt = status.attempt;
                            // A question asked of an agent its timeout ended is not waited on:
                            // the task failed by its timeout.
                            let timed_out = status.exit.as_ref().is_some_and(|exit| exit.timed_out);
                            if let Some(question) = status.question.clone().filter(|_| !timed_out) {
                                self.record_waiting(&task_id, &question, &handle, task.usage).await;
                                phase = Phase::Waiting;
                                continue;
                            }
                            let exit = status.exit.unwrap_or(ExitRecord {
                                code: None,
                                signal: None,
                                stopped_by: None,
                                leaked_processes: 0,
                                timed_out: false,
                                ended_after_session: false,
                                network: None,
                                used: None,
                            });
                            // It reached a spend cap short of its next turn: a person decides.
                            if let Some(over) = status.over_cap.clone().filter(|over| over.stopped_short)
                                && exit.stopped_by.is_none()
                                && self.cancel_level() == CancelLevel::None
                            {
                                self.record_exit(&task_id, exit, &handle, task.usage).await;
                                self.pause_at_cap(&task_id, &over, true).await;
                                phase = Phase::Capped { kind: over.kind };
                                continue;
                            }
                            // Refused before it began (its provider's limit met at its
                            // first request, no answer had): queued again, never failed or
                            // left waiting, whatever `on_limit` says.
                            if let Some(limit) = status.limit.clone()
                                && refused_before_it_began(&task, status.usage)
                                && exit.stopped_by.is_none()
                                && self.cancel_level() == CancelLevel::None
                            {
                                // Closed: it leaves the host's agents, to start afresh later.
                                if handle.close().await {
                                    break Ending::Refused(exit, limit);
                                }
                                continue;
                            }
                            if let Some(limit) = status.limit.clone()
                                && task.on_limit == OnLimit::Pause
                                && exit.stopped_by.is_none()
                                && self.cancel_level() == CancelLevel::None
                            {
                                let mut retry = limit
                                    .resets_at
                                    .is_none()
                                    .then(|| next_try(&mut limit_tries));
                                // A limit hit again after it was said to lift waits at least
                                // crew's backoff: the reset may have been the program's own
                                // short retry (Claude Code retries a 429 without `retry-after`
                                // half a second later), and a restart every few seconds only
                                // meets the limit again.
                                if let Some(resets_at) = limit.resets_at
                                    && limits_hit > 0
                                {
                                    let floor = next_try(&mut limit_tries);
                                    retry = (floor > resets_at).then_some(floor);
                                }
                                limits_hit += 1;
                                self.pause(&task_id, exit, &limit, retry, &handle, task.usage)
                                    .await;
                                phase = Phase::Paused {
                                    resets_at: retry.or(limit.resets_at),
                                };
                                continue;
                            }
                            if exit.stopped_by.is_some()
                                && !exit.timed_out
                                && self.cancel_level() == CancelLevel::None
                            {
                                self.hold(&task_id, exit, &handle, task.usage).await;
                                phase = Phase::Held;
                                continue;
                            }
                            if handle.close().await {
                                break Ending::Exited(exit);
                            }
                        }
                        status = handle.wait_asking(asking) => match status {
                            Some(status) => {
                                asking = status.asks_alive;
                                match status.question {
                                    Some(question) if asking => {
                                        self.record_waiting(&task_id, &question, &handle, task.usage).await;
                                    }
                                    // Answered, and it goes on.
                                    None => self.record_answered(&task_id).await,
                                    // It exits with its question: the exit records it.
                                    Some(_) => {}
                                }
                            }
                            None => {
                                handle.wait_exited().await;
                            }
                        },
                        changed = cancel.changed() => {
                            if changed.is_err() {
                                // The run is over for this task's purposes; its exit decides
                                // on the next turn.
                                handle.wait_exited().await;
                            }
                        }
                    }
                }
                Phase::Paused { resets_at } => {
                    if self.cancel_level() > CancelLevel::None {
                        break Ending::StillPaused;
                    }
                    // No reset to wait for (it could not start again when its limit lifted,
                    // or a new host took the task over): crew tries again by its backoff.
                    let Some(resets_at) = resets_at else {
                        let retry = next_try(&mut limit_tries);
                        let reason = format!(
                            "paused: {}; crew tries again at {retry}, or it goes on with `crew agents resume {}:{task_id}`",
                            task.limit.as_ref().map_or_else(
                                || "it hit a usage limit".to_owned(),
                                |limit| format!("it hit {limit}")
                            ),
                            self.run_id
                        );
                        self.record_paused(&task_id, reason, Some(retry)).await;
                        phase = Phase::Paused {
                            resets_at: Some(retry),
                        };
                        continue;
                    };
                    // The limit's reset time, on this machine's clock; one that is past is now.
                    let wait = resets_at
                        .0
                        .duration_since(std::time::SystemTime::now())
                        .unwrap_or_default();
                    let wake = tokio::time::Instant::now() + wait + LIMIT_SLACK;
                    tokio::select! {
                        restarted = handle.wait_restarted(exited_attempt) => {
                            if restarted.is_none() {
                                break Ending::StillPaused;
                            }
                            self.tell_scheduler(&task_id, Hold::Going);
                            self.record_started(&task_id, &handle).await;
                            phase = Phase::Running;
                        }
                        asked = handle.wait_stop_asked(stops_asked) => {
                            if asked.is_none() || handle.close().await {
                                break Ending::StoppedAtCap;
                            }
                        }
                        () = tokio::time::sleep_until(wake) => {
                            // The limit lifted: its session goes on (the restart is seen above),
                            // or, when it cannot start, crew tries again by its backoff. Either
                            // way the reset time is spent: it never wakes the task twice.
                            phase = match handle.resume(None).await {
                                // Started: its restart is seen next; should that never come,
                                // crew tries again later.
                                Ok(_) => Phase::Paused {
                                    resets_at: Some(next_try(&mut limit_tries)),
                                },
                                Err(error) => {
                                    self.record_warning(
                                        &task_id,
                                        format!("could not start the agent again when its limit lifted: {error}"),
                                    )
                                    .await;
                                    Phase::Paused { resets_at: None }
                                }
                            };
                        }
                        _ = cancel.changed() => {}
                    }
                }
                Phase::Capped { kind } => {
                    if self.cancel_level() > CancelLevel::None {
                        break Ending::StillPaused;
                    }
                    tokio::select! {
                        restarted = handle.wait_restarted(exited_attempt) => {
                            if restarted.is_none() {
                                break Ending::StillPaused;
                            }
                            // A person let it go on: the cap allowed another cap's worth as it
                            // started (`SpendMeter::going_on`), recorded here.
                            self.record_caps(&task_id, kind).await;
                            self.tell_scheduler(&task_id, Hold::Going);
                            self.record_started(&task_id, &handle).await;
                            phase = Phase::Running;
                        }
                        asked = handle.wait_stop_asked(stops_asked) => {
                            if asked.is_none() || handle.close().await {
                                break Ending::StoppedAtCap;
                            }
                        }
                        _ = cancel.changed() => {}
                    }
                }
                Phase::Waiting | Phase::Held => {
                    let held = matches!(phase, Phase::Held);
                    if self.cancel_level() > CancelLevel::None {
                        if !held {
                            break Ending::StillWaiting;
                        }
                        if handle.close().await {
                            break Ending::Stopped;
                        }
                    } else if held && *release.borrow_and_update() && handle.close().await {
                        break Ending::Stopped;
                    }
                    // A follow-up (to a question) or a resume (after a stop) starts the agent
                    // again.
                    tokio::select! {
                        restarted = handle.wait_restarted(exited_attempt) => {
                            if restarted.is_none() {
                                break if held { Ending::Stopped } else { Ending::StillWaiting };
                            }
                            if held {
                                self.tell_scheduler(&task_id, Hold::Going);
                            }
                            self.record_started(&task_id, &handle).await;
                            phase = Phase::Running;
                        }
                        _ = release.changed(), if held => {}
                        _ = cancel.changed() => {}
                    }
                }
            }
        };
        match ending {
            Ending::StillWaiting => {
                self.teardown(&task_id, &workspace, true).await;
                TaskStatus::Waiting
            }
            Ending::StillPaused => {
                self.teardown(&task_id, &workspace, true).await;
                TaskStatus::Paused
            }
            Ending::Refused(exit, limit) => {
                self.record_exit(&task_id, exit, &handle, task.usage).await;
                self.teardown(&task_id, &workspace, false).await;
                self.requeue(&task_id, &limit).await;
                TaskStatus::Pending
            }
            Ending::StoppedAtCap => {
                let reason = format!("{STOPPED_BY_REQUEST} while it was paused");
                self.finish(&task_id, &workspace, TaskStatus::Stopped, Some(reason))
                    .await;
                TaskStatus::Stopped
            }
            Ending::Stopped => {
                self.teardown(&task_id, &workspace, false).await;
                // Its run ended while it was held: its workspace is no longer kept for a
                // resume in this run, and whoever follows the run is told so.
                let record = self
                    .save_task(&format!("task {task_id}'s reason"), &task_id, |record| {
                        record.reason = Some(STOPPED_BY_REQUEST.to_owned());
                        Ok(record.clone())
                    })
                    .await;
                self.runner.announce(
                    &self.run_id,
                    &task_id,
                    TaskStatus::Stopped,
                    Some(STOPPED_BY_REQUEST.to_owned()),
                    record,
                );
                TaskStatus::Stopped
            }
            Ending::Exited(exit) => {
                let cancelled = self.cancel_level() > CancelLevel::None;
                let (mut status, mut reason) =
                    outcome(&exit, cancelled, task.timeout.map(|timeout| timeout.0));
                // Killed by the kernel at its memory cap: the reason names the cap and the peak.
                if let (Some(used), false) = (exit.used, cancelled)
                    && used.oom_kills > 0
                    && exit.code.is_none()
                    && exit.signal == Some(libc::SIGKILL)
                {
                    status = TaskStatus::Failed;
                    reason = Some(format!(
                        "the kernel stopped the agent at its memory cap ({}): it held {} MiB at most; its work is kept",
                        task.resources
                            .memory
                            .map_or_else(|| "unknown".to_owned(), |cap| cap.to_string()),
                        used.peak_memory >> 20
                    ));
                }
                let agent = handle.status();
                // A placed task whose connection was lost: its work is there, for a resume.
                if let (Some(lost), false) = (&agent.lost, cancelled) {
                    status = TaskStatus::Interrupted;
                    reason = Some(lost.clone());
                }
                // Its requests through crew's proxy were all failing: that is why, or part of
                // it (a name its model's API goes by that cannot be resolved).
                match (&agent.unreachable, cancelled) {
                    (Some(down), false) if down.ended_by_crew => {
                        status = TaskStatus::Failed;
                        reason = Some(down.said.clone());
                    }
                    (Some(down), _) if status == TaskStatus::Failed => {
                        if let Some(why) = &mut reason {
                            why.push_str(&format!("; {}", down.said));
                        }
                    }
                    _ => {}
                }
                // A limit is named as one: what it is, and when it lifts. A last turn that
                // ended on one leaves the work undone, whatever the exit says.
                match (status, agent.limit, &mut reason) {
                    (TaskStatus::Succeeded, Some(limit), _) => {
                        status = TaskStatus::Failed;
                        reason = Some(format!("the agent stopped when it hit {limit}"));
                    }
                    // Its protocol said its last turn (or the session itself) failed: an exit
                    // code of 0 does not make that a success.
                    (TaskStatus::Succeeded, None, _) if agent.turn_error.is_some() => {
                        status = TaskStatus::Failed;
                        let how = if exit.ended_after_session {
                            "crew ended the agent once its session was over"
                        } else {
                            "the agent exited 0"
                        };
                        reason = Some(format!(
                            "{how}, but its protocol said it failed: {}",
                            agent.turn_error.as_deref().unwrap_or_default()
                        ));
                    }
                    (TaskStatus::Failed, Some(limit), Some(why)) => {
                        why.push_str(&format!(" after it hit {limit}"));
                    }
                    (TaskStatus::Failed, None, Some(why)) => {
                        if let Some(turn_error) = agent.turn_error {
                            why.push_str(&format!(" (its last turn: {turn_error})"));
                        }
                    }
                    _ => {}
                }
                // A toolchain that failed inside the sandbox says what to add.
                if let (TaskStatus::Failed, Some(why), false) =
                    (status, &mut reason, agent.refused_writes.is_empty())
                {
                    why.push_str(&format!(
                        "; {}",
                        crate::agent::refusals::note(&agent.refused_writes, &task.agent)
                    ));
                }
                // An agent given no network fails as one that could not reach its model's API
                // (Claude Code retries for minutes, then says only that it could not connect):
                // the reason says what it was given.
                let no_network = agent.sandbox.as_ref().is_some_and(|sandbox| {
                    sandbox.state == crew_core::model::SandboxState::Enforced
                        && sandbox.network == crew_core::config::NetworkMode::None
                });
                if let (TaskStatus::Failed, Some(why), true) = (status, &mut reason, no_network) {
                    why.push_str(&format!(
                        "; its network is `none`: it reached no host, its model's API included (give its definition `network = \"proxy\"` with the API's host in `allow_hosts`, in .crew/agents/{}.toml)",
                        task.agent
                    ));
                }
                // Its last turn reached a cap: nothing was left to pause before.
                if let Some(over) = agent.over_cap.as_ref().filter(|over| !over.stopped_short) {
                    self.record_warning(
                        &task_id,
                        format!("spend: its last turn reached a cap: {}", over.reason),
                    )
                    .await;
                }
                if let Some(branch) = agent.landed {
                    self.landed
                        .lock()
                        .unwrap_or_else(|poisoned| poisoned.into_inner())
                        .insert(task_id.clone(), branch);
                }
                self.record_exit(&task_id, exit, &handle, task.usage).await;
                if status == TaskStatus::Succeeded
                    && let Some(check) = &task.check
                {
                    self.check(&task, &check.command, &handle).await;
                }
                self.finish(&task_id, &workspace, status, reason).await;
                status
            }
        }
    }

    /// A person stopped the task's agent while the run goes on: the task is `stopped`, and
    /// holds its workspace so that `crew agents resume` starts the agent again in it.
    pub(super) async fn hold(
        &self,
        task_id: &TaskId,
        exit: ExitRecord,
        handle: &AgentHandle,
        prior: Option<Usage>,
    ) {
        self.record_exit(task_id, exit, handle, prior).await;
        let reason = format!(
            "{STOPPED_BY_REQUEST}; its workspace is kept while the run goes on (`crew agents resume {}:{task_id}` starts it again)",
            self.run_id
        );
        self.record_status(task_id, TaskStatus::Stopped, Some(reason))
            .await;
        self.tell_scheduler(task_id, Hold::Stopped);
    }

    /// The agent hit a usage limit and the task pauses on it (`on_limit = "pause"`): its
    /// workspace is kept, its slot freed, and the run waits for it.
    pub(super) async fn pause(
        &self,
        task_id: &TaskId,
        exit: ExitRecord,
        limit: &UsageLimit,
        retry: Option<Timestamp>,
        handle: &AgentHandle,
        prior: Option<Usage>,
    ) {
        self.record_exit(task_id, exit, handle, prior).await;
        let resume = format!("crew agents resume {}:{task_id}", self.run_id);
        let reason = match retry {
            Some(at) => format!(
                "paused: it hit {limit}; crew tries again at {at}, or it goes on with `{resume}`"
            ),
            None => format!("paused: it hit {limit}; it goes on then, or with `{resume}`"),
        };
        self.record_paused(task_id, reason, retry).await;
        self.tell_scheduler(task_id, Hold::Paused);
    }

    /// The task reached a spend cap (`over`): `paused`, its workspace and session kept, its slot
    /// freed, until a person lets it go on or stops it. `began`: it had started (else the run
    /// or the day was at its cap before it could).
    pub(super) async fn pause_at_cap(&self, task_id: &TaskId, over: &OverCap, began: bool) {
        let agent = format!("{}:{task_id}", self.run_id);
        let when = if began { "" } else { " before it began" };
        let reason = format!(
            "paused{when}: {}; go on with `crew agents resume {agent}` (another cap's worth), or end it with `crew agents stop {agent}`",
            over.reason
        );
        self.spend().paused_at(task_id, over.kind);
        let (run_id, why, kind) = (self.run_id.clone(), reason.clone(), over.kind);
        let record = self
            .save_task(
                &format!("task {task_id} paused at a cap"),
                task_id,
                move |record| {
                    record.set_status(&run_id, TaskStatus::Paused, Timestamp::now())?;
                    record.reason = Some(why);
                    record.capped = Some(kind);
                    Ok(record.clone())
                },
            )
            .await;
        self.runner.announce(
            &self.run_id,
            task_id,
            TaskStatus::Paused,
            Some(reason),
            record,
        );
        self.tell_scheduler(task_id, Hold::Capped);
    }

    /// A person let the task go on past the cap (`kind`) it was paused at: what its caps allow
    /// now is recorded.
    pub(super) async fn record_caps(&self, task_id: &TaskId, kind: CapKind) {
        let (own, run, day) = self.spend().caps_of(task_id);
        self.save_task(
            &format!("task {task_id}'s spend cap"),
            task_id,
            move |record| {
                record.max_cost = own;
                record.capped = None;
                Ok(())
            },
        )
        .await;
        if kind != CapKind::Task {
            self.save(
                &format!("run's spend cap, for task {task_id}"),
                move |manifest| {
                    manifest.max_cost = run;
                    manifest.day_cap = day;
                    Ok(())
                },
            )
            .await;
        }
    }

    /// Records the task queued again (`pending`) after its provider refused it before it
    /// began, with the limit and whose it is: the run starts it afresh when that lifts.
    pub(super) async fn requeue(&self, task_id: &TaskId, limit: &UsageLimit) {
        let (run_id, providers) = (self.run_id.clone(), self.providers());
        let mut limit = limit.clone();
        if limit.resets_at.is_none() {
            limit.retry_at = Some(next_try(&mut 0));
        }
        let record = self
            .save_task(&format!("task {task_id} queued again"), task_id, move |record| {
                let provider = providers
                    .get(&record.agent)
                    .cloned()
                    .unwrap_or_else(|| record.agent.clone());
                let at = limit
                    .continues_at()
                    .map_or_else(String::new, |at| format!(" at {at}"));
                record.set_status(&run_id, TaskStatus::Pending, Timestamp::now())?;
                record.reason = Some(format!(
                    "queued again: {provider} refused it before it began ({limit}); it starts afresh when the limit lifts{at}"
                ));
                limit.provider = Some(provider);
                record.limit = Some(limit);
                Ok(record.clone())
            })
            .await;
        let reason = record.as_ref().and_then(|record| record.reason.clone());
        self.runner
            .announce(&self.run_id, task_id, TaskStatus::Pending, reason, record);
    }

    /// Records the task `paused` for `reason`, and when crew tries it again by its backoff
    /// (`limit.retry_at`) where the limit said nothing of when it lifts.
    pub(super) async fn record_paused(
        &self,
        task_id: &TaskId,
        reason: String,
        retry: Option<Timestamp>,
    ) {
        let (run_id, why) = (self.run_id.clone(), reason.clone());
        let providers = self.providers();
        let record = self
            .save_task(&format!("task {task_id} paused"), task_id, move |record| {
                record.set_status(&run_id, TaskStatus::Paused, Timestamp::now())?;
                record.reason = Some(why);
                let provider = providers
                    .get(&record.agent)
                    .cloned()
                    .unwrap_or_else(|| record.agent.clone());
                if let Some(limit) = &mut record.limit {
                    limit.retry_at = retry;
                    limit.provider = Some(provider);
                }
                Ok(record.clone())
            })
            .await;
        self.runner.announce(
            &self.run_id,
            task_id,
            TaskStatus::Paused,
            Some(reason),
            record,
        );
    }

    /// Tells the scheduler what became of the task's agent: stopped by a person, paused by a
    /// limit, or going again.
    pub(super) fn tell_scheduler(&self, task_id: &TaskId, hold: Hold) {
        // Sending fails only once the scheduler has gone, when the run is over: nobody is
        // left to tell.
        let _ = self.holds.send((task_id.clone(), hold));
    }

    /// Records how the agent's process ended, with what its protocol reported.
    pub(super) async fn record_exit(
        &self,
        task_id: &TaskId,
        exit: ExitRecord,
        handle: &AgentHandle,
        prior: Option<Usage>,
    ) {
        let task = task_id.clone();
        let report = AgentReport::of(handle, prior);
        let usage = report.usage;
        let refused = report.refused_writes.clone();
        // Follow-ups it has not had yet (sent before a stop) outlive this host on the record.
        let follow_ups = handle.status().follow_up_queue;
        self.save_task(&format!("task {task_id}'s exit"), &task, move |record| {
            record.requests = crew_core::model::NetworkCounts::sum(
                record.requests.into_iter().chain(exit.network),
            );
            if let Some(used) = exit.used {
                record.used = Some(record.used.unwrap_or_default().and(used));
                // A process of its killed at the cap while the agent itself went on (a test
                // worker): a warning, and the agent's own end decides the task.
                let agent_killed = exit.code.is_none() && exit.signal == Some(libc::SIGKILL);
                if used.oom_kills > 0 && !agent_killed {
                    let warning = format!(
                        "memory: the kernel killed {} of the agent's processes at its memory cap ({}); the agent went on",
                        used.oom_kills,
                        record
                            .resources
                            .memory
                            .map_or_else(|| "unknown".to_owned(), |cap| cap.to_string())
                    );
                    if !record.warnings.contains(&warning) {
                        record.warnings.push(warning);
                    }
                }
                if used.processes_refused > 0 {
                    let warning = format!(
                        "processes: the agent reached its cap of {} processes; new ones were refused ({} times)",
                        record.resources.processes.unwrap_or_default(),
                        used.processes_refused
                    );
                    if !record.warnings.contains(&warning) {
                        record.warnings.push(warning);
                    }
                }
            }
            // A question its agent asked alive went with it when its timeout ended it.
            if exit.timed_out {
                record.question = None;
            }
            record.exit = Some(exit);
            record.pid = None;
            record.follow_ups = follow_ups;
            report.apply(record);
            Ok(())
        })
        .await;
        if let Some(usage) = usage {
            self.runner.record_event(
                &self.run_id,
                RunEvent::new(Some(task_id.clone()), EventKind::Usage { usage }),
            );
        }
        // What the sandbox refused it, as it said so: an event like every refusal.
        if !refused.is_empty() {
            self.runner.record_event(
                &self.run_id,
                RunEvent::new(
                    Some(task_id.clone()),
                    EventKind::Message {
                        text: format!("the sandbox refused writes to {}", refused.join(", ")),
                    },
                ),
            );
        }
    }

    pub(super) async fn record_waiting(
        &self,
        task_id: &TaskId,
        question: &str,
        handle: &AgentHandle,
        prior: Option<Usage>,
    ) {
        let (run_id, asked) = (self.run_id.clone(), question.to_owned());
        let report = AgentReport::of(handle, prior);
        let record = self
            .save_task(
                &format!("task {task_id}'s question"),
                task_id,
                move |record| {
                    if record.status != TaskStatus::Waiting {
                        record.set_status(&run_id, TaskStatus::Waiting, Timestamp::now())?;
                    }
                    record.question = Some(asked);
                    report.apply(record);
                    Ok(record.clone())
                },
            )
            .await;
        self.runner.announce(
            &self.run_id,
            task_id,
            TaskStatus::Waiting,
            Some(question.to_owned()),
            record,
        );
    }
}

/// How a task's agent ended, before the task's status is decided.
pub(super) enum Ending {
    Exited(ExitRecord),
    /// The agent asked a question and the run stopped before an answer came: the workspace is
    /// kept for it.
    StillWaiting,
    /// A person stopped the agent, and the run ended without a resume: the task stays
    /// `stopped`.
    Stopped,
    /// A usage limit paused the task and the run stopped before it lifted: the workspace is
    /// kept, and the task stays `paused` for `crew runs resume`.
    StillPaused,
    /// Its provider refused it before it began: queued again (see
    /// [`refused_before_it_began`]).
    Refused(ExitRecord, UsageLimit),
    /// A person stopped it while it was paused (at a spend cap, or on a limit): it ends
    /// `stopped`, its work saved.
    StoppedAtCap,
}

/// Whether the limit that ended the agent's turn met it before it began: its task never had a
/// session before this start, and its program reported its turns' tokens, none written (no
/// answer had). A program that reports no tokens (an ACP agent; Codex on a failed turn) cannot
/// be told to have had none: its task pauses or fails on the limit as `on_limit` says.
fn refused_before_it_began(task: &TaskRecord, usage: Option<Usage>) -> bool {
    task.session_id.is_none()
        && usage.is_some_and(|usage| usage.output_tokens == 0 && !usage.tokens_unknown)
}

/// How long after a limit's reset time a paused agent starts again: clocks differ a little.
pub(super) const LIMIT_SLACK: Duration = Duration::from_secs(1);

/// When crew next tries again a task whose limit said nothing of when it lifts, by the
/// backoff of its `tries` so far (counted here).
pub(super) fn next_try(tries: &mut u32) -> Timestamp {
    let wait = crate::agent::limits::retry_backoff(*tries);
    *tries += 1;
    Timestamp(std::time::SystemTime::now() + wait)
}
