//! A run hosted in the foreground of this process, as `crew run` (and its detached host,
//! `crew runs resume`, answering a question whose host is gone) shows it: the library's
//! [`Host`] does the hosting; here SIGINT and SIGTERM become its cancels and its events become
//! progress lines.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::Write as _;

use crew_core::model::{RunManifest, TaskStatus};
use crew_core::{CancelCause, CancelRecord, RunId, TaskId};
use crew_live::{CancelLevel, Canceller, Host, HostEvent, HostEvents, HostOptions};

use crate::CliError;
use crate::context::Context;
use crate::summary::relative;
use crate::ui::{Style, between, duration, sanitize, sanitize_lines, truncate};

pub use crew_live::project::host::{DETACHED_HOST_LABEL, MCP_HOST_LABEL};

/// Who handed a run to a background host (`crew host RUN --from …`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Detached {
    /// `crew run --detach`.
    Run,
    /// `crew mcp`'s `run_tasks`.
    Mcp,
}

impl Detached {
    /// The label its host goes by.
    pub fn label(self) -> &'static str {
        match self {
            Detached::Run => DETACHED_HOST_LABEL,
            Detached::Mcp => MCP_HOST_LABEL,
        }
    }
}

/// Hands the created run `run_id` to a background host (`crew host RUN`, in a session of its
/// own, its output in the run's `host.log`) and returns that host's pid once it has taken
/// the run.
///
/// With `resume`, the run has ended and the background host takes it up again for that task
/// (as `crew agents resume` does in the foreground).
pub async fn host_detached(
    ctx: &Context,
    run_id: &RunId,
    from: Detached,
    resume: Option<&TaskId>,
) -> Result<u32, CliError> {
    let log_path = ctx.store().run_dir(run_id).join("host.log");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)?;
    let exe = std::env::current_exe()?;
    let from = match from {
        Detached::Run => "run",
        Detached::Mcp => "mcp",
    };
    let mut command = std::process::Command::new(exe);
    command.args(["host", run_id.as_str(), "--from", from, "--color", "never"]);
    if let Some(task) = resume {
        command.args(["--resume", task.as_str()]);
    }
    command
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    let mut child = command.spawn()?;
    let pid = child.id();
    let started = std::time::Instant::now();
    loop {
        let taken = ctx
            .store()
            .read_run(run_id)
            .ok()
            .and_then(|manifest| manifest.host)
            .is_some_and(|host| host.identity.pid == pid && host.socket.is_some());
        if taken {
            // Reaped by the kernel when it exits, not left a zombie of this process.
            std::thread::spawn(move || child.wait());
            return Ok(pid);
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(CliError::internal(format!(
                "the background host of run {run_id} exited at once ({status}); see {log_path}"
            )));
        }
        if started.elapsed() > std::time::Duration::from_secs(15) {
            return Err(CliError::internal(format!(
                "the background host of run {run_id} did not start within 15 s; see {log_path}"
            )));
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// A host for this project in this process. Agents reach it with `crew ask` and `crew
/// submit`: this very crew, even when it is not on the user's PATH (started through `cargo
/// run`, or by its full path).
pub async fn start_host(ctx: &Context, label: &str) -> Result<Host, CliError> {
    let crew_dir = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(std::path::Path::to_path_buf));
    let options = HostOptions {
        label: label.to_owned(),
        crew_dir,
    };
    Host::start(ctx.project(), options)
        .await
        .map_err(CliError::internal)
}

/// Runs `run_id` on `host` until it ends, printing progress unless quiet. The first Ctrl-C
/// (or TERM) stops the agents gracefully, the second kills them; work is kept either way.
pub async fn run_here(
    ctx: &Context,
    host: &Host,
    run_id: &RunId,
    resumes: HashMap<TaskId, Option<String>>,
    progress: bool,
) -> Result<RunManifest, CliError> {
    let events = host.events();
    let running = host.start_run(run_id, resumes);
    let signals = tokio::spawn(watch_signals(running.canceller(), ctx.ui.quiet));
    let (finished, finish) = tokio::sync::oneshot::channel();
    let printer = progress.then(|| {
        let tasks = ctx
            .read_run(run_id)
            .map(|manifest| manifest.tasks)
            .unwrap_or_default();
        if ctx.ui.live {
            tokio::spawn(crate::block::show(
                events,
                finish,
                ctx.clone(),
                run_id.clone(),
                tasks,
            ))
        } else {
            tokio::spawn(print_progress(events, finish, ctx.clone(), run_id.clone()))
        }
    });
    let result = running.finish().await;
    signals.abort();
    if let Some(printer) = printer {
        // Every line of the run out before the summary.
        let _ = finished.send(());
        // A printer that panicked printed what it could; the summary follows all the same.
        let _ = printer.await;
    }
    after_run(ctx, result.as_ref().ok());
    Ok(result?)
}

/// What a run's end starts in the background, wherever it was hosted: a prune of history when
/// due, and a refill of the worktree pool after a run that used worktrees.
pub fn after_run(ctx: &Context, finished: Option<&RunManifest>) {
    let due = ctx.project().after_run(finished);
    if due.prune {
        start_in_background(ctx, &["runs", "prune", "--if-due"]);
    }
    if due.refill {
        start_in_background(ctx, &["worktrees", "refill"]);
    }
}

/// Starts `crew <args> --quiet --color never` in the project, detached from this process's
/// output; it is reaped when it ends. What a run's end starts (a prune, a refill of the pool)
/// is a courtesy: one that cannot start now happens after a later run, or by hand.
fn start_in_background(ctx: &Context, args: &[&str]) {
    let Ok(exe) = std::env::current_exe() else {
        return;
    };
    let started = std::process::Command::new(exe)
        .args(args)
        .args(["--quiet", "--color", "never"])
        .current_dir(ctx.workspace().root())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
    match started {
        // Reaped when it ends, so that a long-lived host (`crew mcp`, `crew serve`) keeps no
        // zombie; a `crew run` that exits first leaves it to init.
        Ok(mut child) => {
            std::thread::spawn(move || child.wait());
        }
        Err(error) => tracing::debug!("could not start crew {args:?} in the background: {error}"),
    }
}

/// Turns SIGINT and SIGTERM into cancels: the first is graceful, the second kills.
async fn watch_signals(canceller: Canceller, quiet: bool) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut interrupt), Ok(mut terminate)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        return;
    };
    // Handling SIGHUP at all replaces its default action: a detached host outlives its
    // terminal.
    let _hangup = signal(SignalKind::hangup());
    loop {
        let cause = tokio::select! {
            _ = interrupt.recv() => CancelCause::Interrupt,
            _ = terminate.recv() => CancelCause::Terminate,
        };
        let level = canceller.cancel(CancelRecord::by_this_process(cause)).await;
        if !quiet {
            match level {
                CancelLevel::Graceful => err!(
                    "crew: stopping the agents gracefully and keeping their work (Ctrl-C again to kill them at once)"
                ),
                _ => err!("crew: killing the agents; their work is still saved"),
            }
        }
    }
}

/// One line per task status change, as the run goes.
async fn print_progress(
    mut events: HostEvents,
    mut finish: tokio::sync::oneshot::Receiver<()>,
    ctx: Context,
    run_id: RunId,
) {
    let mut finishing = false;
    loop {
        let change = if finishing {
            // The run is over: what is queued is all there is.
            match events.try_next_task() {
                Some(change) => change,
                None => return,
            }
        } else {
            tokio::select! {
                biased;
                event = events.next() => match event {
                    Some(Ok(HostEvent::Task(change))) => *change,
                    Some(_) => continue,
                    None => return,
                },
                _ = &mut finish => {
                    finishing = true;
                    continue;
                }
            }
        };
        if change.run_id != run_id {
            continue;
        }
        let task = change.task.as_ref();
        let mut line = format!(
            "  {:<14} {}",
            truncate(change.task_id.as_str(), 14),
            ctx.ui.task_status(change.status)
        );
        match change.status {
            TaskStatus::Running => {
                if let Some(task) = task {
                    if let Some(pid) = task.pid {
                        // Writing into a String cannot fail (here and below).
                        let _ = write!(line, "  pid {pid}");
                    }
                    // A placed task's directory here is only where its work arrives.
                    if let Some(placement) = &task.placement {
                        // Writing into a String cannot fail.
                        let _ = write!(
                            line,
                            "  {}",
                            ctx.ui.paint(&format!("on {placement}"), Style::Dim)
                        );
                    } else if let Some(workspace) = &task.workspace {
                        // Writing into a String cannot fail.
                        let _ = write!(
                            line,
                            "  {}",
                            ctx.ui.paint(&relative(&ctx, &workspace.dir), Style::Dim)
                        );
                    }
                    // The machine's network is said where a task has it: named so, its sandbox
                    // off, or crew's default given way on a kernel that cannot give it.
                    if task.placement.is_none()
                        && task.sandbox.as_ref().is_some_and(|sandbox| {
                            sandbox.network == crew_core::config::NetworkMode::Open
                        })
                    {
                        // Writing into a String cannot fail.
                        let _ = write!(line, "  {}", ctx.ui.paint("network open", Style::Warn));
                    }
                }
            }
            TaskStatus::Waiting => {
                // Writing into a String cannot fail.
                let _ = write!(
                    line,
                    "  asks: {}  (answer with `crew agents follow-up {} \"…\"`)",
                    sanitize(change.reason.as_deref().unwrap_or("")),
                    change.task_id
                );
            }
            TaskStatus::Paused => {
                // Writing into a String cannot fail.
                let _ = write!(
                    line,
                    "  {}",
                    sanitize(change.reason.as_deref().unwrap_or(""))
                );
            }
            status if status.is_finished() => {
                if let Some(task) = task {
                    if let Some(elapsed) = between(task.started_at, task.finished_at) {
                        // Writing into a String cannot fail.
                        let _ = write!(line, "  {}", duration(elapsed));
                    }
                    if let Some(report) = &task.teardown
                        && let Some(branch) = &report.branch
                    {
                        // Writing into a String cannot fail.
                        let _ = write!(line, "  {branch}");
                        if let Some(stat) = report.diffstat {
                            // Writing into a String cannot fail.
                            let _ = write!(line, " (+{} -{})", stat.insertions, stat.deletions);
                        }
                    }
                }
                if let Some(reason) = &change.reason {
                    let reason = sanitize_lines(reason, "      ");
                    // Writing into a String cannot fail.
                    let _ = write!(line, "  {}", ctx.ui.paint(&reason, Style::Dim));
                }
            }
            _ => {}
        }
        out!("{line}");
        // Nobody reading is no error here (see `out!`).
        let _ = std::io::stdout().flush();
    }
}
