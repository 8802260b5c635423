//! A warden's process as its host holds it: its pid, a pidfd to wait on, and the host's ends
//! of its agent's pipes. The warden is the host's child (see `warden/server.rs`), so the host
//! reaps it; tokio's `Child` cannot be made for a process tokio did not start.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

use tokio::io::unix::AsyncFd;

/// The host's end of an agent's stdin.
pub type AgentInput = tokio::net::unix::pipe::Sender;
/// The host's end of an agent's stdout or stderr.
pub type AgentOutput = tokio::net::unix::pipe::Receiver;

/// A warden's process, started by a [`super::Spawner`].
#[derive(Debug)]
pub struct Warden {
    pid: u32,
    pidfd: AsyncFd<OwnedFd>,
    status: Option<ExitStatus>,
    /// The agent's stdin, when piped.
    pub stdin: Option<AgentInput>,
    /// The agent's stdout, when piped.
    pub stdout: Option<AgentOutput>,
    /// The agent's stderr, when piped.
    pub stderr: Option<AgentOutput>,
}

impl Warden {
    /// The warden `pid`, a child of this process, with the host's ends of its pipes. Within a
    /// tokio runtime.
    pub(super) fn new(
        pid: libc::pid_t,
        stdin: Option<OwnedFd>,
        stdout: Option<OwnedFd>,
        stderr: Option<OwnedFd>,
    ) -> io::Result<Warden> {
        // SAFETY: no memory argument; the pid is this process's child, not yet reaped, so it
        // names that process.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, libc::PIDFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the kernel just opened this descriptor for this process alone.
        let pidfd = unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) };
        Ok(Warden {
            pid: pid as u32,
            pidfd: watched(pidfd)?,
            status: None,
            stdin: stdin.map(AgentInput::from_owned_fd).transpose()?,
            stdout: stdout.map(AgentOutput::from_owned_fd).transpose()?,
            stderr: stderr.map(AgentOutput::from_owned_fd).transpose()?,
        })
    }

    /// Its pid, until it was reaped.
    pub fn id(&self) -> Option<u32> {
        self.status.is_none().then_some(self.pid)
    }

    /// Waits for it to exit and reaps it: how it ended. Closes the agent's stdin first.
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        drop(self.stdin.take());
        if let Some(status) = self.reap()? {
            return Ok(status);
        }
        let status = exited(&self.pidfd).await?;
        self.status = Some(status);
        Ok(status)
    }

    /// Reaps it if it exited: its status, or `None` while it runs.
    fn reap(&mut self) -> io::Result<Option<ExitStatus>> {
        if self.status.is_none() {
            self.status = reap(self.pidfd.get_ref())?;
        }
        Ok(self.status)
    }
}

/// Waits for the child of `pidfd` to exit, and reaps it.
async fn exited(pidfd: &AsyncFd<OwnedFd>) -> io::Result<ExitStatus> {
    loop {
        let mut ready = pidfd.readable().await?;
        if let Some(status) = reap(ready.get_inner())? {
            return Ok(status);
        }
        ready.clear_ready();
    }
}

/// Reaps the child of `pidfd` if it exited: its status, or `None` while it runs.
fn reap(pidfd: &OwnedFd) -> io::Result<Option<ExitStatus>> {
    // SAFETY: all-zero is a valid siginfo, which waitid fills.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    let flags = libc::WEXITED | libc::WNOHANG;
    let id = pidfd.as_raw_fd() as libc::id_t;
    // SAFETY: waitid writes one siginfo into the one it is given.
    if unsafe { libc::waitid(libc::P_PIDFD, id, &mut info, flags) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: waitid filled the fields of a child's state change, or left zeros.
    let (pid, status) = unsafe { (info.si_pid(), info.si_status()) };
    if pid == 0 {
        return Ok(None);
    }
    let raw = match info.si_code {
        libc::CLD_EXITED => (status & 0xff) << 8,
        libc::CLD_DUMPED => (status & 0x7f) | 0x80,
        _ => status & 0x7f,
    };
    Ok(Some(ExitStatus::from_raw(raw)))
}

/// `pidfd` watched by the runtime's reactor: readable once its process exited.
fn watched(pidfd: OwnedFd) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: the `OwnedFd` returns the descriptor it owns, the same one for as long as the
    // `AsyncFd` holds it.
    Ok(unsafe { AsyncFd::register_with_interest(pidfd, tokio::io::Interest::READABLE) }?)
}

impl Drop for Warden {
    fn drop(&mut self) {
        // Reaped now if it is done; else when it is, by a task of the runtime (or, with none,
        // left to the host's exit, as a zombie, like any child nobody waits for).
        if matches!(self.reap(), Ok(None))
            && let Ok(handle) = tokio::runtime::Handle::try_current()
            && let Ok(pidfd) = self.pidfd.get_ref().try_clone()
        {
            handle.spawn(async move {
                if let Ok(pidfd) = watched(pidfd) {
                    // Only waits: an error means the process is gone as well.
                    let _ = exited(&pidfd).await;
                }
            });
        }
    }
}
