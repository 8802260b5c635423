//! A running run's task journal: `runs/<runId>/changes.jsonl`, beside its manifest.
//!
//! A run's host changes one task at a time (it starts, it exits, its workspace is torn down),
//! and writing the whole manifest for each change costs by the run's size, not the change's:
//! a run of a thousand tasks would write a megabyte a thousand times over. So a change to one
//! task ([`StateStore::update_task_together`]) is appended here, one line a task record:
//!
//! ```text
//! {"journal":3,"at":"2026-12-03T10:00:00.000000000Z","task":{…the task's whole record…}}
//! ```
//!
//! 1. A line belongs to the manifest whose `journal` generation it names; any other line is
//!    from before that manifest was written whole, and is already in it.
//! 2. Reading a manifest (`StateStore::read_manifest`) applies its generation's lines in
//!    order: each replaces its task's record and moves `updated_at`. A last line without its
//!    newline is an append still under way (or cut by a crash): it is left out.
//! 3. A whole write (a change to the run, to several tasks, a journal grown as large as the
//!    manifest, the run's end) folds everything in, takes the next generation (none once the
//!    run ended), and then empties the journal (truncates it; removes it once the run ended):
//!    a crash between the two leaves lines of an older generation, which readers skip.
//! 4. Appends happen under the workspace's lock, each one `write` and `fdatasync`, and only by
//!    a store that remembers the manifest as the files now hold it; any other writer writes
//!    the manifest whole.

use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt as _;

use camino::Utf8PathBuf;
use serde::{Deserialize, Serialize};

use super::{StateError, StateStore};
use crate::fsutil::{FileError, open_append_nofollow, read_nofollow};
use crate::ids::{RunId, TaskId};
use crate::model::{RunManifest, TaskRecord, Timestamp};

/// The run's task journal, relative to its directory.
pub(super) const JOURNAL_FILE: &str = "changes.jsonl";

/// One line of the journal, as written.
#[derive(Serialize)]
struct EntryOut<'a> {
    journal: u64,
    at: Timestamp,
    task: &'a TaskRecord,
}

/// One line of the journal, as read.
#[derive(Deserialize)]
struct EntryIn {
    journal: u64,
    at: Timestamp,
    task: TaskRecord,
}

impl StateStore {
    /// The run's `changes.jsonl`.
    pub(super) fn journal_path(&self, run_id: &RunId) -> Utf8PathBuf {
        self.run_dir(run_id).join(JOURNAL_FILE)
    }

    /// Appends the records of `tasks` (as `manifest` holds them, changed `at`) to the journal
    /// of the manifest's generation. The caller holds the lock; `manifest.journal` is set.
    pub(super) fn append_journal(
        &self,
        manifest: &RunManifest,
        tasks: &[TaskId],
        at: Timestamp,
    ) -> Result<(), StateError> {
        let path = self.journal_path(&manifest.run_id);
        let journal = manifest
            .journal
            .expect("appended only to a journaled manifest");
        let mut lines = Vec::new();
        for task in tasks {
            let Some(record) = manifest.task(task) else {
                continue;
            };
            let entry = EntryOut {
                journal,
                at,
                task: record,
            };
            serde_json::to_writer(&mut lines, &entry).map_err(|source| StateError::Serialize {
                path: path.clone(),
                source,
            })?;
            lines.push(b'\n');
        }
        let write_error = |source| StateError::Write {
            path: path.clone(),
            source,
        };
        let mut file = open_append_nofollow(&path).map_err(write_error)?;
        file.write_all(&lines)
            .and_then(|()| file.sync_data())
            .map_err(|source| {
                write_error(FileError::Write {
                    path: path.clone(),
                    source,
                })
            })
    }

    /// Applies the journal lines of `manifest`'s generation to it, in order.
    pub(super) fn replay_journal(&self, manifest: &mut RunManifest) -> Result<(), StateError> {
        let Some(journal) = manifest.journal else {
            return Ok(());
        };
        let path = self.journal_path(&manifest.run_id);
        let bytes = match read_nofollow(&path) {
            Ok(bytes) => bytes,
            Err(FileError::Read { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
                return Ok(());
            }
            Err(source) => return Err(StateError::Read { path, source }),
        };
        // What follows the last newline is an append under way: not yet a change.
        let complete = match bytes.iter().rposition(|&byte| byte == b'\n') {
            Some(end) => &bytes[..=end],
            None => return Ok(()),
        };
        for line in complete.split(|&byte| byte == b'\n') {
            if line.is_empty() {
                continue;
            }
            let entry: EntryIn =
                serde_json::from_slice(line).map_err(|source| StateError::Corrupt {
                    path: path.clone(),
                    source,
                })?;
            if entry.journal != journal {
                continue;
            }
            if let Some(record) = manifest
                .tasks
                .iter_mut()
                .find(|record| record.id == entry.task.id)
            {
                *record = entry.task;
                manifest.updated_at = entry.at;
            }
        }
        Ok(())
    }

    /// Empties the journal after the manifest was written whole: truncated while the run
    /// runs (its next change appends to the same file: no file is made and deleted at each
    /// whole write, which on some file systems slows every file made after), removed once it
    /// ended. Best effort: lines left behind name an older generation, which readers skip.
    pub(super) fn empty_journal(&self, run_id: &RunId, running: bool) {
        let path = self.journal_path(run_id);
        if running {
            // Only a journal that is there: none is made here; a link or a FIFO planted in
            // its place is not followed or waited on.
            let flags = rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::NONBLOCK;
            // Emptying it is tidiness: readers skip lines of another generation (see the module
            // doc).
            let _ = std::fs::OpenOptions::new()
                .write(true)
                .truncate(true)
                .custom_flags(flags.bits() as i32)
                .open(&path);
        } else {
            // As above: a journal left behind holds lines of a finished run, which readers skip.
            let _ = std::fs::remove_file(path);
        }
    }
}
