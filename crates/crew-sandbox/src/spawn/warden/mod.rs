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
mod sweep;

pub use sweep::decimal;
use sweep::{kill_children, parse_pid, sweep_marked};

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
/// channel fd or -> <marker> <the agent's soft limit on open files or -> <the first of its
/// cgroup's `cgroup.procs` fds and their count, `first,count`, or -> <program> <args…>`.
pub(super) const WARDEN_ARG: &CStr = c"--crew-warden-v7";

/// Which of the warden's arguments is its marker (`CREW_AGENT_ID=<agent id>`).
const MARKER_ARG: usize = 9;

/// Arguments before the agent's program (the name, [`WARDEN_ARG`], pid, ruleset, report,
/// environment, namespace plan, user namespace, proxy channel, marker, open files, cgroup).
const WARDEN_ARGS: usize = 12;

/// The most `cgroup.procs` files an agent joins (v1's memory, cpu, pids and cpuacct).
pub(super) const MAX_CGROUP_FILES: usize = 4;

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
    /// Joining the cgroup of its caps.
    Caps = 7,
}

impl ConfineStep {
    /// Every step, in order.
    const ALL: [ConfineStep; 8] = [
        ConfineStep::Exec,
        ConfineStep::Namespace,
        ConfineStep::Proxy,
        ConfineStep::Ruleset,
        ConfineStep::OwnConnection,
        ConfineStep::OpenFiles,
        ConfineStep::Capabilities,
        ConfineStep::Caps,
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
            Some(ConfineStep::Caps) => Some("joining the cgroup of its caps"),
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
fn close_all_but(mut keep: [libc::c_int; 6 + MAX_CGROUP_FILES]) {
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
    let cgroup = match args[11].to_bytes() {
        b"-" => None,
        range => {
            let parsed = range.iter().position(|byte| *byte == b',').and_then(|at| {
                let first = parse_pid(&range[..at])?;
                let count = parse_pid(&range[at + 1..])?;
                (1..=MAX_CGROUP_FILES as libc::c_int)
                    .contains(&count)
                    .then_some((first, count))
            });
            Some(parsed.unwrap_or_else(|| fail(c"bad cgroup descriptors")))
        }
    };
    // What the host's other threads started meanwhile may have left open here.
    let mut keep = [report; 6 + MAX_CGROUP_FILES];
    keep[..6].copy_from_slice(&[
        report,
        environment,
        ruleset.unwrap_or(report),
        namespace.unwrap_or(report),
        user.unwrap_or(report),
        channel.unwrap_or(report),
    ]);
    if let Some((first, count)) = cgroup {
        for (slot, fd) in keep[6..].iter_mut().zip(first..first + count) {
            *slot = fd;
        }
    }
    close_all_but(keep);
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
            cgroup,
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
    if let Some((first, count)) = cgroup {
        for fd in first..first + count {
            sys::close(fd);
        }
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
    /// The `cgroup.procs` files of its caps' cgroup, open: the first descriptor and how many.
    cgroup: Option<(libc::c_int, libc::c_int)>,
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
        cgroup,
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
    // Into its caps' cgroup first (the warden stays out: an agent at its memory cap cannot
    // take the warden with it): everything it starts from here on is held by the caps.
    if let Some((first, count)) = cgroup {
        for fd in first..first + count {
            if sys::write(fd, b"0") != 1 {
                failed(ConfineStep::Caps)
            }
            sys::close(fd);
        }
    }
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

#[cfg(test)]
mod tests;
