//! The state a worktree's `setup` command (and crew's copies) left before the agent started:
//! the task's baseline.
//!
//! Right after setup, every path git would commit (untracked, changed or deleted) is recorded
//! with the id of its content then, and every ignored path by name. At teardown a path still as
//! setup left it is not the agent's work: it is neither committed nor counted. A path the agent
//! changed afterwards is its work like any other. The record lives in the run's state, where
//! an agent cannot write.

use camino::{Utf8Path, Utf8PathBuf};
use git2::{ObjectType, Oid, Repository, StatusOptions};
use serde::{Deserialize, Serialize};

/// What setup left in a worktree.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetupBaseline {
    /// Paths git would commit, with the blob id of their content (`None`: setup deleted it).
    pub changed: Vec<SetupPath>,
    /// Ignored paths, as git's status names them (a directory once, with a trailing `/`).
    pub ignored: Vec<String>,
}

/// One path setup made, changed or deleted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetupPath {
    /// The path, relative to the worktree root.
    pub path: String,
    /// Its blob id after setup; `None` when setup deleted it.
    pub blob: Option<String>,
}

impl SetupBaseline {
    /// Reads what setup left in the worktree at `root`; crew's own `links` are not setup's.
    pub fn take(root: &Utf8Path, links: &[String]) -> Result<Self, git2::Error> {
        let repo = Repository::open(root)?;
        let mut options = StatusOptions::new();
        options
            .include_untracked(true)
            .recurse_untracked_dirs(true)
            .include_ignored(true)
            .recurse_ignored_dirs(false)
            .exclude_submodules(true);
        let mut baseline = SetupBaseline::default();
        for entry in repo.statuses(Some(&mut options))?.iter() {
            let path = String::from_utf8_lossy(entry.path_bytes()).into_owned();
            if crate::teardown::is_link_path(links, &path) {
                continue;
            }
            if entry.status().is_ignored() {
                baseline.ignored.push(path);
            } else if !entry.status().is_empty() {
                let blob = content_id(&root.join(&path)).map(|oid| oid.to_string());
                baseline.changed.push(SetupPath { path, blob });
            }
        }
        Ok(baseline)
    }

    /// The recorded baseline in `file`; empty when there is none (no setup ran).
    pub fn load(file: &Utf8Path) -> Self {
        crew_core::fsutil::read_nofollow(file)
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .unwrap_or_default()
    }

    /// Writes the baseline to `file`, atomically.
    pub fn save(&self, file: &Utf8Path) -> Result<(), crew_core::fsutil::FileError> {
        let json = serde_json::to_vec_pretty(self).expect("a baseline serializes");
        crew_core::fsutil::write_atomic(file, &json)
    }

    /// The paths of the worktree at `root` that are still exactly as setup left them.
    pub fn untouched(&self, root: &Utf8Path) -> Vec<String> {
        self.changed
            .iter()
            .filter(|entry| {
                let now = content_id(&root.join(&entry.path)).map(|oid| oid.to_string());
                now == entry.blob
            })
            .map(|entry| entry.path.clone())
            .collect()
    }

    /// Whether an ignored path of the worktree is one setup made.
    pub fn made_ignored(&self, path: &str) -> bool {
        self.ignored
            .iter()
            .any(|ignored| ignored.trim_end_matches('/') == path.trim_end_matches('/'))
    }
}

/// Where a task's baseline is kept: `<task state dir>/setup-baseline.json`.
pub fn file_in(task_dir: &Utf8Path) -> Utf8PathBuf {
    task_dir.join("setup-baseline.json")
}

/// The blob id git would give the file or symlink at `path`; `None` when there is nothing
/// there (or a directory).
fn content_id(path: &Utf8Path) -> Option<Oid> {
    let metadata = std::fs::symlink_metadata(path).ok()?;
    if metadata.file_type().is_symlink() {
        let target = std::fs::read_link(path).ok()?;
        let bytes = target.as_os_str().as_encoded_bytes();
        return Oid::hash_object(ObjectType::Blob, bytes).ok();
    }
    if !metadata.is_file() {
        return None;
    }
    // The mode is part of what git records: an executable bit setup set is setup's too.
    let executable = std::os::unix::fs::PermissionsExt::mode(&metadata.permissions()) & 0o111;
    let content = Oid::hash_file(ObjectType::Blob, path).ok()?;
    if executable == 0 {
        Some(content)
    } else {
        // Fold the bit into the id: a file setup left plain and the agent made executable
        // (or the other way round) has changed.
        Oid::hash_object(ObjectType::Blob, format!("{content}+x").as_bytes()).ok()
    }
}
