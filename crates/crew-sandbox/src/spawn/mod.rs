//! Starting agent processes so that they can never outlive their host.
//!
//! Every agent gets a small **warden**: a process of its own that the host starts, leader of a
//! new process group, which asks the kernel for a signal when its parent thread dies
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
//! The warden is not a fork of the host: a fork would share the host's memory copy-on-write
//! for as long as the agent lives, and the host, which keeps writing its memory, would pay a
//! page fault and a copy for each page it touched after every start. Nor is it the host's
//! executable started again for each agent (as it was): the kernel's exec, the loader and the
//! C library's start cost about half a millisecond of CPU at every start, and the exit of a
//! process that mapped the whole executable as much again. Each spawner thread starts, once, a
//! **warden server** (`warden/server.rs`): the host's own executable again
//! (`/proc/self/exe`), caught before `main` by a function this crate places in the
//! executable's initializers (`WARDEN_ENTRY`, in `warden/mod.rs`), so that any program that
//! embeds crew-live can start agents and none of them runs its `main` as a server or a
//! warden. The server forks each warden with `CLONE_PARENT`: the warden is the host's child,
//! its parent the spawner thread, as if the host had started it. Until it execs the agent,
//! the warden runs with nothing of Rust's runtime set up: it makes raw `libc` calls, allocates
//! nothing through the C library and never returns.
//!
//! The warden's parent-death signal fires when the *thread* that started it dies, so every
//! start happens on a dedicated spawner thread that lives as long as the
//! crew-live's `AgentHost`: tokio's blocking threads come and go and would kill agents with them.
//! There are two: confined agents start from one that closed the kernel's keyrings to itself
//! (see [`Spawner`]), the others from one that did not.
#![allow(unsafe_code)]

use std::ffi::{CStr, OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::sync::mpsc;

use tokio::sync::oneshot;

mod process;
mod warden;

pub use process::{AgentInput, AgentOutput, Warden};
pub use warden::decimal;
use warden::server::{
    ARGUMENTS_FD, Descriptors, MAX_PASSED, REPORT_FD, SERVER_ARG, SERVER_NAME, TITLE_ROOM,
    rights_len,
};
use warden::{WARDEN_ARG, WARDEN_ENTRY};

/// How many processes the agent left behind, which its warden writes on its report pipe when
/// the agent exited (read once the warden exited).
#[derive(Debug)]
pub struct LeftoverCount {
    report: OwnedFd,
    read: OnceLock<u32>,
}

impl LeftoverCount {
    /// How many processes the warden killed after the agent exited: 0 until the warden said.
    pub fn get(&self) -> u32 {
        if let Some(count) = self.read.get() {
            return *count;
        }
        match read_u32(&self.report, false) {
            Some(count) => *self.read.get_or_init(|| count),
            None => 0,
        }
    }
}

/// Reads one native-endian `u32` from `pipe`; `None` at its end, on a short read, or (not
/// `blocking`) when nothing was written yet.
fn read_u32(pipe: &OwnedFd, blocking: bool) -> Option<u32> {
    let mut bytes = [0u8; 4];
    if !blocking {
        let mut poll = libc::pollfd {
            fd: pipe.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd on the stack, no wait.
        if unsafe { libc::poll(&mut poll, 1, 0) } != 1 || poll.revents & libc::POLLIN == 0 {
            return None;
        }
    }
    loop {
        // SAFETY: reads into a buffer of this frame from a descriptor `pipe` owns.
        let read = unsafe { libc::read(pipe.as_raw_fd(), bytes.as_mut_ptr().cast(), 4) };
        if read == 4 {
            return Some(u32::from_ne_bytes(bytes));
        }
        if read < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
            continue;
        }
        return None;
    }
}

/// Where one of an agent's standard streams goes.
#[derive(Debug)]
pub enum AgentIo {
    /// `/dev/null`.
    Null,
    /// A pipe whose other end the host gets ([`Warden`]'s `stdin`, `stdout`, `stderr`).
    Piped,
    /// This file or descriptor.
    Fd(OwnedFd),
}

impl From<std::fs::File> for AgentIo {
    fn from(file: std::fs::File) -> Self {
        AgentIo::Fd(file.into())
    }
}

/// The number a warden's first passed descriptor takes (its report pipe), after its stdio and
/// its arguments' file; the others follow in their order.
const FIRST_PASSED_FD: libc::c_int = REPORT_FD;

/// Which of the warden's arguments names its cgroup's files.
const CGROUP_ARG: usize = 11;

/// An agent's command, to be started under a warden by a [`Spawner`]: the agent's program,
/// arguments and whole environment, given to [`WardedCommand::new`], then its directory and
/// stdio.
#[derive(Debug)]
pub struct WardedCommand {
    /// The warden's arguments, its name first: the numbers of its descriptors in them are the
    /// ones it gets (from [`FIRST_PASSED_FD`] on, in the order of `passed`).
    args: Vec<OsString>,
    /// The agent's working directory; the host's when not given.
    dir: Option<WorkingDir>,
    /// The agent's stdin, stdout and stderr.
    stdio: [AgentIo; 3],
    /// The descriptors the warden gets, open until it started: the write end of its report
    /// pipe, the agent's environment, and its ruleset, namespace plan, user namespace and
    /// channel, if any.
    passed: Vec<OwnedFd>,
    /// The read end of the report pipe: first whether the agent started (0, or the error of
    /// its exec), then how many processes it left behind.
    report: OwnedFd,
    /// The host's end of the unix socket the agent's process sends its listening sockets on:
    /// its proxy's (`network = "proxy"`), then its own connection's.
    channel: Option<OwnedFd>,
    /// With `network = "proxy"`, what the proxy lets through.
    proxy: Option<crate::proxy::Rules>,
    /// The agent's process listens on a connection of its own and sends it over the channel.
    own_connection: bool,
    /// It has a ruleset: it starts from the confined agents' spawner thread.
    confined: bool,
}

/// Where an agent works: a path, opened when it starts, or a directory already held open.
#[derive(Debug)]
enum WorkingDir {
    Path(PathBuf),
    Handle(OwnedFd),
}

/// An agent its warden started.
#[derive(Debug)]
pub struct Spawned {
    /// The warden's process.
    pub child: Warden,
    /// What the warden will say of the agent's leftovers.
    pub leftovers: LeftoverCount,
    /// With `network = "proxy"`, the agent's proxy, serving until dropped: keep it as long as
    /// the agent lives.
    pub proxy: Option<crate::proxy::Proxy>,
    /// The listening socket of the agent's own connection to its host, when it has one (see
    /// [`crate::sandbox::Namespace::control`]).
    pub own_connection: Option<std::os::unix::net::UnixListener>,
}

impl WardedCommand {
    /// `program` with `args` and nothing but `env` in its environment, under a warden, in a
    /// process group of its own. `marker` is the entry of `env` that marks the agent
    /// (`CREW_AGENT_ID=<id>`): on host death, the warden kills every process holding it,
    /// inside the group or not.
    ///
    /// The warden itself starts with an empty environment and hands `env` to the agent only:
    /// a variable such as `LD_LIBRARY_PATH` could otherwise make the dynamic loader of the
    /// unconfined warden load a library the agent planted in its workspace.
    ///
    /// The warden is a child subreaper: whatever the agent starts and leaves behind (daemons
    /// that left its group and session, even ones that cleared their environment) is
    /// re-parented to the warden, which kills it when the agent exits and counts it in the
    /// [`LeftoverCount`] the spawner returns.
    ///
    /// With a `ruleset` (a Landlock ruleset built by [`crate::sandbox`]), the agent restricts
    /// itself with it right before exec: the agent and everything it starts are confined, the
    /// warden is not. With a `namespace` that asks for a proxy, `proxy` says what it lets
    /// through (see [`crate::proxy`]); a namespace that asks for one without rules is refused.
    pub fn new(
        program: impl AsRef<OsStr>,
        args: impl IntoIterator<Item = impl AsRef<OsStr>>,
        env: impl IntoIterator<Item = (impl AsRef<OsStr>, impl AsRef<OsStr>)>,
        marker: &str,
        ruleset: Option<OwnedFd>,
        namespace: Option<&crate::sandbox::Namespace>,
        proxy: Option<crate::proxy::Rules>,
    ) -> io::Result<Self> {
        // Keeps the initializer in the executable (see the module's documentation).
        std::hint::black_box(&WARDEN_ENTRY);
        if marker.contains('\0') {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "an agent marker cannot hold a NUL byte",
            ));
        }
        let (report, report_writer) = pipe()?;
        let environment = environment_file(env)?;
        let proxied = namespace.is_some_and(|namespace| namespace.proxy);
        if proxied && proxy.is_none() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "an agent with a proxy of its own needs the proxy's rules",
            ));
        }
        let proxy = proxy.filter(|_| proxied);
        let own_connection = namespace.is_some_and(|namespace| namespace.control.is_some());
        let (host_end, channel) = if proxied || own_connection {
            let (host, agent) = socket_pair(libc::SOCK_DGRAM)?;
            (Some(host), Some(agent))
        } else {
            (None, None)
        };
        // The user namespace the agent's process joins: its host's, made once (see
        // `crate::sandbox::shared_user_namespace`), a copy of whose descriptor the warden
        // gets.
        let user = match namespace.and_then(|_| crate::sandbox::shared_user_namespace()) {
            Some(shared) => Some(shared.try_clone_to_owned()?),
            None => None,
        };
        let namespace = match namespace {
            Some(namespace) => Some(memory_file(c"crew-namespace", &namespace.encode()?)?),
            None => None,
        };
        // Each passed descriptor's number in the warden, in the order of `passed`.
        let mut next = FIRST_PASSED_FD;
        let mut number = |present: bool| -> OsString {
            if !present {
                return "-".into();
            }
            next += 1;
            (next - 1).to_string().into()
        };
        let report_number = number(true);
        let environment_number = number(true);
        let ruleset_number = number(ruleset.is_some());
        let namespace_number = number(namespace.is_some());
        let user_number = number(user.is_some());
        let channel_number = number(channel.is_some());
        let mut warden_args: Vec<OsString> = vec![
            crate::procscan::WARDEN_NAME.into(),
            OsStr::from_bytes(WARDEN_ARG.to_bytes()).to_owned(),
            std::process::id().to_string().into(),
            ruleset_number,
            report_number,
            environment_number,
            namespace_number,
            user_number,
            channel_number,
            marker.into(),
            crate::open_files::users_limit()
                .map_or_else(|| "-".to_owned(), |limit| limit.to_string())
                .into(),
            // Its cgroup's files, given by `caps`.
            "-".into(),
            program.as_ref().to_owned(),
        ];
        warden_args.extend(args.into_iter().map(|arg| arg.as_ref().to_owned()));
        if warden_args.iter().any(|arg| arg.as_bytes().contains(&0)) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "an agent's program or argument cannot hold a NUL byte",
            ));
        }
        let confined = ruleset.is_some();
        let mut passed = vec![report_writer, environment];
        passed.extend(ruleset);
        passed.extend(namespace);
        passed.extend(user);
        passed.extend(channel);
        Ok(WardedCommand {
            args: warden_args,
            dir: None,
            stdio: [AgentIo::Null, AgentIo::Null, AgentIo::Null],
            passed,
            report,
            channel: host_end,
            proxy,
            own_connection,
            confined,
        })
    }

    /// The agent joins the cgroup of its caps before anything else, by the `cgroup.procs`
    /// files `procs` (see [`crate::caps::AgentGroup::procs`]); its warden stays out of it.
    pub fn caps(&mut self, procs: Vec<OwnedFd>) -> io::Result<&mut Self> {
        if procs.is_empty() || procs.len() > warden::MAX_CGROUP_FILES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "an agent's cgroup has one to four files to join",
            ));
        }
        let first = FIRST_PASSED_FD + self.passed.len() as libc::c_int;
        self.args[CGROUP_ARG] = format!("{first},{}", procs.len()).into();
        self.passed.extend(procs);
        Ok(self)
    }

    /// The agent's working directory, by path: opened (following links, as `chdir` would)
    /// when the agent starts, and entered by that handle.
    pub fn current_dir(&mut self, dir: impl AsRef<std::path::Path>) -> &mut Self {
        self.dir = Some(WorkingDir::Path(dir.as_ref().to_owned()));
        self
    }

    /// The agent's working directory, held open (an `O_PATH` handle will do): the warden
    /// enters that very directory, whatever its path names by then.
    pub fn current_dir_handle(&mut self, dir: OwnedFd) -> &mut Self {
        self.dir = Some(WorkingDir::Handle(dir));
        self
    }

    /// The agent's stdin, stdout and stderr (`/dev/null` each unless given).
    pub fn stdio(
        &mut self,
        stdin: impl Into<AgentIo>,
        stdout: impl Into<AgentIo>,
        stderr: impl Into<AgentIo>,
    ) -> &mut Self {
        self.stdio = [stdin.into(), stdout.into(), stderr.into()];
        self
    }

    /// Starts the warden and waits until it started the agent: the agent's own error when it
    /// could not be executed. Runs on the spawner thread, the warden's parent.
    fn start(self, server: &mut Option<Server>) -> io::Result<Spawned> {
        let WardedCommand {
            args,
            dir,
            stdio,
            passed,
            report,
            channel,
            proxy,
            own_connection,
            confined: _,
        } = self;
        // The warden's ends of its stdio, and the host's of the pipes.
        let [stdin, stdout, stderr] = stdio;
        let (stdin, input) = stdio_ends(stdin, true)?;
        let (stdout, output) = stdio_ends(stdout, false)?;
        let (stderr, errors) = stdio_ends(stderr, false)?;
        // Its directory goes as a handle, the last passed descriptor, whose number comes first
        // in the arguments' file: the warden enters it with `fchdir`, never by a path.
        let mut passed = passed;
        let mut arguments = Vec::new();
        if let Some(dir) = dir {
            let handle = match dir {
                WorkingDir::Handle(handle) => handle,
                WorkingDir::Path(path) => rustix::fs::open(
                    &path,
                    rustix::fs::OFlags::PATH
                        | rustix::fs::OFlags::DIRECTORY
                        | rustix::fs::OFlags::CLOEXEC,
                    rustix::fs::Mode::empty(),
                )?,
            };
            let number = FIRST_PASSED_FD as usize + passed.len();
            arguments.extend_from_slice(number.to_string().as_bytes());
            passed.push(handle);
        }
        arguments.push(0);
        for arg in &args {
            arguments.extend_from_slice(arg.as_bytes());
            arguments.push(0);
        }
        let arguments = memory_file(c"crew-warden-args", &arguments)?;
        let kept = [stdin, stdout, stderr, arguments];
        // The report's writer comes first of the passed ones.
        let mut passed = passed.into_iter();
        let mut report_writer = passed.next();
        let passed: Vec<OwnedFd> = passed.collect();
        let mut report = report;
        let mut attempt = 0;
        // First the warden's pid, from the warden itself (or the server's error).
        let pid = loop {
            attempt += 1;
            let writer = match report_writer.take() {
                Some(writer) => writer,
                None => {
                    let (reader, writer) = pipe()?;
                    report = reader;
                    writer
                }
            };
            let sent: Vec<BorrowedFd> = kept
                .iter()
                .chain([&writer])
                .chain(&passed)
                .map(AsFd::as_fd)
                .collect();
            request_warden(server, &sent)?;
            // The host's copy: the report pipe ends when the warden's (and the server's) do.
            drop(writer);
            match read_u32(&report, true).map(|word| word as i32) {
                Some(pid) if pid > 0 => break pid,
                Some(error) => return Err(io::Error::from_raw_os_error(-error)),
                // Taken by a server that was killed before it forked (the socket takes a
                // request before its reader is gone): no warden said its pid, so none runs
                // (one killed between its fork and its first word is dead, left unreaped
                // until the host ends); once more with a new server and a new report pipe.
                None if attempt == 1 => *server = None,
                None => {
                    return Err(io::Error::other(
                        "the warden server ended before it started the agent's warden",
                    ));
                }
            }
        };
        // The host's copies of the warden's descriptors.
        drop((kept, passed));
        let child = Warden::new(pid, input, output, errors).inspect_err(|_| {
            // Not to be left running unwatched: it leads its group, with its agent.
            // SAFETY: no memory argument; `pid` is this process's child, not reaped.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
        })?;
        match read_u32(&report, true) {
            Some(0) => {
                // Sent before the agent's exec, which the report follows: the proxy's socket,
                // then its own connection's.
                let received = |what: &str| {
                    channel
                        .as_ref()
                        .and_then(crate::sandbox::receive_descriptor)
                        .ok_or_else(|| {
                            io::Error::other(format!(
                                "the agent's process did not hand over its {what}"
                            ))
                        })
                };
                let proxy = match proxy {
                    None => None,
                    Some(rules) => Some(crate::proxy::Proxy::start(
                        std::net::TcpListener::from(received("proxy's socket")?),
                        rules,
                    )?),
                };
                let own_connection = match own_connection {
                    false => None,
                    true => Some(std::os::unix::net::UnixListener::from(received(
                        "own connection's socket",
                    )?)),
                };
                Ok(Spawned {
                    child,
                    leftovers: LeftoverCount {
                        report,
                        read: OnceLock::new(),
                    },
                    proxy,
                    own_connection,
                })
            }
            // The warden exits at once.
            Some(error) => Err(match warden::ConfineStep::split(error) {
                (None, errno) => io::Error::from_raw_os_error(errno),
                (Some(step), errno) => io::Error::other(format!(
                    "its sandbox failed it while {step}: {} (`crew sandbox check` tries the sandbox on this machine; `[sandbox] mode = \"off\"` runs an agent unconfined)",
                    io::Error::from_raw_os_error(errno)
                )),
            }),
            None => Err(io::Error::other(
                "the agent's warden ended before it started the agent",
            )),
        }
    }
}

/// The warden's end of one of its agent's streams, and the host's end when it is a pipe
/// (`stdin`: the host writes).
fn stdio_ends(io: AgentIo, stdin: bool) -> io::Result<(OwnedFd, Option<OwnedFd>)> {
    match io {
        AgentIo::Fd(fd) => Ok((fd, None)),
        AgentIo::Null => Ok((
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/null")?
                .into(),
            None,
        )),
        AgentIo::Piped => {
            let (read, write) = pipe()?;
            Ok(if stdin {
                (read, Some(write))
            } else {
                (write, Some(read))
            })
        }
    }
}

/// A connected pair of unix sockets of `kind`, close-on-exec.
fn socket_pair(kind: libc::c_int) -> io::Result<(OwnedFd, OwnedFd)> {
    let mut ends = [0 as libc::c_int; 2];
    let kind = kind | libc::SOCK_CLOEXEC;
    // SAFETY: socketpair fills the two descriptors, owned right below.
    if unsafe { libc::socketpair(libc::AF_UNIX, kind, 0, ends.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both ends were just opened and are owned by nothing else.
    Ok(unsafe { (OwnedFd::from_raw_fd(ends[0]), OwnedFd::from_raw_fd(ends[1])) })
}

/// A pipe, close-on-exec: its read end, then its write end.
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut ends = [0 as libc::c_int; 2];
    // SAFETY: pipe2 fills the two descriptors, owned right below.
    if unsafe { libc::pipe2(ends.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both ends were just opened and are owned by nothing else.
    Ok(unsafe { (OwnedFd::from_raw_fd(ends[0]), OwnedFd::from_raw_fd(ends[1])) })
}

/// A spawner thread's warden server (see `warden/server.rs`): the process, and the host's
/// end of its socket.
struct Server {
    socket: OwnedFd,
    process: std::process::Child,
}

impl Server {
    /// Starts a server from the calling thread, the parent of every warden it will fork.
    fn start() -> io::Result<Server> {
        let (socket, theirs) = socket_pair(libc::SOCK_SEQPACKET)?;
        // Inherited by the server, which closes everything else it was given; a program
        // another thread starts meanwhile holds it only until it exits (the host's copy is
        // closed once the server started).
        // SAFETY: clears the close-on-exec flag of a descriptor `theirs` owns.
        if unsafe { libc::fcntl(theirs.as_raw_fd(), libc::F_SETFD, 0) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let process = std::process::Command::new("/proc/self/exe")
            .arg0(OsStr::from_bytes(SERVER_NAME.to_bytes()))
            .arg(OsStr::from_bytes(SERVER_ARG.to_bytes()))
            .arg(std::process::id().to_string())
            .arg(theirs.as_raw_fd().to_string())
            .arg(" ".repeat(TITLE_ROOM))
            .env_clear()
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            // Not in the host's group: a Ctrl-C at the user's terminal is the host's to answer.
            .process_group(0)
            .spawn();
        drop(theirs);
        Ok(Server {
            socket,
            process: process?,
        })
    }

    /// Asks the server for a warden holding `fds` (stdio, arguments, then the passed ones,
    /// each at its number). `false` when the server is gone: nothing was sent.
    fn fork(&self, fds: &[BorrowedFd]) -> bool {
        let mut targets: Vec<u8> = (0..fds.len())
            .map(|index| {
                if index <= ARGUMENTS_FD as usize {
                    index as u8
                } else {
                    (FIRST_PASSED_FD as usize + index - ARGUMENTS_FD as usize - 1) as u8
                }
            })
            .collect();
        let mut control = Descriptors {
            header: libc::cmsghdr {
                cmsg_len: rights_len(fds.len()) as _,
                cmsg_level: libc::SOL_SOCKET,
                cmsg_type: libc::SCM_RIGHTS,
            },
            fds: [-1; MAX_PASSED],
        };
        for (slot, fd) in control.fds.iter_mut().zip(fds) {
            *slot = fd.as_raw_fd();
        }
        let mut data = libc::iovec {
            iov_base: targets.as_mut_ptr().cast(),
            iov_len: targets.len(),
        };
        // SAFETY: all-zero is a valid message header, filled right below.
        let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
        message.msg_iov = &mut data;
        message.msg_iovlen = 1;
        message.msg_control = (&mut control as *mut Descriptors).cast();
        message.msg_controllen = rights_len(fds.len()) as _;
        loop {
            // SAFETY: the message's buffers are this frame's, alive and sized as it says.
            let sent =
                unsafe { libc::sendmsg(self.socket.as_raw_fd(), &message, libc::MSG_NOSIGNAL) };
            if sent < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return sent == targets.len() as isize;
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // It ends when its socket does; reaped here, not left a zombie.
        // SAFETY: shuts down the socket this server owns; closed when dropped.
        unsafe { libc::shutdown(self.socket.as_raw_fd(), libc::SHUT_RDWR) };
        // The server dies with its socket; this only reaps it.
        let _ = self.process.wait();
    }
}

/// Sends `fds` to this thread's server (started, or started again when it is gone) for a
/// warden to hold.
fn request_warden(server: &mut Option<Server>, fds: &[BorrowedFd]) -> io::Result<()> {
    if fds.len() > MAX_PASSED {
        return Err(io::Error::other("too many descriptors for a warden"));
    }
    for _ in 0..2 {
        let current = match server {
            Some(current) => current,
            None => server.insert(Server::start()?),
        };
        if current.fork(fds) {
            return Ok(());
        }
        // Gone before it got them (killed, say): once more with a new one.
        *server = None;
    }
    Err(io::Error::other("the warden server could not be reached"))
}

/// A memory file holding `env` as `NAME=value` entries, each ended by a NUL: the agent's
/// environment, which its warden maps and hands to the agent's exec.
fn environment_file(
    env: impl IntoIterator<Item = (impl AsRef<OsStr>, impl AsRef<OsStr>)>,
) -> io::Result<OwnedFd> {
    // One entry per name, the later given winning, sorted as std's own commands do.
    let env: std::collections::BTreeMap<_, _> = env
        .into_iter()
        .map(|(name, value)| (name.as_ref().to_owned(), value.as_ref().to_owned()))
        .collect();
    let mut entries = Vec::new();
    for (name, value) in &env {
        let (name, value) = (name.as_bytes(), value.as_bytes());
        if name.is_empty() || name.contains(&b'=') || name.contains(&0) || value.contains(&0) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "`{}` cannot be an environment variable of an agent",
                    String::from_utf8_lossy(name)
                ),
            ));
        }
        entries.extend_from_slice(name);
        entries.push(b'=');
        entries.extend_from_slice(value);
        entries.push(0);
    }
    memory_file(c"crew-agent-env", &entries)
}

/// A memory file named `name` holding `contents`, for a warden to map.
fn memory_file(name: &CStr, contents: &[u8]) -> io::Result<OwnedFd> {
    // SAFETY: memfd_create with a NUL-terminated name; the descriptor is owned right below.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: just opened, owned by nothing else.
    let file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    std::io::Write::write_all(&mut &file, contents)?;
    Ok(file.into())
}

struct SpawnJob {
    command: WardedCommand,
    reply: oneshot::Sender<io::Result<Spawned>>,
}

/// The threads every agent's warden is started from: one for confined agents, one for the
/// others. They live until the last [`Spawner`] is dropped; when one ends, the kernel signals
/// every warden it started.
///
/// The confined agents' thread closes the kernel's keyrings to itself once, as it starts
/// (see `crate::sandbox::close_keyrings`): every warden it starts, and every agent and process
/// of theirs, inherits that. Installed at each start instead, the filter cost 40 to 100 µs of
/// every start here (the kernel compiles it each time).
#[derive(Debug, Clone)]
pub struct Spawner {
    jobs: mpsc::Sender<SpawnJob>,
    confined_jobs: mpsc::Sender<SpawnJob>,
}

impl std::fmt::Debug for SpawnJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpawnJob").finish_non_exhaustive()
    }
}

impl Spawner {
    /// Starts the spawner threads inside the runtime of `handle`.
    pub fn start(handle: tokio::runtime::Handle) -> io::Result<Self> {
        let thread = |name: &str, confined: bool| -> io::Result<mpsc::Sender<SpawnJob>> {
            let (jobs, queue) = mpsc::channel::<SpawnJob>();
            let handle = handle.clone();
            std::thread::Builder::new()
                .name(name.to_owned())
                .spawn(move || {
                    let _runtime = handle.enter();
                    // Refused by the kernel, no confined agent starts: each is told why.
                    let closed = if confined {
                        crate::sandbox::close_keyrings().map_err(|error| error.to_string())
                    } else {
                        Ok(())
                    };
                    // Started at the first agent's start, from this thread.
                    let mut server = None;
                    while let Ok(job) = queue.recv() {
                        let started = match &closed {
                            Ok(()) => job.command.start(&mut server),
                            Err(error) => Err(io::Error::other(format!(
                                "the kernel refused the seccomp filter that closes its keyrings to a confined agent ({error}): run the agent with `[sandbox] mode = \"off\"`, or crew on a kernel with seccomp filters"
                            ))),
                        };
                        // An asker gone before the answer leaves the child to its death
                        // signal: it dies with this thread, when the host does.
                        let _ = job.reply.send(started);
                    }
                })?;
            Ok(jobs)
        };
        Ok(Spawner {
            jobs: thread("crew-spawner", false)?,
            confined_jobs: thread("crew-spawner-confined", true)?,
        })
    }

    /// Starts `command`'s warden from a spawner thread (the confined agents' one when it has
    /// a ruleset), once its agent started: the warden process, and what it will say of the
    /// agent's leftovers.
    pub async fn spawn(&self, command: WardedCommand) -> io::Result<Spawned> {
        let (reply, answer) = oneshot::channel();
        let jobs = if command.confined {
            &self.confined_jobs
        } else {
            &self.jobs
        };
        jobs.send(SpawnJob { command, reply })
            .map_err(|_| io::Error::other("the spawner thread has stopped"))?;
        answer
            .await
            .map_err(|_| io::Error::other("the spawner thread has stopped"))?
    }
}

#[cfg(test)]
mod tests;
