//! Starting agent processes so that they can never outlive their host.
//!
//! Every agent gets a small **warden**: the process the host forks is made leader of a new
//! process group, asks the kernel for a signal when its parent thread dies
//! (`PR_SET_PDEATHSIG`), then forks the agent itself and waits for it. The agent and
//! everything it starts live in the warden's group.
//!
//! - When the agent exits, the warden exits the same way (same code, or the same signal), so
//!   the host sees the agent's own exit status.
//! - When the host dies, even by SIGKILL, the kernel signals the warden, whose handler first
//!   sweeps `/proc` for processes carrying the agent's marker (`CREW_AGENT_ID=<runId>:<taskId>`
//!   in their environment) — daemons that left the group and the session with `setsid` — and
//!   kills them, then sends SIGKILL to the whole group: agent and grandchildren go at once.
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
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicUsize, Ordering};
use std::sync::mpsc;

use tokio::process::{Child, Command};
use tokio::sync::oneshot;

/// The signal the kernel sends the warden when the host's spawner thread dies.
const WARDEN_SIGNAL: libc::c_int = libc::SIGUSR2;

/// The environment entry (`NAME=value`) that marks the guarded agent's processes. Set in the
/// warden after the fork (the warden's own copy of these statics) and read by its parent-death
/// handler; unset in the host.
static MARKER: AtomicPtr<u8> = AtomicPtr::new(std::ptr::null_mut());
static MARKER_LEN: AtomicUsize = AtomicUsize::new(0);

/// How many times the warden sweeps `/proc` on host death while the sweeps still find
/// processes: a marked process may fork while a sweep passes it by.
const SWEEPS: usize = 8;

/// A memory page shared with one warden (mapped before the fork), in which the warden writes
/// how many processes the agent left behind when it exited.
#[derive(Debug)]
pub struct LeftoverCount {
    page: std::ptr::NonNull<AtomicU32>,
}

// SAFETY: the page is only ever accessed through the atomic it holds.
unsafe impl Send for LeftoverCount {}
// SAFETY: as above.
unsafe impl Sync for LeftoverCount {}

const PAGE: usize = 4096;

impl LeftoverCount {
    fn new() -> io::Result<Self> {
        // SAFETY: a fresh anonymous shared mapping; zero-filled, so the counter starts at 0.
        let page = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                PAGE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if page == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let page = std::ptr::NonNull::new(page.cast::<AtomicU32>())
            .ok_or_else(|| io::Error::other("mmap returned a null page"))?;
        Ok(LeftoverCount { page })
    }

    /// How many processes the warden killed after the agent exited (read once it exited).
    pub fn get(&self) -> u32 {
        // SAFETY: the page lives as long as `self`.
        unsafe { self.page.as_ref() }.load(Ordering::SeqCst)
    }
}

impl Drop for LeftoverCount {
    fn drop(&mut self) {
        // SAFETY: mapped by `new`, unmapped once; the warden has its own copy of the mapping.
        unsafe {
            libc::munmap(self.page.as_ptr().cast(), PAGE);
        }
    }
}

/// Makes `command` start under a warden in a process group of its own. `marker` is the
/// environment entry the agent carries (`CREW_AGENT_ID=<id>`): on host death, the warden kills
/// every process holding it, inside the group or not.
///
/// The warden is a child subreaper: whatever the agent starts and leaves behind (daemons that
/// left its group and session, even ones that cleared their environment) is re-parented to the
/// warden, which kills it when the agent exits and counts it in the returned [`LeftoverCount`].
///
/// With a `ruleset` (a Landlock ruleset built by [`crate::sandbox`]), the agent restricts itself
/// with it right before exec: the agent and everything it starts are confined, the warden is
/// not.
pub fn guard_with_warden(
    command: &mut Command,
    marker: &str,
    ruleset: Option<OwnedFd>,
) -> io::Result<LeftoverCount> {
    let host_pid = std::process::id() as libc::pid_t;
    // Allocated here, before the fork; the warden only reads it.
    let marker: Box<[u8]> = marker.as_bytes().into();
    let leftovers = LeftoverCount::new()?;
    let counter = leftovers.page.as_ptr() as usize;
    // SAFETY: the closure only makes async-signal-safe calls (see `become_warden`), captures
    // plain integers, a buffer it never frees and a descriptor it keeps open until the command
    // is dropped, and is sound to run in the child between fork and exec.
    unsafe {
        command.pre_exec(move || {
            let ruleset = ruleset.as_ref().map(AsRawFd::as_raw_fd);
            become_warden(host_pid, &marker, ruleset, counter)
        });
    }
    Ok(leftovers)
}

/// Runs in the forked child, before exec. In the agent (the grandchild) it returns `Ok` and std
/// goes on to exec the program; in the warden it never returns.
///
/// # Safety
/// Must only be called between fork and exec.
unsafe fn become_warden(
    host_pid: libc::pid_t,
    marker: &[u8],
    ruleset: Option<libc::c_int>,
    counter: usize,
) -> io::Result<()> {
    // SAFETY: every call below is async-signal-safe and operates on this process only.
    unsafe {
        if libc::setpgid(0, 0) != 0 {
            return Err(io::Error::last_os_error());
        }
        // `marker` lives in the closure std keeps until exec, which the warden never reaches.
        MARKER.store(marker.as_ptr().cast_mut(), Ordering::SeqCst);
        MARKER_LEN.store(marker.len(), Ordering::SeqCst);
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
        // Named so that a connection from the agent can be traced to it (procscan::WARDEN_NAME).
        libc::prctl(libc::PR_SET_NAME, c"crew-warden".as_ptr(), 0, 0, 0);
        // Whatever the agent leaves behind becomes the warden's child, not init's.
        if libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0 {
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
            if let Some(ruleset) = ruleset {
                crate::sandbox::restrict_self(ruleset)?;
            }
            return Ok(());
        }
        warden(agent, counter)
    }
}

/// The warden's whole life: wait for the agent, then end the same way.
///
/// # Safety
/// Must only be called in the forked child, before exec.
unsafe fn warden(agent: libc::pid_t, counter: usize) -> ! {
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
        // Everything the agent left behind: kill what is alive, reap, and again, until no child
        // is left (a killed daemon's own children become the warden's in turn).
        let mut left_behind = 0;
        loop {
            // No child left (the usual end): nothing to look for in /proc, whose scan reads
            // every process's status on the machine.
            let mut info: libc::siginfo_t = std::mem::zeroed();
            let any = libc::waitid(
                libc::P_ALL,
                0,
                &mut info,
                libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
            );
            if any < 0 && *libc::__errno_location() == libc::ECHILD {
                break;
            }
            left_behind += kill_children();
            let mut ignored: libc::c_int = 0;
            let reaped = libc::waitpid(-1, &mut ignored, 0);
            if reaped < 0 && *libc::__errno_location() != libc::EINTR {
                break;
            }
        }
        // SAFETY: the shared page mapped by the host before the fork, holding one atomic.
        (*(counter as *const AtomicU32)).store(
            u32::try_from(left_behind).unwrap_or(u32::MAX),
            Ordering::SeqCst,
        );
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

/// The warden's handler for its parent-death signal: every process carrying the agent's marker
/// goes, then the whole group, the warden too.
extern "C" fn on_host_death(_signal: libc::c_int) {
    let marker = MARKER.load(Ordering::SeqCst);
    let len = MARKER_LEN.load(Ordering::SeqCst);
    if !marker.is_null() && len > 0 {
        // SAFETY: set by `become_warden` from a buffer that outlives this process.
        let marker = unsafe { std::slice::from_raw_parts(marker, len) };
        for _ in 0..SWEEPS {
            if sweep_marked(marker) == 0 {
                break;
            }
        }
    }
    // SAFETY: kill is async-signal-safe; 0 addresses the caller's own process group.
    unsafe {
        libc::kill(0, libc::SIGKILL);
    }
}

/// Sends SIGKILL to every process but this one whose environment holds `marker` as a whole
/// entry; returns how many were signalled. Async-signal-safe, like [`for_each_pid`].
fn sweep_marked(marker: &[u8]) -> usize {
    // SAFETY: getpid and kill are plain system calls.
    let own_pid = unsafe { libc::getpid() };
    let mut killed = 0;
    for_each_pid(|pid| {
        // SAFETY: kill is a plain system call.
        if pid != own_pid
            && environ_holds(pid, marker)
            && unsafe { libc::kill(pid, libc::SIGKILL) } == 0
        {
            killed += 1;
        }
    });
    killed
}

/// Kills every live child of this process (with the warden a subreaper, every process the
/// agent left behind ends up its child) and returns how many there were. Async-signal-safe.
fn kill_children() -> usize {
    // SAFETY: getpid and kill are plain system calls.
    let own_pid = unsafe { libc::getpid() };
    let mut killed = 0;
    for_each_pid(|pid| {
        if let Some((state, parent)) = state_and_parent(pid)
            && parent == own_pid
            && state != b'Z'
            // SAFETY: kill is a plain system call.
            && unsafe { libc::kill(pid, libc::SIGKILL) } == 0
        {
            killed += 1;
        }
    });
    killed
}

/// Calls `visit` with the pid of every process in `/proc`. Async-signal-safe: raw `open`,
/// `getdents64` and `close` over a stack buffer, no allocation, no panicking index.
fn for_each_pid(mut visit: impl FnMut(libc::pid_t)) {
    // SAFETY: plain system calls on buffers owned by this frame.
    unsafe {
        let proc_dir = libc::open(
            c"/proc".as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        );
        if proc_dir < 0 {
            return;
        }
        let mut entries = [0u8; 4096];
        loop {
            let filled = libc::syscall(
                libc::SYS_getdents64,
                proc_dir,
                entries.as_mut_ptr(),
                entries.len(),
            );
            if filled <= 0 {
                break;
            }
            let filled = &entries[..(filled as usize).min(entries.len())];
            let mut offset = 0;
            // Each record: inode (8 bytes), offset (8), record length (2), type (1), name.
            while let Some(record) = filled.get(offset..) {
                let Some(&[low, high]) = record.get(16..18) else {
                    break;
                };
                let length = u16::from_ne_bytes([low, high]) as usize;
                if length == 0 {
                    break;
                }
                if let Some(pid) = record.get(19..length.min(record.len())).and_then(parse_pid) {
                    visit(pid);
                }
                offset += length;
            }
        }
        libc::close(proc_dir);
    }
}

/// The state letter and parent pid of `pid`, from `/proc/<pid>/stat` (`pid (comm) S ppid …`;
/// the command name may hold spaces and parentheses, so the last `)` ends it).
/// Async-signal-safe.
fn state_and_parent(pid: libc::pid_t) -> Option<(u8, libc::pid_t)> {
    let mut path = [0u8; 32];
    proc_path(pid, b"/stat\0", &mut path);
    let mut buffer = [0u8; 512];
    // SAFETY: `path` is NUL-terminated; the descriptor is closed before returning.
    let read = unsafe {
        let file = libc::open(path.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC);
        if file < 0 {
            return None;
        }
        let read = libc::read(file, buffer.as_mut_ptr().cast(), buffer.len());
        libc::close(file);
        read
    };
    let stat = buffer.get(..usize::try_from(read).ok()?)?;
    let after_name = stat.iter().rposition(|&byte| byte == b')')?;
    // ") S 1234 …"
    let rest = stat.get(after_name + 2..)?;
    let state = *rest.first()?;
    let digits = rest.get(2..)?;
    let end = digits.iter().position(|&byte| byte == b' ')?;
    let parent = parse_pid(digits.get(..end)?)?;
    Some((state, parent))
}

/// Writes `/proc/<pid><suffix>` into `path`; `suffix` ends with a NUL.
fn proc_path(pid: libc::pid_t, suffix: &[u8], path: &mut [u8; 32]) {
    const PREFIX: &[u8] = b"/proc/";
    let mut digits = [0u8; 10];
    let mut count = 0;
    let mut rest = pid;
    loop {
        digits[count] = b'0' + (rest % 10) as u8;
        count += 1;
        rest /= 10;
        if rest == 0 || count == digits.len() {
            break;
        }
    }
    for (slot, &byte) in path.iter_mut().zip(
        PREFIX
            .iter()
            .chain(digits[..count].iter().rev())
            .chain(suffix),
    ) {
        *slot = byte;
    }
}

/// The pid a `/proc` entry names (its name up to the first NUL), if it is all digits.
fn parse_pid(name: &[u8]) -> Option<libc::pid_t> {
    let digits = name.split(|&byte| byte == 0).next()?;
    if digits.is_empty() || digits.len() > 9 {
        return None;
    }
    let mut pid: libc::pid_t = 0;
    for &digit in digits {
        if !digit.is_ascii_digit() {
            return None;
        }
        pid = pid * 10 + libc::pid_t::from(digit - b'0');
    }
    Some(pid)
}

/// Whether `/proc/<pid>/environ` holds `marker` as a whole entry, read in chunks: the
/// signal-handler twin of [`crate::procscan::carries_marker`], which allocates.
fn environ_holds(pid: libc::pid_t, marker: &[u8]) -> bool {
    let mut path = [0u8; 32];
    proc_path(pid, b"/environ\0", &mut path);
    // SAFETY: `path` is NUL-terminated; the descriptor is closed before returning.
    unsafe {
        let file = libc::open(path.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC);
        if file < 0 {
            return false;
        }
        let mut matcher = EntryMatcher::new(marker);
        let mut chunk = [0u8; 4096];
        let mut found = false;
        loop {
            let read = libc::read(file, chunk.as_mut_ptr().cast(), chunk.len());
            if read <= 0 {
                found = found || matcher.finish();
                break;
            }
            if chunk[..(read as usize).min(chunk.len())]
                .iter()
                .any(|&byte| matcher.feed(byte))
            {
                found = true;
                break;
            }
        }
        libc::close(file);
        found
    }
}

/// Finds `marker` as a whole NUL-separated entry in a stream of bytes, one byte at a time.
struct EntryMatcher<'a> {
    marker: &'a [u8],
    matched: usize,
    /// Whether the entry read so far is still a prefix of the marker.
    matching: bool,
}

impl<'a> EntryMatcher<'a> {
    fn new(marker: &'a [u8]) -> Self {
        EntryMatcher {
            marker,
            matched: 0,
            matching: true,
        }
    }

    /// Takes the next byte; true when it ends an entry equal to the marker.
    fn feed(&mut self, byte: u8) -> bool {
        if byte == 0 {
            let found = self.finish();
            self.matched = 0;
            self.matching = true;
            return found;
        }
        if self.matching && self.marker.get(self.matched) == Some(&byte) {
            self.matched += 1;
        } else {
            self.matching = false;
        }
        false
    }

    /// Whether the entry read so far (at the end of the stream) equals the marker.
    fn finish(&self) -> bool {
        self.matching && !self.marker.is_empty() && self.matched == self.marker.len()
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
                    // An asker gone before the answer leaves the child to its death signal: it
                    // dies with this thread, when the host does.
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

#[cfg(test)]
mod tests {
    use std::process::Command;

    use super::{EntryMatcher, environ_holds, parse_pid, sweep_marked};

    fn holds(stream: &[u8], marker: &str) -> bool {
        let mut matcher = EntryMatcher::new(marker.as_bytes());
        stream.iter().any(|&byte| matcher.feed(byte)) || matcher.finish()
    }

    #[test]
    fn only_a_whole_entry_matches() {
        let marker = "CREW_AGENT_ID=r1:api";
        assert!(holds(b"A=1\0CREW_AGENT_ID=r1:api\0B=2\0", marker));
        assert!(holds(b"CREW_AGENT_ID=r1:api", marker));
        assert!(!holds(b"CREW_AGENT_ID=r1:api2\0", marker));
        assert!(!holds(b"XCREW_AGENT_ID=r1:api\0", marker));
        assert!(!holds(b"CREW_AGENT_ID=r1:ap\0", marker));
        assert!(!holds(b"", marker));
        assert!(!holds(b"\0\0", ""));
    }

    #[test]
    fn proc_names_that_are_pids() {
        assert_eq!(parse_pid(b"1234\0\0\0"), Some(1234));
        assert_eq!(parse_pid(b"self\0"), None);
        assert_eq!(parse_pid(b"\0"), None);
        assert_eq!(parse_pid(b"12a\0"), None);
    }

    #[test]
    fn a_sweep_kills_the_marked_process_and_no_other() {
        let marker = format!("CREW_AGENT_ID={}:sweep", std::process::id());
        let other_marker = format!("CREW_AGENT_ID={}:sweep-other", std::process::id());
        let spawn = |marker: &str| {
            let (name, value) = marker.split_once('=').unwrap();
            let child = Command::new("sleep")
                .arg("30")
                .env(name, value)
                .spawn()
                .unwrap();
            // `spawn` may return while the kernel is still setting up the new program's
            // environment (a vfork parent wakes up early in exec): wait until it shows.
            let started = std::time::Instant::now();
            while !environ_holds(child.id() as libc::pid_t, marker.as_bytes()) {
                assert!(started.elapsed() < std::time::Duration::from_secs(10));
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            child
        };
        let mut marked = spawn(&marker);
        let mut other = spawn(&other_marker);
        assert!(!environ_holds(other.id() as libc::pid_t, marker.as_bytes()));
        assert_eq!(sweep_marked(marker.as_bytes()), 1);
        let status = marked.wait().unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(9)
        );
        assert!(other.try_wait().unwrap().is_none());
        other.kill().unwrap();
        other.wait().unwrap();
    }
}
