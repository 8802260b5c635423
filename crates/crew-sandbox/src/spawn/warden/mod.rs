//! The warden: what a process forked by the warden server (`server.rs`) becomes, with its
//! arguments as the server's memory file gives them, or a start of the executable before
//! `main` when its first argument is [`WARDEN_ARG`] (see the module above for why it exists). From its entry to the agent's
//! exec, or to its own end, it runs with nothing of Rust's runtime set up: raw `libc` calls,
//! no allocation, never a return into `main`.
//!
//! Its soundness rests on what runs before `main` and between fork and exec, which the C
//! library decides: glibc calls `.init_array` functions with `main`'s arguments, and its
//! system call wrappers are async-signal-safe. The build refuses any other C library rather
//! than run there unchecked. Every unsafe block here is one operation, with a `SAFETY` comment
//! saying why it is sound (`clippy::multiple_unsafe_ops_per_block` and
//! `clippy::undocumented_unsafe_blocks` deny any other); the system calls are in [`sys`].
#![allow(unsafe_code)]
#![deny(
    unsafe_op_in_unsafe_fn,
    clippy::undocumented_unsafe_blocks,
    clippy::multiple_unsafe_ops_per_block
)]

// The entry relies on glibc passing `main`'s arguments to `.init_array` functions (musl does
// not), and the warden on glibc's wrappers being async-signal-safe between fork and exec.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
compile_error!(
    "crew's warden is sound only with glibc on Linux (target_env = \"gnu\"): it runs before `main`, from `.init_array`, with `main`'s arguments as glibc passes them"
);

use std::ffi::CStr;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

use crate::sys;

pub(super) mod server;

/// The signal the kernel sends the warden when the host's spawner thread dies.
const WARDEN_SIGNAL: libc::c_int = libc::SIGUSR2;

/// The environment entry (`NAME=value`) that marks the guarded agent's processes. Set by the
/// warden at its start and read by its parent-death handler; unset in the host.
static MARKER: AtomicPtr<u8> = AtomicPtr::new(std::ptr::null_mut());
static MARKER_LEN: AtomicUsize = AtomicUsize::new(0);

/// How many times the warden sweeps `/proc` on host death while the sweeps still find
/// processes: a marked process may fork while a sweep passes it by.
const SWEEPS: usize = 8;

/// The first argument that makes a start of the executable a warden. Its arguments, all
/// given by [`WardedCommand::new`]: `crew-warden WARDEN_ARG <host pid> <ruleset fd or ->
/// <report fd> <environment fd> <namespace plan fd or -> <user namespace fd or -> <proxy
/// channel fd or -> <marker> <the agent's soft limit on open files or -> <program> <args…>`.
pub(super) const WARDEN_ARG: &CStr = c"--crew-warden-v6";

/// Which of the warden's arguments is its marker (`CREW_AGENT_ID=<agent id>`).
const MARKER_ARG: usize = 9;

/// Arguments before the agent's program (the name, [`WARDEN_ARG`], pid, ruleset, report,
/// environment, namespace plan, user namespace, proxy channel, marker, open files).
const WARDEN_ARGS: usize = 11;

/// The exit code of a warden whose agent could not be started.
const NOT_STARTED: libc::c_int = 127;

/// The step of an agent's start that failed, reported to the host in the high half of the
/// error (the low half its `errno`): an error confining the agent is not one of its program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum ConfineStep {
    /// Executing its program.
    Exec = 0,
    /// Entering its namespaces: its mounts, covers, terminals, shared memory and network.
    Namespace = 1,
    /// Listening on the proxy's port for its host.
    Proxy = 2,
    /// Applying its Landlock ruleset.
    Ruleset = 3,
    /// Listening on its own connection to its host.
    OwnConnection = 4,
    /// Giving back the user's limit on open files.
    OpenFiles = 5,
    /// Dropping its capabilities.
    Capabilities = 6,
}

impl ConfineStep {
    /// Every step, in order.
    const ALL: [ConfineStep; 7] = [
        ConfineStep::Exec,
        ConfineStep::Namespace,
        ConfineStep::Proxy,
        ConfineStep::Ruleset,
        ConfineStep::OwnConnection,
        ConfineStep::OpenFiles,
        ConfineStep::Capabilities,
    ];

    /// The step (`None` for the program's exec) and the error of a warden's report of a
    /// failed start.
    pub fn split(report: u32) -> (Option<&'static str>, i32) {
        let errno = i32::try_from(report & 0xffff).unwrap_or(libc::EIO);
        let step = Self::ALL
            .into_iter()
            .find(|step| *step as u32 == report >> 16);
        let said = match step {
            Some(ConfineStep::Exec) => None,
            Some(ConfineStep::Namespace) => {
                Some("entering its namespaces (its mounts, covers and terminals)")
            }
            Some(ConfineStep::Proxy) => Some("listening on its proxy's port"),
            Some(ConfineStep::Ruleset) => Some("applying its Landlock ruleset"),
            Some(ConfineStep::OwnConnection) => Some("listening on its own connection"),
            Some(ConfineStep::OpenFiles) => Some("setting its limit on open files"),
            Some(ConfineStep::Capabilities) => Some("dropping its capabilities"),
            None => Some("confining itself"),
        };
        (said, errno)
    }
}

/// The warden's entry: glibc calls every function of `.init_array` with `main`'s arguments
/// before `main`. A start of the executable whose first argument is [`WARDEN_ARG`] becomes a
/// warden and never returns; any other start goes on to `main` at once.
#[used]
#[unsafe(link_section = ".init_array")]
pub(super) static WARDEN_ENTRY: extern "C" fn(
    libc::c_int,
    *const *const libc::c_char,
    *const *const libc::c_char,
) = warden_entry;

extern "C" fn warden_entry(
    argc: libc::c_int,
    argv: *const *const libc::c_char,
    _envp: *const *const libc::c_char,
) {
    let count = usize::try_from(argc).unwrap_or(0);
    if argv.is_null() || count < 2 {
        return;
    }
    // SAFETY: glibc passes `main`'s argv: `argc` (more than 1) pointers, then a null one.
    let slot = unsafe { argv.add(1) };
    // SAFETY: a valid, aligned slot of that array.
    let first = unsafe { *slot };
    if first.is_null() {
        return;
    }
    // SAFETY: one of glibc's NUL-terminated arguments, alive as long as the process.
    let first = unsafe { CStr::from_ptr(first) };
    if first == server::SERVER_ARG && count == server::SERVER_ARGS {
        // SAFETY: the server's own argv, before `main`, with its SERVER_ARGS arguments.
        unsafe { server::become_server(argv) }
    }
    if first != WARDEN_ARG || count <= WARDEN_ARGS {
        return;
    }
    // SAFETY: the warden's own argv, before `main`, with more than WARDEN_ARGS arguments.
    unsafe { become_warden(argv) }
}

/// Argument `index` of the warden.
///
/// # Safety
/// `argv` is `main`'s and holds more than `index` arguments.
unsafe fn argument(argv: *const *const libc::c_char, index: usize) -> &'static CStr {
    // SAFETY: within the array, by the caller's contract.
    let slot = unsafe { argv.add(index) };
    // SAFETY: a valid, aligned slot of the array.
    let pointer = unsafe { *slot };
    // SAFETY: a NUL-terminated argument, alive as long as the process.
    unsafe { CStr::from_ptr(pointer) }
}

/// Parses a decimal argument of the warden's: a pid or a descriptor.
fn parse_number(argument: &CStr) -> Option<libc::c_int> {
    parse_pid(argument.to_bytes())
}

/// Parses the agent's soft limit on open files, a decimal of at most 19 digits.
fn parse_limit(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || digits.len() > 19 {
        return None;
    }
    digits.iter().try_fold(0u64, |limit, &digit| {
        digit
            .is_ascii_digit()
            .then(|| limit * 10 + u64::from(digit - b'0'))
    })
}

/// Writes `value` on the report pipe; a host gone meanwhile is not the warden's concern.
fn report_u32(report: libc::c_int, value: u32) {
    sys::write(report, &value.to_ne_bytes());
}

/// Reports `errno` on the report pipe, says `what` failed on stderr, and ends the warden.
fn fail_reported(report: libc::c_int, what: &CStr) -> ! {
    report_u32(report, sys::errno() as u32);
    fail(what)
}

/// Says `what` failed on stderr and ends the warden, its agent not started.
fn fail(what: &CStr) -> ! {
    for part in [b"crew-warden: ".as_slice(), what.to_bytes(), b"\n"] {
        sys::write(2, part);
    }
    sys::exit(NOT_STARTED)
}

/// Closes every descriptor from 3 up but the ones in `keep`: only for a process about to
/// exec or never to return.
fn close_all_but(mut keep: [libc::c_int; 6]) {
    keep.sort_unstable();
    let mut from: libc::c_int = 3;
    for kept in keep {
        if kept >= from {
            if kept > from {
                sys::close_range(from as u32, (kept - 1) as u32);
            }
            from = kept + 1;
        }
    }
    sys::close_range(from as u32, u32::MAX);
}

/// An optional descriptor argument: `-` for none.
fn optional_fd(argument: &CStr, what: &CStr) -> Option<libc::c_int> {
    match argument.to_bytes() {
        b"-" => None,
        _ => Some(parse_number(argument).unwrap_or_else(|| fail(what))),
    }
}

/// The warden, from its arguments to its end (see [`WardedCommand::new`] for them).
///
/// # Safety
/// Only for [`warden_entry`], before `main`, with the warden's own `argv`.
unsafe fn become_warden(argv: *const *const libc::c_char) -> ! {
    // SAFETY: the caller counted more than WARDEN_ARGS arguments.
    let args: [&CStr; WARDEN_ARGS] = std::array::from_fn(|index| unsafe { argument(argv, index) });
    // Started by a host, a warden leads a process group of its own, which it kills when
    // the host is gone: never someone else's.
    if sys::getpgrp() != sys::getpid() {
        fail(c"only crew starts a warden")
    }
    let Some(host_pid) = parse_number(args[2]) else {
        fail(c"bad host pid")
    };
    let ruleset = optional_fd(args[3], c"bad ruleset descriptor");
    let Some(report) = parse_number(args[4]) else {
        fail(c"bad report descriptor")
    };
    let Some(environment) = parse_number(args[5]) else {
        fail(c"bad environment descriptor")
    };
    let namespace = optional_fd(args[6], c"bad namespace descriptor");
    let user = optional_fd(args[7], c"bad user namespace descriptor");
    let channel = optional_fd(args[8], c"bad proxy channel descriptor");
    // What the host's other threads started meanwhile may have left open here.
    close_all_but([
        report,
        environment,
        ruleset.unwrap_or(report),
        namespace.unwrap_or(report),
        user.unwrap_or(report),
        channel.unwrap_or(report),
    ]);
    let Some(agent_env) = map_environment(environment) else {
        fail_reported(report, c"cannot read the agent's environment")
    };
    let namespace = namespace.map(|fd| {
        map_file(fd).unwrap_or_else(|| fail_reported(report, c"cannot read the agent's namespace"))
    });
    let marker = args[MARKER_ARG].to_bytes();
    let open_files = match args[10].to_bytes() {
        b"-" => None,
        digits => Some(parse_limit(digits).unwrap_or_else(|| fail(c"bad open files limit"))),
    };
    MARKER.store(marker.as_ptr().cast_mut(), Ordering::SeqCst);
    MARKER_LEN.store(marker.len(), Ordering::SeqCst);
    sys::unblock_all_signals();
    sys::on_signal(WARDEN_SIGNAL, on_host_death);
    if sys::prctl(libc::PR_SET_PDEATHSIG, WARDEN_SIGNAL as libc::c_ulong) != 0 {
        fail_reported(report, c"cannot ask for a signal at the host's death");
    }
    // Named so that a connection from the agent can be traced to it (procscan::WARDEN_NAME).
    sys::set_name(c"crew-warden");
    // Whatever the agent leaves behind becomes the warden's child, not init's.
    if sys::prctl(libc::PR_SET_CHILD_SUBREAPER, 1) != 0 {
        fail_reported(report, c"cannot become a subreaper");
    }
    // The host may have died before the signal was armed.
    if sys::getppid() != host_pid {
        sys::kill(0, libc::SIGKILL);
        sys::exit(137);
    }
    // No controlling terminal for the agent (nor for the warden, which needs none): the
    // terminal crew was started in stays the user's, confined or not. An agent holding it
    // could push keystrokes into it (`TIOCSTI`, which the user's shell reads once crew is
    // done) or read from it through `/dev/tty`; without one, `/dev/tty` does not open.
    let terminal = sys::open(
        c"/dev/tty",
        libc::O_RDONLY | libc::O_NOCTTY | libc::O_CLOEXEC,
    );
    if terminal >= 0 {
        sys::give_up_terminal(terminal);
        sys::close(terminal);
    }
    // Says whether the agent's exec failed, and why: closed by a successful one.
    let mut exec_pipe = [0 as libc::c_int; 2];
    if sys::pipe2(&mut exec_pipe, libc::O_CLOEXEC) != 0 {
        fail_reported(report, c"cannot make a pipe");
    }
    // SAFETY: this process has one thread (before `main`, nothing started another), so the
    // child may run anything the parent could; it only makes system calls and execs.
    let agent = unsafe { libc::fork() };
    if agent < 0 {
        fail_reported(report, c"cannot fork the agent");
    }
    if agent == 0 {
        let confinement = Confinement {
            ruleset,
            namespace,
            user,
            channel,
            open_files,
        };
        // SAFETY: the child just forked, with the warden's argv.
        unsafe { start_agent(argv, agent_env, confinement, report, exec_pipe[1]) }
    }
    sys::close(exec_pipe[1]);
    if let Some(user) = user {
        sys::close(user);
    }
    if let Some(channel) = channel {
        sys::close(channel);
    }
    if let Some(ruleset) = ruleset {
        sys::close(ruleset);
    }
    // A graceful stop (TERM to the group) is the agent's to answer; the warden reports how
    // it ended. Set after the fork: the agent keeps the default actions.
    for signal in [
        libc::SIGTERM,
        libc::SIGINT,
        libc::SIGHUP,
        libc::SIGQUIT,
        libc::SIGPIPE,
    ] {
        sys::set_disposition(signal, libc::SIG_IGN);
    }
    sys::set_disposition(libc::SIGCHLD, libc::SIG_DFL);
    let mut error = [0u8; 4];
    let read = loop {
        let read = sys::read(exec_pipe[0], &mut error);
        if read < 0 && sys::errno() == libc::EINTR {
            continue;
        }
        break read;
    };
    sys::close(exec_pipe[0]);
    if read == 4 {
        report_u32(report, u32::from_ne_bytes(error));
        let mut status: libc::c_int = 0;
        sys::waitpid(agent, &mut status, 0);
        sys::exit(NOT_STARTED);
    }
    report_u32(report, 0);
    warden(agent, report)
}

unsafe extern "C" {
    /// The C library's environment, which `execvp` passes on and looks `PATH` up in.
    static mut environ: *const *const libc::c_char;
}

/// Maps the agent's environment (see [`environment_file`]) and builds its null-terminated
/// array of entries, in memory of its own (the warden allocates nothing through the C
/// library); closes the file. `None`, with `errno` set, when it cannot.
fn map_environment(file: libc::c_int) -> Option<*const *const libc::c_char> {
    let text = map_file(file)?;
    let count = text.iter().filter(|&&byte| byte == 0).count();
    let array = sys::map_anonymous((count + 1) * std::mem::size_of::<*const libc::c_char>())?;
    let array = array.cast::<*const libc::c_char>();
    let mut filled = 0;
    let mut start = 0;
    for (index, &byte) in text.iter().enumerate() {
        if byte == 0 {
            if filled < count {
                let entry = text[start..].as_ptr().cast::<libc::c_char>();
                // SAFETY: `filled < count`: within the mapping of `count + 1` pointers.
                let slot = unsafe { array.add(filled) };
                // SAFETY: a writable slot of a page-aligned mapping, so aligned for a pointer.
                unsafe { slot.write(entry) };
                filled += 1;
            }
            start = index + 1;
        }
    }
    // The anonymous mapping is zero-filled: the entry after the last is null.
    Some(array.cast_const())
}

/// Maps a memory file the host wrote (see [`memory_file`]) and closes it: its bytes, for the
/// rest of the process's life. `None`, with `errno` set, when it cannot.
fn map_file(file: libc::c_int) -> Option<&'static [u8]> {
    let size = sys::file_size(file)?;
    if size == 0 {
        sys::close(file);
        return Some(&[]);
    }
    let mapped = sys::map_file(file, size)?;
    sys::close(file);
    Some(mapped)
}

/// What the agent's process confines itself with, from its warden's arguments.
struct Confinement<'a> {
    /// The Landlock ruleset.
    ruleset: Option<libc::c_int>,
    /// The namespace plan (see [`crate::sandbox::Namespace::encode`]).
    namespace: Option<&'a [u8]>,
    /// The user namespace its host made for its agents, to join.
    user: Option<libc::c_int>,
    /// Where the proxy's listening socket goes, when the plan asks for one.
    channel: Option<libc::c_int>,
    /// The soft limit on open files the agent gets back, its host's raised (see
    /// `crate::open_files`).
    open_files: Option<u64>,
}

/// The agent, forked by its warden: confines itself, closes the warden's descriptors and
/// executes its program. Never returns: an error is written on `exec_error` for the warden.
///
/// # Safety
/// Only in the child [`become_warden`] forked, with the warden's `argv`.
unsafe fn start_agent(
    argv: *const *const libc::c_char,
    env: *const *const libc::c_char,
    confinement: Confinement<'_>,
    report: libc::c_int,
    exec_error: libc::c_int,
) -> ! {
    let Confinement {
        ruleset,
        namespace,
        user,
        channel,
        open_files,
    } = confinement;
    // The error, and in its high half the step that failed (see `ConfineStep`).
    let failed = |step: ConfineStep| -> ! {
        let error = (sys::errno() as u32 & 0xffff) | ((step as u32) << 16);
        sys::write(exec_error, &error.to_ne_bytes());
        sys::exit(NOT_STARTED)
    };
    let invalid = |step: ConfineStep| -> ! {
        sys::set_errno(libc::EINVAL);
        failed(step)
    };
    // The parent-death signal is not inherited; the handler goes with exec anyway.
    sys::set_disposition(WARDEN_SIGNAL, libc::SIG_DFL);
    // Mounts first: the ruleset forbids changing them.
    if let Some(plan) = namespace {
        // SAFETY: between fork and exec, in the agent's own process, as it requires.
        if unsafe { crate::sandbox::enter_namespace(plan, ruleset, user) }.is_err() {
            failed(ConfineStep::Namespace)
        }
        // In its own network namespace now: the proxy's port, for the host to accept on.
        // A plan that asks for it without a channel fails closed.
        if crate::sandbox::plan_wants_proxy(plan) {
            let Some(channel) = channel else {
                invalid(ConfineStep::Proxy)
            };
            // SAFETY: between fork and exec; `channel` is the warden's open descriptor.
            if unsafe { crate::sandbox::listen_for_host(channel) }.is_err() {
                failed(ConfineStep::Proxy)
            }
        }
    }
    if let Some(ruleset) = ruleset {
        // SAFETY: between fork and exec; `ruleset` is the warden's open ruleset descriptor.
        if unsafe { crate::sandbox::restrict_self(ruleset) }.is_err() {
            failed(ConfineStep::Ruleset)
        }
        sys::close(ruleset);
    }
    // Confined now: its own connection, which only its own domain may connect to.
    if let Some(name) = namespace.and_then(crate::sandbox::plan_control_name) {
        let Some(channel) = channel else {
            invalid(ConfineStep::OwnConnection)
        };
        // SAFETY: between fork and exec; `channel` is the warden's open descriptor.
        if unsafe { crate::sandbox::listen_for_own_connections(channel, name) }.is_err() {
            failed(ConfineStep::OwnConnection)
        }
    }
    if let Some(channel) = channel {
        sys::close(channel);
    }
    if let Some(user) = user {
        sys::close(user);
    }
    // The user's own limit: lowering a soft limit is never refused.
    if let Some(limit) = open_files
        && sys::set_open_files_soft(limit) != 0
    {
        failed(ConfineStep::OpenFiles)
    }
    // Confined, it keeps no capability, nor gains one by its exec: root's (with no namespace,
    // the machine's: loading a kernel module, setting the clock) or its own namespace's.
    if ruleset.is_some() && sys::drop_capabilities() != 0 {
        failed(ConfineStep::Capabilities)
    }
    sys::close(report);
    // The agent's PATH is the one its program is looked up in, as for any exec.
    // SAFETY: this process has one thread, and nothing reads `environ` while it is set.
    unsafe { environ = env };
    // SAFETY: the warden's argv holds its WARDEN_ARGS arguments, then the agent's program.
    let program_slot = unsafe { argv.add(WARDEN_ARGS) };
    // SAFETY: a valid, aligned slot of that array.
    let program = unsafe { *program_slot };
    // SAFETY: `program` and the rest of argv are NUL-terminated strings ended by a null
    // pointer, and `environ` a null-terminated array of entries: what exec reads.
    unsafe { libc::execvp(program, program_slot) };
    failed(ConfineStep::Exec)
}

/// The warden's life once the agent started: wait for it, then end the same way.
fn warden(agent: libc::pid_t, report: libc::c_int) -> ! {
    let mut status: libc::c_int = 0;
    loop {
        let waited = sys::waitpid(agent, &mut status, 0);
        if waited == agent {
            break;
        }
        if waited < 0 && sys::errno() != libc::EINTR {
            sys::exit(NOT_STARTED);
        }
    }
    // Everything the agent left behind: kill what is alive, reap, and again, until no child
    // is left (a killed daemon's own children become the warden's in turn).
    let mut left_behind = 0;
    loop {
        // No child left (the usual end): nothing to look for in /proc, whose scan reads
        // every process's status on the machine.
        if sys::child_exited() == Err(libc::ECHILD) {
            break;
        }
        left_behind += kill_children();
        let mut ignored: libc::c_int = 0;
        let reaped = sys::waitpid(-1, &mut ignored, 0);
        if reaped < 0 && sys::errno() != libc::EINTR {
            break;
        }
    }
    report_u32(report, u32::try_from(left_behind).unwrap_or(u32::MAX));
    if libc::WIFEXITED(status) {
        sys::exit(libc::WEXITSTATUS(status));
    }
    let signal = if libc::WIFSIGNALED(status) {
        libc::WTERMSIG(status)
    } else {
        libc::SIGKILL
    };
    sys::set_disposition(signal, libc::SIG_DFL);
    sys::unblock_all_signals();
    sys::kill(sys::getpid(), signal);
    sys::exit(128 + signal)
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
    // 0 addresses the caller's own process group.
    sys::kill(0, libc::SIGKILL);
}

/// Sends SIGKILL to every process but this one whose environment holds `marker` as a whole
/// entry; returns how many were signalled. Async-signal-safe, like [`for_each_pid`].
fn sweep_marked(marker: &[u8]) -> usize {
    let own_pid = sys::getpid();
    let mut killed = 0;
    for_each_pid(|pid| {
        if pid != own_pid && environ_holds(pid, marker) && sys::kill(pid, libc::SIGKILL) == 0 {
            killed += 1;
        }
    });
    killed
}

/// Kills every live child of this process (with the warden a subreaper, every process the
/// agent left behind ends up its child) and returns how many there were. Async-signal-safe.
fn kill_children() -> usize {
    let own_pid = sys::getpid();
    let mut killed = 0;
    for_each_pid(|pid| {
        if let Some((state, parent)) = state_and_parent(pid)
            && parent == own_pid
            && state != b'Z'
            && sys::kill(pid, libc::SIGKILL) == 0
        {
            killed += 1;
        }
    });
    killed
}

/// Calls `visit` with the pid of every process in `/proc`. Async-signal-safe: raw `open`,
/// `getdents64` and `close` over a stack buffer, no allocation, no panicking index.
fn for_each_pid(mut visit: impl FnMut(libc::pid_t)) {
    let proc_dir = sys::open(
        c"/proc",
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
    );
    if proc_dir < 0 {
        return;
    }
    let mut entries = [0u8; 4096];
    loop {
        let filled = sys::getdents64(proc_dir, &mut entries);
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
    sys::close(proc_dir);
}

/// The state letter and parent pid of `pid`, from `/proc/<pid>/stat` (`pid (comm) S ppid …`;
/// the command name may hold spaces and parentheses, so the last `)` ends it).
/// Async-signal-safe.
fn state_and_parent(pid: libc::pid_t) -> Option<(u8, libc::pid_t)> {
    let mut path = [0u8; 32];
    proc_path(pid, b"/stat\0", &mut path);
    let mut buffer = [0u8; 512];
    let file = sys::open(proc_cstr(&path)?, libc::O_RDONLY | libc::O_CLOEXEC);
    if file < 0 {
        return None;
    }
    let read = sys::read(file, &mut buffer);
    sys::close(file);
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

/// A path [`proc_path`] wrote, as the C string it is (up to its first NUL).
fn proc_cstr(path: &[u8; 32]) -> Option<&CStr> {
    CStr::from_bytes_until_nul(path).ok()
}

/// Writes `/proc/<pid><suffix>` into `path`; `suffix` ends with a NUL.
fn proc_path(pid: libc::pid_t, suffix: &[u8], path: &mut [u8; 32]) {
    const PREFIX: &[u8] = b"/proc/";
    let mut digits = [0u8; 10];
    let digits = decimal(pid.unsigned_abs(), &mut digits);
    for (slot, &byte) in path
        .iter_mut()
        .zip(PREFIX.iter().chain(digits).chain(suffix))
    {
        *slot = byte;
    }
}

/// `value` in decimal, in `digits`: what code between fork and exec writes numbers with (it
/// allocates nothing).
pub fn decimal(value: u32, digits: &mut [u8; 10]) -> &[u8] {
    let mut start = digits.len();
    let mut rest = value;
    loop {
        start -= 1;
        digits[start] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    &digits[start..]
}

/// The number a `/proc` entry names (its name up to the first NUL), if it is all digits: a
/// pid there, a pid or a descriptor in the warden's arguments.
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
    let Some(path) = proc_cstr(&path) else {
        return false;
    };
    let file = sys::open(path, libc::O_RDONLY | libc::O_CLOEXEC);
    if file < 0 {
        return false;
    }
    let mut matcher = EntryMatcher::new(marker);
    let mut chunk = [0u8; 4096];
    let mut found = false;
    loop {
        let read = sys::read(file, &mut chunk);
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
    sys::close(file);
    found
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

#[cfg(test)]
mod tests {
    use std::process::Command;

    use super::{EntryMatcher, WARDEN_ARG, environ_holds, parse_limit, parse_pid, sweep_marked};

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
    fn an_open_files_limit_is_a_decimal_that_fits() {
        assert_eq!(parse_limit(b"1024"), Some(1024));
        assert_eq!(parse_limit(b"1073741816"), Some(1_073_741_816));
        assert_eq!(parse_limit(b""), None);
        assert_eq!(parse_limit(b"-"), None);
        assert_eq!(parse_limit(b"12x"), None);
        assert_eq!(parse_limit(b"99999999999999999999"), None);
    }

    /// A start of the executable as a warden, as an agent could try it, with `host` named as
    /// its host; what it would start touches `flag`.
    fn start_as_warden(host: &str, flag: &std::path::Path) -> std::process::Output {
        use std::os::unix::process::CommandExt;

        let touch = format!("touch {}", flag.display());
        let env = flag.with_extension("env");
        std::fs::write(&env, "PATH=/usr/bin:/bin\0CREW_AGENT_ID=r:t\0").unwrap();
        // Reports on stderr, takes the agent's environment on stdin.
        Command::new("/proc/self/exe")
            .args([
                WARDEN_ARG.to_str().unwrap(),
                host,
                "-",
                "2",
                "0",
                "-",
                "-",
                "-",
                "CREW_AGENT_ID=r:t",
                "-",
            ])
            .args(["sh", "-c", &touch])
            .stdin(std::fs::File::open(&env).unwrap())
            // Its own group: a warden that kills itself kills its group.
            .process_group(0)
            .output()
            .unwrap()
    }

    #[test]
    fn a_warden_whose_host_is_not_its_parent_starts_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let flag = dir.path().join("started");
        // In this test's own process group: it would kill the group, so it refuses.
        let grouped = Command::new("/proc/self/exe")
            .args([
                WARDEN_ARG.to_str().unwrap(),
                "1",
                "-",
                "2",
                "0",
                "-",
                "-",
                "-",
                "CREW_AGENT_ID=r:t",
                "-",
                "true",
            ])
            .output()
            .unwrap();
        assert_eq!(grouped.status.code(), Some(127));
        assert_eq!(
            String::from_utf8_lossy(&grouped.stderr),
            "crew-warden: only crew starts a warden\n"
        );
        let bad = start_as_warden("not-a-pid", &flag);
        assert_eq!(bad.status.code(), Some(127));
        assert_eq!(
            String::from_utf8_lossy(&bad.stderr),
            "crew-warden: bad host pid\n"
        );
        // pid 1 is not this test's process, which started it.
        let orphan = start_as_warden("1", &flag);
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&orphan.status),
            Some(libc::SIGKILL)
        );
        assert!(!flag.exists(), "neither started the agent");
        let own = start_as_warden(&std::process::id().to_string(), &flag);
        assert!(own.status.success(), "{own:?}");
        assert!(
            flag.exists(),
            "with its host as its parent, the warden starts the agent"
        );
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
