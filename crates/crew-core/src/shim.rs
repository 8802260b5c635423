//! The shim protocol: what a crew host and `crew shim` on another machine (or in another
//! directory) say to each other, one JSON object a line on the shim's stdin and stdout
//! (docs/distributed.md, ARCHITECTURE.md "Placed tasks").
//!
//! ```text
//! host                                   shim
//! hello {project}                   →
//!                                   ←    hello {v, clone}
//! start {task, agent, prompt, base} →
//!                                   ←    need_base {commit}        (its clone lacks the base)
//! pack {data}… base {commit}        →                              (the base's history)
//! start {…}                         →
//!                                   ←    started {task, run, dir, branch}
//!                                   ←    status / output / question  (as they happen)
//! steer | follow_up | stop {task}   →
//!                                   ←    finished {task, status, reason}
//!                                   ←    pack {data}… work {task, claim}   (claim: None = no work)
//! release {task}                    →                              (the work landed here)
//!                                   ←    released {task}
//! ```
//!
//! Packs travel as base64 chunks of at most [`PACK_CHUNK`] bytes, in `pack` messages that the
//! next `base` or `work` message closes. The agent never writes to the shim's stdout: its own
//! stdio are pipes of the shim's supervisor, and what it prints arrives as `output`.

use crate::provider::ProviderError;
use camino::Utf8Path;
use serde::{Deserialize, Serialize};

use crate::config::AgentDef;
use crate::ids::{RunId, TaskId};
use crate::model::{ExitRecord, TaskStatus};

/// The protocol version both sides send in `hello`.
pub const SHIM_PROTOCOL: u32 = 1;

/// The most pack bytes one `pack` message carries (before base64).
pub const PACK_CHUNK: usize = 512 * 1024;

/// What the side that holds the work says it sends. Ids are full hexadecimal object ids.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkClaim {
    /// The run's base commit: the receiving repository has it.
    pub base: String,
    /// The task's tip: the newest commit of its work.
    pub tip: String,
    /// The tip's tree: what the task's files are.
    pub tree: String,
}

/// A message from the host to the shim.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ToShim {
    /// The first message: which project the shim works for. Each project gets a clone and
    /// state of its own on the shim's side.
    Hello {
        /// The protocol version.
        v: u32,
        /// The project's id (its folder on the host's machine).
        project: String,
    },
    /// A chunk of a pack; the next `base` says what the chunks so far hold.
    Pack {
        /// The chunk, base64.
        data: String,
    },
    /// The chunks sent since the last `base` are the history of `commit`: take them in.
    Base {
        /// The commit.
        commit: String,
    },
    /// Run `agent` on `prompt` in a workspace of its own, starting at `base`.
    Start {
        /// The task, unique among the shim's live tasks of this project.
        task: TaskId,
        /// The run the task belongs to on the host (names the shim's run and branch too).
        run: RunId,
        /// The agent definition to run.
        agent: Box<AgentDef>,
        /// What the agent is asked to do.
        prompt: String,
        /// The run's base commit: what the work sent back is measured from.
        base: String,
        /// Where the task starts when not at `base`: the tip of its earlier work the host
        /// holds (its branch there, when the task is taken up again). Without it, a task this
        /// shim ran before for the same run goes on from the work it left in the clone.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        from: Option<String>,
        /// The values of the variables the agent's `pass_env` names, from the host's
        /// environment: the agent sees them there as it would here (they cross the transport,
        /// never a disk).
        #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
        env: std::collections::BTreeMap<String, String>,
        /// The task's caps, held there by the kernel as here.
        #[serde(default, skip_serializing_if = "crate::config::Resources::is_empty")]
        resources: crate::config::Resources,
        /// Where no cgroup can be had there, run it without its caps instead of refusing it.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        allow_uncapped: bool,
    },
    /// Deliver `message` to the running agent now.
    Steer {
        /// The task.
        task: TaskId,
        /// The message.
        message: String,
    },
    /// Queue `message` for the end of the agent's turn.
    FollowUp {
        /// The task.
        task: TaskId,
        /// The message.
        message: String,
    },
    /// Stop the agent: TERM, then KILL after its grace period. Its work is kept.
    Stop {
        /// The task.
        task: TaskId,
    },
    /// The work arrived and was checked: the shim may drop its copy.
    Release {
        /// The task.
        task: TaskId,
    },
}

/// A message from the shim to the host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum FromShim {
    /// The answer to `hello`.
    Hello {
        /// The protocol version.
        v: u32,
        /// The shim's clone of the project, on its machine.
        clone: String,
    },
    /// The clone lacks a commit a `start` needs: send its history (`pack`… `base`).
    NeedBase {
        /// The commit.
        commit: String,
    },
    /// The task's agent started in its workspace.
    Started {
        /// The task.
        task: TaskId,
        /// The shim's run holding it.
        run: RunId,
        /// Where the agent works, on the shim's machine.
        dir: String,
        /// The task's branch in the shim's clone.
        branch: Option<String>,
    },
    /// The task changed status.
    Status {
        /// The task.
        task: TaskId,
        /// Its new status.
        status: TaskStatus,
        /// Why, when that needs saying.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// A line the agent printed.
    Output {
        /// The task.
        task: TaskId,
        /// The line, without its newline.
        line: String,
    },
    /// The task ended; its work follows (`pack`… `work`).
    Finished {
        /// The task.
        task: TaskId,
        /// How it ended.
        status: TaskStatus,
        /// Why, when that needs saying.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        /// How its agent's process ended.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        exit: Option<ExitRecord>,
    },
    /// A chunk of a pack; the next `work` says what the chunks hold.
    Pack {
        /// The chunk, base64.
        data: String,
    },
    /// The task's work: the pack chunks since the last `work` hold its commits from the base.
    Work {
        /// The task.
        task: TaskId,
        /// What the commits are; `None` when the task left no work (and no pack was sent).
        claim: Option<WorkClaim>,
        /// Where the work stays on the shim's side until `release`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        kept_at: Option<String>,
    },
    /// The shim dropped its copy of the task's work.
    Released {
        /// The task.
        task: TaskId,
    },
    /// A request failed; nothing of it happened.
    Error {
        /// The task it concerns, if one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        task: Option<TaskId>,
        /// What went wrong, for programs: `protocol`, `start`, `unknown_task`, `control`,
        /// `base`, `work`, `release`.
        code: String,
        /// What went wrong, for people.
        message: String,
    },
}

/// The git side of a shim's clones (crew-worktree's `GitClones`): what the shim needs of a
/// repository that is not the host's. Called from blocking threads.
pub trait CloneStore: Send + Sync + std::fmt::Debug {
    /// Makes the clone at `dir` when missing (with nothing checked out), or opens it.
    fn open_clone(&self, dir: &Utf8Path) -> Result<(), ProviderError>;
    /// Whether the repository holds `commit`.
    fn has_commit(&self, repo: &Utf8Path, commit: &str) -> Result<bool, ProviderError>;
    /// Takes in `commit`'s history from the pack file `pack`, and names it so that it stays.
    fn import_base(
        &self,
        repo: &Utf8Path,
        pack: &Utf8Path,
        commit: &str,
    ) -> Result<(), ProviderError>;
    /// Writes the commits from `base` to `branch` as a pack to `out`; what they are.
    fn pack_work(
        &self,
        repo: &Utf8Path,
        base: &str,
        branch: &str,
        out: &mut dyn std::io::Write,
    ) -> Result<WorkClaim, ProviderError>;
    /// The commit `branch` points to, if it exists.
    fn branch_tip(&self, repo: &Utf8Path, branch: &str) -> Option<String>;
    /// Deletes `branch` if it is still at `tip` (gone already is fine).
    fn drop_branch(&self, repo: &Utf8Path, branch: &str, tip: &str) -> Result<(), ProviderError>;
}
