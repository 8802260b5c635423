//! A run's manifest read and written: whole and checked (its workspace, its schema), or
//! glanced at; changes made under the run's lock, queued ones written together; what this
//! store last wrote kept, so that reading it back costs nothing while the file is unchanged.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use camino::Utf8Path;
use serde::Deserialize;
use serde::de::DeserializeOwned;

use super::{MANIFEST_FILE, StateError, StateStore, lock_unpoisoned};
use crate::discovery::CREW_DIR;
use crate::fsutil::{
    open_rw_nofollow, read_nofollow_steady, real_dir_exists, spare_name, write_atomic,
    write_exchanging,
};
use crate::ids::{RunId, TaskId, WorkspaceId};
use crate::model::{
    MANIFEST_SCHEMA_VERSION, RunGlance, RunManifest, RunStatus, TaskRecord, Timestamp,
    TransitionError,
};

impl StateStore {
    /// Reads a run's manifest. A newer schema is returned when it parses (it is read-only: any
    /// update is refused); a corrupt file is an error naming it.
    pub fn read_run(&self, run_id: &RunId) -> Result<RunManifest, StateError> {
        match self.look_at_written_or_wait(run_id, RunManifest::clone) {
            Some(manifest) => Ok(manifest),
            None => self.read_manifest(run_id),
        }
    }

    /// `look` at the run's manifest: [`StateStore::read_run`] without a copy of the manifest
    /// when this store wrote it last (a runner looks up one task of a hundred at each start).
    pub fn look_at_run<T>(
        &self,
        run_id: &RunId,
        look: impl Fn(&RunManifest) -> T,
    ) -> Result<T, StateError> {
        match self.look_at_written_or_wait(run_id, &look) {
            Some(found) => Ok(found),
            None => Ok(look(&self.read_manifest(run_id)?)),
        }
    }

    /// [`StateStore::look_at_written`]; when this store is writing the run meanwhile (the
    /// manifest is out of its memory while it changes), after that write, rather than reading
    /// and parsing the files.
    fn look_at_written_or_wait<T>(
        &self,
        run_id: &RunId,
        look: impl Fn(&RunManifest) -> T,
    ) -> Option<T> {
        if let Some(found) = self.look_at_written(run_id, &look) {
            return Some(found);
        }
        let writing = lock_unpoisoned(&self.writing);
        let found = self.look_at_written(run_id, &look);
        drop(writing);
        found
    }

    /// Reads a run's manifest whole: the file, and the journal of task changes that goes with
    /// it (`journal`). Read again when the manifest was rewritten meanwhile, so that a
    /// journal is never applied to a manifest it does not belong to, nor left out.
    pub(super) fn read_manifest(&self, run_id: &RunId) -> Result<RunManifest, StateError> {
        let path = self.manifest_path(run_id);
        let mut tries = 0;
        loop {
            let before = FileStamp::of(&path);
            let mut manifest: RunManifest = self.read_manifest_as(run_id)?;
            if manifest.journal.is_none() {
                return Ok(manifest);
            }
            self.replay_journal(&mut manifest)?;
            tries += 1;
            if before.is_some() && FileStamp::of(&path) == before || tries == 5 {
                return Ok(manifest);
            }
        }
    }

    /// What `look` finds in the manifest as this store last wrote it, if that is still what the
    /// files hold (and the directories leading to them are still real directories), without
    /// copying it.
    pub(super) fn look_at_written<T>(
        &self,
        run_id: &RunId,
        look: impl FnOnce(&RunManifest) -> T,
    ) -> Option<T> {
        let written = lock_unpoisoned(&self.written);
        let entry = written.get(run_id)?;
        self.still_in_place(run_id, &entry.files)
            .then(|| look(&entry.manifest))
    }

    /// [`StateStore::as_written`], taken out of the store's memory, with the files it is in.
    pub(super) fn take_written(&self, run_id: &RunId) -> Option<(RunManifest, Files)> {
        let mut written = lock_unpoisoned(&self.written);
        let entry = written.remove(run_id)?;
        self.still_in_place(run_id, &entry.files)
            .then_some((entry.manifest, entry.files))
    }

    pub(super) fn still_in_place(&self, run_id: &RunId, files: &Files) -> bool {
        let crew_dir = self.workspace.as_path().join(CREW_DIR);
        let dirs = [
            &crew_dir,
            &self.state_dir,
            &self.runs_dir(),
            &self.run_dir(run_id),
        ];
        dirs.iter().all(|dir| real_dir_exists(dir).is_ok())
            && FileStamp::of(&self.manifest_path(run_id)) == Some(files.manifest)
            && FileStamp::of(&self.journal_path(run_id)) == files.journal
    }

    pub(super) fn forget_written(&self, run_id: &RunId) {
        let mut written = lock_unpoisoned(&self.written);
        written.remove(run_id);
    }

    /// Remembers `manifest` as just written, while its run is running.
    pub(super) fn remember_written(&self, manifest: RunManifest) {
        let stamp = FileStamp::of(&self.manifest_path(&manifest.run_id));
        let journal = FileStamp::of(&self.journal_path(&manifest.run_id));
        let mut written = lock_unpoisoned(&self.written);
        match stamp.filter(|_| manifest.status == RunStatus::Running) {
            Some(stamp) => {
                let files = Files {
                    manifest: stamp,
                    journal,
                };
                written.insert(manifest.run_id.clone(), Written { files, manifest });
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
    pub(super) fn read_manifest_as<T: DeserializeOwned + ManifestOf>(
        &self,
        run_id: &RunId,
    ) -> Result<T, StateError> {
        let crew_dir = self.workspace.as_path().join(CREW_DIR);
        let run_dir = self.run_dir(run_id);
        for dir in [&crew_dir, &self.state_dir, &self.runs_dir(), &run_dir] {
            let exists = real_dir_exists(dir).map_err(|source| StateError::Read {
                path: dir.clone(),
                source,
            })?;
            if !exists {
                // No such run here (another project folder's id, a pruned run): a run that
                // matches none, not a file that failed to read.
                return Err(StateError::UnknownRun {
                    prefix: run_id.to_string(),
                    workspace: self.workspace.clone(),
                });
            }
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
        let (mut manifest, _) = self.manifest_to_change(run_id)?;
        let result = change(&mut manifest)?;
        self.write_manifest(&mut manifest)?;
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
        self.change_together(
            run_id,
            Touched::Run,
            move |manifest: &mut RunManifest, shared: bool| {
                let before = shared.then(|| manifest.clone());
                let changed = change(manifest);
                if let (Err(_), Some(before)) = (&changed, before) {
                    *manifest = before;
                }
                changed
            },
        )
    }

    /// [`StateStore::update_run_together`] for a change to one task's record alone: what a
    /// run's host records at each step of a task. It is appended to the run's journal
    /// (`store/journal.rs`), so its cost does not grow with the run; the manifest's
    /// `updated_at` moves with it. A refused change leaves the record as it was.
    pub fn update_task_together<T: Send + 'static>(
        &self,
        run_id: &RunId,
        task_id: &TaskId,
        change: impl FnOnce(&mut TaskRecord) -> Result<T, TransitionError> + Send + 'static,
    ) -> Result<T, StateError> {
        let task = task_id.clone();
        self.change_together(
            run_id,
            Touched::Task(task_id.clone()),
            move |manifest: &mut RunManifest, _shared: bool| {
                let now = Timestamp::now();
                let record = manifest.task_mut(&task)?;
                let before = record.clone();
                let changed = change(record);
                match &changed {
                    Ok(_) => manifest.updated_at = now,
                    Err(_) => *record = before,
                }
                changed
            },
        )
    }

    /// Queues `change` (which undoes itself when it refuses, given whether other changes
    /// share the manifest) to be written together with the changes of other threads; see
    /// [`StateStore::update_run_together`].
    fn change_together<T: Send + 'static>(
        &self,
        run_id: &RunId,
        touched: Touched,
        change: impl FnOnce(&mut RunManifest, bool) -> Result<T, TransitionError> + Send + 'static,
    ) -> Result<T, StateError> {
        let (answer, outcome) = std::sync::mpsc::sync_channel::<Result<T, StateError>>(1);
        let queued: QueuedChange = Box::new(move |target: Option<(&mut RunManifest, bool)>| {
            let Some((manifest, shared)) = target else {
                return Outcome {
                    applied: None,
                    tell: Box::new(move |failed: Option<&Arc<StateError>>| {
                        let error = failed.map_or(StateError::Lost, |error| {
                            StateError::Together(Arc::clone(error))
                        });
                        // The caller may have stopped waiting (its thread ended): no one to tell.
                        let _ = answer.send(Err(error));
                    }),
                };
            };
            match change(manifest, shared) {
                Ok(value) => Outcome {
                    applied: Some(touched),
                    tell: Box::new(move |failed: Option<&Arc<StateError>>| {
                        // The caller may have stopped waiting (its thread ended): no one to tell.
                        let _ = answer.send(match failed {
                            None => Ok(value),
                            Some(error) => Err(StateError::Together(Arc::clone(error))),
                        });
                    }),
                },
                Err(refused) => Outcome {
                    applied: None,
                    tell: Box::new(move |_| {
                        // The caller may have stopped waiting (its thread ended): no one to tell.
                        let _ = answer.send(Err(refused.into()));
                    }),
                },
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
                Ok(Err(StateError::Together(_) | StateError::Lost)) | Err(_) => Err(error),
                Ok(result) => result,
            };
        }
        outcome.try_recv().unwrap_or(Err(StateError::Lost))
    }

    /// Applies `changes` to the run's manifest in one lock → read → modify → write, and tells
    /// each its outcome. An error that stopped them all is returned as well.
    pub(super) fn write_together(
        &self,
        run_id: &RunId,
        changes: Vec<QueuedChange>,
    ) -> Result<(), StateError> {
        let ready = (|| {
            let lock = self.lock()?;
            let manifest = self.manifest_to_change(run_id)?;
            Ok((lock, manifest))
        })();
        let (_lock, (mut manifest, files)) = match ready {
            Ok(ready) => ready,
            Err(error) => {
                let error = Arc::new(error);
                for change in changes {
                    (change(None).tell)(Some(&error));
                }
                return Err(StateError::Together(error));
            }
        };
        let shared = changes.len() > 1;
        let outcomes: Vec<Outcome> = changes
            .into_iter()
            .map(|change| change(Some((&mut manifest, shared))))
            .collect();
        let mut tasks: Vec<TaskId> = Vec::new();
        let mut whole = false;
        for touched in outcomes
            .iter()
            .filter_map(|outcome| outcome.applied.as_ref())
        {
            match touched {
                Touched::Run => whole = true,
                Touched::Task(task) if !tasks.contains(task) => tasks.push(task.clone()),
                Touched::Task(_) => {}
            }
        }
        let result = if whole {
            self.write_manifest(&mut manifest).map(|()| true)
        } else if tasks.is_empty() {
            Ok(false)
        } else if journal_has_room(files.as_ref()) && manifest.journal.is_some() {
            self.append_journal(&manifest, &tasks, manifest.updated_at)
                .map(|()| true)
        } else {
            self.write_manifest(&mut manifest).map(|()| true)
        };
        match result {
            Ok(true) => self.remember_written(manifest),
            Ok(false) => {}
            // What the files hold is not known: the manifest is read again next time.
            Err(_) => self.forget_written(run_id),
        }
        let result = result.map(|_| ()).map_err(Arc::new);
        for outcome in outcomes {
            (outcome.tell)(result.as_ref().err());
        }
        result.map_err(StateError::Together)
    }

    /// The manifest of `run_id` to change, taken out of what this store remembers or read;
    /// refused when a newer crew wrote it. The caller holds the lock.
    pub(super) fn manifest_to_change(
        &self,
        run_id: &RunId,
    ) -> Result<(RunManifest, Option<Files>), StateError> {
        let (manifest, files) = match self.take_written(run_id) {
            Some((manifest, files)) => (manifest, Some(files)),
            None => (self.read_manifest(run_id)?, None),
        };
        if manifest.schema_version > MANIFEST_SCHEMA_VERSION {
            return Err(StateError::NewerSchema {
                path: self.manifest_path(run_id),
                found: manifest.schema_version,
                supported: MANIFEST_SCHEMA_VERSION,
            });
        }
        Ok((manifest, files))
    }

    /// Writes a manifest, keeping the running index with it. The caller holds the lock.
    /// While the run runs, the manifest takes the next generation of its journal, whose older
    /// lines it now holds; the journal then goes.
    pub(super) fn write_manifest(&self, manifest: &mut RunManifest) -> Result<(), StateError> {
        let path = self.manifest_path(&manifest.run_id);
        manifest.journal = (manifest.status == RunStatus::Running)
            .then(|| manifest.journal.map_or(1, |generation| generation + 1));
        let mut json = serde_json::to_vec(&*manifest).map_err(|source| StateError::Serialize {
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
        self.empty_journal(&manifest.run_id, running);
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
}

/// A change queued for [`StateStore::update_run_together`]: applied to the manifest (with
/// whether it must undo itself when refused: other changes share the manifest), or to none
/// when the manifest could not be read, it returns what tells its caller the outcome once the
/// write is done.
pub(super) type QueuedChange = Box<dyn FnOnce(Option<(&mut RunManifest, bool)>) -> Outcome + Send>;

/// Tells a caller of [`StateStore::update_run_together`] its outcome, given the write's error
/// if it failed.
pub(super) type Tell = Box<dyn FnOnce(Option<&Arc<StateError>>) + Send>;

/// The changes queued by run, for [`StateStore::update_run_together`].
#[derive(Default)]
pub(super) struct ChangeQueue(Mutex<HashMap<RunId, Vec<QueuedChange>>>);

impl std::fmt::Debug for ChangeQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let queued: usize = lock_unpoisoned(&self.0).values().map(Vec::len).sum();
        f.debug_struct("ChangeQueue")
            .field("queued", &queued)
            .finish()
    }
}

/// What a queued change did: what it touched when it was applied (not refused), and how to tell its caller
/// the outcome once the write is done.
pub(super) struct Outcome {
    applied: Option<Touched>,
    tell: Tell,
}

/// What an applied change touched: the run (written whole), or one task's record (journaled).
pub(super) enum Touched {
    Run,
    Task(TaskId),
}

/// A manifest this store wrote, and the files it went into.
#[derive(Debug)]
pub(super) struct Written {
    files: Files,
    manifest: RunManifest,
}

/// The files a manifest went into: the manifest, and the journal of task changes appended
/// since (none: no journal file).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Files {
    manifest: FileStamp,
    journal: Option<FileStamp>,
}

/// Whether changed records may go to the journal rather than a whole write: only while the
/// journal (as these files hold it) is smaller than the manifest, whose next whole write folds
/// it in, so that appends and whole writes together cost about what the changes were.
fn journal_has_room(files: Option<&Files>) -> bool {
    files.is_some_and(|files| files.journal.map_or(0, |journal| journal.len) < files.manifest.len)
}

/// Which file is at a path, and as what: a manifest is replaced by renaming a new file over it
/// (or, by its own host, exchanged with its spare), so another writer's manifest is another
/// inode (made while this one still existed), and a reused inode number would also need the
/// same size and change times.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FileStamp {
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

#[derive(Deserialize)]
pub(super) struct SchemaProbe {
    schema_version: u32,
}

/// What a manifest read as a whole or in part says about the workspace it belongs to.
pub(super) trait ManifestOf {
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
