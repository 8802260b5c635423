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
//! The warden is the host's own executable started again (`/proc/self/exe`, with
//! `posix_spawn`), not a fork of the host: a fork would share the host's memory copy-on-write
//! for as long as the agent lives, and the host, which keeps writing its memory, would pay a
//! page fault and a copy for each page it touched after every start. Started again, the warden
//! is caught before `main` by a function this crate places in the executable's initializers
//! (`WARDEN_ENTRY`, in `warden.rs`): any program that embeds crew-live can start agents, and none of them
//! runs its `main` as a warden. Until it execs the agent, the warden runs with nothing of
//! Rust's runtime set up: it makes raw `libc` calls, allocates nothing and never returns.
//!
//! The warden's parent-death signal fires when the *thread* that started it dies, so every
//! start happens on a dedicated spawner thread that lives as long as the
//! [`crate::AgentHost`]: tokio's blocking threads come and go and would kill agents with them.
//! There are two: confined agents start from one that closed the kernel's keyrings to itself
//! (see [`Spawner`]), the others from one that did not.
#![allow(unsafe_code)]

use std::ffi::{CStr, OsStr};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::OnceLock;
use std::sync::mpsc;

use tokio::process::{Child, Command};
use tokio::sync::oneshot;

mod warden;

pub(crate) use warden::decimal;
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

/// An agent's command, to be started under a warden by a [`Spawner`]: the agent's program,
/// arguments and whole environment, given to [`WardedCommand::new`], then its directory and
/// stdio.
#[derive(Debug)]
pub struct WardedCommand {
    command: Command,
    /// The descriptors the warden inherits, open until it started: the write end of its report
    /// pipe, the agent's environment, and its ruleset, namespace plan, user namespace and
    /// channel, if any. Their numbers are in its arguments.
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

/// An agent its warden started.
#[derive(Debug)]
pub struct Spawned {
    /// The warden's process.
    pub child: Child,
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
        let mut ends = [0 as libc::c_int; 2];
        // SAFETY: pipe2 fills the two descriptors, owned right below.
        if unsafe { libc::pipe2(ends.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: both ends were just opened and are owned by nothing else.
        let (report, report_writer) =
            unsafe { (OwnedFd::from_raw_fd(ends[0]), OwnedFd::from_raw_fd(ends[1])) };
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
            let mut ends = [0 as libc::c_int; 2];
            // SAFETY: socketpair fills the two descriptors, owned right below.
            if unsafe {
                libc::socketpair(
                    libc::AF_UNIX,
                    libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
                    0,
                    ends.as_mut_ptr(),
                )
            } != 0
            {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: both ends were just opened and are owned by nothing else.
            let (host, agent) =
                unsafe { (OwnedFd::from_raw_fd(ends[0]), OwnedFd::from_raw_fd(ends[1])) };
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
        let mut command = Command::new("/proc/self/exe");
        command
            .arg0(crate::procscan::WARDEN_NAME)
            .arg(OsStr::from_bytes(WARDEN_ARG.to_bytes()))
            .arg(std::process::id().to_string())
            .arg(
                ruleset
                    .as_ref()
                    .map_or_else(|| "-".to_owned(), |fd| fd.as_raw_fd().to_string()),
            )
            .arg(report_writer.as_raw_fd().to_string())
            .arg(environment.as_raw_fd().to_string())
            .arg(
                namespace
                    .as_ref()
                    .map_or_else(|| "-".to_owned(), |fd| fd.as_raw_fd().to_string()),
            )
            .arg(
                user.as_ref()
                    .map_or_else(|| "-".to_owned(), |fd| fd.as_raw_fd().to_string()),
            )
            .arg(
                channel
                    .as_ref()
                    .map_or_else(|| "-".to_owned(), |fd| fd.as_raw_fd().to_string()),
            )
            .arg(marker)
            .arg(
                crate::open_files::users_limit()
                    .map_or_else(|| "-".to_owned(), |limit| limit.to_string()),
            )
            .arg(program)
            .args(args)
            .env_clear()
            .process_group(0)
            .kill_on_drop(false);
        let confined = ruleset.is_some();
        let mut passed = vec![report_writer, environment];
        passed.extend(ruleset);
        passed.extend(namespace);
        passed.extend(user);
        passed.extend(channel);
        Ok(WardedCommand {
            command,
            passed,
            report,
            channel: host_end,
            proxy,
            own_connection,
            confined,
        })
    }

    /// The agent's working directory.
    pub fn current_dir(&mut self, dir: impl AsRef<std::path::Path>) -> &mut Self {
        self.command.current_dir(dir);
        self
    }

    /// The agent's stdin, stdout and stderr.
    pub fn stdio(
        &mut self,
        stdin: impl Into<std::process::Stdio>,
        stdout: impl Into<std::process::Stdio>,
        stderr: impl Into<std::process::Stdio>,
    ) -> &mut Self {
        self.command.stdin(stdin).stdout(stdout).stderr(stderr);
        self
    }

    /// Starts the warden and waits until it started the agent: the agent's own error when it
    /// could not be executed. Runs on the spawner thread, the warden's parent.
    fn start(self) -> io::Result<Spawned> {
        let WardedCommand {
            mut command,
            passed,
            report,
            channel,
            proxy,
            own_connection,
            confined: _,
        } = self;
        for fd in &passed {
            // Kept by no other warden: a warden (of any host, from either spawner thread)
            // closes whatever it did not ask for before it starts its agent. A program
            // another thread starts meanwhile (git, a setup command) inherits them until it
            // exits: a ruleset, a pipe, and an environment made of the host's own.
            // SAFETY: clears the close-on-exec flag of a descriptor `passed` owns.
            if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, 0) } != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        let child = command.spawn();
        // The host's copies: the report pipe ends when the warden's copy does.
        drop(passed);
        let child = child?;
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
            // The warden exits at once; tokio reaps it.
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
                    while let Ok(job) = queue.recv() {
                        let started = match &closed {
                            Ok(()) => job.command.start(),
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
mod tests {
    use super::*;
    use crate::sandbox::{Hidden, Namespace, namespaces_work};

    /// An agent whose namespace cannot be entered (here: a place to cover that is not there)
    /// is refused with the step that failed, not as a program that cannot be run (`sh` is
    /// there: an `ENOENT` of a mount is not one of `PATH`).
    #[tokio::test]
    async fn a_start_its_sandbox_refused_names_the_step() {
        if !namespaces_work() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let missing = camino::Utf8PathBuf::from_path_buf(dir.path().join("absent")).unwrap();
        let namespace = Namespace {
            hidden: vec![Hidden::Directory(missing)],
            ..Namespace::default()
        };
        let marker = "CREW_AGENT_ID=r:t";
        let command = WardedCommand::new(
            "sh",
            ["-c", "true"],
            [("PATH", "/usr/bin:/bin"), ("CREW_AGENT_ID", "r:t")],
            marker,
            None,
            Some(&namespace),
            None,
        )
        .unwrap();
        let Err(error) = command.start() else {
            panic!("the agent started");
        };
        let said = error.to_string();
        assert!(
            said.contains("while entering its namespaces") && said.contains("No such file"),
            "{said}"
        );
    }
}
