//! The executor of a run: it carries out what the [`Schedule`] decides, starts each task on a
//! task of its own (`task.rs`), and answers the control channel's requests for the run while
//! it goes on.

use std::collections::HashMap;
use std::sync::Arc;

use camino::Utf8PathBuf;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

use crew_core::model::{EventKind, RunEvent, RunManifest, TaskStatus};
use crew_core::{AgentId, CancelCause, CancelRecord, RunId, TaskId};

use super::schedule::{Schedule, Step};
use super::task::RunContext;
use super::{CancelLevel, RunError, Runner, blocking, foreign_run};
use crate::agent::events::answer;
use crate::control::{ErrorBody, ErrorCode, RunCommand};

impl Runner {
    /// Runs the tasks of `run_id` to the end. `cancel` is watched for Ctrl-C; `commands` brings
    /// requests from the control channel. `resumes` names tasks to resume and the message for
    /// each: a waiting task goes on with it as its answer, a finished one starts through its
    /// agent's `resume` template (`None`: the template's default message).
    pub async fn execute(
        &self,
        run_id: &RunId,
        socket: Option<Utf8PathBuf>,
        mut cancel: watch::Receiver<CancelLevel>,
        mut commands: mpsc::Receiver<RunCommand>,
        resumes: HashMap<TaskId, Option<String>>,
    ) -> Result<RunManifest, RunError> {
        let manifest = self.read(run_id).await?;
        let (run_cancel, _) = watch::channel(CancelLevel::None);
        let (holds, mut hold_changes) = mpsc::unbounded_channel();
        let (release, _) = watch::channel(false);
        let resume_messages = resumes
            .iter()
            .filter(|(task_id, _)| {
                manifest.task(task_id).is_some_and(|task| {
                    !matches!(task.status, TaskStatus::Waiting | TaskStatus::Paused)
                })
            })
            .map(|(task_id, message)| (task_id.clone(), message.clone()))
            .collect();
        let context = Arc::new(RunContext::new(
            self.clone(),
            &manifest,
            socket,
            run_cancel.clone(),
            resume_messages,
            holds,
            release.clone(),
        ));
        let mut schedule = Schedule::new(
            &manifest.tasks,
            manifest.max_parallel,
            manifest.fail_fast,
            &|task| context.provider_of(task),
        );
        let mut running: JoinSet<(TaskId, TaskStatus)> = JoinSet::new();
        // Which task each spawned future runs: a future that panics returns nothing else.
        let mut spawned: HashMap<tokio::task::Id, TaskId> = HashMap::new();
        // Providers held until a time (see `Schedule::hold_provider_of`).
        let mut lifts: Vec<(String, tokio::time::Instant)> = Vec::new();
        let mut commands_open = true;
        let mut cancel_open = true;

        // Tasks that were waiting for an answer when their host went away wait again here.
        for task in manifest
            .tasks
            .iter()
            .filter(|task| task.status == TaskStatus::Waiting)
        {
            let context = context.clone();
            let task = task.clone();
            let answer = resumes.get(&task.id).cloned().flatten();
            schedule.adopt(&task.id);
            let id = task.id.clone();
            let future = running.spawn(async move {
                let id = task.id.clone();
                (id, context.adopt_waiting(task, answer).await)
            });
            spawned.insert(future.id(), id);
        }
        // Tasks a usage limit paused go on when it lifts, or now when the resume names them.
        for task in manifest
            .tasks
            .iter()
            .filter(|task| task.status == TaskStatus::Paused)
        {
            let context = context.clone();
            let task = task.clone();
            let message = resumes.get(&task.id).cloned();
            schedule.adopt(&task.id);
            let id = task.id.clone();
            let future = running.spawn(async move {
                let id = task.id.clone();
                (id, context.adopt_paused(task, message).await)
            });
            spawned.insert(future.id(), id);
        }

        loop {
            let level = *cancel.borrow();
            if level > CancelLevel::None {
                schedule.cancel();
                if *run_cancel.borrow() < level {
                    run_cancel.send_replace(level);
                }
            }
            schedule.spend_hold(context.spend().run_or_day_reached().is_some());
            for step in schedule.next_steps() {
                match step {
                    Step::Finish {
                        task,
                        status,
                        reason,
                    } => self.finish_unstarted(run_id, &task, status, &reason).await,
                    Step::Start(task_id) => {
                        let context = context.clone();
                        let id = task_id.clone();
                        let future = running.spawn(async move {
                            let status = context.run_task(task_id.clone()).await;
                            (task_id, status)
                        });
                        spawned.insert(future.id(), id);
                    }
                }
            }
            release.send_if_modified(|released| {
                let now = schedule.only_held_left();
                std::mem::replace(released, now) != now
            });
            if schedule.is_over() {
                break;
            }
            tokio::select! {
                Some(joined) = running.join_next_with_id() => {
                    let (task_id, status) = match joined {
                        Ok((id, result)) => {
                            spawned.remove(&id);
                            result
                        }
                        Err(error) => {
                            let task_id = spawned
                                .remove(&error.id())
                                .expect("every task future is recorded when spawned");
                            let status = self.task_panicked(run_id, &task_id, error).await;
                            (task_id, status)
                        }
                    };
                    let fails_fast = schedule.ended(&task_id, status);
                    // Queued again: its provider refused it before it began. The provider is
                    // held until the limit's time, then ramps back up.
                    if status == TaskStatus::Pending
                        && let Some(provider) = schedule.hold_provider_of(&task_id)
                    {
                        let at = self
                            .read(run_id)
                            .await
                            .ok()
                            .and_then(|manifest| {
                                manifest.task(&task_id)?.limit.as_ref()?.continues_at()
                            })
                            .and_then(|at| at.0.duration_since(std::time::SystemTime::now()).ok())
                            .unwrap_or_default();
                        lifts.push((provider, tokio::time::Instant::now() + at));
                    }
                    if fails_fast {
                        let by = CancelRecord { task: Some(task_id), ..CancelRecord::new(CancelCause::FailFast) };
                        self.record_cancel(run_id, by).await;
                        run_cancel.send_replace(CancelLevel::Graceful);
                    }
                }
                Some((task_id, stopped)) = hold_changes.recv() => schedule.hold(&task_id, stopped),
                () = next_lift(&lifts), if !lifts.is_empty() => {
                    let now = tokio::time::Instant::now();
                    for (provider, _) in lifts.iter().filter(|(_, at)| *at <= now) {
                        schedule.lift(provider);
                    }
                    lifts.retain(|(_, at)| *at > now);
                }
                changed = cancel.changed(), if cancel_open => {
                    // A canceller that is gone can send nothing more: stop listening to it (a
                    // closed channel answers at once, and the loop would spin).
                    cancel_open = changed.is_ok();
                }
                command = commands.recv(), if commands_open => match command {
                    Some(command) => {
                        self.answer(run_id, command, &mut schedule, &context, &run_cancel).await;
                    }
                    None => commands_open = false,
                },
            }
        }
        self.finish_run(run_id, schedule.run_status(), context.saved())
            .await
    }

    /// A task whose future panicked (a defect of crew's, never the agent's doing): its agent
    /// is stopped, and the task fails with the panic in its reason; its workspace stays as it
    /// was, its work in it, for `crew runs clean` to save to its branch. The host and the
    /// run's other tasks go on.
    async fn task_panicked(
        &self,
        run_id: &RunId,
        task_id: &TaskId,
        error: tokio::task::JoinError,
    ) -> TaskStatus {
        let what = if error.is_panic() {
            let payload = error.into_panic();
            let message = payload
                .downcast_ref::<&str>()
                .map(|message| (*message).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "no message".to_owned());
            format!("crew panicked while running it ({message})")
        } else {
            "crew stopped running it".to_owned()
        };
        let agent_id = AgentId::new(run_id.clone(), task_id.clone());
        let registry = self.host().registry();
        if let Some(handle) = registry.remove(&agent_id) {
            // Its outcome is the agent's exit, which the close below waits for.
            let _ = handle.stop().await;
            handle.close().await;
        }
        let reason = format!(
            "{what}; its agent was stopped and its workspace kept as it was: `crew runs clean {run_id}` saves its work to its branch"
        );
        self.finish_unstarted(run_id, task_id, TaskStatus::Failed, &reason)
            .await;
        TaskStatus::Failed
    }

    /// Answers a request of the control channel for this run.
    async fn answer(
        &self,
        run_id: &RunId,
        command: RunCommand,
        schedule: &mut Schedule,
        context: &RunContext,
        run_cancel: &watch::Sender<CancelLevel>,
    ) {
        match command {
            RunCommand::Cancel {
                workspace,
                by,
                reply,
            } => {
                if &workspace != self.workspace.id() {
                    answer(reply, Err(foreign_run(run_id, &workspace)));
                    return;
                }
                self.record_cancel(run_id, by).await;
                schedule.cancel();
                run_cancel.send_replace(CancelLevel::Graceful);
                answer(
                    reply,
                    Ok(serde_json::json!({ "run_id": run_id, "cancelled": true })),
                );
            }
            RunCommand::Submit {
                workspace,
                agent,
                tasks,
                reply,
            } => {
                let result = match self.refusal(run_id, &workspace, schedule, "takes no new tasks")
                {
                    Some(refused) => Err(refused),
                    None => self.accept_submission(run_id, &agent, tasks, context).await,
                };
                if let Ok(added) = &result {
                    for task in added {
                        context.spend().add(&task.id, task.max_cost);
                    }
                    schedule.add(added, &|task| context.provider_of(task));
                }
                answer(reply, result.map(|added| {
                    serde_json::json!({
                        "accepted": added.iter().map(|task| task.id.as_str()).collect::<Vec<_>>()
                    })
                }));
            }
            RunCommand::Resume {
                workspace,
                task,
                message,
                reply,
            } => {
                let result =
                    match self.refusal(run_id, &workspace, schedule, "starts no task again") {
                        Some(refused) => Err(refused),
                        None if schedule.is_active(&task) => Err(ErrorBody::new(
                            ErrorCode::AlreadyRunning,
                            format!("task {task} of run {run_id} is still going"),
                        )),
                        None => self.requeue(run_id, &task, message.is_some()).await,
                    };
                if result.is_ok() {
                    schedule.requeue(&task);
                    context.resume_with_message(&task, message);
                }
                answer(
                    reply,
                    result.map(|()| {
                        serde_json::json!({
                            "agent_id": AgentId::new(run_id.clone(), task),
                            "requeued": true,
                        })
                    }),
                );
            }
        }
    }

    /// Why the run refuses a request from `workspace` now: it is another workspace's run, or
    /// it is stopping and `refused` what was asked.
    fn refusal(
        &self,
        run_id: &RunId,
        workspace: &crew_core::WorkspaceId,
        schedule: &Schedule,
        refused: &str,
    ) -> Option<ErrorBody> {
        if workspace != self.workspace.id() {
            return Some(foreign_run(run_id, workspace));
        }
        schedule.stopping().then(|| {
            ErrorBody::new(
                ErrorCode::RunStopping,
                format!("run {run_id} is stopping; it {refused}"),
            )
        })
    }

    /// Records how the run ended. Any change of the run that could not be recorded, this one
    /// included, makes it [`RunError::Unrecorded`], naming where the work was `saved`.
    async fn finish_run(
        &self,
        run_id: &RunId,
        status: crew_core::RunStatus,
        saved: Vec<String>,
    ) -> Result<RunManifest, RunError> {
        // The event first, as for a task's status: whoever follows the run and reads its record
        // ended finds the end in its log too (`crew events --follow` stops at a record ended).
        self.record_event(
            run_id,
            RunEvent::new(
                None,
                EventKind::RunStatus {
                    status,
                    reason: None,
                },
            ),
        );
        let store = self.store.clone();
        let id = run_id.clone();
        let manifest = blocking(move || {
            store.update_run(&id, |manifest| {
                manifest.set_status(status)?;
                Ok(manifest.clone())
            })
        })
        .await;
        if let Err(error) = &manifest {
            self.unrecorded(run_id, &format!("the run's end ({status})"), error);
        }
        let problems = self.take_unrecorded(run_id);
        match manifest {
            Ok(manifest) if problems.is_empty() => Ok(manifest),
            _ => Err(RunError::Unrecorded {
                run_id: run_id.clone(),
                problems,
                saved,
            }),
        }
    }
}

/// Sleeps until the first of `lifts` is due.
async fn next_lift(lifts: &[(String, tokio::time::Instant)]) {
    if let Some(at) = lifts.iter().map(|(_, at)| *at).min() {
        tokio::time::sleep_until(at).await;
    }
}
