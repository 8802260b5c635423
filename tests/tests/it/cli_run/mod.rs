//! The `crew` binary end to end: what a user types and sees.

use camino::{Utf8Path, Utf8PathBuf};
use crew_tests::{Redactor, TestEnv, render_output, wait_until, write};

use crate::common::runs::{
    finished_run, manifest, run_ids, shell_worktree_args, shell_worktree_run, task, trio_repo,
};

mod basics;
mod radar_and_land;

/// A finished run of three worktree tasks: `red` and `blue` rewrite the same line of
/// `src/lib.txt` (they conflict), `docs` appends to `README.md`.
fn red_blue_docs(env: &TestEnv, repo: &Utf8Path) -> String {
    shell_worktree_run(
        env,
        repo,
        &[
            "red=printf 'one\\nred\\nthree\\n' > src/lib.txt",
            "blue=printf 'one\\nblue\\nthree\\n' > src/lib.txt",
            "docs=echo more >> README.md",
        ],
    )
}
