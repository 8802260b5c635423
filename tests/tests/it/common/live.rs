//! Live agents in this process: a host, a workspace and a run id to start them under, the fake
//! agent, and waiting for what they print.

use std::time::{Duration, Instant};

use crew_core::config::{AgentDef, SteerMode};
use crew_core::{AgentId, RunId, TaskId, WorkspaceId};
use crew_live::{AgentEvent, AgentHost, AgentSpec};
use crew_tests::TestEnv;
use tokio::sync::broadcast;

/// The fake agent helper binary.
pub const FAKE_AGENT: &str = env!("CARGO_BIN_EXE_fake-agent");

pub struct LiveFixture {
    pub env: TestEnv,
    pub host: AgentHost,
    pub workspace: WorkspaceId,
    pub run_id: RunId,
}

impl LiveFixture {
    pub fn new() -> Self {
        Self::in_env(TestEnv::new())
    }

    pub fn in_env(env: TestEnv) -> Self {
        let dir = env.dir("project");
        let workspace = WorkspaceId::from_path(dir.as_std_path()).unwrap();
        LiveFixture {
            host: AgentHost::new().unwrap(),
            env,
            workspace,
            run_id: RunId::generate(),
        }
    }

    pub fn spec(&self, task: &str, definition: AgentDef) -> AgentSpec {
        AgentSpec {
            agent_id: self.agent_id(task),
            workspace: self.workspace.clone(),
            dir: self.workspace.as_path().to_owned(),
            definition,
            prompt: "the prompt".into(),
            timeout: None,
            stop_grace: Duration::from_millis(500),
            unreachable_timeout: None,
            output_log: self.env.root().join("logs").join(format!("{task}.log")),
            output_log_limit: 64 << 20,
            socket: None,
            sandbox: crew_live::SandboxPlan::confined_to(self.workspace.as_path()),
            workspace_env: Vec::new(),
            git_config: Vec::new(),
            session_id: None,
            session_cost: None,
            placed: None,
            follow_ups: Vec::new(),
            network_log: None,
            spend: None,
            parent: None,
        }
    }

    pub fn agent_id(&self, task: &str) -> AgentId {
        AgentId::new(self.run_id.clone(), TaskId::parse(task).unwrap())
    }
}

/// An agent definition running the fake agent with `args`.
pub fn fake(args: &[&str], steer: SteerMode) -> AgentDef {
    let mut definition = AgentDef::builtin_shell();
    definition.name = "fake".into();
    definition.command = std::iter::once(FAKE_AGENT.to_owned())
        .chain(args.iter().map(|arg| (*arg).to_owned()))
        .collect();
    definition.steer = steer;
    definition
}

/// Waits for `agent_id` to print `line`.
pub async fn wait_for_line(
    events: &mut broadcast::Receiver<AgentEvent>,
    agent_id: &AgentId,
    line: &str,
) {
    wait_for_lines(events, &[(agent_id, line)]).await;
}

/// Waits until each agent has printed its line, in whatever order the agents run.
pub async fn wait_for_lines(
    events: &mut broadcast::Receiver<AgentEvent>,
    expected: &[(&AgentId, &str)],
) {
    let mut missing: Vec<(&AgentId, &str)> = expected.to_vec();
    tokio::time::timeout(Duration::from_secs(20), async {
        while !missing.is_empty() {
            match events.recv().await {
                Ok(AgentEvent::Output {
                    agent_id: id,
                    line: got,
                    ..
                }) => missing.retain(|(agent_id, line)| !(**agent_id == id && *line == got)),
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(error) => panic!("events ended: {error}"),
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("never printed: {missing:?}"));
}

/// Live processes whose environment carries `marker` (`NAME=value`), found through `/proc`.
pub fn marked_processes(marker: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| crew_live::procscan::carries_marker(pid, marker))
        .collect()
}

/// Waits until no process carries `marker`, or fails after `limit`.
pub async fn assert_no_marked_processes(marker: &str, limit: Duration) {
    let started = Instant::now();
    loop {
        let left = marked_processes(marker);
        if left.is_empty() {
            return;
        }
        assert!(
            started.elapsed() < limit,
            "processes still carry {marker}: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs `live-helper args…` in a process of its own, with the test's temp dir, and returns the
/// JSON it prints.
pub fn live_helper_json(env: &TestEnv, args: &[&str]) -> serde_json::Value {
    crew_tests::live_helper_json(args, Some(&env.tmp()))
}
