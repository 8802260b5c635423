//! Which process hosts a run, and whether it is still alive.
//!
//! A pid alone is not an identity: after the host dies the kernel may give its pid to an
//! unrelated process. A host is recorded as its pid, the start time the kernel reports for that
//! pid in `/proc/<pid>/stat` (clock ticks since boot), and the boot id; all three must match
//! for the host to count as alive.

use serde::{Deserialize, Serialize};

/// The identity of a live process, as recorded in a run manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostIdentity {
    /// The process id.
    pub pid: u32,
    /// Field 22 of `/proc/<pid>/stat`: when the process started, in clock ticks since boot.
    pub start_time: u64,
    /// `/proc/sys/kernel/random/boot_id`; empty when the kernel does not provide it.
    #[serde(default)]
    pub boot_id: String,
}

/// This process's identity could not be read.
#[derive(Debug, thiserror::Error)]
#[error("failed to read the identity of process {pid} from /proc")]
pub struct HostIdentityError {
    /// The process whose identity was asked for.
    pub pid: u32,
    /// Why `/proc/<pid>/stat` could not be read.
    #[source]
    pub source: std::io::Error,
}

impl HostIdentity {
    /// The identity of the calling process.
    pub fn current() -> Result<Self, HostIdentityError> {
        let pid = std::process::id();
        Self::of_pid(pid)?.ok_or_else(|| HostIdentityError {
            pid,
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        })
    }

    /// The identity of `pid` now, or `None` when no such process exists.
    pub fn of_pid(pid: u32) -> Result<Option<Self>, HostIdentityError> {
        let stat = match read_proc_file(&format!("/proc/{pid}/stat")) {
            Ok(stat) => stat,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(HostIdentityError { pid, source }),
        };
        let Some(start_time) = parse_start_time(&stat) else {
            return Err(HostIdentityError {
                pid,
                source: std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("unexpected format of /proc/{pid}/stat"),
                ),
            });
        };
        Ok(Some(HostIdentity {
            pid,
            start_time,
            boot_id: boot_id(),
        }))
    }

    /// Whether the process this identity describes is still running. A pid now held by another
    /// process, a zombie, or a different boot all count as gone.
    pub fn is_alive(&self) -> bool {
        let Ok(stat) = read_proc_file(&format!("/proc/{}/stat", self.pid)) else {
            return false;
        };
        if parse_state(&stat) == Some('Z') {
            return false;
        }
        parse_start_time(&stat) == Some(self.start_time)
            && (self.boot_id.is_empty() || self.boot_id == boot_id())
    }
}

/// The boot id, read once per process: it cannot change while the process lives, and listings
/// check the liveness of every host.
fn boot_id() -> String {
    static BOOT_ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BOOT_ID
        .get_or_init(|| {
            read_proc_file("/proc/sys/kernel/random/boot_id")
                .map(|id| id.trim().to_owned())
                .unwrap_or_default()
        })
        .clone()
}

/// A small file of `/proc`, in one read and the one that finds its end: such files say their
/// size is 0, so `fs::read_to_string` reads them in growing pieces (six reads for a process's
/// `stat`, which every listing reads for each host).
fn read_proc_file(path: &str) -> std::io::Result<String> {
    use std::io::Read as _;
    let mut text = String::with_capacity(1024);
    std::fs::File::open(path)?.read_to_string(&mut text)?;
    Ok(text)
}

/// The fields after the command name. The name sits in parentheses and may itself contain
/// spaces and parentheses, so the split is at the last `)`.
fn fields_after_comm(stat: &str) -> Option<std::str::SplitWhitespace<'_>> {
    let close = stat.rfind(')')?;
    Some(stat[close + 1..].split_whitespace())
}

fn parse_state(stat: &str) -> Option<char> {
    fields_after_comm(stat)?.next()?.chars().next()
}

fn parse_start_time(stat: &str) -> Option<u64> {
    // After the name come field 3 (state) onwards; start time is field 22.
    fields_after_comm(stat)?.nth(22 - 3)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_awkward_command_names() {
        let stat =
            "1234 (a) b) (c) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 100";
        assert_eq!(parse_start_time(stat), Some(987_654));
        assert_eq!(parse_state(stat), Some('S'));
    }

    #[test]
    fn current_process_is_alive_and_a_changed_start_time_is_not() {
        let me = HostIdentity::current().unwrap();
        assert!(me.is_alive());
        let reused = HostIdentity {
            start_time: me.start_time + 1,
            ..me.clone()
        };
        assert!(!reused.is_alive());
        let other_boot = HostIdentity {
            boot_id: "not-this-boot".into(),
            ..me
        };
        assert!(!other_boot.is_alive());
    }
}
