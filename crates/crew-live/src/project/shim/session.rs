//! What a shim's session holds: the project a `hello` named, the tasks it runs or holds the
//! work of, and how it answers a request it refuses.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use camino::Utf8PathBuf;
use crew_core::config::ProjectConfig;
use crew_core::provider::WorkspaceProvider;
use crew_core::shim::{CloneStore, FromShim};
use crew_core::{RunId, TaskId};
use tokio::sync::mpsc;

use crate::project::host::{Canceller, Host};
use crate::project::open::Project;

/// Makes the workspace provider of a clone from its configuration.
pub type ProviderFor = Arc<dyn Fn(&ProjectConfig) -> Arc<dyn WorkspaceProvider> + Send + Sync>;

/// What a shim serves with.
#[derive(Clone)]
pub struct ShimOptions {
    /// Where it keeps its clones, one directory per project (canonical).
    pub root: Utf8PathBuf,
    /// The git side of the clones.
    pub clones: Arc<dyn CloneStore>,
    /// The workspaces of a clone's tasks, from its configuration.
    pub provider: ProviderFor,
    /// The directory of the `crew` program agents call (`crew ask`), first on their `PATH`.
    pub crew_dir: Option<PathBuf>,
}

impl std::fmt::Debug for ShimOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShimOptions")
            .field("root", &self.root)
            .finish_non_exhaustive()
    }
}

pub(super) type Out = mpsc::UnboundedSender<FromShim>;

/// A task the shim runs or holds the work of.
#[derive(Debug)]
pub(super) struct Held {
    pub(super) run: RunId,
    pub(super) canceller: Option<Canceller>,
    /// The branch and tip the work is kept at in the clone, once sent.
    pub(super) kept: Option<(String, String)>,
    /// The branch (and tip) of an earlier start's work this one went on from: it goes too
    /// when the work is released.
    pub(super) prior: Option<(String, String)>,
}

pub(super) type Tasks = Arc<Mutex<HashMap<TaskId, Held>>>;

/// The project a `hello` named: its clone, and the host running its tasks (made at the first
/// `start`).
pub(super) struct Session {
    pub(super) clone: Utf8PathBuf,
    pub(super) options: ShimOptions,
    /// A task of this shim ended without success, or its work could not be sent.
    pub(super) failed: Arc<AtomicBool>,
    pub(super) host: Option<Arc<Host>>,
    pub(super) project: Option<Project>,
    /// Told when the forwarder has sent everything of a task up to its end.
    pub(super) ended: Ended,
}

pub(super) type Ended = Arc<Mutex<HashMap<(RunId, TaskId), Arc<tokio::sync::Notify>>>>;

/// A request about a task this shim does not hold.
pub(super) fn unknown(out: &Out, task: &TaskId) {
    refuse(
        out,
        Some(task.clone()),
        "unknown_task",
        format!("no task {task} here"),
    );
}

pub(super) fn refuse(out: &Out, task: Option<TaskId>, code: &str, message: String) {
    // The writer ends only with the connection: no one to tell.
    let _ = out.send(FromShim::Error {
        task,
        code: code.to_owned(),
        message,
    });
}
