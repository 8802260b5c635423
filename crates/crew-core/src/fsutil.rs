//! File helpers every state write goes through: atomic replacement, no-follow opens and
//! directories that must be real directories.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::time::{Duration, Instant};

use camino::{Utf8Path, Utf8PathBuf};

/// A file crew failed to read or write, or refused to touch.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The path is a symlink.
    #[error(
        "refusing to use {path}: it is a symlink; crew never reads or writes state through links"
    )]
    Symlink {
        /// The link.
        path: Utf8PathBuf,
    },
    /// The path is something else than was asked for.
    #[error("refusing to use {path}: it exists but is not a {expected}")]
    WrongType {
        /// The path.
        path: Utf8PathBuf,
        /// `directory` or `file`.
        expected: &'static str,
    },
    /// A directory could not be made.
    #[error("failed to create directory {path}")]
    CreateDir {
        /// The directory.
        path: Utf8PathBuf,
        /// Why it could not be made.
        #[source]
        source: io::Error,
    },
    /// A file could not be read.
    #[error("failed to read {path}")]
    Read {
        /// The file.
        path: Utf8PathBuf,
        /// Why it could not be read.
        #[source]
        source: io::Error,
    },
    /// A file could not be written.
    #[error("failed to write {path}")]
    Write {
        /// The file.
        path: Utf8PathBuf,
        /// Why it could not be written.
        #[source]
        source: io::Error,
    },
}

/// Makes `base/<parents…>/<name>` through directory handles, never by path after a check: from
/// `base` down, each level is opened without following a link (`openat` with `O_NOFOLLOW`) and
/// made (mode 0700) when missing, so a level swapped for a link at any moment is refused
/// rather than followed out of `base`. `name` itself must not exist (it is made with mode 0777
/// under the umask, as `create_dir` does): an existing one is `AlreadyExists`. Returns its path,
/// and the directory itself held open (see [`crate::paths::HeldDir`]) for filling it.
pub fn create_dir_beneath(
    base: &Utf8Path,
    parents: &[&str],
    name: &str,
) -> Result<(Utf8PathBuf, crate::paths::HeldDir), FileError> {
    use rustix::fs::{Mode, OFlags};
    let (dir, mut path) = open_dirs_beneath(base, parents)?;
    path.push(name);
    let failed = |errno: rustix::io::Errno| FileError::CreateDir {
        path: path.clone(),
        source: errno.into(),
    };
    rustix::fs::mkdirat(&dir, name, Mode::from_raw_mode(0o777)).map_err(failed)?;
    let made = rustix::fs::openat(
        &dir,
        name,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(failed)?;
    Ok((path, crate::paths::HeldDir::from_fd(made)))
}

/// Renames `from` to `to`, both beneath `base`, through directory handles: each one's parent
/// is reached from `base` down without following a link (`to`'s made when missing), and the
/// rename is `renameat` between the two handles, refused where `to` exists. A level swapped for
/// a link at any moment is refused rather than followed out of `base`.
pub fn rename_beneath(base: &Utf8Path, from: &Utf8Path, to: &Utf8Path) -> Result<(), FileError> {
    let split = |path: &Utf8Path| -> Result<(Vec<String>, String), FileError> {
        let relative = path
            .strip_prefix(base)
            .ok()
            .filter(|relative| {
                relative
                    .components()
                    .all(|part| matches!(part, camino::Utf8Component::Normal(_)))
            })
            .ok_or_else(|| FileError::Write {
                path: path.to_owned(),
                source: io::Error::new(io::ErrorKind::InvalidInput, format!("not beneath {base}")),
            })?;
        let mut levels: Vec<String> = relative.iter().map(str::to_owned).collect();
        let name = levels.pop().ok_or_else(|| FileError::Write {
            path: path.to_owned(),
            source: io::Error::new(io::ErrorKind::InvalidInput, "nothing to rename"),
        })?;
        Ok((levels, name))
    };
    let (from_levels, from_name) = split(from)?;
    let (to_levels, to_name) = split(to)?;
    fn levels(levels: &[String]) -> Vec<&str> {
        levels.iter().map(String::as_str).collect()
    }
    let (from_dir, _) = open_dirs_beneath(base, &levels(&from_levels))?;
    let (to_dir, _) = open_dirs_beneath(base, &levels(&to_levels))?;
    rustix::fs::renameat_with(
        &from_dir,
        from_name.as_str(),
        &to_dir,
        to_name.as_str(),
        rustix::fs::RenameFlags::NOREPLACE,
    )
    .map_err(|errno| FileError::Write {
        path: to.to_owned(),
        source: errno.into(),
    })
}

/// [`create_dir_beneath`] for a directory that may exist already (then it must be a real one,
/// reached through real ones). Returns its path.
pub fn ensure_dirs_beneath(base: &Utf8Path, levels: &[&str]) -> Result<Utf8PathBuf, FileError> {
    open_dirs_beneath(base, levels).map(|(_, path)| path)
}

/// Opens `base`, then each of `levels` beneath it (made, mode 0700, when missing), never
/// following a link: the last level's handle and path.
fn open_dirs_beneath(
    base: &Utf8Path,
    levels: &[&str],
) -> Result<(OwnedFd, Utf8PathBuf), FileError> {
    use rustix::fs::{Mode, OFlags};
    let directory = OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let mut path = base.to_owned();
    let refused = |path: &Utf8Path, errno: rustix::io::Errno| {
        if errno == rustix::io::Errno::LOOP || errno == rustix::io::Errno::NOTDIR {
            FileError::Symlink {
                path: path.to_owned(),
            }
        } else {
            FileError::CreateDir {
                path: path.to_owned(),
                source: errno.into(),
            }
        }
    };
    let mut dir = rustix::fs::open(base.as_std_path(), directory, Mode::empty())
        .map_err(|errno| refused(&path, errno))?;
    for level in levels {
        path.push(level);
        match rustix::fs::mkdirat(&dir, *level, Mode::from_raw_mode(0o700)) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
            Err(errno) => return Err(refused(&path, errno)),
        }
        dir = rustix::fs::openat(&dir, *level, directory, Mode::empty())
            .map_err(|errno| refused(&path, errno))?;
    }
    Ok((dir, path))
}

/// Makes sure `path` is a real directory (created with mode 0700 when missing), not a symlink or
/// a file. Parents are not created: callers build the tree top-down, checking every level.
pub fn ensure_real_dir(path: &Utf8Path) -> Result<(), FileError> {
    match std::fs::symlink_metadata(path) {
        Ok(metadata) if metadata.file_type().is_symlink() => Err(FileError::Symlink {
            path: path.to_owned(),
        }),
        Ok(metadata) if metadata.is_dir() => Ok(()),
        Ok(_) => Err(FileError::WrongType {
            path: path.to_owned(),
            expected: "directory",
        }),
        Err(error) if error.kind() == io::ErrorKind::NotFound => {
            match std::fs::DirBuilder::new().mode(0o700).create(path) {
                Ok(()) => Ok(()),
                // Another process created it between our look and our create: check what it is.
                Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {
                    ensure_existing_real_dir(path)
                }
                Err(source) => Err(FileError::CreateDir {
                    path: path.to_owned(),
                    source,
                }),
            }
        }
        Err(source) => Err(FileError::Read {
            path: path.to_owned(),
            source,
        }),
    }
}

/// Asks the file system to place each directory made in `dir` away from the others, as it
/// places users' home directories (`chattr +T`, the top of a hierarchy for ext4's Orlov
/// allocator): a run's worktrees (a pooled worktree, a run's state) then go to a block group
/// with room and few directories, instead of beside what was deleted last, whose freed inodes
/// ext4 passes over one by one at every new file for a minute or more. Measured: a 20,000-file
/// checkout right after eight such worktrees were deleted took 1.1 s placed so, 4.3 s beside
/// them. Only a hint, and not inherited: where the file system has no such flag nothing
/// changes.
pub fn spread_apart(dir: &Utf8Path) {
    use rustix::fs::{IFlags, Mode, OFlags};
    let Ok(handle) = rustix::fs::open(
        dir.as_std_path(),
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) else {
        return;
    };
    if let Ok(flags) = rustix::fs::ioctl_getflags(&handle)
        && !flags.contains(IFlags::TOPDIR)
    {
        // Only where new directories are placed; a file system without the flag works the same.
        let _ = rustix::fs::ioctl_setflags(&handle, flags | IFlags::TOPDIR);
    }
}

/// Checks that an existing `path` is a real directory; `Ok(false)` when it does not exist.
pub fn real_dir_exists(path: &Utf8Path) -> Result<bool, FileError> {
    match std::fs::symlink_metadata(path) {
        Ok(metadata) if metadata.file_type().is_symlink() => Err(FileError::Symlink {
            path: path.to_owned(),
        }),
        Ok(metadata) if metadata.is_dir() => Ok(true),
        Ok(_) => Err(FileError::WrongType {
            path: path.to_owned(),
            expected: "directory",
        }),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(source) => Err(FileError::Read {
            path: path.to_owned(),
            source,
        }),
    }
}

fn ensure_existing_real_dir(path: &Utf8Path) -> Result<(), FileError> {
    if real_dir_exists(path)? {
        Ok(())
    } else {
        Err(FileError::WrongType {
            path: path.to_owned(),
            expected: "directory",
        })
    }
}

/// Opens `path` for reading without following a symlink at the last component.
pub fn open_nofollow(path: &Utf8Path) -> Result<File, FileError> {
    // Opened without blocking, so that a FIFO (or a device) planted where a file is expected
    // is refused instead of waiting for a writer for ever; a regular file reads as usual.
    let file = OpenOptions::new()
        .read(true)
        .custom_flags((rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::NONBLOCK).bits() as i32)
        .open(path)
        .map_err(|source| classify_open_error(path, source, false))?;
    let metadata = file.metadata().map_err(|source| FileError::Read {
        path: path.to_owned(),
        source,
    })?;
    if !metadata.is_file() {
        return Err(FileError::WrongType {
            path: path.to_owned(),
            expected: "regular file",
        });
    }
    rustix::fs::fcntl_setfl(&file, rustix::fs::OFlags::empty()).map_err(|errno| {
        FileError::Read {
            path: path.to_owned(),
            source: errno.into(),
        }
    })?;
    Ok(file)
}

/// Reads a whole file without following a symlink at the last component.
pub fn read_nofollow(path: &Utf8Path) -> Result<Vec<u8>, FileError> {
    let mut file = open_nofollow(path)?;
    let mut contents = Vec::new();
    io::Read::read_to_end(&mut file, &mut contents).map_err(|source| FileError::Read {
        path: path.to_owned(),
        source,
    })?;
    Ok(contents)
}

/// [`read_nofollow`] for a file [`write_exchanging`] or [`write_replace`] keeps: the contents,
/// and whether the file stayed the same while it was read (its size and change time before
/// and after). A reader that opened the file two writes ago may otherwise read it while it is
/// rewritten, part old and part new; one that gets `false` reads again.
pub fn read_nofollow_steady(path: &Utf8Path) -> Result<(Vec<u8>, bool), FileError> {
    let read_error = |source| FileError::Read {
        path: path.to_owned(),
        source,
    };
    let mut file = open_nofollow(path)?;
    let stamp = |file: &File| {
        file.metadata()
            .map(|metadata| (metadata.len(), metadata.ctime(), metadata.ctime_nsec()))
    };
    let before = stamp(&file).map_err(read_error)?;
    let mut contents = Vec::new();
    io::Read::read_to_end(&mut file, &mut contents).map_err(read_error)?;
    let after = stamp(&file).map_err(read_error)?;
    let steady = before == after && after.0 == contents.len() as u64;
    Ok((contents, steady))
}

/// Opens (creating when missing, mode 0600) a file for appending, refusing a symlink.
pub fn open_append_nofollow(path: &Utf8Path) -> Result<File, FileError> {
    OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(path)
        .map_err(|source| classify_open_error(path, source, true))
}

/// Opens (creating when missing, mode 0600) a file for reading and writing in place, refusing a
/// symlink. Used for lock files, which are never replaced.
pub fn open_rw_nofollow(path: &Utf8Path) -> Result<File, FileError> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(path)
        .map_err(|source| classify_open_error(path, source, true))
}

/// A failed open: a symlink refused by `O_NOFOLLOW` (ELOOP), or a read or write failure.
fn classify_open_error(path: &Utf8Path, source: io::Error, writing: bool) -> FileError {
    let path = path.to_owned();
    if source.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error()) {
        FileError::Symlink { path }
    } else if writing {
        FileError::Write { path, source }
    } else {
        FileError::Read { path, source }
    }
}

/// Replaces `path` with `contents` atomically: a temp file in the same directory is written and
/// synced, renamed over the target, and the directory is synced. A reader (or a crash) sees the
/// complete old file or the complete new one, never a mix. A symlink at `path` is refused, not
/// written through.
pub fn write_atomic(path: &Utf8Path, contents: &[u8]) -> Result<(), FileError> {
    replace_file(path, contents, true)
}

/// [`write_exchanging`] without waiting for the disk, for a file that describes the present (a
/// live host's listing) and that a crash makes stale anyway: readers see the old content or the
/// new (but see [`write_exchanging`] on a reader that waits between opening and reading); after
/// a power loss they may find either, or an empty file, and must treat a file they cannot parse
/// as absent. One writer at a time.
pub fn write_replace(path: &Utf8Path, contents: &[u8]) -> Result<(), FileError> {
    exchange_file(path, contents, false)
}

/// [`write_atomic`] for a file that is rewritten often by one writer at a time (the caller holds
/// the lock that guards it): the new content goes to a spare file beside it (`.<name>.spare`),
/// which is then exchanged with the file in one step (`renameat2` with `RENAME_EXCHANGE`). The
/// spare keeps the previous content and is rewritten by the next write, so once both exist no
/// write creates or deletes a file; on a file system that has freed many files recently, making
/// one costs far more than writing it (ext4 looks for an inode it may reuse).
///
/// A reader sees the complete old file or the complete new one, like [`write_atomic`]'s, with
/// one exception: a reader that opened the file and only reads it after two more writes may
/// find it being rewritten (it has become the spare). Readers use [`read_nofollow_steady`] and
/// read again when the file changed under them. Where the file system cannot exchange two names, the spare is renamed
/// over the file instead.
pub fn write_exchanging(path: &Utf8Path, contents: &[u8]) -> Result<(), FileError> {
    exchange_file(path, contents, true)
}

fn exchange_file(path: &Utf8Path, contents: &[u8], durable: bool) -> Result<(), FileError> {
    let write_error = |source| FileError::Write {
        path: path.to_owned(),
        source,
    };
    check_replaceable(path)?;
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(write_error(io::Error::new(
            io::ErrorKind::InvalidInput,
            "path has no parent directory",
        )));
    };
    let spare_path = dir.join(spare_name(name));
    let spare = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(&spare_path);
    let spare = match spare {
        Ok(spare) => spare,
        // A symlink or anything else in the spare's place: not written through; replaced the
        // way every other state file is.
        Err(_) => return replace_file(path, contents, durable),
    };
    let alone = spare
        .metadata()
        .is_ok_and(|metadata| metadata.is_file() && metadata.nlink() == 1);
    if !alone {
        // Linked from elsewhere: writing it would write there too. Its name goes; the link
        // stays whole.
        drop(spare);
        if let Err(source) = std::fs::remove_file(&spare_path) {
            return Err(write_error(source));
        }
        return replace_file(path, contents, durable);
    }
    let result = (|| {
        // Emptied first: a reader cut short by this write (see `read_nofollow_steady`) reads
        // a part of the new content only, never the old content's tail after it.
        spare.set_len(0)?;
        std::os::unix::fs::FileExt::write_all_at(&spare, contents, 0)?;
        if durable {
            spare.sync_all()?;
        }
        drop(spare);
        match rustix::fs::renameat_with(
            rustix::fs::CWD,
            spare_path.as_std_path(),
            rustix::fs::CWD,
            path.as_std_path(),
            rustix::fs::RenameFlags::EXCHANGE,
        ) {
            Ok(()) => {}
            // No file yet (its first write), or a file system that cannot exchange names.
            Err(rustix::io::Errno::NOENT | rustix::io::Errno::INVAL) => {
                std::fs::rename(&spare_path, path)?
            }
            Err(error) => return Err(io::Error::from(error)),
        }
        if durable { sync_dir(dir) } else { Ok(()) }
    })();
    result.map_err(write_error)
}

/// The spare file [`write_exchanging`] keeps beside a file named `name`.
pub fn spare_name(name: &str) -> String {
    format!(".{name}.spare")
}

/// Refuses to replace a symlink or anything but a regular file at `path`; a missing one is fine.
fn check_replaceable(path: &Utf8Path) -> Result<(), FileError> {
    match std::fs::symlink_metadata(path) {
        Ok(metadata) if metadata.file_type().is_symlink() => Err(FileError::Symlink {
            path: path.to_owned(),
        }),
        Ok(metadata) if !metadata.is_file() => Err(FileError::WrongType {
            path: path.to_owned(),
            expected: "regular file",
        }),
        Ok(_) => Ok(()),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(FileError::Write {
            path: path.to_owned(),
            source,
        }),
    }
}

fn replace_file(path: &Utf8Path, contents: &[u8], durable: bool) -> Result<(), FileError> {
    let write_error = |source| FileError::Write {
        path: path.to_owned(),
        source,
    };
    check_replaceable(path)?;
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(write_error(io::Error::new(
            io::ErrorKind::InvalidInput,
            "path has no parent directory",
        )));
    };
    let temp_path = dir.join(format!(
        ".{name}.tmp-{}-{}",
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    ));
    let result = (|| {
        let mut temp = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&temp_path)?;
        temp.write_all(contents)?;
        if durable {
            temp.sync_all()?;
        }
        drop(temp);
        std::fs::rename(&temp_path, path)?;
        if durable { sync_dir(dir) } else { Ok(()) }
    })();
    if let Err(source) = result {
        // Best effort: the temp file carries no state anyone reads.
        let _ = std::fs::remove_file(&temp_path);
        return Err(write_error(source));
    }
    Ok(())
}

/// An exclusive lock on a lock file, held until dropped.
///
/// Built on std's `File::try_lock` (an `flock` on its own open file description), so it
/// excludes other threads of this process exactly as it excludes other processes.
#[derive(Debug)]
pub struct FileLock {
    _file: File,
}

/// A lock that could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// The lock file could not be opened.
    #[error("failed to open lock file {path}")]
    Open {
        /// The lock file.
        path: Utf8PathBuf,
        /// Why it could not be opened.
        #[source]
        source: FileError,
    },
    /// The lock could not be taken.
    #[error("failed to lock {path}")]
    Lock {
        /// The lock file.
        path: Utf8PathBuf,
        /// Why it could not be taken.
        #[source]
        source: io::Error,
    },
    /// Another process held the lock for longer than crew waits.
    #[error(
        "timed out after {waited:?} waiting for the lock {path}; another crew process holds it"
    )]
    Timeout {
        /// The lock file.
        path: Utf8PathBuf,
        /// How long crew waited.
        waited: Duration,
    },
}

impl FileLock {
    /// Locks `path` (created when missing, never replaced or deleted), waiting up to `timeout`
    /// for another holder to let go.
    pub fn acquire(path: &Utf8Path, timeout: Duration) -> Result<Self, LockError> {
        let file = open_rw_nofollow(path).map_err(|source| LockError::Open {
            path: path.to_owned(),
            source,
        })?;
        let started = Instant::now();
        let mut pause = Duration::from_millis(1);
        loop {
            match file.try_lock() {
                Ok(()) => return Ok(FileLock { _file: file }),
                Err(std::fs::TryLockError::WouldBlock) => {
                    if started.elapsed() >= timeout {
                        return Err(LockError::Timeout {
                            path: path.to_owned(),
                            waited: started.elapsed(),
                        });
                    }
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(20));
                }
                Err(std::fs::TryLockError::Error(source)) => {
                    return Err(LockError::Lock {
                        path: path.to_owned(),
                        source,
                    });
                }
            }
        }
    }
}

/// Flushes a directory's entries (a rename or a new file) to disk.
pub fn sync_dir(dir: &Utf8Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// `true` for the temp files `write_atomic` leaves behind when killed mid-write.
pub fn is_atomic_temp_name(name: &str) -> bool {
    name.starts_with('.') && name.contains(".tmp-")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_made_beneath_a_root_never_goes_through_a_link() {
        let (_dir, root) = temp_dir();
        let outside = root.join("outside");
        std::fs::create_dir(&outside).unwrap();
        let base = root.join("repo");
        std::fs::create_dir(&base).unwrap();
        let (made, held) = create_dir_beneath(&base, &[".worktrees", "run"], "task").unwrap();
        assert_eq!(made, base.join(".worktrees/run/task"));
        assert!(made.is_dir());
        // Held: what is written through it lands there even once its path names elsewhere.
        std::fs::rename(base.join(".worktrees/run"), root.join("moved")).unwrap();
        std::os::unix::fs::symlink(&outside, base.join(".worktrees/run")).unwrap();
        std::fs::write(held.path().join("file"), "x").unwrap();
        assert!(root.join("moved/task/file").is_file());
        assert!(!outside.join("task").exists());
        std::fs::remove_file(base.join(".worktrees/run")).unwrap();
        std::fs::rename(root.join("moved"), base.join(".worktrees/run")).unwrap();
        assert!(matches!(
            create_dir_beneath(&base, &[".worktrees", "run"], "task"),
            Err(FileError::CreateDir { .. })
        ));
        // A level that is a link, as one swapped in while crew makes the next level.
        std::os::unix::fs::symlink(&outside, base.join(".worktrees/other")).unwrap();
        assert!(matches!(
            create_dir_beneath(&base, &[".worktrees", "other"], "task"),
            Err(FileError::Symlink { .. })
        ));
        assert!(matches!(
            ensure_dirs_beneath(&base, &[".worktrees", "other", "task"]),
            Err(FileError::Symlink { .. })
        ));
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
        assert_eq!(
            ensure_dirs_beneath(&base, &[".worktrees", "run", "task"]).unwrap(),
            made
        );
    }

    #[test]
    fn a_rename_beneath_a_root_never_goes_through_a_link() {
        let (_dir, root) = temp_dir();
        let outside = root.join("outside");
        std::fs::create_dir(&outside).unwrap();
        let base = root.join("repo");
        std::fs::create_dir(&base).unwrap();
        let pooled = ensure_dirs_beneath(&base, &[".worktrees", ".pool", "p1"]).unwrap();
        std::fs::write(pooled.join("file"), "x").unwrap();
        // The run's level swapped for a link to elsewhere: refused, nothing moved there.
        std::os::unix::fs::symlink(&outside, base.join(".worktrees/run")).unwrap();
        let target = base.join(".worktrees/run/task");
        assert!(matches!(
            rename_beneath(&base, &pooled, &target),
            Err(FileError::Symlink { .. })
        ));
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
        assert!(pooled.join("file").exists());
        // Outside the root, or onto something there: refused.
        assert!(rename_beneath(&base, &pooled, &outside.join("task")).is_err());
        std::fs::remove_file(base.join(".worktrees/run")).unwrap();
        std::fs::create_dir_all(&target).unwrap();
        assert!(rename_beneath(&base, &pooled, &target).is_err());
        std::fs::remove_dir(&target).unwrap();
        rename_beneath(&base, &pooled, &target).unwrap();
        assert!(target.join("file").exists() && !pooled.exists());
    }

    fn temp_dir() -> (tempfile::TempDir, Utf8PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = Utf8PathBuf::from_path_buf(dir.path().to_owned()).unwrap();
        (dir, path)
    }

    #[test]
    fn atomic_write_replaces_contents_and_leaves_no_temp_file() {
        let (_guard, dir) = temp_dir();
        let target = dir.join("manifest.json");
        write_atomic(&target, b"one").unwrap();
        write_atomic(&target, b"two").unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"two");
        let names: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn an_exchanging_write_reuses_two_files_and_writes_through_no_link() {
        use std::os::unix::fs::MetadataExt as _;
        let (_dir, dir) = temp_dir();
        let target = dir.join("manifest.json");
        let spare = dir.join(spare_name("manifest.json"));
        write_exchanging(&target, b"one").unwrap();
        write_exchanging(&target, b"two").unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"two");
        assert_eq!(
            std::fs::read(&spare).unwrap(),
            b"one",
            "the spare holds the write before"
        );
        let inodes = |path: &Utf8Path| std::fs::metadata(path).unwrap().ino();
        let (first, second) = (inodes(&target), inodes(&spare));
        write_exchanging(&target, b"three").unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"three");
        assert_eq!(
            (inodes(&target), inodes(&spare)),
            (second, first),
            "the two files take turns; none is made"
        );
        let names = || {
            let mut names: Vec<String> = std::fs::read_dir(&dir)
                .unwrap()
                .map(|entry| entry.unwrap().file_name().into_string().unwrap())
                .collect();
            names.sort();
            names
        };
        assert_eq!(names(), [".manifest.json.spare", "manifest.json"]);

        // A spare linked to another file: that file is never written.
        let victim = dir.join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        std::fs::remove_file(&spare).unwrap();
        std::fs::hard_link(&victim, &spare).unwrap();
        write_exchanging(&target, b"four").unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"four");
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");

        // A spare that is a symlink: not followed.
        let _ = std::fs::remove_file(&spare);
        std::os::unix::fs::symlink(&victim, &spare).unwrap();
        write_replace(&target, b"five").unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"five");
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");

        // A symlink in the file's place is refused, as by write_atomic.
        let link = dir.join("link.json");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        assert!(matches!(
            write_exchanging(&link, b"evil"),
            Err(FileError::Symlink { .. })
        ));
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
    }

    #[test]
    fn atomic_write_refuses_a_symlink_target() {
        let (_guard, dir) = temp_dir();
        let canary = dir.join("canary");
        std::fs::write(&canary, b"canary").unwrap();
        let target = dir.join("manifest.json");
        std::os::unix::fs::symlink(&canary, &target).unwrap();
        let error = write_atomic(&target, b"evil").unwrap_err();
        assert!(matches!(error, FileError::Symlink { .. }), "{error}");
        assert_eq!(std::fs::read(&canary).unwrap(), b"canary");
        assert!(read_nofollow(&target).is_err());
    }

    #[test]
    fn ensure_real_dir_refuses_symlinks_and_files() {
        let (_guard, dir) = temp_dir();
        let link = dir.join("link");
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        assert!(matches!(
            ensure_real_dir(&link),
            Err(FileError::Symlink { .. })
        ));
        let file = dir.join("file");
        std::fs::write(&file, b"").unwrap();
        assert!(matches!(
            ensure_real_dir(&file),
            Err(FileError::WrongType { .. })
        ));
        ensure_real_dir(&dir.join("new")).unwrap();
        assert!(dir.join("new").is_dir());
    }
}
