//! What a host hands the agent room to run one agent: the agent's spec, and the parts of
//! the host every supervisor shares.

use std::sync::Arc;
use std::time::Duration;

use camino::Utf8PathBuf;
use crew_core::config::AgentDef;
use crew_core::{AgentId, TaskId, WorkspaceId};
use crew_sandbox::sandbox::SandboxPlan;
use crew_sandbox::spawn::Spawner;
use tokio::sync::broadcast;

use crate::agent::env::BaseEnv;
use crate::agent::events::AgentEvent;
use crate::agent::status::OverCap;

/// The message a resume without one sends to agents whose `resume` template wants one.
pub const DEFAULT_RESUME_MESSAGE: &str = "Continue where you left off.";

/// Everything needed to run one agent.
#[derive(Debug, Clone)]
pub struct AgentSpec {
    /// The agent's id: its run and task.
    pub agent_id: AgentId,
    /// The workspace (project root) the agent belongs to.
    pub workspace: WorkspaceId,
    /// Where it works.
    pub dir: Utf8PathBuf,
    /// The agent definition it runs.
    pub definition: AgentDef,
    /// What it is asked to do.
    pub prompt: String,
    /// Stop the agent when one of its processes runs longer than this.
    pub timeout: Option<Duration>,
    /// Time between TERM and KILL.
    pub stop_grace: Duration,
    /// End the agent when every request through its proxy has failed upstream for this long
    /// and none got through (`[run] unreachable_timeout`); `None`: never.
    pub unreachable_timeout: Option<Duration>,
    /// `output.log`; its directory is created when missing.
    pub output_log: Utf8PathBuf,
    /// How large `output.log` may grow before it starts over (the part before is kept as
    /// `output.log.1`).
    pub output_log_limit: u64,
    /// The control socket agents reach their host on (`crew ask`), passed as `CREW_SOCKET`.
    pub socket: Option<Utf8PathBuf>,
    /// What the kernel lets the agent write.
    pub sandbox: SandboxPlan,
    /// Variables crew sets for this kind of workspace (such as `GIT_CEILING_DIRECTORIES`, so
    /// that git in a workspace inside the project never finds the project's repository).
    pub workspace_env: Vec<(String, String)>,
    /// git settings of the project the agent's git runs with whatever its home (its identity,
    /// `user.name` and `user.email`, as the repository resolves them), through git's
    /// `GIT_CONFIG_COUNT` variables.
    pub git_config: Vec<(String, String)>,
    /// The task whose agent submitted this one (a lead agent's sub-task), if any.
    pub parent: Option<TaskId>,
    /// The session an earlier start reported (see `Protocol`): what `{session_id}` in the
    /// resume template takes up, until the agent reports one itself.
    pub session_id: Option<String>,
    /// What that session has cost so far in US dollars, as recorded on the task (starts of
    /// other hosts): an `acp` agent reports its session's cost as a running total, and a
    /// resumed task's share is what comes on top.
    pub session_cost: Option<f64>,
    /// The task runs on a placement: `definition` is its transport, and this what runs there.
    pub placed: Option<crate::agent::placed::Placed>,
    /// Follow-ups sent to it that an earlier host had not delivered yet (recorded on its task
    /// when it was stopped): they wait for it as ones queued here do.
    pub follow_ups: Vec<String>,
    /// Where its proxy reports each request (`network = "proxy"`): the run's events.
    pub network_log: Option<crew_sandbox::proxy::NetworkLog>,
    /// What each of its turns' cost is held to (its task's, its run's and the day's spend
    /// caps), when any cap holds it.
    pub spend: Option<Arc<dyn SpendMeter>>,
}

/// What each turn's cost is held to (DESIGN §8c).
pub trait SpendMeter: Send + Sync + std::fmt::Debug {
    /// A turn cost `usd`: the cap this reached, if any.
    fn turn_cost(&self, usd: f64) -> Option<OverCap>;

    /// The agent starts again: where its task was paused at a cap, a person let it go on, and
    /// that cap allows another cap's worth — before its next turn is measured.
    fn going_on(&self);
}

/// The shared parts of a host that every supervisor uses.
#[derive(Debug, Clone)]
pub(crate) struct Launcher {
    pub spawner: Spawner,
    pub env: Arc<BaseEnv>,
    pub events: broadcast::Sender<AgentEvent>,
    /// Where agents' own connections are served, once the host serves a control socket.
    pub own_connections: Arc<std::sync::OnceLock<Arc<dyn OwnConnections>>>,
}

/// Serves an agent's own connection to its host (see [`crew_sandbox::sandbox::Namespace::control`]):
/// what the host's control server does, for the agents it starts.
pub(crate) trait OwnConnections: std::fmt::Debug + Send + Sync {
    /// Serves every connection on `listener` as the agent whose warden is `warden`, until the
    /// returned guard is dropped.
    fn serve(
        &self,
        listener: std::os::unix::net::UnixListener,
        warden: u32,
    ) -> Box<dyn std::any::Any + Send>;
}
