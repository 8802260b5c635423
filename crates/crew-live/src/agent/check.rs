//! A task's check command: run with `sh -c` in its workspace once its agent finished, confined
//! and guarded exactly like the agent (its sandbox, a warden that kills what it leaves behind,
//! the agent's environment without the control socket), so that code the agent wrote cannot
//! do more when a check runs it than when the agent did. Its output goes to `check.log`; the
//! record keeps its exit and the end of what it printed.

use std::io::{Read as _, Seek as _, SeekFrom};
use std::os::unix::process::ExitStatusExt as _;
use std::time::{Duration, Instant};

use camino::{Utf8Path, Utf8PathBuf};
use crew_core::env_vars;
use crew_core::model::CheckRecord;
use crew_sandbox::procscan;
use crew_sandbox::spawn::WardedCommand;

use crate::agent::confine::{confinement, private_temp_dir};
use crate::agent::env::agent_env;
use crate::agent::spec::{AgentSpec, Launcher};

/// How much of the end of a check's output its record keeps.
const TAIL_BYTES: u64 = 2048;
/// How many of the last lines of that.
const TAIL_LINES: usize = 20;

/// How a check is asked to stop: each request counts, as with an agent's stop. The first is
/// TERM to its group, then KILL after the agent's grace; a second is KILL at once.
pub(crate) type StopRequests = tokio::sync::watch::Receiver<u32>;

/// How a check's process ended, besides its exit status.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CheckEnding {
    /// It ran out of time and was killed.
    pub timed_out: bool,
    /// It was stopped on request (a person's stop, the run's cancel).
    pub stopped: bool,
    /// It needed KILL.
    pub killed: bool,
}

/// Runs `command` as `spec`'s check, writing its output to `log`; stops it (its whole group,
/// and whatever carries the agent's marker) after `timeout`, or as `stop` asks. Never fails: a
/// check that cannot start is a check that did not pass, with the reason.
pub(crate) async fn run_check(
    launcher: &Launcher,
    spec: &AgentSpec,
    command: &str,
    log: &Utf8Path,
    timeout: Duration,
    stop: StopRequests,
) -> (CheckRecord, CheckEnding) {
    let mut record = CheckRecord::pending(command.to_owned());
    let started = Instant::now();
    let mut ending = CheckEnding::default();
    match run(launcher, spec, command, log, timeout, stop).await {
        Ok((status, ended)) => {
            ending = ended;
            record.passed = Some(status.success() && !ended.timed_out && !ended.stopped);
            record.code = status.code();
            record.signal = status.signal();
            record.timed_out = ended.timed_out;
            record.stopped = ended.stopped;
        }
        Err(error) => {
            record.passed = Some(false);
            record.error = Some(error);
        }
    }
    record.duration_ms = Some(u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX));
    record.output_tail = tail_of(log);
    (record, ending)
}

async fn run(
    launcher: &Launcher,
    spec: &AgentSpec,
    command: &str,
    log: &Utf8Path,
    timeout: Duration,
    mut stop: StopRequests,
) -> Result<(std::process::ExitStatus, CheckEnding), String> {
    if !spec.dir.is_dir() {
        return Err(format!("its workspace {} is gone", spec.dir));
    }
    if let Some(parent) = log.parent() {
        std::fs::create_dir_all(parent).map_err(|error| format!("{parent}: {error}"))?;
    }
    let output = std::fs::File::create(log).map_err(|error| format!("{log}: {error}"))?;
    let errors = output
        .try_clone()
        .map_err(|error| format!("{log}: {error}"))?;
    let temp_dir = private_temp_dir(spec).map_err(|error| error.to_string())?;
    let temp_path = Utf8PathBuf::from_path_buf(temp_dir.path().to_owned())
        .map_err(|path| format!("{} is not UTF-8", path.display()))?;
    let dir = spec.dir.to_string();
    let mut vars = vec![
        (env_vars::CREW_RUN_ID, spec.agent_id.run_id().to_string()),
        (env_vars::CREW_TASK_ID, spec.agent_id.task_id().to_string()),
        (env_vars::CREW_AGENT_ID, spec.agent_id.to_string()),
        (env_vars::CREW_WORKSPACE, dir),
        (env_vars::CREW_PROJECT_ROOT, spec.workspace.to_string()),
        (env_vars::TMPDIR, temp_path.to_string()),
        (env_vars::XDG_RUNTIME_DIR, temp_path.to_string()),
        (env_vars::CREW_CHECK, "1".to_owned()),
    ];
    for (name, value) in &spec.workspace_env {
        vars.push((name.as_str(), value.clone()));
    }
    let (prepared, caches) =
        confinement(spec, launcher, temp_path, false).map_err(|error| error.to_string())?;
    if prepared.record.state == crew_core::model::SandboxState::Enforced {
        vars.push((
            env_vars::CREW_SANDBOX,
            prepared.record.state.as_str().to_owned(),
        ));
    }
    if prepared.proxy.is_some() {
        vars.extend(
            crew_sandbox::proxy::PROXY_VARS
                .iter()
                .map(|(name, value)| (*name, (*value).to_owned())),
        );
    }
    let marker = procscan::agent_marker(&spec.agent_id);
    let mut warded = WardedCommand::new(
        "sh",
        ["-c", command],
        agent_env(
            &launcher.env,
            &spec.definition,
            caches.as_ref().map(|caches| &caches.env[..]),
            &vars,
            &spec.git_config,
        ),
        &marker,
        prepared.ruleset,
        prepared.namespace.as_ref(),
        prepared.proxy.map(|lists| crew_sandbox::proxy::Rules {
            lists,
            log: spec.network_log.clone(),
            credentials: Vec::new(),
        }),
    )
    .map_err(|error| format!("could not start sh: {error}"))?;
    warded
        .current_dir(&spec.dir)
        .stdio(crew_sandbox::spawn::AgentIo::Null, output, errors);
    let crew_sandbox::spawn::Spawned {
        mut child,
        proxy: _proxy,
        ..
    } = launcher
        .spawner
        .spawn(warded)
        .await
        .map_err(|error| format!("could not start sh: {error}"))?;
    let group = child
        .id()
        .and_then(|pid| rustix::process::Pid::from_raw(pid as i32));
    let signal = |signal| {
        if let Some(group) = group {
            // The group may be gone already; whatever left it is killed by its marker.
            let _ = rustix::process::kill_process_group(group, signal);
        }
    };
    let deadline = tokio::time::Instant::now() + timeout;
    let mut kill_at: Option<tokio::time::Instant> = None;
    let mut ending = CheckEnding::default();
    let mut stop_open = true;
    let status = loop {
        tokio::select! {
            status = child.wait() => break status,
            _ = tokio::time::sleep_until(deadline), if !ending.timed_out && !ending.killed => {
                ending.timed_out = true;
                ending.killed = true;
                signal(rustix::process::Signal::KILL);
                kill_at = None;
            }
            changed = stop.changed(), if stop_open => {
                if changed.is_err() {
                    // Nobody can ask any more: the check runs to its end or its timeout.
                    stop_open = false;
                    continue;
                }
                ending.stopped = true;
                if *stop.borrow_and_update() >= 2 || kill_at.is_some() {
                    ending.killed = true;
                    signal(rustix::process::Signal::KILL);
                    kill_at = None;
                } else if !ending.killed {
                    signal(rustix::process::Signal::TERM);
                    kill_at = Some(tokio::time::Instant::now() + spec.stop_grace);
                }
            }
            _ = tokio::time::sleep_until(kill_at.unwrap_or(deadline)), if kill_at.is_some() => {
                ending.killed = true;
                signal(rustix::process::Signal::KILL);
                kill_at = None;
            }
        }
    };
    if ending.killed {
        // What left the group is killed by its marker; best effort, as the check has ended.
        let _ = tokio::task::spawn_blocking(move || procscan::kill_marked(&marker)).await;
    }
    status
        .map(|status| (status, ending))
        .map_err(|error| format!("could not wait for the check: {error}"))
}

/// The last lines of the log (at most [`TAIL_LINES`] of its last [`TAIL_BYTES`]), lossy.
fn tail_of(log: &Utf8Path) -> String {
    let Ok(mut file) = std::fs::File::open(log) else {
        return String::new();
    };
    let length = file.metadata().map_or(0, |metadata| metadata.len());
    let start = length.saturating_sub(TAIL_BYTES);
    let mut bytes = Vec::new();
    if file.seek(SeekFrom::Start(start)).is_err() || file.read_to_end(&mut bytes).is_err() {
        return String::new();
    }
    let text = String::from_utf8_lossy(&bytes);
    let mut lines: Vec<&str> = text.lines().collect();
    if start > 0 && !lines.is_empty() {
        // The first line was cut by the byte limit.
        lines.remove(0);
    }
    let from = lines.len().saturating_sub(TAIL_LINES);
    lines[from..].join("\n")
}
