//! crew agents list against git worktree list, alone and beside live runs.

use super::*;

/// The crew binary built next to this benchmark, as `cargo install` leaves it: a copy.
///
/// The linker leaves the file it has just written in the page cache in a state that costs
/// every start of it about 0.15–0.25 ms more (10–15 more page faults, each slower) until its
/// pages are read from disk again: measured beside 48 live agents, `crew agents list` took
/// 2.3–2.4 ms run in place and 2.0–2.2 ms as a copy, and the same after the page cache was
/// dropped, in place or copied (BENCHMARKS.md). A user's `crew` is installed (copied) or was
/// read from disk; a listing judged against `git` in milliseconds is timed as such.
pub(super) fn crew_binary() -> Utf8PathBuf {
    INSTALLED_CREW
        .get_or_init(|| {
            let exe = Utf8PathBuf::from_path_buf(std::env::current_exe().unwrap()).unwrap();
            let dir = exe.parent().unwrap().parent().unwrap();
            let candidates = [dir.join("crew"), dir.parent().unwrap().join("release/crew")];
            let built = candidates
                .into_iter()
                .find(|path| path.exists())
                .expect("build the crew binary first: cargo build --release -p crew-cli");
            refuse_if_stale(&built);
            let installed = Utf8PathBuf::from_path_buf(std::env::temp_dir())
                .unwrap()
                .join(format!("crew-bench-installed-{}", std::process::id()));
            std::fs::create_dir_all(&installed).unwrap();
            let crew = installed.join("crew");
            std::fs::copy(&built, &crew).unwrap();
            crew
        })
        .clone()
}

/// Stops the benchmark when the crew binary it found is older than a source it is built from:
/// `cargo bench` rebuilds the benchmark, not `crew`, and the lines that run `crew` would
/// measure the old one without a word.
pub(super) fn refuse_if_stale(built: &Utf8Path) {
    let modified = |path: &std::path::Path| path.metadata().and_then(|meta| meta.modified()).ok();
    let binary = modified(built.as_std_path()).unwrap();
    let crates = Utf8Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .join("crates");
    let mut dirs = vec![crates.into_std_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path
                .extension()
                .is_some_and(|ext| ext == "rs" || ext == "toml")
                && modified(&path).is_some_and(|source| source > binary)
            {
                panic!(
                    "{built} is older than {}: rebuild it first (cargo build --release -p crew-cli)",
                    path.display()
                );
            }
        }
    }
}

/// Where [`crew_binary`] installed crew.
pub(super) static INSTALLED_CREW: std::sync::OnceLock<Utf8PathBuf> = std::sync::OnceLock::new();

/// `crew agents list` with 3 live runs of 16 agents each, against `git worktree list`.
pub(super) fn agents_list(bench: &Bench) {
    agents_list_beside_live_runs(
        &bench.repo,
        bench.rounds,
        "crew agents list (3 runs × 16 agents)",
        &[],
    );
}

/// Starts 3 detached runs of 16 sleeping agents in `project` (with `mode` arguments), times
/// `crew agents list` against `git worktree list` there, prints the line `name`, and cancels
/// the runs.
pub(super) fn agents_list_beside_live_runs(
    project: &Utf8Path,
    rounds: usize,
    name: &str,
    mode: &[&str],
) {
    let crew = crew_binary();
    let mut runs = Vec::new();
    for _ in 0..3 {
        let output = Command::new(&crew)
            .args(["run", "--detach", "-q", "--agent", "shell"])
            .args(mode)
            .args(["--fan-out", "16", "--max-parallel", "16", "sleep 600"])
            .current_dir(project)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        runs.push(String::from_utf8(output.stdout).unwrap().trim().to_owned());
    }
    // All 48 listed before measuring.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let output = Command::new(&crew)
            .args(["agents", "list", "--json"])
            .current_dir(project)
            .output()
            .unwrap();
        let agents: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap_or_default();
        if agents.as_array().is_some_and(|agents| agents.len() == 48) {
            break;
        }
        assert!(Instant::now() < deadline, "the 48 agents never showed up");
        std::thread::sleep(Duration::from_millis(100));
    }
    // The hosts have just started 48 agents and written their listings; let them settle.
    std::thread::sleep(Duration::from_secs(1));
    let timed = |program: &Utf8Path, args: &[&str]| {
        let started = Instant::now();
        let output = Command::new(program)
            .args(args)
            .current_dir(project)
            .output()
            .unwrap();
        assert!(output.status.success());
        started.elapsed()
    };
    let git = Utf8PathBuf::from("git");
    let mut crew_samples = Samples::default();
    let mut git_samples = Samples::default();
    for round in 0..rounds * 10 {
        // Alternate who goes first, so that neither always runs right after the other.
        if round % 2 == 0 {
            crew_samples.push(timed(&crew, &["agents", "list"]));
            git_samples.push(timed(&git, &["worktree", "list"]));
        } else {
            git_samples.push(timed(&git, &["worktree", "list"]));
            crew_samples.push(timed(&crew, &["agents", "list"]));
        }
    }
    Comparison {
        name: name.into(),
        crew: crew_samples,
        reference: git_samples,
        reference_name: "git worktree list".into(),
        // #35: every listing within 1.2× of git's.
        target: Some(1.2),
        paired: false,
    }
    .print();
    for run in runs {
        let _ = Command::new(&crew)
            .args(["runs", "cancel", "--force", "-q", &run])
            .current_dir(project)
            .status();
    }
}

/// Runs `live-helper args…` (a host process of its own) and returns the JSON it prints.
pub(super) fn live_helper(args: &[&str]) -> serde_json::Value {
    crew_tests::live_helper_json(args, None)
}
