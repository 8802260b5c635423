//! The system calls the warden and its agent's process make before exec, each in a function of
//! its own with the one unsafe operation it needs and why that operation is sound. None
//! allocates; all are async-signal-safe (what glibc's wrappers are), so they may run before
//! `main`, between fork and exec, and in a signal handler.

use std::ffi::CStr;

use libc::{c_int, c_ulong, pid_t};

/// This thread's `errno`.
pub(super) fn errno() -> c_int {
    // SAFETY: no precondition; it returns this thread's errno slot.
    let slot = unsafe { libc::__errno_location() };
    // SAFETY: the slot is valid and aligned for the thread's whole life.
    unsafe { *slot }
}

/// Sets this thread's `errno`.
pub(super) fn set_errno(value: c_int) {
    // SAFETY: no precondition; it returns this thread's errno slot.
    let slot = unsafe { libc::__errno_location() };
    // SAFETY: the slot is valid and aligned for the thread's whole life.
    unsafe { *slot = value };
}

/// `write(2)` of `bytes`.
pub(super) fn write(fd: c_int, bytes: &[u8]) -> isize {
    // SAFETY: reads `bytes.len()` bytes of a live slice.
    unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) }
}

/// `read(2)` into `buffer`.
pub(super) fn read(fd: c_int, buffer: &mut [u8]) -> isize {
    // SAFETY: writes at most `buffer.len()` bytes of a live, exclusive slice.
    unsafe { libc::read(fd, buffer.as_mut_ptr().cast(), buffer.len()) }
}

/// `_exit(2)`: ends the process at once, running nothing of Rust's or the C library's.
pub(super) fn exit(code: c_int) -> ! {
    // SAFETY: no precondition.
    unsafe { libc::_exit(code) }
}

/// This process's id.
pub(super) fn getpid() -> pid_t {
    // SAFETY: no precondition.
    unsafe { libc::getpid() }
}

/// The parent's id.
pub(super) fn getppid() -> pid_t {
    // SAFETY: no precondition.
    unsafe { libc::getppid() }
}

/// This process's group.
pub(super) fn getpgrp() -> pid_t {
    // SAFETY: no precondition.
    unsafe { libc::getpgrp() }
}

/// `kill(2)`.
pub(super) fn kill(pid: pid_t, signal: c_int) -> c_int {
    // SAFETY: no memory precondition; which process it reaches is the caller's choice.
    unsafe { libc::kill(pid, signal) }
}

/// `open(2)` of `path`.
pub(super) fn open(path: &CStr, flags: c_int) -> c_int {
    // SAFETY: `path` is NUL-terminated and outlives the call.
    unsafe { libc::open(path.as_ptr(), flags) }
}

/// `close(2)`.
pub(super) fn close(fd: c_int) -> c_int {
    // SAFETY: no memory precondition; the callers close only descriptors they own.
    unsafe { libc::close(fd) }
}

/// Closes the descriptors from `first` to `last`, both included.
pub(super) fn close_range(first: u32, last: u32) {
    // SAFETY: no memory precondition; only for a process about to exec or never to return,
    // whose descriptors nothing else uses.
    unsafe { libc::syscall(libc::SYS_close_range, first, last, 0u32) };
}

/// `prctl(2)` with one integer argument.
pub(super) fn prctl(option: c_int, argument: c_ulong) -> c_int {
    // SAFETY: the options used take an integer, not a pointer.
    unsafe { libc::prctl(option, argument, 0, 0, 0) }
}

/// Names the calling thread (`PR_SET_NAME`).
pub(super) fn set_name(name: &CStr) {
    // SAFETY: `name` is NUL-terminated and outlives the call; the kernel copies it.
    unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr(), 0, 0, 0) };
}

/// `pipe2(2)`.
pub(super) fn pipe2(ends: &mut [c_int; 2], flags: c_int) -> c_int {
    // SAFETY: writes two descriptors into an exclusive array of two.
    unsafe { libc::pipe2(ends.as_mut_ptr(), flags) }
}

/// Sets `signal`'s disposition to `handler` (`SIG_IGN`, `SIG_DFL`).
pub(super) fn set_disposition(signal: c_int, handler: libc::sighandler_t) {
    // SAFETY: the handlers passed are the constants, never a function pointer.
    unsafe { libc::signal(signal, handler) };
}

/// An empty signal set.
fn empty_set() -> libc::sigset_t {
    // SAFETY: an all-zero `sigset_t` is a valid value, emptied below anyway.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: writes the set it is given.
    unsafe { libc::sigemptyset(&mut set) };
    set
}

/// Unblocks every signal.
pub(super) fn unblock_all_signals() {
    let set = empty_set();
    // SAFETY: reads the set; no old set is asked for.
    unsafe { libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut()) };
}

/// Runs `handler` on `signal`.
pub(super) fn on_signal(signal: c_int, handler: extern "C" fn(c_int)) {
    // SAFETY: an all-zero `sigaction` is a valid value: no flags, no restorer.
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    action.sa_sigaction = handler as libc::sighandler_t;
    action.sa_mask = empty_set();
    // SAFETY: reads the action; no old one is asked for. The handler is async-signal-safe.
    unsafe { libc::sigaction(signal, &action, std::ptr::null_mut()) };
}

/// `waitpid(2)`.
pub(super) fn waitpid(pid: pid_t, status: &mut c_int, flags: c_int) -> pid_t {
    // SAFETY: writes the status into an exclusive integer.
    unsafe { libc::waitpid(pid, status, flags) }
}

/// Whether a child of this process has exited and waits to be reaped, without reaping it;
/// `Err(errno)` when asking failed (`ECHILD`: there is no child at all).
pub(super) fn child_exited() -> Result<(), c_int> {
    // SAFETY: an all-zero `siginfo_t` is a valid value to be written over.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    let flags = libc::WEXITED | libc::WNOHANG | libc::WNOWAIT;
    // SAFETY: writes into an exclusive `siginfo_t`.
    let asked = unsafe { libc::waitid(libc::P_ALL, 0, &mut info, flags) };
    if asked < 0 { Err(errno()) } else { Ok(()) }
}

/// `getdents64(2)` into `buffer`.
pub(super) fn getdents64(fd: c_int, buffer: &mut [u8]) -> isize {
    // SAFETY: writes at most `buffer.len()` bytes of a live, exclusive slice.
    let filled =
        unsafe { libc::syscall(libc::SYS_getdents64, fd, buffer.as_mut_ptr(), buffer.len()) };
    filled as isize
}

/// The size of the file `fd`.
pub(super) fn file_size(fd: c_int) -> Option<usize> {
    // SAFETY: an all-zero `stat` is a valid value to be written over.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: writes into an exclusive `stat`.
    if unsafe { libc::fstat(fd, &mut stat) } != 0 {
        return None;
    }
    usize::try_from(stat.st_size).ok()
}

/// Maps `size` bytes of the file `fd` read-only, for the rest of the process's life.
pub(super) fn map_file(fd: c_int, size: usize) -> Option<&'static [u8]> {
    let flags = libc::MAP_PRIVATE;
    // SAFETY: a new mapping the kernel places; nothing else is touched.
    let mapped = unsafe { libc::mmap(std::ptr::null_mut(), size, libc::PROT_READ, flags, fd, 0) };
    if mapped == libc::MAP_FAILED {
        return None;
    }
    // SAFETY: `size` readable bytes at `mapped`, never unmapped nor written: valid for
    // `'static`.
    Some(unsafe { std::slice::from_raw_parts(mapped.cast::<u8>(), size) })
}

/// A new zero-filled, writable mapping of `len` bytes, for the rest of the process's life.
pub(super) fn map_anonymous(len: usize) -> Option<*mut u8> {
    let protection = libc::PROT_READ | libc::PROT_WRITE;
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
    // SAFETY: a new mapping the kernel places; nothing else is touched.
    let mapped = unsafe { libc::mmap(std::ptr::null_mut(), len, protection, flags, -1, 0) };
    (mapped != libc::MAP_FAILED).then(|| mapped.cast::<u8>())
}
