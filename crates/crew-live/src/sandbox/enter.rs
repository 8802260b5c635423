//! What the agent's own process does between fork and exec, in this order: enter its
//! namespaces ([`enter_namespace`]), listen on the proxy's port and on its own connection for
//! its host, then restrict itself ([`restrict_self`]). Async-signal-safe throughout: system
//! calls on buffers of the caller's frame, no allocation. Also the probes that say whether
//! this kernel lets a process do so.
#![allow(unsafe_code)]

use super::*;

/// Whether this kernel lets an unprivileged process make a user and mount namespace of its own
/// (some distributions turn that off). Asked once, by a child that tries.
pub fn namespaces_work() -> bool {
    static WORKS: OnceLock<bool> = OnceLock::new();
    *WORKS.get_or_init(|| {
        // SAFETY: the probe makes one system call.
        unsafe { child_succeeds(|| libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) == 0) }
    })
}

/// Whether `probe`, run in a child forked for it, says yes: what a kernel lets a process do to
/// itself (enter namespaces), asked without changing this one.
///
/// # Safety
/// `probe` runs between fork and exit in a copy of a multi-threaded process: only
/// async-signal-safe system calls, no allocation, no lock.
pub(super) unsafe fn child_succeeds(probe: impl FnOnce() -> bool) -> bool {
    // SAFETY: the child runs `probe` (see above) and exits; the parent waits for it.
    unsafe {
        let child = libc::fork();
        if child == 0 {
            libc::_exit(if probe() { 0 } else { 1 });
        }
        if child < 0 {
            return false;
        }
        let mut status = 0;
        libc::waitpid(child, &mut status, 0) == child
            && libc::WIFEXITED(status)
            && libc::WEXITSTATUS(status) == 0
    }
}

/// Whether an agent's process can mount a private instance of the terminal devices (see
/// [`Namespace::terminals`]) here. Asked once, by a child that enters such a namespace.
pub fn private_terminals_work() -> bool {
    static WORKS: OnceLock<bool> = OnceLock::new();
    *WORKS.get_or_init(|| {
        if !namespaces_work() || std::fs::metadata("/dev/ptmx").is_err() {
            return false;
        }
        let mut plan = [0u8; 17];
        plan[0] = PLAN_TERMINALS;
        // SAFETY: the probe only makes the namespace's system calls, on a plan made before
        // the fork.
        unsafe { child_succeeds(|| enter_namespace(&plan, None).is_ok()) }
    })
}

/// Enters the namespace `plan` encodes (see [`Namespace::encode`]) for the calling process and
/// everything it starts: a user namespace of its own (mapping its own uid and gid, nothing
/// else), a mount namespace in it whose mounts no longer propagate, a private instance of the
/// terminal devices when asked, and each read-only path bound onto itself and marked
/// read-only. Landlock, applied next, forbids changing mounts: the agent cannot undo this.
///
/// # Safety
/// Runs between fork and exec: only async-signal-safe system calls, no allocation.
pub(crate) unsafe fn enter_namespace(
    plan: &[u8],
    ruleset: Option<libc::c_int>,
) -> std::io::Result<()> {
    let invalid = || std::io::Error::from_raw_os_error(libc::EINVAL);
    let Some((&flags, rest)) = plan.split_first() else {
        return Err(invalid());
    };
    let (terminals, paths) = if flags & PLAN_TERMINALS != 0 {
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
    /// `struct mount_attr` of `mount_setattr(2)`.
    #[repr(C)]
    struct MountAttr {
        attr_set: u64,
        attr_clr: u64,
        propagation: u64,
        userns_fd: u64,
    }
    const MOUNT_ATTR_RDONLY: u64 = 0x1;
    let error = std::io::Error::last_os_error;
    // SAFETY: plain system calls on this process, with NUL-terminated strings.
    unsafe {
        let (uid, gid) = (libc::getuid(), libc::getgid());
        if libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS | network) != 0 {
            return Err(error());
        }
        let mut line = [0u8; 32];
        write_proc(c"/proc/self/setgroups", b"deny")?;
        write_proc(c"/proc/self/uid_map", id_map(&mut line, uid))?;
        write_proc(c"/proc/self/gid_map", id_map(&mut line, gid))?;
        // A network of its own has its own loopback, down until raised: programs that talk to
        // themselves over 127.0.0.1 (a test suite's server) go on working, and reach nothing
        // else.
        if network != 0 {
            loopback_up()?;
        }
        let none = std::ptr::null::<libc::c_char>();
        if libc::mount(
            none,
            c"/".as_ptr(),
            none,
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        ) != 0
        {
            return Err(error());
        }
        if let Some((dir_access, file_access)) = terminals {
            if libc::mount(
                c"devpts".as_ptr(),
                c"/dev/pts".as_ptr(),
                c"devpts".as_ptr(),
                libc::MS_NOSUID | libc::MS_NOEXEC,
                c"newinstance,ptmxmode=0666,mode=0620".as_ptr().cast(),
            ) != 0
            {
                return Err(error());
            }
            if libc::mount(
                c"/dev/pts/ptmx".as_ptr(),
                c"/dev/ptmx".as_ptr(),
                none,
                libc::MS_BIND,
                std::ptr::null(),
            ) != 0
            {
                return Err(error());
            }
            // Granted here, where they are this instance's: beneath `/dev/pts`, and its `ptmx`
            // itself (reached through `/dev/ptmx`, a walk up from it never passes the
            // instance's root). Landlock ignores the mount points a walk up crosses, so a
            // grant of the user's `/dev/pts` would not reach these, nor these the user's.
            if let Some(ruleset) = ruleset {
                grant(ruleset, c"/dev/pts", dir_access)?;
                grant(ruleset, c"/dev/pts/ptmx", file_access)?;
            }
        }
        let attr = MountAttr {
            attr_set: MOUNT_ATTR_RDONLY,
            attr_clr: 0,
            propagation: 0,
            userns_fd: 0,
        };
        let mut start = 0;
        let mut overlay_target = std::ptr::null::<libc::c_char>();
        for (end, _) in paths.iter().enumerate().filter(|(_, byte)| **byte == 0) {
            let kind = paths[start];
            let path = paths.as_ptr().add(start + 1).cast::<libc::c_char>();
            start = end + 1;
            match kind {
                b'o' => {
                    overlay_target = path;
                    continue;
                }
                // An overlay on its own lower layer: the agent reads the directory as it is,
                // and what it changes goes to the upper layer.
                b'O' => {
                    if overlay_target.is_null()
                        || libc::mount(
                            c"crew-private".as_ptr(),
                            overlay_target,
                            c"overlay".as_ptr(),
                            libc::MS_NOSUID | libc::MS_NODEV,
                            path.cast(),
                        ) != 0
                    {
                        return Err(error());
                    }
                    overlay_target = std::ptr::null();
                    continue;
                }
                // Covered: by a small empty directory of its own, or by /dev/null.
                b'd' => {
                    if libc::mount(
                        c"crew-hidden".as_ptr(),
                        path,
                        c"tmpfs".as_ptr(),
                        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                        c"size=16k,mode=0700".as_ptr().cast(),
                    ) != 0
                    {
                        return Err(error());
                    }
                    continue;
                }
                b'f' => {
                    if libc::mount(
                        c"/dev/null".as_ptr(),
                        path,
                        none,
                        libc::MS_BIND,
                        std::ptr::null(),
                    ) != 0
                    {
                        return Err(error());
                    }
                    continue;
                }
                // Listened on once confined: see `listen_for_own_connections`.
                b'c' => continue,
                b'r' => {}
                _ => return Err(invalid()),
            }
            if libc::mount(
                path,
                path,
                none,
                libc::MS_BIND | libc::MS_REC,
                std::ptr::null(),
            ) != 0
            {
                return Err(error());
            }
            if libc::syscall(
                libc::SYS_mount_setattr,
                libc::AT_FDCWD,
                path,
                libc::AT_RECURSIVE as libc::c_uint,
                &attr as *const MountAttr,
                std::mem::size_of::<MountAttr>(),
            ) != 0
            {
                return Err(error());
            }
        }
    }
    Ok(())
}

/// The name of the agent's own connection a namespace plan holds (see [`Namespace::control`]).
///
/// Async-signal-safe: it only reads the plan.
pub(crate) fn plan_control_name(plan: &[u8]) -> Option<&[u8]> {
    let (&flags, rest) = plan.split_first()?;
    let mut entries = if flags & PLAN_TERMINALS != 0 {
        rest.get(16..)?
    } else {
        rest
    };
    while let Some(end) = entries.iter().position(|byte| *byte == 0) {
        let (entry, after) = entries.split_at(end);
        if let Some((&b'c', name)) = entry.split_first() {
            return Some(name);
        }
        entries = &after[1..];
    }
    None
}

/// Listens on the abstract unix socket `name` and sends the listening socket over `channel`
/// to the host, then closes it here: called once the agent's process is confined, so that the
/// socket is its Landlock domain's, which only that domain may connect to (ABI 6 scoping):
/// the agent and what it starts, never another agent. The host serves it as that agent.
///
/// # Safety
/// Async-signal-safe: a socket, bind, listen, one `sendmsg`, a close, all on this frame.
pub(crate) unsafe fn listen_for_own_connections(
    channel: libc::c_int,
    name: &[u8],
) -> std::io::Result<()> {
    // SAFETY: every structure is plain data on this frame, sized as the calls expect.
    unsafe {
        let mut address: libc::sockaddr_un = std::mem::zeroed();
        if name.is_empty() || name.len() + 1 > address.sun_path.len() {
            return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
        }
        address.sun_family = libc::AF_UNIX as libc::sa_family_t;
        // An abstract name: a leading NUL, then the name, no terminator.
        for (at, byte) in name.iter().enumerate() {
            address.sun_path[at + 1] = *byte as libc::c_char;
        }
        let length = std::mem::size_of::<libc::sa_family_t>() + 1 + name.len();
        let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let listening = libc::bind(
            fd,
            (&address as *const libc::sockaddr_un).cast(),
            length as libc::socklen_t,
        ) == 0
            && libc::listen(fd, 64) == 0;
        let result = if listening {
            send_descriptor(channel, fd)
        } else {
            Err(std::io::Error::last_os_error())
        };
        libc::close(fd);
        result
    }
}

/// Whether a namespace plan (see [`Namespace::encode`]) asks for the proxy's socket.
pub(crate) fn plan_wants_proxy(plan: &[u8]) -> bool {
    plan.first().is_some_and(|flags| flags & PLAN_PROXY != 0)
}

/// Listens on the proxy's port of the calling process's (own) loopback and sends the
/// listening socket over `channel` (a unix socket whose other end the host holds), then
/// closes it here: only the host accepts on it, and the agent's programs cannot take the port.
///
/// # Safety
/// Async-signal-safe: a socket, bind, listen, one `sendmsg` of a message on the stack, a close.
pub(crate) unsafe fn listen_for_host(channel: libc::c_int) -> std::io::Result<()> {
    // SAFETY: every structure is plain data on this frame, sized as the calls expect.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut address: libc::sockaddr_in = std::mem::zeroed();
        address.sin_family = libc::AF_INET as libc::sa_family_t;
        address.sin_port = crate::proxy::PROXY_PORT.to_be();
        address.sin_addr.s_addr = u32::from_be_bytes([127, 0, 0, 1]).to_be();
        let bound = libc::bind(
            fd,
            (&address as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        ) == 0
            && libc::listen(fd, 1024) == 0;
        let result = if bound {
            send_descriptor(channel, fd)
        } else {
            Err(std::io::Error::last_os_error())
        };
        libc::close(fd);
        result
    }
}

/// Room for one descriptor's control message, aligned as `cmsghdr` needs.
#[repr(C, align(8))]
struct Control([u8; 64]);

/// A message of one data byte (`data`) with room for a descriptor (`control`), both of the
/// caller's frame, which must outlive it.
fn rights_message(data: &mut libc::iovec, control: &mut Control) -> libc::msghdr {
    // SAFETY: a zeroed `msghdr` is a valid empty one; its pointers are set right below.
    let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
    message.msg_iov = data;
    message.msg_iovlen = 1;
    message.msg_control = control.0.as_mut_ptr().cast();
    message.msg_controllen = control.0.len() as _;
    message
}

/// Sends `fd` over the unix socket `channel` (`SCM_RIGHTS`), with one byte of data.
///
/// # Safety
/// Async-signal-safe; `channel` and `fd` are open descriptors.
unsafe fn send_descriptor(channel: libc::c_int, fd: libc::c_int) -> std::io::Result<()> {
    // SAFETY: the control buffer is aligned and sized for one descriptor; the header's
    // pointers point into this frame.
    unsafe {
        let mut control = Control([0; 64]);
        let mut byte = [1u8];
        let mut data = libc::iovec {
            iov_base: byte.as_mut_ptr().cast(),
            iov_len: 1,
        };
        let mut message = rights_message(&mut data, &mut control);
        message.msg_controllen = libc::CMSG_SPACE(std::mem::size_of::<libc::c_int>() as u32) as _;
        let header = libc::CMSG_FIRSTHDR(&message);
        (*header).cmsg_level = libc::SOL_SOCKET;
        (*header).cmsg_type = libc::SCM_RIGHTS;
        (*header).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<libc::c_int>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(header).cast::<libc::c_int>(), fd);
        if libc::sendmsg(channel, &message, libc::MSG_NOSIGNAL) != 1 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
}

/// Receives the descriptor [`listen_for_host`] sent on `channel`, without waiting: `None`
/// when nothing came.
pub(crate) fn receive_descriptor(channel: &OwnedFd) -> Option<OwnedFd> {
    let mut control = Control([0; 64]);
    let mut byte = [0u8];
    let mut data = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    let mut message = rights_message(&mut data, &mut control);
    // SAFETY: the message's buffers are this frame's; a descriptor received is owned at once.
    unsafe {
        let received = libc::recvmsg(
            channel.as_raw_fd(),
            &mut message,
            libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC,
        );
        if received != 1 {
            return None;
        }
        let header = libc::CMSG_FIRSTHDR(&message);
        if header.is_null()
            || (*header).cmsg_level != libc::SOL_SOCKET
            || (*header).cmsg_type != libc::SCM_RIGHTS
        {
            return None;
        }
        let fd = std::ptr::read_unaligned(libc::CMSG_DATA(header).cast::<libc::c_int>());
        (fd >= 0).then(|| OwnedFd::from_raw_fd(fd))
    }
}

/// Raises the loopback interface of the calling process's network namespace.
///
/// # Safety
/// Async-signal-safe: a socket, two ioctls on a request on the stack, a close.
unsafe fn loopback_up() -> std::io::Result<()> {
    // SAFETY: `ifreq` is plain data; the ioctls read and write only it.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut request: libc::ifreq = std::mem::zeroed();
        for (slot, byte) in request.ifr_name.iter_mut().zip(b"lo\0") {
            *slot = *byte as libc::c_char;
        }
        let mut result = Ok(());
        if libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut request) != 0 {
            result = Err(std::io::Error::last_os_error());
        } else {
            request.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
            if libc::ioctl(fd, libc::SIOCSIFFLAGS, &request) != 0 {
                result = Err(std::io::Error::last_os_error());
            }
        }
        libc::close(fd);
        result
    }
}

/// Adds to `ruleset` a rule that `access` is allowed beneath `path`.
///
/// # Safety
/// Async-signal-safe; `path` is NUL-terminated.
unsafe fn grant(ruleset: libc::c_int, path: &std::ffi::CStr, access: u64) -> std::io::Result<()> {
    /// `struct landlock_path_beneath_attr`, packed as the kernel declares it.
    #[repr(C, packed)]
    struct PathBeneathAttr {
        allowed_access: u64,
        parent_fd: i32,
    }
    const LANDLOCK_RULE_PATH_BENEATH: libc::c_int = 1;
    // SAFETY: open, one rule of a ruleset this process holds, close.
    unsafe {
        let fd = libc::open(
            path.as_ptr(),
            libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        );
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let attr = PathBeneathAttr {
            allowed_access: access,
            parent_fd: fd,
        };
        let added = libc::syscall(
            libc::SYS_landlock_add_rule,
            ruleset,
            LANDLOCK_RULE_PATH_BENEATH,
            &attr as *const PathBeneathAttr,
            0u32,
        );
        let result = if added == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        };
        libc::close(fd);
        result
    }
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

/// Writes `contents` to a file of `/proc/self`.
///
/// # Safety
/// Async-signal-safe; `path` is NUL-terminated.
unsafe fn write_proc(path: &std::ffi::CStr, contents: &[u8]) -> std::io::Result<()> {
    // SAFETY: open, write and close of one file.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let written = libc::write(fd, contents.as_ptr().cast(), contents.len());
        let result = if written == contents.len() as isize {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        };
        libc::close(fd);
        result
    }
}

/// Applies a ruleset built by [`prepare`] to the calling process: no new privileges (setuid
/// programs cannot lift the sandbox), then the ruleset.
///
/// # Safety
/// Runs between fork and exec: only async-signal-safe system calls, no allocation.
pub(crate) unsafe fn restrict_self(ruleset: libc::c_int) -> std::io::Result<()> {
    // SAFETY: plain system calls on this process.
    unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if libc::syscall(libc::SYS_landlock_restrict_self, ruleset, 0u32) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}
