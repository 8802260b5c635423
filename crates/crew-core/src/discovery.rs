//! Finding the workspace a command acts on.
//!
//! From the current directory, canonicalized: the nearest ancestor holding `.crew/`, else the
//! top level of the git work tree, else the directory itself. Before that, the nested-worktree
//! guard: a directory inside a git worktree that lives inside its own leader repository (such
//! as `<root>/.worktrees/<run>/<task>/…`) is translated to the same place in the leader, so an
//! agent running `crew` inside its worktree acts on the leader's workspace.

use std::io;
use std::path::Path;

use camino::{Utf8Path, Utf8PathBuf};

use crate::ids::WorkspaceId;
use crate::paths::{WorkspacePathError, canonical_utf8, is_within};

/// The directory crew keeps its configuration and state in, under a workspace root.
pub const CREW_DIR: &str = ".crew";

/// Where a command runs: the workspace root and where inside it the user stood.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workspace {
    id: WorkspaceId,
    /// The canonical directory the command was started from, translated to the leader when it
    /// was inside a nested worktree.
    invoked_from: Utf8PathBuf,
    /// The top level of the git work tree holding the workspace, if any.
    repo_root: Option<Utf8PathBuf>,
}

/// The current directory could not be turned into a workspace.
#[derive(Debug, thiserror::Error)]
pub enum DiscoverWorkspaceError {
    /// A path could not be made canonical (it is missing, or not UTF-8).
    #[error("failed to find the workspace for {path}")]
    Path {
        /// The path as it was given.
        path: String,
        /// Why it could not be resolved.
        #[source]
        source: WorkspacePathError,
    },
    /// A directory on the way up could not be read.
    #[error("failed to inspect {path} while looking for the workspace")]
    Inspect {
        /// The directory.
        path: Utf8PathBuf,
        /// Why it could not be read.
        #[source]
        source: io::Error,
    },
}

impl Workspace {
    /// Discovers the workspace for a command started in `dir`.
    pub fn discover(dir: &Path) -> Result<Self, DiscoverWorkspaceError> {
        let canonical = canonical_utf8(dir).map_err(|source| DiscoverWorkspaceError::Path {
            path: dir.to_string_lossy().into_owned(),
            source,
        })?;
        let invoked_from = leader_location(&canonical)?.unwrap_or(canonical);
        let repo_root = find_ancestor_with(&invoked_from, ".git")?;
        let root = match find_ancestor_with_dir(&invoked_from, CREW_DIR)? {
            Some(root) => root,
            None => repo_root.clone().unwrap_or_else(|| invoked_from.clone()),
        };
        // The repository only counts when it holds the workspace root; a `.crew/` above the
        // repository makes the workspace a plain directory around it.
        let repo_root = repo_root.filter(|repo| is_within(repo, &root));
        Ok(Workspace {
            id: WorkspaceId::from_canonical(root),
            invoked_from,
            repo_root,
        })
    }

    /// A workspace rooted exactly at `root`, without discovery: the library entry point for a
    /// host that already knows its project folder.
    pub fn at_root(root: &Path) -> Result<Self, DiscoverWorkspaceError> {
        let root = canonical_utf8(root).map_err(|source| DiscoverWorkspaceError::Path {
            path: root.to_string_lossy().into_owned(),
            source,
        })?;
        let repo_root = find_ancestor_with(&root, ".git")?;
        Ok(Workspace {
            id: WorkspaceId::from_canonical(root.clone()),
            invoked_from: root,
            repo_root,
        })
    }

    /// The workspace's id: its canonical root.
    pub fn id(&self) -> &WorkspaceId {
        &self.id
    }

    /// The project folder: where `.crew/` is (or would be).
    pub fn root(&self) -> &Utf8Path {
        self.id.as_path()
    }

    /// The canonical directory crew was started in: the root or a directory beneath it.
    pub fn invoked_from(&self) -> &Utf8Path {
        &self.invoked_from
    }

    /// The git repository that holds the root, if there is one.
    pub fn repo_root(&self) -> Option<&Utf8Path> {
        self.repo_root.as_deref()
    }

    /// `<root>/.crew`
    pub fn crew_dir(&self) -> Utf8PathBuf {
        self.root().join(CREW_DIR)
    }

    /// Where the command was started, relative to the repository root (or to the workspace
    /// root outside git): a task started in `<root>/a/b` works in `<workspace>/a/b`.
    pub fn relative_invocation_dir(&self) -> Utf8PathBuf {
        let base = self.repo_root().unwrap_or(self.root());
        self.invoked_from
            .strip_prefix(base)
            .map(Utf8Path::to_owned)
            .unwrap_or_default()
    }
}

/// The nearest ancestor of `dir` (itself included) containing an entry `name` of any type.
fn find_ancestor_with(
    dir: &Utf8Path,
    name: &str,
) -> Result<Option<Utf8PathBuf>, DiscoverWorkspaceError> {
    for ancestor in dir.ancestors() {
        if entry_exists(&ancestor.join(name))? {
            return Ok(Some(ancestor.to_owned()));
        }
    }
    Ok(None)
}

/// The nearest ancestor of `dir` (itself included) with a real directory `name` in it.
fn find_ancestor_with_dir(
    dir: &Utf8Path,
    name: &str,
) -> Result<Option<Utf8PathBuf>, DiscoverWorkspaceError> {
    for ancestor in dir.ancestors() {
        match std::fs::symlink_metadata(ancestor.join(name)) {
            Ok(metadata) if metadata.is_dir() => return Ok(Some(ancestor.to_owned())),
            // A symlinked `.crew` still marks a workspace; the state store refuses to use it.
            Ok(metadata) if metadata.file_type().is_symlink() => {
                return Ok(Some(ancestor.to_owned()));
            }
            Ok(_) => {}
            Err(error) if is_absent(&error) => {}
            Err(source) => {
                return Err(DiscoverWorkspaceError::Inspect {
                    path: ancestor.join(name),
                    source,
                });
            }
        }
    }
    Ok(None)
}

fn entry_exists(path: &Utf8Path) -> Result<bool, DiscoverWorkspaceError> {
    match std::fs::symlink_metadata(path) {
        Ok(_) => Ok(true),
        Err(error) if is_absent(&error) => Ok(false),
        Err(source) => Err(DiscoverWorkspaceError::Inspect {
            path: path.to_owned(),
            source,
        }),
    }
}

fn is_absent(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
    )
}

/// The nested-worktree guard. When `dir` is inside a linked git worktree whose leader work tree
/// contains it, returns the same relative place in the leader (its nearest existing ancestor).
fn leader_location(dir: &Utf8Path) -> Result<Option<Utf8PathBuf>, DiscoverWorkspaceError> {
    let Some(worktree_root) = find_ancestor_with(dir, ".git")? else {
        return Ok(None);
    };
    let Some(leader) = leader_of_linked_worktree(&worktree_root) else {
        return Ok(None);
    };
    if leader == worktree_root || !is_within(&leader, &worktree_root) {
        return Ok(None);
    }
    let relative = dir
        .strip_prefix(&worktree_root)
        .expect("the worktree root is an ancestor of dir");
    let mut mapped = leader.join(relative);
    while !mapped.is_dir() {
        if !mapped.pop() {
            break;
        }
    }
    // The leader itself may live inside another leader's worktree (a worktree of a worktree
    // never arises from crew, but an outer repository might): apply the guard again.
    match leader_location(&mapped)? {
        Some(outer) => Ok(Some(outer)),
        None => Ok(Some(mapped)),
    }
}

/// For a work tree whose `.git` is a file, the work tree of the repository it belongs to. `None`
/// for main work trees, submodules and anything unreadable.
///
/// git's own linked worktrees say `gitdir: <repo>/.git/worktrees/<name>`, whose `commondir`
/// leads to `<repo>/.git`. While a crew task runs, its worktree's `.git` leads instead to the
/// agent's git directory beneath that admin entry, `<repo>/.git/worktrees/<name>/agent`, whose
/// `commondir` is a store of the agent's own (ARCHITECTURE.md, "Agents are untrusted"): the
/// repository is then the one whose `.git/worktrees/` holds the git directory.
fn leader_of_linked_worktree(worktree_root: &Utf8Path) -> Option<Utf8PathBuf> {
    let dot_git = worktree_root.join(".git");
    let metadata = std::fs::symlink_metadata(&dot_git).ok()?;
    if !metadata.is_file() {
        return None;
    }
    let contents = std::fs::read_to_string(&dot_git).ok()?;
    let gitdir = contents.lines().next()?.strip_prefix("gitdir:")?.trim();
    let gitdir = canonical_utf8(worktree_root.join(gitdir).as_std_path()).ok()?;
    let commondir = std::fs::read_to_string(gitdir.join("commondir")).ok()?;
    let common = canonical_utf8(gitdir.join(commondir.trim()).as_std_path()).ok()?;
    if common.file_name() == Some(".git") {
        return common.parent().map(Utf8Path::to_owned);
    }
    let admin_entries = gitdir
        .ancestors()
        .find(|dir| dir.file_name() == Some("worktrees"))?;
    let common = admin_entries.parent()?;
    (common.file_name() == Some(".git"))
        .then(|| common.parent().map(Utf8Path::to_owned))
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_root() -> (tempfile::TempDir, Utf8PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let root = canonical_utf8(dir.path()).unwrap();
        (dir, root)
    }

    #[test]
    fn crew_dir_wins_over_git_top_level() {
        let (_guard, root) = temp_root();
        std::fs::create_dir_all(root.join(".git")).unwrap();
        std::fs::create_dir_all(root.join("sub/.crew")).unwrap();
        std::fs::create_dir_all(root.join("sub/deep")).unwrap();
        let workspace = Workspace::discover(root.join("sub/deep").as_std_path()).unwrap();
        assert_eq!(workspace.root(), root.join("sub"));
        assert_eq!(workspace.repo_root(), Some(root.as_path()));
        assert_eq!(workspace.relative_invocation_dir(), "sub/deep");
    }

    #[test]
    fn plain_directory_is_its_own_workspace() {
        let (_guard, root) = temp_root();
        std::fs::create_dir_all(root.join("a")).unwrap();
        let workspace = Workspace::discover(root.join("a").as_std_path()).unwrap();
        assert_eq!(workspace.root(), root.join("a"));
        assert_eq!(workspace.repo_root(), None);
    }
}
