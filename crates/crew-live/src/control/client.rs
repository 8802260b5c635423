//! The caller's side: a connection to a host, an agent's own connection when it has one.

use std::io;
use std::time::Duration;

use camino::{Utf8Path, Utf8PathBuf};
use crew_core::WorkspaceId;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

use crate::control::socket::{ControlError, own_connection};
use crate::control::wire::{Op, Request, Response};

/// A connection to a host's control socket.
#[derive(Debug)]
pub struct ControlClient {
    path: Utf8PathBuf,
    reader: BufReader<UnixStream>,
    next_id: u64,
}

/// How long a client waits for a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Connects to the abstract unix socket `name` (a connection to an abstract socket does not
/// wait: there is a listener or there is not).
fn connect_abstract(name: &str) -> io::Result<UnixStream> {
    use std::os::linux::net::SocketAddrExt;
    let address = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
    let stream = std::os::unix::net::UnixStream::connect_addr(&address)?;
    stream.set_nonblocking(true)?;
    UnixStream::from_std(stream)
}

impl ControlClient {
    /// The socket it is connected to.
    pub fn path(&self) -> &Utf8Path {
        &self.path
    }

    /// Connects to the host at `path`. A socket without a listener (its host died) is reported
    /// as [`ControlError::HostGone`] at once.
    ///
    /// `@name` is an abstract socket: an agent's own connection to its host. Inside an agent
    /// that has one (its `CREW_SOCKET` is `@name`), every connection goes there, whatever
    /// `path` says: it is the agent's only way to its host (the host's socket is hidden from
    /// it), and the host answers it as that agent.
    pub async fn connect(path: &Utf8Path) -> Result<Self, ControlError> {
        let own = own_connection();
        let path = own.as_deref().map_or(path, Utf8Path::new);
        let connecting = async {
            match path.as_str().strip_prefix('@') {
                Some(name) => connect_abstract(name),
                None => UnixStream::connect(path).await,
            }
        };
        let stream = match tokio::time::timeout(CONNECT_TIMEOUT, connecting).await {
            Err(_) => {
                return Err(ControlError::Timeout {
                    path: path.to_owned(),
                    waited: CONNECT_TIMEOUT,
                });
            }
            Ok(Err(error))
                if matches!(
                    error.kind(),
                    io::ErrorKind::ConnectionRefused | io::ErrorKind::NotFound
                ) =>
            {
                return Err(ControlError::HostGone {
                    path: path.to_owned(),
                });
            }
            Ok(Err(source)) => {
                return Err(ControlError::Connect {
                    path: path.to_owned(),
                    source,
                });
            }
            Ok(Ok(stream)) => stream,
        };
        Ok(ControlClient {
            path: path.to_owned(),
            reader: BufReader::new(stream),
            next_id: 1,
        })
    }

    /// The connection, for reading what a host streams after an answer ([`Op::Watch`]).
    pub(crate) fn into_reader(self) -> BufReader<UnixStream> {
        self.reader
    }

    /// Sends one request and waits up to `timeout` for its answer.
    pub async fn call(
        &mut self,
        workspace: &WorkspaceId,
        op: Op,
        timeout: Duration,
    ) -> Result<Response, ControlError> {
        let request = Request {
            id: Some(self.next_id),
            workspace: workspace.as_path().to_owned(),
            op,
        };
        self.next_id += 1;
        let mut line = serde_json::to_vec(&request).map_err(|source| ControlError::Protocol {
            path: self.path.clone(),
            source,
        })?;
        line.push(b'\n');
        let io_error = |source| ControlError::Connect {
            path: self.path.clone(),
            source,
        };
        if let Err(error) = self.reader.get_mut().write_all(&line).await {
            // A host that refuses a connection ("busy") answers and closes at once, so the
            // request may not go out: its answer is still waiting to be read.
            let mut refusal = String::new();
            let pending = tokio::time::timeout(
                Duration::from_millis(200),
                self.reader.read_line(&mut refusal),
            )
            .await;
            if let (Ok(Ok(read)), Ok(response)) =
                (pending, serde_json::from_str::<Response>(&refusal))
                && read > 0
            {
                return Ok(response);
            }
            return Err(io_error(error));
        }
        let mut answer = String::new();
        let read = tokio::time::timeout(timeout, self.reader.read_line(&mut answer))
            .await
            .map_err(|_| ControlError::Timeout {
                path: self.path.clone(),
                waited: timeout,
            })?
            .map_err(|source| ControlError::Connect {
                path: self.path.clone(),
                source,
            })?;
        if read == 0 {
            return Err(ControlError::Closed {
                path: self.path.clone(),
            });
        }
        serde_json::from_str(&answer).map_err(|source| ControlError::Protocol {
            path: self.path.clone(),
            source,
        })
    }
}
