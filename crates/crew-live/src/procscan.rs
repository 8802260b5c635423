//! Finding an agent's processes by their marker, for the ones that left its process group
//! (`setsid`, double forks). Never by name: only a process whose environment holds exactly
//! `CREW_AGENT_ID=<runId>:<taskId>` is touched, and only this user's processes are readable.

/// The environment entry that marks every process of an agent: `CREW_AGENT_ID=<runId>:<taskId>`.
pub fn agent_marker(agent_id: &crew_core::AgentId) -> String {
    format!("{}={agent_id}", crew_core::env_vars::CREW_AGENT_ID)
}

/// The environment entry that marks every process of a run's agents: `CREW_RUN_ID=<runId>`.
pub fn run_marker(run_id: &crew_core::RunId) -> String {
    format!("{}={run_id}", crew_core::env_vars::CREW_RUN_ID)
}

/// Sends SIGKILL to every process whose environment contains `marker` (`NAME=value`) as a
/// whole entry. Returns how many were signalled.
pub fn kill_marked(marker: &str) -> usize {
    let own_pid = std::process::id();
    let mut killed = 0;
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|name| name.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == own_pid || !carries_marker(pid, marker) {
            continue;
        }
        if let Some(pid) = rustix::process::Pid::from_raw(pid as i32)
            && rustix::process::kill_process(pid, rustix::process::Signal::KILL).is_ok()
        {
            killed += 1;
        }
    }
    killed
}

/// Whether the environment of `pid` holds `marker` as a whole entry.
pub fn carries_marker(pid: u32, marker: &str) -> bool {
    std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|environ| {
        environ
            .split(|&byte| byte == 0)
            .any(|entry| entry == marker.as_bytes())
    })
}

/// The session id of `pid` (`None` for this process), as `/proc/<pid>/stat` gives it.
///
/// `None` when the process is gone or its session leader lies outside this pid namespace (a
/// container started from another session reports session 0): the session is then unknown,
/// never equal to another.
pub fn session_of(pid: Option<u32>) -> Option<u32> {
    let path = match pid {
        Some(pid) => format!("/proc/{pid}/stat"),
        None => "/proc/self/stat".to_owned(),
    };
    let stat = std::fs::read_to_string(path).ok()?;
    // `pid (comm) state ppid pgrp session …`; comm may itself hold spaces and parentheses.
    let (_, fields) = stat.rsplit_once(')')?;
    let session = fields.split_whitespace().nth(3)?.parse::<u32>().ok()?;
    (session > 0).then_some(session)
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};

    use super::session_of;

    #[test]
    fn a_new_session_is_told_apart_from_this_one() {
        let mut child = Command::new("setsid")
            .args(["sh", "-c", "echo $$; exec sleep 30"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("setsid (util-linux) runs");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let leader: u32 = line.trim().parse().unwrap();
        let session = session_of(Some(leader));
        // `setsid` forks first when it leads a process group itself: stop the leader by pid.
        let leader_pid = rustix::process::Pid::from_raw(leader as i32).unwrap();
        rustix::process::kill_process(leader_pid, rustix::process::Signal::KILL).unwrap();
        child.wait().unwrap();
        assert_eq!(session, Some(leader));
        assert_ne!(session_of(None), session);
        assert_eq!(session_of(None), session_of(Some(std::process::id())));
        assert_eq!(session_of(Some(u32::MAX)), None);
    }
}
