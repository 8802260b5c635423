//! The host's room for open descriptors.
//!
//! A host holds about six descriptors for each live agent (its output pipe and log, its
//! warden's process and report descriptors, its control connection), and most systems give a
//! process 1,024 (`ulimit -n`): a run of 200 agents at once had 85 of them fail to start, and
//! the run's own state writes with them. The first host of a process raises its soft limit to
//! the hard one, as Go's runtime does for every program, and each agent gets the user's own
//! limit back before its program starts (the warden's agent process sets it, see
//! `spawn::warden`): a program that still uses `select(2)` is never handed a descriptor past
//! 1,023 because of crew. Crew's other children (git, a worktree's `setup` command) inherit the
//! raised limit.

use std::sync::OnceLock;

use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};

/// The soft limit the process had before [`raise`] raised it; `None` when it did not (already
/// at the hard limit, or refused).
static USERS_LIMIT: OnceLock<Option<u64>> = OnceLock::new();

/// Raises this process's soft limit on open descriptors to its hard limit, once; later calls
/// do nothing. Best effort: a refusal leaves the limit as it was, and an agent that finds no
/// descriptor left fails to start with what to do (see `error::spawn_reason`).
pub fn raise() {
    USERS_LIMIT.get_or_init(|| {
        let Rlimit { current, maximum } = getrlimit(Resource::Nofile);
        let users = current?;
        // `None` is "unlimited", which Linux does not give descriptors; the kernel's own
        // ceiling (`fs.nr_open`) is what a raise may reach then.
        let ceiling = maximum.unwrap_or_else(nr_open);
        if ceiling <= users {
            return None;
        }
        setrlimit(
            Resource::Nofile,
            Rlimit {
                current: Some(ceiling),
                maximum,
            },
        )
        .ok()?;
        Some(users)
    });
}

/// The soft limit an agent gets back: the process's before [`raise`] raised it, `None` when it
/// was not raised (the agent then inherits the limit as it is).
pub fn users_limit() -> Option<u64> {
    USERS_LIMIT.get().copied().flatten()
}

/// The kernel's ceiling on a process's descriptors (`/proc/sys/fs/nr_open`, 1,048,576 unless
/// changed).
fn nr_open() -> u64 {
    std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(1 << 20)
}
