//! The state store: `<workspace>/.crew/state`.
//!
//! ```text
//! state/lock                                 cross-process lock, never deleted
//! state/runs/<runId>/manifest.json           replaced atomically on every whole change
//! state/runs/<runId>/changes.jsonl           while it runs: one task's changes, appended (`journal`)
//! state/runs/<runId>/events.jsonl            append-only
//! state/runs/<runId>/tasks/<taskId>/output.log
//! state/ws/<runId>/<taskId>/                 `dedicated` workspaces
//! state/running/<runId>                      an empty file per run whose manifest says running
//! ```
//!
//! `running/` is an index kept with the manifests, under the lock: a marker is made before a
//! manifest that says `running` is written and removed after one that says otherwise, so what
//! is live is found without reading the finished runs, however many there are. A marker left by
//! a crash between the two steps names a finished run; readers skip it and reconciling removes
//! it. A state made before the index existed gets it built once, from every manifest.
//!
//! Every mutation is lock → read → modify → write, with the lock held only for that. Every
//! directory on the way is checked to be a real directory, never a symlink, and files are opened
//! without following links. A manifest that cannot be parsed is reported with its path and left
//! exactly as it is; the other runs stay usable.

use std::collections::HashMap;
use std::io::{self};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use camino::{Utf8Path, Utf8PathBuf};

use crate::discovery::CREW_DIR;
use crate::fsutil::{FileError, FileLock, LockError, ensure_real_dir, open_rw_nofollow};
use crate::git_exclude::{anchored_dir_pattern, ensure_excluded};
use crate::ids::{RunId, TaskId, WorkspaceId};
use crate::model::{RunManifest, TransitionError};
use crate::paths::RemoveError;

mod events;
mod journal;
mod listing;
mod manifests;
mod retention;

use manifests::{ChangeQueue, Written};

/// `.crew/state`, relative to the workspace root.
pub const STATE_DIR: &str = "state";
const LOCK_FILE: &str = "lock";
const RUNS_DIR: &str = "runs";
const RUNNING_DIR: &str = "running";
const WS_DIR: &str = "ws";
const TASKS_DIR: &str = "tasks";
const MANIFEST_FILE: &str = "manifest.json";
const EVENTS_FILE: &str = "events.jsonl";
/// The tasks of a run whose outcome someone has looked at (its summary at the end of `crew
/// run`, `crew runs show`, its diff, the board's pane): one id a line, appended.
const SEEN_FILE: &str = "seen";
const OUTPUT_LOG: &str = "output.log";
const CHECK_LOG: &str = "check.log";

/// How long a state operation waits for another process to release the lock.
pub const LOCK_TIMEOUT: Duration = Duration::from_secs(30);

/// A state operation that failed. Each variant names the file it is about.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The state directory could not be made or is not a real directory.
    #[error("failed to prepare the state directory")]
    Layout(#[source] FileError),
    /// The workspace's state lock could not be taken.
    #[error("failed to lock the state of the workspace")]
    Lock(#[from] LockError),
    /// A state file could not be read.
    #[error("failed to read {path}")]
    Read {
        /// The file.
        path: Utf8PathBuf,
        /// Why it could not be read.
        #[source]
        source: FileError,
    },
    /// A state file could not be written.
    #[error("failed to write {path}")]
    Write {
        /// The file.
        path: Utf8PathBuf,
        /// Why it could not be written.
        #[source]
        source: FileError,
    },
    /// A manifest is not valid JSON of its schema.
    #[error("run manifest {path} is corrupt; it was left as it is")]
    Corrupt {
        /// The manifest.
        path: Utf8PathBuf,
        /// What the parser said.
        #[source]
        source: serde_json::Error,
    },
    /// A manifest a newer crew wrote.
    #[error(
        "run manifest {path} has schema version {found}, newer than this crew supports ({supported}); it is read-only to this crew"
    )]
    NewerSchema {
        /// The manifest.
        path: Utf8PathBuf,
        /// Its schema version.
        found: u32,
        /// The newest this crew reads.
        supported: u32,
    },
    /// A manifest of a schema version no crew writes.
    #[error(
        "run manifest {path} has schema version {found}, which no crew writes (this one writes {supported}); it was left as it is"
    )]
    OlderSchema {
        /// The manifest.
        path: Utf8PathBuf,
        /// Its schema version.
        found: u32,
        /// The version this crew writes.
        supported: u32,
    },
    /// A manifest that names another project folder (copied or edited).
    #[error("run manifest {path} belongs to workspace {found}, not {expected}")]
    ForeignManifest {
        /// The manifest.
        path: Utf8PathBuf,
        /// This store's project folder.
        expected: WorkspaceId,
        /// The folder the manifest names.
        found: WorkspaceId,
    },
    /// No run id starts with the prefix.
    #[error("no run matches `{prefix}` in workspace {workspace}")]
    UnknownRun {
        /// The prefix given.
        prefix: String,
        /// The project folder searched.
        workspace: WorkspaceId,
    },
    /// More than one run id starts with the prefix.
    #[error("`{prefix}` matches several runs: {}", candidates.iter().map(RunId::as_str).collect::<Vec<_>>().join(", "))]
    AmbiguousRun {
        /// The prefix given.
        prefix: String,
        /// The runs it matches.
        candidates: Vec<RunId>,
    },
    /// A run name another run already has, or whose branches another run's could be.
    #[error("the run name `{name}` is taken: {}", if name == taken_by { "a run of this workspace has it".to_owned() } else { format!("its branches could be those of run {taken_by}") })]
    NameTaken {
        /// The name asked for.
        name: RunId,
        /// The run that has it.
        taken_by: RunId,
    },
    /// A state directory could not be listed.
    #[error("failed to list {path}")]
    List {
        /// The directory.
        path: Utf8PathBuf,
        /// Why it could not be listed.
        #[source]
        source: io::Error,
    },
    /// A run could not be removed.
    #[error("failed to remove run {run_id}")]
    Remove {
        /// The run.
        run_id: RunId,
        /// Why it could not be removed.
        #[source]
        source: RemoveError,
    },
    /// A manifest could not be written as JSON.
    #[error("failed to serialize {path}")]
    Serialize {
        /// The manifest.
        path: Utf8PathBuf,
        /// What the serializer said.
        #[source]
        source: serde_json::Error,
    },
    /// A status change the lifecycle does not allow.
    #[error(transparent)]
    Transition(#[from] TransitionError),
    /// A change written together with others (see [`StateStore::update_run_together`]), whose
    /// write failed with this error: every change of the write is told the same one.
    #[error(transparent)]
    Together(std::sync::Arc<StateError>),
    /// A change written together with others whose outcome never came back (the thread that
    /// wrote it panicked).
    #[error("the run's manifest was not written: the change was lost")]
    Lost,
}

impl StateError {
    /// The error itself, for one that reached its caller through a write of changes together.
    pub fn root(&self) -> &StateError {
        match self {
            StateError::Together(error) => error.root(),
            error => error,
        }
    }
}

/// The state of one workspace.
#[derive(Debug)]
pub struct StateStore {
    workspace: WorkspaceId,
    repo_root: Option<Utf8PathBuf>,
    state_dir: Utf8PathBuf,
    layout_ready: OnceLock<()>,
    /// The manifests of running runs as this store last wrote them, with the file each went
    /// into: while that file is still the one in place, it is not read and parsed again.
    written: Mutex<HashMap<RunId, Written>>,
    /// Changes waiting to be written together ([`StateStore::update_run_together`]), by run.
    queued: ChangeQueue,
    /// Held by the thread writing queued changes.
    writing: Mutex<()>,
}

/// One run as found on disk: its manifest, or why it could not be read.
#[derive(Debug)]
pub struct RunListing {
    /// The run's id (its directory's name).
    pub run_id: RunId,
    /// Its manifest, or why it could not be read.
    pub manifest: Result<RunManifest, StateError>,
}

/// What retention removed (or would remove, in a dry run).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PruneReport {
    /// The runs removed (or that would be).
    pub pruned: Vec<RunId>,
    /// How many finished runs were kept.
    pub kept: usize,
}

/// Locks `mutex`, whatever a thread that panicked holding it left: what it guards is rebuilt
/// from disk when in doubt.
fn lock_unpoisoned<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl StateStore {
    /// The store of `workspace`. Nothing is created until the first write.
    pub fn new(workspace: &WorkspaceId, repo_root: Option<&Utf8Path>) -> Self {
        StateStore {
            workspace: workspace.clone(),
            repo_root: repo_root.map(Utf8Path::to_owned),
            state_dir: workspace.as_path().join(CREW_DIR).join(STATE_DIR),
            layout_ready: OnceLock::new(),
            written: Mutex::new(HashMap::new()),
            queued: ChangeQueue::default(),
            writing: Mutex::new(()),
        }
    }

    /// The project folder whose state this is.
    pub fn workspace(&self) -> &WorkspaceId {
        &self.workspace
    }

    /// `.crew/state`.
    pub fn state_dir(&self) -> &Utf8Path {
        &self.state_dir
    }

    /// `runs/`, a directory per run.
    pub fn runs_dir(&self) -> Utf8PathBuf {
        self.state_dir.join(RUNS_DIR)
    }

    /// The directory of one run.
    pub fn run_dir(&self, run_id: &RunId) -> Utf8PathBuf {
        self.runs_dir().join(run_id.as_str())
    }

    /// The run's `manifest.json`.
    pub fn manifest_path(&self, run_id: &RunId) -> Utf8PathBuf {
        self.run_dir(run_id).join(MANIFEST_FILE)
    }

    /// The run's `events.jsonl`.
    pub fn events_path(&self, run_id: &RunId) -> Utf8PathBuf {
        self.run_dir(run_id).join(EVENTS_FILE)
    }

    /// The directory of one task of a run.
    pub fn task_dir(&self, run_id: &RunId, task_id: &TaskId) -> Utf8PathBuf {
        self.run_dir(run_id).join(TASKS_DIR).join(task_id.as_str())
    }

    /// The task's `output.log`: what its agent printed.
    pub fn output_log_path(&self, run_id: &RunId, task_id: &TaskId) -> Utf8PathBuf {
        self.task_dir(run_id, task_id).join(OUTPUT_LOG)
    }

    /// What the task's check command printed, the last time it ran.
    pub fn check_log_path(&self, run_id: &RunId, task_id: &TaskId) -> Utf8PathBuf {
        self.task_dir(run_id, task_id).join(CHECK_LOG)
    }

    /// `ws/`, the parent of every `dedicated` workspace.
    pub fn dedicated_root(&self) -> Utf8PathBuf {
        self.state_dir.join(WS_DIR)
    }

    /// The `dedicated` workspace of one task.
    pub fn dedicated_dir(&self, run_id: &RunId, task_id: &TaskId) -> Utf8PathBuf {
        self.dedicated_root()
            .join(run_id.as_str())
            .join(task_id.as_str())
    }

    /// Creates `.crew/state/runs` (each level a real directory, never a link), the lock file,
    /// and the `info/exclude` entry. Done once per store.
    pub fn ensure_layout(&self) -> Result<(), StateError> {
        if self.layout_ready.get().is_some() {
            return Ok(());
        }
        let crew_dir = self.workspace.as_path().join(CREW_DIR);
        for dir in [&crew_dir, &self.state_dir, &self.runs_dir()] {
            ensure_real_dir(dir).map_err(StateError::Layout)?;
        }
        // Each run's records go where the file system has room, not among those of the runs
        // deleted last (see `spread_apart`).
        crate::fsutil::spread_apart(&self.runs_dir());
        open_rw_nofollow(&self.state_dir.join(LOCK_FILE)).map_err(StateError::Layout)?;
        if let Some(repo_root) = &self.repo_root
            && let Some(pattern) = anchored_dir_pattern(repo_root, &self.state_dir)
        {
            // Not fatal: state works without it, `git status` is merely noisier.
            let _ = ensure_excluded(repo_root, &[pattern]);
        }
        // Set by another thread first means the layout is ready all the same.
        let _ = self.layout_ready.set(());
        Ok(())
    }

    /// Takes the cross-process lock, waiting up to [`LOCK_TIMEOUT`].
    pub fn lock(&self) -> Result<FileLock, StateError> {
        self.ensure_layout()?;
        Ok(FileLock::acquire(&self.lock_path(), LOCK_TIMEOUT)?)
    }

    /// The file of the cross-process lock (see [`StateStore::lock`]).
    pub fn lock_path(&self) -> Utf8PathBuf {
        self.state_dir.join(LOCK_FILE)
    }

    /// Creates a run with a fresh id. `build` receives the id and returns the manifest.
    pub fn create_run(
        &self,
        build: impl FnOnce(RunId) -> RunManifest,
    ) -> Result<RunManifest, StateError> {
        let _lock = self.lock()?;
        let run_id = loop {
            let candidate = RunId::generate();
            let dir = self.run_dir(&candidate);
            match std::fs::create_dir(&dir) {
                Ok(()) => break candidate,
                // Same id from another process in the same millisecond: draw again.
                Err(error) if error.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(source) => {
                    return Err(StateError::Layout(FileError::CreateDir {
                        path: dir,
                        source,
                    }));
                }
            }
        };
        let mut manifest = build(run_id);
        self.write_manifest(&mut manifest)?;
        Ok(manifest)
    }

    /// [`StateStore::create_run`] for a run a person named: refused when a run of the
    /// workspace has that name, or one whose task branches could be this run's (`refund` and
    /// `refund-fix`: `refund-fix-api` would be both's).
    pub fn create_named_run(
        &self,
        name: &RunId,
        build: impl FnOnce(RunId) -> RunManifest,
    ) -> Result<RunManifest, StateError> {
        let _lock = self.lock()?;
        let taken = |taken_by: RunId| StateError::NameTaken {
            name: name.clone(),
            taken_by,
        };
        if let Some(other) = self.run_ids()?.into_iter().find(|id| id.overlaps(name)) {
            return Err(taken(other));
        }
        let dir = self.run_dir(name);
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {
                return Err(taken(name.clone()));
            }
            Err(source) => {
                return Err(StateError::Layout(FileError::CreateDir {
                    path: dir,
                    source,
                }));
            }
        }
        let mut manifest = build(name.clone());
        self.write_manifest(&mut manifest)?;
        Ok(manifest)
    }

    /// Creates `runs/<runId>/tasks/<taskId>/` and returns it.
    pub fn ensure_task_dir(
        &self,
        run_id: &RunId,
        task_id: &TaskId,
    ) -> Result<Utf8PathBuf, StateError> {
        self.ensure_layout()?;
        let run_dir = self.run_dir(run_id);
        let tasks_dir = run_dir.join(TASKS_DIR);
        let task_dir = tasks_dir.join(task_id.as_str());
        for dir in [&run_dir, &tasks_dir, &task_dir] {
            ensure_real_dir(dir).map_err(StateError::Layout)?;
        }
        Ok(task_dir)
    }

    /// Creates `ws/<runId>/<taskId>/` (a `dedicated` workspace) and returns it.
    pub fn ensure_dedicated_dir(
        &self,
        run_id: &RunId,
        task_id: &TaskId,
    ) -> Result<Utf8PathBuf, StateError> {
        self.ensure_layout()?;
        let root = self.dedicated_root();
        // Through handles from the state directory down: a level swapped for a link as it is
        // made is refused, never followed out of crew's roots.
        let (Some(parent), Some(ws)) = (root.parent(), root.file_name()) else {
            return Err(StateError::Layout(crate::fsutil::FileError::WrongType {
                path: root,
                expected: "directory",
            }));
        };
        crate::fsutil::ensure_dirs_beneath(parent, &[ws, run_id.as_str(), task_id.as_str()])
            .map_err(StateError::Layout)
    }
}

/// A failed write of `path` (a removal or a rename in the state directory).
fn io_write(path: &Utf8Path, source: io::Error) -> StateError {
    StateError::Write {
        path: path.to_owned(),
        source: FileError::Write {
            path: path.to_owned(),
            source,
        },
    }
}
