//! Tasks that run on a placement (`[placements.<name>]`, docs/distributed.md): the agent
//! process this host supervises is the placement's transport — `crew shim --stdio DIR` here,
//! or `ssh <host> crew shim …` — and a driver speaks the shim protocol (`crew_core::shim`) over
//! its stdin and the lines of its stdout:
//!
//! 1. `hello` with the project's id, then `start` with the task's agent, prompt and the run's
//!    base; a clone that lacks the base asks for it (`need_base`) and gets its history as a
//!    pack, made by the workspace provider.
//! 2. What the remote task says becomes this agent's output (its lines, `[placement] …` notes)
//!    and events: a remote question is this task's question, answered by a follow-up; steer
//!    and follow-up go to the remote agent.
//! 3. When the remote task ends, its work arrives as a pack and a claim; the provider checks it
//!    into this repository (`accept_work`: the tip descends from the base, has the claimed
//!    tree, every commit is whole and writes nothing into `.git`) and only then moves the
//!    task's branch. The driver sends `release`, and closes the transport's input.
//!
//! The transport's exit says how it went: `crew shim` exits 0 only when every task it ran
//! succeeded and was released. A remote failure is also told as the task's last turn, so the
//! task's reason names it; work that fails the check is not released and stays in the
//! placement's clone, its quarantine ref here naming what arrived.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use camino::Utf8PathBuf;
use crew_core::model::TaskStatus;
use crew_core::provider::{ReceivedWork, WorkspaceProvider};
use crew_core::shim::{FromShim, PACK_CHUNK, SHIM_PROTOCOL, ToShim};
use crew_core::{AgentDef, AgentId};
use crew_sandbox::spawn::AgentInput;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::agent::events::OutputStream;
use crate::agent::output::OutputSink;
use crate::agent::protocol::ProtocolEvent;

/// What a task that runs on a placement needs besides its transport.
#[derive(Debug, Clone)]
pub struct Placed {
    /// The placement's name, for what the task shows.
    pub name: String,
    /// The task's caps, held where it runs.
    pub caps: crew_core::config::Resources,
    /// Where no cgroup can be had there, it runs without its caps instead of being refused.
    pub allow_uncapped: bool,
    /// Whether `start` carries the values of what the agent's `pass_env` names (not where
    /// the transport gives them otherwise, as a Kubernetes Secret).
    pub send_env: bool,
    /// The agent that runs there.
    pub agent: AgentDef,
    /// The project's id, which names its clone on the placement.
    pub project: String,
    /// The run's base commit: where the task starts there, and what its work is measured
    /// from.
    pub base: String,
    /// The tip of the task's earlier work here, when it is taken up again: it goes on from
    /// there, and its branch moves on from there.
    pub from: Option<String>,
    /// This repository's top level, where the work comes back.
    pub repo_root: Utf8PathBuf,
    /// The task's branch here.
    pub branch: String,
    /// Makes the base's history into a pack, and checks the work in.
    pub provider: Arc<dyn WorkspaceProvider>,
    /// The name of its Slurm job, on a Slurm placement: what `squeue` and `scancel` know it
    /// by.
    pub slurm_job: Option<String>,
}

/// What the supervisor tells a placed task's driver.
#[derive(Debug)]
pub(crate) enum PlacedInput {
    /// Deliver now.
    Steer(String),
    /// Queue for the end of the remote agent's turn, or answer its question.
    FollowUp(String),
}

/// The supervisor's end of a driver.
#[derive(Debug)]
pub(crate) struct PlacedLink {
    pub inputs: mpsc::UnboundedSender<PlacedInput>,
    pub driver: JoinHandle<()>,
}

/// Starts the driver of a freshly started transport: `stdin` is its input, `lines` its stdout
/// (the output drain sends them on), `sink` where what the task says is shown and the
/// supervisor told; `dir` is the task's scratch directory here, where its work arrives.
pub(crate) fn start(
    placed: Placed,
    agent_id: AgentId,
    prompt: String,
    dir: Utf8PathBuf,
    stdin: AgentInput,
    lines: mpsc::UnboundedReceiver<String>,
    sink: OutputSink,
) -> PlacedLink {
    let (inputs, receiver) = mpsc::unbounded_channel();
    let driver = Driver {
        placed,
        agent_id,
        dir,
        stdin: Some(stdin),
        sink,
        pack: None,
        asked: false,
        told_not_protocol: false,
        remote: None,
        over: false,
        heard_output: false,
        hello: false,
        failed_there: false,
        queued: None,
    };
    let driver = tokio::spawn(driver.drive(prompt, lines, receiver));
    PlacedLink { inputs, driver }
}

struct Driver {
    placed: Placed,
    agent_id: AgentId,
    dir: Utf8PathBuf,
    /// The transport's input; `None` once closed (the shim then ends).
    stdin: Option<AgentInput>,
    sink: OutputSink,
    /// The work's pack as it arrives.
    pack: Option<(Utf8PathBuf, std::fs::File)>,
    /// The remote task waits on a question.
    asked: bool,
    told_not_protocol: bool,
    /// Where the task works there, once it started: its directory and branch in the clone.
    remote: Option<(String, Option<String>)>,
    /// The connection's end was said (`released`, a refusal): its close is no loss.
    over: bool,
    /// The remote agent printed something: it started there.
    heard_output: bool,
    /// The shim answered: the transport reached it (on Slurm: the job runs).
    hello: bool,
    /// The task ended otherwise than succeeded there.
    failed_there: bool,
    /// On Slurm, what was last said of the job while the shim had not answered (queued and
    /// why, or where it runs).
    queued: Option<String>,
}

impl Driver {
    async fn drive(
        mut self,
        prompt: String,
        mut lines: mpsc::UnboundedReceiver<String>,
        mut inputs: mpsc::UnboundedReceiver<PlacedInput>,
    ) {
        let start = ToShim::Start {
            task: self.agent_id.task_id().clone(),
            run: self.agent_id.run_id().clone(),
            agent: Box::new(self.placed.agent.clone()),
            prompt,
            base: self.placed.base.clone(),
            from: self.placed.from.clone(),
            resources: self.placed.caps,
            allow_uncapped: self.placed.allow_uncapped,
            env: if self.placed.send_env {
                let mut env = crate::agent::env::passed_values(&self.placed.agent.pass_env);
                env.extend(crate::agent::credentials::placed_values(
                    &self.placed.agent,
                    &crate::agent::env::BaseEnv::from_process(),
                ));
                env
            } else {
                Default::default()
            },
        };
        self.send(&ToShim::Hello {
            v: SHIM_PROTOCOL,
            project: self.placed.project.clone(),
        })
        .await;
        self.send(&start).await;
        // On Slurm, the job's state while it waits to run: said as it changes.
        let mut queue_check = tokio::time::interval(Duration::from_millis(500));
        queue_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                line = lines.recv() => {
                    let Some(line) = line else {
                        self.ended(self.ended_by_slurm().await);
                        break;
                    };
                    let message = match serde_json::from_str::<FromShim>(&line) {
                        Ok(message) => message,
                        Err(_) => {
                            self.not_protocol(line);
                            continue;
                        }
                    };
                    if !self.heard(message, &start).await {
                        self.over = true;
                        self.close();
                    }
                }
                _ = queue_check.tick(), if !self.hello && self.placed.slurm_job.is_some() => {
                    self.say_queued().await;
                }
                input = inputs.recv(), if self.stdin.is_some() => {
                    let task = self.agent_id.task_id().clone();
                    match input {
                        Some(PlacedInput::Steer(message)) => {
                            self.send(&ToShim::Steer { task, message }).await;
                        }
                        Some(PlacedInput::FollowUp(message)) => {
                            self.send(&ToShim::FollowUp { task, message }).await;
                        }
                        None => self.close(),
                    }
                }
            }
        }
    }

    /// Acts on one message of the shim; `false` when the connection is over for this task.
    async fn heard(&mut self, message: FromShim, start: &ToShim) -> bool {
        match message {
            FromShim::Hello { v, clone } => {
                self.hello = true;
                if v != SHIM_PROTOCOL {
                    self.fail(format!(
                        "the placement's crew speaks shim protocol {v}, this one {SHIM_PROTOCOL}"
                    ));
                    return false;
                }
                self.note(format!("a clone of this project at {clone}"));
            }
            FromShim::NeedBase { commit } => {
                self.note(format!("sending the history of {commit}"));
                match self.history(&commit).await {
                    Ok(bytes) => {
                        for chunk in bytes.chunks(PACK_CHUNK) {
                            self.send(&ToShim::Pack {
                                data: base64::engine::general_purpose::STANDARD.encode(chunk),
                            })
                            .await;
                        }
                        self.send(&ToShim::Base { commit }).await;
                        self.send(start).await;
                    }
                    Err(error) => {
                        self.fail(format!("could not send the base's history: {error}"));
                        return false;
                    }
                }
            }
            FromShim::Started { dir, branch, .. } => {
                self.note(format!("working in {dir}"));
                self.remote = Some((dir, branch));
            }
            FromShim::Status { status, reason, .. } => {
                if status == TaskStatus::Waiting {
                    self.asked = true;
                    self.sink
                        .tell(ProtocolEvent::Asked(reason.unwrap_or_default()));
                } else if self.asked {
                    self.asked = false;
                    self.sink.tell(ProtocolEvent::Answered);
                }
            }
            FromShim::Output { line, .. } => {
                self.heard_output = true;
                self.show(line);
            }
            FromShim::Finished { status, reason, .. } => {
                let said = reason
                    .map(|reason| format!(": {reason}"))
                    .unwrap_or_default();
                self.note(format!("the task {status} there{said}"));
                if status != TaskStatus::Succeeded {
                    self.failed_there = true;
                    self.sink.tell(ProtocolEvent::Failed(format!(
                        "on {}, the task {status}{said}",
                        self.placed.name
                    )));
                }
            }
            FromShim::Pack { data } => {
                if let Err(error) = self.take_chunk(&data) {
                    self.fail(error);
                    return false;
                }
            }
            FromShim::Work { claim, kept_at, .. } => {
                let task = self.agent_id.task_id().clone();
                let Some(claim) = claim else {
                    self.note("no work came back".to_owned());
                    self.send(&ToShim::Release { task }).await;
                    return true;
                };
                let tip = claim.tip.clone();
                match self.accept(claim).await {
                    Ok(()) => {
                        self.note(format!(
                            "the work came back and was checked: {}",
                            self.placed.branch
                        ));
                        self.sink.tell(ProtocolEvent::Landed {
                            branch: self.placed.branch.clone(),
                            tip: tip.clone(),
                        });
                        self.send(&ToShim::Release { task }).await;
                    }
                    Err(error) => {
                        let kept = kept_at
                            .map(|branch| {
                                format!("; it stays on {branch} in the placement's clone")
                            })
                            .unwrap_or_default();
                        self.fail(format!(
                            "the work that came back was refused: {error}{kept}"
                        ));
                        return false;
                    }
                }
            }
            FromShim::Released { .. } => return false,
            FromShim::Error { code, message, .. } => {
                self.note(format!("{code}: {message}"));
                if matches!(code.as_str(), "start" | "base" | "work" | "protocol") {
                    self.fail(message);
                    return false;
                }
            }
        }
        true
    }

    async fn history(&self, commit: &str) -> Result<Vec<u8>, String> {
        let (provider, repo_root, commit) = (
            self.placed.provider.clone(),
            self.placed.repo_root.clone(),
            commit.to_owned(),
        );
        tokio::task::spawn_blocking(move || {
            let mut bytes = Vec::new();
            provider
                .pack_history(&repo_root, &commit, &mut bytes)
                .map(|()| bytes)
                .map_err(|error| crate::agent::error::with_causes(&*error))
        })
        .await
        .map_err(|error| error.to_string())?
    }

    fn take_chunk(&mut self, data: &str) -> Result<(), String> {
        use std::io::Write as _;
        let chunk = base64::engine::general_purpose::STANDARD
            .decode(data)
            .map_err(|error| format!("a pack chunk of the work is not base64: {error}"))?;
        if self.pack.is_none() {
            let path = self.dir.join("work.pack");
            let file = std::fs::File::create(&path)
                .map_err(|error| format!("failed to write {path}: {error}"))?;
            self.pack = Some((path, file));
        }
        let (path, file) = self.pack.as_mut().expect("opened above");
        file.write_all(&chunk)
            .map_err(|error| format!("failed to write {path}: {error}"))
    }

    async fn accept(&mut self, claim: crew_core::shim::WorkClaim) -> Result<(), String> {
        let (pack, file) = self
            .pack
            .take()
            .ok_or_else(|| "the work's pack did not arrive".to_owned())?;
        file.sync_all()
            .map_err(|error| format!("failed to write {pack}: {error}"))?;
        let request = ReceivedWork {
            repo_root: self.placed.repo_root.clone(),
            claim,
            pack,
            branch: self.placed.branch.clone(),
            branch_expected_at: self.placed.from.clone(),
            quarantine: format!(
                "refs/crew/incoming/{}-{}",
                self.agent_id.run_id(),
                self.agent_id.task_id()
            ),
        };
        let provider = self.placed.provider.clone();
        tokio::task::spawn_blocking(move || {
            provider
                .accept_work(&request)
                .map_err(|error| crate::agent::error::with_causes(&*error))
        })
        .await
        .map_err(|error| error.to_string())?
    }

    async fn send(&mut self, message: &ToShim) {
        let Some(stdin) = self.stdin.as_mut() else {
            return;
        };
        let mut line = serde_json::to_vec(message).expect("a shim message serializes");
        line.push(b'\n');
        let written = async {
            stdin.write_all(&line).await?;
            stdin.flush().await
        };
        if let Err(error) = written.await {
            // The transport is gone: its exit tells the rest.
            tracing::debug!(agent = %self.agent_id, "the placement's transport took no more: {error}");
            self.stdin = None;
        }
    }

    /// On Slurm: the job's state, said when it changed, while the shim has not answered.
    async fn say_queued(&mut self) {
        let Some(name) = self.placed.slurm_job.clone() else {
            return;
        };
        let Some(job) = crate::agent::slurm::job_state(&name).await else {
            return;
        };
        let said = match job.state.as_str() {
            "PENDING" => format!(
                "pending in Slurm: {} (job {})",
                job.reason.as_deref().unwrap_or("waiting"),
                job.id
            ),
            "RUNNING" | "CONFIGURING" => format!(
                "job {} runs on {}",
                job.id,
                job.nodes.as_deref().unwrap_or("its node")
            ),
            _ => return,
        };
        if self.queued.as_deref() != Some(said.as_str()) {
            self.note(said.clone());
            self.queued = Some(said);
        }
    }

    /// On Slurm, once the transport ended without the task's success: its job, when Slurm
    /// ended it (its time or memory limit, a failed node).
    async fn ended_by_slurm(&self) -> Option<crate::agent::slurm::JobState> {
        let name = self.placed.slurm_job.as_deref()?;
        if self.over && !self.failed_there {
            return None;
        }
        crate::agent::slurm::final_state(name)
            .await
            .filter(|job| crate::agent::slurm::ended_by_slurm(job).is_some())
    }

    /// The transport ended. Where Slurm ended the job at a limit of the task's, the task fails
    /// naming it (and where its work is, when it did not come back); for the cluster's sake (a
    /// failed node), it is lost as a dropped connection is, the reason saying so.
    fn ended(&mut self, slurm: Option<crate::agent::slurm::JobState>) {
        let Some(job) = slurm else {
            self.lost(None);
            return;
        };
        let said = crate::agent::slurm::ended_by_slurm(&job).unwrap_or_default();
        if !crate::agent::slurm::ended_by_its_limits(&job) {
            self.lost(Some(said));
            return;
        }
        let work = match (&self.remote, self.over) {
            (_, true) => "its work came back".to_owned(),
            (Some((dir, Some(branch))), false) => format!(
                "its work is in {dir} there, and on the branch {branch} of that clone once its shim stopped the agent"
            ),
            (Some((dir, None)), false) => format!("its work is in {dir} there"),
            (None, false) => "it had not started there".to_owned(),
        };
        self.over = true;
        self.fail(format!("{said}; {work}"));
    }

    /// The transport ended before the task's work came back: the task's reason says where the
    /// work is, and how Slurm ended its job (`slurm`) where it did.
    fn lost(&mut self, slurm: Option<String>) {
        if self.over {
            return;
        }
        let placement = &self.placed.name;
        let before_start = self.remote.is_none() && !self.heard_output;
        let reason = match &self.remote {
            Some((dir, Some(branch))) => format!(
                "the connection to the placement `{placement}` ended before the task's work came back; it is in {dir} there, and on the branch {branch} of that clone once its shim stopped the agent"
            ),
            Some((dir, None)) => format!(
                "the connection to the placement `{placement}` ended before the task's work came back; it is in {dir} there"
            ),
            None if self.heard_output => format!(
                "the connection to the placement `{placement}` ended before the task's work came back; it is in a worktree of the placement's clone"
            ),
            None => format!(
                "the connection to the placement `{placement}` ended before the task started there"
            ),
        };
        let reason = match slurm {
            Some(said) => format!("{said}; {reason}"),
            None => reason,
        };
        self.note(reason.clone());
        self.sink.tell(ProtocolEvent::Lost {
            reason,
            before_start,
        });
    }

    /// Closes the transport's input: the shim ends once its tasks have.
    fn close(&mut self) {
        self.stdin = None;
    }

    fn fail(&mut self, reason: String) {
        self.note(reason.clone());
        self.sink.tell(ProtocolEvent::Failed(reason));
    }

    fn show(&self, line: String) {
        self.sink.show(OutputStream::Stdout, line);
    }

    fn note(&self, text: String) {
        self.show(format!("[{}] {text}", self.placed.name));
    }

    fn not_protocol(&mut self, line: String) {
        if !self.told_not_protocol {
            self.told_not_protocol = true;
            self.sink
                .tell(ProtocolEvent::NotProtocol(line.chars().take(80).collect()));
        }
        self.show(line);
    }
}
