//! The messages of the protocol, both ways: requests (`Op`), answers (`Response`, with an
//! `ErrorBody` and its `ErrorCode`), and the commands the server hands a run.

use std::sync::Arc;
use std::time::Duration;

use camino::Utf8PathBuf;
use crew_core::{AgentId, CancelRecord, RunId, TaskId, WorkspaceId};
use dashmap::DashMap;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

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
/// How long a client waits for a live host's answer (a stop waits for the grace period).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a whole request may take to arrive, from its first byte to its newline: a client
/// trickling bytes cannot hold a connection longer.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(10);
/// The protocol version in every message.
pub const PROTOCOL_VERSION: u32 = 1;

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
    /// (see [`crate::project::watch`]). Only the user may watch.
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

/// The answer to a request: what it gave, or why it failed — one `Result`. On the wire,
/// `{"v":1,"id":…,"ok":true,"result":…}` or `{"v":1,"id":…,"ok":false,"error":{…}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(into = "ResponseWire", from = "ResponseWire")]
pub struct Response {
    /// The protocol version.
    pub v: u32,
    /// The request's id.
    pub id: Option<u64>,
    /// What it gave, or why it failed.
    pub answer: Result<Value, ErrorBody>,
}

/// [`Response`] as it is written.
#[derive(Serialize, Deserialize)]
struct ResponseWire {
    v: u32,
    #[serde(default)]
    id: Option<u64>,
    ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    result: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<ErrorBody>,
}

impl From<Response> for ResponseWire {
    fn from(response: Response) -> Self {
        let (ok, result, error) = match response.answer {
            Ok(result) => (true, Some(result), None),
            Err(error) => (false, None, Some(error)),
        };
        ResponseWire {
            v: response.v,
            id: response.id,
            ok,
            result,
            error,
        }
    }
}

impl From<ResponseWire> for Response {
    fn from(wire: ResponseWire) -> Self {
        let answer = match (wire.ok, wire.error) {
            (true, _) => Ok(wire.result.unwrap_or_default()),
            (false, Some(error)) => Err(error),
            (false, None) => Err(ErrorBody::new(
                ErrorCode::Internal,
                "the host refused without saying why",
            )),
        };
        Response {
            v: wire.v,
            id: wire.id,
            answer,
        }
    }
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
    pub(crate) fn ok(id: Option<u64>, result: Value) -> Self {
        Response {
            v: PROTOCOL_VERSION,
            id,
            answer: Ok(result),
        }
    }

    pub(super) fn error(id: Option<u64>, code: ErrorCode, message: impl Into<String>) -> Self {
        Response {
            v: PROTOCOL_VERSION,
            id,
            answer: Err(ErrorBody::new(code, message)),
        }
    }
}
