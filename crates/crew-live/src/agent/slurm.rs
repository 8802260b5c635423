//! A placed task's Slurm job, as Slurm's own commands tell it: `squeue` for its state (queued
//! and why, running, or how Slurm ended it), `scancel` to signal it. The job is named for its
//! run and task (`crew_core::config::slurm_job_name`), so these find it without its id.

use std::time::Duration;

/// One job's state, as `squeue` gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct JobState {
    /// Its id.
    pub id: String,
    /// `PENDING`, `RUNNING`, `TIMEOUT`, `NODE_FAIL` …
    pub state: String,
    /// Why it is in that state (`Resources`, `Priority`; `None` when nothing is said).
    pub reason: Option<String>,
    /// The nodes it runs on, once it does.
    pub nodes: Option<String>,
}

/// The newest job named `name`, in any state Slurm still remembers; `None` when there is none
/// or `squeue` cannot say.
pub(crate) async fn job_state(name: &str) -> Option<JobState> {
    let output = tokio::process::Command::new("squeue")
        .args(["--noheader", "--states=all", "--format=%i|%T|%r|%N"])
        .arg(format!("--name={name}"))
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .await
        .ok()?;
    let text = String::from_utf8_lossy(&output.stdout);
    text.lines()
        .filter_map(|line| {
            let mut parts = line.trim().split('|');
            let id = parts.next()?.to_owned();
            let state = parts.next()?.to_owned();
            let said = |part: Option<&str>| {
                part.map(str::trim)
                    .filter(|text| !text.is_empty() && *text != "None" && *text != "(null)")
                    .map(str::to_owned)
            };
            let reason = said(parts.next());
            let nodes = said(parts.next());
            Some(JobState {
                id,
                state,
                reason,
                nodes,
            })
        })
        .max_by_key(|job| job.id.parse::<u64>().unwrap_or(0))
}

/// How Slurm ended a job that did not end by itself, in a reason's words; `None` for a job
/// that completed, failed by its own exit, or has not ended.
pub(crate) fn ended_by_slurm(job: &JobState) -> Option<String> {
    ended_how(job).map(|(said, _)| said)
}

/// Whether Slurm ended the job for what the task asked of it (its time or memory limit: the
/// task fails), rather than for the cluster's sake (a failed node, a preemption: the task is
/// interrupted, to be resumed).
pub(crate) fn ended_by_its_limits(job: &JobState) -> bool {
    ended_how(job).is_some_and(|(_, limits)| limits)
}

fn ended_how(job: &JobState) -> Option<(String, bool)> {
    let (how, limits) = match job.state.as_str() {
        "TIMEOUT" => ("at its time limit (TIMEOUT)", true),
        "OUT_OF_MEMORY" => ("at its memory limit (OUT_OF_MEMORY)", true),
        "DEADLINE" => ("at its deadline (DEADLINE)", true),
        "NODE_FAIL" => ("when its node failed (NODE_FAIL)", false),
        "PREEMPTED" => ("to run another job (PREEMPTED)", false),
        "BOOT_FAIL" => ("when its node could not boot (BOOT_FAIL)", false),
        _ => return None,
    };
    Some((format!("Slurm ended its job {} {how}", job.id), limits))
}

/// Whether the job is still to end (queued, running, or being cleaned up).
pub(crate) fn ending(job: &JobState) -> bool {
    matches!(
        job.state.as_str(),
        "PENDING" | "CONFIGURING" | "RUNNING" | "COMPLETING" | "SUSPENDED" | "STAGE_OUT"
    )
}

/// The job's final state, once Slurm has one (it may take the node a few seconds to clean the
/// job up after its step ended); the last seen otherwise.
pub(crate) async fn final_state(name: &str) -> Option<JobState> {
    let mut last = None;
    for _ in 0..40 {
        let job = job_state(name).await;
        match &job {
            Some(job) if ending(job) => {}
            _ => return job.or(last),
        }
        last = job;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    last
}

/// Sends `signal` to the job's processes (`TERM`: its shim stops its task gracefully and sends
/// its work back), or cancels it outright (`None`). Waited for on a task of its own.
pub(crate) fn signal(name: &str, signal: Option<&str>) {
    let mut command = tokio::process::Command::new("scancel");
    if let Some(signal) = signal {
        command.arg(format!("--signal={signal}"));
    }
    command
        .arg(format!("--name={name}"))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    match command.spawn() {
        Ok(mut child) => {
            tokio::spawn(async move {
                // Its exit says nothing more: the job's own end is what the task sees.
                let _ = child.wait().await;
            });
        }
        Err(error) => tracing::warn!("scancel could not start: {error}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_states_slurm_ends_a_job_in_are_named_with_the_job() {
        let job = |state: &str| JobState {
            id: "12".into(),
            state: state.into(),
            reason: None,
            nodes: None,
        };
        assert_eq!(
            ended_by_slurm(&job("TIMEOUT")).as_deref(),
            Some("Slurm ended its job 12 at its time limit (TIMEOUT)")
        );
        assert!(
            ended_by_slurm(&job("NODE_FAIL"))
                .unwrap()
                .contains("node failed")
        );
        assert_eq!(ended_by_slurm(&job("COMPLETED")), None);
        assert_eq!(ended_by_slurm(&job("FAILED")), None);
        assert!(ending(&job("COMPLETING")) && !ending(&job("TIMEOUT")));
        assert!(ended_by_its_limits(&job("TIMEOUT")) && !ended_by_its_limits(&job("NODE_FAIL")));
    }
}
