//! The control channel: a host serves its registry over a Unix socket, so that other `crew`
//! processes of the same workspace (and agents running `crew ask`) can list and steer its
//! agents.
//!
//! - The socket lives in a directory only the user can enter (0700, owner checked, never a
//!   symlink): `$XDG_RUNTIME_DIR/crew`, else `$TMPDIR/crew-<uid>`, else `/tmp/crew-<uid>`, the
//!   first whose paths fit a socket address. Its name is a hash of the workspace plus the host's
//!   pid, so long project paths never matter; the path is recorded in the run's manifest.
//! - The socket is 0600 whatever the umask, and the peer's uid is checked before anything is
//!   read.
//! - Requests and responses are JSON, one per line, each request at most [`MAX_REQUEST_BYTES`].
//!   A connection idle for [`IDLE_TIMEOUT`] is closed; at most [`MAX_CONNECTIONS`] are served
//!   at once. Malformed input gets a structured error, never a panic, and the server goes on.
//! - A client that finds no listener (a stale socket of a dead host) learns it at once.

use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::sync::Arc;
use std::time::Duration;

use camino::{Utf8Path, Utf8PathBuf};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use crew_core::{AgentId, CancelCause, CancelRecord, RunId, TaskId, WorkspaceId};
use dashmap::DashMap;
use tokio::sync::{mpsc, oneshot};

use crate::error::AgentOpError;
use crate::host::AgentHost;
use crate::procscan;
use crate::watch::{TaskFeed, serve_watch};

/// The largest request line a server reads; longer ones are answered with an error.
pub const MAX_REQUEST_BYTES: usize = 1024 * 1024;
/// How long a connection may stay silent.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// How many connections a server serves at once; more are answered "busy".
pub const MAX_CONNECTIONS: usize = 64;
/// How many of those the agents of a host may hold together, so that agents can never lock the
/// user out of their own host.
pub const MAX_AGENT_CONNECTIONS: usize = 32;
/// How many connections one agent (all its processes together) may hold at once.
pub const MAX_CONNECTIONS_PER_PEER: usize = 8;
/// How long a whole request may take to arrive, from its first byte to its newline: a client
/// trickling bytes cannot hold a connection longer.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(10);
/// The protocol version in every message.
pub const PROTOCOL_VERSION: u32 = 1;
/// The longest socket path the kernel accepts, minus its terminating NUL.
const MAX_SOCKET_PATH: usize = 107;

/// A request to a host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Request {
    /// Echoed in the response, to pair them.
    #[serde(default)]
    pub id: Option<u64>,
    /// The caller's workspace: only its agents are visible and controllable.
    pub workspace: Utf8PathBuf,
    /// What the caller wants.
    #[serde(flatten)]
    pub op: Op,
}

/// What the caller wants.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    /// Whether the host answers.
    Ping,
    /// The workspace's live agents.
    List,
    /// Streams what happens to the workspace's agents and tasks until the caller hangs up
    /// (see [`crate::watch`]). Only the user may watch.
    Watch,
    /// Delivers a message to a running agent now.
    Steer {
        /// The agent: its id or a unique part of it.
        agent: String,
        /// The message.
        message: String,
    },
    /// Queues a message for the end of the agent's turn (or resumes an exited agent with it).
    FollowUp {
        /// The agent: its id or a unique part of it.
        agent: String,
        /// The message.
        message: String,
    },
    /// Stops an agent: TERM, then KILL after the grace period.
    Stop {
        /// The agent: its id or a unique part of it.
        agent: String,
    },
    /// Starts a stopped or finished agent again in its workspace.
    Resume {
        /// The agent: its id or a unique part of it.
        agent: String,
        /// What to tell it, if anything.
        #[serde(default)]
        message: Option<String>,
    },
    /// Sent by an agent about itself (`crew ask`).
    Ask {
        /// The asking agent (its `CREW_AGENT_ID`).
        agent: AgentId,
        /// The question.
        question: String,
    },
    /// Cancels a run hosted here: its agents are stopped gracefully and their work kept.
    CancelRun {
        /// The run.
        run: RunId,
        /// The caller's `--force` (recorded: it cancels a run of another session).
        #[serde(default)]
        force: bool,
    },
    /// Tasks an agent submits to its own run (an agent-authored plan). They carry no
    /// workspace mode and no path: they run in the mode the run chose.
    SubmitTasks {
        /// The submitting agent (its `CREW_AGENT_ID`).
        agent: AgentId,
        /// The tasks.
        tasks: Vec<SubmittedTask>,
    },
}

/// A task submitted by a running agent. Only these fields are accepted: a workspace mode, a
/// directory or any other field is refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubmittedTask {
    /// The task id, unique in the run.
    pub id: String,
    /// The agent definition to run; the submitting agent's own when absent.
    #[serde(default)]
    pub agent: Option<String>,
    /// What the agent is asked to do.
    pub prompt: String,
    /// Ids of tasks (of the run or of this submission) that must succeed first.
    #[serde(default)]
    pub depends_on: Vec<String>,
}

/// A request the control channel hands to the runner of a run.
#[derive(Debug)]
pub enum RunCommand {
    /// Cancels the run: its agents stop gracefully and their work is kept.
    Cancel {
        /// The caller's workspace.
        workspace: WorkspaceId,
        /// Who asked, as the socket's peer credentials say.
        by: CancelRecord,
        /// Where the answer goes.
        reply: oneshot::Sender<Result<Value, ErrorBody>>,
    },
    /// Adds tasks an agent submitted to the run.
    Submit {
        /// The caller's workspace.
        workspace: WorkspaceId,
        /// The submitting agent.
        agent: AgentId,
        /// The tasks.
        tasks: Vec<SubmittedTask>,
        /// Where the answer goes.
        reply: oneshot::Sender<Result<Value, ErrorBody>>,
    },
    /// Starts a finished task of the run again by resuming its agent (its workspace was torn
    /// down, so the task is prepared anew).
    Resume {
        /// The caller's workspace.
        workspace: WorkspaceId,
        /// The task.
        task: TaskId,
        /// What to tell its agent, if anything.
        message: Option<String>,
        /// Where the answer goes.
        reply: oneshot::Sender<Result<Value, ErrorBody>>,
    },
}

/// The runs a server routes [`RunCommand`]s to.
pub type RunRoutes = Arc<DashMap<RunId, mpsc::Sender<RunCommand>>>;

/// The answer to a request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Response {
    /// The protocol version.
    pub v: u32,
    /// The request's id.
    #[serde(default)]
    pub id: Option<u64>,
    /// Whether the request succeeded.
    pub ok: bool,
    /// What it gave, when it succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// Why it failed, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorBody>,
}

/// A structured error: a stable code and a message for people.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// What went wrong, for programs.
    pub code: ErrorCode,
    /// What went wrong, for people.
    pub message: String,
}

impl ErrorBody {
    /// An error of `code` saying `message`.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ErrorBody {
            code,
            message: message.into(),
        }
    }
}

/// What went wrong with a request, for programs: stable across versions, written in
/// `snake_case` on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    // The connection and the request.
    /// The caller is another user.
    PermissionDenied,
    /// Too many connections: retry.
    Busy,
    /// The request is larger than a request may be.
    RequestTooLarge,
    /// The request is not valid JSON of the protocol.
    InvalidRequest,
    /// The caller's workspace is not a project folder.
    InvalidWorkspace,
    /// An agent asked for what only people may do.
    Forbidden,
    /// The host failed in a way that is not the caller's.
    Internal,
    // Agents.
    /// No live agent matches.
    NotFound,
    /// The agent belongs to another project folder.
    ForeignWorkspace,
    /// Several live agents match.
    Ambiguous,
    /// The agent cannot be steered while it runs.
    SteerUnsupported,
    /// The agent is not running.
    NotRunning,
    /// The agent is already running.
    AlreadyRunning,
    /// The agent's workspace was torn down.
    Closed,
    /// The agent did not take the message.
    Input,
    /// The agent could not be started again.
    Restart,
    /// The agent is no longer supervised.
    Gone,
    /// The agent has finished and its task's check runs.
    Checking,
    // Runs.
    /// No run of that id is hosted here.
    UnknownRun,
    /// The run is ending.
    RunStopping,
    /// The submitted tasks break a rule.
    InvalidTasks,
    /// The task already succeeded: it is not started again.
    Succeeded,
    /// The run's state could not be read or written.
    State,
    /// A code from a newer crew than this one.
    #[serde(other)]
    Unknown,
}

impl std::fmt::Display for ErrorCode {
    /// The code as it is written on the wire.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let wire = serde_json::to_value(self).ok();
        f.write_str(wire.as_ref().and_then(Value::as_str).unwrap_or("unknown"))
    }
}

impl Response {
    fn ok(id: Option<u64>, result: Value) -> Self {
        Response {
            v: PROTOCOL_VERSION,
            id,
            ok: true,
            result: Some(result),
            error: None,
        }
    }

    fn error(id: Option<u64>, code: ErrorCode, message: impl Into<String>) -> Self {
        Response {
            v: PROTOCOL_VERSION,
            id,
            ok: false,
            result: None,
            error: Some(ErrorBody::new(code, message)),
        }
    }
}

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

fn ensure_private_dir(dir: &Utf8Path, uid: u32) -> Result<(), ControlError> {
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

/// A host's control socket, served until dropped.
#[derive(Debug)]
pub struct ControlServer {
    path: Utf8PathBuf,
    task: JoinHandle<()>,
    runs: RunRoutes,
    tasks: TaskFeedSlot,
}

/// The task changes a server streams to watchers, once its runner exists.
type TaskFeedSlot = Arc<std::sync::OnceLock<TaskFeed>>;

impl ControlServer {
    /// Binds a socket for `workspace` in [`socket_dir`] and serves `host`'s registry on it.
    pub async fn bind(host: AgentHost, workspace: &WorkspaceId) -> Result<Self, ControlError> {
        Self::bind_in(host, workspace, &socket_dir()?).await
    }

    /// Like [`ControlServer::bind`], in a directory of the caller's choosing (created 0700 and
    /// checked like the default one).
    pub async fn bind_in(
        host: AgentHost,
        workspace: &WorkspaceId,
        dir: &Utf8Path,
    ) -> Result<Self, ControlError> {
        ensure_private_dir(dir, rustix::process::geteuid().as_raw())?;
        let pid = std::process::id();
        let hash = workspace_hash(workspace);
        for attempt in 0..1000 {
            let path = dir.join(format!("{hash}-{pid}-{attempt}.sock"));
            if std::fs::symlink_metadata(&path).is_ok() {
                // A live host keeps its socket; a dead one's is stale and may go.
                if std::os::unix::net::UnixStream::connect(&path).is_ok() {
                    continue;
                }
                // A dead host's socket left in place answers nobody; binding finds another name.
                let _ = std::fs::remove_file(&path);
            }
            return Self::bind_at(host, path).await;
        }
        Err(ControlError::NoSocketDir)
    }

    /// Serves `host`'s registry on a socket at `path`, which must not exist.
    pub async fn bind_at(host: AgentHost, path: Utf8PathBuf) -> Result<Self, ControlError> {
        let bind_error = |source| ControlError::Bind {
            path: path.clone(),
            source,
        };
        let listener = UnixListener::bind(&path).map_err(bind_error)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
            .map_err(bind_error)?;
        let runs = RunRoutes::default();
        let tasks = TaskFeedSlot::default();
        let serving = Serving {
            host: host.clone(),
            runs: runs.clone(),
            tasks: tasks.clone(),
            permits: Arc::new(Semaphore::new(MAX_CONNECTIONS)),
            agent_permits: Arc::new(Semaphore::new(MAX_AGENT_CONNECTIONS)),
            peers: PeerCounts::default(),
            uid: rustix::process::geteuid().as_raw(),
            own_wardens: procscan::warden_ancestors(std::process::id())
                .into_iter()
                .map(|(warden, _)| warden)
                .collect(),
        };
        host.serve_own_connections(Arc::new(serving.clone()));
        let task = tokio::spawn(serve(listener, serving, None));
        Ok(ControlServer {
            path,
            task,
            runs,
            tasks,
        })
    }

    /// Streams the task changes of the runs executed for `workspace` to its watchers (set
    /// once: a host executes the runs of one workspace).
    pub(crate) fn feed_tasks(&self, feed: TaskFeed) {
        // A second feed is the same runner's: the first one stays.
        let _first_stays = self.tasks.set(feed);
    }

    /// Routes cancel and task-submission requests for `run_id` to its runner.
    pub fn attach_run(&self, run_id: RunId, commands: mpsc::Sender<RunCommand>) {
        self.runs.insert(run_id, commands);
    }

    /// Stops routing requests for `run_id`: its run has ended.
    pub fn detach_run(&self, run_id: &RunId) {
        self.runs.remove(run_id);
    }

    /// The run routes this server hands requests through, shared: a run going on in the
    /// background detaches itself when it ends.
    pub fn routes(&self) -> RunRoutes {
        self.runs.clone()
    }

    /// The socket's path.
    pub fn path(&self) -> &Utf8Path {
        &self.path
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.task.abort();
        // Left behind, the socket is a dead host's: reconciling removes it.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Who is on the other end of a connection, from the kernel's word on its process (never from
/// what it claims): a process descending from one of this host's wardens is that agent; one
/// descending from another crew host's warden is a foreign agent; anything else is the user.
/// Wardens above this host (an agent that started this host itself) do not count: that agent
/// is this host's user.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Caller {
    Person,
    /// An agent of this host, by the pid of its warden.
    Agent {
        warden: u32,
    },
    Foreign {
        warden: u32,
    },
}

impl Caller {
    /// Traces the process that connected (`peer_pid`, the kernel's word at `connect`), failing
    /// closed: a peer that cannot be traced — outside this pid namespace, gone before it was
    /// looked at (an agent's child that connected and was reaped), or gone while it was traced
    /// (its pid free for another process to take) — is trusted with nothing.
    fn of(peer_pid: Option<u32>, own_wardens: &[u32]) -> Self {
        const UNKNOWN: Caller = Caller::Foreign { warden: 0 };
        let Some(pid) = peer_pid.filter(|pid| *pid > 0) else {
            return UNKNOWN;
        };
        // Held while the chain is read: the process itself, whatever its pid comes to name.
        let Some(process) = rustix::process::Pid::from_raw(pid as i32).and_then(|raw| {
            rustix::process::pidfd_open(raw, rustix::process::PidfdFlags::empty()).ok()
        }) else {
            return UNKNOWN;
        };
        let host = std::process::id();
        let nearest = procscan::warden_ancestors(pid)
            .into_iter()
            .find(|(warden, _)| !own_wardens.contains(warden));
        // Still that process once read (its pidfd not yet readable, which it becomes when it
        // exits): the chain read was its own.
        let mut ready = [rustix::event::PollFd::new(
            &process,
            rustix::event::PollFlags::IN,
        )];
        let exited = rustix::event::poll(&mut ready, Some(&rustix::event::Timespec::default()))
            .map_or(true, |ready| ready > 0);
        if exited {
            return UNKNOWN;
        }
        match nearest {
            None => Caller::Person,
            Some((warden, parent)) if parent == host => Caller::Agent { warden },
            Some((warden, _)) => Caller::Foreign { warden },
        }
    }

    fn is_agent(self) -> bool {
        self != Caller::Person
    }
}

/// Connections held now, per caller.
type PeerCounts = Arc<DashMap<Caller, usize>>;

/// Counts a connection of `caller` while it lives.
struct PeerSlot {
    counts: PeerCounts,
    caller: Caller,
}

impl PeerSlot {
    fn take(counts: &PeerCounts, caller: Caller) -> Option<Self> {
        let mut count = counts.entry(caller).or_insert(0);
        if *count >= MAX_CONNECTIONS_PER_PEER {
            return None;
        }
        *count += 1;
        drop(count);
        Some(PeerSlot {
            counts: counts.clone(),
            caller,
        })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let caller = self.caller;
        let emptied = match self.counts.get_mut(&caller) {
            Some(mut count) => {
                *count = count.saturating_sub(1);
                *count == 0
            }
            None => false,
        };
        if emptied {
            self.counts.remove_if(&caller, |_, count| *count == 0);
        }
    }
}

/// What every connection of a server shares: the host and its runs, and the limits.
#[derive(Clone)]
struct Serving {
    host: AgentHost,
    runs: RunRoutes,
    tasks: TaskFeedSlot,
    permits: Arc<Semaphore>,
    agent_permits: Arc<Semaphore>,
    peers: PeerCounts,
    uid: u32,
    /// Wardens above this host (an agent that started it): they do not make its callers agents.
    own_wardens: Arc<[u32]>,
}

impl std::fmt::Debug for Serving {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Serving").field("uid", &self.uid).finish()
    }
}

/// Ends a task when dropped.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl crate::agent::OwnConnections for Serving {
    fn serve(
        &self,
        listener: std::os::unix::net::UnixListener,
        warden: u32,
    ) -> Box<dyn std::any::Any + Send> {
        let listener = listener
            .set_nonblocking(true)
            .and_then(|()| UnixListener::from_std(listener));
        match listener {
            Ok(listener) => Box::new(AbortOnDrop(tokio::spawn(serve(
                listener,
                self.clone(),
                Some(warden),
            )))),
            // Not served: the agent's `crew ask` finds no host, and says so.
            Err(_) => Box::new(()),
        }
    }
}

/// Serves connections on `listener`: the host's own socket, whose callers are told apart by
/// the kernel's word on their process (`as_agent` `None`), or an agent's own connection, whose
/// every caller is that agent (its warden's pid) by construction — only the agent's sandbox
/// can connect to it.
async fn serve(listener: UnixListener, serving: Serving, as_agent: Option<u32>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            // Out of descriptors or similar: back off instead of spinning.
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let serving = serving.clone();
        tokio::spawn(async move {
            let credentials = stream.peer_cred().ok();
            if credentials.map(|cred| cred.uid()) != Some(serving.uid) {
                refuse(
                    stream,
                    ErrorCode::PermissionDenied,
                    "only the user running the host may use its socket",
                )
                .await;
                return;
            }
            let peer_pid = credentials
                .and_then(|cred| cred.pid())
                .and_then(|pid| u32::try_from(pid).ok());
            let caller = match as_agent {
                Some(warden) => Caller::Agent { warden },
                None => Caller::of(peer_pid, &serving.own_wardens),
            };
            // Agents are capped one by one and together; the user's own clients (an editor may
            // hold many) only by the host's limit.
            let mut _agent_slot = None;
            if caller.is_agent() {
                let (Some(slot), Ok(permit)) = (
                    PeerSlot::take(&serving.peers, caller),
                    serving.agent_permits.clone().try_acquire_owned(),
                ) else {
                    refuse(stream, ErrorCode::Busy,
                        "this agent (or the host's agents together) holds too many connections; retry",
                    )
                    .await;
                    return;
                };
                _agent_slot = Some((slot, permit));
            }
            let Ok(_permit) = serving.permits.clone().try_acquire_owned() else {
                refuse(
                    stream,
                    ErrorCode::Busy,
                    "the host serves too many connections; retry",
                )
                .await;
                return;
            };
            let peer = Peer {
                pid: peer_pid,
                uid: serving.uid,
            };
            let Serving {
                host, runs, tasks, ..
            } = serving;
            serve_connection(stream, host, runs, tasks, caller, peer).await;
        });
    }
}

async fn refuse(mut stream: UnixStream, code: ErrorCode, message: &str) {
    let response = Response::error(None, code, message);
    // A refused client that does not read its refusal learns it from the closed stream.
    let _ = write_response(&mut stream, &response).await;
}

async fn write_response(
    stream: &mut (impl AsyncWriteExt + Unpin),
    response: &Response,
) -> io::Result<()> {
    let mut line = serde_json::to_vec(response).unwrap_or_else(|_| b"{\"ok\":false}".to_vec());
    line.push(b'\n');
    stream.write_all(&line).await?;
    stream.flush().await
}

/// One request line, or why there is none.
enum Line {
    Request(Vec<u8>),
    TooLarge,
    End,
}

/// Reads one request line: the connection may be idle for [`IDLE_TIMEOUT`] before it starts,
/// and the whole line must then arrive within [`REQUEST_DEADLINE`].
async fn read_line(reader: &mut BufReader<UnixStream>) -> io::Result<Line> {
    let mut line = Vec::new();
    let mut too_large = false;
    let mut deadline = tokio::time::Instant::now() + IDLE_TIMEOUT;
    let mut started = false;
    loop {
        let buffer = tokio::time::timeout_at(deadline, reader.fill_buf())
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "idle or slow connection"))??;
        if !started && !buffer.is_empty() {
            started = true;
            deadline = tokio::time::Instant::now() + REQUEST_DEADLINE;
        }
        if buffer.is_empty() {
            return Ok(if too_large {
                Line::TooLarge
            } else if line.is_empty() {
                Line::End
            } else {
                Line::Request(line)
            });
        }
        let (chunk, found_newline) = match buffer.iter().position(|&byte| byte == b'\n') {
            Some(newline) => (&buffer[..newline], true),
            None => (buffer, false),
        };
        if !too_large {
            if line.len() + chunk.len() > MAX_REQUEST_BYTES {
                // Keep reading to the newline without storing: the connection stays usable.
                too_large = true;
                line = Vec::new();
            } else {
                line.extend_from_slice(chunk);
            }
        }
        let consumed = chunk.len() + usize::from(found_newline);
        reader.consume(consumed);
        if found_newline {
            return Ok(if too_large {
                Line::TooLarge
            } else {
                Line::Request(line)
            });
        }
    }
}

/// The process on the other end of a connection, from the kernel.
#[derive(Debug, Clone, Copy)]
struct Peer {
    pid: Option<u32>,
    uid: u32,
}

async fn serve_connection(
    stream: UnixStream,
    host: AgentHost,
    runs: RunRoutes,
    tasks: TaskFeedSlot,
    caller: Caller,
    peer: Peer,
) {
    let mut reader = BufReader::new(stream);
    loop {
        let response = match read_line(&mut reader).await {
            Ok(Line::End) | Err(_) => return,
            Ok(Line::TooLarge) => Response::error(
                None,
                ErrorCode::RequestTooLarge,
                format!("a request may be at most {MAX_REQUEST_BYTES} bytes"),
            ),
            Ok(Line::Request(line)) => match serde_json::from_slice::<Request>(&line) {
                Ok(request) => match authorize(&host, caller, &request).await {
                    Ok(()) if request.op == Op::Watch => {
                        match WorkspaceId::from_path(request.workspace.as_std_path()) {
                            Ok(workspace) => {
                                let feed = tasks.get().cloned();
                                let stream = reader.into_inner();
                                serve_watch(stream, host, feed, workspace, request.id).await;
                                return;
                            }
                            Err(error) => Response::error(
                                request.id,
                                ErrorCode::InvalidWorkspace,
                                error.to_string(),
                            ),
                        }
                    }
                    Ok(()) => handle(&host, &runs, request, peer).await,
                    Err(refusal) => *refusal,
                },
                Err(error) => Response::error(None, ErrorCode::InvalidRequest, error.to_string()),
            },
        };
        if write_response(reader.get_mut(), &response).await.is_err() {
            return;
        }
    }
}

fn op_error(id: Option<u64>, error: &AgentOpError) -> Response {
    Response::error(id, error.code(), error.to_string())
}

/// What a caller may do: the user anything; an agent of this host only ask and submit for
/// itself; an agent of another host nothing but ping.
async fn authorize(
    host: &AgentHost,
    caller: Caller,
    request: &Request,
) -> Result<(), Box<Response>> {
    let id = request.id;
    let forbidden =
        |message: String| Err(Box::new(Response::error(id, ErrorCode::Forbidden, message)));
    match (caller, &request.op) {
        (Caller::Person, _) | (_, Op::Ping) => Ok(()),
        (Caller::Foreign { warden: 0 }, _) => forbidden(
            "the caller could not be identified (it exited before it was traced, or runs outside this pid namespace): only ping is answered".to_owned(),
        ),
        (Caller::Foreign { .. }, _) => {
            forbidden("an agent of another crew host may not use this host's socket".to_owned())
        }
        (Caller::Agent { warden }, op) => {
            let Some(own) = host.registry().agent_with_pid_soon(warden).await else {
                return forbidden("the calling agent is not known to this host".to_owned());
            };
            match op {
                Op::Ask { agent, .. } | Op::SubmitTasks { agent, .. } if *agent == own => Ok(()),
                Op::Ask { .. } | Op::SubmitTasks { .. } => {
                    forbidden(format!("agent {own} may only ask and submit for itself"))
                }
                _ => forbidden(format!(
                    "agent {own} may only ask and submit for itself; listing, steering and stopping agents takes the user's own `crew`"
                )),
            }
        }
    }
}

async fn handle(host: &AgentHost, runs: &RunRoutes, request: Request, peer: Peer) -> Response {
    let id = request.id;
    // Every spelling of a directory (symlink, `..`, trailing slash) is the same workspace.
    let workspace = match WorkspaceId::from_path(request.workspace.as_std_path()) {
        Ok(workspace) => workspace,
        Err(error) => return Response::error(id, ErrorCode::InvalidWorkspace, error.to_string()),
    };
    let registry = host.registry();
    let json = |value: Result<Value, serde_json::Error>| match value {
        Ok(value) => Response::ok(id, value),
        Err(error) => Response::error(id, ErrorCode::Internal, error.to_string()),
    };
    match request.op {
        Op::Ping => Response::ok(id, serde_json::json!({ "pid": std::process::id() })),
        Op::List => json(serde_json::to_value(registry.list(&workspace))),
        // Served by `serve_connection`, which keeps the connection for the stream.
        Op::Watch => Response::error(id, ErrorCode::Internal, "watch is served apart"),
        Op::Steer { agent, message } => match registry.steer(&workspace, &agent, &message).await {
            Ok(agent_id) => json(Ok(serde_json::json!({ "agent_id": agent_id }))),
            Err(error) => op_error(id, &error),
        },
        Op::FollowUp { agent, message } => {
            match registry.follow_up(&workspace, &agent, &message).await {
                Ok((agent_id, outcome)) => json(Ok(
                    serde_json::json!({ "agent_id": agent_id, "follow_up": outcome }),
                )),
                Err(AgentOpError::Closed { agent_id }) => {
                    let mut response = requeue(id, runs, workspace, &agent_id, Some(message)).await;
                    if let Some(result) = &mut response.result {
                        result["follow_up"] = serde_json::json!({ "outcome": "requeued" });
                    }
                    response
                }
                Err(error) => op_error(id, &error),
            }
        }
        Op::Stop { agent } => match registry.stop(&workspace, &agent).await {
            Ok((agent_id, outcome)) => json(Ok(
                serde_json::json!({ "agent_id": agent_id, "stop": outcome }),
            )),
            Err(error) => op_error(id, &error),
        },
        Op::Resume { agent, message } => match registry
            .resume(&workspace, &agent, message.as_deref())
            .await
        {
            Ok((agent_id, pid)) => {
                json(Ok(serde_json::json!({ "agent_id": agent_id, "pid": pid })))
            }
            Err(AgentOpError::Closed { agent_id }) => {
                requeue(id, runs, workspace, &agent_id, message).await
            }
            Err(error) => op_error(id, &error),
        },
        Op::Ask { agent, question } => match registry.ask(&workspace, &agent, &question).await {
            Ok(()) => json(Ok(serde_json::json!({ "agent_id": agent }))),
            Err(error) => op_error(id, &error),
        },
        Op::CancelRun { run, force } => {
            let host_session = procscan::session_of(None);
            let caller_session = peer.pid.and_then(|pid| procscan::session_of(Some(pid)));
            let by = CancelRecord {
                pid: peer.pid,
                uid: Some(peer.uid),
                other_session: procscan::same_session(host_session, caller_session)
                    .map(|same| !same),
                forced: force,
                ..CancelRecord::new(CancelCause::RunsCancel)
            };
            route(id, runs, &run, |reply| RunCommand::Cancel {
                workspace,
                by,
                reply,
            })
            .await
        }
        Op::SubmitTasks { agent, tasks } => {
            let run = agent.run_id().clone();
            route(id, runs, &run, |reply| RunCommand::Submit {
                workspace,
                agent,
                tasks,
                reply,
            })
            .await
        }
    }
}

/// An agent whose task has finished in a run that goes on: its runner starts the task again.
/// A run not hosted here leaves the agent closed, as the registry said.
async fn requeue(
    id: Option<u64>,
    runs: &RunRoutes,
    workspace: WorkspaceId,
    agent_id: &AgentId,
    message: Option<String>,
) -> Response {
    let run = agent_id.run_id();
    if !runs.contains_key(run) {
        let closed = AgentOpError::Closed {
            agent_id: agent_id.clone(),
        };
        return op_error(id, &closed);
    }
    route(id, runs, run, |reply| RunCommand::Resume {
        workspace,
        task: agent_id.task_id().clone(),
        message,
        reply,
    })
    .await
}

/// Hands a run command to the runner of `run` and relays its answer.
async fn route(
    id: Option<u64>,
    runs: &RunRoutes,
    run: &RunId,
    build: impl FnOnce(oneshot::Sender<Result<Value, ErrorBody>>) -> RunCommand,
) -> Response {
    let Some(commands) = runs.get(run).map(|entry| entry.value().clone()) else {
        return Response::error(
            id,
            ErrorCode::UnknownRun,
            format!("run {run} is not hosted here"),
        );
    };
    let (reply, answer) = oneshot::channel();
    if commands.send(build(reply)).await.is_err() {
        return Response::error(id, ErrorCode::UnknownRun, format!("run {run} has ended"));
    }
    match answer.await {
        Ok(Ok(value)) => Response::ok(id, value),
        Ok(Err(error)) => Response::error(id, error.code, error.message),
        Err(_) => Response::error(id, ErrorCode::UnknownRun, format!("run {run} has ended")),
    }
}

/// A connection to a host's control socket.
#[derive(Debug)]
pub struct ControlClient {
    path: Utf8PathBuf,
    reader: BufReader<UnixStream>,
    next_id: u64,
}

/// How long a client waits for a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// The own connection of the agent this process runs in (`CREW_SOCKET=@name`), if it has one.
fn own_connection() -> Option<String> {
    std::env::var(crew_core::env_vars::CREW_SOCKET)
        .ok()
        .filter(|socket| socket.starts_with('@'))
}

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
