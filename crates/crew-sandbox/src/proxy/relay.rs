//! The bytes of a connection the proxy let through, relayed both ways: read from one socket
//! into a buffer of the host's and written to the other, each direction on its own.
//!
//! What a download through the proxy costs is the size of each read: every one is a wake-up, two
//! system calls and a second trip through the kernel's TCP for what it moved. A direction that
//! has moved a megabyte (a download, not an exchange of requests) reads 256 KiB at a time; the
//! rest read 16 KiB, a TLS record. Measured here, a 100 MB download from loopback took 0.94–1.01×
//! the direct one's time with 256 KiB reads, 1.15–1.27× with 64 KiB, and 1.09–1.19× moving the
//! bytes with `splice(2)` through a 256 KiB pipe (which never copies them, but hands the
//! agent's socket the sender's pages one by one: BENCHMARKS.md).
//!
//! An agent's proxy lets at most [`BULK_READERS`] directions read in bulk at once: a hostile
//! agent's 128 connections, each streaming both ways, cost the host 4 MiB of small buffers and
//! 2 MiB of large ones, not 64 MiB.
//!
//! A direction holds its buffer only while bytes flow: it gives it back after [`IDLE`] without
//! any, so a kept-alive connection between requests (a package manager holds dozens) costs the
//! host its two sockets and nothing more.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// What a direction reads at a time until it has moved [`BULK_AFTER`]: a TLS record.
const FIRST_READ: usize = 16 << 10;

/// What a direction has moved when it starts reading [`BULK_READ`] at a time.
const BULK_AFTER: usize = 1 << 20;

/// What a bulk transfer reads at a time (BENCHMARKS.md, "The proxy's relay, copied again").
const BULK_READ: usize = 256 << 10;

/// How many directions of one agent's connections may read [`BULK_READ`] at a time at once; the
/// others go on reading [`FIRST_READ`] until one of them gives its large buffer back.
pub(super) const BULK_READERS: usize = 8;

/// The large buffers one agent's proxy may hold at once: a permit each.
#[derive(Clone)]
pub(super) struct BulkReads(Arc<Semaphore>);

impl BulkReads {
    pub(super) fn new() -> BulkReads {
        BulkReads::with(BULK_READERS)
    }

    fn with(readers: usize) -> BulkReads {
        BulkReads(Arc::new(Semaphore::new(readers)))
    }

    /// A permit, if a large buffer is free.
    fn take(&self) -> Option<OwnedSemaphorePermit> {
        self.0.clone().try_acquire_owned().ok()
    }
}

/// How long a direction waits for bytes with its buffer still held: past that, it gives the
/// buffer back until its next bytes come.
const IDLE: Duration = Duration::from_millis(100);

/// Relays `client` and `upstream` both ways until both have ended: each direction's end (the
/// sender's half-close) is passed on as a half-close of the other socket, as `tokio::io::
/// copy_bidirectional` does. The first error ends the relay; the caller drops both sockets.
pub(super) async fn relay(
    client: &TcpStream,
    upstream: &TcpStream,
    bulk: &BulkReads,
) -> io::Result<()> {
    let upload = one_way(client, upstream, bulk);
    let download = one_way(upstream, client, bulk);
    tokio::try_join!(upload, download)?;
    Ok(())
}

/// Moves what `from` receives to `to` until `from` ends, then half-closes `to`.
async fn one_way(from: &TcpStream, to: &TcpStream, bulk: &BulkReads) -> io::Result<()> {
    let mut buffer: Option<Buffer> = None;
    let mut moved_so_far = 0usize;
    loop {
        let Some(held) = &mut buffer else {
            // Waited for without one: it is taken when there are bytes to move.
            from.readable().await?;
            buffer = Some(Buffer::new(None));
            continue;
        };
        if moved_so_far >= BULK_AFTER
            && held.permit.is_none()
            && let Some(permit) = bulk.take()
        {
            *held = Buffer::new(Some(permit));
        }
        held.bytes.clear();
        match from.try_read_buf(&mut held.bytes) {
            Ok(0) => break,
            Ok(read) => {
                write_all(to, &held.bytes[..read]).await?;
                moved_so_far += read;
            }
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                // Nothing yet: waited for with the buffer a while, then without it.
                match tokio::time::timeout(IDLE, from.readable()).await {
                    Ok(ready) => ready?,
                    Err(_) => buffer = None,
                }
            }
            Err(error) => return Err(error),
        }
    }
    rustix::net::shutdown(to, rustix::net::Shutdown::Write).or_else(|error| {
        // The peer already gone: nothing to tell it.
        if error == rustix::io::Errno::NOTCONN {
            Ok(())
        } else {
            Err(error.into())
        }
    })
}

/// Writes all of `bytes` to `to`, waiting for room as it needs.
async fn write_all(to: &TcpStream, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        to.writable().await?;
        match to.try_write(bytes) {
            Ok(written) => bytes = &bytes[written..],
            // Readiness tokio had not cleared yet: waited for again.
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

/// A direction's buffer: read into its spare room, so only what was read is ever touched.
struct Buffer {
    bytes: Vec<u8>,
    /// A large one's permit, given back with it.
    permit: Option<OwnedSemaphorePermit>,
}

impl Buffer {
    /// [`BULK_READ`] of room with a permit, [`FIRST_READ`] without.
    fn new(permit: Option<OwnedSemaphorePermit>) -> Buffer {
        let room = if permit.is_some() {
            BULK_READ
        } else {
            FIRST_READ
        };
        #[cfg(test)]
        tests::LIVE_BUFFERS.with(|live| live.set(live.get() + 1));
        #[cfg(test)]
        tests::LARGEST_BUFFER.with(|largest| largest.set(largest.get().max(room)));
        #[cfg(test)]
        if permit.is_some() {
            let live = tests::LIVE_BULK.with(|live| {
                live.set(live.get() + 1);
                live.get()
            });
            tests::MOST_BULK.with(|most| most.set(most.get().max(live)));
        }
        Buffer {
            bytes: Vec::with_capacity(room),
            permit,
        }
    }
}

#[cfg(test)]
impl Drop for Buffer {
    fn drop(&mut self) {
        tests::LIVE_BUFFERS.with(|live| live.set(live.get() - 1));
        if self.permit.is_some() {
            tests::LIVE_BULK.with(|live| live.set(live.get() - 1));
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    thread_local! {
        /// The buffers the relays of this thread hold (a `#[tokio::test]` runs on one thread).
        pub(super) static LIVE_BUFFERS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
        /// The most room a buffer of this thread's relays was given.
        pub(super) static LARGEST_BUFFER: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
        /// The large buffers this thread's relays hold, and the most they held at once.
        pub(super) static LIVE_BULK: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
        pub(super) static MOST_BULK: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }

    #[tokio::test]
    async fn an_idle_connection_gives_its_buffers_back_and_takes_them_again_for_its_next_bytes() {
        let (mut agent, mut server, relaying) = relayed(&BulkReads::new()).await;
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
            // Both directions took a buffer to move their bytes; idle, both give them back.
            tokio::time::sleep(IDLE * 4).await;
            assert_eq!(
                LIVE_BUFFERS.get(),
                0,
                "round {round}: buffers kept while idle"
            );
        }
        // An exchange of requests never reads a bulk transfer's size at a time.
        assert_eq!(LARGEST_BUFFER.get(), FIRST_READ);
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
    async fn relayed(
        bulk: &BulkReads,
    ) -> (
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
        let bulk = bulk.clone();
        let relaying = tokio::spawn(async move { relay(&client, &upstream, &bulk).await });
        (agent, server, relaying)
    }

    #[tokio::test]
    async fn both_directions_arrive_whole_and_in_order_and_each_end_is_passed_on() {
        let (agent, server, relaying) = relayed(&BulkReads::new()).await;
        // Many times a bulk read, both ways at once.
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
        // Past the first megabyte, each direction reads a bulk transfer's size at a time.
        assert_eq!(LARGEST_BUFFER.get(), BULK_READ);
    }

    #[tokio::test]
    async fn one_side_ending_early_leaves_the_other_direction_flowing() {
        let (agent, mut server, relaying) = relayed(&BulkReads::new()).await;
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

    #[tokio::test]
    async fn an_agent_s_connections_hold_no_more_large_buffers_than_it_is_allowed() {
        // One large buffer for the agent; two downloads at once, each past its first megabyte.
        let bulk = BulkReads::with(1);
        let (first_agent, first_server, first) = relayed(&bulk).await;
        let (second_agent, second_server, second) = relayed(&bulk).await;
        let (one, two) = (pattern(9 << 20, 4), pattern(9 << 20, 5));
        let all = async {
            tokio::join!(
                exchange(first_agent, Vec::new()),
                exchange(first_server, one.clone()),
                exchange(second_agent, Vec::new()),
                exchange(second_server, two.clone()),
            )
        };
        let (at_first, _, at_second, _) = within_a_minute(all).await;
        within_a_minute(first).await.unwrap().unwrap();
        within_a_minute(second).await.unwrap().unwrap();
        assert!(
            at_first == one && at_second == two,
            "a download arrived changed"
        );
        assert_eq!(LARGEST_BUFFER.get(), BULK_READ, "neither read in bulk");
        assert_eq!(
            MOST_BULK.get(),
            1,
            "more large buffers than allowed at once"
        );
        assert_eq!(LIVE_BULK.get(), 0);
    }
}
