//! The user namespace an agent's process joins (one per host, shared by its confined agents)
//! or, where it cannot, makes of its own: its ids mapped onto themselves, `setgroups` denied.
#![allow(unsafe_code)]
#![deny(
    unsafe_op_in_unsafe_fn,
    clippy::undocumented_unsafe_blocks,
    clippy::multiple_unsafe_ops_per_block
)]

use std::ffi::CStr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::OnceLock;

use crate::sys;
use crate::sys::zero_or_error;

/// The user namespace every confined agent of this process joins (see [`enter_namespace`](crate::sandbox::enter_namespace)),
/// made once: `None` where the kernel refuses, and each agent then makes one of its own.
///
/// Joining it costs an agent's process about 10 µs here, against about 65 µs to make one of
/// its own and write its id maps (and as much again to tear it down when the agent ends).
/// Shared, it gives agents nothing of one another's: each has mount and network namespaces
/// of its own in it, which only a process with capabilities there may enter, and an agent
/// drops all of its before its program starts; its Landlock domain keeps it from opening
/// another's `/proc/<pid>/ns` besides. What else a user namespace holds, its users'
/// keyrings, a confined agent cannot reach (see `close_keyrings`).
pub fn shared_user_namespace() -> Option<std::os::fd::BorrowedFd<'static>> {
    static SHARED: OnceLock<Option<OwnedFd>> = OnceLock::new();
    SHARED
        .get_or_init(|| make_user_namespace().ok())
        .as_ref()
        .map(|namespace| namespace.as_fd())
}

/// A user namespace mapping this process's uid and gid to themselves: made by a child, which
/// enters it, says so, and waits there until this process opened it.
fn make_user_namespace() -> std::io::Result<OwnedFd> {
    // The child's answer (0 once in, or why not), and the pipe whose end lets it go.
    let (answer, answering) = std::io::pipe()?;
    let (held, holding) = std::io::pipe()?;
    let (uid, gid) = (sys::getuid(), sys::getgid());
    // SAFETY: the child makes only system calls on this frame's descriptors, and exits.
    let child = unsafe { libc::fork() };
    if child == 0 {
        sys::close(answer.as_raw_fd());
        sys::close(holding.as_raw_fd());
        let entered =
            zero_or_error(sys::unshare(libc::CLONE_NEWUSER)).and_then(|()| map_own_ids(uid, gid));
        let code = entered
            .err()
            .map_or(0, |error| error.raw_os_error().unwrap_or(libc::EIO));
        sys::write(answering.as_raw_fd(), &code.to_ne_bytes());
        let mut byte = [0u8; 1];
        while sys::read(held.as_raw_fd(), &mut byte) < 0 && sys::errno() == libc::EINTR {}
        sys::exit(0);
    }
    if child < 0 {
        return Err(std::io::Error::last_os_error());
    }
    drop((answering, held));
    let mut code = [0u8; 4];
    let answered = std::io::Read::read_exact(&mut &answer, &mut code);
    let opened = match answered.map(|()| libc::c_int::from_ne_bytes(code)) {
        Ok(0) => std::fs::File::open(format!("/proc/{child}/ns/user")).map(OwnedFd::from),
        Ok(error) => Err(std::io::Error::from_raw_os_error(error)),
        Err(_) => Err(std::io::Error::other(
            "the user namespace's maker ended unheard",
        )),
    };
    // Let go: the namespace lives on as long as the descriptor does.
    drop(holding);
    let mut status = 0;
    sys::waitpid(child, &mut status, 0);
    opened
}

/// `<id> <id> 1`: a namespace's map of one id onto itself, in `line`.
pub(super) fn id_map(line: &mut [u8; 32], id: u32) -> &[u8] {
    let mut digits = [0u8; 10];
    let digits = crate::spawn::decimal(id, &mut digits);
    let mut length = 0;
    for part in [digits, b" ", digits, b" 1"] {
        line[length..length + part.len()].copy_from_slice(part);
        length += part.len();
    }
    &line[..length]
}

/// Maps `uid` and `gid` to themselves in the user namespace this process just made, and
/// nothing else: the only map its user may write. Async-signal-safe.
pub(super) fn map_own_ids(uid: libc::uid_t, gid: libc::gid_t) -> std::io::Result<()> {
    let mut line = [0u8; 32];
    write_proc(c"/proc/self/setgroups", b"deny")?;
    write_proc(c"/proc/self/uid_map", id_map(&mut line, uid))?;
    write_proc(c"/proc/self/gid_map", id_map(&mut line, gid))
}

/// Writes `contents` to a file of `/proc/self`. Async-signal-safe.
fn write_proc(path: &CStr, contents: &[u8]) -> std::io::Result<()> {
    let fd = sys::open(path, libc::O_WRONLY | libc::O_CLOEXEC);
    if fd < 0 {
        return Err(std::io::Error::from_raw_os_error(sys::errno()));
    }
    let written = sys::write(fd, contents);
    let result = if written == contents.len() as isize {
        Ok(())
    } else {
        Err(std::io::Error::from_raw_os_error(sys::errno()))
    };
    sys::close(fd);
    result
}
