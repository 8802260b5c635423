//! The bytes of a connection the proxy let through, relayed both ways with `splice(2)` through
//! a pipe per direction: they move from one socket to the other inside the kernel (the pipe
//! holds references to the received pages) and never through the host's memory. A download
//! through the proxy then costs about what the same download costs without it: the copy out
//! of the receiving socket and the copy into the agent's program, each done once, by the
//! kernel. A copy through a buffer in the host (what `tokio::io::copy` does) takes each byte
//! through two more copies and the host's scheduler, and costs each streaming agent its
//! buffers.
#![allow(unsafe_code)]
#![deny(
    unsafe_op_in_unsafe_fn,
    clippy::undocumented_unsafe_blocks,
    clippy::multiple_unsafe_ops_per_block
)]

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use tokio::io::Interest;
use tokio::net::TcpStream;

/// The most one `splice` call asks to move: more than a pipe holds, so each call moves what
/// the pipe has room for, or what it holds.
const SPLICE_MAX: usize = 1 << 20;

/// What a direction has moved when its pipe grows to [`BULK_PIPE`]: a download, not an
/// exchange of requests. A pipe's room counts against its user's pipe quota
/// (`/proc/sys/fs/pipe-user-pages-soft`, shared with every program the user runs), so only a
/// bulk transfer takes more than the default 64 KiB.
const BULK_AFTER: usize = 1 << 20;

/// The room of a bulk transfer's pipe: a quarter of the round trips of the default, which
/// on loopback took a 100 MB download through the proxy from about 1.3× the direct one's time
/// to about 1.15×.
const BULK_PIPE: libc::c_int = 256 << 10;

/// Relays `client` and `upstream` both ways until both have ended: each direction's end (the
/// sender's half-close) is passed on as a half-close of the other socket, as `tokio::io::
/// copy_bidirectional` does. The first error ends the relay; the caller drops both sockets.
pub(super) async fn relay(client: &TcpStream, upstream: &TcpStream) -> io::Result<()> {
    let upload = one_way(client, upstream);
    let download = one_way(upstream, client);
    tokio::try_join!(upload, download)?;
    Ok(())
}

/// How long a direction waits for bytes with its pipe still made: past that, it gives the
/// pipe's two descriptors back until its next bytes come. A relayed connection then costs
/// the host its two sockets while idle (a kept-alive connection between requests, of which a
/// package manager holds dozens) and six only while bytes flow.
const IDLE: std::time::Duration = std::time::Duration::from_millis(100);

/// Moves what `from` receives to `to` through a pipe of its own until `from` ends, then
/// half-closes `to`.
async fn one_way(from: &TcpStream, to: &TcpStream) -> io::Result<()> {
    let mut pipe: Option<Pipe> = None;
    let mut in_pipe = 0usize;
    let mut ended = false;
    let mut moved_so_far = 0usize;
    loop {
        if in_pipe == 0 {
            if ended {
                break;
            }
            let moved = loop {
                let Some(current) = &pipe else {
                    // Waited for without one: it is made when there are bytes to move.
                    from.readable().await?;
                    pipe = Some(Pipe::new()?);
                    continue;
                };
                // The pipe is empty, so a `WouldBlock` can only be the socket's: tokio may
                // clear its readiness.
                match from.try_io(Interest::READABLE, || current.fill_from(from.as_raw_fd())) {
                    Ok(moved) => break moved,
                    Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                        // Nothing yet: waited for with the pipe a while, then without it.
                        match tokio::time::timeout(IDLE, from.readable()).await {
                            Ok(ready) => ready?,
                            Err(_) => pipe = None,
                        }
                    }
                    Err(error) => return Err(error),
                }
            };
            if moved == 0 {
                ended = true;
                continue;
            }
            in_pipe += moved;
        }
        let current = pipe
            .as_mut()
            .expect("made before its first bytes, kept while it holds some");
        if !current.grown && moved_so_far >= BULK_AFTER {
            // Best effort: at the user's quota the default room is kept.
            current.grow(BULK_PIPE);
        }
        let current = &*current;
        if !ended {
            // More of what already arrived, without waiting and without telling tokio: a
            // `WouldBlock` here may be the full pipe's, not the socket's.
            match current.fill_from(from.as_raw_fd()) {
                Ok(0) => ended = true,
                Ok(moved) => in_pipe += moved,
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
                Err(error) => return Err(error),
            }
        }
        // The pipe holds something, so a `WouldBlock` can only be the socket's.
        let moved = to
            .async_io(Interest::WRITABLE, || {
                current.drain_to(to.as_raw_fd(), in_pipe)
            })
            .await?;
        in_pipe -= moved;
        moved_so_far += moved;
    }
    shutdown_write(to)
}

/// A pipe's two ends.
struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
    /// Whether it was asked for a bulk transfer's room.
    grown: bool,
}

impl Pipe {
    fn new() -> io::Result<Pipe> {
        let mut ends = [0 as libc::c_int; 2];
        // SAFETY: `pipe2` writes two descriptors into the array it is given, of that size.
        if unsafe { libc::pipe2(ends.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: both just made by `pipe2`, owned by nothing else.
        let read = unsafe { OwnedFd::from_raw_fd(ends[0]) };
        // SAFETY: as above.
        let write = unsafe { OwnedFd::from_raw_fd(ends[1]) };
        #[cfg(test)]
        tests::LIVE_PIPES.with(|live| live.set(live.get() + 1));
        Ok(Pipe {
            read,
            write,
            grown: false,
        })
    }

    /// Asks for `room` bytes of room, keeping what it has if refused.
    fn grow(&mut self, room: libc::c_int) {
        // SAFETY: `F_SETPIPE_SZ` on a pipe this holds open; it passes no memory.
        unsafe { libc::fcntl(self.write.as_raw_fd(), libc::F_SETPIPE_SZ, room) };
        self.grown = true;
    }

    /// Moves what `socket` has received into the pipe, as much as it has room for: 0 when the
    /// socket's sender has ended.
    fn fill_from(&self, socket: RawFd) -> io::Result<usize> {
        splice(socket, self.write.as_raw_fd(), SPLICE_MAX)
    }

    /// Sends up to `len` bytes of what the pipe holds on `socket`.
    fn drain_to(&self, socket: RawFd, len: usize) -> io::Result<usize> {
        splice(self.read.as_raw_fd(), socket, len)
    }
}

#[cfg(test)]
impl Drop for Pipe {
    fn drop(&mut self) {
        tests::LIVE_PIPES.with(|live| live.set(live.get() - 1));
    }
}

/// One non-blocking `splice(2)` of up to `len` bytes from `from` to `to`.
fn splice(from: RawFd, to: RawFd, len: usize) -> io::Result<usize> {
    let flags = libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK;
    // SAFETY: no memory is passed (null offsets: both ends are a socket or a pipe, read where
    // they are); the descriptors are open, held by the caller for the call.
    let moved = unsafe {
        libc::splice(
            from,
            std::ptr::null_mut(),
            to,
            std::ptr::null_mut(),
            len,
            flags,
        )
    };
    usize::try_from(moved).map_err(|_| io::Error::last_os_error())
}

/// Half-closes `socket`: its peer reads the end of what was sent, and may go on sending.
fn shutdown_write(socket: &TcpStream) -> io::Result<()> {
    // SAFETY: `shutdown` on a socket the caller holds open; it passes no memory.
    if unsafe { libc::shutdown(socket.as_raw_fd(), libc::SHUT_WR) } != 0 {
        let error = io::Error::last_os_error();
        // The peer already gone: nothing to tell it.
        if error.raw_os_error() != Some(libc::ENOTCONN) {
            return Err(error);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    thread_local! {
        /// The pipes the relays of this thread hold (a `#[tokio::test]` runs on one thread).
        pub(super) static LIVE_PIPES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }

    #[tokio::test]
    async fn an_idle_connection_gives_its_pipes_back_and_takes_them_again_for_its_next_bytes() {
        let (mut agent, mut server, relaying) = relayed().await;
        let mut answer = vec![0u8; 5];
        for round in 0..2 {
            agent.write_all(b"ask").await.unwrap();
            let mut asked = [0u8; 3];
            within_a_minute(server.read_exact(&mut asked))
                .await
                .unwrap();
            server.write_all(b"reply").await.unwrap();
            within_a_minute(agent.read_exact(&mut answer))
                .await
                .unwrap();
            assert_eq!(
                (&asked, answer.as_slice()),
                (b"ask", &b"reply"[..]),
                "{round}"
            );
            // Both directions made a pipe to move their bytes; idle, both give them back.
            tokio::time::sleep(IDLE * 4).await;
            assert_eq!(LIVE_PIPES.get(), 0, "round {round}: pipes kept while idle");
        }
        drop((agent, server));
        let _ = within_a_minute(relaying).await;
    }

    /// `len` bytes of a pattern in which a byte out of place shows.
    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|at| (at % 251) as u8 ^ (at / 251) as u8 ^ seed)
            .collect()
    }

    /// Sends `bytes` on `stream`, half-closes it, and returns all it reads until the other
    /// end does the same.
    async fn exchange(mut stream: TcpStream, bytes: Vec<u8>) -> Vec<u8> {
        let (mut reading, mut writing) = stream.split();
        let send = async {
            writing.write_all(&bytes).await.unwrap();
            writing.shutdown().await.unwrap();
        };
        let mut received = Vec::new();
        let receive = reading.read_to_end(&mut received);
        let ((), read) = tokio::join!(send, receive);
        read.unwrap();
        received
    }

    /// What `future` gives, failing the test if it takes a minute: an end not passed on
    /// leaves a reader waiting forever.
    async fn within_a_minute<T>(future: impl std::future::Future<Output = T>) -> T {
        tokio::time::timeout(std::time::Duration::from_secs(60), future)
            .await
            .expect("the relay did not finish within a minute")
    }

    /// The agent's and the server's ends of two connections the relay joins, and the relay.
    async fn relayed() -> (
        TcpStream,
        TcpStream,
        tokio::task::JoinHandle<io::Result<()>>,
    ) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let agent = TcpStream::connect(address).await.unwrap();
        let (client, _) = listener.accept().await.unwrap();
        let upstream = TcpStream::connect(address).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let relaying = tokio::spawn(async move { relay(&client, &upstream).await });
        (agent, server, relaying)
    }

    #[tokio::test]
    async fn both_directions_arrive_whole_and_in_order_and_each_end_is_passed_on() {
        let (agent, server, relaying) = relayed().await;
        // Many times what a pipe holds, both ways at once.
        let (download, upload) = (pattern(9 << 20, 1), pattern(3 << 20, 2));
        let both = async {
            tokio::join!(
                exchange(agent, upload.clone()),
                exchange(server, download.clone())
            )
        };
        let (at_agent, at_server) = within_a_minute(both).await;
        within_a_minute(relaying).await.unwrap().unwrap();
        assert!(at_agent == download, "the download arrived changed");
        assert!(at_server == upload, "the upload arrived changed");
    }

    #[tokio::test]
    async fn one_side_ending_early_leaves_the_other_direction_flowing() {
        let (agent, mut server, relaying) = relayed().await;
        // The agent sends its request and ends its side at once; the server reads the end,
        // then answers.
        let agent_side = tokio::spawn(exchange(agent, b"request".to_vec()));
        let mut request = Vec::new();
        within_a_minute(server.read_to_end(&mut request))
            .await
            .unwrap();
        assert_eq!(request, b"request");
        let answer = pattern(2 << 20, 3);
        server.write_all(&answer).await.unwrap();
        server.shutdown().await.unwrap();
        let received = within_a_minute(agent_side).await.unwrap();
        assert!(received == answer, "the answer arrived changed");
        within_a_minute(relaying).await.unwrap().unwrap();
    }
}
