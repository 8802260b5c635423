//! Filling a new worktree with the files of a commit, faster than libgit2's checkout.
//!
//! libgit2's checkout costs about twice git's own on a large repository: it re-hashes every
//! object it reads, looks attributes up per file, and uses one thread. When a repository needs
//! none of what attributes and filters do — no `.gitattributes` anywhere, no `core.autocrlf`, no
//! sparse checkout — a checkout is only "inflate each blob, write it with its mode, record its
//! stat in the index". crew does exactly that, over every core:
//!
//! - the blobs are inflated by worker threads, each with its own handle on the object database,
//!   and written straight from libgit2's buffer, once every directory is made (in tree order,
//!   before any file: see `make_directories`);
//! - tasks that start from the same commit at the same moment (the tasks of one run) share one
//!   pass: each blob is inflated once and written into every worktree of the batch;
//! - the index is written with the stat data of the files just written, so `git status` in the
//!   worktree is immediately clean and fast.
//!
//! Anything the fast path does not handle (attributes, filters, an unusual configuration) goes
//! through libgit2's own forced checkout: same result, slower.

use std::collections::HashMap;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, LazyLock, Mutex};
use std::time::Duration;

use camino::{Utf8Path, Utf8PathBuf};
use crew_core::provider::{Progress, ProgressSink};
use git2::{
    FileMode, IndexEntry, IndexTime, ObjectType, Oid, Repository, TreeWalkMode, TreeWalkResult,
};

/// How long the first task to need a commit waits for others of the same run to join it.
const BATCH_WINDOW: Duration = Duration::from_millis(15);
/// How many neighbouring entries a worker takes at a time.
const CHUNK: usize = 64;
/// At most this many worktrees share one pass.
const MAX_BATCH: usize = 16;

/// How often a checkout tells how far it has come.
const PROGRESS_EVERY: Duration = Duration::from_millis(100);

/// Where each worktree being filled tells its progress (see [`populate`]).
static PROGRESS: LazyLock<Mutex<HashMap<Utf8PathBuf, ProgressSink>>> =
    LazyLock::new(Default::default);

/// Fills the worktree at `root` with the files of `commit` and writes its index, telling
/// `progress` how many files are written a few times a second.
pub fn populate(
    root: &Utf8Path,
    common: &Utf8Path,
    commit: Oid,
    progress: Option<&ProgressSink>,
) -> Result<(), git2::Error> {
    let repo = Repository::open(root)?;
    if !fast_path_allowed(&repo, common)? {
        drop(repo);
        return libgit2_checkout(root, progress);
    }
    drop(repo);
    let registered = progress.map(|sink| {
        lock(&PROGRESS).insert(root.to_owned(), sink.clone());
        root
    });
    let filled = join_batch(common, commit, root);
    if let Some(root) = registered {
        lock(&PROGRESS).remove(root);
    }
    filled
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Tells the worktrees of `targets` that `done` of `total` files are written.
fn tell_progress(targets: &[Utf8PathBuf], done: usize, total: usize) {
    let sinks = lock(&PROGRESS);
    for target in targets {
        if let Some(sink) = sinks.get(target) {
            sink.tell(Progress::Checkout {
                done: done.min(total) as u64,
                total: total as u64,
            });
        }
    }
}

/// libgit2's forced checkout of HEAD: handles attributes, filters and everything else.
fn libgit2_checkout(root: &Utf8Path, progress: Option<&ProgressSink>) -> Result<(), git2::Error> {
    let repo = Repository::open(root)?;
    let mut builder = git2::build::CheckoutBuilder::new();
    builder.force();
    if let Some(sink) = progress {
        let mut told = std::time::Instant::now();
        builder.progress(move |_, done, total| {
            if told.elapsed() >= PROGRESS_EVERY {
                told = std::time::Instant::now();
                sink.tell(Progress::Checkout {
                    done: done as u64,
                    total: total as u64,
                });
            }
        });
    }
    repo.checkout_head(Some(&mut builder))
}

/// The fast path writes files byte for byte: only when no configuration would transform them.
/// (A `.gitattributes` in the commit is found when its tree is listed, in [`fill`].)
fn fast_path_allowed(repo: &Repository, common: &Utf8Path) -> Result<bool, git2::Error> {
    let config = repo.config()?;
    let flag = |name: &str| config.get_bool(name).ok();
    let text = |name: &str| config.get_string(name).ok();
    let transforms = text("core.autocrlf").is_some_and(|value| value != "false")
        || text("core.eol").is_some()
        || flag("core.symlinks") == Some(false)
        || flag("core.filemode") == Some(false)
        || flag("core.sparseCheckout") == Some(true)
        || text("core.attributesFile").is_some()
        || text("filter.lfs.process").is_some();
    Ok(!(transforms
        || common.join("info/attributes").exists()
        || global_attributes_file().exists()))
}

/// What a batch did for one worktree.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Filled {
    Written,
    /// The commit has attributes: libgit2 must check it out, with its filters.
    NeedsFilters,
    Failed(String),
}

fn global_attributes_file() -> Utf8PathBuf {
    let config_home = std::env::var("XDG_CONFIG_HOME")
        .ok()
        .filter(|value| !value.is_empty())
        .map(Utf8PathBuf::from)
        .or_else(|| {
            std::env::var("HOME")
                .ok()
                .map(|home| Utf8PathBuf::from(home).join(".config"))
        })
        .unwrap_or_default();
    config_home.join("git/attributes")
}

/// Worktrees waiting to be filled from one commit of one repository.
#[derive(Debug, Default)]
struct Batch {
    state: Mutex<BatchState>,
    finished: Condvar,
}

#[derive(Debug, Default)]
struct BatchState {
    targets: Vec<Utf8PathBuf>,
    closed: bool,
    results: HashMap<Utf8PathBuf, Filled>,
    done: bool,
}

type BatchKey = (Utf8PathBuf, Oid);

static OPEN_BATCHES: LazyLock<Mutex<HashMap<BatchKey, Arc<Batch>>>> =
    LazyLock::new(Default::default);

/// Joins the open batch for `commit`, or opens one and runs it after a short window.
fn join_batch(common: &Utf8Path, commit: Oid, root: &Utf8Path) -> Result<(), git2::Error> {
    let key = (common.to_owned(), commit);
    let (batch, leads) = {
        let mut open = OPEN_BATCHES
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        match open.get(&key) {
            Some(batch) => {
                let mut state = batch
                    .state
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
                state.targets.push(root.to_owned());
                if state.targets.len() >= MAX_BATCH {
                    state.closed = true;
                    drop(state);
                    let batch = open.remove(&key).expect("the batch is open");
                    (batch, false)
                } else {
                    drop(state);
                    (batch.clone(), false)
                }
            }
            None => {
                let batch = Arc::new(Batch::default());
                batch
                    .state
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .targets
                    .push(root.to_owned());
                open.insert(key.clone(), batch.clone());
                (batch, true)
            }
        }
    };
    if leads {
        std::thread::sleep(BATCH_WINDOW);
        let targets = {
            let mut open = OPEN_BATCHES
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            if open
                .get(&key)
                .is_some_and(|current| Arc::ptr_eq(current, &batch))
            {
                open.remove(&key);
            }
            let mut state = batch
                .state
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            state.closed = true;
            state.targets.clone()
        };
        let results = fill(common, commit, &targets);
        let mut state = batch
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        state.results = results;
        state.done = true;
        batch.finished.notify_all();
    }
    let mut state = batch
        .state
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    while !state.done {
        state = batch
            .finished
            .wait(state)
            .unwrap_or_else(|poisoned| poisoned.into_inner());
    }
    let filled = state.results.remove(root);
    drop(state);
    match filled {
        Some(Filled::Written) => Ok(()),
        Some(Filled::NeedsFilters) => libgit2_checkout(root, None),
        Some(Filled::Failed(message)) => Err(git2::Error::from_str(&message)),
        None => Err(git2::Error::from_str(
            "the checkout batch lost this worktree",
        )),
    }
}

/// One file of the commit.
struct Entry {
    path: Vec<u8>,
    id: Oid,
    mode: i32,
}

/// Fills every target from one pass over the commit. One result per target.
fn fill(common: &Utf8Path, commit: Oid, targets: &[Utf8PathBuf]) -> HashMap<Utf8PathBuf, Filled> {
    crate::leader::fast_reads();

    let every = |filled: Filled| -> HashMap<Utf8PathBuf, Filled> {
        targets
            .iter()
            .map(|target| (target.clone(), filled.clone()))
            .collect()
    };
    let entries = match list_entries(common, commit) {
        Ok(entries) => entries,
        Err(error) => return every(Filled::Failed(error.to_string())),
    };
    let has_attributes = entries.iter().any(|entry| {
        entry.path.rsplit(|&byte| byte == b'/').next() == Some(b".gitattributes".as_slice())
    });
    if has_attributes {
        return every(Filled::NeedsFilters);
    }
    let failed: Vec<Mutex<Option<String>>> = targets.iter().map(|_| Mutex::new(None)).collect();
    let fail = |target: usize, message: String| {
        let mut slot = failed[target]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        slot.get_or_insert(message);
    };
    let is_failed = |target: usize| {
        failed[target]
            .lock()
            .map(|slot| slot.is_some())
            .unwrap_or(true)
    };

    // Every directory before any file: see `make_directories`.
    make_directories(&entries, targets, &fail, &is_failed);
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let workers = std::thread::available_parallelism()
        .map_or(2, |count| count.get())
        .clamp(1, 8);
    let (finished, reporter_wait) = std::sync::mpsc::channel::<()>();
    let collected: Vec<Vec<(usize, usize, IndexEntry)>> = std::thread::scope(|scope| {
        // Tells the worktrees' progress until the workers are done (the channel closes).
        let (handed_out, total) = (&next, entries.len());
        let watched = {
            let sinks = lock(&PROGRESS);
            targets.iter().any(|target| sinks.contains_key(target))
        };
        scope.spawn(move || {
            if !watched {
                return;
            }
            while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                reporter_wait.recv_timeout(PROGRESS_EVERY)
            {
                tell_progress(targets, handed_out.load(Ordering::Relaxed), total);
            }
        });
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                scope.spawn(|| {
                    let mut done = Vec::new();
                    let repo = match Repository::open(common) {
                        Ok(repo) => repo,
                        Err(error) => {
                            for target in 0..targets.len() {
                                fail(target, error.to_string());
                            }
                            stop.store(true, Ordering::SeqCst);
                            return done;
                        }
                    };
                    let Ok(odb) = repo.odb() else {
                        stop.store(true, Ordering::SeqCst);
                        return done;
                    };
                    // Workers take runs of neighbouring entries: files of one directory go to
                    // one worker, and workers do not contend for the same directory.
                    let mut chunk = 0..0;
                    loop {
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                        let index = match chunk.next() {
                            Some(index) => index,
                            None => {
                                let start = next.fetch_add(CHUNK, Ordering::Relaxed);
                                chunk = start..(start + CHUNK).min(entries.len());
                                match chunk.next() {
                                    Some(index) => index,
                                    None => break,
                                }
                            }
                        };
                        let Some(entry) = entries.get(index) else {
                            break;
                        };
                        // The blob is written straight from libgit2's buffer, never copied.
                        let object = if entry.mode == i32::from(FileMode::Commit) {
                            None
                        } else {
                            match odb.read(entry.id) {
                                Ok(object) => Some(object),
                                Err(error) => {
                                    for target in 0..targets.len() {
                                        fail(target, error.to_string());
                                    }
                                    stop.store(true, Ordering::SeqCst);
                                    break;
                                }
                            }
                        };
                        let data = object.as_ref().map(git2::OdbObject::data);
                        for (target_index, target) in targets.iter().enumerate() {
                            if is_failed(target_index) {
                                continue;
                            }
                            match write_entry(target, entry, data) {
                                Ok(index_entry) => done.push((target_index, index, index_entry)),
                                Err(message) => fail(target_index, message),
                            }
                        }
                    }
                    done
                })
            })
            .collect();
        let collected = handles
            .into_iter()
            .map(|handle| handle.join().unwrap_or_default())
            .collect();
        drop(finished);
        collected
    });
    tell_progress(targets, entries.len(), entries.len());

    let mut per_target: Vec<Vec<(usize, IndexEntry)>> =
        targets.iter().map(|_| Vec::new()).collect();
    for (target, index, entry) in collected.into_iter().flatten() {
        per_target[target].push((index, entry));
    }
    let mut results = HashMap::new();
    for (target_index, target) in targets.iter().enumerate() {
        let failure = failed[target_index]
            .lock()
            .map(|slot| slot.clone())
            .unwrap_or_else(|_| Some("a checkout worker failed".into()));
        let result = match failure {
            Some(message) => Err(message),
            None => {
                let mut written = std::mem::take(&mut per_target[target_index]);
                written.sort_by_key(|(index, _)| *index);
                if written.len() != entries.len() {
                    Err(format!(
                        "only {} of {} files were written",
                        written.len(),
                        entries.len()
                    ))
                } else {
                    write_index(target, written.into_iter().map(|(_, entry)| entry))
                        .map_err(|error| error.to_string())
                }
            }
        };
        let filled = match result {
            Ok(()) => Filled::Written,
            Err(message) => Filled::Failed(message),
        };
        results.insert(target.clone(), filled);
    }
    results
}

/// Makes every directory of `entries` in every target, in tree order, before any file is
/// written. Workers that made them as they reached them (overlapping with the writes) were no
/// faster on a file system as it was left, and a quarter to two fifths slower right after a mass
/// deletion, when ext4 passes over every inode freed in the last minute at each new file of
/// the same block group. Made together first, the checkout meets far less of that walk (where
/// the directories, and so their files, land among the block groups is the likeliest reason;
/// BENCHMARKS.md, "Creation after a mass deletion").
fn make_directories(
    entries: &[Entry],
    targets: &[Utf8PathBuf],
    fail: &dyn Fn(usize, String),
    is_failed: &dyn Fn(usize) -> bool,
) {
    let mut made: Option<&[u8]> = None;
    for entry in entries {
        let Some(parent) = entry
            .path
            .iter()
            .rposition(|&byte| byte == b'/')
            .map(|slash| &entry.path[..slash])
        else {
            continue;
        };
        // Tree order puts a directory's files next to each other.
        if made == Some(parent) {
            continue;
        }
        for (index, target) in targets.iter().enumerate() {
            if is_failed(index) {
                continue;
            }
            let dir = target.as_std_path().join(bytes_path(parent));
            if let Err(error) = std::fs::create_dir_all(&dir) {
                fail(
                    index,
                    format!("failed to create {}: {error}", dir.display()),
                );
            }
        }
        made = Some(parent);
    }
}

/// Every file of the commit's tree, in tree order.
fn list_entries(common: &Utf8Path, commit: Oid) -> Result<Vec<Entry>, git2::Error> {
    let repo = Repository::open(common)?;
    let tree = repo.find_commit(commit)?.tree()?;
    let mut entries = Vec::new();
    tree.walk(TreeWalkMode::PreOrder, |parent, entry| {
        if entry.kind() == Some(ObjectType::Tree) {
            return TreeWalkResult::Ok;
        }
        let mut path = parent.as_bytes().to_vec();
        path.extend_from_slice(entry.name_bytes());
        entries.push(Entry {
            path,
            id: entry.id(),
            mode: entry.filemode(),
        });
        TreeWalkResult::Ok
    })?;
    Ok(entries)
}

fn bytes_path(bytes: &[u8]) -> &std::path::Path {
    std::path::Path::new(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(bytes))
}

/// Writes one entry into one worktree and returns its index entry with the file's stat data.
fn write_entry(
    target: &Utf8Path,
    entry: &Entry,
    data: Option<&[u8]>,
) -> Result<IndexEntry, String> {
    let path = target.as_std_path().join(bytes_path(&entry.path));
    let error =
        |what: &str, error: std::io::Error| format!("failed to {what} {}: {error}", path.display());
    let mode = entry.mode;
    let metadata = if mode == i32::from(FileMode::Link) {
        let link_target = bytes_path(data.unwrap_or_default());
        std::os::unix::fs::symlink(link_target, &path)
            .map_err(|source| error("create the symlink", source))?;
        std::fs::symlink_metadata(&path).map_err(|source| error("inspect", source))?
    } else if mode == i32::from(FileMode::Commit) {
        // A submodule: an empty directory, as git leaves an uninitialized one.
        std::fs::create_dir_all(&path).map_err(|source| error("create", source))?;
        return Ok(index_entry(entry, None));
    } else {
        let permissions = if mode == i32::from(FileMode::BlobExecutable) {
            0o777
        } else {
            0o666
        };
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(permissions)
            .open(&path)
            .map_err(|source| error("create", source))?;
        file.write_all(data.unwrap_or_default())
            .map_err(|source| error("write", source))?;
        file.metadata().map_err(|source| error("inspect", source))?
    };
    Ok(index_entry(entry, Some(&metadata)))
}

fn index_entry(entry: &Entry, metadata: Option<&std::fs::Metadata>) -> IndexEntry {
    // The index stores 32-bit fields; git truncates the same way.
    let time = |seconds: i64, nanoseconds: i64| IndexTime::new(seconds as i32, nanoseconds as u32);
    let (ctime, mtime, dev, ino, uid, gid, size) = match metadata {
        Some(metadata) => (
            time(metadata.ctime(), metadata.ctime_nsec()),
            time(metadata.mtime(), metadata.mtime_nsec()),
            metadata.dev() as u32,
            metadata.ino() as u32,
            metadata.uid(),
            metadata.gid(),
            metadata.len() as u32,
        ),
        None => (time(0, 0), time(0, 0), 0, 0, 0, 0, 0),
    };
    IndexEntry {
        ctime,
        mtime,
        dev,
        ino,
        mode: entry.mode as u32,
        uid,
        gid,
        file_size: size,
        id: entry.id,
        flags: entry.path.len().min(0xfff) as u16,
        flags_extended: 0,
        path: entry.path.clone(),
    }
}

/// Writes the worktree's index from the entries just written.
fn write_index(
    target: &Utf8Path,
    entries: impl Iterator<Item = IndexEntry>,
) -> Result<(), git2::Error> {
    let repo = Repository::open(target)?;
    let mut index = repo.index()?;
    index.clear()?;
    for entry in entries {
        index.add(&entry)?;
    }
    index.write()
}
