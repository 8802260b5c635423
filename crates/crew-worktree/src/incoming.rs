//! Work that comes back from a workspace on another machine, checked before it lands on the
//! task's branch (ARCHITECTURE.md, "Workspaces"; docs/distributed.md).
//!
//! The side that holds the work ([`pack_work`]) writes the commits from the run's base to the
//! task's tip as a git pack and says what they are: a [`WorkClaim`] of base, tip and the tip's
//! tree. The side that receives it ([`accept_work`]) trusts neither the pack nor the claim —
//! the agent that made the commits is untrusted, and so is the way they travelled:
//!
//! 1. the pack is indexed into the repository's object store (objects only: no ref moves);
//! 2. a quarantine ref names the tip, so that whatever happens next, the objects stay reachable
//!    and the user can look at them;
//! 3. the tip must be a commit that descends from the base, and its tree must be the claimed
//!    one;
//! 4. every commit from the base to the tip must be whole: each object it changes from its
//!    first parent is present, and no path it names is one git refuses (`.git`, `.`, `..`,
//!    an empty name) — what a checkout of it would otherwise write;
//! 5. only then does the task's branch move to the tip, and only from where it was expected to
//!    be (created when it was expected not to exist); the quarantine ref is deleted last.
//!
//! A refusal changes no branch and keeps the quarantine ref, which the error names.

use crew_core::provider::ProviderError;
use std::io::Write;

use camino::Utf8Path;
use git2::{Delta, DiffOptions, Oid, Repository, Sort};

use crate::create::repo_lock;

pub use crew_core::shim::WorkClaim;

/// Where received work goes.
#[derive(Debug, Clone)]
pub struct AcceptWork<'a> {
    /// The receiving repository's top level.
    pub repo_root: &'a Utf8Path,
    /// What the sender said it sent.
    pub claim: &'a WorkClaim,
    /// The pack, as a file.
    pub pack: &'a Utf8Path,
    /// The task's branch, e.g. `crew/<run>-<task>`.
    pub branch: &'a str,
    /// Where the branch must be for it to move: `None` when it must not exist yet.
    pub branch_expected_at: Option<&'a str>,
    /// The ref that holds the tip while it is checked, and after a refusal, e.g.
    /// `refs/crew/incoming/<run>-<task>`.
    pub quarantine: &'a str,
}

/// Work that landed on its branch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accepted {
    /// The branch's tip now.
    pub tip: String,
    /// Commits from the base to the tip.
    pub commits: usize,
}

/// Work that could not be sent or was refused. A refusal moved no branch.
#[derive(Debug, thiserror::Error)]
pub enum IncomingError {
    /// git failed on something that is not the work's fault.
    #[error("failed to {what} in {repo}")]
    Git {
        /// The repository.
        repo: String,
        /// What crew was doing.
        what: &'static str,
        /// What git said.
        #[source]
        source: git2::Error,
    },
    /// An id in the claim is not an object id.
    #[error("the claim's {field} `{value}` is not an object id")]
    BadId {
        /// `base`, `tip` or `tree`.
        field: &'static str,
        /// What it said.
        value: String,
    },
    /// The pack is not a pack git can read.
    #[error("the work's pack could not be read; it is kept at {quarantine} if any of it arrived")]
    BadPack {
        /// The quarantine ref.
        quarantine: String,
        /// What git said.
        #[source]
        source: git2::Error,
    },
    /// The work does not hold the commit it claims as its tip.
    #[error("the work's tip {tip} is not a commit it holds")]
    NoTip {
        /// The claimed tip.
        tip: String,
    },
    /// The tip does not descend from the run's base.
    #[error(
        "the work's tip {tip} does not start from the run's base {base}; it is kept at {quarantine}"
    )]
    NotFromBase {
        /// The tip.
        tip: String,
        /// The run's base.
        base: String,
        /// The quarantine ref.
        quarantine: String,
    },
    /// The tip's tree is not the one the sender reported.
    #[error(
        "the work's tree is {found}, not the {claimed} its sender reported; it is kept at {quarantine}"
    )]
    TreeMismatch {
        /// The tree the claim names.
        claimed: String,
        /// The tip's tree.
        found: String,
        /// The quarantine ref.
        quarantine: String,
    },
    /// A commit of the work names an object the pack did not bring.
    #[error(
        "commit {commit} of the work names {path} ({object}), which is missing; it is kept at {quarantine}"
    )]
    Incomplete {
        /// The commit.
        commit: String,
        /// The path.
        path: String,
        /// The missing object.
        object: String,
        /// The quarantine ref.
        quarantine: String,
    },
    /// A commit of the work names a path git refuses to write.
    #[error(
        "commit {commit} of the work names the path {path:?}, which git never writes; it is kept at {quarantine}"
    )]
    UnsafePath {
        /// The commit.
        commit: String,
        /// The path.
        path: String,
        /// The quarantine ref.
        quarantine: String,
    },
    /// The task's branch is not where it was expected.
    #[error("{branch} is at {found}, not {expected}; the work is kept at {quarantine}")]
    BranchMoved {
        /// The branch.
        branch: String,
        /// Where it was expected (`nothing` when it was not to exist).
        expected: String,
        /// Where it is (`nothing` when it does not exist).
        found: String,
        /// The quarantine ref.
        quarantine: String,
    },
    /// The pack file could not be read or written.
    #[error("failed to {what} {path}")]
    File {
        /// The pack file.
        path: String,
        /// Reading or writing.
        what: &'static str,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// Writes the commits from `base` to the tip of `branch` in the repository at `repo_root` as a
/// pack to `out`, and says what they are.
pub fn pack_work(
    repo_root: &Utf8Path,
    base: &str,
    branch: &str,
    out: &mut dyn Write,
) -> Result<WorkClaim, IncomingError> {
    let repo = open(repo_root)?;
    let git = |what| git_failed(repo_root, what);
    let base = parse_id("base", base)?;
    let tip = repo
        .revparse_single(branch)
        .and_then(|object| object.peel_to_commit())
        .map_err(git("read the task's branch"))?;
    write_pack(&repo, tip.id(), Some(base), out).map_err(git("pack the work"))?;
    Ok(WorkClaim {
        base: base.to_string(),
        tip: tip.id().to_string(),
        tree: tip.tree_id().to_string(),
    })
}

/// Writes the whole history of `commit` in the repository at `repo_root` as a pack to `out`:
/// what a clone that lacks the commit needs to start from it.
pub fn pack_history(
    repo_root: &Utf8Path,
    commit: &str,
    out: &mut dyn Write,
) -> Result<(), IncomingError> {
    let repo = open(repo_root)?;
    let git = |what| git_failed(repo_root, what);
    let commit = parse_id("base", commit)?;
    write_pack(&repo, commit, None, out).map_err(git("pack the base's history"))
}

/// A clone of crew's own at `dir` (made, with nothing checked out, when missing): where a shim
/// keeps one project's history and workspaces.
pub fn open_clone(dir: &Utf8Path) -> Result<(), IncomingError> {
    let git = |source| IncomingError::Git {
        repo: dir.to_string(),
        what: "make the clone",
        source,
    };
    // Two shims may start on one project at once (a run's placed tasks): one makes it, and
    // the other waits rather than open a repository half made.
    let _lock = clone_lock(dir)?;
    if dir.join(".git").exists() {
        return open(dir).map(|_| ());
    }
    std::fs::create_dir_all(dir).map_err(|source| IncomingError::File {
        path: dir.to_string(),
        what: "make",
        source,
    })?;
    let mut options = git2::RepositoryInitOptions::new();
    options.initial_head("main");
    Repository::init_opts(dir, &options)
        .map(|_| ())
        .map_err(git)
}

/// The lock of a shim's clone at `dir`, beside it: taken while the clone is made and while
/// history arrives in it.
fn clone_lock(dir: &Utf8Path) -> Result<crew_core::fsutil::FileLock, IncomingError> {
    crew_core::fsutil::FileLock::acquire(
        &dir.with_extension("lock"),
        std::time::Duration::from_secs(120),
    )
    .map_err(|error| IncomingError::Git {
        repo: dir.to_string(),
        what: "lock the clone",
        source: git2::Error::from_str(&error.to_string()),
    })
}

/// The commit `branch` points to in the repository at `repo_root`, if it exists.
pub fn branch_tip(repo_root: &Utf8Path, branch: &str) -> Option<String> {
    open(repo_root)
        .ok()?
        .refname_to_id(&format!("refs/heads/{branch}"))
        .ok()
        .map(|id| id.to_string())
}

/// Whether the repository at `repo_root` holds `commit`.
pub fn has_commit(repo_root: &Utf8Path, commit: &str) -> Result<bool, IncomingError> {
    let repo = open(repo_root)?;
    let id = parse_id("base", commit)?;
    Ok(repo.find_commit(id).is_ok())
}

/// Takes in the history of a base commit from `pack` (written by [`pack_history`] on the
/// other side) and names it with `refs/crew/bases/<commit>`, so that it stays.
pub fn import_base(
    repo_root: &Utf8Path,
    pack: &Utf8Path,
    commit: &str,
) -> Result<(), IncomingError> {
    let repo = open(repo_root)?;
    let id = parse_id("base", commit)?;
    let name = format!("refs/crew/bases/{id}");
    // One at a time per clone: two shims of a run receive the same history at once, and the
    // second finds the commit there.
    let _lock = clone_lock(repo_root)?;
    if repo.find_commit(id).is_ok() && repo.refname_to_id(&name).is_ok() {
        return Ok(());
    }
    write_objects(&repo, repo_root, pack, &name)?;
    if repo.find_commit(id).is_err() {
        return Err(IncomingError::NoTip {
            tip: commit.to_owned(),
        });
    }
    match repo.reference(&name, id, true, "crew: base received") {
        Ok(_) => Ok(()),
        // Another shim of the project named it at the same moment.
        Err(_) if repo.refname_to_id(&name).ok() == Some(id) => Ok(()),
        Err(source) => Err(IncomingError::Git {
            repo: repo_root.to_string(),
            what: "name the base",
            source,
        }),
    }
}

/// Writes the commits reachable from `tip` (and not from `hide`) as a pack to `out`.
fn write_pack(
    repo: &Repository,
    tip: Oid,
    hide: Option<Oid>,
    out: &mut dyn Write,
) -> Result<(), git2::Error> {
    let mut walk = repo.revwalk()?;
    walk.push(tip)?;
    if let Some(hide) = hide {
        walk.hide(hide)?;
    }
    let mut builder = repo.packbuilder()?;
    builder.insert_walk(&mut walk)?;
    let mut written = Ok(());
    builder.foreach(|chunk| {
        written = out.write_all(chunk);
        written.is_ok()
    })?;
    written.map_err(|error| git2::Error::from_str(&format!("writing the pack: {error}")))
}

/// Streams `pack` into the object store of `repo` (no ref moves); a pack git cannot read is
/// [`IncomingError::BadPack`], naming `quarantine`.
fn write_objects(
    repo: &Repository,
    repo_root: &Utf8Path,
    pack: &Utf8Path,
    quarantine: &str,
) -> Result<(), IncomingError> {
    // Streamed, never held whole: a task's work may be large.
    let mut file = std::fs::File::open(pack).map_err(|source| IncomingError::File {
        path: pack.to_string(),
        what: "read",
        source,
    })?;
    let git = |what| git_failed(repo_root, what);
    let odb = repo.odb().map_err(git("open the object store"))?;
    let mut writer = odb.packwriter().map_err(git("open the object store"))?;
    std::io::copy(&mut file, &mut writer)
        .map(|_| ())
        .map_err(|error| git2::Error::from_str(&error.to_string()))
        .and_then(|()| writer.commit().map(|_| ()))
        .map_err(|source| IncomingError::BadPack {
            quarantine: quarantine.to_owned(),
            source,
        })
}

/// Takes in work another repository sent (see the module documentation for the steps).
pub fn accept_work(request: &AcceptWork<'_>) -> Result<Accepted, IncomingError> {
    let repo = open(request.repo_root)?;
    let git = |what| git_failed(request.repo_root, what);
    let claim = request.claim;
    let base = parse_id("base", &claim.base)?;
    let tip = parse_id("tip", &claim.tip)?;
    let tree = parse_id("tree", &claim.tree)?;
    let quarantine = request.quarantine.to_owned();

    // 1. The objects, and nothing else.
    write_objects(&repo, request.repo_root, request.pack, &quarantine)?;

    // 2. The tip, held where the user can find it.
    let tip_commit = repo.find_commit(tip).map_err(|_| IncomingError::NoTip {
        tip: claim.tip.clone(),
    })?;
    repo.reference(&quarantine, tip, true, "crew: work received")
        .map_err(git("hold the work in its quarantine ref"))?;

    // 3. From the base, with the claimed tree.
    if tip != base
        && !repo
            .graph_descendant_of(tip, base)
            .map_err(git("compare the work with the base"))?
    {
        return Err(IncomingError::NotFromBase {
            tip: claim.tip.clone(),
            base: claim.base.clone(),
            quarantine,
        });
    }
    if tip_commit.tree_id() != tree {
        return Err(IncomingError::TreeMismatch {
            claimed: claim.tree.clone(),
            found: tip_commit.tree_id().to_string(),
            quarantine,
        });
    }

    // 4. Every commit whole and safe to write.
    let commits = check_commits(&repo, base, tip, &quarantine)?;

    // 5. The branch, from where it was expected.
    let _lock =
        repo_lock(&crate::leader::common_dir(&repo)).map_err(|error| IncomingError::Git {
            repo: request.repo_root.to_string(),
            what: "lock the repository's worktrees",
            source: git2::Error::from_str(&error.to_string()),
        })?;
    let name = format!("refs/heads/{}", request.branch);
    let found = repo.refname_to_id(&name).ok();
    let expected = request
        .branch_expected_at
        .map(|id| parse_id("branch tip", id))
        .transpose()?;
    if found != expected {
        let show = |id: Option<Oid>| id.map_or_else(|| "nothing".to_owned(), |id| id.to_string());
        return Err(IncomingError::BranchMoved {
            branch: request.branch.to_owned(),
            expected: show(expected),
            found: show(found),
            quarantine,
        });
    }
    let message = "crew: work received and checked";
    match expected {
        Some(expected) => repo
            .reference_matching(&name, tip, true, expected, message)
            .map(|_| ()),
        None => repo.reference(&name, tip, false, message).map(|_| ()),
    }
    .map_err(git("move the task's branch"))?;
    if let Ok(mut held) = repo.find_reference(&quarantine) {
        // The branch holds the work now: the quarantine ref only named it meanwhile, and one
        // left behind is harmless (it names a commit the branch holds).
        let _ = held.delete();
    }
    Ok(Accepted {
        tip: claim.tip.clone(),
        commits,
    })
}

/// Checks each commit from `base` (exclusive) to `tip` against its first parent: every object
/// it adds or changes is present, and no path it names is one git refuses. Returns how many
/// commits there are.
fn check_commits(
    repo: &Repository,
    base: Oid,
    tip: Oid,
    quarantine: &str,
) -> Result<usize, IncomingError> {
    let git = |what| {
        move |source| IncomingError::Git {
            repo: repo.path().display().to_string(),
            what,
            source,
        }
    };
    let odb = repo.odb().map_err(git("open the object store"))?;
    let mut walk = repo.revwalk().map_err(git("walk the work's commits"))?;
    walk.set_sorting(Sort::TOPOLOGICAL | Sort::REVERSE)
        .map_err(git("walk the work's commits"))?;
    walk.push(tip).map_err(git("walk the work's commits"))?;
    walk.hide(base).map_err(git("walk the work's commits"))?;
    let mut count = 0;
    for id in walk {
        let id = id.map_err(git("walk the work's commits"))?;
        let incomplete = |path: String, object: Oid| IncomingError::Incomplete {
            commit: id.to_string(),
            path,
            object: object.to_string(),
            quarantine: quarantine.to_owned(),
        };
        let commit = repo
            .find_commit(id)
            .map_err(|_| incomplete("(the commit itself)".to_owned(), id))?;
        let tree = commit
            .tree()
            .map_err(|_| incomplete("(its root tree)".to_owned(), commit.tree_id()))?;
        let parent = commit
            .parents()
            .next()
            .map(|parent| parent.tree())
            .transpose();
        let parent = parent.map_err(git("read a parent of the work's commits"))?;
        let mut options = DiffOptions::new();
        options.include_typechange(true);
        let diff = repo
            .diff_tree_to_tree(parent.as_ref(), Some(&tree), Some(&mut options))
            .map_err(|source| match source.code() {
                git2::ErrorCode::NotFound => incomplete("(a directory)".to_owned(), tree.id()),
                _ => git("compare the work's commits")(source),
            })?;
        for delta in diff.deltas() {
            if delta.status() == Delta::Deleted {
                continue;
            }
            let file = delta.new_file();
            let path = file
                .path_bytes()
                .map(|bytes| String::from_utf8_lossy(bytes).into_owned())
                .unwrap_or_default();
            if !safe_path(&path) {
                return Err(IncomingError::UnsafePath {
                    commit: id.to_string(),
                    path,
                    quarantine: quarantine.to_owned(),
                });
            }
            // A submodule's commit lives in another repository: nothing to find here.
            let submodule = file.mode() == git2::FileMode::Commit;
            if !submodule && !odb.exists(file.id()) {
                return Err(incomplete(path, file.id()));
            }
        }
        count += 1;
    }
    Ok(count)
}

/// Whether git would write `path` (slash-separated, relative): no empty component, no `.` or
/// `..`, no `.git` in any spelling a case-insensitive file system folds to it.
fn safe_path(path: &str) -> bool {
    !path.is_empty()
        && path.split('/').all(|part| {
            !part.is_empty()
                && part != "."
                && part != ".."
                && !part.eq_ignore_ascii_case(".git")
                && !part.contains('\\')
        })
}

/// What makes a git failure in `repo` doing `what` an [`IncomingError`].
fn git_failed(repo: &Utf8Path, what: &'static str) -> impl Fn(git2::Error) -> IncomingError {
    let repo = repo.to_string();
    move |source| IncomingError::Git {
        repo: repo.clone(),
        what,
        source,
    }
}

fn open(repo_root: &Utf8Path) -> Result<Repository, IncomingError> {
    Repository::open(repo_root).map_err(|source| IncomingError::Git {
        repo: repo_root.to_string(),
        what: "open the repository",
        source,
    })
}

fn parse_id(field: &'static str, value: &str) -> Result<Oid, IncomingError> {
    let bad = || IncomingError::BadId {
        field,
        value: value.to_owned(),
    };
    if value.len() != 40 {
        return Err(bad());
    }
    Oid::from_str(value).map_err(|_| bad())
}

/// The git side of a shim's clones, for `crew_core::shim::CloneStore`.
#[derive(Debug, Clone, Copy, Default)]
pub struct GitClones;

impl crew_core::shim::CloneStore for GitClones {
    fn open_clone(&self, dir: &Utf8Path) -> Result<(), ProviderError> {
        open_clone(dir).map_err(Into::into)
    }

    fn has_commit(&self, repo: &Utf8Path, commit: &str) -> Result<bool, ProviderError> {
        has_commit(repo, commit).map_err(Into::into)
    }

    fn import_base(
        &self,
        repo: &Utf8Path,
        pack: &Utf8Path,
        commit: &str,
    ) -> Result<(), ProviderError> {
        import_base(repo, pack, commit).map_err(Into::into)
    }

    fn pack_work(
        &self,
        repo: &Utf8Path,
        base: &str,
        branch: &str,
        out: &mut dyn Write,
    ) -> Result<WorkClaim, ProviderError> {
        pack_work(repo, base, branch, out).map_err(Into::into)
    }

    fn branch_tip(&self, repo: &Utf8Path, branch: &str) -> Option<String> {
        branch_tip(repo, branch)
    }

    fn drop_branch(&self, repo: &Utf8Path, branch: &str, tip: &str) -> Result<(), ProviderError> {
        match crate::inspect::drop_branch(repo, branch, tip) {
            crate::inspect::BranchDrop::Deleted | crate::inspect::BranchDrop::Missing => Ok(()),
            crate::inspect::BranchDrop::Moved { tip } => {
                Err(format!("it moved on to {tip}, so it holds more than the work sent").into())
            }
            crate::inspect::BranchDrop::Refused { message } => Err(message.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::safe_path;

    #[test]
    fn paths_git_refuses_are_unsafe() {
        for path in ["src/main.rs", "a", ".github/workflows/ci.yml", ".gitignore"] {
            assert!(safe_path(path), "{path}");
        }
        for path in [
            "",
            ".git/hooks/post-checkout",
            "x/.GIT/config",
            "a//b",
            "../up",
            "a/./b",
            "a\\b",
        ] {
            assert!(!safe_path(path), "{path}");
        }
    }
}
