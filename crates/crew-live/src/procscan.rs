//! Finding an agent's processes by their marker, for the ones that left its process group
//! (`setsid`, double forks). Never by name: only a process whose environment holds exactly
//! `CREW_AGENT_ID=<runId>:<taskId>` is touched, and only this user's processes are readable.

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
