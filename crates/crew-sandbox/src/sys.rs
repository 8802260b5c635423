//! The system calls the warden and its agent's process make before exec (`spawn::warden`,
//! `sandbox::enter`), each in a function of its own with the one unsafe operation it needs and
//! why that operation is sound. None allocates; all are async-signal-safe (what glibc's
//! wrappers are), so they may run before `main`, between fork and exec, and in a signal
//! handler.
#![allow(unsafe_code)]
#![deny(
    unsafe_op_in_unsafe_fn,
    clippy::undocumented_unsafe_blocks,
    clippy::multiple_unsafe_ops_per_block
)]

use std::ffi::CStr;

use libc::{c_int, c_ulong, pid_t};

/// Sets this process's soft limit on open files to `limit`, its hard limit as it is: 0, or -1
/// with `errno` set.
pub(crate) fn set_open_files_soft(limit: u64) -> c_int {
    let mut current = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `getrlimit` writes one `rlimit` into the one it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut current) } != 0 {
        return -1;
    }
    let wanted = libc::rlimit {
        rlim_cur: limit.min(current.rlim_max),
        rlim_max: current.rlim_max,
    };
    // SAFETY: `setrlimit` reads the one `rlimit` it is given.
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &wanted) }
}

/// This thread's `errno`.
pub(crate) fn errno() -> c_int {
    // SAFETY: no precondition; it returns this thread's errno slot.
    let slot = unsafe { libc::__errno_location() };
    // SAFETY: the slot is valid and aligned for the thread's whole life.
    unsafe { *slot }
}

/// Sets this thread's `errno`.
pub(crate) fn set_errno(value: c_int) {
    // SAFETY: no precondition; it returns this thread's errno slot.
    let slot = unsafe { libc::__errno_location() };
    // SAFETY: the slot is valid and aligned for the thread's whole life.
    unsafe { *slot = value };
}

/// `write(2)` of `bytes`.
pub(crate) fn write(fd: c_int, bytes: &[u8]) -> isize {
    // SAFETY: reads `bytes.len()` bytes of a live slice.
    unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) }
}

/// `read(2)` into `buffer`.
pub(crate) fn read(fd: c_int, buffer: &mut [u8]) -> isize {
    // SAFETY: writes at most `buffer.len()` bytes of a live, exclusive slice.
    unsafe { libc::read(fd, buffer.as_mut_ptr().cast(), buffer.len()) }
}

/// `_exit(2)`: ends the process at once, running nothing of Rust's or the C library's.
pub(crate) fn exit(code: c_int) -> ! {
    // SAFETY: no precondition.
    unsafe { libc::_exit(code) }
}

/// This process's id.
pub(crate) fn getpid() -> pid_t {
    // SAFETY: no precondition.
    unsafe { libc::getpid() }
}

/// The parent's id.
pub(crate) fn getppid() -> pid_t {
    // SAFETY: no precondition.
    unsafe { libc::getppid() }
}

/// This process's group.
pub(crate) fn getpgrp() -> pid_t {
    // SAFETY: no precondition.
    unsafe { libc::getpgrp() }
}

/// `kill(2)`.
pub(crate) fn kill(pid: pid_t, signal: c_int) -> c_int {
    // SAFETY: no memory precondition; which process it reaches is the caller's choice.
    unsafe { libc::kill(pid, signal) }
}

/// `open(2)` of `path`.
pub(crate) fn open(path: &CStr, flags: c_int) -> c_int {
    // SAFETY: `path` is NUL-terminated and outlives the call.
    unsafe { libc::open(path.as_ptr(), flags) }
}

/// `close(2)`.
pub(crate) fn close(fd: c_int) -> c_int {
    // SAFETY: no memory precondition; the callers close only descriptors they own.
    unsafe { libc::close(fd) }
}

/// Closes the descriptors from `first` to `last`, both included.
pub(crate) fn close_range(first: u32, last: u32) {
    // SAFETY: no memory precondition; only for a process about to exec or never to return,
    // whose descriptors nothing else uses.
    unsafe { libc::syscall(libc::SYS_close_range, first, last, 0u32) };
}

/// `dup2(2)`: `fd` copied onto `target` (closing what `target` was), close-on-exec off.
pub(crate) fn dup_onto(fd: c_int, target: c_int) -> c_int {
    // SAFETY: no memory precondition; only for a process that owns both numbers.
    unsafe { libc::dup2(fd, target) }
}

/// A copy of `fd` at the lowest free number from `lowest` up, close-on-exec.
pub(crate) fn dup_from(fd: c_int, lowest: c_int) -> c_int {
    // SAFETY: no memory precondition; the copy is a new descriptor of the caller's.
    unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, lowest) }
}

/// Makes this process the leader of a process group of its own.
pub(crate) fn lead_own_group() -> c_int {
    // SAFETY: no memory precondition.
    unsafe { libc::setpgid(0, 0) }
}

/// A fork whose child is this process's parent's child, not its own (`CLONE_PARENT`): 0 in
/// the child, the child's pid in the parent, -1 with `errno` set.
///
/// Only for a process with one thread, whose child runs nothing but system calls.
pub(crate) fn fork_sibling() -> pid_t {
    let flags = libc::CLONE_PARENT as libc::c_ulong;
    // SAFETY: `clone` without a new stack or any pointer argument is a fork; the parent's
    // exit signal is inherited with CLONE_PARENT. The caller has one thread, so the child's
    // copy of the C library's state is consistent.
    let pid = unsafe { libc::syscall(libc::SYS_clone, flags, 0usize, 0usize, 0usize, 0usize) };
    pid as pid_t
}

/// `prctl(2)` with one integer argument.
pub(crate) fn prctl(option: c_int, argument: c_ulong) -> c_int {
    // SAFETY: the options used take an integer, not a pointer.
    unsafe { libc::prctl(option, argument, 0, 0, 0) }
}

/// Names the calling thread (`PR_SET_NAME`).
pub(crate) fn set_name(name: &CStr) {
    // SAFETY: `name` is NUL-terminated and outlives the call; the kernel copies it.
    unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr(), 0, 0, 0) };
}

/// `pipe2(2)`.
pub(crate) fn pipe2(ends: &mut [c_int; 2], flags: c_int) -> c_int {
    // SAFETY: writes two descriptors into an exclusive array of two.
    unsafe { libc::pipe2(ends.as_mut_ptr(), flags) }
}

/// Sets `signal`'s disposition to `handler` (`SIG_IGN`, `SIG_DFL`).
pub(crate) fn set_disposition(signal: c_int, handler: libc::sighandler_t) {
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
pub(crate) fn unblock_all_signals() {
    let set = empty_set();
    // SAFETY: reads the set; no old set is asked for.
    unsafe { libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut()) };
}

/// Runs `handler` on `signal`.
pub(crate) fn on_signal(signal: c_int, handler: extern "C" fn(c_int)) {
    // SAFETY: an all-zero `sigaction` is a valid value: no flags, no restorer.
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    action.sa_sigaction = handler as libc::sighandler_t;
    action.sa_mask = empty_set();
    // SAFETY: reads the action; no old one is asked for. The handler is async-signal-safe.
    unsafe { libc::sigaction(signal, &action, std::ptr::null_mut()) };
}

/// `waitpid(2)`.
pub(crate) fn waitpid(pid: pid_t, status: &mut c_int, flags: c_int) -> pid_t {
    // SAFETY: writes the status into an exclusive integer.
    unsafe { libc::waitpid(pid, status, flags) }
}

/// Whether a child of this process has exited and waits to be reaped, without reaping it;
/// `Err(errno)` when asking failed (`ECHILD`: there is no child at all).
pub(crate) fn child_exited() -> Result<(), c_int> {
    // SAFETY: an all-zero `siginfo_t` is a valid value to be written over.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    let flags = libc::WEXITED | libc::WNOHANG | libc::WNOWAIT;
    // SAFETY: writes into an exclusive `siginfo_t`.
    let asked = unsafe { libc::waitid(libc::P_ALL, 0, &mut info, flags) };
    if asked < 0 { Err(errno()) } else { Ok(()) }
}

/// `getdents64(2)` into `buffer`.
pub(crate) fn getdents64(fd: c_int, buffer: &mut [u8]) -> isize {
    // SAFETY: writes at most `buffer.len()` bytes of a live, exclusive slice.
    let filled =
        unsafe { libc::syscall(libc::SYS_getdents64, fd, buffer.as_mut_ptr(), buffer.len()) };
    filled as isize
}

/// The size of the file `fd`.
pub(crate) fn file_size(fd: c_int) -> Option<usize> {
    // SAFETY: an all-zero `stat` is a valid value to be written over.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: writes into an exclusive `stat`.
    if unsafe { libc::fstat(fd, &mut stat) } != 0 {
        return None;
    }
    usize::try_from(stat.st_size).ok()
}

/// Maps `size` bytes of the file `fd` read-only, for the rest of the process's life.
pub(crate) fn map_file(fd: c_int, size: usize) -> Option<&'static [u8]> {
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
pub(crate) fn map_anonymous(len: usize) -> Option<*mut u8> {
    let protection = libc::PROT_READ | libc::PROT_WRITE;
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
    // SAFETY: a new mapping the kernel places; nothing else is touched.
    let mapped = unsafe { libc::mmap(std::ptr::null_mut(), len, protection, flags, -1, 0) };
    (mapped != libc::MAP_FAILED).then(|| mapped.cast::<u8>())
}

/// This process's user id.
pub(crate) fn getuid() -> libc::uid_t {
    // SAFETY: no precondition.
    unsafe { libc::getuid() }
}

/// This process's group id.
pub(crate) fn getgid() -> libc::gid_t {
    // SAFETY: no precondition.
    unsafe { libc::getgid() }
}

/// `unshare(2)`.
pub(crate) fn unshare(flags: c_int) -> c_int {
    // SAFETY: no memory precondition; the namespaces are this process's own.
    unsafe { libc::unshare(flags) }
}

/// `setns(2)`: joins the namespace `fd` refers to, of type `nstype` (0 for any).
pub(crate) fn setns(fd: c_int, nstype: c_int) -> c_int {
    // SAFETY: no memory precondition; the namespaces changed are this thread's own.
    unsafe { libc::setns(fd, nstype) }
}

/// `mount(2)`, each string NUL-terminated (or absent).
pub(crate) fn mount(
    source: Option<&CStr>,
    target: &CStr,
    fstype: Option<&CStr>,
    flags: libc::c_ulong,
    data: Option<&CStr>,
) -> c_int {
    let pointer = |text: Option<&CStr>| text.map_or(std::ptr::null(), CStr::as_ptr);
    // SAFETY: every pointer is null or a NUL-terminated string alive for the call.
    unsafe {
        libc::mount(
            pointer(source),
            target.as_ptr(),
            pointer(fstype),
            flags,
            pointer(data).cast(),
        )
    }
}

/// `struct mount_attr` of `mount_setattr(2)`.
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// `mount_setattr(2)` of the mount at `path` (and, with `AT_RECURSIVE` in `flags`, of every
/// mount beneath it): the attributes `set` set, `clear` cleared.
fn set_mount_attributes(path: &CStr, flags: libc::c_uint, set: u64, clear: u64) -> c_int {
    let attr = MountAttr {
        attr_set: set,
        attr_clr: clear,
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: `path` is NUL-terminated; the kernel reads `attr`, of the size given.
    let done = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            path.as_ptr(),
            flags,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    done as c_int
}

const MOUNT_ATTR_RDONLY: u64 = 0x1;

/// Marks the mount at `path`, and every mount beneath it, read-only.
pub(crate) fn make_read_only(path: &CStr) -> c_int {
    set_mount_attributes(
        path,
        libc::AT_RECURSIVE as libc::c_uint,
        MOUNT_ATTR_RDONLY,
        0,
    )
}

/// The addresses of this machine's interfaces, every family crew reaches (`getifaddrs(3)`);
/// none when they cannot be read. Not async-signal-safe (the C library allocates the list).
pub(crate) fn own_addresses() -> Vec<std::net::IpAddr> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: the C library writes the head of a list it allocated into `list`.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return Vec::new();
    }
    let mut found = Vec::new();
    let mut entry = list;
    while !entry.is_null() {
        // SAFETY: `entry` is an element of the list, alive until `freeifaddrs` below.
        let ifaddr = unsafe { &*entry };
        let address = ifaddr.ifa_addr;
        if !address.is_null() {
            // SAFETY: a non-null `ifa_addr` points at a socket address of its family.
            let family = c_int::from(unsafe { (*address).sa_family });
            if family == libc::AF_INET {
                // SAFETY: an `AF_INET` address is a `sockaddr_in`.
                let v4 = unsafe { &*address.cast::<libc::sockaddr_in>() };
                found.push(std::net::IpAddr::from(
                    u32::from_be(v4.sin_addr.s_addr).to_be_bytes(),
                ));
            } else if family == libc::AF_INET6 {
                // SAFETY: an `AF_INET6` address is a `sockaddr_in6`.
                let v6 = unsafe { &*address.cast::<libc::sockaddr_in6>() };
                found.push(std::net::IpAddr::from(v6.sin6_addr.s6_addr));
            }
        }
        entry = ifaddr.ifa_next;
    }
    // SAFETY: the list `getifaddrs` gave, freed once, nothing of it kept.
    unsafe { libc::freeifaddrs(list) };
    found
}

/// `Ok` when a system call answered 0, else the error it left in `errno`.
pub(crate) fn zero_or_error(answer: c_int) -> std::io::Result<()> {
    if answer == 0 {
        Ok(())
    } else {
        Err(std::io::Error::from_raw_os_error(errno()))
    }
}

/// A new, empty tmpfs of 4 KiB, mounted nowhere (`fsopen`, `fsconfig`, `fsmount`): a
/// descriptor of its root, or -1 with `errno` set (a kernel before 5.2, or one that refuses).
pub(crate) fn detached_tmpfs() -> c_int {
    // SAFETY: the name is NUL-terminated; no other memory argument.
    let context =
        unsafe { libc::syscall(libc::SYS_fsopen, c"tmpfs".as_ptr(), FSOPEN_CLOEXEC) } as c_int;
    if context < 0 {
        return -1;
    }
    // SAFETY: the key and value are NUL-terminated strings alive for the call.
    let sized = unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            context,
            FSCONFIG_SET_STRING,
            c"size".as_ptr(),
            c"4k".as_ptr(),
            0,
        )
    };
    // SAFETY: no memory argument (key and value null, as `FSCONFIG_CMD_CREATE` takes them).
    let made = sized == 0
        && unsafe {
            libc::syscall(
                libc::SYS_fsconfig,
                context,
                FSCONFIG_CMD_CREATE,
                std::ptr::null::<libc::c_char>(),
                std::ptr::null::<libc::c_void>(),
                0,
            )
        } == 0;
    let root = if made {
        // SAFETY: no memory argument.
        let root = unsafe {
            libc::syscall(
                libc::SYS_fsmount,
                context,
                FSMOUNT_CLOEXEC,
                MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC,
            )
        };
        root as c_int
    } else {
        -1
    };
    let saved = errno();
    close(context);
    set_errno(saved);
    root
}

/// Makes the empty file `name` in the directory `dir` (`openat(2)` with `O_CREAT | O_EXCL`,
/// closed at once).
pub(crate) fn make_empty_file(dir: c_int, name: &CStr) -> c_int {
    // SAFETY: `name` is NUL-terminated.
    let fd = unsafe {
        libc::openat(
            dir,
            name.as_ptr(),
            libc::O_CREAT | libc::O_EXCL | libc::O_RDONLY | libc::O_CLOEXEC,
            0o444 as libc::c_uint,
        )
    };
    if fd < 0 {
        return -1;
    }
    close(fd);
    0
}

/// Binds `name` of the directory `dir` (a file of a detached mount will do) onto `target`:
/// `open_tree(2)` with `OPEN_TREE_CLONE`, then `move_mount(2)`.
pub(crate) fn bind_beneath(dir: c_int, name: &CStr, target: &CStr) -> c_int {
    // SAFETY: `name` is NUL-terminated.
    let tree = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            dir,
            name.as_ptr(),
            OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC,
        )
    } as c_int;
    if tree < 0 {
        return -1;
    }
    // SAFETY: both paths are NUL-terminated strings alive for the call.
    let moved = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree,
            c"".as_ptr(),
            libc::AT_FDCWD,
            target.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    } as c_int;
    let saved = errno();
    close(tree);
    set_errno(saved);
    moved
}

/// A detached copy of the tree at `name` beneath the directory `dir`, with every mount
/// beneath it (`open_tree(2)` with `OPEN_TREE_CLONE | AT_RECURSIVE`, a link at its end
/// followed): its descriptor, or -1 with `errno` set.
pub(crate) fn clone_tree(dir: c_int, name: &CStr) -> c_int {
    // SAFETY: `name` is NUL-terminated.
    unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            dir,
            name.as_ptr(),
            OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | libc::AT_RECURSIVE as libc::c_uint,
        ) as c_int
    }
}

/// Attaches the detached tree `tree` at `name` beneath the directory `dir` (`move_mount(2)`).
pub(crate) fn attach_tree(tree: c_int, dir: c_int, name: &CStr) -> c_int {
    // SAFETY: both paths are NUL-terminated strings alive for the call.
    unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree,
            c"".as_ptr(),
            dir,
            name.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        ) as c_int
    }
}

/// Makes the directory `name` beneath the directory `dir` (`mkdirat(2)`).
pub(crate) fn make_dir(dir: c_int, name: &CStr, mode: libc::mode_t) -> c_int {
    // SAFETY: `name` is NUL-terminated.
    unsafe { libc::mkdirat(dir, name.as_ptr(), mode) }
}

/// Makes the link `name` beneath the directory `dir`, leading to `target` (`symlinkat(2)`).
pub(crate) fn make_link(target: &CStr, dir: c_int, name: &CStr) -> c_int {
    // SAFETY: both are NUL-terminated.
    unsafe { libc::symlinkat(target.as_ptr(), dir, name.as_ptr()) }
}

// The new mount API's constants (linux/mount.h), which the libc crate gives only in part.
const FSOPEN_CLOEXEC: libc::c_uint = 0x1;
const FSCONFIG_SET_STRING: libc::c_uint = 1;
const FSCONFIG_CMD_CREATE: libc::c_uint = 6;
const FSMOUNT_CLOEXEC: libc::c_uint = 0x1;
const MOUNT_ATTR_NOSUID: libc::c_uint = 0x2;
const MOUNT_ATTR_NODEV: libc::c_uint = 0x4;
const MOUNT_ATTR_NOEXEC: libc::c_uint = 0x8;
const OPEN_TREE_CLONE: libc::c_uint = 0x1;
const OPEN_TREE_CLOEXEC: libc::c_uint = libc::O_CLOEXEC as libc::c_uint;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;

/// Marks the mount at `path` (only that one) writable again.
pub(crate) fn make_writable(path: &CStr) -> c_int {
    set_mount_attributes(path, 0, 0, MOUNT_ATTR_RDONLY)
}

/// The `getcwd` system call into `buffer` (the C library's may allocate): the path's length
/// with its NUL, or `None` (too long, or a directory no longer reachable from the root).
pub(crate) fn current_dir(buffer: &mut [u8]) -> Option<usize> {
    // SAFETY: the kernel writes at most `buffer.len()` bytes into it.
    let length = unsafe { libc::syscall(libc::SYS_getcwd, buffer.as_mut_ptr(), buffer.len()) };
    usize::try_from(length)
        .ok()
        .filter(|length| *length > 1 && buffer.first() == Some(&b'/'))
}

/// `fchdir(2)`: into the directory `fd` holds (an `O_PATH` handle will do).
pub(crate) fn change_dir_to(fd: c_int) -> c_int {
    // SAFETY: no memory argument.
    unsafe { libc::fchdir(fd) }
}

/// `chdir(2)`.
pub(crate) fn change_dir(path: &CStr) -> c_int {
    // SAFETY: `path` is NUL-terminated and alive for the call.
    unsafe { libc::chdir(path.as_ptr()) }
}

/// `socket(2)`.
pub(crate) fn socket(domain: c_int, kind: c_int) -> c_int {
    // SAFETY: no memory precondition.
    unsafe { libc::socket(domain, kind, 0) }
}

/// `bind(2)` to the address `address` holds, of `length` bytes.
pub(crate) fn bind<T>(fd: c_int, address: &T, length: usize) -> c_int {
    if length > std::mem::size_of::<T>() {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: the kernel reads at most `length` bytes of `address`, which holds that many.
    unsafe { libc::bind(fd, (address as *const T).cast(), length as libc::socklen_t) }
}

/// `listen(2)`.
pub(crate) fn listen(fd: c_int, backlog: c_int) -> c_int {
    // SAFETY: no memory precondition.
    unsafe { libc::listen(fd, backlog) }
}

/// A plain-data C structure, all zero: a valid value for the structures used here (socket
/// addresses, an interface request, a message header).
pub(crate) fn zeroed<T: Zeroable>() -> T {
    // SAFETY: `T` is one of the plain-data structures for which all-zero bytes are valid.
    unsafe { std::mem::zeroed() }
}

/// Plain-data C structures whose all-zero bytes are a valid value.
pub(crate) trait Zeroable {}
impl Zeroable for libc::sockaddr_un {}
impl Zeroable for libc::sockaddr_in {}
impl Zeroable for libc::ifreq {}
impl Zeroable for libc::msghdr {}
impl Zeroable for libc::cmsghdr {}

/// `ioctl(2)` with an interface request (`SIOCGIFFLAGS`, `SIOCSIFFLAGS`).
pub(crate) fn ioctl_interface(
    fd: c_int,
    request: libc::Ioctl,
    interface: &mut libc::ifreq,
) -> c_int {
    // SAFETY: these requests read and write only the `ifreq` they are given.
    unsafe { libc::ioctl(fd, request, interface as *mut libc::ifreq) }
}

/// `ioctl(fd, TIOCNOTTY)`: this process (not a session's leader) gives up its controlling
/// terminal, which `fd` is open on; its session and the terminal's other processes keep it.
pub(crate) fn give_up_terminal(fd: c_int) -> c_int {
    // SAFETY: the request takes no argument and touches no memory of the caller's.
    unsafe { libc::ioctl(fd, libc::TIOCNOTTY) }
}

/// `sendmsg(2)`.
///
/// # Safety
/// Every pointer in `message` points at memory alive and sized as it says.
pub(crate) unsafe fn sendmsg(fd: c_int, message: &libc::msghdr, flags: c_int) -> isize {
    // SAFETY: by the caller's contract.
    unsafe { libc::sendmsg(fd, message, flags) }
}

/// `recvmsg(2)`.
///
/// # Safety
/// Every pointer in `message` points at writable memory alive and sized as it says.
pub(crate) unsafe fn recvmsg(fd: c_int, message: &mut libc::msghdr, flags: c_int) -> isize {
    // SAFETY: by the caller's contract.
    unsafe { libc::recvmsg(fd, message, flags) }
}

/// `struct landlock_path_beneath_attr`, packed as the kernel declares it.
#[repr(C, packed)]
struct PathBeneathAttr {
    allowed_access: u64,
    parent_fd: i32,
}

/// Adds to the Landlock `ruleset` a rule that `access` is allowed beneath the directory or
/// file `parent` (an `O_PATH` descriptor).
pub(crate) fn landlock_add_path_rule(ruleset: c_int, parent: c_int, access: u64) -> c_int {
    const LANDLOCK_RULE_PATH_BENEATH: c_int = 1;
    let attr = PathBeneathAttr {
        allowed_access: access,
        parent_fd: parent,
    };
    // SAFETY: the kernel reads the attribute of the kind named.
    let added = unsafe {
        libc::syscall(
            libc::SYS_landlock_add_rule,
            ruleset,
            LANDLOCK_RULE_PATH_BENEATH,
            &attr as *const PathBeneathAttr,
            0u32,
        )
    };
    added as c_int
}

/// Confines this process with the Landlock `ruleset` (after `PR_SET_NO_NEW_PRIVS`).
pub(crate) fn landlock_restrict_self(ruleset: c_int) -> c_int {
    // SAFETY: no memory precondition; the confinement is this process's own.
    let done = unsafe { libc::syscall(libc::SYS_landlock_restrict_self, ruleset, 0u32) };
    done as c_int
}

/// Installs the seccomp filter `program` on this process and everything it starts (after
/// `PR_SET_NO_NEW_PRIVS`).
pub(crate) fn seccomp_filter(program: &libc::sock_fprog) -> c_int {
    const SECCOMP_SET_MODE_FILTER: c_int = 1;
    // SAFETY: the kernel copies the program `program` points at, whose filter lives as long
    // as the borrow; nothing is written.
    let done = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            SECCOMP_SET_MODE_FILTER,
            0u32,
            program as *const libc::sock_fprog,
        )
    };
    done as c_int
}

/// `struct __user_cap_header_struct`.
#[repr(C)]
struct CapabilityHeader {
    version: u32,
    pid: c_int,
}

/// `struct __user_cap_data_struct`.
#[repr(C)]
#[derive(Clone, Copy)]
struct CapabilityData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// `_LINUX_CAPABILITY_VERSION_3`: two data structs, 64 capabilities.
const CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// Whether this process holds `capability` in its effective set.
fn holds_capability(capability: u32) -> bool {
    let mut header = CapabilityHeader {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapabilityData {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: the kernel reads the header and writes the two data structs version 3 asks for.
    let read = unsafe {
        libc::syscall(
            libc::SYS_capget,
            &mut header as *mut CapabilityHeader,
            data.as_mut_ptr(),
        )
    };
    let (slot, bit) = ((capability / 32) as usize, capability % 32);
    read == 0 && data[slot].effective & (1 << bit) != 0
}

/// Leaves this process, and what it executes, no capability: its sets emptied, its ambient
/// set cleared, and the secure bits that make root an ordinary user at exec set and locked
/// (`SECBIT_NOROOT`: an exec as root, of its namespace or with none, gains nothing; no
/// ambient capability can be raised again; none of these bits can be changed back). Under
/// `PR_SET_NO_NEW_PRIVS`, which a confined agent's process always sets, the kernel already
/// keeps an exec from gaining a capability its process did not hold (a file's capabilities
/// and set-user-id are not honoured); the secure bits say so a second time, for the cost of
/// one call. Emptying the bounding set instead, one capability at a time, took 41 calls that
/// each commit new credentials: about 60 µs of every agent's start here, against about 2 µs.
/// 0, or -1 with `errno` set. A process without `CAP_SETPCAP` (an ordinary user's, outside a
/// user namespace) has none to drop, and none an exec would give it under
/// `PR_SET_NO_NEW_PRIVS`: nothing is done.
pub(crate) fn drop_capabilities() -> c_int {
    const CAP_SETPCAP: u32 = 8;
    if !holds_capability(CAP_SETPCAP) {
        return 0;
    }
    const NOT_ROOT_AT_EXEC: c_ulong = (libc::SECBIT_NOROOT
        | libc::SECBIT_NOROOT_LOCKED
        | libc::SECBIT_NO_SETUID_FIXUP_LOCKED
        | libc::SECBIT_KEEP_CAPS_LOCKED
        | libc::SECBIT_NO_CAP_AMBIENT_RAISE
        | libc::SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED)
        as c_ulong;
    // SAFETY: integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_SECUREBITS, NOT_ROOT_AT_EXEC, 0, 0, 0) } != 0 {
        return -1;
    }
    // SAFETY: integer arguments only.
    let cleared = unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as c_ulong,
            0,
            0,
            0,
        )
    };
    if cleared != 0 {
        return -1;
    }
    let header = CapabilityHeader {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    let none = [CapabilityData {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: the kernel reads the header and the two data structs version 3 names.
    let set = unsafe {
        libc::syscall(
            libc::SYS_capset,
            &header as *const CapabilityHeader,
            none.as_ptr(),
        )
    };
    set as c_int
}
