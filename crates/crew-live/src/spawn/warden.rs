//! The warden: what a start of the executable becomes before `main` when its first argument
//! is [`WARDEN_ARG`] (see the module above for why it exists). From its entry to the agent's
//! exec, or to its own end, it runs with nothing of Rust's runtime set up: raw `libc` calls,
//! no allocation, never a return into `main`.
//!
//! Its soundness rests on what runs before `main` and between fork and exec, which the C
//! library decides: glibc calls `.init_array` functions with `main`'s arguments, and its
//! system call wrappers are async-signal-safe. The build refuses any other C library rather
//! than run there unchecked. Every unsafe block here says, in a `SAFETY` comment, why its
//! operations are sound (`clippy::undocumented_unsafe_blocks` denies one without).
#![allow(unsafe_code)]
#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

// The entry relies on glibc passing `main`'s arguments to `.init_array` functions (musl does
// not), and the warden on glibc's wrappers being async-signal-safe between fork and exec.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
compile_error!(
    "crew's warden is sound only with glibc on Linux (target_env = \"gnu\"): it runs before `main`, from `.init_array`, with `main`'s arguments as glibc passes them"
);

use std::ffi::CStr;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

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
/// <report fd> <environment fd> <namespace plan fd or -> <proxy channel fd or -> <marker>
/// <program> <args…>`.
pub(super) const WARDEN_ARG: &CStr = c"--crew-warden-v3";

/// Arguments before the agent's program (the name, [`WARDEN_ARG`], pid, ruleset, report,
/// environment, namespace plan, proxy channel, marker).
const WARDEN_ARGS: usize = 9;

/// The exit code of a warden whose agent could not be started.
const NOT_STARTED: libc::c_int = 127;

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
    if argv.is_null() || count <= WARDEN_ARGS {
        return;
    }
    // SAFETY: glibc passes `main`'s argv: `argc` NUL-terminated strings, then a null pointer.
    unsafe {
        let first = *argv.add(1);
        if first.is_null() || CStr::from_ptr(first) != WARDEN_ARG {
            return;
        }
        become_warden(argv)
    }
}

/// Parses a decimal argument of the warden's: a pid or a descriptor.
fn parse_number(argument: &CStr) -> Option<libc::c_int> {
    parse_pid(argument.to_bytes())
}

/// Writes `value` on the report pipe; a host gone meanwhile is not the warden's concern.
///
/// # Safety
/// `report` must be an open descriptor.
unsafe fn report_u32(report: libc::c_int, value: u32) {
    let bytes = value.to_ne_bytes();
    // SAFETY: writes a buffer of this frame.
    unsafe {
        libc::write(report, bytes.as_ptr().cast(), bytes.len());
    }
}

/// Closes every descriptor from 3 up but the ones in `keep`.
///
/// # Safety
/// Closes descriptors others may own: only for a process about to exec or never to return.
unsafe fn close_all_but(mut keep: [libc::c_int; 5]) {
    keep.sort_unstable();
    let mut from: libc::c_int = 3;
    for kept in keep {
        if kept >= from {
            if kept > from {
                // SAFETY: close_range on this process's own table.
                unsafe {
                    libc::syscall(libc::SYS_close_range, from as u32, (kept - 1) as u32, 0u32);
                }
            }
            from = kept + 1;
        }
    }
    // SAFETY: as above.
    unsafe {
        libc::syscall(libc::SYS_close_range, from as u32, u32::MAX, 0u32);
    }
}

/// The warden, from its arguments to its end (see [`WardedCommand::new`] for them).
///
/// # Safety
/// Only for [`warden_entry`], before `main`, with the warden's own `argv`.
unsafe fn become_warden(argv: *const *const libc::c_char) -> ! {
    // SAFETY: the arguments are NUL-terminated strings (checked for count by the caller);
    // every call below is a plain system call on this process.
    unsafe {
        let argument = |index: usize| CStr::from_ptr(*argv.add(index));
        let fail = |what: &CStr| -> ! {
            for part in [b"crew-warden: ".as_slice(), what.to_bytes(), b"\n"] {
                libc::write(2, part.as_ptr().cast(), part.len());
            }
            libc::_exit(NOT_STARTED)
        };
        // Started by a host, a warden leads a process group of its own, which it kills when
        // the host is gone: never someone else's.
        if libc::getpgrp() != libc::getpid() {
            fail(c"only crew starts a warden")
        }
        let Some(host_pid) = parse_number(argument(2)) else {
            fail(c"bad host pid")
        };
        let ruleset = match argument(3).to_bytes() {
            b"-" => None,
            _ => match parse_number(argument(3)) {
                Some(fd) => Some(fd),
                None => fail(c"bad ruleset descriptor"),
            },
        };
        let Some(report) = parse_number(argument(4)) else {
            fail(c"bad report descriptor")
        };
        let Some(environment) = parse_number(argument(5)) else {
            fail(c"bad environment descriptor")
        };
        let namespace = match argument(6).to_bytes() {
            b"-" => None,
            _ => match parse_number(argument(6)) {
                Some(fd) => Some(fd),
                None => fail(c"bad namespace descriptor"),
            },
        };
        let channel = match argument(7).to_bytes() {
            b"-" => None,
            _ => match parse_number(argument(7)) {
                Some(fd) => Some(fd),
                None => fail(c"bad proxy channel descriptor"),
            },
        };
        // What the host's other threads started meanwhile may have left open here.
        close_all_but([
            report,
            environment,
            ruleset.unwrap_or(report),
            namespace.unwrap_or(report),
            channel.unwrap_or(report),
        ]);
        let Some(agent_env) = map_environment(environment) else {
            report_u32(report, *libc::__errno_location() as u32);
            fail(c"cannot read the agent's environment")
        };
        let namespace = match namespace {
            None => None,
            Some(fd) => match map_file(fd) {
                Some(plan) => Some(plan),
                None => {
                    report_u32(report, *libc::__errno_location() as u32);
                    fail(c"cannot read the agent's namespace")
                }
            },
        };
        let marker = argument(8).to_bytes();
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
            report_u32(report, *libc::__errno_location() as u32);
            fail(c"cannot ask for a signal at the host's death");
        }
        // Named so that a connection from the agent can be traced to it (procscan::WARDEN_NAME).
        libc::prctl(libc::PR_SET_NAME, c"crew-warden".as_ptr(), 0, 0, 0);
        // Whatever the agent leaves behind becomes the warden's child, not init's.
        if libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0 {
            report_u32(report, *libc::__errno_location() as u32);
            fail(c"cannot become a subreaper");
        }
        // The host may have died before the signal was armed.
        if libc::getppid() != host_pid {
            libc::kill(0, libc::SIGKILL);
            libc::_exit(137);
        }
        // Says whether the agent's exec failed, and why: closed by a successful one.
        let mut exec_pipe = [0 as libc::c_int; 2];
        if libc::pipe2(exec_pipe.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
            report_u32(report, *libc::__errno_location() as u32);
            fail(c"cannot make a pipe");
        }
        let agent = libc::fork();
        if agent < 0 {
            report_u32(report, *libc::__errno_location() as u32);
            fail(c"cannot fork the agent");
        }
        if agent == 0 {
            start_agent(
                argv,
                agent_env,
                Confinement {
                    ruleset,
                    namespace,
                    channel,
                },
                report,
                exec_pipe[1],
            )
        }
        libc::close(exec_pipe[1]);
        if let Some(channel) = channel {
            libc::close(channel);
        }
        if let Some(ruleset) = ruleset {
            libc::close(ruleset);
        }
        // A graceful stop (TERM to the group) is the agent's to answer; the warden reports how
        // it ended. Set after the fork: the agent keeps the default actions.
        libc::signal(libc::SIGTERM, libc::SIG_IGN);
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::signal(libc::SIGHUP, libc::SIG_IGN);
        libc::signal(libc::SIGQUIT, libc::SIG_IGN);
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
        libc::signal(libc::SIGCHLD, libc::SIG_DFL);
        let mut error = [0u8; 4];
        let read = loop {
            let read = libc::read(exec_pipe[0], error.as_mut_ptr().cast(), error.len());
            if read < 0 && *libc::__errno_location() == libc::EINTR {
                continue;
            }
            break read;
        };
        libc::close(exec_pipe[0]);
        if read == 4 {
            report_u32(report, u32::from_ne_bytes(error));
            let mut status: libc::c_int = 0;
            libc::waitpid(agent, &mut status, 0);
            libc::_exit(NOT_STARTED);
        }
        report_u32(report, 0);
        warden(agent, report)
    }
}

unsafe extern "C" {
    /// The C library's environment, which `execvp` passes on and looks `PATH` up in.
    static mut environ: *const *const libc::c_char;
}

/// Maps the agent's environment (see [`environment_file`]) and builds its null-terminated
/// array of entries, in memory of its own (the warden allocates nothing through the C
/// library); closes the file. `None`, with `errno` set, when it cannot.
///
/// # Safety
/// Only for [`become_warden`], with a descriptor of its arguments.
unsafe fn map_environment(file: libc::c_int) -> Option<*const *const libc::c_char> {
    // SAFETY: plain system calls; every pointer built stays within the mappings made here.
    unsafe {
        let text = map_file(file)?;
        let bytes = text.as_ptr();
        let count = text.iter().filter(|&&byte| byte == 0).count();
        let array = libc::mmap(
            std::ptr::null_mut(),
            (count + 1) * std::mem::size_of::<*const libc::c_char>(),
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        if array == libc::MAP_FAILED {
            return None;
        }
        let array = array.cast::<*const libc::c_char>();
        let mut filled = 0;
        let mut start = 0;
        for (index, &byte) in text.iter().enumerate() {
            if byte == 0 {
                if filled < count {
                    *array.add(filled) = bytes.add(start).cast();
                    filled += 1;
                }
                start = index + 1;
            }
        }
        // The anonymous mapping is zero-filled: the entry after the last is null.
        Some(array.cast_const())
    }
}

/// Maps a memory file the host wrote (see [`memory_file`]) and closes it: its bytes, for the
/// rest of the process's life. `None`, with `errno` set, when it cannot.
///
/// # Safety
/// Only for [`become_warden`], with a descriptor of its arguments.
unsafe fn map_file(file: libc::c_int) -> Option<&'static [u8]> {
    // SAFETY: plain system calls; the mapping is never unmapped.
    unsafe {
        let mut stat: libc::stat = std::mem::zeroed();
        if libc::fstat(file, &mut stat) != 0 {
            return None;
        }
        let size = usize::try_from(stat.st_size).ok()?;
        if size == 0 {
            libc::close(file);
            return Some(&[]);
        }
        let mapped = libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ,
            libc::MAP_PRIVATE,
            file,
            0,
        );
        if mapped == libc::MAP_FAILED {
            return None;
        }
        libc::close(file);
        Some(std::slice::from_raw_parts(mapped.cast::<u8>(), size))
    }
}

/// What the agent's process confines itself with, from its warden's arguments.
struct Confinement<'a> {
    /// The Landlock ruleset.
    ruleset: Option<libc::c_int>,
    /// The namespace plan (see [`crate::sandbox::Namespace::encode`]).
    namespace: Option<&'a [u8]>,
    /// Where the proxy's listening socket goes, when the plan asks for one.
    channel: Option<libc::c_int>,
}

/// The agent, forked by its warden: confines itself, closes the warden's descriptors and
/// executes its program. Never returns: an error is written on `exec_error` for the warden.
///
/// # Safety
/// Only in the child [`become_warden`] forked.
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
        channel,
    } = confinement;
    // SAFETY: plain system calls on this process; `argv` is the warden's, NULL-terminated.
    unsafe {
        let failed = || -> ! {
            let error = (*libc::__errno_location() as u32).to_ne_bytes();
            libc::write(exec_error, error.as_ptr().cast(), error.len());
            libc::_exit(NOT_STARTED)
        };
        // The parent-death signal is not inherited; the handler goes with exec anyway.
        libc::signal(WARDEN_SIGNAL, libc::SIG_DFL);
        // Mounts first: the ruleset forbids changing them.
        if let Some(plan) = namespace {
            if crate::sandbox::enter_namespace(plan, ruleset).is_err() {
                failed()
            }
            // In its own network namespace now: the proxy's port, for the host to accept on.
            // A plan that asks for it without a channel fails closed.
            if crate::sandbox::plan_wants_proxy(plan) {
                match channel {
                    Some(channel) if crate::sandbox::listen_for_host(channel).is_ok() => {}
                    Some(_) => failed(),
                    None => {
                        *libc::__errno_location() = libc::EINVAL;
                        failed()
                    }
                }
            }
        }
        if let Some(ruleset) = ruleset {
            if crate::sandbox::restrict_self(ruleset).is_err() {
                failed()
            }
            libc::close(ruleset);
        }
        // Confined now: its own connection, which only its own domain may connect to.
        if let Some(name) = namespace.and_then(crate::sandbox::plan_control_name) {
            match channel {
                Some(channel)
                    if crate::sandbox::listen_for_own_connections(channel, name).is_ok() => {}
                Some(_) => failed(),
                None => {
                    *libc::__errno_location() = libc::EINVAL;
                    failed()
                }
            }
        }
        if let Some(channel) = channel {
            libc::close(channel);
        }
        libc::close(report);
        // The agent's PATH is the one its program is looked up in, as for any exec.
        environ = env;
        let program = *argv.add(WARDEN_ARGS);
        libc::execvp(program, argv.add(WARDEN_ARGS));
        failed()
    }
}

/// The warden's life once the agent started: wait for it, then end the same way.
///
/// # Safety
/// Only for [`become_warden`].
unsafe fn warden(agent: libc::pid_t, report: libc::c_int) -> ! {
    // SAFETY: async-signal-safe calls only; this process never returns into Rust code.
    unsafe {
        let mut status: libc::c_int = 0;
        loop {
            let waited = libc::waitpid(agent, &mut status, 0);
            if waited == agent {
                break;
            }
            if waited < 0 && *libc::__errno_location() != libc::EINTR {
                libc::_exit(NOT_STARTED);
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
        report_u32(report, u32::try_from(left_behind).unwrap_or(u32::MAX));
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
        if pid == own_pid || !environ_holds(pid, marker) {
            return;
        }
        // SAFETY: kill is a plain system call.
        if unsafe { libc::kill(pid, libc::SIGKILL) } == 0 {
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
pub(crate) fn decimal(value: u32, digits: &mut [u8; 10]) -> &[u8] {
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
                "--crew-warden-v3",
                host,
                "-",
                "2",
                "0",
                "-",
                "-",
                "CREW_AGENT_ID=r:t",
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
                "--crew-warden-v3",
                "1",
                "-",
                "2",
                "0",
                "-",
                "-",
                "CREW_AGENT_ID=r:t",
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
