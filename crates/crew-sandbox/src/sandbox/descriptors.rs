//! What an agent's process hands its host, between fork and exec: the listening socket of its
//! proxy port and of its own connection, sent over the warden's channel (`SCM_RIGHTS`), and
//! the host's side that receives them. Async-signal-safe on the agent's side.
#![allow(unsafe_code)]
#![deny(
    unsafe_op_in_unsafe_fn,
    clippy::undocumented_unsafe_blocks,
    clippy::multiple_unsafe_ops_per_block
)]

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use super::namespace::{PLAN_ACCESS, PLAN_PROXY};
use crate::sandbox::enter::entries;
use crate::sys;

/// The name of the agent's own connection a namespace plan holds (see [`Namespace::control`](crate::sandbox::Namespace::control)).
///
/// Async-signal-safe: it only reads the plan.
pub fn plan_control_name(plan: &[u8]) -> Option<&[u8]> {
    let (&flags, rest) = plan.split_first()?;
    let paths = if flags & PLAN_ACCESS != 0 {
        rest.get(16..)?
    } else {
        rest
    };
    entries(paths).find_map(|entry| match entry {
        Ok((b'c', name)) => Some(name.to_bytes()),
        _ => None,
    })
}

/// Listens on the abstract unix socket `name` and sends the listening socket over `channel`
/// to the host, then closes it here: called once the agent's process is confined, so that the
/// socket is its Landlock domain's, which only that domain may connect to (ABI 6 scoping):
/// the agent and what it starts, never another agent. The host serves it as that agent.
///
/// # Safety
/// Async-signal-safe: a socket, bind, listen, one `sendmsg`, a close, all on this frame.
pub unsafe fn listen_for_own_connections(channel: libc::c_int, name: &[u8]) -> std::io::Result<()> {
    let mut address: libc::sockaddr_un = sys::zeroed();
    if name.is_empty() || name.len() + 1 > address.sun_path.len() {
        return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
    }
    address.sun_family = libc::AF_UNIX as libc::sa_family_t;
    // An abstract name: a leading NUL, then the name, no terminator.
    for (at, byte) in name.iter().enumerate() {
        address.sun_path[at + 1] = *byte as libc::c_char;
    }
    let length = std::mem::size_of::<libc::sa_family_t>() + 1 + name.len();
    listen_and_send(channel, libc::AF_UNIX, &address, length, 64)
}

/// Makes a listening socket of `domain` at `address` (`length` bytes of it), sends it over
/// `channel` to the host, and closes it here. Async-signal-safe.
fn listen_and_send<T>(
    channel: libc::c_int,
    domain: libc::c_int,
    address: &T,
    length: usize,
    backlog: libc::c_int,
) -> std::io::Result<()> {
    let fd = sys::socket(domain, libc::SOCK_STREAM | libc::SOCK_CLOEXEC);
    if fd < 0 {
        return Err(std::io::Error::from_raw_os_error(sys::errno()));
    }
    let listening = sys::bind(fd, address, length) == 0 && sys::listen(fd, backlog) == 0;
    let result = if listening {
        send_descriptor(channel, fd)
    } else {
        Err(std::io::Error::from_raw_os_error(sys::errno()))
    };
    sys::close(fd);
    result
}

/// Whether a namespace plan (see [`Namespace::encode`](crate::sandbox::Namespace::encode)) asks for the proxy's socket.
pub fn plan_wants_proxy(plan: &[u8]) -> bool {
    plan.first().is_some_and(|flags| flags & PLAN_PROXY != 0)
}

/// Listens on the proxy's port of the calling process's (own) loopback and sends the
/// listening socket over `channel` (a unix socket whose other end the host holds), then
/// closes it here: only the host accepts on it, and the agent's programs cannot take the port.
///
/// # Safety
/// Async-signal-safe: a socket, bind, listen, one `sendmsg` of a message on the stack, a close.
pub unsafe fn listen_for_host(channel: libc::c_int) -> std::io::Result<()> {
    let mut address: libc::sockaddr_in = sys::zeroed();
    address.sin_family = libc::AF_INET as libc::sa_family_t;
    address.sin_port = crate::proxy::PROXY_PORT.to_be();
    address.sin_addr.s_addr = u32::from_be_bytes([127, 0, 0, 1]).to_be();
    let length = std::mem::size_of::<libc::sockaddr_in>();
    listen_and_send(channel, libc::AF_INET, &address, length, 1024)
}

/// The control message of one descriptor (`SCM_RIGHTS`), laid out as `CMSG_DATA` finds it
/// on Linux: right after the header, which is a multiple of its alignment.
#[repr(C)]
struct OneDescriptor {
    header: libc::cmsghdr,
    fd: libc::c_int,
}

// SAFETY: `CMSG_LEN` and `CMSG_SPACE` only compute sizes.
const RIGHTS_LEN: libc::c_uint = unsafe { libc::CMSG_LEN(std::mem::size_of::<libc::c_int>() as _) };

// SAFETY: as above.
const RIGHTS_SPACE: libc::c_uint =
    unsafe { libc::CMSG_SPACE(std::mem::size_of::<libc::c_int>() as _) };
// The layout above is the one the kernel reads and writes.
const _: () = assert!(std::mem::offset_of!(OneDescriptor, fd) == RIGHTS_LEN as usize - 4);
const _: () = assert!(std::mem::size_of::<OneDescriptor>() <= RIGHTS_SPACE as usize);

/// A message of the one data byte `data` and the control message `control`, both of the
/// caller's frame, which must outlive it.
fn rights_message(data: &mut libc::iovec, control: &mut OneDescriptor) -> libc::msghdr {
    let mut message: libc::msghdr = sys::zeroed();
    message.msg_iov = data;
    message.msg_iovlen = 1;
    message.msg_control = (control as *mut OneDescriptor).cast();
    message.msg_controllen = RIGHTS_SPACE as _;
    message
}

/// Sends `fd` over the unix socket `channel` (`SCM_RIGHTS`), with one byte of data.
/// Async-signal-safe.
fn send_descriptor(channel: libc::c_int, fd: libc::c_int) -> std::io::Result<()> {
    let mut control = OneDescriptor {
        header: libc::cmsghdr {
            cmsg_len: RIGHTS_LEN as _,
            cmsg_level: libc::SOL_SOCKET,
            cmsg_type: libc::SCM_RIGHTS,
        },
        fd,
    };
    let mut byte = [1u8];
    let mut data = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    let message = rights_message(&mut data, &mut control);
    // SAFETY: the message's data and control buffers are this frame's, alive and sized as
    // the header says.
    if unsafe { sys::sendmsg(channel, &message, libc::MSG_NOSIGNAL) } != 1 {
        return Err(std::io::Error::from_raw_os_error(sys::errno()));
    }
    Ok(())
}

/// Receives the descriptor [`listen_for_host`] sent on `channel`, without waiting: `None`
/// when nothing came.
pub fn receive_descriptor(channel: &OwnedFd) -> Option<OwnedFd> {
    let mut control = OneDescriptor {
        header: libc::cmsghdr {
            cmsg_len: 0,
            cmsg_level: 0,
            cmsg_type: 0,
        },
        fd: -1,
    };
    let mut byte = [0u8];
    let mut data = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    let mut message = rights_message(&mut data, &mut control);
    let flags = libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC;
    // SAFETY: the message's buffers are this frame's, writable and sized as the header says.
    let received = unsafe { sys::recvmsg(channel.as_raw_fd(), &mut message, flags) };
    let header = &control.header;
    if received != 1
        || message.msg_controllen < RIGHTS_LEN as usize
        || header.cmsg_level != libc::SOL_SOCKET
        || header.cmsg_type != libc::SCM_RIGHTS
        || header.cmsg_len != RIGHTS_LEN as usize
        || control.fd < 0
    {
        return None;
    }
    // SAFETY: the kernel just installed this descriptor in this process for us alone.
    Some(unsafe { OwnedFd::from_raw_fd(control.fd) })
}
