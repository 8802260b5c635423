//! What the agent's own process does between fork and exec, in this order: enter its
//! namespaces ([`enter_namespace`]), listen on the proxy's port and on its own connection for
//! its host, then restrict itself ([`restrict_self`]). Async-signal-safe throughout: system
//! calls on buffers of the caller's frame, no allocation. Also the probes that say whether
//! this kernel lets a process do so.
#![allow(unsafe_code)]
#![deny(
    unsafe_op_in_unsafe_fn,
    clippy::undocumented_unsafe_blocks,
    clippy::multiple_unsafe_ops_per_block
)]

use std::ffi::CStr;
use std::sync::OnceLock;

use super::namespace::{
    PLAN_ACCESS, PLAN_NO_NETWORK, PLAN_PROXY, PLAN_READ_ONLY_ELSEWHERE, PLAN_SHARED_MEMORY,
    PLAN_TERMINALS,
};
use crate::sandbox::user_namespace::map_own_ids;
use crate::sys;
use crate::sys::zero_or_error;

/// Whether this kernel lets an unprivileged process make the user, mount and IPC namespaces
/// an agent's process makes (some distributions turn that off). Asked once, by a child that
/// tries.
pub fn namespaces_work() -> bool {
    static WORKS: OnceLock<bool> = OnceLock::new();
    *WORKS.get_or_init(|| {
        // SAFETY: the probe makes one system call.
        unsafe {
            child_succeeds(|| {
                sys::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS | libc::CLONE_NEWIPC) == 0
            })
        }
    })
}

/// Whether `probe`, run in a child forked for it, says yes: what a kernel lets a process do to
/// itself (enter namespaces), asked without changing this one.
///
/// # Safety
/// `probe` runs between fork and exit in a copy of a multi-threaded process: only
/// async-signal-safe system calls, no allocation, no lock.
pub(super) unsafe fn child_succeeds(probe: impl FnOnce() -> bool) -> bool {
    // SAFETY: the child runs only `probe`, which the caller vouches for, and exits.
    let child = unsafe { libc::fork() };
    if child == 0 {
        sys::exit(if probe() { 0 } else { 1 });
    }
    if child < 0 {
        return false;
    }
    let mut status = 0;
    sys::waitpid(child, &mut status, 0) == child
        && libc::WIFEXITED(status)
        && libc::WEXITSTATUS(status) == 0
}

/// Whether an agent's process can mount a private instance of the terminal devices (see
/// [`Namespace::terminals`](crate::sandbox::Namespace::terminals)) here. Asked once, by a child that enters such a namespace.
pub fn private_terminals_work() -> bool {
    static WORKS: OnceLock<bool> = OnceLock::new();
    *WORKS.get_or_init(|| {
        if !namespaces_work() || std::fs::metadata("/dev/ptmx").is_err() {
            return false;
        }
        let mut plan = [0u8; 17];
        plan[0] = PLAN_TERMINALS;
        let probe = || {
            // SAFETY: in the child the probe forked: system calls only, on a plan made
            // before the fork.
            unsafe { enter_namespace(&plan, None, None) }.is_ok()
        };
        // SAFETY: the probe only makes the namespace's system calls.
        unsafe { child_succeeds(probe) }
    })
}

/// [`zero_or_error`] for a cover: `false` where the path is not there (`ENOENT`), which is
/// not an error. Async-signal-safe.
fn gone_or_error(answer: libc::c_int) -> std::io::Result<bool> {
    match zero_or_error(answer) {
        Ok(()) => Ok(true),
        Err(error) if error.raw_os_error() == Some(libc::ENOENT) => Ok(false),
        Err(error) => Err(error),
    }
}

/// Enters the namespace `plan` encodes (see [`Namespace::encode`](crate::sandbox::Namespace::encode)) for the calling process and
/// everything it starts: the user namespace `user` (see [`shared_user_namespace`](crate::sandbox::shared_user_namespace)), or one of
/// its own (mapping its own uid and gid, nothing else), a mount namespace in it whose mounts
/// no longer propagate, its private views laid, every mount read-only but its places and
/// views when asked (its working directory entered again through them), a private instance
/// of the terminal devices when asked, the covers, and each read-only path bound onto itself
/// and marked read-only. Landlock, applied next, forbids changing mounts: the agent cannot
/// undo this.
///
/// # Safety
/// Runs between fork and exec: only async-signal-safe system calls, no allocation.
pub unsafe fn enter_namespace(
    plan: &[u8],
    ruleset: Option<libc::c_int>,
    user: Option<libc::c_int>,
) -> std::io::Result<()> {
    let invalid = || std::io::Error::from_raw_os_error(libc::EINVAL);
    let Some((&flags, rest)) = plan.split_first() else {
        return Err(invalid());
    };
    let (access, paths) = if flags & PLAN_ACCESS != 0 {
        if rest.len() < 16 {
            return Err(invalid());
        }
        let mut dir = [0u8; 8];
        let mut file = [0u8; 8];
        dir.copy_from_slice(&rest[..8]);
        file.copy_from_slice(&rest[8..16]);
        (
            Some((u64::from_le_bytes(dir), u64::from_le_bytes(file))),
            &rest[16..],
        )
    } else {
        (None, rest)
    };
    let network = if flags & (PLAN_NO_NETWORK | PLAN_PROXY) != 0 {
        libc::CLONE_NEWNET
    } else {
        0
    };
    // The user namespace its host made for its agents, joined; where that is refused, one of
    // its own. Either way, mount, IPC and network namespaces of its own in it: System V shared
    // memory, semaphores and message queues (and POSIX message queues) are found by a number,
    // not a path, so Landlock does not see them, and in the machine's IPC namespace an agent
    // could read, fill or remove those of every program of its user (as root, of everyone).
    let own = libc::CLONE_NEWNS | libc::CLONE_NEWIPC | network;
    if user.is_some_and(|user| sys::setns(user, libc::CLONE_NEWUSER) == 0) {
        zero_or_error(sys::unshare(own))?;
    } else {
        let (uid, gid) = (sys::getuid(), sys::getgid());
        zero_or_error(sys::unshare(libc::CLONE_NEWUSER | own))?;
        map_own_ids(uid, gid)?;
    }
    // A network of its own has its own loopback, down until raised: programs that talk to
    // themselves over 127.0.0.1 (a test suite's server) go on working, and reach nothing
    // else.
    if network != 0 {
        loopback_up()?;
    }
    zero_or_error(sys::mount(
        None,
        c"/",
        None,
        libc::MS_REC | libc::MS_PRIVATE,
        None,
    ))?;
    let read_only_elsewhere = flags & PLAN_READ_ONLY_ELSEWHERE != 0;
    // Where it works: gone back to once its places are bound, so that it works through the
    // bind, not the mount beneath it that is made read-only (nor the home beneath its cover).
    let mut cwd = [0u8; 4096];
    let cwd = if read_only_elsewhere {
        sys::current_dir(&mut cwd).and_then(|length| CStr::from_bytes_with_nul(&cwd[..length]).ok())
    } else {
        None
    };
    cover_partially(paths)?;
    // Its places, each bound onto itself (but those a partial view bound back already): a
    // mount of their own, made writable again below.
    if read_only_elsewhere {
        for entry in entries(paths) {
            let (kind, path) = entry?;
            if kind == b'w' {
                bind_onto_itself(path)?;
            }
        }
    }
    // Each private view: an overlay on its own lower layer; the agent reads the directory as
    // it is, and what it changes goes to the upper layer (which the overlay holds a mount of
    // its own of, untouched by what follows).
    let mut overlay_target: Option<&CStr> = None;
    for entry in entries(paths) {
        match entry? {
            (b'o', target) => overlay_target = Some(target),
            (b'O', options) => {
                let target = overlay_target.take().ok_or_else(invalid)?;
                zero_or_error(sys::mount(
                    Some(c"crew-private"),
                    target,
                    Some(c"overlay"),
                    libc::MS_NOSUID | libc::MS_NODEV,
                    Some(options),
                ))?;
            }
            _ => {}
        }
    }
    // Every mount read-only, then its places and views writable again: what it may not write,
    // it may not `chmod`, `touch` or give attributes either.
    if read_only_elsewhere {
        zero_or_error(sys::make_read_only(c"/"))?;
        for entry in entries(paths) {
            let (kind, path) = entry?;
            match kind {
                b'o' => zero_or_error(sys::make_writable(path))?,
                // A place on a mount the machine made read-only stays read-only (the kernel
                // keeps that flag of a mount a namespace inherited): it was never writable.
                b'w' | b'W' if sys::make_writable(path) != 0 && sys::errno() != libc::EPERM => {
                    return Err(std::io::Error::from_raw_os_error(sys::errno()));
                }
                _ => {}
            }
        }
        if let Some(cwd) = cwd {
            zero_or_error(sys::change_dir(cwd))?;
        }
    }
    if let Some((dir_access, file_access)) = access.filter(|_| flags & PLAN_TERMINALS != 0) {
        zero_or_error(sys::mount(
            Some(c"devpts"),
            c"/dev/pts",
            Some(c"devpts"),
            libc::MS_NOSUID | libc::MS_NOEXEC,
            Some(c"newinstance,ptmxmode=0666,mode=0620"),
        ))?;
        zero_or_error(sys::mount(
            Some(c"/dev/pts/ptmx"),
            c"/dev/ptmx",
            None,
            libc::MS_BIND,
            None,
        ))?;
        // Granted here, where they are this instance's: beneath `/dev/pts`, and its `ptmx`
        // itself (reached through `/dev/ptmx`, a walk up from it never passes the
        // instance's root). Landlock ignores the mount points a walk up crosses, so a
        // grant of the user's `/dev/pts` would not reach these, nor these the user's.
        if let Some(ruleset) = ruleset {
            grant(ruleset, c"/dev/pts", dir_access)?;
            grant(ruleset, c"/dev/pts/ptmx", file_access)?;
        }
    }
    // Shared memory of its own, over the user's (after the mounts were made read-only, so
    // writable), granted the same way.
    if let Some((dir_access, _)) = access.filter(|_| flags & PLAN_SHARED_MEMORY != 0) {
        zero_or_error(sys::mount(
            Some(c"crew-shm"),
            c"/dev/shm",
            Some(c"tmpfs"),
            libc::MS_NOSUID | libc::MS_NODEV,
            Some(c"mode=1777"),
        ))?;
        if let Some(ruleset) = ruleset {
            grant(ruleset, c"/dev/shm", dir_access)?;
        }
    }
    // The first directory covered: the small empty file system over it covers the others
    // too, bound onto them (a bind costs a third of a new file system's making, and as much
    // less at the end; nothing can write it: no grant of the agent's lies within a cover).
    let mut first_cover: Option<&CStr> = None;
    let mut file_covers = FileCovers::default();
    for entry in entries(paths) {
        match entry? {
            // Covered: by a small empty directory of its own, or by /dev/null.
            // A path gone since the plan was made (another host's socket directory, removed
            // as that host ended) has nothing left to cover: the agent starts all the same,
            // as it would had the path never been there.
            (b'd', path) => {
                let bound = first_cover.is_some_and(|first| {
                    sys::mount(Some(first), path, None, libc::MS_BIND, None) == 0
                });
                if !bound {
                    let covered = gone_or_error(sys::mount(
                        Some(c"crew-hidden"),
                        path,
                        Some(c"tmpfs"),
                        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                        Some(c"size=16k,mode=0700"),
                    ))?;
                    if covered {
                        first_cover.get_or_insert(path);
                    }
                }
            }
            (b'f', path) => {
                gone_or_error(file_covers.cover(path))?;
            }
            // Read-only beneath a place it may write (or a view).
            (b'r', path) => {
                bind_onto_itself(path)?;
                zero_or_error(sys::make_read_only(path))?;
            }
            // Done above; the agent's own connection is listened on once confined (see
            // `listen_for_own_connections`).
            (b'w' | b'W' | b'o' | b'O' | b'c' | b'H' | b'K' | b'k' | b'L' | b'T', _) => {}
            _ => return Err(invalid()),
        }
    }
    Ok(())
}

/// Covers each directory the agent sees only in part with a small empty file system and
/// binds back beneath it what the plan keeps (`H`, then `K`, `k`, `L`/`T`; see
/// [`PartialView`](crate::sandbox::PartialView)): each taken from the directory beneath the
/// cover, reached by a descriptor of it opened before, with the mounts beneath it, onto a
/// directory or file made for it on the way there; each link made again. The outer ones come
/// first, so an inner one (the home within `/home`) is covered where the outer one kept it. A
/// place gone since the plan was made is left out. Async-signal-safe: paths are put together in
/// a buffer of the stack.
fn cover_partially(paths: &[u8]) -> std::io::Result<()> {
    let mut open: Option<(libc::c_int, libc::c_int)> = None;
    let covered = cover_each(paths, &mut open);
    if let Some((beneath, cover)) = open {
        sys::close(beneath);
        sys::close(cover);
    }
    covered
}

/// The work of [`cover_partially`], the descriptors of the directory in hand (beneath its
/// cover, and the cover) in `open` for the caller to close.
fn cover_each(paths: &[u8], open: &mut Option<(libc::c_int, libc::c_int)>) -> std::io::Result<()> {
    let invalid = || std::io::Error::from_raw_os_error(libc::EINVAL);
    let failed = || std::io::Error::from_raw_os_error(sys::errno());
    let directory = libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC;
    let mut link: Option<&CStr> = None;
    for entry in entries(paths) {
        let (kind, path) = entry?;
        if kind == b'H' {
            if let Some((beneath, cover)) = open.take() {
                sys::close(beneath);
                sys::close(cover);
            }
            let beneath = sys::open(path, directory);
            if beneath < 0 {
                return Err(failed());
            }
            if sys::mount(
                Some(c"crew-partial"),
                path,
                Some(c"tmpfs"),
                libc::MS_NOSUID | libc::MS_NODEV,
                Some(c"size=1m,nr_inodes=4096,mode=0755"),
            ) != 0
            {
                let error = failed();
                sys::close(beneath);
                return Err(error);
            }
            let cover = sys::open(path, directory);
            if cover < 0 {
                let error = failed();
                sys::close(beneath);
                return Err(error);
            }
            *open = Some((beneath, cover));
            continue;
        }
        if !matches!(kind, b'K' | b'k' | b'L' | b'T') {
            continue;
        }
        let (beneath, cover) = open.ok_or_else(invalid)?;
        if kind != b'T' {
            make_parents(cover, path)?;
        }
        let made = match kind {
            b'K' => sys::make_dir(cover, path, 0o755),
            b'k' => sys::make_empty_file(cover, path),
            b'L' => {
                link = Some(path);
                continue;
            }
            // `T`: where the link just named leads.
            _ => {
                let name = link.take().ok_or_else(invalid)?;
                if sys::make_link(path, cover, name) != 0 && sys::errno() != libc::EEXIST {
                    return Err(failed());
                }
                continue;
            }
        };
        if made != 0 && sys::errno() != libc::EEXIST {
            return Err(failed());
        }
        let tree = sys::clone_tree(beneath, path);
        if tree < 0 {
            if sys::errno() == libc::ENOENT {
                continue;
            }
            return Err(failed());
        }
        let attached = sys::attach_tree(tree, cover, path);
        let error = failed();
        sys::close(tree);
        if attached != 0 {
            return Err(error);
        }
    }
    Ok(())
}

/// Makes the directories on the way to `path` beneath `dir`, as `mkdir -p` would, in a buffer
/// of the stack. Async-signal-safe.
fn make_parents(dir: libc::c_int, path: &CStr) -> std::io::Result<()> {
    let bytes = path.to_bytes();
    let mut buffer = [0u8; 4096];
    if bytes.len() >= buffer.len() {
        return Err(std::io::Error::from_raw_os_error(libc::ENAMETOOLONG));
    }
    buffer[..bytes.len()].copy_from_slice(bytes);
    for end in 1..bytes.len() {
        if bytes[end] != b'/' {
            continue;
        }
        buffer[end] = 0;
        let parent = CStr::from_bytes_with_nul(&buffer[..=end])
            .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
        if sys::make_dir(dir, parent, 0o755) != 0 && sys::errno() != libc::EEXIST {
            return Err(std::io::Error::from_raw_os_error(sys::errno()));
        }
        buffer[end] = b'/';
    }
    Ok(())
}

/// The empty files that cover files (crew's lock files, sockets) in the agent's namespace:
/// each one of its own, on a small tmpfs of the agent's mounted nowhere, so that a lock an
/// agent takes on one conflicts with nothing else (a lock on `/dev/null`, one inode for the
/// whole machine, held by one agent, refused every other agent's). Where the kernel cannot
/// make them (before 6.15 a file of a detached mount cannot be bound), `/dev/null`.
#[derive(Default)]
struct FileCovers {
    /// The tmpfs's root: `None` until the first cover, -1 where it could not be made.
    root: Option<libc::c_int>,
    made: u8,
}

impl FileCovers {
    /// Covers the file `path`, read-only; 0, or -1 with `errno` set (`ENOENT`: it is gone).
    /// Async-signal-safe.
    fn cover(&mut self, path: &CStr) -> libc::c_int {
        let root = *self.root.get_or_insert_with(sys::detached_tmpfs);
        if root >= 0 && self.made < 100 {
            // c00 … c99, in a buffer of the stack: nothing allocated after the fork.
            let name = [b'c', b'0' + self.made / 10, b'0' + self.made % 10, 0];
            if let Ok(name) = CStr::from_bytes_with_nul(&name)
                && sys::make_empty_file(root, name) == 0
            {
                self.made += 1;
                if sys::bind_beneath(root, name, path) == 0 {
                    return sys::make_read_only(path);
                }
                if sys::errno() == libc::ENOENT {
                    return -1;
                }
            }
        }
        sys::mount(Some(c"/dev/null"), path, None, libc::MS_BIND, None)
    }
}

/// Binds `path` (and the mounts beneath it) onto itself: a mount of its own, whose flags can
/// then be set apart from the one it lies on. Async-signal-safe.
fn bind_onto_itself(path: &CStr) -> std::io::Result<()> {
    zero_or_error(sys::mount(
        Some(path),
        path,
        None,
        libc::MS_BIND | libc::MS_REC,
        None,
    ))
}

/// The entries of a namespace plan's paths (see [`Namespace::encode`](crate::sandbox::Namespace::encode)): a kind byte and a
/// NUL-terminated path each. Async-signal-safe: it only reads the plan.
pub(super) fn entries(paths: &[u8]) -> impl Iterator<Item = std::io::Result<(u8, &CStr)>> {
    paths.split_inclusive(|byte| *byte == 0).map(|entry| {
        let invalid = || std::io::Error::from_raw_os_error(libc::EINVAL);
        let (&kind, path) = entry.split_first().ok_or_else(invalid)?;
        let path = CStr::from_bytes_with_nul(path).map_err(|_| invalid())?;
        Ok((kind, path))
    })
}

/// Raises the loopback interface of the calling process's network namespace.
/// Async-signal-safe: a socket, two ioctls on a request on the stack, a close.
fn loopback_up() -> std::io::Result<()> {
    let fd = sys::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC);
    if fd < 0 {
        return Err(std::io::Error::from_raw_os_error(sys::errno()));
    }
    let mut request: libc::ifreq = sys::zeroed();
    for (slot, byte) in request.ifr_name.iter_mut().zip(b"lo\0") {
        *slot = *byte as libc::c_char;
    }
    let result = zero_or_error(sys::ioctl_interface(fd, libc::SIOCGIFFLAGS, &mut request))
        .and_then(|()| {
            // SAFETY: reading the flags member, which SIOCGIFFLAGS just wrote.
            let flags = unsafe { request.ifr_ifru.ifru_flags };
            request.ifr_ifru.ifru_flags = flags | libc::IFF_UP as libc::c_short;
            zero_or_error(sys::ioctl_interface(fd, libc::SIOCSIFFLAGS, &mut request))
        });
    sys::close(fd);
    result
}

/// Adds to `ruleset` a rule that `access` is allowed beneath `path`. Async-signal-safe.
fn grant(ruleset: libc::c_int, path: &CStr, access: u64) -> std::io::Result<()> {
    let fd = sys::open(path, libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC);
    if fd < 0 {
        return Err(std::io::Error::from_raw_os_error(sys::errno()));
    }
    let result = zero_or_error(sys::landlock_add_path_rule(ruleset, fd, access));
    sys::close(fd);
    result
}

/// Applies a ruleset built by [`prepare`](crate::sandbox::prepare) to the calling process: no new privileges (setuid
/// programs cannot lift the sandbox), then the ruleset. (An agent's keyrings were closed
/// before: see `crate::spawn::Spawner`.)
///
/// # Safety
/// Runs between fork and exec: only async-signal-safe system calls, no allocation.
pub unsafe fn restrict_self(ruleset: libc::c_int) -> std::io::Result<()> {
    zero_or_error(sys::prctl(libc::PR_SET_NO_NEW_PRIVS, 1))?;
    zero_or_error(sys::landlock_restrict_self(ruleset))
}
