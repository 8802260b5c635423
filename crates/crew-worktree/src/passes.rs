//! How many passes over whole worktrees run at once.
//!
//! A teardown's status and commit, or a recycled worktree's switch, reads every entry of the
//! index and looks up every file: bound by the CPU and the kernel's path lookups. More of them
//! at once than there are cores finishes none sooner and holds each one's index and trees in
//! memory at the same time (a few MB each on a 20,000-file repository), so a process runs at
//! most one per core and the others wait their turn. Fresh checkouts are not limited here: tasks
//! starting together share one checkout pass (`checkout`), which already uses every core.

use std::sync::{Condvar, LazyLock, Mutex};

struct Slots {
    free: Mutex<usize>,
    freed: Condvar,
}

static SLOTS: LazyLock<Slots> = LazyLock::new(|| Slots {
    free: Mutex::new(std::thread::available_parallelism().map_or(2, usize::from)),
    freed: Condvar::new(),
});

/// A turn to make a pass over a worktree; the next waiting one goes when it is dropped.
pub(crate) struct Turn(());

/// Waits for a turn.
pub(crate) fn turn() -> Turn {
    let mut free = SLOTS
        .free
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    while *free == 0 {
        free = SLOTS
            .freed
            .wait(free)
            .unwrap_or_else(|poisoned| poisoned.into_inner());
    }
    *free -= 1;
    Turn(())
}

impl Drop for Turn {
    fn drop(&mut self) {
        let mut free = SLOTS
            .free
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        *free += 1;
        SLOTS.freed.notify_one();
    }
}
