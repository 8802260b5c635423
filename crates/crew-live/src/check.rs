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

use crate::agent::{AgentSpec, Launcher, confinement, private_temp_dir};
use crate::env::agent_env;
use crate::procscan;
use crate::spawn::WardedCommand;

/// How much of the end of a check's output its record keeps.
const TAIL_BYTES: u64 = 2048;
/// How many of the last lines of that.
const TAIL_LINES: usize = 20;

/// Runs `command` as `spec`'s check, writing its output to `log`; stops it (its whole group,
/// and whatever carries the agent's marker) after `timeout`. Never fails: a check that cannot
/// start is a check that did not pass, with the reason.
pub(crate) async fn run_check(
    launcher: &Launcher,
    spec: &AgentSpec,
    command: &str,
    log: &Utf8Path,
    timeout: Duration,
) -> CheckRecord {
    let mut record = CheckRecord::pending(command.to_owned());
    let started = Instant::now();
    match run(launcher, spec, command, log, timeout).await {
        Ok((status, timed_out)) => {
            record.passed = Some(status.success() && !timed_out);
            record.code = status.code();
            record.signal = status.signal();
            record.timed_out = timed_out;
        }
        Err(error) => {
            record.passed = Some(false);
            record.error = Some(error);
        }
    }
    record.duration_ms = Some(u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX));
    record.output_tail = tail_of(log);
    record
}

async fn run(
    launcher: &Launcher,
    spec: &AgentSpec,
    command: &str,
    log: &Utf8Path,
    timeout: Duration,
) -> Result<(std::process::ExitStatus, bool), String> {
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
        (env_vars::CREW_CHECK, "1".to_owned()),
    ];
    for (name, value) in &spec.workspace_env {
        vars.push((name.as_str(), value.clone()));
    }
    let prepared = confinement(spec, launcher, temp_path).map_err(|error| error.to_string())?;
    let marker = procscan::agent_marker(&spec.agent_id);
    let mut warded = WardedCommand::new(
        "sh",
        ["-c", command],
        agent_env(&launcher.env, &spec.definition, &vars),
        &marker,
        prepared.ruleset,
    )
    .map_err(|error| format!("could not start sh: {error}"))?;
    warded
        .current_dir(&spec.dir)
        .stdio(std::process::Stdio::null(), output, errors);
    let (mut child, _leftovers) = launcher
        .spawner
        .spawn(warded)
        .await
        .map_err(|error| format!("could not start sh: {error}"))?;
    let pid = child.id();
    match tokio::time::timeout(timeout, child.wait()).await {
        Ok(status) => status
            .map(|status| (status, false))
            .map_err(|error| format!("could not wait for the check: {error}")),
        Err(_) => {
            if let Some(group) = pid.and_then(|pid| rustix::process::Pid::from_raw(pid as i32)) {
                // The group may be gone already; whatever left it is killed by its marker next.
                let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
            }
            // Best effort: the check already failed by its timeout, and its wait below ends it.
            let _ = tokio::task::spawn_blocking(move || procscan::kill_marked(&marker)).await;
            child
                .wait()
                .await
                .map(|status| (status, true))
                .map_err(|error| format!("could not wait for the check: {error}"))
        }
    }
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
