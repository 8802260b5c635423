//! Settings of the whole process that a program hosting agents takes at its start: what the C
//! library keeps of freed memory, what a closed output does to it, how it yields the machine.
//! Each is one call the standard library and rustix do not wrap.

#![allow(unsafe_code)]

/// glibc gives each thread that allocates a heap of its own, up to eight per core, and keeps
/// what was freed in each: a host whose blocking threads take turns reading 20,000-entry
/// indexes ended a 16-task run at 110 MB resident for 15 MB of live heap. Two heaps hold it to
/// 50 MB at the same speed. Call it before any other thread exists.
pub fn few_malloc_arenas() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only changes a malloc setting; the caller calls it before any other
    // thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

/// What a reader that stops reading does to this process: ignored where it hosts agents (their
/// printing stops, never their agents), else the default action, so that `crew runs list |
/// head` ends as quietly as `git log | head`. Set explicitly either way: a disposition of
/// "ignore" is inherited from whoever started the process. Call it before any other thread
/// exists.
pub fn on_closed_stdout(hosts_agents: bool) {
    let action = match hosts_agents {
        true => libc::SIG_IGN,
        false => libc::SIG_DFL,
    };
    // SAFETY: setting a signal's disposition to a constant one; no handler runs.
    unsafe {
        libc::signal(libc::SIGPIPE, action);
    }
}

/// `nice 19` and the idle I/O class, for this process and what it starts: last in line for
/// the CPU and the disk.
pub fn lowest_priority() {
    // Where it is refused the process runs at its priority: nothing to undo.
    let _ = rustix::process::nice(19);
    // ioprio_set(IOPRIO_WHO_PROCESS, 0, IOPRIO_CLASS_IDLE << 13): no wrapper in rustix.
    const IOPRIO_WHO_PROCESS: libc::c_long = 1;
    const IOPRIO_CLASS_IDLE: libc::c_long = 3;
    // SAFETY: a plain system call with integer arguments; it changes only this process's I/O
    // priority.
    unsafe {
        libc::syscall(
            libc::SYS_ioprio_set,
            IOPRIO_WHO_PROCESS,
            0 as libc::c_long,
            IOPRIO_CLASS_IDLE << 13,
        );
    }
}

/// `pow`, the one function crew took from glibc's `libm` (for indicatif's and tokio's
/// averages): given here, the loader maps no `libm` at each start (its ifunc resolvers were 2%
/// of a listing's samples). See ARCHITECTURE.md, "Start-up".
#[cfg(target_env = "gnu")]
#[unsafe(no_mangle)]
extern "C" fn pow(base: f64, exponent: f64) -> f64 {
    libm::pow(base, exponent)
}
