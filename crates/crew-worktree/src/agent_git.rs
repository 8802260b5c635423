//! The agent's own git directory: where an agent's git writes, so that nothing it does there
//! reaches the repository's history, another task's branch or the user's refs (ARCHITECTURE.md,
//! "Agents are untrusted").
//!
//! A worktree registered with git has an admin entry `<common>/worktrees/<admin>` (its `HEAD`,
//! its `index`, and the pointers `gitdir` and `commondir`), and everything else — objects, refs,
//! `packed-refs` — is the shared common directory. A commit needs to write objects and a ref, and
//! the kernel's sandbox grants directories, not files: granting what a commit needs there would
//! grant the agent every object and every task's branch. So an agent never writes there at all.
//! While its task runs, the worktree's `.git` file leads to a directory of the agent's own
//! beneath the admin entry, `<admin>/agent`, laid out as git's own linked worktrees are:
//!
//! - `agent/HEAD`, `agent/index`: the worktree's own, copied from the admin entry when the task
//!   starts; `agent/gitdir` and `agent/commondir` point at the worktree and at the store;
//! - `agent/common`, the store, a common directory of the agent's own: `objects/` is private,
//!   with the repository's object directory as a read-only alternate (git's own quarantine
//!   idea); `packed-refs` holds every ref of the repository as it was when the task started, and
//!   the agent's ref updates go beside it; `config`, `hooks` and `info` are links to the
//!   repository's own, which it reads but cannot write (`git config` resolves the link, and the
//!   sandbox refuses the write).
//!
//! The sandbox grants `agent/` and nothing else of the repository. Inside it, `git commit`,
//! `git stash`, `git rebase`, `git gc`, branches of its own and amends all work — whatever state
//! the user's refs are in, packed or loose — and touch only the agent's store. The admin entry
//! stays crew's: the user's `git worktree list`, `git gc` and `git fsck` see only objects the
//! repository has.
//!
//! When the task ends, crew puts its own pointers back (reporting any the agent changed), takes
//! the work (see [`AgentGit::take`]: the objects reachable from the task branch's tip, each
//! checked against its id, moved into the repository, and the task branch set to that tip), and
//! gives the worktree back its ordinary `.git`. Branches and refs the agent changed in its store
//! go with the store: only its task branch leaves it.

use std::collections::HashSet;

use camino::{Utf8Path, Utf8PathBuf};
use crew_core::fsutil::{read_nofollow, write_atomic};
use crew_core::paths::remove_contained;
use crew_core::provider::SecurityFinding;
use git2::{ObjectType, Oid, Repository};

use crate::admin;
use crate::names::TaskNames;

/// The agent's git directory, beneath the worktree's admin entry.
pub const AGENT_DIR: &str = "agent";
/// Its store, beneath the agent's git directory.
const STORE_DIR: &str = "common";
/// The repository's files the store links to: read through, never written. `info/` is a
/// directory of the store's own (git writes `info/refs` there), whose entries link to the
/// repository's (`exclude`, `attributes`).
const LINKED: &[&str] = &["config", "hooks", "shallow", "lfs"];
/// What git writes into `info/` of a store itself.
const INFO_OWN: &[&str] = &["refs"];

/// The places of one worktree's agent git directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentGit {
    /// The repository's common git directory.
    common: Utf8PathBuf,
    /// The worktree's admin entry: `<common>/worktrees/<admin>`.
    admin: Utf8PathBuf,
    /// The worktree.
    root: Utf8PathBuf,
    /// Where its `.git` is written: the worktree's held directory while it is made (see
    /// `crew_core::paths::HeldDir`), else `root`.
    through: Option<Utf8PathBuf>,
}

/// The agent's work could not be taken into the repository.
#[derive(Debug, thiserror::Error)]
pub enum TakeError {
    /// An object the task's branch needs is in neither store.
    #[error("object {id} of the agent's branch is missing")]
    Missing {
        /// The object.
        id: Oid,
    },
    /// An object's content does not have the id it is stored under.
    #[error("object {id} of the agent's branch does not hash to its id (it hashes to {actual})")]
    Corrupt {
        /// The id it was stored under.
        id: Oid,
        /// The id of its content.
        actual: Oid,
    },
    /// An object of the agent's branch is not what git writes for its type.
    #[error("object {id} of the agent's branch is malformed")]
    Malformed {
        /// The object.
        id: Oid,
    },
    /// git could not read or write.
    #[error(transparent)]
    Git(#[from] git2::Error),
}

impl AgentGit {
    /// The agent git directory of a task's worktree.
    pub fn of(common: &Utf8Path, names: &TaskNames) -> Self {
        AgentGit {
            common: common.to_owned(),
            admin: admin::admin_root(common).join(&names.admin),
            root: names.root.clone(),
            through: None,
        }
    }

    /// The same, writing the worktree's `.git` through `through` (its held directory).
    pub fn writing_through(mut self, through: &Utf8Path) -> Self {
        self.through = Some(through.to_owned());
        self
    }

    /// The worktree's `.git`, as crew writes it.
    fn dot_git_file(&self) -> Utf8PathBuf {
        self.through.as_ref().unwrap_or(&self.root).join(".git")
    }

    /// `<admin>/agent`: what the sandbox grants the agent in the repository.
    pub fn dir(&self) -> Utf8PathBuf {
        self.admin.join(AGENT_DIR)
    }

    fn store(&self) -> Utf8PathBuf {
        self.dir().join(STORE_DIR)
    }

    /// Whether the worktree has one (its task started, and its work has not been taken yet).
    pub fn exists(&self) -> bool {
        std::fs::symlink_metadata(self.dir()).is_ok_and(|metadata| metadata.is_dir())
    }

    /// The git directory the worktree's `.git` file must lead to now.
    pub fn expected_git_dir(&self) -> Utf8PathBuf {
        if self.exists() {
            self.dir()
        } else {
            self.admin.clone()
        }
    }

    /// Gives the worktree its agent git directory, or repairs the one it has (a task taken up
    /// again keeps its store: it may hold commits not yet taken). `leader` is the repository;
    /// the worktree's `.git` is switched last, once everything it leads to is in place.
    pub fn arm(&self, leader: &Repository) -> Result<Vec<SecurityFinding>, String> {
        if self.exists() {
            return self.repair();
        }
        let building = self.admin.join(format!("{AGENT_DIR}.new"));
        if std::fs::symlink_metadata(&building).is_ok() {
            remove_contained(&building, &[&self.admin]).map_err(|error| error.to_string())?;
        }
        self.build(leader, &building)
            .map_err(|error| format!("could not make {building}: {error}"))?;
        std::fs::rename(&building, self.dir())
            .map_err(|error| format!("could not make {}: {error}", self.dir()))?;
        write_atomic(&self.dot_git_file(), self.dot_git(&self.dir()).as_bytes())
            .map_err(|error| error.to_string())?;
        Ok(Vec::new())
    }

    fn build(&self, leader: &Repository, dir: &Utf8Path) -> std::io::Result<()> {
        let store = dir.join(STORE_DIR);
        for sub in ["objects/info", "objects/pack", "refs/heads", "refs/tags"] {
            std::fs::create_dir_all(store.join(sub))?;
        }
        let head = read_nofollow(&self.admin.join("HEAD")).map_err(std::io::Error::other)?;
        std::fs::write(dir.join("HEAD"), &head)?;
        if let Ok(index) = read_nofollow(&self.admin.join("index")) {
            std::fs::write(dir.join("index"), index)?;
        }
        // Absolute: libgit2 resolves a relative one against the process's directory.
        std::fs::write(
            dir.join("commondir"),
            format!("{}\n", self.dir().join(STORE_DIR)),
        )?;
        std::fs::write(dir.join("gitdir"), format!("{}/.git\n", self.root))?;
        std::fs::write(
            store.join("objects/info/alternates"),
            self.alternates_text(),
        )?;
        std::fs::write(store.join("packed-refs"), packed_refs(leader)?)?;
        // Detached: a store's HEAD on a branch would count as that branch checked out.
        let tip = leader
            .find_reference(head_ref(&head).unwrap_or("HEAD"))
            .ok()
            .and_then(|reference| reference.target())
            .or_else(|| leader.head().ok().and_then(|head| head.target()))
            .ok_or_else(|| std::io::Error::other("the worktree's branch has no commit"))?;
        std::fs::write(store.join("HEAD"), format!("{tip}\n"))?;
        std::fs::create_dir(store.join("info"))?;
        for (target, link) in self.links(&store) {
            std::os::unix::fs::symlink(&target, link)?;
        }
        Ok(())
    }

    /// The links a store has, `(what it leads to, where it is)`: every one of [`LINKED`] the
    /// repository has, and every entry of the repository's `info/` but what git writes itself.
    fn links(&self, store: &Utf8Path) -> Vec<(Utf8PathBuf, Utf8PathBuf)> {
        let mut links: Vec<(Utf8PathBuf, Utf8PathBuf)> = LINKED
            .iter()
            .map(|name| (self.common.join(name), store.join(name)))
            .filter(|(target, _)| std::fs::symlink_metadata(target).is_ok())
            .collect();
        if let Ok(entries) = self.common.join("info").read_dir_utf8() {
            for entry in entries.flatten() {
                if !INFO_OWN.contains(&entry.file_name()) {
                    links.push((
                        entry.path().to_owned(),
                        store.join("info").join(entry.file_name()),
                    ));
                }
            }
        }
        links
    }

    fn alternates_text(&self) -> String {
        format!("{}\n", self.common.join("objects"))
    }

    fn dot_git(&self, git_dir: &Utf8Path) -> String {
        format!("gitdir: {git_dir}\n")
    }

    /// Puts back every pointer crew wrote that the agent changed: the worktree's `.git`, the
    /// admin entry's and the agent directory's `gitdir` and `commondir` (an unconfined agent
    /// can reach the admin entry's), the store's alternate and its links to the repository's
    /// files. Each change is a finding; what crew reads next goes where crew decided, not where
    /// the agent pointed it.
    pub fn repair(&self) -> Result<Vec<SecurityFinding>, String> {
        let dir = self.dir();
        let store = self.store();
        let mut findings = Vec::new();
        let files = [
            (self.admin.join("commondir"), admin::COMMONDIR.to_owned()),
            (self.admin.join("gitdir"), format!("{}/.git\n", self.root)),
            (self.dot_git_file(), self.dot_git(&dir)),
            (dir.join("gitdir"), format!("{}/.git\n", self.root)),
            (dir.join("commondir"), format!("{store}\n")),
            (
                store.join("objects/info/alternates"),
                self.alternates_text(),
            ),
        ];
        let through = self.through.as_ref().unwrap_or(&self.root);
        for (path, expected) in files {
            let found = read_nofollow(&path).ok();
            if found.as_deref() == Some(expected.as_bytes()) {
                continue;
            }
            if let Some(parent) = path.parent() {
                // Where it fails, the write below says why.
                let _ = std::fs::create_dir_all(parent);
            }
            clear(&path, &self.admin, through)?;
            write_atomic(&path, expected.as_bytes()).map_err(|error| error.to_string())?;
            // Named by the worktree's path, not the handle it was written through.
            let shown = match path.strip_prefix(through) {
                Ok(inside) if self.through.is_some() => self.root.join(inside),
                _ => path,
            };
            findings.push(restored(shown, found.is_some()));
        }
        let info = store.join("info");
        if !std::fs::symlink_metadata(&info).is_ok_and(|metadata| metadata.is_dir()) {
            let present = std::fs::symlink_metadata(&info).is_ok();
            clear(&info, &self.admin, &self.root)?;
            std::fs::create_dir(&info).map_err(|error| format!("{info}: {error}"))?;
            findings.push(restored(info.clone(), present));
        }
        let links = self.links(&store);
        for (target, path) in &links {
            let found = std::fs::read_link(path).ok();
            if found.as_deref() == Some(target.as_std_path()) {
                continue;
            }
            let present = std::fs::symlink_metadata(path).is_ok();
            clear(path, &self.admin, &self.root)?;
            std::os::unix::fs::symlink(target, path)
                .map_err(|error| format!("could not link {path}: {error}"))?;
            findings.push(restored(path.clone(), present));
        }
        // What the agent added where only the repository's files belong.
        let mut planted: Vec<Utf8PathBuf> = LINKED
            .iter()
            .map(|name| store.join(name))
            .filter(|path| std::fs::symlink_metadata(path).is_ok())
            .collect();
        if let Ok(entries) = info.read_dir_utf8() {
            planted.extend(
                entries
                    .flatten()
                    .filter(|entry| !INFO_OWN.contains(&entry.file_name()))
                    .map(|entry| entry.path().to_owned()),
            );
        }
        for path in planted {
            if links.iter().any(|(_, link)| *link == path) {
                continue;
            }
            clear(&path, &self.admin, &self.root)?;
            findings.push(SecurityFinding {
                path,
                change: "added".to_owned(),
                restored: true,
                saved: None,
                on_branch: false,
            });
        }
        Ok(findings)
    }

    /// The tip of the task's branch in the agent's store, if it has one.
    fn tip(&self, branch_ref: &str) -> Option<Oid> {
        let store = self.store();
        if let Ok(bytes) = read_nofollow(&store.join(branch_ref)) {
            return Oid::from_str(String::from_utf8_lossy(&bytes).trim()).ok();
        }
        let packed = read_nofollow(&store.join("packed-refs")).ok()?;
        String::from_utf8_lossy(&packed).lines().find_map(|line| {
            let (id, name) = line.split_once(' ')?;
            (name == branch_ref)
                .then(|| Oid::from_str(id).ok())
                .flatten()
        })
    }

    /// Takes the agent's commits into the repository: every object reachable from the tip of
    /// the task's branch in the agent's store that the repository lacks is read from the
    /// store, written into the repository (which computes its id from its content: one that
    /// does not match is refused), and the task's branch is set to that tip. Objects the
    /// repository already has are never read from the store. Returns the tip.
    pub fn take(&self, leader: &Repository, branch_ref: &str) -> Result<Option<Oid>, TakeError> {
        self.take_from(leader, branch_ref, false)
    }

    /// [`AgentGit::take`], and also every object the agent's index stages (what a worktree
    /// handed to the user without crew's commit may still need).
    pub fn take_with_index(
        &self,
        leader: &Repository,
        branch_ref: &str,
    ) -> Result<Option<Oid>, TakeError> {
        self.take_from(leader, branch_ref, true)
    }

    fn take_from(
        &self,
        leader: &Repository,
        branch_ref: &str,
        with_index: bool,
    ) -> Result<Option<Oid>, TakeError> {
        if !self.exists() {
            return Ok(None);
        }
        let Some(tip) = self.tip(branch_ref) else {
            return Ok(None);
        };
        let theirs = git2::Odb::new()?;
        theirs.add_disk_alternate(self.store().join("objects").as_str())?;
        let mut seen = HashSet::new();
        copy_missing(leader, &theirs, vec![tip], true, &mut seen)?;
        // What the index stages may name objects nobody wrote (an intent to add names the
        // empty blob): taken when there, not required.
        if with_index && let Ok(index) = git2::Index::open(self.dir().join("index").as_std_path()) {
            let staged = index
                .iter()
                .filter(|entry| entry.mode != 0o160000)
                .map(|entry| entry.id)
                .collect();
            copy_missing(leader, &theirs, staged, false, &mut seen)?;
        }
        let current = leader
            .find_reference(branch_ref)
            .ok()
            .and_then(|reference| reference.target());
        if current != Some(tip) {
            leader.reference(branch_ref, tip, true, "crew: the agent's commits")?;
        }
        Ok(Some(tip))
    }

    /// Points the worktree back at its admin entry when its work could not be taken: the user's
    /// git there reads the repository's own files again, never the agent's (a
    /// `config.worktree` with a `core.fsmonitor` would run on their `git status`). The agent's
    /// directory stays where it is, unread, with what could not be taken; the admin entry keeps
    /// its own index.
    pub fn point_back(&self) -> Result<(), String> {
        write_atomic(&self.dot_git_file(), self.dot_git(&self.admin).as_bytes())
            .map_err(|error| error.to_string())
    }

    /// Gives the worktree back its ordinary `.git` once its work is taken: the admin entry gets
    /// the agent's index (every object it names is the repository's now), and the agent's
    /// directory goes.
    pub fn disarm(&self) -> Result<(), String> {
        if !self.exists() {
            return Ok(());
        }
        // Moved, not copied: an index is large, and a crash that loses the move only costs
        // the next status a re-read of the files. Never a link the agent left in its place.
        let index = self.dir().join("index");
        if std::fs::symlink_metadata(&index).is_ok_and(|metadata| metadata.is_file()) {
            std::fs::rename(&index, self.admin.join("index"))
                .map_err(|error| format!("could not move {index}: {error}"))?;
        }
        write_atomic(&self.dot_git_file(), self.dot_git(&self.admin).as_bytes())
            .map_err(|error| error.to_string())?;
        remove_contained(&self.dir(), &[&self.admin])
            .map(drop)
            .map_err(|error| error.to_string())
    }
}

/// Copies into `leader` every object reachable from `roots` that it lacks, from `theirs`, all
/// or nothing: each is read and checked first (its content must hash to its id, and with
/// `required`, an object in neither store is an error; without, it is skipped), and only when
/// every one passed are they written. The repository never holds part of an agent's history:
/// an object it has is whole, which is what lets the walk stop at one.
pub(crate) fn copy_missing(
    leader: &Repository,
    theirs: &git2::Odb<'_>,
    mut todo: Vec<Oid>,
    required: bool,
    seen: &mut HashSet<Oid>,
) -> Result<(), TakeError> {
    let ours = leader.odb()?;
    let mut checked = Vec::new();
    while let Some(id) = todo.pop() {
        if !seen.insert(id) || ours.exists(id) {
            continue;
        }
        let object = match theirs.read(id) {
            Ok(object) => object,
            Err(_) if !required => continue,
            Err(_) => return Err(TakeError::Missing { id }),
        };
        let actual = Oid::hash_object(object.kind(), object.data())?;
        if actual != id {
            return Err(TakeError::Corrupt { id, actual });
        }
        todo.extend(links(id, object.kind(), object.data())?);
        checked.push(id);
    }
    for id in checked {
        let object = theirs.read(id)?;
        ours.write(object.kind(), object.data())?;
    }
    Ok(())
}

/// The objects a commit (its tree and parents), a tree (its entries but submodules' commits)
/// or a tag (its target) names, read from its content as git writes it.
fn links(id: Oid, kind: ObjectType, data: &[u8]) -> Result<Vec<Oid>, TakeError> {
    let malformed = || TakeError::Malformed { id };
    let hex = |text: &[u8]| {
        std::str::from_utf8(text)
            .ok()
            .and_then(|text| Oid::from_str(text).ok())
            .ok_or_else(malformed)
    };
    let mut named = Vec::new();
    match kind {
        ObjectType::Commit | ObjectType::Tag => {
            for line in data.split(|byte| *byte == b'\n') {
                if line.is_empty() {
                    break;
                }
                let field = match kind {
                    ObjectType::Commit => line
                        .strip_prefix(b"tree ")
                        .or_else(|| line.strip_prefix(b"parent ")),
                    _ => line.strip_prefix(b"object "),
                };
                if let Some(field) = field {
                    named.push(hex(field)?);
                }
            }
        }
        ObjectType::Tree => {
            let mut rest = data;
            while !rest.is_empty() {
                let space = rest
                    .iter()
                    .position(|byte| *byte == b' ')
                    .ok_or_else(malformed)?;
                let mode = &rest[..space];
                let nul = rest
                    .iter()
                    .position(|byte| *byte == 0)
                    .ok_or_else(malformed)?;
                let entry = rest.get(nul + 1..nul + 21).ok_or_else(malformed)?;
                // A submodule's commit is in its own repository, not this one.
                if mode != b"160000" {
                    named.push(Oid::from_bytes(entry).map_err(|_| malformed())?);
                }
                rest = &rest[nul + 21..];
            }
        }
        _ => {}
    }
    Ok(named)
}

/// The task branches whose agents are at work or have not been taken yet: their commits are in
/// the agents' own stores, not the repository's. By branch name (`crew/<run>-<task>`), the tip
/// in the store and the store's object directory, for readers that add it as an alternate
/// (read-only, in memory: the conflict radar).
pub fn live_tips(common: &Utf8Path) -> std::collections::HashMap<String, (Oid, Utf8PathBuf)> {
    let mut tips = std::collections::HashMap::new();
    let Ok(entries) = admin::admin_root(common).read_dir_utf8() else {
        return tips;
    };
    for entry in entries.flatten() {
        let agent_git = AgentGit {
            common: common.to_owned(),
            admin: entry.path().to_owned(),
            root: Utf8PathBuf::new(),
            through: None,
        };
        if !agent_git.exists() {
            continue;
        }
        let Some(branch_ref) = read_nofollow(&agent_git.admin.join("HEAD"))
            .ok()
            .and_then(|head| head_ref(&head).map(str::to_owned))
        else {
            continue;
        };
        let (Some(branch), Some(tip)) = (
            branch_ref.strip_prefix("refs/heads/"),
            agent_git.tip(&branch_ref),
        ) else {
            continue;
        };
        tips.insert(branch.to_owned(), (tip, agent_git.store().join("objects")));
    }
    tips
}

/// `ref: refs/heads/x` → `refs/heads/x`.
fn head_ref(head: &[u8]) -> Option<&str> {
    std::str::from_utf8(head).ok()?.trim().strip_prefix("ref: ")
}

/// Every ref of the repository that names an object, as a `packed-refs` file as git writes it:
/// sorted, and each tag that is an annotated tag followed by the object it peels to (`^<id>`),
/// which the `peeled` trait promises (and readers such as GitPython require it to be said).
fn packed_refs(leader: &Repository) -> std::io::Result<String> {
    let mut refs: Vec<(String, Oid)> = leader
        .references()
        .map_err(std::io::Error::other)?
        .filter_map(Result::ok)
        .filter_map(|reference| Some((reference.name().ok()?.to_owned(), reference.target()?)))
        .filter(|(name, _)| name.starts_with("refs/"))
        .collect();
    refs.sort();
    let mut text = String::from("# pack-refs with: peeled sorted \n");
    for (name, id) in refs {
        text.push_str(&format!("{id} {name}\n"));
        if name.starts_with("refs/tags/")
            && let Some(peeled) = peeled_tag(leader, id)
        {
            text.push_str(&format!("^{peeled}\n"));
        }
    }
    Ok(text)
}

/// What the annotated tag `id` (a tag of a tag too) finally names; `None` when `id` is no tag.
fn peeled_tag(leader: &Repository, mut id: Oid) -> Option<Oid> {
    let mut peeled = None;
    // A chain of tags ends; a broken one is said as far as it goes.
    for _ in 0..64 {
        match leader.find_tag(id) {
            Ok(tag) => {
                id = tag.target_id();
                peeled = Some(id);
            }
            Err(_) => break,
        }
    }
    peeled
}

/// Removes whatever is at `path` (never following a link) so that crew's own can be written.
fn clear(path: &Utf8Path, admin: &Utf8Path, root: &Utf8Path) -> Result<(), String> {
    match std::fs::symlink_metadata(path) {
        Ok(metadata) if metadata.is_dir() => remove_contained(path, &[admin, root])
            .map(drop)
            .map_err(|error| error.to_string()),
        Ok(_) => std::fs::remove_file(path).map_err(|error| format!("{path}: {error}")),
        Err(_) => Ok(()),
    }
}

fn restored(path: Utf8PathBuf, existed: bool) -> SecurityFinding {
    SecurityFinding {
        path,
        change: if existed { "modified" } else { "removed" }.to_owned(),
        restored: true,
        saved: None,
        on_branch: false,
    }
}
