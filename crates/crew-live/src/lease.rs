//! A task's lease: a block of ports no other task and no other program holds, and a name of
//! its own (`[lease]`), so that parallel tasks can each start the project's dev server and its
//! Compose stack at once.
//!
//! Ports are found by binding, not by hashing: a block is taken when a lease file could be
//! created for each of its ports (`create_new`, beneath the user's state directory:
//! `$XDG_STATE_HOME/crew/leases`, else `~/.local/state/crew/leases`, shared by every project
//! and host of the user) and each binds on every address of this machine (nothing listens
//! there now). A lease file names the host process that holds it; one whose host is gone is
//! taken over. A lease is released when its task ends, and kept on its record across resumes,
//! which take the same ports again where they are free.

use std::io::Write as _;

use camino::Utf8PathBuf;
use crew_core::config::LeaseSettings;
use crew_core::model::LeaseRecord;

/// Where the user's leased ports are recorded.
#[derive(Debug, Clone)]
pub struct Leases {
    dir: Utf8PathBuf,
}

impl Leases {
    /// The current user's, from `XDG_STATE_HOME` or `HOME`; `None` without either.
    pub fn of_user() -> Option<Self> {
        let state = crew_core::env_vars::user_state_dir(|name| std::env::var(name).ok())?;
        Some(Leases {
            dir: state.join("leases"),
        })
    }

    /// A lease for the task `run`:`task` as `settings` say: the ports of `earlier` (its
    /// record's, on a resume) when they are free, else the first free block from a place in
    /// the range that differs from host to host; its name either way. The error says why no
    /// block could be had.
    pub fn acquire(
        &self,
        settings: &LeaseSettings,
        run: &str,
        task: &str,
        earlier: Option<&LeaseRecord>,
    ) -> Result<LeaseRecord, String> {
        let name = LeaseRecord::name_of(run, task);
        let record = |port| LeaseRecord {
            port,
            ports: if port.is_some() { settings.ports } else { 0 },
            name: name.clone(),
            names: settings.names.clone(),
        };
        if settings.ports == 0 {
            return Ok(record(None));
        }
        std::fs::create_dir_all(&self.dir)
            .map_err(|error| format!("cannot make {}: {error}", self.dir))?;
        let owner = format!("{}\n{run}:{task}\n", std::process::id());
        let count = settings.ports;
        let [low, high] = settings.port_range;
        let blocks = (u32::from(high) - u32::from(low) + 1) / u32::from(count);
        if let Some(port) = earlier.and_then(|earlier| earlier.port)
            && earlier.is_some_and(|earlier| earlier.ports == count)
            && self.take(port, count, &owner)
        {
            return Ok(record(Some(port)));
        }
        // Where this host starts looking: hosts started at once look in different places.
        let start = std::process::id() % blocks.max(1);
        for offset in 0..blocks {
            let block = (start + offset) % blocks;
            let port = low + (block * u32::from(count)) as u16;
            if self.take(port, count, &owner) {
                return Ok(record(Some(port)));
            }
        }
        Err(format!(
            "no block of {count} free ports is left in [lease] port_range [{low}, {high}]: widen it, or lease fewer ports a task"
        ))
    }

    /// Releases the ports of `lease` (the task ended).
    pub fn release(&self, lease: &LeaseRecord) {
        let Some(port) = lease.port else { return };
        for port in port..port.saturating_add(lease.ports) {
            // Gone already (taken over from a dead host, or removed by hand): nothing to do.
            let _ = std::fs::remove_file(self.file(port));
        }
    }

    fn file(&self, port: u16) -> Utf8PathBuf {
        self.dir.join(format!("port-{port}"))
    }

    /// Takes `count` ports from `port` on for `owner`: every lease file made and every port
    /// free to bind, else none of them.
    fn take(&self, port: u16, count: u16, owner: &str) -> bool {
        let mut made = Vec::new();
        let mut all = true;
        for port in port..port.saturating_add(count) {
            if self.claim(port, owner) {
                made.push(port);
            } else {
                all = false;
                break;
            }
            if !free_to_bind(port) {
                all = false;
                break;
            }
        }
        if !all {
            for port in made {
                let _ = std::fs::remove_file(self.file(port));
            }
        }
        all
    }

    /// Makes the lease file of `port`, taking over one whose host is gone.
    fn claim(&self, port: u16, owner: &str) -> bool {
        let path = self.file(port);
        for _ in 0..2 {
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
            {
                Ok(mut file) => return file.write_all(owner.as_bytes()).is_ok(),
                Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {
                    let holder = std::fs::read_to_string(&path).unwrap_or_default();
                    let alive = holder
                        .lines()
                        .next()
                        .and_then(|pid| pid.parse::<i32>().ok())
                        .and_then(rustix::process::Pid::from_raw)
                        .is_some_and(|pid| rustix::process::test_kill_process(pid).is_ok());
                    // Held by a live host (a half-written file is its own, being written).
                    if alive || holder.is_empty() {
                        return false;
                    }
                    let _ = std::fs::remove_file(&path);
                }
                Err(_) => return false,
            }
        }
        false
    }
}

/// Whether nothing listens on `port` on this machine, on any address of either family.
fn free_to_bind(port: u16) -> bool {
    let v4 = std::net::TcpListener::bind(("0.0.0.0", port)).is_ok();
    // Without IPv6 there is nothing to collide with there.
    let v6 = match std::net::TcpListener::bind(("::", port)) {
        Ok(_) => true,
        Err(error) => error.kind() == std::io::ErrorKind::AddrNotAvailable,
    };
    v4 && v6
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_held_by_another_program_or_task_is_skipped_and_a_release_frees_it() {
        let dir = tempfile::tempdir().unwrap();
        let leases = Leases {
            dir: Utf8PathBuf::from_path_buf(dir.path().to_owned()).unwrap(),
        };
        let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = held.local_addr().unwrap().port();
        let settings = LeaseSettings {
            ports: 2,
            port_range: [port, port + 7],
            names: vec!["DATABASE_NAME".into()],
        };
        let taken: Vec<LeaseRecord> = (0..3)
            .map(|task| {
                leases
                    .acquire(&settings, "r", &format!("t{task}"), None)
                    .unwrap()
            })
            .collect();
        let mut ports: Vec<u16> = taken.iter().map(|lease| lease.port.unwrap()).collect();
        ports.sort_unstable();
        ports.dedup();
        assert_eq!(ports.len(), 3, "{taken:?}");
        // The block holding the busy port was never handed out.
        assert!(
            ports
                .iter()
                .all(|first| !(*first..first + 2).contains(&port))
        );
        assert!(
            leases.acquire(&settings, "r", "t3", None).is_err(),
            "the range is full"
        );
        leases.release(&taken[0]);
        let again = leases.acquire(&settings, "r", "t3", None).unwrap();
        assert_eq!(again.port, taken[0].port);
        assert_eq!(again.name, "crew_r_t3");
        assert!(
            again
                .vars()
                .contains(&("DATABASE_NAME".into(), "crew_r_t3".into()))
        );
        // A resume takes its own ports again.
        leases.release(&again);
        let resumed = leases.acquire(&settings, "r", "t3", Some(&again)).unwrap();
        assert_eq!(resumed.port, again.port);
    }
}
