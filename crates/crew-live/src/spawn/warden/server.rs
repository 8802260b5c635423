//! The warden server: one small process per spawner thread that forks each warden, so that a
//! warden's start is a fork of a process of a few pages, not an exec of the host's executable
//! (the kernel mapping it, the loader, the C library's start: about half a millisecond of CPU
//! at every agent's start, here).
//!
//! The host starts it once, as it started every warden before: its own executable again
//! (`/proc/self/exe`), caught before `main` when its first argument is [`SERVER_ARG`], with an
//! empty environment and one end of a `SOCK_SEQPACKET` socket pair. For each warden the host
//! sends one message: the descriptors the warden is to hold, with the number each takes (its
//! stdio, then [`ARGUMENTS_FD`], a memory file holding its directory and arguments, then the
//! ones the arguments name). The server forks with `CLONE_PARENT`, so the warden is the
//! host's child exactly as a warden the host started itself (its parent the spawner thread,
//! whose death signals it; the host reaps it). The child puts its descriptors where they
//! belong, says its pid on its report pipe, leads a process group of its own, goes to its
//! directory and becomes the warden, as an exec of the executable would have. The server
//! answers nothing on its socket: a fork that failed is said on the report pipe instead.
//!
//! The confined agents' server also makes the next agent's mount and IPC namespaces ahead of
//! its start (see [`Ahead`]) and gives them to the warden whose request asks for them.
//!
//! The server has one thread and runs before `main`, with raw system calls, as the warden
//! does: its forks copy nothing of Rust's runtime. It dies with the spawner thread (its
//! parent-death signal is SIGKILL) or when the host closes its end of the socket.

use std::ffi::CStr;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

use crate::sys;

/// The first argument that makes a start of the executable a warden server:
/// `crew-wardens SERVER_ARG <host pid> <socket fd> <user namespace fd or -> <ready flags or ->
/// <title room>`.
pub(in crate::spawn) const SERVER_ARG: &CStr = c"--crew-warden-server-v2";

/// The server's arguments, its name included: the last is [`TITLE_ROOM`] spaces.
pub(super) const SERVER_ARGS: usize = 7;

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

/// Where a warden finds the memory file of its directory and arguments: its directory, then
/// each argument (`argv[0]` first), each ended by a NUL.
pub(in crate::spawn) const ARGUMENTS_FD: libc::c_int = 3;

/// Where a warden finds its report pipe (its first passed descriptor). The first word on it is
/// the warden's pid, which the warden writes itself, or, when the server could not fork it,
/// the negated error: a server that dies mid-request leaves no warden the host does not know.
pub(in crate::spawn) const REPORT_FD: libc::c_int = ARGUMENTS_FD + 1;

/// The most descriptors one warden is given: its stdio, its arguments, its report pipe,
/// environment, ruleset, namespace plan, user namespace and channel.
pub(in crate::spawn) const MAX_PASSED: usize = 10;

/// Where a warden finds the mount namespace made ahead of its agent's start, when the server
/// gave it one (see [`crate::sandbox::Ready`]): above every number it is given.
pub(super) const READY_MOUNT_FD: libc::c_int = MAX_PASSED as libc::c_int;

/// Where a warden finds the IPC namespace made with it.
pub(super) const READY_IPC_FD: libc::c_int = READY_MOUNT_FD + 1;

/// The lowest number a forked warden moves what it received to before putting each where it
/// belongs: above every number it is given.
const ABOVE_PASSED: libc::c_int = READY_IPC_FD + 1;

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
    let [host, socket, user, flags] =
        [2, 3, 4, 5].map(|index| unsafe { super::argument(argv, index) });
    let (Some(host_pid), Some(socket)) = (super::parse_number(host), super::parse_number(socket))
    else {
        super::fail(c"bad warden server arguments")
    };
    let user = super::optional_fd(user, c"bad warden server arguments");
    let flags = match flags.to_bytes() {
        b"-" => None,
        _ => super::parse_number(flags)
            .and_then(|flags| u8::try_from(flags).ok())
            .or_else(|| super::fail(c"bad warden server arguments")),
    };
    super::close_all_but([socket, user.unwrap_or(socket)]);
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
    let mut ahead = user
        .zip(flags)
        .and_then(|(user, flags)| Ahead::new(user, flags));
    loop {
        // A request, a namespace made ahead, or a change of the mounts it was made from.
        if let Some(ahead) = &mut ahead {
            ahead.start_making();
        }
        let pollfd = |fd: libc::c_int, events: libc::c_short| libc::pollfd {
            fd,
            events,
            revents: 0,
        };
        let mut polled = [
            pollfd(socket, libc::POLLIN),
            pollfd(ahead.as_ref().map_or(-1, Ahead::answer), libc::POLLIN),
            pollfd(
                ahead.as_ref().map_or(-1, |ahead| ahead.mounts),
                libc::POLLPRI,
            ),
        ];
        if sys::poll(&mut polled, -1) < 0 {
            if sys::errno() == libc::EINTR {
                continue;
            }
            sys::exit(0);
        }
        if let Some(ahead) = &mut ahead {
            if polled[2].revents & (libc::POLLPRI | libc::POLLERR) != 0 {
                ahead.discard();
            }
            if polled[1].revents != 0 {
                ahead.collect();
            }
        }
        if polled[0].revents == 0 {
            continue;
        }
        // The descriptors' numbers, then the flags of the plan the warden's agent would take
        // a ready namespace for (0: none).
        let mut targets = [0u8; MAX_PASSED + 1];
        let mut control = Descriptors {
            header: sys::zeroed(),
            fds: [-1; MAX_PASSED],
        };
        let mut data = libc::iovec {
            iov_base: targets.as_mut_ptr().cast(),
            iov_len: targets.len(),
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
        let count = usize::try_from(received - 1).unwrap_or(0);
        let wants = targets[count];
        let header = &control.header;
        let complete = message.msg_flags & (libc::MSG_CTRUNC | libc::MSG_TRUNC) == 0
            && message.msg_controllen >= rights_len(count)
            && header.cmsg_level == libc::SOL_SOCKET
            && header.cmsg_type == libc::SCM_RIGHTS
            && header.cmsg_len == rights_len(count);
        let fds = &control.fds[..count.min(MAX_PASSED)];
        let ready = match &mut ahead {
            Some(ahead) if complete => ahead.take(wants),
            _ => None,
        };
        let pid = if complete {
            sys::fork_sibling()
        } else {
            sys::set_errno(libc::EINVAL);
            -1
        };
        if pid == 0 {
            sys::close(socket);
            become_forked_warden(fds, &targets[..count], ready)
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
        // A ready namespace given is the warden's alone, made use of or not.
        for &fd in fds
            .iter()
            .chain(ready.as_ref().map_or(&[][..], |ready| &ready.fds[..]))
        {
            if fd >= 0 {
                sys::close(fd);
            }
        }
    }
}

/// The namespaces the server makes ahead of the next confined agent's start (see
/// [`crate::sandbox::Ready`]), one at a time, each given to one warden only: a child of the
/// server joins the host's user namespace for its agents, makes a mount and an IPC namespace
/// there, lays what every agent of the server's plan flags lays, says so and waits until the
/// server opened them. Made while the server waits for requests, so a start never waits on
/// one: a start with none ready lays its namespace itself, as it always did.
///
/// A ready namespace is a copy of the mounts when it was made: one that changes the server's
/// mounts (the user mounting a disk, say) discards it, seen by polling `/proc/self/mountinfo`,
/// and the next is made from the mounts as they are then.
struct Ahead {
    /// The host's user namespace for its agents.
    user: libc::c_int,
    /// The flags of the plans its namespaces are made for (see
    /// [`crate::sandbox::READY_FLAGS`]).
    flags: u8,
    /// `/proc/self/mountinfo`: polled as changed when the server's mounts change.
    mounts: libc::c_int,
    /// The namespace made and not yet given.
    ready: Option<ReadyFds>,
    /// The child making one.
    making: Option<Making>,
    /// A child could not make one: none is made again.
    given_up: bool,
}

/// A ready namespace's descriptors: its mount namespace's, then its IPC namespace's.
struct ReadyFds {
    fds: [libc::c_int; 2],
}

/// A child making a namespace.
struct Making {
    pid: libc::pid_t,
    /// Where it says it made it (0) or why not (an error number).
    answer: libc::c_int,
    /// Its end closed, the child ends.
    release: libc::c_int,
    /// The mounts changed meanwhile: what it makes is discarded.
    stale: bool,
}

impl Ahead {
    /// For plans of `flags`, in the user namespace `user`; `None` when the server's mounts
    /// cannot be watched.
    fn new(user: libc::c_int, flags: u8) -> Option<Ahead> {
        let mounts = sys::open(c"/proc/self/mountinfo", libc::O_RDONLY | libc::O_CLOEXEC);
        (mounts >= 0).then_some(Ahead {
            user,
            flags,
            mounts,
            ready: None,
            making: None,
            given_up: false,
        })
    }

    /// The descriptor the child answers on, -1 when none is being made.
    fn answer(&self) -> libc::c_int {
        self.making.as_ref().map_or(-1, |making| making.answer)
    }

    /// Starts a child making a namespace when none is ready or being made.
    fn start_making(&mut self) {
        if self.given_up || self.ready.is_some() || self.making.is_some() {
            return;
        }
        let (mut answer, mut held) = ([0; 2], [0; 2]);
        if sys::pipe2(&mut answer, libc::O_CLOEXEC) != 0 {
            self.given_up = true;
            return;
        }
        if sys::pipe2(&mut held, libc::O_CLOEXEC) != 0 {
            sys::close(answer[0]);
            sys::close(answer[1]);
            self.given_up = true;
            return;
        }
        let pid = sys::fork_child();
        if pid == 0 {
            // Nothing of the server's but what it makes the namespace with: a request never
            // reaches a server that is gone because this child holds its socket.
            super::close_all_but([answer[1], held[0], self.user]);
            let made = sys::setns(self.user, libc::CLONE_NEWUSER) == 0
                && sys::unshare(libc::CLONE_NEWNS | libc::CLONE_NEWIPC) == 0
                // SAFETY: a forked child of a process of one thread, making system calls.
                && unsafe { crate::sandbox::lay_ready_namespace(self.flags) }.is_ok();
            let code: libc::c_int = if made { 0 } else { sys::errno().max(1) };
            sys::write(answer[1], &code.to_ne_bytes());
            let mut byte = [0u8; 1];
            while sys::read(held[0], &mut byte) < 0 && sys::errno() == libc::EINTR {}
            sys::exit(0);
        }
        sys::close(answer[1]);
        sys::close(held[0]);
        if pid < 0 {
            sys::close(answer[0]);
            sys::close(held[1]);
            self.given_up = true;
            return;
        }
        self.making = Some(Making {
            pid,
            answer: answer[0],
            release: held[1],
            stale: false,
        });
    }

    /// Takes the namespace the child answered for (unless the mounts changed meanwhile), lets
    /// the child go and reaps it.
    fn collect(&mut self) {
        let Some(making) = self.making.take() else {
            return;
        };
        let mut code = [0u8; 4];
        let read = loop {
            let read = sys::read(making.answer, &mut code);
            if read < 0 && sys::errno() == libc::EINTR {
                continue;
            }
            break read;
        };
        if read == 4 && libc::c_int::from_ne_bytes(code) == 0 {
            if !making.stale {
                let mount = open_namespace(making.pid, b"mnt");
                let ipc = open_namespace(making.pid, b"ipc");
                if mount >= 0 && ipc >= 0 {
                    self.ready = Some(ReadyFds { fds: [mount, ipc] });
                } else {
                    for fd in [mount, ipc] {
                        if fd >= 0 {
                            sys::close(fd);
                        }
                    }
                    self.given_up = true;
                }
            }
        } else {
            self.given_up = true;
        }
        sys::close(making.answer);
        sys::close(making.release);
        let mut status = 0;
        while sys::waitpid(making.pid, &mut status, 0) < 0 && sys::errno() == libc::EINTR {}
    }

    /// The mounts changed: what is ready, or being made, is a copy of what they were.
    fn discard(&mut self) {
        if let Some(ready) = self.ready.take() {
            for fd in ready.fds {
                sys::close(fd);
            }
        }
        if let Some(making) = &mut self.making {
            making.stale = true;
        }
    }

    /// The ready namespace, for a warden whose agent's plan has `wants` (0: none) of the
    /// ready flags: only the very ones it was made with.
    fn take(&mut self, wants: u8) -> Option<ReadyFds> {
        if wants == 0 || wants != self.flags {
            return None;
        }
        self.ready.take()
    }
}

/// Opens `/proc/<pid>/ns/<kind>`: -1 when it cannot.
fn open_namespace(pid: libc::pid_t, kind: &[u8]) -> libc::c_int {
    let mut digits = [0u8; 10];
    let digits = super::decimal(pid as u32, &mut digits);
    let mut path = [0u8; 32];
    let mut length = 0;
    for part in [b"/proc/".as_slice(), digits, b"/ns/", kind] {
        path[length..length + part.len()].copy_from_slice(part);
        length += part.len();
    }
    match CStr::from_bytes_with_nul(&path[..=length]) {
        Ok(path) => sys::open(path, libc::O_RDONLY | libc::O_CLOEXEC),
        Err(_) => -1,
    }
}

/// A warden just forked by the server: its descriptors where the host asked, a process group
/// of its own, its directory; then the warden itself, with the arguments of its memory file.
fn become_forked_warden(fds: &[libc::c_int], targets: &[u8], ready: Option<ReadyFds>) -> ! {
    // Out of the way of every number given first, then each onto its own (which clears its
    // close-on-exec flag, as the warden's descriptors had when the host started it), a ready
    // namespace's onto theirs.
    let ready = ready.as_ref().map_or(&[][..], |ready| &ready.fds[..]);
    let mut moved = [-1; MAX_PASSED + 2];
    for (slot, &fd) in moved.iter_mut().zip(fds.iter().chain(ready)) {
        *slot = sys::dup_from(fd, ABOVE_PASSED);
        if *slot < 0 {
            super::fail(c"cannot take the descriptors of a warden");
        }
    }
    let ready_targets = [READY_MOUNT_FD, READY_IPC_FD];
    let targets = targets
        .iter()
        .map(|&target| libc::c_int::from(target))
        .chain(ready_targets.into_iter().take(ready.len()));
    for (&fd, target) in moved.iter().zip(targets) {
        if sys::dup_onto(fd, target) < 0 {
            super::fail(c"cannot take the descriptors of a warden");
        }
    }
    if ready.is_empty() {
        sys::close_range(READY_MOUNT_FD as u32, u32::MAX);
    } else {
        sys::close_range(ABOVE_PASSED as u32, u32::MAX);
    }
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
    if !directory.is_empty() && sys::change_dir(directory) != 0 {
        // As an exec's would have been: the start fails with the error, reported as the
        // agent's.
        super::report_u32(REPORT_FD, sys::errno() as u32);
        super::fail(c"cannot enter the agent's directory")
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
