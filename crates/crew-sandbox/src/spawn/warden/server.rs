//! The warden server: one small process per spawner thread that forks each warden, so that a
//! warden's start is a fork of a process of a few pages, not an exec of the host's executable
//! (the kernel mapping it, the loader, the C library's start: about half a millisecond of CPU
//! at every agent's start, here).
//!
//! The host starts it once, as it started every warden before: its own executable again
//! (`/proc/self/exe`), caught before `main` when its first argument is [`SERVER_ARG`], with an
//! empty environment and one end of a `SOCK_SEQPACKET` socket pair. For each warden the host
//! sends one message: the descriptors the warden is to hold, with the number each takes (its
//! stdio, then [`ARGUMENTS_FD`], a memory file holding its directory's descriptor and its
//! arguments, then the ones the arguments name). The server forks with `CLONE_PARENT`, so the warden is the
//! host's child exactly as a warden the host started itself (its parent the spawner thread,
//! whose death signals it; the host reaps it). The child puts its descriptors where they
//! belong, says its pid on its report pipe, leads a process group of its own, goes to its
//! directory and becomes the warden, as an exec of the executable would have. The server
//! answers nothing on its socket: a fork that failed is said on the report pipe instead.
//!
//! The server has one thread and runs before `main`, with raw system calls, as the warden
//! does: its forks copy nothing of Rust's runtime. It dies with the spawner thread (its
//! parent-death signal is SIGKILL) or when the host closes its end of the socket.

use std::ffi::CStr;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

use crate::sys;

/// The first argument that makes a start of the executable a warden server:
/// `crew-wardens SERVER_ARG <host pid> <socket fd>`.
pub(in crate::spawn) const SERVER_ARG: &CStr = c"--crew-warden-server-v1";

/// The server's arguments, its name included: the last is [`TITLE_ROOM`] spaces.
pub(super) const SERVER_ARGS: usize = 5;

/// The room a forked warden has for its title, as `ps` shows it (`/proc/<pid>/cmdline`, read
/// from the memory its arguments lie in, which a fork shares with the server): the server's
/// last argument, these many spaces, that the server blanks and a warden writes over.
pub(in crate::spawn) const TITLE_ROOM: usize = 120;

/// Where the server's arguments lie, one after the other, and how many bytes they take: what
/// a forked warden writes its title over. Null where they do not lie so.
static TITLE: AtomicPtr<u8> = AtomicPtr::new(std::ptr::null_mut());
static TITLE_LEN: AtomicUsize = AtomicUsize::new(0);

/// The server's name (its `argv[0]` and its thread's name): not the warden's, so that a
/// connection is never traced to it.
pub(in crate::spawn) const SERVER_NAME: &CStr = c"crew-wardens";

/// Where a warden finds the memory file of its directory and arguments: the number of its
/// directory's handle (empty: the host's directory), then each argument (`argv[0]` first),
/// each ended by a NUL.
pub(in crate::spawn) const ARGUMENTS_FD: libc::c_int = 3;

/// Where a warden finds its report pipe (its first passed descriptor). The first word on it is
/// the warden's pid, which the warden writes itself, or, when the server could not fork it,
/// the negated error: a server that dies mid-request leaves no warden the host does not know.
pub(in crate::spawn) const REPORT_FD: libc::c_int = ARGUMENTS_FD + 1;

/// The most descriptors one warden is given: its stdio, its arguments, its report pipe,
/// environment, ruleset, namespace plan, user namespace, channel, its cgroup's files and its
/// directory.
pub(in crate::spawn) const MAX_PASSED: usize = 11 + super::MAX_CGROUP_FILES;

/// The lowest number a forked warden moves what it received to before putting each where it
/// belongs: above every number it is given.
const ABOVE_PASSED: libc::c_int = MAX_PASSED as libc::c_int + 1;

/// The control message of up to [`MAX_PASSED`] descriptors (`SCM_RIGHTS`), laid out as
/// `CMSG_DATA` finds them on Linux: right after the header, which is a multiple of its
/// alignment.
#[repr(C)]
pub(in crate::spawn) struct Descriptors {
    pub(in crate::spawn) header: libc::cmsghdr,
    pub(in crate::spawn) fds: [libc::c_int; MAX_PASSED],
}

/// `CMSG_LEN` of `count` descriptors.
pub(in crate::spawn) const fn rights_len(count: usize) -> usize {
    std::mem::size_of::<libc::cmsghdr>() + count * std::mem::size_of::<libc::c_int>()
}

// The layout above is the one the kernel reads and writes.
// SAFETY: `CMSG_LEN` and `CMSG_SPACE` only compute sizes.
const _: () = assert!(unsafe { libc::CMSG_LEN(4) } as usize == rights_len(1));
const _: () = assert!(std::mem::offset_of!(Descriptors, fds) == rights_len(0));
// SAFETY: as above.
const _: () = assert!(
    std::mem::size_of::<Descriptors>()
        <= unsafe { libc::CMSG_SPACE((MAX_PASSED * 4) as libc::c_uint) } as usize
);

/// The server, from its arguments to its end.
///
/// # Safety
/// Only for the executable's entry, before `main`, with the server's own `argv` of
/// [`SERVER_ARGS`] arguments.
pub(super) unsafe fn become_server(argv: *const *const libc::c_char) -> ! {
    // SAFETY: the caller counted SERVER_ARGS arguments.
    let host = unsafe { super::argument(argv, 2) };
    // SAFETY: as above.
    let socket = unsafe { super::argument(argv, 3) };
    let (Some(host_pid), Some(socket)) = (super::parse_number(host), super::parse_number(socket))
    else {
        super::fail(c"bad warden server arguments")
    };
    super::close_all_but([socket; 6 + super::MAX_CGROUP_FILES]);
    sys::unblock_all_signals();
    if sys::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
        super::fail(c"cannot ask for a signal at the host's death");
    }
    // The host may have died before the signal was armed.
    if sys::getppid() != host_pid {
        sys::exit(0);
    }
    sys::set_name(SERVER_NAME);
    // SAFETY: the caller counted SERVER_ARGS arguments.
    unsafe { keep_title_room(argv) };
    loop {
        let mut targets = [0u8; MAX_PASSED];
        let mut control = Descriptors {
            header: sys::zeroed(),
            fds: [-1; MAX_PASSED],
        };
        let mut data = libc::iovec {
            iov_base: targets.as_mut_ptr().cast(),
            iov_len: MAX_PASSED,
        };
        let mut message: libc::msghdr = sys::zeroed();
        message.msg_iov = &mut data;
        message.msg_iovlen = 1;
        message.msg_control = (&mut control as *mut Descriptors).cast();
        message.msg_controllen = std::mem::size_of::<Descriptors>() as _;
        // SAFETY: the message's buffers are this frame's, writable and sized as it says.
        let received = unsafe { sys::recvmsg(socket, &mut message, libc::MSG_CMSG_CLOEXEC) };
        if received < 0 && sys::errno() == libc::EINTR {
            continue;
        }
        // The host closed its end, or the socket failed: no warden to start any more.
        if received <= 0 {
            sys::exit(0);
        }
        let count = usize::try_from(received).unwrap_or(0);
        let header = &control.header;
        let complete = message.msg_flags & (libc::MSG_CTRUNC | libc::MSG_TRUNC) == 0
            && message.msg_controllen >= rights_len(count)
            && header.cmsg_level == libc::SOL_SOCKET
            && header.cmsg_type == libc::SCM_RIGHTS
            && header.cmsg_len == rights_len(count);
        let fds = &control.fds[..count.min(MAX_PASSED)];
        let pid = if complete {
            sys::fork_sibling()
        } else {
            sys::set_errno(libc::EINVAL);
            -1
        };
        if pid == 0 {
            sys::close(socket);
            become_forked_warden(fds, &targets[..count])
        }
        if pid < 0 {
            let error = -sys::errno();
            let report = targets[..count]
                .iter()
                .position(|&target| libc::c_int::from(target) == REPORT_FD);
            if let Some(&report) = report.and_then(|index| fds.get(index)) {
                sys::write(report, &error.to_ne_bytes());
            }
        }
        // The warden's now; the host sees its report pipe end when the warden's copy does.
        for &fd in fds {
            if fd >= 0 {
                sys::close(fd);
            }
        }
    }
}

/// A warden just forked by the server: its descriptors where the host asked, a process group
/// of its own, its directory; then the warden itself, with the arguments of its memory file.
fn become_forked_warden(fds: &[libc::c_int], targets: &[u8]) -> ! {
    // Out of the way of every number given first, then each onto its own (which clears its
    // close-on-exec flag, as the warden's descriptors had when the host started it).
    let mut moved = [-1; MAX_PASSED];
    for (slot, &fd) in moved.iter_mut().zip(fds) {
        *slot = sys::dup_from(fd, ABOVE_PASSED);
        if *slot < 0 {
            super::fail(c"cannot take the descriptors of a warden");
        }
    }
    for (&fd, &target) in moved.iter().zip(targets) {
        if sys::dup_onto(fd, libc::c_int::from(target)) < 0 {
            super::fail(c"cannot take the descriptors of a warden");
        }
    }
    sys::close_range(ABOVE_PASSED as u32, u32::MAX);
    // The host learns the warden's pid from the warden itself (see REPORT_FD).
    sys::write(REPORT_FD, &sys::getpid().to_ne_bytes());
    if sys::lead_own_group() != 0 {
        super::fail(c"cannot lead a process group");
    }
    let Some(entries) = super::map_environment(ARGUMENTS_FD) else {
        super::fail(c"cannot read the warden's arguments")
    };
    // Its directory, then its arguments: more than the warden's own, then a null pointer.
    let mut count = 0;
    loop {
        // SAFETY: within the null-terminated array: reads stop at its null pointer.
        let slot = unsafe { entries.add(count) };
        // SAFETY: a valid, aligned slot of that array.
        if unsafe { *slot }.is_null() {
            break;
        }
        count += 1;
    }
    if count <= super::WARDEN_ARGS + 1 {
        super::fail(c"too few warden arguments");
    }
    // SAFETY: more than one entry: the directory, then the warden's argv.
    let argv = unsafe { entries.add(1) };
    // SAFETY: the warden's argv, of more than WARDEN_ARGS arguments (counted above).
    let marker = unsafe { super::argument(argv, super::MARKER_ARG) };
    // SAFETY: as above.
    let program = unsafe { super::argument(argv, super::WARDEN_ARGS) };
    // `crew-warden <agent id> <program>`: which agent a warden in `ps` stands for.
    let agent = marker
        .to_bytes()
        .iter()
        .position(|&byte| byte == b'=')
        .map_or(marker.to_bytes(), |equals| &marker.to_bytes()[equals + 1..]);
    set_title(&[b"crew-warden ", agent, b" ", program.to_bytes()]);
    // SAFETY: the first entry, NUL-terminated, alive as long as the process.
    let directory = unsafe { super::argument(entries, 0) };
    // The number of the directory's handle: entered by it, then closed (the agent never
    // holds it).
    if !directory.is_empty() {
        let handle = super::parse_number(directory).unwrap_or(-1);
        if handle < 0 {
            sys::set_errno(libc::EBADF);
        }
        if handle < 0 || sys::change_dir_to(handle) != 0 {
            // As an exec's would have been: the start fails with the error, reported as the
            // agent's.
            super::report_u32(REPORT_FD, sys::errno() as u32);
            super::fail(c"cannot enter the agent's directory")
        }
        sys::close(handle);
    }
    // SAFETY: the warden's argv: more than WARDEN_ARGS NUL-terminated arguments, then a null
    // pointer, alive as long as the process.
    unsafe { super::become_warden(argv) }
}

/// Notes where the server's arguments lie ([`TITLE`]) when they lie one after the other, as
/// the kernel lays them out, and blanks its last, the room for a forked warden's title.
///
/// # Safety
/// `argv` is the server's own, of [`SERVER_ARGS`] arguments.
unsafe fn keep_title_room(argv: *const *const libc::c_char) {
    // SAFETY: the caller's contract: SERVER_ARGS arguments.
    let first = unsafe { super::argument(argv, 0) };
    let start = first.as_ptr() as usize;
    let mut end = start;
    for index in 0..SERVER_ARGS {
        // SAFETY: as above.
        let argument = unsafe { super::argument(argv, index) };
        if argument.as_ptr() as usize != end {
            return;
        }
        end += argument.to_bytes_with_nul().len();
    }
    TITLE.store(first.as_ptr().cast::<u8>().cast_mut(), Ordering::SeqCst);
    TITLE_LEN.store(end - start, Ordering::SeqCst);
    // SAFETY: as above.
    let room = unsafe { super::argument(argv, SERVER_ARGS - 1) };
    let blank_from = room.as_ptr() as usize - start;
    if let Some(area) = title_area() {
        area[blank_from..].fill(0);
    }
}

/// The memory of the server's arguments, to write a title in: this process's own (a fork's
/// copy of the server's), which nothing else reads or writes but the kernel for `ps`.
fn title_area() -> Option<&'static mut [u8]> {
    let start = TITLE.load(Ordering::SeqCst);
    let len = TITLE_LEN.load(Ordering::SeqCst);
    if start.is_null() || len == 0 {
        return None;
    }
    // SAFETY: `len` writable bytes of this process's argument strings from `start` (checked
    // contiguous by `keep_title_room`), used only here, by the one thread there is, with no
    // other reference to them alive (the `CStr`s of the server's arguments are not kept).
    Some(unsafe { std::slice::from_raw_parts_mut(start, len) })
}

/// Writes `parts` as this process's title (what `ps` shows), cut to the room there is, the
/// rest of the room NULs.
fn set_title(parts: &[&[u8]]) {
    let Some(area) = title_area() else {
        return;
    };
    let room = area.len() - 1;
    let mut written = 0;
    for &byte in parts.iter().flat_map(|part| part.iter()).take(room) {
        area[written] = byte;
        written += 1;
    }
    area[written..].fill(0);
}
