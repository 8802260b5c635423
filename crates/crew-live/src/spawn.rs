//! Starting agent processes so that they can never outlive their host.
//!
//! Every agent gets a small **warden**: the process the host forks is made leader of a new
//! process group, asks the kernel for a signal when its parent thread dies
//! (`PR_SET_PDEATHSIG`), then forks the agent itself and waits for it. The agent and
//! everything it starts live in the warden's group.
//!
//! - When the agent exits, the warden exits the same way (same code, or the same signal), so
//!   the host sees the agent's own exit status.
//! - When the host dies, even by SIGKILL, the kernel signals the warden, whose handler sends
//!   SIGKILL to the whole group: agent and grandchildren go at once.
//! - The warden ignores TERM and INT: a graceful stop (TERM to the group) reaches the agent, and
//!   the warden simply reports how the agent ended.
//!
//! The parent-death signal fires when the *thread* that forked dies, so every fork happens on
//! one dedicated spawner thread that lives as long as the [`crate::AgentHost`]: tokio's blocking
//! threads come and go and would kill agents with them.
//!
//! The warden runs between `fork` and `exec` of a multi-threaded process, where only
//! async-signal-safe calls are allowed: it uses raw `libc` calls, allocates nothing and never
//! returns into Rust code.
#![allow(unsafe_code)]

use std::io;
use std::sync::mpsc;

use tokio::process::{Child, Command};
use tokio::sync::oneshot;

/// The signal the kernel sends the warden when the host's spawner thread dies.
const WARDEN_SIGNAL: libc::c_int = libc::SIGUSR2;

/// Makes `command` start under a warden in a process group of its own.
pub fn guard_with_warden(command: &mut Command) {
    let host_pid = std::process::id() as libc::pid_t;
    // SAFETY: the closure only makes async-signal-safe calls (see `become_warden`), captures a
    // plain integer, and is sound to run in the child between fork and exec.
    unsafe {
        command.pre_exec(move || become_warden(host_pid));
    }
}

/// Runs in the forked child, before exec. In the agent (the grandchild) it returns `Ok` and std
/// goes on to exec the program; in the warden it never returns.
///
/// # Safety
/// Must only be called between fork and exec.
unsafe fn become_warden(host_pid: libc::pid_t) -> io::Result<()> {
    // SAFETY: every call below is async-signal-safe and operates on this process only.
    unsafe {
        if libc::setpgid(0, 0) != 0 {
            return Err(io::Error::last_os_error());
        }
        let mut unblocked: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut unblocked);
        libc::sigprocmask(libc::SIG_SETMASK, &unblocked, std::ptr::null_mut());
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_host_death as *const () as libc::sighandler_t;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(WARDEN_SIGNAL, &action, std::ptr::null_mut());
        if libc::prctl(
            libc::PR_SET_PDEATHSIG,
            WARDEN_SIGNAL as libc::c_ulong,
            0,
            0,
            0,
        ) != 0
        {
            return Err(io::Error::last_os_error());
        }
        // The host may have died before the signal was armed.
        if libc::getppid() != host_pid {
            libc::kill(0, libc::SIGKILL);
            libc::_exit(137);
        }
        let agent = libc::fork();
        if agent < 0 {
            return Err(io::Error::last_os_error());
        }
        if agent == 0 {
            // The agent: the parent-death signal is not inherited; restore the default action
            // of the warden's signal before exec clears the handler anyway.
            libc::signal(WARDEN_SIGNAL, libc::SIG_DFL);
            return Ok(());
        }
        warden(agent)
    }
}

/// The warden's whole life: wait for the agent, then end the same way.
///
/// # Safety
/// Must only be called in the forked child, before exec.
unsafe fn warden(agent: libc::pid_t) -> ! {
    // SAFETY: async-signal-safe calls only; this process never returns into Rust code.
    unsafe {
        // Every inherited descriptor but stdio: above all std's exec-error pipe, which must
        // close when the agent execs so that the host learns the spawn succeeded.
        if libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) != 0 {
            let mut fd = 3;
            while fd < 65_536 {
                libc::close(fd);
                fd += 1;
            }
        }
        libc::signal(libc::SIGTERM, libc::SIG_IGN);
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::signal(libc::SIGHUP, libc::SIG_IGN);
        libc::signal(libc::SIGQUIT, libc::SIG_IGN);
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
        libc::signal(libc::SIGCHLD, libc::SIG_DFL);
        let mut status: libc::c_int = 0;
        loop {
            let waited = libc::waitpid(agent, &mut status, 0);
            if waited == agent {
                break;
            }
            if waited < 0 && *libc::__errno_location() != libc::EINTR {
                libc::_exit(127);
            }
        }
        if libc::WIFEXITED(status) {
            libc::_exit(libc::WEXITSTATUS(status));
        }
        let signal = if libc::WIFSIGNALED(status) {
            libc::WTERMSIG(status)
        } else {
            libc::SIGKILL
        };
        libc::signal(signal, libc::SIG_DFL);
        let mut unblocked: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut unblocked);
        libc::sigprocmask(libc::SIG_SETMASK, &unblocked, std::ptr::null_mut());
        libc::kill(libc::getpid(), signal);
        libc::_exit(128 + signal)
    }
}

/// The warden's handler for its parent-death signal: the whole group goes, the warden too.
extern "C" fn on_host_death(_signal: libc::c_int) {
    // SAFETY: kill is async-signal-safe; 0 addresses the caller's own process group.
    unsafe {
        libc::kill(0, libc::SIGKILL);
    }
}

struct SpawnJob {
    command: Command,
    reply: oneshot::Sender<io::Result<Child>>,
}

/// The thread every agent is forked from. It lives until the last [`Spawner`] is dropped; when
/// it ends, the kernel signals every warden it forked.
#[derive(Debug, Clone)]
pub struct Spawner {
    jobs: mpsc::Sender<SpawnJob>,
}

impl std::fmt::Debug for SpawnJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpawnJob").finish_non_exhaustive()
    }
}

impl Spawner {
    /// Starts the spawner thread inside the runtime of `handle`.
    pub fn start(handle: tokio::runtime::Handle) -> io::Result<Self> {
        let (jobs, queue) = mpsc::channel::<SpawnJob>();
        std::thread::Builder::new()
            .name("crew-spawner".to_owned())
            .spawn(move || {
                let _runtime = handle.enter();
                while let Ok(mut job) = queue.recv() {
                    let _ = job.reply.send(job.command.spawn());
                }
            })?;
        Ok(Spawner { jobs })
    }

    /// Spawns `command` from the spawner thread.
    pub async fn spawn(&self, command: Command) -> io::Result<Child> {
        let (reply, answer) = oneshot::channel();
        self.jobs
            .send(SpawnJob { command, reply })
            .map_err(|_| io::Error::other("the spawner thread has stopped"))?;
        answer
            .await
            .map_err(|_| io::Error::other("the spawner thread has stopped"))?
    }
}
