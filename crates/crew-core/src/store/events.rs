//! A run's event log (appended, one JSON line per event, and read from an offset) and the
//! record of which of its tasks a person has seen.

use std::collections::BTreeSet;
use std::io::{self, Write};

use super::{SEEN_FILE, StateError, StateStore};
use crate::fsutil::{FileError, open_append_nofollow, open_nofollow, read_nofollow};
use crate::ids::{RunId, TaskId};
use crate::model::RunEvent;

impl StateStore {
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

    /// Records that someone looked at the outcome of `tasks` of `run_id` (see `SEEN_FILE`).
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
}
