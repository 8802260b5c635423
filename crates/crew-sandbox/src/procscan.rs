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

/// The name every warden gives itself (`/proc/<pid>/comm`), so that a connection to a control
/// socket can be traced to the agent it comes from. Only a process can name itself, so an agent
/// cannot rename its warden away.
pub const WARDEN_NAME: &str = "crew-warden";

/// The parent pid and command name of `pid`, from `/proc/<pid>/stat` (`pid (comm) S ppid …`;
/// the name may hold spaces and parentheses, so the last `)` ends it).
pub fn parent_and_name(pid: u32) -> Option<(u32, String)> {
    let stat = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    let open = stat.iter().position(|&byte| byte == b'(')?;
    let close = stat.iter().rposition(|&byte| byte == b')')?;
    let name = String::from_utf8_lossy(stat.get(open + 1..close)?).into_owned();
    let rest = std::str::from_utf8(stat.get(close + 2..)?).ok()?;
    let parent = rest.split(' ').nth(1)?.parse().ok()?;
    Some((parent, name))
}

/// The wardens among the ancestors of `pid` (itself included), nearest first, each with its
/// parent (the host that started it).
pub fn warden_ancestors(pid: u32) -> Vec<(u32, u32)> {
    let mut wardens = Vec::new();
    let mut current = pid;
    // A pid chain is short; the bound only guards against a cycle read mid-change.
    for _ in 0..256 {
        if current <= 1 {
            break;
        }
        let Some((parent, name)) = parent_and_name(current) else {
            break;
        };
        if name == WARDEN_NAME {
            wardens.push((current, parent));
        }
        current = parent;
    }
    wardens
}

/// Sends SIGKILL to every process whose environment contains `marker` (`NAME=value`) as a
/// whole entry. Returns how many were signalled.
///
/// One pass over `/proc` can miss a marked process: one forked by another while the pass went
/// on (a lower pid after wrap-around, or a child born after its number was passed), or one in
/// the middle of an exec, whose environment reads as nothing for that moment. So the passes go
/// on until one finds nothing more (a few at most: each kill stops its process forking).
pub fn kill_marked(marker: &str) -> usize {
    const PASSES: usize = 5;
    // A process killed in one pass may still be exiting in the next: each counts once.
    let mut killed = std::collections::HashSet::new();
    for _ in 0..PASSES {
        if kill_marked_once(marker, &mut killed) == 0 {
            break;
        }
    }
    killed.len()
}

/// One pass: kills the marked processes, adding them to `killed`; how many were new.
fn kill_marked_once(marker: &str, killed: &mut std::collections::HashSet<u32>) -> usize {
    let own_pid = std::process::id();
    let mut new = 0;
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
        if let Some(target) = rustix::process::Pid::from_raw(pid as i32)
            && rustix::process::kill_process(target, rustix::process::Signal::KILL).is_ok()
            && killed.insert(pid)
        {
            new += 1;
        }
    }
    new
}

/// Whether the environment of `pid` holds `marker` as a whole entry.
pub fn carries_marker(pid: u32, marker: &str) -> bool {
    std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|environ| {
        environ
            .split(|&byte| byte == 0)
            .any(|entry| entry == marker.as_bytes())
    })
}

/// The terminal session of a process, as `/proc/<pid>/stat` gives it. Compare two with
/// [`same_session`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Session {
    /// The session id: 0 when the session's leader lies outside this pid namespace (a
    /// container started from another session).
    pub id: u32,
    /// The controlling terminal's device number, 0 when the process has none.
    pub terminal: u32,
}

/// The session of `pid` (`None` for this process); `None` when the process is gone.
pub fn session_of(pid: Option<u32>) -> Option<Session> {
    let path = match pid {
        Some(pid) => format!("/proc/{pid}/stat"),
        None => "/proc/self/stat".to_owned(),
    };
    let stat = std::fs::read_to_string(path).ok()?;
    // `pid (comm) state ppid pgrp session tty_nr …`; comm may itself hold spaces and
    // parentheses.
    let (_, fields) = stat.rsplit_once(')')?;
    let mut fields = fields.split_whitespace().skip(3);
    let id = fields.next()?.parse().ok()?;
    let terminal = fields.next()?.parse::<i64>().ok()?;
    Some(Session {
        id,
        terminal: u32::try_from(terminal).unwrap_or(0),
    })
}

/// Whether two sessions read by [`session_of`] are one: `None` when that is unknown (either
/// process is gone, or both leaders lie outside this pid namespace and the two share no
/// controlling terminal). A leader inside the namespace and one outside it are two sessions;
/// where both lie outside, one controlling terminal makes them one and two make them two.
pub fn same_session(a: Option<Session>, b: Option<Session>) -> Option<bool> {
    let (a, b) = (a?, b?);
    match (a.id, b.id) {
        (0, 0) if a.terminal == 0 || b.terminal == 0 => None,
        (0, 0) => Some(a.terminal == b.terminal),
        (a, b) => Some(a == b),
    }
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};

    use super::{Session, same_session, session_of};

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
        let session = session.expect("the new session's leader was alive");
        assert_eq!(session.id, leader);
        assert_eq!(
            session.terminal, 0,
            "setsid leaves the controlling terminal behind"
        );
        let own = session_of(None).unwrap();
        assert_ne!(own, session);
        assert_eq!(Some(own), session_of(Some(std::process::id())));
        assert_eq!(session_of(Some(u32::MAX)), None);
        assert_eq!(same_session(Some(own), Some(session)), Some(false));
        if own.id != 0 {
            assert_eq!(same_session(Some(own), Some(own)), Some(true));
        }
        // Leaders outside this pid namespace: told apart by their terminals, where they have one.
        let outside = |terminal| Some(Session { id: 0, terminal });
        assert_eq!(same_session(outside(0), Some(session)), Some(false));
        assert_eq!(same_session(outside(0), outside(0)), None);
        assert_eq!(same_session(outside(34816), outside(0)), None);
        assert_eq!(same_session(outside(34816), outside(34816)), Some(true));
        assert_eq!(same_session(outside(34816), outside(34817)), Some(false));
        let session = Some(session);
        assert_eq!(same_session(None, session), None);
    }
}
