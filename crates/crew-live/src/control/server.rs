//! The host's side: the socket served, who each caller is (the user, one of its agents
//! through its own connection, or a foreign caller), the caps on connections, and each
//! request handled.

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::time::Duration;

use camino::{Utf8Path, Utf8PathBuf};
use crew_core::{AgentId, CancelCause, CancelRecord, RunId, WorkspaceId};
use crew_sandbox::procscan;
use dashmap::DashMap;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::agent::error::AgentOpError;
use crate::control::agents::AgentHost;
use crate::control::socket::{ControlError, ensure_private_dir, socket_dir, workspace_hash};
use crate::control::watch::{TaskFeed, serve_watch};
use crate::control::wire::{
    ErrorBody, ErrorCode, IDLE_TIMEOUT, MAX_AGENT_CONNECTIONS, MAX_CONNECTIONS,
    MAX_CONNECTIONS_PER_PEER, MAX_REQUEST_BYTES, Op, REQUEST_DEADLINE, Request, Response,
    RunCommand, RunRoutes,
};

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
                    if let Ok(result) = &mut response.answer {
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
