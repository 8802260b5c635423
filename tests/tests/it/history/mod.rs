//! The repository's history, its refs and other tasks' branches are out of an agent's reach
//! (ARCHITECTURE.md, "The agent's own git directory"): an agent in a worktree, under the real
//! kernel sandbox, tries to delete and rewrite objects, move and delete other branches and
//! their reflogs, and repoint its git directory; the user's history must still pass `git fsck
//! --full` (also after an ordinary `git gc --prune=now`), every ref but the agent's own branch
//! must be where it was, and the agent's own work must be on its branch. Honest git keeps
//! working, whatever state the user's refs are in.

use std::collections::BTreeMap;

use camino::Utf8Path;
use crew_tests::{TestEnv, render_output, tree_fingerprint, wait_until, write};

use crate::common::runs::{finished_run, manifest, run_ids, task};

mod objects;
mod single;
mod worktree;

/// Every ref of the repository with the object it names.
fn refs(env: &TestEnv, repo: &Utf8Path) -> BTreeMap<String, String> {
    env.git(repo, ["for-each-ref", "--format=%(refname) %(objectname)"])
        .lines()
        .filter_map(|line| line.split_once(' '))
        .map(|(name, id)| (name.to_owned(), id.to_owned()))
        .collect()
}

/// The repository's pack files and loose objects, with what each holds.
fn objects(repo: &Utf8Path) -> Vec<(String, String)> {
    tree_fingerprint(repo.join(".git/objects").as_std_path())
}

fn output_log(repo: &Utf8Path, run: &str, task: &str) -> String {
    std::fs::read_to_string(repo.join(format!(".crew/state/runs/{run}/tasks/{task}/output.log")))
        .unwrap()
}

fn commit_team(env: &TestEnv, repo: &Utf8Path, team: &str) {
    write(&repo.join(".crew/teams/t.toml"), team);
    env.git(repo, ["add", ".crew"]);
    env.git(repo, ["commit", "-q", "-m", "crew team"]);
}

/// What a hostile agent tries on the shared git directory `$C`, straight and through git. A
/// write that works prints `ESCAPED <what>`; git's own commands are expected to work, on the
/// agent's own view only.
fn attacks(early_branch: &str) -> String {
    format!(
        r#"
C="$CREW_PROJECT_ROOT/.git"
try() {{ name=$1; shift; if ( "$@" ) 2>/dev/null; then echo "ESCAPED $name"; fi; }}
try delete-pack sh -c 'rm "$0"/objects/pack/*.pack' "$C"
try rewrite-loose sh -c 'for f in "$0"/objects/??/*; do printf x > "$f" && exit 0; done; exit 1' "$C"
try plant-object sh -c 'mkdir -p "$0/objects/ab" && echo x > "$0/objects/ab/cdef"' "$C"
try remove-ref sh -c 'rm "$0/refs/heads/{early_branch}"' "$C"
try remove-reflog sh -c 'rm -r "$0"/logs/refs/heads/crew/*' "$C"
try packed-refs sh -c 'echo > "$0/packed-refs"' "$C"
try admin-entry sh -c 'for d in "$0"/worktrees/*/; do echo /elsewhere/.git > "$d/gitdir" && exit 0; done; exit 1' "$C"
git update-ref refs/heads/{early_branch} HEAD
git update-ref -d "refs/heads/crew/$CREW_RUN_ID-sib"
git update-ref refs/heads/main HEAD
git tag -f planted
git reflog expire --expire=now --all
git gc -q --prune=now
git repack -q -a -d
echo work > work.txt
git add work.txt && git -c user.name=agent -c user.email=agent@example.com commit -q -m "agent's own commit"
echo left > left.txt
echo done
"#
    )
}

/// What an agent runs to move its branch onto a commit whose blob exists nowhere (`git mktree
/// --missing`, `commit-tree`), writing the commit's id to `ghost.id`.
const GHOST_COMMIT: &str = r#"export GIT_AUTHOR_NAME=agent GIT_AUTHOR_EMAIL=agent@example.com GIT_COMMITTER_NAME=agent GIT_COMMITTER_EMAIL=agent@example.com
tree=$(printf '100644 blob 0123456789012345678901234567890123456789\tghost.txt\n' | git mktree --missing)
commit=$(git commit-tree "$tree" -p HEAD -m ghost)
git update-ref HEAD "$commit" && echo "$commit" > ghost.id"#;
