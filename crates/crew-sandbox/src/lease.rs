//! A task's lease: a block of ports no other task and no other program holds, and a name of
//! its own (`[lease]`), so that parallel tasks can each start the project's dev server and its
//! Compose stack at once.
//!
//! Ports are found by binding, not by hashing: a block is taken when its bytes of the user's
//! lease file (`$XDG_STATE_HOME/crew/leases/ports`, else `~/.local/state/crew/leases/ports`,
//! shared by every project and host of the user) could be locked — byte `p` is port `p` — and
//! each of its ports binds on every address of this machine (nothing listens there now). The
//! lock is an open file description's (`F_OFD_SETLK`): it is [`Lease`]'s alone, other leases
//! of the same process conflict with it as another process's do, and the kernel releases it
//! when the lease is dropped or its host dies, however it dies: no lease outlives its holder,
//! and no file is made or deleted for one. A lease is released when its task ends, and kept
//! on its record across resumes, which take the same ports again where they are free.
#![allow(unsafe_code)]
#![deny(
    unsafe_op_in_unsafe_fn,
    clippy::undocumented_unsafe_blocks,
    clippy::multiple_unsafe_ops_per_block
)]

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt as _;

use camino::Utf8PathBuf;
use crew_core::config::LeaseSettings;
use crew_core::model::LeaseRecord;

/// Where the user's leased ports are locked.
#[derive(Debug, Clone)]
pub struct Leases {
    dir: Utf8PathBuf,
}

/// A task's lease as its host holds it: its record, and the lock on its ports, released when
/// this is dropped.
#[derive(Debug)]
pub struct Lease {
    /// What the task's record and environment say of it.
    pub record: LeaseRecord,
    /// The open file description whose lock holds the ports; `None` without ports.
    _held: Option<OwnedFd>,
}

impl Lease {
    /// A lease of no ports, only the task's name: where the user has no state directory.
    pub fn unported(run: &str, task: &str, settings: &LeaseSettings) -> Lease {
        Lease {
            record: LeaseRecord {
                port: None,
                ports: 0,
                name: LeaseRecord::name_of(run, task),
                names: settings.names.clone(),
            },
            _held: None,
        }
    }
}

impl Leases {
    /// The current user's, from `XDG_STATE_HOME` or `HOME`; `None` without either.
    pub fn of_user() -> Option<Self> {
        let state = crew_core::env_vars::user_state_dir(|name| std::env::var(name).ok())?;
        Some(Leases {
            dir: state.join("leases"),
        })
    }

    /// The directory of the lease file, which no agent may see: a lock an agent took there
    /// (a read lock needs only reading) would keep other tasks from their ports.
    pub fn dir(&self) -> &camino::Utf8Path {
        &self.dir
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
    ) -> Result<Lease, String> {
        if settings.ports == 0 {
            return Ok(Lease::unported(run, task, settings));
        }
        let lease = |port, held| Lease {
            record: LeaseRecord {
                port: Some(port),
                ports: settings.ports,
                name: LeaseRecord::name_of(run, task),
                names: settings.names.clone(),
            },
            _held: Some(held),
        };
        let path = self.dir.join("ports");
        let file = std::fs::create_dir_all(&self.dir)
            .and_then(|()| {
                std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .mode(0o600)
                    .custom_flags(libc::O_NOFOLLOW)
                    .open(&path)
            })
            .map_err(|error| format!("cannot open {path}: {error}"))?;
        let held = OwnedFd::from(file);
        let count = settings.ports;
        let [low, high] = settings.port_range;
        let blocks = (u32::from(high) - u32::from(low) + 1) / u32::from(count);
        if let Some(port) = earlier.and_then(|earlier| earlier.port)
            && earlier.is_some_and(|earlier| earlier.ports == count)
            && take(&held, port, count)
        {
            return Ok(lease(port, held));
        }
        // Where this host starts looking: hosts started at once look in different places.
        let start = std::process::id() % blocks.max(1);
        for offset in 0..blocks {
            let block = (start + offset) % blocks;
            let port = low + (block * u32::from(count)) as u16;
            if take(&held, port, count) {
                return Ok(lease(port, held));
            }
        }
        Err(format!(
            "no block of {count} free ports is left in [lease] port_range [{low}, {high}]: widen it, or lease fewer ports a task"
        ))
    }
}

/// Takes `count` ports from `port` on for the lease whose lock file is `held`: their bytes
/// locked and every port free to bind, else none of them (the lock is let go).
fn take(held: &OwnedFd, port: u16, count: u16) -> bool {
    if !lock(held, port, count, libc::F_WRLCK as libc::c_short) {
        return false;
    }
    let free = (port..port.saturating_add(count)).all(free_to_bind);
    if !free {
        lock(held, port, count, libc::F_UNLCK as libc::c_short);
    }
    free
}

/// Sets the lock `kind` (`F_WRLCK` or `F_UNLCK`) on the bytes `port..port + count` of `held`'s
/// open file description, without waiting: whether it could.
fn lock(held: &OwnedFd, port: u16, count: u16, kind: libc::c_short) -> bool {
    // SAFETY: `flock` is plain data, for which all zeroes is a valid value.
    let mut range: libc::flock = unsafe { std::mem::zeroed() };
    range.l_type = kind;
    range.l_whence = libc::SEEK_SET as libc::c_short;
    range.l_start = libc::off_t::from(port);
    range.l_len = libc::off_t::from(count);
    // SAFETY: `F_OFD_SETLK` reads the `flock` it is given, alive for the call, on a descriptor
    // `held` keeps open.
    unsafe { libc::fcntl(held.as_raw_fd(), libc::F_OFD_SETLK, &mut range) == 0 }
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

    /// What `acquire` gives within a few seconds: a child another test forks holds a copy of
    /// a dropped lease's description (and its lock) until it execs or ends.
    fn soon(acquire: impl Fn() -> Result<Lease, String>) -> Lease {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            match acquire() {
                Ok(lease) => return lease,
                Err(reason) if std::time::Instant::now() > deadline => panic!("{reason}"),
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(20)),
            }
        }
    }

    /// A port this test holds, the seven above it free when looked at: below the kernel's
    /// ephemeral range, where the listeners other tests ask for (port 0) never land (one that
    /// landed among the seven left fewer blocks than the test counts on).
    fn held_below_free_ones() -> (std::net::TcpListener, u16) {
        let start = 20_000 + (std::process::id() % 500) as u16 * 16;
        for port in (start..30_000).step_by(8) {
            let Ok(held) = std::net::TcpListener::bind(("127.0.0.1", port)) else {
                continue;
            };
            if (port + 1..port + 8).all(free_to_bind) {
                return (held, port);
            }
        }
        panic!("no port from {start} up with the seven above it free");
    }

    #[test]
    fn a_port_held_by_another_program_or_task_is_skipped_and_a_release_frees_it() {
        let dir = tempfile::tempdir().unwrap();
        let leases = Leases {
            dir: Utf8PathBuf::from_path_buf(dir.path().to_owned()).unwrap(),
        };
        let (_held, port) = held_below_free_ones();
        let settings = LeaseSettings {
            ports: 2,
            port_range: [port, port + 7],
            names: vec!["DATABASE_NAME".into()],
        };
        let mut taken: Vec<Lease> = (0..3)
            .map(|task| {
                leases
                    .acquire(&settings, "r", &format!("t{task}"), None)
                    .unwrap()
            })
            .collect();
        let mut ports: Vec<u16> = taken
            .iter()
            .map(|lease| lease.record.port.unwrap())
            .collect();
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
        let first = taken.remove(0);
        let first_port = first.record.port;
        drop(first);
        let again = soon(|| leases.acquire(&settings, "r", "t3", None));
        assert_eq!(again.record.port, first_port);
        assert_eq!(again.record.name, "crew_r_t3");
        assert!(
            again
                .record
                .vars()
                .contains(&("DATABASE_NAME".into(), "crew_r_t3".into()))
        );
        // A resume takes its own ports again.
        let record = again.record.clone();
        drop(again);
        let resumed = soon(|| leases.acquire(&settings, "r", "t3", Some(&record)));
        assert_eq!(resumed.record.port, record.port);
    }

    #[test]
    fn a_lease_dies_with_its_holder_and_another_process_s_is_never_taken() {
        let dir = tempfile::tempdir().unwrap();
        let leases = Leases {
            dir: Utf8PathBuf::from_path_buf(dir.path().to_owned()).unwrap(),
        };
        // A free port, and the block of one port there: below the kernel's ephemeral range, so
        // that no connection of another test takes it between the two acquires (CI met that).
        let start = 21_000 + (std::process::id() % 4_000) as u16;
        let port = (start..start + 2_000)
            .find(|port| std::net::TcpListener::bind(("127.0.0.1", *port)).is_ok())
            .expect("a free port below the ephemeral range");
        let settings = LeaseSettings {
            ports: 1,
            port_range: [port, port],
            names: Vec::new(),
        };
        // Another process takes it: a child holding its own open file description of the
        // lease file (the parent closes its copy), locked as a lease locks, until killed.
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(dir.path().join("ports"))
            .unwrap();
        let description = OwnedFd::from(file);
        let (mut ready, ready_writer) = std::io::pipe().unwrap();
        // SAFETY: the child makes only system calls on what the parent made before the fork
        // (a lock on `description`, a write, a pause) and never returns.
        let holder = unsafe { libc::fork() };
        if holder == 0 {
            // Only its own description: the test process's other leases (of tests running
            // beside this one) are not to outlive their holders in this child.
            let mut keep = [description.as_raw_fd(), ready_writer.as_raw_fd()];
            keep.sort_unstable();
            let mut from = 3;
            for kept in keep {
                if kept > from {
                    // SAFETY: closes the child's descriptors below `kept`; no memory passed.
                    unsafe { libc::close_range(from as u32, (kept - 1) as u32, 0) };
                }
                from = kept + 1;
            }
            // SAFETY: as above, every descriptor above the last kept.
            unsafe { libc::close_range(from as u32, u32::MAX, 0) };
            let said: &[u8] = if lock(&description, port, 1, libc::F_WRLCK as libc::c_short) {
                b"y"
            } else {
                b"n"
            };
            // SAFETY: a write of a static byte on a descriptor the child holds.
            unsafe { libc::write(ready_writer.as_raw_fd(), said.as_ptr().cast(), 1) };
            loop {
                // SAFETY: waits for a signal; the parent kills the child.
                unsafe { libc::pause() };
            }
        }
        assert!(holder > 0, "fork failed");
        drop((description, ready_writer));
        let mut said = [0u8; 1];
        std::io::Read::read_exact(&mut ready, &mut said).unwrap();
        assert_eq!(&said, b"y", "the child could not lock");
        assert!(
            leases.acquire(&settings, "r", "t", None).is_err(),
            "another process's lease was taken"
        );
        // Its holder killed: the kernel let the lock go, the port is free again.
        // SAFETY: signals the child forked above, which the parent has not reaped.
        assert_eq!(unsafe { libc::kill(holder, libc::SIGKILL) }, 0);
        let mut status = 0;
        // SAFETY: reaps that child into a local.
        assert_eq!(unsafe { libc::waitpid(holder, &mut status, 0) }, holder);
        let taken = leases.acquire(&settings, "r", "t", None).unwrap();
        assert_eq!(taken.record.port, Some(port));
    }
}
