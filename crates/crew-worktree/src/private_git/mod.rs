//! A `single` task's private view of the repository's git directory (ARCHITECTURE.md, "Agents
//! are untrusted").
//!
//! A `single` task works in the project itself, so its git directory is the user's: a commit
//! needs to write objects and refs there, and the kernel's sandbox grants directories, not
//! files, so granting what a commit needs would grant the agent the user's whole history. So
//! the agent never writes it. Where the kernel lets it, the agent's own namespace lays an
//! overlay over the common git directory: the agent reads the repository as it is, and every
//! change it makes (objects, refs, reflogs, `HEAD`, the index, a planted hook in a submodule)
//! goes to an upper layer beneath the task's state, `<task>/git/upper`. Deleting packs,
//! rewriting an object, moving another branch or another task's saved work, expiring reflogs,
//! `git gc --prune=now`: all of it happens in the agent's view only.
//!
//! When the task ends, crew takes from that layer what is the agent's to give
//! ([`PrivateGit::take`]):
//!
//! - the branch the checkout was on when the task started, moved to where the agent left it,
//!   when that only adds to it (a fast-forward of where the branch is now); when the branch
//!   moved another way meanwhile, the agent's commits go on a branch of their own
//!   (`crew/<run>-<task>`) and the task says so;
//! - refs the agent made that the repository does not have (its branches, tags, a stash; none
//!   under crew's prefix, where task branches are);
//! - `HEAD`, when the agent switched the checkout and the user did not meanwhile; and the
//!   index, when the user's did not change meanwhile;
//! - the objects those need, each written into the repository by its content (one that does
//!   not hash to its name is refused), and only those: objects the repository has are never
//!   read from the layer;
//! - each submodule's branch, the same way.
//!
//! Anything else the agent changed there (another ref moved or deleted, a config, a hook, an
//! admin entry of another worktree) never reached the repository: each is a security finding,
//! its version kept as evidence. Then the layer goes.
//!
//! Where the kernel cannot lay the overlay (no unprivileged user namespaces, or the sandbox off),
//! the layer stays empty and the agent writes the git directory itself; the tripwire and the
//! read-only mounts (where there are namespaces) are what holds there.

use crate::private_git::spares::open_spares;
use crate::private_git::spares::untouched;
use std::collections::HashSet;
use std::io::Write as _;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt as _};

use camino::{Utf8Path, Utf8PathBuf};
use crew_core::fsutil::{read_nofollow, write_atomic};
use crew_core::paths::remove_contained;
use crew_core::provider::{PrivateView, SecurityFinding};
use git2::{Oid, Repository};
use serde::{Deserialize, Serialize};

use crate::agent_git::{TakeError, copy_missing};

mod layer;
mod spares;

pub use spares::{holds_changes, recycle_view, remove_view, spares_dir};

use layer::{Layer, View, layer_entries};

/// Beneath the task's state directory: the view's layer, scratch and start record.
const DIR: &str = "git";

/// A spare view's former start record, beside where the next one goes: no record of where any
/// task started (see [`recycle_view`]).
const SPARE_START: &str = "start.spare";

/// A `single` task's private view of the common git directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrivateGit {
    /// The repository's common git directory.
    common: Utf8PathBuf,
    /// The checkout's own git directory, relative to `common` (empty for the main checkout;
    /// `worktrees/<name>` for a linked one).
    own: Utf8PathBuf,
    /// `<task state>/git`.
    dir: Utf8PathBuf,
}

/// Where the checkout stood when the task started, as crew recorded it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Start {
    /// Its `HEAD` as written (`ref: refs/heads/main`, or a commit id).
    head: String,
    /// Its index, as a file: the user's staging is theirs if this changed.
    index: Option<FileStamp>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct FileStamp {
    inode: u64,
    size: u64,
    modified_ns: i64,
}

impl FileStamp {
    fn of(path: &Utf8Path) -> Option<Self> {
        let metadata = std::fs::symlink_metadata(path).ok()?;
        metadata.is_file().then(|| FileStamp {
            inode: metadata.ino(),
            size: metadata.size(),
            modified_ns: metadata
                .mtime()
                .saturating_mul(1_000_000_000)
                .saturating_add(metadata.mtime_nsec()),
        })
    }
}

/// What taking the agent's changes did.
#[derive(Debug, Default)]
pub struct Taken {
    /// What the agent changed that never reached the repository.
    pub findings: Vec<SecurityFinding>,
    /// What could not be taken as it was, and where it went instead.
    pub warnings: Vec<String>,
    /// The branch the agent's commits went to when the checkout's branch moved meanwhile.
    pub rescue_branch: Option<String>,
}

/// Files git writes in a git directory for a command's own use (merges, rebases, messages):
/// the agent's, and nothing to take.
const TRANSIENT: &[&str] = &[
    "ORIG_HEAD",
    "FETCH_HEAD",
    "MERGE_HEAD",
    "MERGE_MSG",
    "MERGE_MODE",
    "MERGE_RR",
    "MERGE_AUTOSTASH",
    "AUTO_MERGE",
    "CHERRY_PICK_HEAD",
    "REVERT_HEAD",
    "REBASE_HEAD",
    "COMMIT_EDITMSG",
    "TAG_EDITMSG",
    "SQUASH_MSG",
    "NOTES_EDITMSG",
    "EDIT_DESCRIPTION",
    "BISECT_LOG",
    "BISECT_START",
    "BISECT_EXPECTED_REV",
    "BISECT_ANCESTORS_OK",
    "BISECT_NAMES",
    "BISECT_TERMS",
    "BISECT_RUN",
    "gc.log",
    "gc.pid",
    // What `git update-server-info` (run by `git repack`) writes for dumb transports.
    "info/refs",
];
/// Directories of the same kind.
const TRANSIENT_DIRS: &[&str] = &[
    "rebase-merge",
    "rebase-apply",
    "sequencer",
    "rr-cache",
    "lfs",
];

impl PrivateGit {
    /// The view of the repository whose common git directory is `common`, for a checkout whose
    /// own git directory is `git_dir`, kept beneath `task_dir` (the task's state directory).
    pub fn new(common: &Utf8Path, git_dir: &Utf8Path, task_dir: &Utf8Path) -> Self {
        let trim = |path: &Utf8Path| path.as_str().trim_end_matches('/').to_owned();
        let (common_text, git_dir_text) = (trim(common), trim(git_dir));
        let own = git_dir_text
            .strip_prefix(&common_text)
            .map(|rest| rest.trim_start_matches('/'))
            .unwrap_or_default();
        PrivateGit {
            common: Utf8PathBuf::from(common_text.clone()),
            own: Utf8PathBuf::from(own),
            dir: task_dir.join(DIR),
        }
    }

    /// The overlay the sandbox lays for the agent.
    pub fn view(&self) -> PrivateView {
        PrivateView {
            target: self.common.clone(),
            upper: self.upper(),
            work: self.dir.join("work"),
            // Rewritten by the agent's own `git gc` (`info/refs` too), `git branch -d` of a
            // packed branch: its own business in its view, the user's otherwise.
            read_only_without: vec![self.common.join("packed-refs"), self.common.join("info")],
        }
    }

    fn upper(&self) -> Utf8PathBuf {
        self.dir.join("upper")
    }

    fn start_file(&self) -> Utf8PathBuf {
        self.dir.join("start.json")
    }

    /// Makes the view's directories (or takes a spare one from `spares`, see [`recycle_view`])
    /// and records where the checkout stands, unless the task already has a view (taken up
    /// again after its host died: what its agent changed is still to be taken, and where it
    /// started still counts).
    pub fn arm(&self, spares: &Utf8Path) -> std::io::Result<()> {
        if self.start_file().is_file() && self.upper().is_dir() {
            return Ok(());
        }
        let view = self.view();
        if !self.take_spare(spares) {
            std::fs::create_dir_all(&view.upper)?;
            std::fs::create_dir_all(&view.work)?;
        }
        let own = self.common.join(&self.own);
        let head = read_nofollow(&own.join("HEAD")).map_err(std::io::Error::other)?;
        let start = Start {
            head: String::from_utf8_lossy(&head).into_owned(),
            index: FileStamp::of(&own.join("index")),
        };
        let json = serde_json::to_vec(&start).map_err(std::io::Error::other)?;
        // Not synced: lost in a crash, the next arm records where the checkout stands then,
        // which the agent's view never changed. Written over a spare view's former record
        // where it has one, then named: no new file (see `recycle_view`). Over it, not
        // truncated first: a record of about the same size keeps its block, where a truncate
        // frees it and the write takes one again (a discard each time, on a disk mounted so;
        // under load the slowest open of a start).
        let spare = self.dir.join(SPARE_START);
        let rewritten = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
            .open(&spare)
            .and_then(|mut file| {
                file.write_all(&json)?;
                file.set_len(json.len() as u64)
            });
        match rewritten {
            Ok(()) => std::fs::rename(&spare, self.start_file()),
            Err(_) => std::fs::write(self.start_file(), json),
        }
    }

    /// Moves a spare view from `spares` into place, if there is one: an empty layer and the
    /// overlay's scratch directory, which the kernel empties at every mount. Another task's
    /// arm may take the same spare first; a spare that holds anything is not a view to take.
    fn take_spare(&self, spares: &Utf8Path) -> bool {
        let Some(spares) = open_spares(spares, false) else {
            return false;
        };
        let Ok(entries) = rustix::fs::Dir::read_from(&spares) else {
            return false;
        };
        let Some(task_dir) = self.dir.parent() else {
            return false;
        };
        if std::fs::create_dir_all(task_dir).is_err() {
            return false;
        }
        for entry in entries.flatten() {
            // A directory, never a link (taken, its `upper/` would be wherever it led).
            let name = entry.file_name().to_owned();
            if name.as_bytes() == b"." || name.as_bytes() == b".." {
                continue;
            }
            let is_dir = rustix::fs::statat(&spares, &*name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
                .is_ok_and(|stat| {
                    rustix::fs::FileType::from_raw_mode(stat.st_mode)
                        == rustix::fs::FileType::Directory
                });
            if !is_dir
                || rustix::fs::renameat(&spares, &*name, rustix::fs::CWD, self.dir.as_std_path())
                    .is_err()
            {
                continue;
            }
            let work = self.dir.join("work");
            let work_is_dir = std::fs::symlink_metadata(&work)
                .is_ok_and(|metadata| metadata.is_dir() && !metadata.is_symlink());
            if untouched(&self.dir) && work_is_dir && !self.start_file().exists() {
                return true;
            }
            remove_view(task_dir);
        }
        false
    }

    /// Takes from the agent's layer what is its to give (see the module's doc), reports the
    /// rest, keeping each such file in `evidence`, and removes the view. `rescue` is the branch
    /// the agent's commits go to when the checkout's branch moved another way meanwhile;
    /// `crew_prefix` (`refs/heads/crew/`) is where an agent may make no branch.
    pub fn take(
        &self,
        repo: &Repository,
        rescue: &str,
        crew_prefix: &str,
        evidence: &Utf8Path,
    ) -> Result<Taken, TakeError> {
        let mut taken = Taken::default();
        let upper = self.upper();
        if upper.is_dir() {
            let start: Option<Start> = read_nofollow(&self.start_file())
                .ok()
                .and_then(|bytes| serde_json::from_slice(&bytes).ok());
            let scratch = self.dir.join("objects");
            let mut context = Taking {
                rescue,
                crew_prefix,
                evidence,
                scratch: &scratch,
                taken: &mut taken,
            };
            context.git_dir(
                repo,
                &self.common,
                &upper,
                &self.own,
                start.as_ref(),
                Utf8Path::new(""),
            )?;
            for module in module_dirs(&self.common, &upper) {
                let Ok(module_repo) = Repository::open_bare(self.common.join(&module)) else {
                    continue;
                };
                context.git_dir(
                    &module_repo,
                    &self.common.join(&module),
                    &upper.join(&module),
                    Utf8Path::new(""),
                    None,
                    &module,
                )?;
            }
        }
        self.remove();
        Ok(taken)
    }

    /// Removes the view's directories.
    pub fn remove(&self) {
        if let Some(task_dir) = self.dir.parent() {
            remove_view(task_dir);
        }
    }
}

/// The submodules' git directories the agent changed something in (`modules/<name>`, nested
/// ones too), relative to the common git directory: those the repository has.
fn module_dirs(common: &Utf8Path, upper: &Utf8Path) -> Vec<Utf8PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![Utf8PathBuf::from("modules")];
    while let Some(current) = stack.pop() {
        let Ok(entries) = upper.join(&current).read_dir_utf8() else {
            continue;
        };
        for entry in entries.flatten() {
            if !entry.file_type().is_ok_and(|kind| kind.is_dir()) {
                continue;
            }
            let relative = current.join(entry.file_name());
            if common.join(&relative).join("HEAD").is_file() {
                stack.push(relative.join("modules"));
                found.push(relative);
            } else {
                stack.push(relative);
            }
        }
    }
    found
}

/// One teardown's taking, across the common git directory and its submodules'.
struct Taking<'a> {
    rescue: &'a str,
    crew_prefix: &'a str,
    evidence: &'a Utf8Path,
    scratch: &'a Utf8Path,
    taken: &'a mut Taken,
}

impl Taking<'_> {
    /// Takes what it may of one git directory's layer (`upper`, over `real`): `own` is the
    /// checkout's own git directory beneath it, `start` where it stood (the common directory's
    /// only), `shown` its path relative to the common git directory, for what is said.
    fn git_dir(
        &mut self,
        repo: &Repository,
        real: &Utf8Path,
        upper: &Utf8Path,
        own: &Utf8Path,
        start: Option<&Start>,
        shown: &Utf8Path,
    ) -> Result<(), TakeError> {
        let mut reported = Vec::new();
        let mut head = None;
        let mut index = None;
        for (relative, layer) in layer_entries(upper) {
            let within_own = if own.as_str().is_empty() {
                Some(relative.as_path())
            } else {
                relative.strip_prefix(own).ok()
            };
            let first = relative.components().next().map(|part| part.as_str());
            match (first, within_own.map(Utf8Path::as_str)) {
                (_, Some("HEAD")) if layer == Layer::File => head = Some(upper.join(&relative)),
                (_, Some("index")) if layer == Layer::File => index = Some(upper.join(&relative)),
                (_, Some(name)) if is_transient(name) => {}
                (Some("objects" | "logs"), _) | (Some("modules"), _) => {}
                (Some("refs"), _) | (_, Some("packed-refs")) => {}
                _ if relative.as_str().ends_with(".lock") => {}
                _ => reported.push((relative, layer)),
            }
        }

        let branch = start
            .map(|start| start.head.clone())
            .or_else(|| {
                read_nofollow(&real.join(own).join("HEAD"))
                    .ok()
                    .map(|head| String::from_utf8_lossy(&head).into_owned())
            })
            .and_then(|head| head.trim().strip_prefix("ref: ").map(str::to_owned));
        let theirs = self.their_objects(upper)?;
        // Every ref the agent touched, as its view has it against the repository's now: where
        // they differ, the agent changed it (or rewrote its packed refs before the user moved
        // one). What it did not touch is not read: a project's refs may be thousands.
        let view = View::of(real, upper);
        for name in view.touched() {
            let theirs_value = view.value(&name);
            let current = repo
                .find_reference(&name)
                .ok()
                .and_then(|reference| reference.target());
            if theirs_value == current || is_transient(&name) {
                continue;
            }
            let name = &name;
            let relative = Utf8Path::new(name.as_str());
            match (theirs_value, current) {
                (Some(value), _) if Some(name) == branch.as_ref() => {
                    self.move_branch(repo, &theirs, name, current, value, shown);
                }
                // Its own branch, removed in its view: the repository keeps it.
                (None, _) if Some(name) == branch.as_ref() => {}
                (Some(value), None) if !name.starts_with(self.crew_prefix) => {
                    let made = self.bring(repo, &theirs, value, true)
                        && repo
                            .reference(name, value, false, "crew: the agent's ref")
                            .is_ok();
                    if !made {
                        self.report(upper, real, relative, "added");
                    }
                }
                (Some(_), None) => self.report(upper, real, relative, "added"),
                (Some(_), Some(_)) => self.report(upper, real, relative, "modified"),
                (None, _) => self.report(upper, real, relative, "removed"),
            }
        }

        if let (Some(start), Some(head)) = (start, &head) {
            self.switch_head(repo, &theirs, real, own, start, head, shown);
        } else if let Some(head) = head {
            let ours = read_nofollow(&real.join(own).join("HEAD")).ok();
            if read_nofollow(&head).ok() != ours {
                self.taken.warnings.push(format!(
                    "the agent switched {} to another commit or branch; its HEAD stays where it was",
                    described(shown)
                ));
            }
        }
        if let (Some(start), Some(index)) = (start, index) {
            self.take_index(repo, &theirs, real, own, start, &index);
        }
        for (relative, layer) in reported {
            let change = match layer {
                Layer::File if real.join(&relative).exists() => "modified",
                Layer::File => "added",
                Layer::Removed | Layer::Replaced => "removed",
            };
            self.report(upper, real, &relative, change);
        }
        Ok(())
    }

    /// The objects the agent wrote in this layer, as a store of their own: its loose objects
    /// and packs, linked into a scratch directory (what it removed, whiteouts, left out).
    fn their_objects(&self, upper: &Utf8Path) -> Result<git2::Odb<'static>, TakeError> {
        let odb = git2::Odb::new()?;
        let objects = upper.join("objects");
        if !objects.is_dir() {
            return Ok(odb);
        }
        if std::fs::symlink_metadata(self.scratch).is_ok() {
            // Scratch space of this teardown: what is left goes with the task's state.
            let _ = remove_contained(
                self.scratch,
                &[self.scratch.parent().unwrap_or(self.scratch)],
            );
        }
        for (relative, layer) in layer_entries(&objects) {
            let source = objects.join(&relative);
            let is_file = std::fs::symlink_metadata(&source).is_ok_and(|m| m.is_file());
            if layer != Layer::File || !is_file {
                continue;
            }
            let target = self.scratch.join(&relative);
            if let Some(parent) = target.parent() {
                // A directory that cannot be made fails the link or copy below, which is reported.
                let _ = std::fs::create_dir_all(parent);
            }
            if std::fs::hard_link(&source, &target).is_err() {
                // A file neither linked nor copied is missing from the scratch store, and the check
                // of the objects below names it.
                let _ = std::fs::copy(&source, &target);
            }
        }
        std::fs::create_dir_all(self.scratch.join("pack"))
            .map_err(|error| git2::Error::from_str(&format!("{}: {error}", self.scratch)))?;
        odb.add_disk_alternate(self.scratch.as_str())?;
        Ok(odb)
    }

    /// Copies what `tip` needs from the agent's objects; false when it cannot be had whole.
    fn bring(&mut self, repo: &Repository, theirs: &git2::Odb<'_>, tip: Oid, whole: bool) -> bool {
        copy_missing(repo, theirs, vec![tip], whole, &mut HashSet::new()).is_ok()
    }

    /// The checkout's branch, where the agent left it: moved when that only adds to it, else
    /// its commits on a branch of their own.
    fn move_branch(
        &mut self,
        repo: &Repository,
        theirs: &git2::Odb<'_>,
        name: &str,
        current: Option<Oid>,
        value: Oid,
        shown: &Utf8Path,
    ) {
        if current == Some(value) {
            return;
        }
        if !self.bring(repo, theirs, value, true) {
            self.taken.warnings.push(format!(
                "the agent left {name}{} at {value}, which its objects do not hold whole: not taken",
                in_module(shown)
            ));
            return;
        }
        let forward =
            current.is_none_or(|current| repo.graph_descendant_of(value, current).unwrap_or(false));
        if forward {
            let moved = match current {
                Some(current) => {
                    repo.reference_matching(name, value, true, current, "crew: the agent's commits")
                }
                None => repo.reference(name, value, false, "crew: the agent's commits"),
            };
            if moved.is_ok() {
                return;
            }
        }
        let short = name.strip_prefix("refs/heads/").unwrap_or(name);
        let rescue = if shown.as_str().is_empty() {
            self.rescue.to_owned()
        } else {
            format!("{}-{}", self.rescue, shown.as_str().replace('/', "-"))
        };
        if repo
            .reference(
                &format!("refs/heads/{rescue}"),
                value,
                true,
                "crew: the agent's commits",
            )
            .is_ok()
        {
            self.taken.warnings.push(format!(
                "{short}{} moved another way while the agent worked: its commits are on {rescue}",
                in_module(shown)
            ));
            if shown.as_str().is_empty() {
                self.taken.rescue_branch = Some(rescue);
            }
        }
    }

    /// The agent's `HEAD`, when it switched the checkout and nobody else did meanwhile.
    #[allow(clippy::too_many_arguments)]
    fn switch_head(
        &mut self,
        repo: &Repository,
        theirs: &git2::Odb<'_>,
        real: &Utf8Path,
        own: &Utf8Path,
        start: &Start,
        head: &Utf8Path,
        shown: &Utf8Path,
    ) {
        let Ok(theirs_head) = read_nofollow(head) else {
            return;
        };
        let theirs_head = String::from_utf8_lossy(&theirs_head).into_owned();
        if theirs_head == start.head {
            return;
        }
        let path = real.join(own).join("HEAD");
        let ours = read_nofollow(&path)
            .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
            .unwrap_or_default();
        let valid = match theirs_head.trim().strip_prefix("ref: ") {
            Some(name) => name.starts_with("refs/heads/") && repo.find_reference(name).is_ok(),
            None => {
                Oid::from_str(theirs_head.trim()).is_ok_and(|id| self.bring(repo, theirs, id, true))
            }
        };
        if ours == start.head && valid && write_atomic(&path, theirs_head.as_bytes()).is_ok() {
            return;
        }
        self.taken.warnings.push(format!(
            "the agent left {} at `{}`; its HEAD stays at `{}`",
            described(shown),
            theirs_head.trim(),
            ours.trim()
        ));
    }

    /// The agent's index, when the checkout's own did not change meanwhile, with what it stages.
    fn take_index(
        &mut self,
        repo: &Repository,
        theirs: &git2::Odb<'_>,
        real: &Utf8Path,
        own: &Utf8Path,
        start: &Start,
        index: &Utf8Path,
    ) {
        let path = real.join(own).join("index");
        if FileStamp::of(&path) != start.index {
            self.taken.warnings.push(
                "the checkout's index changed while the agent worked: what the agent staged stays in its files, unstaged"
                    .to_owned(),
            );
            return;
        }
        let Ok(staged) = git2::Index::open(index.as_std_path()) else {
            return;
        };
        let ids = staged
            .iter()
            .filter(|entry| entry.mode != 0o160_000)
            .map(|entry| entry.id)
            .collect();
        // Objects that cannot be copied leave the index pointing at objects the repository lacks:
        // the index is then not taken, as the check before the write refuses it.
        let _ = copy_missing(repo, theirs, ids, false, &mut HashSet::new());
        if let Ok(bytes) = read_nofollow(index) {
            // The agent's index kept beside the task is for the user to look at; without it nothing
            // is lost from the repository.
            let _ = write_atomic(&path, &bytes);
        }
    }

    /// A change of the agent's that never reached the repository: reported, and its version
    /// kept in the evidence directory.
    fn report(&mut self, upper: &Utf8Path, real: &Utf8Path, relative: &Utf8Path, change: &str) {
        let source = upper.join(relative);
        let kept = self
            .evidence
            .join(real.join(relative).as_str().trim_start_matches('/'));
        let movable = std::fs::symlink_metadata(&source)
            .is_ok_and(|metadata| metadata.is_file() || metadata.is_symlink());
        let moved = movable
            && kept
                .parent()
                .is_some_and(|parent| std::fs::create_dir_all(parent).is_ok())
            && std::fs::rename(&source, &kept).is_ok();
        let saved = moved.then_some(kept);
        self.taken.findings.push(SecurityFinding {
            path: real.join(relative),
            change: change.to_owned(),
            restored: true,
            saved,
            on_branch: false,
        });
    }
}

fn is_transient(name: &str) -> bool {
    let first = name.split('/').next().unwrap_or(name);
    TRANSIENT.contains(&name)
        || TRANSIENT_DIRS.contains(&first)
        || name.starts_with("refs/bisect/")
        || name.starts_with("refs/worktree/")
        || name.starts_with("logs/")
}

fn described(shown: &Utf8Path) -> String {
    if shown.as_str().is_empty() {
        "the checkout".to_owned()
    } else {
        format!("the submodule's checkout ({shown})")
    }
}

fn in_module(shown: &Utf8Path) -> String {
    if shown.as_str().is_empty() {
        String::new()
    } else {
        format!(" (in {shown})")
    }
}
