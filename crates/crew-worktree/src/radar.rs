//! The conflict radar: which task branches would conflict with each other, and with the branch
//! they will land on — found by merging their tips in memory (git2's `merge_commits`): no
//! checkout, no branch or file changed.

use camino::Utf8Path;
use git2::{BranchType, Oid, Repository};
use serde::Serialize;

/// Two branches whose merge would conflict, and in which files.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Overlap {
    /// The names given for the two sides (a task id, or the target branch's name).
    pub left: String,
    pub right: String,
    pub files: Vec<String>,
}

/// The overlaps among `branches` (`(name, branch)`) pairwise, and between each of them and
/// `target` (a branch name) when given. Branches that cannot be read are skipped.
pub fn overlaps(
    repo_root: &Utf8Path,
    branches: &[(String, String)],
    target: Option<&str>,
) -> Result<Vec<Overlap>, git2::Error> {
    let repo = Repository::open(repo_root)?;
    let tip = |branch: &str| -> Option<Oid> {
        [BranchType::Local, BranchType::Remote]
            .into_iter()
            .find_map(|kind| repo.find_branch(branch, kind).ok())?
            .get()
            .target()
    };
    let mut sides: Vec<(String, Oid)> = branches
        .iter()
        .filter_map(|(name, branch)| Some((name.clone(), tip(branch)?)))
        .collect();
    let target = target.and_then(|name| Some((name.to_owned(), tip(name)?)));
    let mut found = Vec::new();
    let count = sides.len();
    if let Some(target) = target {
        sides.push(target);
    }
    for left in 0..count {
        for right in left + 1..sides.len() {
            let files = conflicting_files(&repo, sides[left].1, sides[right].1)?;
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
    let repo = Repository::open(repo_root)?;
    let tip = |branch: &str| -> Option<Oid> {
        [BranchType::Local, BranchType::Remote]
            .into_iter()
            .find_map(|kind| repo.find_branch(branch, kind).ok())?
            .get()
            .target()
    };
    let Some(own) = tip(branch) else {
        return Ok(Vec::new());
    };
    let mut found = Vec::new();
    let sides = others
        .iter()
        .map(|(other, branch)| (other.as_str(), branch.as_str()))
        .chain(target.map(|target| (target, target)));
    for (other, other_branch) in sides {
        let Some(their) = tip(other_branch) else {
            continue;
        };
        let files = conflicting_files(&repo, own, their)?;
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

/// The files a merge of the two commits would leave in conflict.
fn conflicting_files(repo: &Repository, left: Oid, right: Oid) -> Result<Vec<String>, git2::Error> {
    if left == right {
        return Ok(Vec::new());
    }
    let index = repo.merge_commits(&repo.find_commit(left)?, &repo.find_commit(right)?, None)?;
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
