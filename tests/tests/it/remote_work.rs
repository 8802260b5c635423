//! Work that comes back from a workspace elsewhere (crew-worktree `incoming`): packed on the
//! side that holds it, checked on the side that receives it, and refused whole — no branch
//! moved, the work kept at its quarantine ref — when the pack or the claim lies.

use camino::{Utf8Path, Utf8PathBuf};
use crew_tests::{TestEnv, write};
use crew_worktree::incoming::{AcceptWork, IncomingError, WorkClaim, accept_work, pack_work};
use git2::{ObjectType, Oid, Repository, Signature};

const BRANCH: &str = "crew/r1-api";
const QUARANTINE: &str = "refs/crew/incoming/r1-api";

/// The project, and a clone of it standing for the other machine's, on the task's branch.
struct Sides {
    env: TestEnv,
    local: Utf8PathBuf,
    remote: Utf8PathBuf,
    base: String,
}

fn sides() -> Sides {
    let env = TestEnv::new();
    let local = env.repo("project");
    let remote = env.dir("elsewhere");
    env.git(
        &env.dir("packs"),
        ["clone", "-q", local.as_str(), remote.as_str()],
    );
    env.git(&remote, ["checkout", "-q", "-b", BRANCH]);
    let base = env.git(&local, ["rev-parse", "HEAD"]).trim().to_owned();
    Sides {
        env,
        local,
        remote,
        base,
    }
}

impl Sides {
    /// Two commits of work on the remote side's task branch.
    fn work(&self) {
        write(&self.remote.join("api.txt"), "the api\n");
        self.env.git(&self.remote, ["add", "-A"]);
        self.env.git(&self.remote, ["commit", "-q", "-m", "api"]);
        write(&self.remote.join("src/lib.txt"), "one\ntwo\nthree\nfour\n");
        self.env.git(&self.remote, ["commit", "-q", "-am", "four"]);
    }

    fn pack(&self, name: &str) -> (Utf8PathBuf, WorkClaim) {
        let path = self.env.dir("packs").join(name);
        let mut file = std::fs::File::create(&path).unwrap();
        let claim = pack_work(&self.remote, &self.base, BRANCH, &mut file).unwrap();
        (path, claim)
    }

    fn accept(
        &self,
        pack: &Utf8Path,
        claim: &WorkClaim,
        expected_at: Option<&str>,
    ) -> Result<crew_worktree::incoming::Accepted, IncomingError> {
        accept_work(&AcceptWork {
            repo_root: &self.local,
            claim,
            pack,
            branch: BRANCH,
            branch_expected_at: expected_at,
            quarantine: QUARANTINE,
        })
    }

    fn local_ref(&self, name: &str) -> Option<String> {
        let output = self
            .env
            .git_output(&self.local, ["rev-parse", "--verify", "-q", name]);
        output
            .status
            .success()
            .then(|| String::from_utf8_lossy(&output.stdout).trim().to_owned())
    }

    /// Nothing moved: no task branch, and the work held at the quarantine ref.
    fn assert_refused_and_kept(&self, tip: &str) {
        assert_eq!(self.local_ref(&format!("refs/heads/{BRANCH}")), None);
        assert_eq!(self.local_ref(QUARANTINE).as_deref(), Some(tip));
    }
}

#[test]
fn honest_work_lands_on_its_branch_with_the_tree_its_sender_reported() {
    let sides = sides();
    sides.work();
    let (pack, claim) = sides.pack("work.pack");
    assert_eq!(claim.base, sides.base);
    let accepted = sides.accept(&pack, &claim, None).unwrap();
    assert_eq!(accepted.commits, 2);
    assert_eq!(
        sides.local_ref(&format!("refs/heads/{BRANCH}")).as_deref(),
        Some(claim.tip.as_str())
    );
    // The same files as on the other side, and the quarantine ref gone.
    let tree = |dir: &Utf8Path| {
        sides
            .env
            .git(dir, ["rev-parse", &format!("{BRANCH}^{{tree}}")])
    };
    assert_eq!(tree(&sides.local), tree(&sides.remote));
    assert_eq!(
        sides
            .env
            .git(&sides.local, ["show", &format!("{BRANCH}:api.txt")]),
        "the api\n"
    );
    assert_eq!(sides.local_ref(QUARANTINE), None);
    // The user's checkout was not touched.
    assert_eq!(sides.env.git(&sides.local, ["status", "--porcelain"]), "");
}

#[test]
fn a_claim_whose_tree_differs_from_the_tips_is_refused_and_the_work_kept() {
    let sides = sides();
    sides.work();
    let (pack, claim) = sides.pack("work.pack");
    // The tree of the first commit of the work, not the tip's: what a sender that lies (or a
    // pack that lost the last commit's files) would say.
    let other = sides.env.git(
        &sides.remote,
        ["rev-parse", &format!("{BRANCH}~1^{{tree}}")],
    );
    let lie = WorkClaim {
        tree: other.trim().to_owned(),
        ..claim.clone()
    };
    let refused = sides.accept(&pack, &lie, None).unwrap_err();
    assert!(
        matches!(refused, IncomingError::TreeMismatch { .. }),
        "{refused}"
    );
    assert!(refused.to_string().contains(QUARANTINE), "{refused}");
    sides.assert_refused_and_kept(&claim.tip);
}

#[test]
fn work_that_does_not_start_from_the_base_is_refused() {
    let sides = sides();
    // History of its own: an orphan branch that shares nothing with the run's base.
    sides
        .env
        .git(&sides.remote, ["checkout", "-q", "--orphan", "elsewhere"]);
    write(&sides.remote.join("other.txt"), "unrelated\n");
    sides.env.git(&sides.remote, ["add", "-A"]);
    sides
        .env
        .git(&sides.remote, ["commit", "-q", "-m", "unrelated"]);
    sides
        .env
        .git(&sides.remote, ["branch", "-q", "-f", BRANCH, "elsewhere"]);
    let (pack, claim) = sides.pack("work.pack");
    let refused = sides.accept(&pack, &claim, None).unwrap_err();
    assert!(
        matches!(refused, IncomingError::NotFromBase { .. }),
        "{refused}"
    );
    sides.assert_refused_and_kept(&claim.tip);
}

#[test]
fn a_pack_that_leaves_out_a_file_is_refused_as_incomplete() {
    let sides = sides();
    sides.work();
    let (_, claim) = sides.pack("whole.pack");
    // The tip's commit and trees, without the blob of the file it changed.
    let repo = Repository::open(&sides.remote).unwrap();
    let tip = repo
        .find_commit(Oid::from_str(&claim.tip).unwrap())
        .unwrap();
    let changed = tip
        .tree()
        .unwrap()
        .get_path(std::path::Path::new("src/lib.txt"))
        .unwrap()
        .id();
    let mut builder = repo.packbuilder().unwrap();
    let mut walk = repo.revwalk().unwrap();
    walk.push(tip.id()).unwrap();
    walk.hide(Oid::from_str(&sides.base).unwrap()).unwrap();
    for commit in walk {
        let commit = repo.find_commit(commit.unwrap()).unwrap();
        builder.insert_object(commit.id(), None).unwrap();
        let tree = commit.tree().unwrap();
        builder.insert_object(tree.id(), None).unwrap();
        builder
            .insert_object(tree.get_name("src").unwrap().id(), None)
            .unwrap();
        let api = tree.get_name("api.txt").unwrap().id();
        builder.insert_object(api, None).unwrap();
    }
    let mut bytes = git2::Buf::new();
    builder.write_buf(&mut bytes).unwrap();
    let pack = sides.env.dir("packs").join("partial.pack");
    std::fs::write(&pack, &*bytes).unwrap();

    let refused = sides.accept(&pack, &claim, None).unwrap_err();
    match &refused {
        IncomingError::Incomplete { path, object, .. } => {
            assert_eq!(path, "src/lib.txt");
            assert_eq!(object, &changed.to_string());
        }
        other => panic!("{other}"),
    }
    sides.assert_refused_and_kept(&claim.tip);
}

#[test]
fn a_commit_that_would_write_into_dot_git_is_refused() {
    let sides = sides();
    // A tree git itself would never make: `.git/hooks/post-checkout` as tracked files, written
    // object by object, as a hostile agent with a shell could.
    let repo = Repository::open(&sides.remote).unwrap();
    let odb = repo.odb().unwrap();
    let hook = odb
        .write(ObjectType::Blob, b"#!/bin/sh\ntouch /tmp/owned\n")
        .unwrap();
    let tree_of = |entries: &[(&str, &str, Oid)]| {
        let mut bytes = Vec::new();
        for (mode, name, id) in entries {
            bytes.extend_from_slice(format!("{mode} {name}\0").as_bytes());
            bytes.extend_from_slice(id.as_bytes());
        }
        odb.write(ObjectType::Tree, &bytes).unwrap()
    };
    let hooks = tree_of(&[("100755", "post-checkout", hook)]);
    let dot_git = tree_of(&[("40000", "hooks", hooks)]);
    let base = repo
        .find_commit(Oid::from_str(&sides.base).unwrap())
        .unwrap();
    let mut root: Vec<(String, String, Oid)> = base
        .tree()
        .unwrap()
        .iter()
        .map(|entry| {
            (
                format!("{:o}", entry.filemode()),
                entry.name().unwrap().to_owned(),
                entry.id(),
            )
        })
        .collect();
    root.insert(0, ("40000".to_owned(), ".git".to_owned(), dot_git));
    let entries: Vec<(&str, &str, Oid)> = root
        .iter()
        .map(|(mode, name, id)| (mode.as_str(), name.as_str(), *id))
        .collect();
    let tree = repo.find_tree(tree_of(&entries)).unwrap();
    let signature = Signature::now("agent", "agent@example.com").unwrap();
    repo.commit(
        Some(&format!("refs/heads/{BRANCH}")),
        &signature,
        &signature,
        "hooks",
        &tree,
        &[&base],
    )
    .unwrap();
    let (pack, claim) = sides.pack("hostile.pack");
    let refused = sides.accept(&pack, &claim, None).unwrap_err();
    match &refused {
        IncomingError::UnsafePath { path, .. } => assert!(path.starts_with(".git/"), "{path}"),
        other => panic!("{other}"),
    }
    sides.assert_refused_and_kept(&claim.tip);
    assert!(!sides.local.join(".git/hooks/post-checkout").exists());
}

#[test]
fn the_branch_moves_only_from_where_it_was_expected() {
    let sides = sides();
    sides.work();
    let (pack, claim) = sides.pack("work.pack");
    // Someone made the task's branch meanwhile: crew does not move it.
    sides.env.git(&sides.local, ["branch", "-q", BRANCH]);
    let refused = sides.accept(&pack, &claim, None).unwrap_err();
    assert!(
        matches!(refused, IncomingError::BranchMoved { .. }),
        "{refused}"
    );
    assert_eq!(
        sides.local_ref(&format!("refs/heads/{BRANCH}")).as_deref(),
        Some(sides.base.as_str())
    );
    assert_eq!(
        sides.local_ref(QUARANTINE).as_deref(),
        Some(claim.tip.as_str())
    );
    // Where it was expected, it moves.
    let accepted = sides
        .accept(&pack, &claim, Some(sides.base.as_str()))
        .unwrap();
    assert_eq!(accepted.tip, claim.tip);
    assert_eq!(
        sides.local_ref(&format!("refs/heads/{BRANCH}")).as_deref(),
        Some(claim.tip.as_str())
    );
}

#[test]
fn garbage_for_a_pack_and_ids_that_are_not_ids_are_refused_plainly() {
    let sides = sides();
    sides.work();
    let (_, claim) = sides.pack("work.pack");
    let garbage = sides.env.dir("packs").join("garbage.pack");
    std::fs::write(&garbage, b"PACK but not really a pack at all").unwrap();
    let refused = sides.accept(&garbage, &claim, None).unwrap_err();
    assert!(
        matches!(refused, IncomingError::BadPack { .. }),
        "{refused}"
    );
    assert_eq!(sides.local_ref(&format!("refs/heads/{BRANCH}")), None);
    let short = WorkClaim {
        tip: claim.tip[..12].to_owned(),
        ..claim.clone()
    };
    let refused = sides
        .accept(&sides.env.dir("packs").join("work.pack"), &short, None)
        .unwrap_err();
    insta::assert_snapshot!(refused.to_string().replace(&claim.tip[..12], "[SHORT]"), @"the claim's tip `[SHORT]` is not an object id");
}
