//! Spare views: a view its agent wrote nothing in is kept for the next task rather than made
//! again (new and freed inodes are most of what a one-line task costs ext4).

use std::os::unix::fs::{MetadataExt as _, PermissionsExt};

use camino::{Utf8Path, Utf8PathBuf};
use crew_core::paths::remove_contained;

use crate::private_git::{DIR, SPARE_START};

/// Whether the view of the task whose state directory is `task_dir` holds anything its agent
/// wrote (most tasks' agents write nothing in git: their teardown need not open the
/// repository).
pub fn holds_changes(task_dir: &Utf8Path) -> bool {
    task_dir
        .join(DIR)
        .join("upper")
        .read_dir_utf8()
        .is_ok_and(|mut entries| entries.next().is_some())
}

/// The most spare views a project keeps (see [`recycle_view`]): as many as the tasks that
/// usually run at once.
const SPARE_VIEWS: usize = 16;

/// Where a project whose state directory is `state_dir` keeps its spare views.
pub fn spares_dir(state_dir: &Utf8Path) -> Utf8PathBuf {
    state_dir.join("views")
}

/// Keeps the view beneath `task_dir`, whose agent ended and wrote nothing in it, in `spares`
/// for the next task's [`PrivateGit::arm`](crate::private_git::PrivateGit::arm), where fewer than `SPARE_VIEWS` wait; else
/// removes it. Making a view's directories and removing them again is most of what a
/// one-line `single` task costs the file system: on ext4 without a journal each new inode is
/// looked for past every one freed in the last minutes, and each freed block discarded at
/// once. Where the task started is no longer the view's to say: that record goes first,
/// renamed to `SPARE_START`, which the next arm writes over and names again (a file made and
/// removed at every task was one more inode looked for).
pub fn recycle_view(task_dir: &Utf8Path, spares: &Utf8Path) {
    let dir = task_dir.join(DIR);
    let Some(spares) = open_spares(spares, true) else {
        remove_view(task_dir);
        return;
    };
    let kept = rustix::fs::Dir::read_from(&spares)
        .map_or(0, |entries| entries.flatten().count().saturating_sub(2));
    let start = dir.join("start.json");
    let recycled = kept < SPARE_VIEWS
        && untouched(&dir)
        && std::fs::rename(&start, dir.join(SPARE_START)).map_or_else(
            |error| error.kind() == std::io::ErrorKind::NotFound,
            |()| true,
        )
        && {
            // `<run>-<task>`, from `runs/<run>/tasks/<task>`: no other task's.
            let run = task_dir
                .parent()
                .and_then(Utf8Path::parent)
                .and_then(Utf8Path::file_name);
            let name = format!(
                "{}-{}",
                run.unwrap_or("run"),
                task_dir.file_name().unwrap_or("task")
            );
            rustix::fs::renameat(rustix::fs::CWD, dir.as_std_path(), &spares, name.as_str()).is_ok()
        };
    if !recycled {
        remove_view(task_dir);
    }
}

/// The spare views' directory, opened without following a link (one planted in its place is
/// never read, moved into or taken from), and made first when `create`.
pub(super) fn open_spares(spares: &Utf8Path, create: bool) -> Option<rustix::fd::OwnedFd> {
    use rustix::fs::{Mode, OFlags};
    let open = || {
        rustix::fs::open(
            spares.as_std_path(),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
    };
    match open() {
        // Made where missing (a link in its place is not missing: the open refuses it).
        Err(rustix::io::Errno::NOENT) if create => {
            match rustix::fs::mkdir(spares.as_std_path(), Mode::from_raw_mode(0o700)) {
                Ok(()) | Err(rustix::io::Errno::EXIST) => open().ok(),
                Err(_) => None,
            }
        }
        opened => opened.ok(),
    }
}

/// Whether the view in `dir` (`<task>/git`) is as crew made it: its layer holds nothing, and
/// its root, which is the overlay's root, has the mode crew made it with (that of `dir`,
/// made beside it) and no extended attribute but the overlay's own mark. An agent that
/// changed the mode of its `.git`, or set an attribute or an ACL on it, changed that root
/// and nothing in it: a view like that is never another task's.
pub(super) fn untouched(dir: &Utf8Path) -> bool {
    let upper = dir.join("upper");
    let mode = |path: &Utf8Path| {
        std::fs::symlink_metadata(path)
            .ok()
            .filter(|metadata| metadata.is_dir() && !metadata.is_symlink())
            .map(|metadata| metadata.mode() & 0o7777)
    };
    let mut names = [0u8; 256];
    let attributes_are_the_overlays = rustix::fs::llistxattr(upper.as_std_path(), &mut names)
        .is_ok_and(|length| {
            names[..length]
                .split(|byte| *byte == 0)
                .all(|name| name.is_empty() || name == b"user.overlay.uuid")
        });
    mode(&upper).is_some()
        && mode(&upper) == mode(dir)
        && attributes_are_the_overlays
        && upper
            .read_dir_utf8()
            .is_ok_and(|mut entries| entries.next().is_none())
}

/// Removes the view beneath the task state directory `task_dir` (the overlay's scratch
/// directory, which the kernel makes unreadable, is opened again first).
pub fn remove_view(task_dir: &Utf8Path) {
    let dir = task_dir.join(DIR);
    let inner = dir.join("work/work");
    if std::fs::symlink_metadata(&inner).is_ok_and(|metadata| metadata.is_dir()) {
        // Only so that the removal below can enter it; a failure there is what counts.
        let _ = std::fs::set_permissions(&inner, std::fs::Permissions::from_mode(0o700));
    }
    if std::fs::symlink_metadata(&dir).is_ok() {
        // A view not removed stays under the task's state and goes with the run.
        let _ = remove_contained(&dir, &[task_dir]);
    }
}
