//! Finding runs: the index of running ones, ids newest first (by creation time, without
//! reading manifests), listings, and a run named by a prefix of its id.

use std::io;

use camino::{Utf8Path, Utf8PathBuf};

use super::{RUNNING_DIR, RunListing, StateError, StateStore, io_write};
use crate::discovery::CREW_DIR;
use crate::fsutil::{ensure_real_dir, open_rw_nofollow, real_dir_exists};
use crate::ids::RunId;
use crate::model::{RunGlance, RunStatus, Timestamp};

impl StateStore {
    pub(super) fn running_dir(&self) -> Utf8PathBuf {
        self.state_dir.join(RUNNING_DIR)
    }

    /// Says that `run_id`'s host is alive now: its running marker's time is set to now (the
    /// marker is never made or followed here). A host that dies unrecorded was last seen then
    /// (see `reconcile`); its host calls this every few seconds while the run goes on.
    pub fn mark_alive(&self, run_id: &RunId) -> Result<(), StateError> {
        let marker = self.running_dir().join(run_id.as_str());
        let now = rustix::fs::Timestamps {
            last_access: rustix::fs::Timespec {
                tv_sec: 0,
                tv_nsec: rustix::fs::UTIME_NOW,
            },
            last_modification: rustix::fs::Timespec {
                tv_sec: 0,
                tv_nsec: rustix::fs::UTIME_NOW,
            },
        };
        match rustix::fs::utimensat(
            rustix::fs::CWD,
            marker.as_std_path(),
            &now,
            rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
        ) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(()),
            Err(errno) => Err(io_write(&marker, errno.into())),
        }
    }

    /// When `run_id`'s host last said it was alive ([`Self::mark_alive`]), if its marker is
    /// there.
    pub(super) fn marked_alive_at(&self, run_id: &RunId) -> Option<Timestamp> {
        let marker = self.running_dir().join(run_id.as_str());
        std::fs::symlink_metadata(marker)
            .and_then(|metadata| metadata.modified())
            .ok()
            .map(Timestamp)
    }

    /// Removes `run_id`'s running marker, if it has one. The caller holds the lock.
    pub(super) fn remove_marker(&self, run_id: &RunId) -> Result<(), StateError> {
        let marker = self.running_dir().join(run_id.as_str());
        match std::fs::remove_file(&marker) {
            Ok(()) => Ok(()),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(io_write(&marker, source)),
        }
    }

    /// Builds `running/` from every manifest when it does not exist yet (a state made before
    /// the index, or a new one). The caller holds the lock.
    pub(super) fn ensure_running_index_locked(&self) -> Result<(), StateError> {
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
    pub(super) fn run_ids_exist(&self, runs_dir: &Utf8Path) -> Result<bool, StateError> {
        let crew_dir = self.workspace.as_path().join(CREW_DIR);
        real_dir_exists(&crew_dir)
            .and_then(|exists| Ok(exists && real_dir_exists(&self.state_dir)?))
            .and_then(|exists| Ok(exists && real_dir_exists(runs_dir)?))
            .map_err(|source| StateError::Read {
                path: runs_dir.to_owned(),
                source,
            })
    }

    pub(super) fn newest_run_ids_in(
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
}

/// When a directory was made (its birth time, or its last change where the filesystem keeps
/// no birth time), in milliseconds since the epoch.
pub(super) fn created_millis(dir: &Utf8Path) -> Option<u64> {
    let metadata = std::fs::symlink_metadata(dir).ok()?;
    let time = metadata.created().or_else(|_| metadata.modified()).ok()?;
    let since = time.duration_since(std::time::UNIX_EPOCH).ok()?;
    u64::try_from(since.as_millis()).ok()
}
