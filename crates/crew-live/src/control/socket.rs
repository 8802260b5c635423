//! Where control sockets live: a private directory of the user's, checked before use, and
//! names that fit a socket address.

use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::time::Duration;

use camino::{Utf8Path, Utf8PathBuf};
use crew_core::WorkspaceId;

/// The longest socket path the kernel accepts, minus its terminating NUL.
const MAX_SOCKET_PATH: usize = 107;

/// The control channel failed.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// The socket directory is not safe: another user owns it, or others may write it.
    #[error("the socket directory {path} is not safe to use: {problem}")]
    UnsafeSocketDir {
        /// The directory.
        path: Utf8PathBuf,
        /// What is wrong with it.
        problem: String,
    },
    /// Every candidate path for the socket is too long.
    #[error("no directory for the control socket: every candidate path is too long or unusable")]
    NoSocketDir,
    /// The socket directory could not be made.
    #[error("failed to create the socket directory {path}")]
    CreateSocketDir {
        /// The directory.
        path: Utf8PathBuf,
        /// Why it could not be made.
        #[source]
        source: io::Error,
    },
    /// The socket could not be bound.
    #[error("failed to bind the control socket {path}")]
    Bind {
        /// The socket.
        path: Utf8PathBuf,
        /// Why it could not be bound.
        #[source]
        source: io::Error,
    },
    /// Nothing listens on the socket any more.
    #[error("the host behind {path} is gone (stale socket)")]
    HostGone {
        /// The socket.
        path: Utf8PathBuf,
    },
    /// The socket could not be reached.
    #[error("failed to reach the host at {path}")]
    Connect {
        /// The socket.
        path: Utf8PathBuf,
        /// Why it could not be reached.
        #[source]
        source: io::Error,
    },
    /// The host did not answer in time.
    #[error("the host at {path} did not answer within {waited:?}")]
    Timeout {
        /// The socket.
        path: Utf8PathBuf,
        /// How long crew waited.
        waited: Duration,
    },
    /// The host closed the connection before it answered.
    #[error("the host at {path} closed the connection")]
    Closed {
        /// The socket.
        path: Utf8PathBuf,
    },
    /// The host's answer is not the protocol.
    #[error("the host at {path} answered something crew cannot read")]
    Protocol {
        /// The socket.
        path: Utf8PathBuf,
        /// What the parser said.
        #[source]
        source: serde_json::Error,
    },
}

/// The directory control sockets go in, created 0700 when missing and checked when present:
/// a real directory, owned by this user, closed to everyone else.
pub fn socket_dir() -> Result<Utf8PathBuf, ControlError> {
    let uid = rustix::process::geteuid().as_raw();
    let mut candidates = Vec::new();
    if let Ok(runtime) = std::env::var("XDG_RUNTIME_DIR")
        && Utf8Path::new(&runtime).is_absolute()
        && Utf8Path::new(&runtime).is_dir()
    {
        candidates.push(Utf8PathBuf::from(runtime).join("crew"));
    }
    if let Ok(tmp) = std::env::var("TMPDIR")
        && Utf8Path::new(&tmp).is_absolute()
    {
        candidates.push(Utf8PathBuf::from(tmp).join(format!("crew-{uid}")));
    }
    candidates.push(Utf8PathBuf::from(format!("/tmp/crew-{uid}")));
    // Room for `/<16 hex>-<pid>-<n>.sock`.
    let room = 1 + 16 + 1 + 10 + 1 + 4 + 5;
    let mut last_error = None;
    for dir in candidates {
        if dir.as_str().len() + room > MAX_SOCKET_PATH {
            continue;
        }
        match ensure_private_dir(&dir, uid) {
            Ok(()) => return Ok(dir),
            Err(error) => last_error = Some(error),
        }
    }
    Err(last_error.unwrap_or(ControlError::NoSocketDir))
}

/// Whether a socket path read back from state (a run's manifest, which an agent working in the
/// project could have edited) is one a crew host would have made: a socket of this user in a
/// private directory of this user. Nothing else is ever connected to.
pub fn is_plausible_socket(path: &Utf8Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    // Inside an agent with a connection of its own, hosts' sockets are hidden from it: it
    // reaches its host by that connection (see `ControlClient::connect`), whatever the path.
    if own_connection().is_some() {
        return path.is_absolute();
    }
    let uid = rustix::process::geteuid().as_raw();
    let normal = path.is_absolute()
        && path
            .components()
            .all(|component| !matches!(component, camino::Utf8Component::ParentDir));
    let Some(dir) = path.parent().filter(|_| normal) else {
        return false;
    };
    let private_dir = std::fs::symlink_metadata(dir).is_ok_and(|metadata| {
        metadata.is_dir() && metadata.uid() == uid && metadata.mode() & 0o077 == 0
    });
    private_dir
        && std::fs::symlink_metadata(path)
            .is_ok_and(|metadata| metadata.file_type().is_socket() && metadata.uid() == uid)
}

pub(super) fn ensure_private_dir(dir: &Utf8Path, uid: u32) -> Result<(), ControlError> {
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(
                |source| ControlError::CreateSocketDir {
                    path: dir.to_owned(),
                    source,
                },
            )?;
        }
        Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {}
        Err(source) => {
            return Err(ControlError::CreateSocketDir {
                path: dir.to_owned(),
                source,
            });
        }
    }
    let unsafe_dir = |problem: &str| ControlError::UnsafeSocketDir {
        path: dir.to_owned(),
        problem: problem.to_owned(),
    };
    let metadata =
        std::fs::symlink_metadata(dir).map_err(|source| ControlError::CreateSocketDir {
            path: dir.to_owned(),
            source,
        })?;
    if metadata.file_type().is_symlink() || !metadata.is_dir() {
        return Err(unsafe_dir("it is not a real directory"));
    }
    if metadata.uid() != uid {
        return Err(unsafe_dir("it belongs to another user"));
    }
    if metadata.mode() & 0o077 != 0 {
        return Err(unsafe_dir("others may enter it (its mode must be 0700)"));
    }
    Ok(())
}

/// A short, stable name for a workspace.
pub fn workspace_hash(workspace: &WorkspaceId) -> String {
    format!(
        "{:016x}",
        crew_core::ids::stable_hash(workspace.as_path().as_str())
    )
}

/// The own connection of the agent this process runs in (`CREW_SOCKET=@name`), if it has one.
pub(super) fn own_connection() -> Option<String> {
    std::env::var(crew_core::env_vars::CREW_SOCKET)
        .ok()
        .filter(|socket| socket.starts_with('@'))
}
