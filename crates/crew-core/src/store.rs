//! The state store: `<workspace>/.crew/state`.
//!
//! ```text
//! state/lock                                 cross-process lock, never deleted
//! state/runs/<runId>/manifest.json           replaced atomically on every change
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

use std::collections::{BTreeSet, HashMap};
use std::io::{self, Write};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use camino::{Utf8Path, Utf8PathBuf};
use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::config::RetentionSettings;
use crate::discovery::CREW_DIR;
use crate::fsutil::{
    FileError, FileLock, LockError, ensure_real_dir, open_append_nofollow, open_nofollow,
    open_rw_nofollow, read_nofollow, read_nofollow_steady, real_dir_exists, spare_name,
    write_atomic, write_exchanging,
};
use crate::git_exclude::{anchored_dir_pattern, ensure_excluded};
use crate::ids::{RunId, TaskId, WorkspaceId};
use crate::model::{
    EventKind, INTERRUPTED_REASON, MANIFEST_SCHEMA_VERSION, RunEvent, RunGlance, RunManifest,
    RunStatus, TaskRecord, TaskStatus, TransitionError,
};
use crate::paths::{RemoveError, remove_contained};

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
    /// write failed with the error this names.
    #[error("the run's manifest was not written: {0}")]
    Together(String),
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

/// A change queued for [`StateStore::update_run_together`]: applied to the manifest (with
/// whether it must undo itself when refused: other changes share the manifest), or to none
/// when the manifest could not be read, it returns what tells its caller the outcome once the
/// write is done.
type QueuedChange = Box<dyn FnOnce(Option<(&mut RunManifest, bool)>) -> Outcome + Send>;

/// Tells a caller of [`StateStore::update_run_together`] its outcome, given the write's error
/// if it failed.
type Tell = Box<dyn FnOnce(Option<&StateError>) + Send>;

/// The changes queued by run, for [`StateStore::update_run_together`].
#[derive(Default)]
struct ChangeQueue(Mutex<HashMap<RunId, Vec<QueuedChange>>>);

impl std::fmt::Debug for ChangeQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let queued: usize = lock_unpoisoned(&self.0).values().map(Vec::len).sum();
        f.debug_struct("ChangeQueue")
            .field("queued", &queued)
            .finish()
    }
}

/// What a queued change did: whether it was applied (not refused), and how to tell its caller
/// the outcome once the write is done.
struct Outcome {
    applied: bool,
    tell: Tell,
}

/// A manifest this store wrote, and the file it went into.
#[derive(Debug)]
struct Written {
    stamp: FileStamp,
    manifest: RunManifest,
}

/// Which file is at a path, and as what: a manifest is replaced by renaming a new file over it
/// (or, by its own host, exchanged with its spare), so another writer's manifest is another
/// inode (made while this one still existed), and a reused inode number would also need the
/// same size and change times.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileStamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl FileStamp {
    fn of(path: &Utf8Path) -> Option<Self> {
        use std::os::unix::fs::MetadataExt;
        let metadata = std::fs::symlink_metadata(path).ok()?;
        metadata.is_file().then(|| FileStamp {
            dev: metadata.dev(),
            ino: metadata.ino(),
            len: metadata.len(),
            mtime: (metadata.mtime(), metadata.mtime_nsec()),
            ctime: (metadata.ctime(), metadata.ctime_nsec()),
        })
    }
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

#[derive(Deserialize)]
struct SchemaProbe {
    schema_version: u32,
}

/// What a manifest read as a whole or in part says about the workspace it belongs to.
trait ManifestOf {
    fn workspace(&self) -> &WorkspaceId;
    fn schema_version(&self) -> u32;
}

impl ManifestOf for RunManifest {
    fn workspace(&self) -> &WorkspaceId {
        &self.cwd
    }
    fn schema_version(&self) -> u32 {
        self.schema_version
    }
}

impl ManifestOf for RunGlance {
    fn workspace(&self) -> &WorkspaceId {
        &self.cwd
    }
    fn schema_version(&self) -> u32 {
        self.schema_version
    }
}

/// Locks `mutex`, whatever a thread that panicked holding it left: what it guards is rebuilt
/// from disk when in doubt.
fn lock_unpoisoned<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// `error` and each of its sources, joined by `: `.
fn error_chain(error: &StateError) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
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
        Ok(FileLock::acquire(
            &self.state_dir.join(LOCK_FILE),
            LOCK_TIMEOUT,
        )?)
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
        let manifest = build(run_id);
        self.write_manifest(&manifest)?;
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
        let manifest = build(name.clone());
        self.write_manifest(&manifest)?;
        Ok(manifest)
    }

    /// Reads a run's manifest. A newer schema is returned when it parses (it is read-only: any
    /// update is refused); a corrupt file is an error naming it.
    pub fn read_run(&self, run_id: &RunId) -> Result<RunManifest, StateError> {
        match self.as_written(run_id) {
            Some(manifest) => Ok(manifest),
            None => self.read_manifest_as(run_id),
        }
    }

    /// `look` at the run's manifest: [`StateStore::read_run`] without a copy of the manifest
    /// when this store wrote it last (a runner looks up one task of a hundred at each start).
    pub fn look_at_run<T>(
        &self,
        run_id: &RunId,
        look: impl Fn(&RunManifest) -> T,
    ) -> Result<T, StateError> {
        match self.look_at_written(run_id, &look) {
            Some(found) => Ok(found),
            None => Ok(look(&self.read_manifest_as(run_id)?)),
        }
    }

    /// The manifest as this store last wrote it, if that is still the file in place (and the
    /// directories leading to it are still real directories).
    fn as_written(&self, run_id: &RunId) -> Option<RunManifest> {
        self.look_at_written(run_id, RunManifest::clone)
    }

    /// What `look` finds in [`StateStore::as_written`]'s manifest, without copying it.
    fn look_at_written<T>(
        &self,
        run_id: &RunId,
        look: impl FnOnce(&RunManifest) -> T,
    ) -> Option<T> {
        let written = lock_unpoisoned(&self.written);
        let entry = written.get(run_id)?;
        self.still_in_place(run_id, entry.stamp)
            .then(|| look(&entry.manifest))
    }

    /// [`StateStore::as_written`], taken out of the store's memory.
    fn take_written(&self, run_id: &RunId) -> Option<RunManifest> {
        let mut written = lock_unpoisoned(&self.written);
        let entry = written.remove(run_id)?;
        self.still_in_place(run_id, entry.stamp)
            .then_some(entry.manifest)
    }

    fn still_in_place(&self, run_id: &RunId, stamp: FileStamp) -> bool {
        let crew_dir = self.workspace.as_path().join(CREW_DIR);
        let dirs = [
            &crew_dir,
            &self.state_dir,
            &self.runs_dir(),
            &self.run_dir(run_id),
        ];
        dirs.iter().all(|dir| real_dir_exists(dir).is_ok())
            && FileStamp::of(&self.manifest_path(run_id)) == Some(stamp)
    }

    fn forget_written(&self, run_id: &RunId) {
        let mut written = lock_unpoisoned(&self.written);
        written.remove(run_id);
    }

    /// Remembers `manifest` as just written, while its run is running.
    fn remember_written(&self, manifest: RunManifest) {
        let stamp = FileStamp::of(&self.manifest_path(&manifest.run_id));
        let mut written = lock_unpoisoned(&self.written);
        match stamp.filter(|_| manifest.status == RunStatus::Running) {
            Some(stamp) => {
                written.insert(manifest.run_id.clone(), Written { stamp, manifest });
            }
            None => {
                written.remove(&manifest.run_id);
            }
        }
    }

    /// Whether a run is live and who hosts it, without reading its tasks: cheaper than
    /// [`StateStore::read_run`] for listings that look at every run.
    pub fn glance_run(&self, run_id: &RunId) -> Result<RunGlance, StateError> {
        self.read_manifest_as(run_id)
    }

    /// [`StateStore::glance_run`] for every run whose manifest is readable.
    pub fn glance_runs(&self) -> Result<Vec<RunGlance>, StateError> {
        Ok(self
            .run_ids()?
            .iter()
            .filter_map(|run_id| self.glance_run(run_id).ok())
            .collect())
    }

    /// Reads a run's manifest as `T` (the whole manifest, or a view of some of its fields).
    fn read_manifest_as<T: DeserializeOwned + ManifestOf>(
        &self,
        run_id: &RunId,
    ) -> Result<T, StateError> {
        let crew_dir = self.workspace.as_path().join(CREW_DIR);
        let run_dir = self.run_dir(run_id);
        for dir in [&crew_dir, &self.state_dir, &self.runs_dir(), &run_dir] {
            real_dir_exists(dir).map_err(|source| StateError::Read {
                path: dir.clone(),
                source,
            })?;
        }
        let path = self.manifest_path(run_id);
        let read = || {
            read_nofollow_steady(&path).map_err(|source| StateError::Read {
                path: path.clone(),
                source,
            })
        };
        let (mut bytes, mut steady) = read()?;
        let mut parsed = serde_json::from_slice(&bytes);
        // A running run's manifest is exchanged with a spare at each write: opened just before
        // two writes, it may be read while it is being rewritten (`write_exchanging`). Read
        // again before trusting it or calling it corrupt.
        for _ in 0..5 {
            if steady && parsed.is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
            (bytes, steady) = read()?;
            parsed = serde_json::from_slice(&bytes);
        }
        let manifest: T = match parsed {
            Ok(manifest) => manifest,
            Err(source) => {
                return Err(match serde_json::from_slice::<SchemaProbe>(&bytes) {
                    Ok(probe) if probe.schema_version > MANIFEST_SCHEMA_VERSION => {
                        StateError::NewerSchema {
                            path,
                            found: probe.schema_version,
                            supported: MANIFEST_SCHEMA_VERSION,
                        }
                    }
                    _ => StateError::Corrupt { path, source },
                });
            }
        };
        if manifest.schema_version() < MANIFEST_SCHEMA_VERSION {
            return Err(StateError::OlderSchema {
                path,
                found: manifest.schema_version(),
                supported: MANIFEST_SCHEMA_VERSION,
            });
        }
        if manifest.workspace() != &self.workspace {
            return Err(StateError::ForeignManifest {
                path,
                expected: self.workspace.clone(),
                found: manifest.workspace().clone(),
            });
        }
        Ok(manifest)
    }

    /// Lock → read → modify → write. `change` may refuse (an invalid transition), in which case
    /// nothing is written. Manifests of a newer schema are never written.
    pub fn update_run<T>(
        &self,
        run_id: &RunId,
        change: impl FnOnce(&mut RunManifest) -> Result<T, TransitionError>,
    ) -> Result<T, StateError> {
        let _lock = self.lock()?;
        // Taken out while it changes: a change that fails leaves nothing behind to trust.
        let mut manifest = self.manifest_to_change(run_id)?;
        let result = change(&mut manifest)?;
        self.write_manifest(&manifest)?;
        self.remember_written(manifest);
        Ok(result)
    }

    /// [`StateStore::update_run`] for a process that changes one run from many threads (a
    /// run's host, whose tasks each record every step): a change made while another thread
    /// writes the manifest waits for that write to end, and is written together with every
    /// other change that waited, in one write, in the order they came. Each caller learns its
    /// own outcome: its change's refusal (the others are written all the same), or the write's
    /// error.
    pub fn update_run_together<T: Send + 'static>(
        &self,
        run_id: &RunId,
        change: impl FnOnce(&mut RunManifest) -> Result<T, TransitionError> + Send + 'static,
    ) -> Result<T, StateError> {
        let (answer, outcome) = std::sync::mpsc::sync_channel::<Result<T, StateError>>(1);
        let queued: QueuedChange = Box::new(move |target: Option<(&mut RunManifest, bool)>| {
            let Some((manifest, shared)) = target else {
                return Outcome {
                    applied: false,
                    tell: Box::new(move |failed: Option<&StateError>| {
                        let message = failed.map_or_else(String::new, error_chain);
                        let _ = answer.send(Err(StateError::Together(message)));
                    }),
                };
            };
            let before = shared.then(|| manifest.clone());
            match change(manifest) {
                Ok(value) => Outcome {
                    applied: true,
                    tell: Box::new(move |failed: Option<&StateError>| {
                        let _ = answer.send(match failed {
                            None => Ok(value),
                            Some(error) => Err(StateError::Together(error_chain(error))),
                        });
                    }),
                },
                Err(refused) => {
                    if let Some(before) = before {
                        *manifest = before;
                    }
                    Outcome {
                        applied: false,
                        tell: Box::new(move |_| {
                            let _ = answer.send(Err(refused.into()));
                        }),
                    }
                }
            }
        });
        lock_unpoisoned(&self.queued.0)
            .entry(run_id.clone())
            .or_default()
            .push(queued);
        let _writing = lock_unpoisoned(&self.writing);
        // The thread that wrote before may have written this change too.
        if let Ok(result) = outcome.try_recv() {
            return result;
        }
        let changes = lock_unpoisoned(&self.queued.0)
            .remove(run_id)
            .unwrap_or_default();
        if let Err(error) = self.write_together(run_id, changes) {
            // Every change was told; this caller learns the error itself, unless its own
            // change was refused first.
            return match outcome.try_recv() {
                Ok(Err(StateError::Together(_))) | Err(_) => Err(error),
                Ok(result) => result,
            };
        }
        outcome
            .try_recv()
            .unwrap_or_else(|_| Err(StateError::Together("the change was lost".to_owned())))
    }

    /// Applies `changes` to the run's manifest in one lock → read → modify → write, and tells
    /// each its outcome. An error that stopped them all is returned as well.
    fn write_together(&self, run_id: &RunId, changes: Vec<QueuedChange>) -> Result<(), StateError> {
        let written = (|| {
            let lock = self.lock()?;
            let manifest = self.manifest_to_change(run_id)?;
            Ok((lock, manifest))
        })();
        let (_lock, mut manifest) = match written {
            Ok(ready) => ready,
            Err(error) => {
                for change in changes {
                    (change(None).tell)(Some(&error));
                }
                return Err(error);
            }
        };
        let shared = changes.len() > 1;
        let outcomes: Vec<Outcome> = changes
            .into_iter()
            .map(|change| change(Some((&mut manifest, shared))))
            .collect();
        let any_applied = outcomes.iter().any(|outcome| outcome.applied);
        let result = if any_applied {
            self.write_manifest(&manifest)
        } else {
            Ok(())
        };
        if result.is_ok() && any_applied {
            self.remember_written(manifest);
        }
        for outcome in outcomes {
            (outcome.tell)(result.as_ref().err());
        }
        result
    }

    /// The manifest of `run_id` to change, taken out of what this store remembers or read;
    /// refused when a newer crew wrote it. The caller holds the lock.
    fn manifest_to_change(&self, run_id: &RunId) -> Result<RunManifest, StateError> {
        let manifest = match self.take_written(run_id) {
            Some(manifest) => manifest,
            None => self.read_manifest_as(run_id)?,
        };
        if manifest.schema_version > MANIFEST_SCHEMA_VERSION {
            return Err(StateError::NewerSchema {
                path: self.manifest_path(run_id),
                found: manifest.schema_version,
                supported: MANIFEST_SCHEMA_VERSION,
            });
        }
        Ok(manifest)
    }

    /// Writes a manifest, keeping the running index with it. The caller holds the lock.
    fn write_manifest(&self, manifest: &RunManifest) -> Result<(), StateError> {
        let path = self.manifest_path(&manifest.run_id);
        let mut json = serde_json::to_vec(manifest).map_err(|source| StateError::Serialize {
            path: path.clone(),
            source,
        })?;
        json.push(b'\n');
        let running = manifest.status == RunStatus::Running;
        if running {
            // First the marker: a crash before the manifest leaves a marker of a run that is
            // not running, which readers skip; never a running run the index misses.
            self.ensure_running_index_locked()?;
            let marker = self.running_dir().join(manifest.run_id.as_str());
            open_rw_nofollow(&marker).map_err(StateError::Layout)?;
        }
        // Whatever this store remembered of the run is no longer what is on disk.
        self.forget_written(&manifest.run_id);
        let hosted_here = manifest
            .host
            .as_ref()
            .is_some_and(|host| host.identity.pid == std::process::id());
        if running && hosted_here {
            // Its host rewrites a running run's manifest at every step of every task:
            // exchanged with a spare, no file is made or deleted per write. Any other process
            // writes a new file, so that the host's memory of what it wrote (`FileStamp`, an
            // inode) never takes that write for its own.
            write_exchanging(&path, &json)
        } else {
            write_atomic(&path, &json)
        }
        .map_err(|source| StateError::Write {
            path: path.clone(),
            source,
        })?;
        if !running {
            // An ended run is rarely written again; its spare (the manifest before) goes.
            let spare = self
                .run_dir(&manifest.run_id)
                .join(spare_name(MANIFEST_FILE));
            // Best effort: the spare is never read, and a later write makes it again.
            let _ = std::fs::remove_file(spare);
            self.remove_marker(&manifest.run_id)?;
        }
        Ok(())
    }

    fn running_dir(&self) -> Utf8PathBuf {
        self.state_dir.join(RUNNING_DIR)
    }

    /// Removes `run_id`'s running marker, if it has one. The caller holds the lock.
    fn remove_marker(&self, run_id: &RunId) -> Result<(), StateError> {
        let marker = self.running_dir().join(run_id.as_str());
        match std::fs::remove_file(&marker) {
            Ok(()) => Ok(()),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(io_write(&marker, source)),
        }
    }

    /// Builds `running/` from every manifest when it does not exist yet (a state made before
    /// the index, or a new one). The caller holds the lock.
    fn ensure_running_index_locked(&self) -> Result<(), StateError> {
        let dir = self.running_dir();
        let exists = real_dir_exists(&dir).map_err(|source| StateError::Read {
            path: dir.clone(),
            source,
        })?;
        if exists {
            return Ok(());
        }
        // Built aside and renamed into place: a reader never sees half an index.
        let building = self
            .state_dir
            .join(format!("{RUNNING_DIR}.building-{}", std::process::id()));
        if std::fs::symlink_metadata(&building).is_ok() {
            // Left by a build of this pid's that failed; a link there is removed, not followed.
            std::fs::remove_dir_all(&building).map_err(|source| io_write(&building, source))?;
        }
        ensure_real_dir(&building).map_err(StateError::Layout)?;
        for glance in self.glance_runs()? {
            if glance.status == RunStatus::Running {
                open_rw_nofollow(&building.join(glance.run_id.as_str()))
                    .map_err(StateError::Layout)?;
            }
        }
        std::fs::rename(&building, &dir).map_err(|source| io_write(&dir, source))
    }

    /// The runs the running index names, building it first when it does not exist. A name
    /// may be stale (see the module doc): whoever reads the run learns whether it runs.
    pub fn running_run_ids(&self) -> Result<Vec<RunId>, StateError> {
        let dir = self.running_dir();
        let exists = real_dir_exists(&dir).map_err(|source| StateError::Read {
            path: dir.clone(),
            source,
        })?;
        if !exists {
            if !real_dir_exists(&self.runs_dir()).unwrap_or(false) {
                // No run was ever recorded here.
                return Ok(Vec::new());
            }
            let _lock = self.lock()?;
            self.ensure_running_index_locked()?;
        }
        let entries = dir.read_dir_utf8().map_err(|source| StateError::List {
            path: dir.clone(),
            source,
        })?;
        let mut ids = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|source| StateError::List {
                path: dir.clone(),
                source,
            })?;
            if let Ok(run_id) = RunId::parse(entry.file_name()) {
                ids.push(run_id);
            }
        }
        ids.sort();
        Ok(ids)
    }

    /// [`StateStore::glance_run`] for every run the running index names whose manifest says
    /// it is running: what is live, read without the finished runs.
    pub fn glance_running(&self) -> Result<Vec<RunGlance>, StateError> {
        Ok(self
            .running_run_ids()?
            .iter()
            .filter_map(|run_id| self.glance_run(run_id).ok())
            .filter(|glance| glance.status == RunStatus::Running)
            .collect())
    }

    /// Appends one event line to the run's `events.jsonl`. Each line is written with a single
    /// `write` on an `O_APPEND` file, so concurrent writers never interleave within a line.
    pub fn append_event(&self, run_id: &RunId, event: &RunEvent) -> Result<(), StateError> {
        let path = self.events_path(run_id);
        let mut line = serde_json::to_vec(event).map_err(|source| StateError::Serialize {
            path: path.clone(),
            source,
        })?;
        line.push(b'\n');
        let mut file = open_append_nofollow(&path).map_err(|source| StateError::Write {
            path: path.clone(),
            source,
        })?;
        file.write_all(&line).map_err(|source| StateError::Write {
            path: path.clone(),
            source: FileError::Write { path, source },
        })
    }

    /// Records that someone looked at the outcome of `tasks` of `run_id` (see [`SEEN_FILE`]).
    pub fn mark_seen(&self, run_id: &RunId, tasks: &[TaskId]) -> Result<(), StateError> {
        if tasks.is_empty() {
            return Ok(());
        }
        let path = self.run_dir(run_id).join(SEEN_FILE);
        let lines: String = tasks.iter().map(|task| format!("{task}\n")).collect();
        let mut file = open_append_nofollow(&path).map_err(|source| StateError::Write {
            path: path.clone(),
            source,
        })?;
        file.write_all(lines.as_bytes())
            .map_err(|source| StateError::Write {
                path: path.clone(),
                source: FileError::Write { path, source },
            })
    }

    /// The tasks of `run_id` someone looked at; none when nobody did. A line that is not a
    /// task id (a write cut short) is skipped.
    pub fn seen_tasks(&self, run_id: &RunId) -> Result<BTreeSet<TaskId>, StateError> {
        let path = self.run_dir(run_id).join(SEEN_FILE);
        let bytes = match read_nofollow(&path) {
            Ok(bytes) => bytes,
            Err(FileError::Read { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
                return Ok(BTreeSet::new());
            }
            Err(source) => return Err(StateError::Read { path, source }),
        };
        Ok(String::from_utf8_lossy(&bytes)
            .lines()
            .filter_map(|line| TaskId::parse(line).ok())
            .collect())
    }

    /// The events of a run, in order. A line that cannot be parsed (such as the last line of a
    /// log cut short by a crash) is counted, not fatal.
    pub fn read_events(&self, run_id: &RunId) -> Result<(Vec<RunEvent>, usize), StateError> {
        let path = self.events_path(run_id);
        let bytes = match read_nofollow(&path) {
            Ok(bytes) => bytes,
            Err(FileError::Read { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
                return Ok((Vec::new(), 0));
            }
            Err(source) => return Err(StateError::Read { path, source }),
        };
        let mut events = Vec::new();
        let mut unreadable = 0;
        for line in bytes.split(|&b| b == b'\n').filter(|line| !line.is_empty()) {
            match serde_json::from_slice(line) {
                Ok(event) => events.push(event),
                Err(_) => unreadable += 1,
            }
        }
        Ok((events, unreadable))
    }

    /// The events of a run written from byte `offset` of its log on, complete lines only, and
    /// the offset after the last of them: reading again from there gives what came since
    /// (`crew events --follow`). A line that cannot be parsed is skipped.
    pub fn read_events_since(
        &self,
        run_id: &RunId,
        offset: u64,
    ) -> Result<(Vec<RunEvent>, u64), StateError> {
        let path = self.events_path(run_id);
        let mut file = match open_nofollow(&path) {
            Ok(file) => file,
            Err(FileError::Read { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
                return Ok((Vec::new(), offset));
            }
            Err(source) => return Err(StateError::Read { path, source }),
        };
        let read_error = |source| StateError::Read {
            path: path.clone(),
            source: FileError::Read {
                path: path.clone(),
                source,
            },
        };
        io::Seek::seek(&mut file, io::SeekFrom::Start(offset)).map_err(read_error)?;
        let mut bytes = Vec::new();
        io::Read::read_to_end(&mut file, &mut bytes).map_err(read_error)?;
        // A line still being written waits for the next read.
        let complete = bytes
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |end| end + 1);
        let events = bytes[..complete]
            .split(|&b| b == b'\n')
            .filter(|line| !line.is_empty())
            .filter_map(|line| serde_json::from_slice(line).ok())
            .collect();
        Ok((events, offset + complete as u64))
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

    /// The ids of the runs on disk, newest first.
    pub fn run_ids(&self) -> Result<Vec<RunId>, StateError> {
        let runs_dir = self.runs_dir();
        if !self.run_ids_exist(&runs_dir)? {
            return Ok(Vec::new());
        }
        Ok(self.newest_run_ids_in(&runs_dir, usize::MAX)?.0)
    }

    /// The `limit` newest runs' ids, newest first, and how many runs there are: one pass over
    /// the runs directory that keeps only the newest (the directory's order is not the runs'),
    /// without a heap allocation for the others.
    pub fn newest_run_ids(&self, limit: usize) -> Result<(Vec<RunId>, usize), StateError> {
        let runs_dir = self.runs_dir();
        match self.run_ids_exist(&runs_dir)? {
            true => self.newest_run_ids_in(&runs_dir, limit),
            false => Ok((Vec::new(), 0)),
        }
    }

    /// Whether `.crew/state/runs` is there, each step a real directory.
    fn run_ids_exist(&self, runs_dir: &Utf8Path) -> Result<bool, StateError> {
        let crew_dir = self.workspace.as_path().join(CREW_DIR);
        real_dir_exists(&crew_dir)
            .and_then(|exists| Ok(exists && real_dir_exists(&self.state_dir)?))
            .and_then(|exists| Ok(exists && real_dir_exists(runs_dir)?))
            .map_err(|source| StateError::Read {
                path: runs_dir.to_owned(),
                source,
            })
    }

    fn newest_run_ids_in(
        &self,
        runs_dir: &Utf8Path,
        limit: usize,
    ) -> Result<(Vec<RunId>, usize), StateError> {
        use std::cmp::Reverse;
        use std::collections::BinaryHeap;
        let list_error = |source: std::io::Error| StateError::List {
            path: runs_dir.to_owned(),
            source,
        };
        let fd = rustix::fs::open(
            runs_dir.as_std_path(),
            rustix::fs::OFlags::RDONLY
                | rustix::fs::OFlags::DIRECTORY
                | rustix::fs::OFlags::NOFOLLOW
                | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(|errno| list_error(errno.into()))?;
        let mut dir = rustix::fs::Dir::read_from(&fd).map_err(|errno| list_error(errno.into()))?;
        // The newest `limit` seen so far, the oldest of them on top.
        let mut newest: BinaryHeap<Reverse<(u64, String)>> = BinaryHeap::new();
        let mut total = 0;
        while let Some(entry) = dir.read() {
            let entry = entry.map_err(|errno| list_error(errno.into()))?;
            let name = entry.file_name().to_bytes();
            // Anything that is not a run directory (a stray file, a temp file) is not a run.
            if !RunId::is_valid(name) {
                continue;
            }
            let name = std::str::from_utf8(name).expect("a valid run id is ASCII");
            let is_dir = match entry.file_type() {
                rustix::fs::FileType::Directory => true,
                rustix::fs::FileType::Unknown => {
                    real_dir_exists(&runs_dir.join(name)).unwrap_or(false)
                }
                _ => false,
            };
            if !is_dir {
                continue;
            }
            total += 1;
            // A named run has no time in its id: its directory's birth says when.
            let created = RunId::created_millis_of(name)
                .or_else(|| created_millis(&runs_dir.join(name)))
                .unwrap_or(0);
            let newer = newest.len() < limit
                || newest
                    .peek()
                    .is_some_and(|Reverse(oldest)| (created, name) > (oldest.0, oldest.1.as_str()));
            if newer {
                newest.push(Reverse((created, name.to_owned())));
                if newest.len() > limit {
                    newest.pop();
                }
            }
        }
        let mut ids: Vec<(u64, String)> = newest.into_iter().map(|Reverse(id)| id).collect();
        ids.sort_by(|a, b| b.cmp(a));
        let ids = ids
            .into_iter()
            .filter_map(|(_, name)| RunId::parse(&name).ok())
            .collect();
        Ok((ids, total))
    }

    /// Every run of the workspace, newest first; unreadable ones carry their error.
    pub fn list_runs(&self) -> Result<Vec<RunListing>, StateError> {
        Ok(self.list_newest_runs(usize::MAX)?.0)
    }

    /// The `limit` newest runs, reading no other run's manifest, and how many runs there are.
    pub fn list_newest_runs(&self, limit: usize) -> Result<(Vec<RunListing>, usize), StateError> {
        let (ids, total) = self.newest_run_ids(limit)?;
        let listed = ids
            .into_iter()
            .take(limit)
            .map(|run_id| RunListing {
                manifest: self.read_run(&run_id),
                run_id,
            })
            .collect();
        Ok((listed, total))
    }

    /// The run a user means by `prefix`: an exact id, or a prefix only one run has.
    pub fn resolve_run(&self, prefix: &str) -> Result<RunId, StateError> {
        let ids = self.run_ids()?;
        if let Some(exact) = ids.iter().find(|id| id.as_str() == prefix) {
            return Ok(exact.clone());
        }
        let matches: Vec<RunId> = ids
            .into_iter()
            .filter(|id| !prefix.is_empty() && id.as_str().starts_with(prefix))
            .collect();
        match matches.len() {
            0 => Err(StateError::UnknownRun {
                prefix: prefix.to_owned(),
                workspace: self.workspace.clone(),
            }),
            1 => Ok(matches.into_iter().next().expect("one match")),
            _ => Err(StateError::AmbiguousRun {
                prefix: prefix.to_owned(),
                candidates: matches,
            }),
        }
    }

    /// Marks every `running` run of this workspace whose host process is gone as `interrupted`;
    /// its tasks that were preparing or running become `failed` with the reason. Runs of other
    /// workspaces are never looked at. Returns the runs it changed.
    pub fn reconcile(&self) -> Result<Vec<RunId>, StateError> {
        let mut interrupted = Vec::new();
        // Only the runs the index says are running: finished runs are never read.
        for run_id in self.running_run_ids()? {
            // Cheap check without the lock first: the run's status and host, not its tasks.
            let manifest = match self.glance_run(&run_id) {
                Ok(manifest) => manifest,
                Err(_) if !real_dir_exists(&self.run_dir(&run_id)).unwrap_or(true) => {
                    // The run is gone (removed by hand): so is its marker.
                    let _lock = self.lock()?;
                    self.remove_marker(&run_id)?;
                    continue;
                }
                Err(_) => continue,
            };
            if manifest.status != RunStatus::Running {
                // A marker a crash left behind: checked again under the lock, then removed.
                let _lock = self.lock()?;
                if self
                    .read_run(&run_id)
                    .is_ok_and(|manifest| manifest.status != RunStatus::Running)
                {
                    self.remove_marker(&run_id)?;
                }
                continue;
            }
            if manifest
                .host
                .as_ref()
                .is_some_and(|host| host.identity.is_alive())
            {
                continue;
            }
            let changed = self.update_run(&run_id, |manifest| {
                // Checked again under the lock: the host may have finished the run meanwhile.
                if manifest.status != RunStatus::Running || host_alive(manifest) {
                    return Ok(None);
                }
                let reason = match &manifest.host {
                    Some(host) => format!("host process {} is gone", host.identity.pid),
                    None => "the run has no recorded host".to_owned(),
                };
                let active: Vec<TaskId> = manifest
                    .tasks
                    .iter()
                    .filter(|task| {
                        matches!(task.status, TaskStatus::Preparing | TaskStatus::Running)
                    })
                    .map(|task| task.id.clone())
                    .collect();
                for task_id in &active {
                    let task = manifest.set_task_status(task_id, TaskStatus::Failed)?;
                    task.reason = Some(format!("{INTERRUPTED_REASON}{reason}"));
                }
                manifest.set_status(RunStatus::Interrupted)?;
                manifest.reason = Some(reason.clone());
                Ok(Some((reason, active)))
            })?;
            if let Some((reason, active)) = changed {
                // The run's history says its host died, as it says everything else. The
                // manifest holds the same: an event that cannot be written loses nothing.
                let mut events: Vec<RunEvent> = active
                    .into_iter()
                    .map(|task_id| {
                        RunEvent::new(
                            Some(task_id),
                            EventKind::TaskStatus {
                                status: TaskStatus::Failed,
                                reason: Some(format!("{INTERRUPTED_REASON}{reason}")),
                            },
                        )
                    })
                    .collect();
                events.push(RunEvent::new(
                    None,
                    EventKind::RunStatus {
                        status: RunStatus::Interrupted,
                        reason: Some(reason),
                    },
                ));
                for event in &events {
                    let _ = self.append_event(&run_id, event);
                }
                interrupted.push(run_id);
            }
        }
        Ok(interrupted)
    }

    /// Applies retention: finished runs beyond `max_kept_runs` (newest kept) or older than
    /// `max_run_age_days` are removed with their `dedicated` workspaces. Running runs, runs with
    /// a task waiting for an answer, and unreadable runs are never pruned.
    pub fn prune(
        &self,
        retention: &RetentionSettings,
        now: SystemTime,
        dry_run: bool,
    ) -> Result<PruneReport, StateError> {
        self.prune_where(retention, now, dry_run, |_| true)
    }

    /// [`StateStore::prune`] as crew does it by itself: only runs whose every task's work is
    /// on a branch, in the project itself, or was never there (a `dedicated` workspace, a
    /// preserved worktree or one never torn down keeps its run).
    pub fn prune_saved(
        &self,
        retention: &RetentionSettings,
        now: SystemTime,
    ) -> Result<PruneReport, StateError> {
        self.prune_where(retention, now, false, |manifest| {
            manifest.tasks.iter().all(TaskRecord::work_is_saved)
        })
    }

    /// Whether retention may have something to prune, from the runs' names alone (no manifest
    /// is read): more runs than `max_kept_runs`, or an oldest run older than
    /// `max_run_age_days`. What a run's end checks before it starts a prune.
    pub fn prune_due(&self, retention: &RetentionSettings, now: SystemTime) -> bool {
        let Ok(entries) = self.runs_dir().read_dir_utf8() else {
            return false;
        };
        let ids: Vec<RunId> = entries
            .flatten()
            .filter_map(|entry| RunId::parse(entry.file_name()).ok())
            .collect();
        if ids.len() > retention.max_kept_runs {
            return true;
        }
        let max_age = Duration::from_secs(retention.max_run_age_days.saturating_mul(86_400));
        ids.iter()
            .filter_map(RunId::created_millis)
            .min()
            .is_some_and(|oldest| {
                let created = SystemTime::UNIX_EPOCH + Duration::from_millis(oldest);
                now.duration_since(created).unwrap_or_default() > max_age
            })
    }

    fn prune_where(
        &self,
        retention: &RetentionSettings,
        now: SystemTime,
        dry_run: bool,
        may_remove: impl Fn(&RunManifest) -> bool,
    ) -> Result<PruneReport, StateError> {
        let max_age = Duration::from_secs(retention.max_run_age_days.saturating_mul(86_400));
        let mut report = PruneReport::default();
        let mut finished_seen = 0usize;
        for listing in self.list_runs()? {
            let Ok(manifest) = listing.manifest else {
                report.kept += 1;
                continue;
            };
            let prunable = manifest.schema_version <= MANIFEST_SCHEMA_VERSION
                && manifest.status.is_finished()
                && !manifest
                    .tasks
                    .iter()
                    .any(|task| matches!(task.status, TaskStatus::Waiting | TaskStatus::Paused))
                && may_remove(&manifest);
            if !prunable {
                report.kept += 1;
                continue;
            }
            finished_seen += 1;
            let finished = manifest.finished_at.unwrap_or(manifest.updated_at).0;
            let too_old = now.duration_since(finished).unwrap_or_default() > max_age;
            if finished_seen <= retention.max_kept_runs && !too_old {
                report.kept += 1;
                continue;
            }
            if !dry_run {
                self.remove_run(&listing.run_id)?;
            }
            report.pruned.push(listing.run_id);
        }
        Ok(report)
    }

    /// Removes a run's directory and its `dedicated` workspaces, refusing anything outside
    /// `.crew/state`.
    pub fn remove_run(&self, run_id: &RunId) -> Result<(), StateError> {
        let _lock = self.lock()?;
        // A run of another crew's format is not this crew's to remove: a newer crew may still
        // need it, and its workspaces may hold what this crew cannot see.
        match self.glance_run(run_id) {
            Ok(glance) if glance.schema_version > MANIFEST_SCHEMA_VERSION => {
                return Err(StateError::NewerSchema {
                    path: self.manifest_path(run_id),
                    found: glance.schema_version,
                    supported: MANIFEST_SCHEMA_VERSION,
                });
            }
            Err(error @ (StateError::NewerSchema { .. } | StateError::OlderSchema { .. })) => {
                return Err(error);
            }
            _ => {}
        }
        let roots = [self.state_dir.as_path()];
        remove_contained(&self.dedicated_root().join(run_id.as_str()), &roots).map_err(
            |source| StateError::Remove {
                run_id: run_id.clone(),
                source,
            },
        )?;
        remove_contained(&self.run_dir(run_id), &roots).map_err(|source| StateError::Remove {
            run_id: run_id.clone(),
            source,
        })?;
        // A running run is never removed; a stale marker goes with its run.
        self.remove_marker(run_id)?;
        Ok(())
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

fn host_alive(manifest: &RunManifest) -> bool {
    manifest
        .host
        .as_ref()
        .is_some_and(|host| host.identity.is_alive())
}

/// When a directory was made (its birth time, or its last change where the filesystem keeps
/// no birth time), in milliseconds since the epoch.
fn created_millis(dir: &Utf8Path) -> Option<u64> {
    let metadata = std::fs::symlink_metadata(dir).ok()?;
    let time = metadata.created().or_else(|_| metadata.modified()).ok()?;
    let since = time.duration_since(std::time::UNIX_EPOCH).ok()?;
    u64::try_from(since.as_millis()).ok()
}
