//! The conflict radar: which task branches would conflict with each other, and with the branch
//! they will land on — found by merging their tips in memory (git2's `merge_commits`): no
//! checkout, no branch or file changed.

use std::collections::HashMap;

use camino::{Utf8Path, Utf8PathBuf};
use git2::{BranchType, Oid, Repository};
use serde::Serialize;

/// Two branches whose merge would conflict, and in which files.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Overlap {
    /// The names given for the two sides (a task id, or the target branch's name).
    pub left: String,
    /// The other side.
    pub right: String,
    /// The files whose merge conflicts.
    pub files: Vec<String>,
}

/// The overlaps among `branches` (`(name, branch)`) pairwise, and between each of them and
/// `target` (a branch name) when given. Branches that cannot be read are skipped. A branch
/// listed in `working` (`(branch, worktree)`: a task still at work) is read as its worktree
/// stands, what its agent has not committed yet included (see `working_commit`).
pub fn overlaps(
    repo_root: &Utf8Path,
    branches: &[(String, String)],
    working: &[(String, Utf8PathBuf)],
    target: Option<&str>,
) -> Result<Vec<Overlap>, git2::Error> {
    crate::leader::fast_reads();
    let repo = Repository::open(repo_root)?;
    let live = with_live_tips(&repo)?;
    // What the working states are written as: objects in memory only, never in the
    // repository.
    let odb = repo.odb()?;
    if !working.is_empty() {
        odb.add_new_mempack_backend(1_000)?;
    }
    let tip = |branch: &str| {
        let tip = live_or_branch_tip(&repo, &live, branch)?;
        Some(
            working
                .iter()
                .find(|(name, _)| name == branch)
                .and_then(|(_, worktree)| working_commit(&repo, worktree, tip))
                .unwrap_or(tip),
        )
    };
    let mut sides: Vec<(String, Oid)> = branches
        .iter()
        .filter_map(|(name, branch)| Some((name.clone(), tip(branch)?)))
        .collect();
    let target = target.and_then(|name| Some((name.to_owned(), tip(name)?)));
    let mut found = Vec::new();
    let mut changes = Changes::default();
    let count = sides.len();
    if let Some(target) = target {
        sides.push(target);
    }
    for left in 0..count {
        for right in left + 1..sides.len() {
            let files = conflicting_files(&repo, &mut changes, sides[left].1, sides[right].1)?;
            if !files.is_empty() {
                found.push(Overlap {
                    left: sides[left].0.clone(),
                    right: sides[right].0.clone(),
                    files,
                });
            }
        }
    }
    Ok(found)
}

/// The overlaps of one branch (`branch`, named `name`) with each of `others` and with
/// `target`: what a task's branch meets when it appears, without the pairs among the others.
/// A side that cannot be read is skipped.
pub fn overlaps_of(
    repo_root: &Utf8Path,
    (name, branch): (&str, &str),
    others: &[(String, String)],
    target: Option<&str>,
) -> Result<Vec<Overlap>, git2::Error> {
    crate::leader::fast_reads();
    let repo = Repository::open(repo_root)?;
    let live = with_live_tips(&repo)?;
    let tip = |branch: &str| live_or_branch_tip(&repo, &live, branch);
    let Some(own) = tip(branch) else {
        return Ok(Vec::new());
    };
    let mut found = Vec::new();
    let mut changes = Changes::default();
    let sides = others
        .iter()
        .map(|(other, branch)| (other.as_str(), branch.as_str()))
        .chain(target.map(|target| (target, target)));
    for (other, other_branch) in sides {
        let Some(their) = tip(other_branch) else {
            continue;
        };
        let files = conflicting_files(&repo, &mut changes, own, their)?;
        if !files.is_empty() {
            found.push(Overlap {
                left: name.to_owned(),
                right: other.to_owned(),
                files,
            });
        }
    }
    Ok(found)
}

/// One path a commit changed since a base: its blob and mode before and after (`None`: it
/// was not there, or is not any more).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Change {
    old: Option<(Oid, u32)>,
    new: Option<(Oid, u32)>,
}

/// What commits changed since a base, by `(base, commit)`: each side is diffed once however
/// many pairs it is in.
#[derive(Default)]
struct Changes(HashMap<(Oid, Oid), HashMap<String, Change>>);

impl Changes {
    /// The paths `commit` changed since `base`.
    fn of(
        &mut self,
        repo: &Repository,
        base: Oid,
        commit: Oid,
    ) -> Result<&HashMap<String, Change>, git2::Error> {
        if let std::collections::hash_map::Entry::Vacant(slot) = self.0.entry((base, commit)) {
            let old = repo.find_commit(base)?.tree_id();
            let new = repo.find_commit(commit)?.tree_id();
            let mut changed = HashMap::new();
            tree_changes(repo, Some(old), Some(new), "", &mut changed)?;
            slot.insert(changed);
        }
        Ok(&self.0[&(base, commit)])
    }
}

/// The files that differ between trees `old` and `new` (`None`: no tree), under `prefix`, as
/// a tree diff without renames lists them — but reading only the subtrees whose ids differ:
/// libgit2's diff walks every entry of both trees, which on a large repository is most of the
/// radar's time. A path that is a file on one side and a directory on the other is the file
/// removed (or added) and each file of the directory added (or removed).
fn tree_changes(
    repo: &Repository,
    old: Option<Oid>,
    new: Option<Oid>,
    prefix: &str,
    changed: &mut HashMap<String, Change>,
) -> Result<(), git2::Error> {
    if old == new {
        return Ok(());
    }
    let entries = |tree: Option<Oid>| -> Result<Vec<(String, Oid, u32)>, git2::Error> {
        let Some(tree) = tree else {
            return Ok(Vec::new());
        };
        Ok(repo
            .find_tree(tree)?
            .iter()
            .map(|entry| {
                let name = String::from_utf8_lossy(entry.name_bytes()).into_owned();
                let mode = u32::try_from(entry.filemode()).unwrap_or_default();
                (name, entry.id(), mode)
            })
            .collect())
    };
    let ours = entries(old)?;
    let mut theirs: HashMap<String, (Oid, u32)> = entries(new)?
        .into_iter()
        .map(|(name, id, mode)| (name, (id, mode)))
        .collect();
    let is_tree = |mode: u32| mode == TREE_MODE;
    for (name, id, mode) in ours {
        let path = format!("{prefix}{name}");
        match theirs.remove(&name) {
            None => one_side(repo, path, (id, mode), true, changed)?,
            Some(their) if their == (id, mode) => {}
            Some((their_id, their_mode)) if is_tree(mode) && is_tree(their_mode) => {
                tree_changes(repo, Some(id), Some(their_id), &format!("{path}/"), changed)?;
            }
            Some(their) if !is_tree(mode) && !is_tree(their.1) => {
                changed.insert(
                    path,
                    Change {
                        old: Some((id, mode)),
                        new: Some(their),
                    },
                );
            }
            Some(their) => {
                one_side(repo, path.clone(), (id, mode), true, changed)?;
                one_side(repo, path, their, false, changed)?;
            }
        }
    }
    for (name, their) in theirs {
        one_side(repo, format!("{prefix}{name}"), their, false, changed)?;
    }
    Ok(())
}

/// A path only one side has (`removed`: the old one): a file, or every file of a directory.
fn one_side(
    repo: &Repository,
    path: String,
    (id, mode): (Oid, u32),
    removed: bool,
    changed: &mut HashMap<String, Change>,
) -> Result<(), git2::Error> {
    if mode == TREE_MODE {
        let (old, new) = if removed {
            (Some(id), None)
        } else {
            (None, Some(id))
        };
        return tree_changes(repo, old, new, &format!("{path}/"), changed);
    }
    let (old, new) = if removed {
        (Some((id, mode)), None)
    } else {
        (None, Some((id, mode)))
    };
    changed.insert(path, Change { old, new });
    Ok(())
}

/// The mode of a tree entry that is a directory.
const TREE_MODE: u32 = 0o040000;

/// The files a merge of the two commits would leave in conflict (`changes` caches what each
/// side changed across the pairs of one call). What each side changed since their merge base
/// is compared first (tree diffs, which skip unchanged directories by their ids):
/// - no path changed differently on both sides, and no file on one side where the other has a
///   directory: no conflict (most pairs of task branches);
/// - only files both sides edited in place, and neither side removed anything (so nothing was
///   renamed): each such file is merged on its own, three ways, as the full merge would;
/// - anything else (removals, renames, additions meeting): the full merge in memory
///   (`merge_commits`), whose answer it is.
fn conflicting_files(
    repo: &Repository,
    changes: &mut Changes,
    left: Oid,
    right: Oid,
) -> Result<Vec<String>, git2::Error> {
    if left == right {
        return Ok(Vec::new());
    }
    if let Some(base) = merge_base(repo, left, right) {
        let ours = changes.of(repo, base, left)?.clone();
        let theirs = changes.of(repo, base, right)?;
        let meeting: Vec<(&String, &Change, &Change)> = ours
            .iter()
            .filter_map(|(path, our)| {
                let their = theirs.get(path)?;
                (their.new != our.new).then_some((path, our, their))
            })
            .collect();
        let nested = ours
            .keys()
            .any(|path| ancestors(path).any(|dir| theirs.contains_key(dir)))
            || theirs
                .keys()
                .any(|path| ancestors(path).any(|dir| ours.contains_key(dir)));
        if meeting.is_empty() && !nested {
            return Ok(Vec::new());
        }
        let removes =
            |side: &HashMap<String, Change>| side.values().any(|change| change.new.is_none());
        let in_place = |change: &Change| change.old.is_some() && change.new.is_some();
        if !nested
            && !removes(&ours)
            && !removes(theirs)
            && meeting
                .iter()
                .all(|(_, our, their)| in_place(our) && in_place(their))
        {
            let mut files = Vec::new();
            for (path, our, their) in meeting {
                let entry = |(id, mode): (Oid, u32)| index_entry(path, id, mode);
                let (Some(ancestor), Some(mine), Some(other)) = (our.old, our.new, their.new)
                else {
                    continue;
                };
                let merged = repo.merge_file_from_index(
                    &entry(ancestor),
                    &entry(mine),
                    &entry(other),
                    None,
                )?;
                if !merged.is_automergeable() {
                    files.push(path.clone());
                }
            }
            files.sort();
            return Ok(files);
        }
    }
    let index = repo.merge_commits(&repo.find_commit(left)?, &repo.find_commit(right)?, None)?;
    conflicted_paths(&index)
}

/// The paths a merged index holds in conflict, sorted.
fn conflicted_paths(index: &git2::Index) -> Result<Vec<String>, git2::Error> {
    if !index.has_conflicts() {
        return Ok(Vec::new());
    }
    let mut files: Vec<String> = index
        .conflicts()?
        .flatten()
        .filter_map(|conflict| {
            let entry = conflict.our.or(conflict.their).or(conflict.ancestor)?;
            Some(String::from_utf8_lossy(&entry.path).into_owned())
        })
        .collect();
    files.sort();
    files.dedup();
    Ok(files)
}

/// The commit a local (or else remote-tracking) branch points at.
/// The tips of the task branches whose agents' commits are still in their own git directories
/// (see [`crate::agent_git`]), their stores added to `repo`'s objects (in memory, read-only):
/// the radar sees a running task's commits as well as a finished one's.
fn with_live_tips(repo: &Repository) -> Result<HashMap<String, Oid>, git2::Error> {
    let live = crate::agent_git::live_tips(&crate::leader::common_dir(repo));
    if live.is_empty() {
        return Ok(HashMap::new());
    }
    let odb = repo.odb()?;
    let mut tips = HashMap::new();
    for (branch, (tip, objects)) in live {
        if odb.add_disk_alternate(objects.as_str()).is_ok() {
            tips.insert(branch, tip);
        }
    }
    Ok(tips)
}

/// A commit (in memory: `repo`'s object store must write to a mempack) of the worktree at
/// `worktree` as it stands, on top of `tip`: each file git would commit — changed, new or
/// deleted, ignored ones left out — as it is on disk. `None` when nothing is uncommitted or the
/// worktree cannot be read. A new link is left out: crew's own (`node_modules`) are links the
/// agent did not write.
fn working_commit(repo: &Repository, worktree: &Utf8Path, tip: Oid) -> Option<Oid> {
    let work = Repository::open(worktree).ok()?;
    let mut options = git2::StatusOptions::new();
    options
        .include_untracked(true)
        .recurse_untracked_dirs(true)
        .include_ignored(false)
        .exclude_submodules(true);
    let statuses = work.statuses(Some(&mut options)).ok()?;
    let mut update = git2::build::TreeUpdateBuilder::new();
    let mut any = false;
    for entry in statuses.iter() {
        let Ok(path) = entry.path() else {
            continue;
        };
        let file = worktree.join(path);
        match std::fs::symlink_metadata(&file) {
            Ok(metadata) if metadata.is_file() => {
                let Ok(content) = std::fs::read(&file) else {
                    continue;
                };
                let executable =
                    std::os::unix::fs::PermissionsExt::mode(&metadata.permissions()) & 0o111 != 0;
                let mode = if executable {
                    git2::FileMode::BlobExecutable
                } else {
                    git2::FileMode::Blob
                };
                update.upsert(path, repo.blob(&content).ok()?, mode);
            }
            Ok(metadata) if metadata.is_symlink() && !entry.status().is_wt_new() => {
                let target = std::fs::read_link(&file).ok()?;
                let blob = repo.blob(target.as_os_str().as_encoded_bytes()).ok()?;
                update.upsert(path, blob, git2::FileMode::Link);
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                update.remove(path);
            }
            _ => continue,
        }
        any = true;
    }
    if !any {
        return None;
    }
    let base = repo.find_commit(tip).ok()?;
    let tree = update.create_updated(repo, &base.tree().ok()?).ok()?;
    let tree = repo.find_tree(tree).ok()?;
    let signature = git2::Signature::new("crew", "crew@localhost", &git2::Time::new(0, 0)).ok()?;
    repo.commit(
        None,
        &signature,
        &signature,
        "as the worktree stands",
        &tree,
        &[&base],
    )
    .ok()
}

fn live_or_branch_tip(repo: &Repository, live: &HashMap<String, Oid>, branch: &str) -> Option<Oid> {
    live.get(branch).copied().or_else(|| tip(repo, branch))
}

fn tip(repo: &Repository, branch: &str) -> Option<Oid> {
    [BranchType::Local, BranchType::Remote]
        .into_iter()
        .find_map(|kind| repo.find_branch(branch, kind).ok())?
        .get()
        .target()
}

/// The merge base of two commits. Task branches are mostly one commit on the run's base: two
/// commits with the same single parent have it as their base, and a commit whose single parent
/// is the other has the other; only other shapes walk the history.
fn merge_base(repo: &Repository, left: Oid, right: Oid) -> Option<Oid> {
    let single_parent = |id: Oid| {
        let commit = repo.find_commit(id).ok()?;
        (commit.parent_count() == 1)
            .then(|| commit.parent_id(0).ok())
            .flatten()
    };
    match (single_parent(left), single_parent(right)) {
        (Some(ours), Some(theirs)) if ours == theirs => return Some(ours),
        (Some(ours), _) if ours == right => return Some(right),
        (_, Some(theirs)) if theirs == left => return Some(left),
        _ => {}
    }
    repo.merge_base(left, right).ok()
}

/// An index entry naming a blob at `path`, for merging it on its own.
fn index_entry(path: &str, id: Oid, mode: u32) -> git2::IndexEntry {
    let zero = git2::IndexTime::new(0, 0);
    git2::IndexEntry {
        ctime: zero,
        mtime: zero,
        dev: 0,
        ino: 0,
        mode,
        uid: 0,
        gid: 0,
        file_size: 0,
        id,
        flags: 0,
        flags_extended: 0,
        path: path.as_bytes().to_vec(),
    }
}

/// `a/b/c` → `a/b`, `a`.
fn ancestors(path: &str) -> impl Iterator<Item = &str> {
    path.char_indices()
        .filter(|(_, c)| *c == '/')
        .map(move |(at, _)| &path[..at])
}

#[cfg(test)]
mod tests {
    use super::*;
    use git2::build::TreeUpdateBuilder;
    use git2::{FileMode, Signature};

    /// A commit on `parent` with `changes` applied (`None`: removed).
    fn commit(repo: &Repository, parent: Oid, changes: &[(&str, Option<&str>)]) -> Oid {
        let parent = repo.find_commit(parent).unwrap();
        // Removals first: a file may give way to a directory of the same name.
        let mut removals = TreeUpdateBuilder::new();
        let mut additions = TreeUpdateBuilder::new();
        for (path, content) in changes {
            match content {
                Some(content) => {
                    let blob = repo.blob(content.as_bytes()).unwrap();
                    additions.upsert(*path, blob, FileMode::Blob);
                }
                None => {
                    removals.remove(*path);
                }
            }
        }
        let tree = removals
            .create_updated(repo, &parent.tree().unwrap())
            .unwrap();
        let tree = additions
            .create_updated(repo, &repo.find_tree(tree).unwrap())
            .unwrap();
        let tree = repo.find_tree(tree).unwrap();
        let signature = Signature::now("t", "t@example.com").unwrap();
        repo.commit(None, &signature, &signature, "c", &tree, &[&parent])
            .unwrap()
    }

    /// What a full in-memory merge says: the answer the quick comparison must give.
    fn merged(repo: &Repository, left: Oid, right: Oid) -> Vec<String> {
        let index = repo
            .merge_commits(
                &repo.find_commit(left).unwrap(),
                &repo.find_commit(right).unwrap(),
                None,
            )
            .unwrap();
        conflicted_paths(&index).unwrap()
    }

    /// A root commit with an empty tree.
    fn empty_root(repo: &Repository) -> Oid {
        let tree = repo
            .find_tree(repo.treebuilder(None).unwrap().write().unwrap())
            .unwrap();
        let signature = Signature::now("t", "t@example.com").unwrap();
        repo.commit(None, &signature, &signature, "root", &tree, &[])
            .unwrap()
    }

    #[test]
    fn the_quick_comparison_agrees_with_a_full_merge() {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init(dir.path()).unwrap();
        let empty = empty_root(&repo);
        let text = "one\ntwo\nthree\nfour\nfive\nsix\nseven\neight\n";
        let base = commit(
            &repo,
            empty,
            &[
                ("x.txt", Some(text)),
                ("d", Some("a file\n")),
                ("same.txt", Some("s\n")),
            ],
        );
        type Side<'a> = Vec<(&'a str, Option<&'a str>)>;
        let cases: Vec<(&str, Side<'_>, Side<'_>)> = vec![
            (
                "other files",
                vec![("a.txt", Some("a\n"))],
                vec![("b.txt", Some("b\n"))],
            ),
            (
                "the same line",
                vec![(
                    "x.txt",
                    Some("ONE\ntwo\nthree\nfour\nfive\nsix\nseven\neight\n"),
                )],
                vec![(
                    "x.txt",
                    Some("uno\ntwo\nthree\nfour\nfive\nsix\nseven\neight\n"),
                )],
            ),
            (
                "other lines of one file",
                vec![(
                    "x.txt",
                    Some("ONE\ntwo\nthree\nfour\nfive\nsix\nseven\neight\n"),
                )],
                vec![(
                    "x.txt",
                    Some("one\ntwo\nthree\nfour\nfive\nsix\nseven\nEIGHT\n"),
                )],
            ),
            (
                "the same change",
                vec![("same.txt", Some("t\n"))],
                vec![("same.txt", Some("t\n"))],
            ),
            (
                "removed against changed",
                vec![("x.txt", None)],
                vec![("x.txt", Some("changed\n"))],
            ),
            (
                "a file where the other side has a directory",
                vec![("d", None), ("d/f", Some("inside\n"))],
                vec![("d", Some("changed file\n"))],
            ),
            (
                "a new directory where the other side adds a file",
                vec![("e/f", Some("in a directory\n"))],
                vec![("e", Some("a file\n"))],
            ),
            (
                "renamed against changed",
                vec![("x.txt", None), ("y.txt", Some(text))],
                vec![(
                    "x.txt",
                    Some("one\ntwo\nthree\nfour\nfive\nsix\nseven\nEIGHT\n"),
                )],
            ),
        ];
        for (what, left, right) in cases {
            let left = commit(&repo, base, &left);
            let right = commit(&repo, base, &right);
            let quick = conflicting_files(&repo, &mut Changes::default(), left, right).unwrap();
            assert_eq!(quick, merged(&repo, left, right), "{what}");
        }
    }

    /// What libgit2's full tree diff lists: the answer the pruned walk must give.
    fn diffed(repo: &Repository, old: Oid, new: Oid) -> HashMap<String, Change> {
        let old = repo.find_commit(old).unwrap().tree().unwrap();
        let new = repo.find_commit(new).unwrap().tree().unwrap();
        let diff = repo
            .diff_tree_to_tree(Some(&old), Some(&new), None)
            .unwrap();
        let side = |file: git2::DiffFile<'_>| {
            (!file.id().is_zero()).then(|| (file.id(), u32::from(file.mode())))
        };
        let mut changed = HashMap::new();
        for delta in diff.deltas() {
            let path = delta.new_file().path().or(delta.old_file().path()).unwrap();
            let change = Change {
                old: side(delta.old_file()),
                new: side(delta.new_file()),
            };
            changed.insert(path.to_string_lossy().into_owned(), change);
        }
        changed
    }

    #[test]
    fn the_pruned_tree_walk_lists_what_a_full_diff_lists() {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init(dir.path()).unwrap();
        let root = empty_root(&repo);
        let base = commit(
            &repo,
            root,
            &[
                ("a/b/c.txt", Some("c\n")),
                ("a/b/same.txt", Some("s\n")),
                ("a/kept.txt", Some("k\n")),
                ("d.txt", Some("d\n")),
                ("e", Some("a file\n")),
                ("f/g.txt", Some("g\n")),
                ("f/h/i.txt", Some("i\n")),
                ("x.sh", Some("run\n")),
            ],
        );
        let changed = commit(
            &repo,
            base,
            &[
                ("a/b/c.txt", Some("changed\n")),
                ("d.txt", None),
                ("e", None),
                ("e/inside.txt", Some("now a directory\n")),
                ("f", None),
                ("f", Some("now a file\n")),
                ("new/deep/n.txt", Some("n\n")),
            ],
        );
        // An executable bit, by hand: the helper writes plain files.
        let changed = {
            let parent = repo.find_commit(changed).unwrap();
            let blob = repo.blob(b"run\n").unwrap();
            let mut update = TreeUpdateBuilder::new();
            update.upsert("x.sh", blob, FileMode::BlobExecutable);
            let tree = update
                .create_updated(&repo, &parent.tree().unwrap())
                .unwrap();
            let tree = repo.find_tree(tree).unwrap();
            let signature = Signature::now("t", "t@example.com").unwrap();
            repo.commit(None, &signature, &signature, "x", &tree, &[&parent])
                .unwrap()
        };
        for (old, new) in [
            (base, changed),
            (changed, base),
            (root, changed),
            (base, base),
        ] {
            let mut walked = HashMap::new();
            tree_changes(
                &repo,
                Some(repo.find_commit(old).unwrap().tree_id()),
                Some(repo.find_commit(new).unwrap().tree_id()),
                "",
                &mut walked,
            )
            .unwrap();
            assert_eq!(walked, diffed(&repo, old, new));
        }
        let mut walked = HashMap::new();
        let tree = repo.find_commit(changed).unwrap().tree_id();
        tree_changes(&repo, Some(tree), Some(tree), "", &mut walked).unwrap();
        assert!(walked.is_empty());
    }
}
