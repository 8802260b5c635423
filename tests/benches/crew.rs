//! crew's benchmarks: every figure is a ratio against a reference run in the same process on
//! the same repository — `git` itself, mostly — never an absolute time.
//!
//!     cargo bench -p crew-tests --bench crew              # the reference repository
//!     cargo bench -p crew-tests --bench crew -- --quick   # a tenth of it, fewer rounds
//!     cargo bench -p crew-tests --bench crew -- --large   # worktrees of 100,000 files
//!
//! See the README (Benchmarks) for the output format and BENCHMARKS.md for this machine's
//! figures.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    clippy::print_stderr
)]

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use camino::{Utf8Path, Utf8PathBuf};
use crew_core::config::{ProjectConfig, WorkspaceMode};
use crew_core::provider::{TaskWorkspace, TeardownRequest, WorkspaceProvider, WorkspaceRequest};
use crew_core::{RunId, TaskId, Workspace};
use crew_tests::synth::{RepoSpec, generate_node_modules, generate_repository};
use crew_worktree::CrewWorkspaces;

#[path = "crew/board.rs"]
mod board;
use board::Board;

/// Measured durations of one side of a comparison.
#[derive(Debug, Clone, Default)]
struct Samples(Vec<Duration>);

impl Samples {
    fn push(&mut self, duration: Duration) {
        self.0.push(duration);
    }

    fn median(&self) -> Duration {
        let mut sorted = self.0.clone();
        sorted.sort();
        sorted[sorted.len() / 2]
    }

    fn min(&self) -> Duration {
        *self.0.iter().min().unwrap()
    }

    fn max(&self) -> Duration {
        *self.0.iter().max().unwrap()
    }

    fn show(&self) -> String {
        format!(
            "{} [{} … {}]",
            seconds(self.median()),
            seconds(self.min()),
            seconds(self.max())
        )
    }
}

fn seconds(duration: Duration) -> String {
    let value = duration.as_secs_f64();
    if value < 0.001 {
        format!("{:.0}µs", value * 1_000_000.0)
    } else if value < 0.1 {
        format!("{:.1}ms", value * 1000.0)
    } else {
        format!("{value:.2}s")
    }
}

/// One printed comparison.
struct Comparison {
    name: String,
    crew: Samples,
    reference: Samples,
    reference_name: String,
    /// The ratio crew / reference must stay at or below this.
    target: Option<f64>,
    /// The rounds were taken in pairs (crew and reference back to back): the ratio is the
    /// median of the pairs' ratios, which a machine slowing down between pairs does not move.
    paired: bool,
}

impl Comparison {
    fn ratio(&self) -> f64 {
        if self.paired {
            let mut ratios: Vec<f64> = self
                .crew
                .0
                .iter()
                .zip(&self.reference.0)
                .map(|(crew, reference)| crew.as_secs_f64() / reference.as_secs_f64())
                .collect();
            ratios.sort_by(f64::total_cmp);
            return ratios[ratios.len() / 2];
        }
        self.crew.median().as_secs_f64() / self.reference.median().as_secs_f64()
    }

    fn print(&self) {
        let verdict = match self.target {
            Some(target) if self.ratio() <= target => format!("≤ {target:.2}×  met"),
            Some(target) => format!("≤ {target:.2}×  MISSED"),
            None => String::new(),
        };
        println!(
            "{:<44} {:<28} {:<28} {:>6.2}×  {}",
            self.name,
            self.crew.show(),
            format!("{} ({})", self.reference.show(), self.reference_name),
            self.ratio(),
            verdict
        );
    }
}

struct Bench {
    root: Utf8PathBuf,
    repo: Utf8PathBuf,
    /// The run's base commit, fixed once per run as `crew run` does.
    base: String,
    workspace: Workspace,
    /// Recycling off: every worktree is checked out.
    provider: CrewWorkspaces,
    /// Recycling on, as by default.
    pooled: CrewWorkspaces,
    rounds: usize,
    counter: usize,
    /// The 100,000-file repository (`--large`), where a recycled worktree must do better.
    large: bool,
}

impl Bench {
    fn git(&self, args: &[&str]) {
        let status = Command::new("git")
            .args(args)
            .current_dir(&self.repo)
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_CONFIG_SYSTEM", "/dev/null")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "git {args:?}");
    }

    fn timed_git(&self, args: &[&str]) -> Duration {
        let started = Instant::now();
        self.git(args);
        started.elapsed()
    }

    fn next_name(&mut self) -> String {
        self.counter += 1;
        format!("bench{}", self.counter)
    }

    fn request(&self, run_id: &RunId, task: &str) -> WorkspaceRequest {
        WorkspaceRequest {
            workspace: self.workspace.id().clone(),
            repo_root: Some(self.repo.clone()),
            invocation_dir: Utf8PathBuf::new(),
            run_id: run_id.clone(),
            task_id: TaskId::parse(task).unwrap(),
            mode: WorkspaceMode::Worktree,
            base: Some(self.base.clone()),
            upstream: Vec::new(),
            progress: None,
            env: Vec::new(),
            unconfined: false,
        }
    }

    fn teardown_request(&self, run_id: &RunId, task: &str) -> TeardownRequest {
        TeardownRequest {
            workspace: self.workspace.id().clone(),
            repo_root: Some(self.repo.clone()),
            run_id: run_id.clone(),
            task_id: TaskId::parse(task).unwrap(),
            agent_alive: false,
            keep: false,
            placed_for: None,
        }
    }

    /// A fresh worktree workspace through crew, timed.
    fn crew_prepare(&self, run_id: &RunId, task: &str) -> (Duration, TaskWorkspace) {
        let started = Instant::now();
        let workspace = self.provider.allocate(&self.request(run_id, task)).unwrap();
        (started.elapsed(), workspace)
    }

    /// Removes every worktree and branch the benchmarks made (not timed).
    fn clean_up(&self) {
        self.delete_worktrees();
        let branches = Command::new("git")
            .args(["for-each-ref", "--format=%(refname:short)", "refs/heads/"])
            .current_dir(&self.repo)
            .output()
            .unwrap();
        for branch in String::from_utf8(branches.stdout).unwrap().lines() {
            if branch != "main" {
                self.git(&["branch", "-D", branch]);
            }
        }
    }

    /// Deletes every worktree made so far, as a user's `rm -rf` or crew's teardowns take them:
    /// their files, then git's admin entries (locked ones too); the branches stay.
    fn delete_worktrees(&self) {
        let _ = std::fs::remove_dir_all(self.repo.join(".worktrees"));
        let _ = std::fs::remove_dir_all(self.git_worktrees());
        let _ = std::fs::remove_dir_all(self.repo.join(".git/worktrees"));
        std::fs::create_dir_all(self.git_worktrees()).unwrap();
    }

    /// [`Bench::delete_worktrees`], but crew's pool stays (its worktrees, their admin entries).
    fn delete_worktrees_but_the_pool(&self) {
        if let Ok(entries) = self.repo.join(".worktrees").read_dir_utf8() {
            for entry in entries.flatten() {
                if entry.file_name() != ".pool" {
                    let _ = std::fs::remove_dir_all(entry.path());
                }
            }
        }
        self.git(&["worktree", "prune"]);
        std::fs::create_dir_all(self.git_worktrees()).unwrap();
    }

    /// Where the reference `git worktree add` puts its worktrees: under the repository's
    /// `.worktrees`, beside crew's, so that both start from the same parent (ext4 puts a new
    /// directory's files near its parent; a sibling of the repository lands elsewhere). crew
    /// marks `.worktrees` as the top of a hierarchy, so that each of its runs is placed apart:
    /// that is crew's own doing, and git's worktrees go where git puts them (this directory,
    /// made again after every deletion, is placed by the file system's default).
    fn git_worktrees(&self) -> Utf8PathBuf {
        self.repo.join(".worktrees").join("git-reference")
    }
}

/// Every benchmark's name, as `-- --only` takes them, in the order of a full run.
const BENCHMARKS: &[&str] = &[
    "eight",
    "eight-deleted",
    "eight-pooled",
    "fresh",
    "fresh-deleted",
    "recycled",
    "cargo",
    "committed",
    "linking",
    "list",
    "agents",
    "sandbox",
    "network",
    "block",
    "board",
    "radar",
    "history",
    "hundred",
    "placement",
    "thousand",
];

fn main() {
    let quick = std::env::args().any(|arg| arg == "--quick");
    // `-- --large`: the worktree benchmarks (fresh and recycled) on a 100,000-file repository;
    // not in the default run.
    let large = std::env::args().any(|arg| arg == "--large");
    // `-- --only NAME[,NAME…]` runs those benchmarks, in the order of a full run.
    let only: Option<Vec<String>> = std::env::args()
        .skip_while(|arg| arg != "--only")
        .nth(1)
        .map(|names| names.split(',').map(str::to_owned).collect());
    if let Some(unknown) = only
        .iter()
        .flatten()
        .find(|name| !BENCHMARKS.contains(&name.as_str()))
    {
        eprintln!(
            "--only: no benchmark is called {unknown:?}; there are {}",
            BENCHMARKS.join(", ")
        );
        std::process::exit(2);
    }
    // `cargo bench` passes `--bench`; anything else unknown is ignored.
    let spec = if large {
        RepoSpec::large()
    } else if quick {
        RepoSpec::quick()
    } else {
        RepoSpec::reference()
    };
    let rounds = if quick { 3 } else { 5 };
    // `-- --load`: the whole run beside a load of the benchmark's own, one thread per core
    // spinning on arithmetic and system calls: a slower, busier host, to see which steps of
    // crew's grow there.
    let _load = std::env::args()
        .any(|arg| arg == "--load")
        .then(HostLoad::start);
    let root = Utf8PathBuf::from_path_buf(
        tempfile::Builder::new()
            .prefix("crew-bench-")
            .tempdir()
            .unwrap()
            .keep(),
    )
    .unwrap();
    let repo = root.join("repo");
    let started = Instant::now();
    generate_repository(&repo, &spec);
    let size = du(&repo);
    println!(
        "crew benchmarks — repository: {} files in {} directories, {} MB checked out, {} commits (generated in {})",
        spec.files,
        spec.dirs,
        size / 1_000_000,
        spec.commits,
        seconds(started.elapsed())
    );
    println!(
        "each cell: median [min … max] of {rounds} rounds; ratio = crew ÷ reference, same repository, same process\n"
    );
    println!(
        "{:<44} {:<28} {:<28} {:>7}  target",
        "benchmark", "crew", "reference", "ratio"
    );
    let workspace = Workspace::at_root(repo.as_std_path()).unwrap();
    let head = Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(&repo)
        .output()
        .unwrap();
    let base = String::from_utf8(head.stdout).unwrap().trim().to_owned();
    let mut fresh_config = ProjectConfig::default();
    fresh_config.worktree.pool_size = 0;
    let mut bench = Bench {
        base,
        provider: CrewWorkspaces::new(&fresh_config),
        pooled: CrewWorkspaces::new(&ProjectConfig::default()),
        root: root.clone(),
        repo,
        workspace,
        rounds,
        counter: 0,
        large,
    };
    std::fs::create_dir_all(bench.git_worktrees()).unwrap();

    let wanted = |name: &str| match &only {
        Some(only) => only.iter().any(|wanted| wanted == name),
        None => !large || matches!(name, "fresh" | "recycled"),
    };
    if wanted("eight") {
        eight_at_once(&mut bench, Disk::AsLeft);
    }
    if wanted("eight-deleted") {
        eight_at_once(&mut bench, Disk::AfterDeletion);
    }
    if wanted("eight-pooled") {
        eight_at_once(&mut bench, Disk::AfterDeletionWithPool);
    }
    if wanted("fresh") {
        fresh_worktrees(&mut bench);
    }
    if wanted("fresh-deleted") {
        fresh_after_deletion(&mut bench);
    }
    if wanted("recycled") {
        recycled(&mut bench);
    }
    if wanted("cargo") {
        warm_builds(&bench);
    }
    if wanted("committed") {
        committed_teardown(&bench);
    }
    if wanted("linking") {
        linking(&bench);
    }
    if wanted("list") {
        agents_list(&bench);
    }
    if wanted("agents") {
        many_agents(&bench);
    }
    if wanted("sandbox") {
        sandboxed_starts(&bench);
    }
    if wanted("network") {
        network(&bench);
    }
    if wanted("block") {
        live_block(&bench);
    }
    if wanted("board") {
        board(&bench);
    }
    if wanted("radar") {
        radar(&bench);
    }
    if wanted("history") {
        history(&bench);
    }
    if wanted("hundred") {
        hundred_tasks(&bench);
    }
    if wanted("placement") {
        placement(&bench);
    }
    if wanted("thousand") {
        thousand_tasks(&bench);
    }

    let _ = std::fs::remove_dir_all(&root);
    if let Some(installed) = INSTALLED_CREW.get().and_then(|crew| crew.parent()) {
        let _ = std::fs::remove_dir_all(installed);
    }
}

/// Bytes of the files below `dir`, `.git` aside.
fn du(dir: &Utf8Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![dir.to_owned()];
    while let Some(current) = stack.pop() {
        for entry in current.read_dir_utf8().unwrap().flatten() {
            if entry.file_name() == ".git" {
                continue;
            }
            let metadata = entry.path().symlink_metadata().unwrap();
            if metadata.is_dir() {
                stack.push(entry.path().to_owned());
            } else {
                total += metadata.len();
            }
        }
    }
    total
}

/// A fresh worktree workspace ready, against `git worktree add` (default and with parallel
/// checkout), then the teardown of a clean one against `git worktree remove` + `git branch -D`.
/// Waits until the file system has written out what earlier steps left dirty (`sync`), so that
/// a timed step does not pay for the one before it.
fn flush_writeback() {
    let _ = Command::new("sync").status();
}

fn fresh_worktrees(bench: &mut Bench) {
    let mut crew = Samples::default();
    let mut git_default = Samples::default();
    let mut git_parallel = Samples::default();
    let mut crew_teardown = Samples::default();
    let mut git_teardown = Samples::default();
    // Every worktree stays until all are made: deleting thousands of files leaves this file
    // system slow to create more for minutes, and whoever came next would pay for it.
    let mut made = Vec::new();
    for round in 0..bench.rounds {
        let run_id = RunId::generate();
        let name = bench.next_name();
        let path = bench.git_worktrees().join(&name);
        let name2 = bench.next_name();
        let path2 = bench.git_worktrees().join(&name2);
        // The three take turns going first, and each starts with the file system's writeback
        // done.
        let mut workspace = None;
        for turn in 0..3 {
            flush_writeback();
            match (round + turn) % 3 {
                0 => {
                    let (took, prepared) = bench.crew_prepare(&run_id, "fresh");
                    crew.push(took);
                    workspace = Some(prepared);
                }
                1 => git_default.push(bench.timed_git(&[
                    "worktree",
                    "add",
                    "-q",
                    "-b",
                    &name,
                    path.as_str(),
                    "HEAD",
                ])),
                _ => git_parallel.push(bench.timed_git(&[
                    "-c",
                    "checkout.workers=0",
                    "worktree",
                    "add",
                    "-q",
                    "-b",
                    &name2,
                    path2.as_str(),
                    "HEAD",
                ])),
            }
        }
        let workspace = workspace.expect("crew took its turn");
        made.push((run_id, workspace, name, path, name2, path2));
    }
    for (round, (run_id, workspace, name, path, name2, path2)) in made.into_iter().enumerate() {
        // Teardowns take turns going first too.
        for turn in 0..2 {
            flush_writeback();
            if (round + turn) % 2 == 0 {
                let started = Instant::now();
                bench
                    .provider
                    .teardown(&workspace, &bench.teardown_request(&run_id, "fresh"))
                    .unwrap();
                crew_teardown.push(started.elapsed());
            } else {
                let started = Instant::now();
                bench.git(&["worktree", "remove", path.as_str()]);
                bench.git(&["branch", "-D", &name]);
                git_teardown.push(started.elapsed());
            }
        }
        bench.git(&["worktree", "remove", path2.as_str()]);
        bench.git(&["branch", "-D", &name2]);
    }
    Comparison {
        name: "fresh worktree workspace".into(),
        crew: crew.clone(),
        reference: git_default,
        reference_name: "git worktree add".into(),
        target: None,
        paired: false,
    }
    .print();
    Comparison {
        name: "fresh worktree workspace".into(),
        crew,
        reference: git_parallel,
        reference_name: "checkout.workers=0".into(),
        target: Some(1.0),
        paired: false,
    }
    .print();
    Comparison {
        name: "teardown of a clean worktree".into(),
        crew: crew_teardown,
        reference: git_teardown,
        reference_name: "remove + branch -D".into(),
        target: None,
        paired: false,
    }
    .print();
    bench.clean_up();
}

/// A workspace from crew's pool (a finished task's worktree, switched to the new task's branch
/// and cleaned), against a fresh `git worktree add`.
fn recycled(bench: &mut Bench) {
    let mut crew = Samples::default();
    let mut git = Samples::default();
    // Fill the pool once.
    let run_id = RunId::generate();
    let first = bench
        .pooled
        .allocate(&bench.request(&run_id, "seed"))
        .unwrap();
    bench
        .pooled
        .teardown(&first, &bench.teardown_request(&run_id, "seed"))
        .unwrap();
    for round in 0..bench.rounds {
        recycled_round(
            bench,
            &run_id,
            &format!("recycled{round}"),
            &mut crew,
            &mut git,
        );
    }
    Comparison {
        name: "recycled worktree workspace".into(),
        crew,
        reference: git,
        reference_name: "git worktree add".into(),
        target: Some(if bench.large { 0.1 } else { 0.15 }),
        paired: false,
    }
    .print();
    let common = bench.repo.join(".git");
    crew_worktree::pool::empty(&common, &bench.repo, bench.pooled.settings());

    // The first task of a run after a run's end refilled the pool (what `crew worktrees
    // refill` does in the background, untimed), one worktree deep.
    let mut settings = bench.pooled.settings().clone();
    settings.pool_size = 1;
    let mut crew = Samples::default();
    let mut git = Samples::default();
    for round in 0..bench.rounds {
        crew_worktree::pool::empty(&common, &bench.repo, &settings);
        let added = crew_worktree::pool::refill_at_head(&bench.repo, &settings, || false).unwrap();
        assert_eq!(added, 1);
        recycled_round(
            bench,
            &run_id,
            &format!("refilled{round}"),
            &mut crew,
            &mut git,
        );
    }
    Comparison {
        name: "first task after the pool refilled".into(),
        crew,
        reference: git,
        reference_name: "git worktree add".into(),
        target: Some(0.15),
        paired: false,
    }
    .print();
    crew_worktree::pool::empty(&common, &bench.repo, bench.pooled.settings());
    bench.clean_up();
}

/// What a warm worktree is worth to a build: the first `cargo check` of a task (a change to
/// one library of a generated 12-crate workspace: a core, ten libraries on it, an application
/// on them all) in a recycled worktree whose `target/` the
/// previous task left (`[worktree] keep_ignored = ["target"]`, what `crew init` writes for a
/// Cargo project), workspace and check timed together, against a fresh `git worktree add`
/// and the same check with a cold `target/`.
fn warm_builds(bench: &Bench) {
    let has_cargo = Command::new("cargo")
        .arg("--version")
        .output()
        .is_ok_and(|output| output.status.success());
    if !has_cargo {
        println!("{:<44} skipped: cargo is not installed", "warm cargo check");
        return;
    }
    let repo = bench.root.join("cargo-repo");
    let crates = if bench.rounds < 5 { 6 } else { 12 };
    crew_tests::synth::generate_cargo_workspace(&repo, crates, 30, 20);
    let workspace = Workspace::at_root(repo.as_std_path()).unwrap();
    let mut config = ProjectConfig::default();
    config.worktree.keep_ignored = vec!["target".into()];
    config.worktree.pool_size = 1;
    let provider = CrewWorkspaces::new(&config);
    let run_id = RunId::generate();
    let request = |task: &str| WorkspaceRequest {
        workspace: workspace.id().clone(),
        repo_root: Some(repo.clone()),
        invocation_dir: Utf8PathBuf::new(),
        run_id: run_id.clone(),
        task_id: TaskId::parse(task).unwrap(),
        mode: WorkspaceMode::Worktree,
        base: None,
        upstream: Vec::new(),
        progress: None,
        env: Vec::new(),
        unconfined: false,
    };
    let teardown = |task: &str| TeardownRequest {
        workspace: workspace.id().clone(),
        repo_root: Some(repo.clone()),
        run_id: run_id.clone(),
        task_id: TaskId::parse(task).unwrap(),
        agent_alive: false,
        keep: false,
        placed_for: None,
    };
    // A task's change: a function more in one of the libraries (it and the application are
    // checked again).
    let changed = format!("crate{}/src/m0.rs", crates / 2);
    let change_and_check = |dir: &Utf8Path, round: &str| {
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(dir.join(&changed))
            .unwrap();
        std::io::Write::write_all(
            &mut file,
            format!("\npub fn task_{round}() -> usize {{ {} }}\n", round.len()).as_bytes(),
        )
        .unwrap();
        let checked = Command::new("cargo")
            .args(["check", "--offline", "--quiet", "--workspace"])
            .env_remove("CARGO_TARGET_DIR")
            .env_remove("RUSTFLAGS")
            .current_dir(dir)
            .status()
            .unwrap();
        assert!(checked.success(), "cargo check in {dir}");
    };
    // The first task builds cold, and gives its worktree (and its target/) to the pool.
    let seed = provider.allocate(&request("seed")).unwrap();
    change_and_check(&seed.dir, "seed");
    provider.teardown(&seed, &teardown("seed")).unwrap();

    let mut crew = Samples::default();
    let mut git = Samples::default();
    let rounds = bench.rounds.min(3);
    for round in 0..rounds {
        let task = format!("warm{round}");
        let started = Instant::now();
        let workspace = provider.allocate(&request(&task)).unwrap();
        assert!(workspace.reused || workspace.dir.join("target").is_dir());
        change_and_check(&workspace.dir, &task);
        crew.push(started.elapsed());
        provider.teardown(&workspace, &teardown(&task)).unwrap();

        let path = bench.root.join(format!("cargo-cold-{round}"));
        let started = Instant::now();
        let added = Command::new("git")
            .args([
                "worktree",
                "add",
                "-q",
                "-b",
                &format!("cold{round}"),
                path.as_str(),
                "HEAD",
            ])
            .current_dir(&repo)
            .status()
            .unwrap();
        assert!(added.success());
        change_and_check(&path, &task);
        git.push(started.elapsed());
        let _ = std::fs::remove_dir_all(&path);
        let _ = Command::new("git")
            .args(["worktree", "prune"])
            .current_dir(&repo)
            .status();
    }
    Comparison {
        name: "first cargo check, recycled warm worktree".into(),
        crew,
        reference: git,
        reference_name: "git worktree add, cold target/".into(),
        // A recycled worktree keeps its task's path (BENCHMARKS.md, "What each line rests on"): rustc's
        // incremental caches, keyed by the working directory, rebuild the workspace's crates.
        target: Some(0.3),
        paired: false,
    }
    .print();
    let _ = std::fs::remove_dir_all(&repo);
}

/// One round of a recycled-worktree comparison: crew's task `task` takes a pooled worktree
/// (timed) and gives it back; `git worktree add` (timed) makes one, removed again.
/// The teardown of a task whose agent made one commit (a recycled worktree, given back to the
/// pool), against the same teardown of a worktree without an agent git directory, where the
/// commit went straight into the repository — what a teardown cost before agents had a git
/// directory of their own: taking the agent's objects and its branch in is the difference.
fn committed_teardown(bench: &Bench) {
    let mut own = Samples::default();
    let mut shared = Samples::default();
    let run_id = RunId::generate();
    let seed = bench
        .pooled
        .allocate(&bench.request(&run_id, "seed"))
        .unwrap();
    bench
        .pooled
        .teardown(&seed, &bench.teardown_request(&run_id, "seed"))
        .unwrap();
    let common = bench.repo.join(".git");
    for round in 0..bench.rounds * 2 {
        for turn in 0..2 {
            let task = format!("commit{round}x{turn}");
            let workspace = bench
                .pooled
                .allocate(&bench.request(&run_id, &task))
                .unwrap();
            let with_own_git = (round + turn) % 2 == 0;
            if !with_own_git {
                let names = crew_worktree::names::TaskNames::new(
                    &bench.repo,
                    bench.pooled.settings(),
                    &run_id,
                    &TaskId::parse(&task).unwrap(),
                );
                crew_worktree::agent_git::AgentGit::of(&common, &names)
                    .disarm()
                    .unwrap();
            }
            std::fs::write(workspace.root.join("work.txt"), format!("{task}\n")).unwrap();
            for args in [
                &["add", "work.txt"][..],
                &[
                    "-c",
                    "user.name=a",
                    "-c",
                    "user.email=a@example.com",
                    "commit",
                    "-q",
                    "-m",
                    "work",
                ],
            ] {
                let status = Command::new("git")
                    .args(args)
                    .current_dir(&workspace.root)
                    .env("GIT_CONFIG_GLOBAL", "/dev/null")
                    .status()
                    .unwrap();
                assert!(status.success(), "git {args:?}");
            }
            flush_writeback();
            let started = Instant::now();
            let report = bench
                .pooled
                .teardown(&workspace, &bench.teardown_request(&run_id, &task))
                .unwrap();
            let took = started.elapsed();
            assert!(report.branch.is_some(), "{report:?}");
            if with_own_git {
                own.push(took)
            } else {
                shared.push(took)
            }
        }
    }
    Comparison {
        name: "teardown of a one-commit task".into(),
        crew: own,
        reference: shared,
        reference_name: "commit in the shared dir".into(),
        target: Some(1.05),
        paired: true,
    }
    .print();
}

fn recycled_round(
    bench: &mut Bench,
    run_id: &RunId,
    task: &str,
    crew: &mut Samples,
    git: &mut Samples,
) {
    let started = Instant::now();
    let workspace = bench.pooled.allocate(&bench.request(run_id, task)).unwrap();
    crew.push(started.elapsed());
    bench
        .pooled
        .teardown(&workspace, &bench.teardown_request(run_id, task))
        .unwrap();

    let name = bench.next_name();
    let path = bench.git_worktrees().join(&name);
    git.push(bench.timed_git(&["worktree", "add", "-q", "-b", &name, path.as_str(), "HEAD"]));
    bench.git(&["worktree", "remove", path.as_str()]);
    bench.git(&["branch", "-D", &name]);
}

/// The fresh line on a disk just after a mass deletion: crew's fresh worktree, `git worktree
/// add` and the same with `checkout.workers=0` take turns, each right after every worktree
/// made before it was deleted (the first after eight, 160,000 files).
fn fresh_after_deletion(bench: &mut Bench) {
    let mut crew = Samples::default();
    let mut git_default = Samples::default();
    let mut git_parallel = Samples::default();
    for _ in 0..8 {
        let name = bench.next_name();
        let path = bench.git_worktrees().join(&name);
        bench.git(&["worktree", "add", "-q", "-b", &name, path.as_str(), "HEAD"]);
    }
    for round in 0..bench.rounds.min(3) {
        for turn in 0..3 {
            bench.delete_worktrees();
            settle_disk();
            let name = bench.next_name();
            let path = bench.git_worktrees().join(&name);
            let add = ["worktree", "add", "-q", "-b", &name, path.as_str(), "HEAD"];
            match (round + turn) % 3 {
                0 => crew.push(bench.crew_prepare(&RunId::generate(), "fresh").0),
                1 => git_default.push(bench.timed_git(&add)),
                _ => git_parallel.push(
                    bench.timed_git(&[["-c", "checkout.workers=0"].as_slice(), &add].concat()),
                ),
            }
        }
    }
    bench.clean_up();
    for (reference, reference_name, target) in [
        (git_default, "git worktree add", None),
        (git_parallel, "checkout.workers=0", Some(1.0)),
    ] {
        Comparison {
            name: "fresh worktree, after a mass deletion".into(),
            crew: crew.clone(),
            reference,
            reference_name: reference_name.into(),
            target,
            paired: false,
        }
        .print();
    }
}

/// The disk an [`eight_at_once`] side starts on.
#[derive(Clone, Copy, PartialEq)]
enum Disk {
    /// As the benchmarks before left it.
    AsLeft,
    /// Right after every worktree made before was deleted (160,000 files): ext4 then passes
    /// over each inode freed in the last minute at every new file of the same block group.
    AfterDeletion,
    /// The same, with crew's pool as a run leaves it (`pool_size` 4, the default, holding what
    /// the previous run's teardowns recycled): the state a user's disk is in after a day of
    /// agents run by crew.
    AfterDeletionWithPool,
}

/// Eight tasks' workspaces prepared by crew (as a run does, at once) against eight sequential
/// `git worktree add`, on the `disk` given.
fn eight_at_once(bench: &mut Bench, disk: Disk) {
    let mut crew = Samples::default();
    let mut git = Samples::default();
    let rounds = bench.rounds.min(3);
    let pooled = disk == Disk::AfterDeletionWithPool;
    let deleted = |bench: &Bench| match disk {
        Disk::AsLeft => {}
        Disk::AfterDeletion => bench.delete_worktrees(),
        Disk::AfterDeletionWithPool => bench.delete_worktrees_but_the_pool(),
    };
    let provider = Arc::new(if pooled {
        bench.pooled.clone()
    } else {
        bench.provider.clone()
    });
    let allocate_eight = |bench: &Bench, run_id: &RunId| -> Vec<TaskWorkspace> {
        let threads: Vec<_> = (0..8)
            .map(|index| {
                let provider = provider.clone();
                let request = bench.request(run_id, &format!("task{index}"));
                std::thread::spawn(move || provider.allocate(&request).unwrap())
            })
            .collect();
        threads
            .into_iter()
            .map(|thread| thread.join().unwrap())
            .collect()
    };
    // A run's eight, torn down by crew at its end: the pool keeps four of them.
    let tear_down = |bench: &Bench, run_id: &RunId, workspaces: Vec<TaskWorkspace>| {
        for (index, workspace) in workspaces.iter().enumerate() {
            provider
                .teardown(
                    workspace,
                    &bench.teardown_request(run_id, &format!("task{index}")),
                )
                .unwrap();
        }
    };
    if disk != Disk::AsLeft {
        // A first deletion as large as a round's, before the first side.
        for _ in 0..8 {
            let name = bench.next_name();
            let path = bench.git_worktrees().join(&name);
            bench.git(&["worktree", "add", "-q", "-b", &name, path.as_str(), "HEAD"]);
        }
    }
    if pooled {
        let run_id = RunId::generate();
        let workspaces = allocate_eight(bench, &run_id);
        tear_down(bench, &run_id, workspaces);
    }
    for round in 0..rounds {
        // Alternate who goes first, so that neither always meets a file system still busy
        // with the other's files.
        let crew_round = |bench: &mut Bench| {
            deleted(bench);
            let run_id = RunId::generate();
            settle_disk();
            let started = Instant::now();
            let workspaces = allocate_eight(bench, &run_id);
            let took = started.elapsed();
            if pooled {
                tear_down(bench, &run_id, workspaces);
            }
            took
        };
        let git_round = |bench: &mut Bench| {
            deleted(bench);
            settle_disk();
            let started = Instant::now();
            for _ in 0..8 {
                let name = bench.next_name();
                let path = bench.git_worktrees().join(&name);
                bench.git(&["worktree", "add", "-q", "-b", &name, path.as_str(), "HEAD"]);
            }
            started.elapsed()
        };
        if round % 2 == 0 {
            crew.push(crew_round(bench));
            git.push(git_round(bench));
        } else {
            git.push(git_round(bench));
            crew.push(crew_round(bench));
        }
    }
    // Only now: ext4 creates files 2–3× slower for minutes after many were deleted, and
    // deleting between rounds made every later round measure that instead (0.39× to 0.64×
    // between full runs; `git worktree add` alone went from 2.5 s to 6 s of system time).
    if pooled {
        crew_worktree::pool::empty(
            &bench.repo.join(".git"),
            &bench.repo,
            bench.pooled.settings(),
        );
    }
    bench.clean_up();
    Comparison {
        name: match disk {
            Disk::AsLeft => "8 tasks' worktrees",
            Disk::AfterDeletion => "8 tasks' worktrees, after a mass deletion",
            Disk::AfterDeletionWithPool => "8 tasks, after a mass deletion, crew's pool",
        }
        .into(),
        crew,
        reference: git,
        reference_name: "8 × git worktree add".into(),
        // After a mass deletion the target is the pooled line's: the pool is crew's default,
        // its own way of not creating on such a disk what it can reuse. With recycling off, ext4
        // puts each new directory in the emptiest block groups, which right after a deletion
        // are the ones just freed, and walks past their freed inodes at every new file: crew
        // cannot choose the group, and the line is printed for what that disk costs.
        target: (disk != Disk::AfterDeletion).then_some(0.5),
        paired: false,
    }
    .print();
}

/// Writes back every dirty page before a timed side starts: 8 checkouts leave gigabytes of
/// them, and the side that came second used to pay for the first one's writeback (0.39× to
/// 0.64× between full runs).
fn settle_disk() {
    // SAFETY: sync takes no arguments and only flushes the page cache.
    #[allow(unsafe_code)]
    unsafe {
        libc::sync();
    }
}

/// Linking `node_modules` into a worktree: 50,000 files against 10, measured alternately so that
/// neither meets the file system in another state.
fn linking(bench: &Bench) {
    let settings = bench.provider.settings().clone();
    let leaders: Vec<(usize, Utf8PathBuf)> = [10, 50_000]
        .into_iter()
        .map(|files| {
            let leader = bench.root.join(format!("leader-{files}"));
            generate_node_modules(&leader.join("node_modules"), files);
            (files, leader)
        })
        .collect();
    let mut samples = [Samples::default(), Samples::default()];
    for round in 0..200 {
        for (slot, (files, leader)) in leaders.iter().enumerate() {
            let worktree = bench.root.join(format!("linked-{files}-{round}"));
            std::fs::create_dir_all(&worktree).unwrap();
            let started = Instant::now();
            let made = crew_worktree::envsetup::link_paths(&settings, leader, &worktree).unwrap();
            samples[slot].push(started.elapsed());
            assert_eq!(made.len(), 1);
        }
    }
    let [small, large] = samples;
    Comparison {
        name: "link node_modules: 50,000 files".into(),
        crew: large,
        reference: small,
        reference_name: "10 files".into(),
        target: Some(1.2),
        paired: false,
    }
    .print();
}

/// The crew binary built next to this benchmark, as `cargo install` leaves it: a copy.
///
/// The linker leaves the file it has just written in the page cache in a state that costs
/// every start of it about 0.15–0.25 ms more (10–15 more page faults, each slower) until its
/// pages are read from disk again: measured beside 48 live agents, `crew agents list` took
/// 2.3–2.4 ms run in place and 2.0–2.2 ms as a copy, and the same after the page cache was
/// dropped, in place or copied (BENCHMARKS.md). A user's `crew` is installed (copied) or was
/// read from disk; a listing judged against `git` in milliseconds is timed as such.
fn crew_binary() -> Utf8PathBuf {
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
fn refuse_if_stale(built: &Utf8Path) {
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
static INSTALLED_CREW: std::sync::OnceLock<Utf8PathBuf> = std::sync::OnceLock::new();

/// `crew agents list` with 3 live runs of 16 agents each, against `git worktree list`.
fn agents_list(bench: &Bench) {
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
fn agents_list_beside_live_runs(project: &Utf8Path, rounds: usize, name: &str, mode: &[&str]) {
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
fn live_helper(args: &[&str]) -> serde_json::Value {
    crew_tests::live_helper_json(args, None)
}

/// The sandbox's cost at start: 200 agents started one after another in a host of their own,
/// each confined by Landlock, against the same starts unconfined; the two take turns.
fn sandboxed_starts(bench: &Bench) {
    const AGENTS: u32 = 200;
    let start = |sandbox: &str| {
        let figures = live_helper(&["start", bench.repo.as_str(), &AGENTS.to_string(), sandbox]);
        Duration::from_secs_f64(figures["start_seconds"].as_f64().unwrap())
    };
    let (confined, unconfined, per_agent) = paired_starts(&start, "on", "off", AGENTS);
    Comparison {
        name: "200 agent starts, sandboxed".into(),
        crew: confined,
        reference: unconfined,
        reference_name: "unsandboxed".into(),
        // The isolation each agent gets (BENCHMARKS.md).
        target: Some(1.2),
        paired: true,
    }
    .print();
    // The one absolute figure crew holds itself to beside the ratios (BENCHMARKS.md).
    print_per_agent(
        "sandbox added at each start",
        per_agent,
        Some(Duration::from_micros(500)),
    );
    // Single mode's read-only places (a mount each) and its private view of the git directory
    // (an overlay), against the ruleset alone.
    let (single, confined, per_agent) = paired_starts(&start, "single", "on", AGENTS);
    Comparison {
        name: "200 agent starts, single mode's mounts".into(),
        crew: single,
        reference: confined,
        reference_name: "sandboxed".into(),
        target: Some(START_EXTRAS),
        paired: true,
    }
    .print();
    print_per_agent(
        "single mode's mounts and git view at each start",
        per_agent,
        None,
    );
}

/// What a start with more of the kernel's isolation may cost against a sandboxed start measured
/// in the same run (single mode's mounts, an agent's own network namespace): a ratio, which a
/// slower host's kernel changes on both sides, where an absolute time (the 1 ms a start of
/// earlier runs) it misses by as much as the host is slower.
const START_EXTRAS: f64 = 1.50;

/// What `network = "proxy"` costs: a 100 MB download from a server on this machine through
/// crew's proxy against the same download with the network open, paired rounds taking turns;
/// what an agent's own network namespace (and, with `proxy`, its proxy) adds at each start;
/// and the host's peak memory with 50 agents streaming through their proxies at once, against
/// the same 50 with the network open.
fn network(bench: &Bench) {
    let download = |mode: &str, agents: &str, megabytes: &str| {
        live_helper(&["download", bench.repo.as_str(), agents, megabytes, mode])
    };
    let mut proxied = Samples::default();
    let mut direct = Samples::default();
    // A download takes about 60 ms and one alone varies by half: fifteen pairs, so that the
    // median of their ratios is the proxy's cost and not a few slow rounds'.
    for round in 0..bench.rounds.max(15) {
        let took =
            |mode| Duration::from_secs_f64(download(mode, "1", "100")["seconds"].as_f64().unwrap());
        if round % 2 == 0 {
            proxied.push(took("proxy"));
            direct.push(took("direct"));
        } else {
            direct.push(took("direct"));
            proxied.push(took("proxy"));
        }
    }
    Comparison {
        name: "100 MB download, through the proxy".into(),
        crew: proxied,
        reference: direct,
        reference_name: "network open".into(),
        target: Some(1.10),
        paired: true,
    }
    .print();
    const AGENTS: u32 = 200;
    let start = |sandbox: &str| {
        let figures = live_helper(&["start", bench.repo.as_str(), &AGENTS.to_string(), sandbox]);
        Duration::from_secs_f64(figures["start_seconds"].as_f64().unwrap())
    };
    for mode in ["none", "proxy"] {
        let (isolated, confined, per_agent) = paired_starts(&start, mode, "on", AGENTS);
        Comparison {
            name: format!("200 agent starts, network \"{mode}\""),
            crew: isolated,
            reference: confined,
            reference_name: "sandboxed, open".into(),
            target: Some(START_EXTRAS),
            paired: true,
        }
        .print();
        print_per_agent(
            &format!("network \"{mode}\" added at each start"),
            per_agent,
            None,
        );
    }
    let peak = |mode| download(mode, "50", "20")["hwm_kib"].as_u64().unwrap();
    let (proxied, open) = (peak("proxy"), peak("direct"));
    println!(
        "{:<44} {} MiB host peak, {} MiB with the network open: {} KiB per streaming agent",
        "50 agents streaming through their proxies",
        proxied / 1024,
        open / 1024,
        proxied.saturating_sub(open) / 50
    );
}

/// Eleven rounds of `start(measured)` and `start(reference)`, taking turns going first: both
/// sides' samples, and the median of the rounds' differences per agent.
fn paired_starts(
    start: &dyn Fn(&str) -> Duration,
    measured: &str,
    reference: &str,
    agents: u32,
) -> (Samples, Samples, Duration) {
    let mut ours = Samples::default();
    let mut theirs = Samples::default();
    for round in 0..11 {
        if round % 2 == 0 {
            ours.push(start(measured));
            theirs.push(start(reference));
        } else {
            theirs.push(start(reference));
            ours.push(start(measured));
        }
    }
    let mut differences: Vec<Duration> = ours
        .0
        .iter()
        .zip(&theirs.0)
        .map(|(ours, theirs)| ours.saturating_sub(*theirs))
        .collect();
    differences.sort();
    let per_agent = differences[differences.len() / 2] / agents;
    (ours, theirs, per_agent)
}

/// A line saying what something costs each agent start, against its target where it has one.
fn print_per_agent(name: &str, per_agent: Duration, limit: Option<Duration>) {
    match limit {
        Some(limit) => println!(
            "{name:<44} {} per agent (≤ {}: {})",
            seconds(per_agent),
            seconds(limit),
            if per_agent <= limit { "met" } else { "MISSED" }
        ),
        None => println!("{name:<44} {} per agent", seconds(per_agent)),
    }
}

/// 200 sleeping agents in one host process: its CPU while they sleep, its memory, and the time
/// to stop them all (against the grace period plus a second). The host is a process of its own
/// so that its figures are its own.
fn many_agents(bench: &Bench) {
    let figures = live_helper(&["many", bench.repo.as_str(), "200", "2"]);
    let cpu = figures["idle_cpu_share"].as_f64().unwrap();
    let rss_mb = figures["rss_kib"].as_u64().unwrap() / 1024;
    let stopped = Duration::from_secs_f64(figures["stop_seconds"].as_f64().unwrap());
    let grace = Duration::from_secs(2);
    println!(
        "{:<44} idle CPU {:.2}% of a core (≤ 2%: {}); host RSS {} MB (≤ 64 MB: {}); all stopped in {} (≤ grace {} + 1s: {})",
        "200 sleeping agents, one host",
        cpu * 100.0,
        if cpu <= 0.02 { "met" } else { "MISSED" },
        rss_mb,
        if rss_mb <= 64 { "met" } else { "MISSED" },
        seconds(stopped),
        seconds(grace),
        if stopped <= grace + Duration::from_secs(1) {
            "met"
        } else {
            "MISSED"
        },
    );
}

/// The conflict radar over 16 task branches of the benchmark repository (each changes a file
/// of its own and a line of a file it shares with every fourth other branch), in memory,
/// against `git merge-tree --write-tree --stdin` merging the same pairs in one process.
fn radar(bench: &Bench) {
    use git2::build::TreeUpdateBuilder;
    let repo = git2::Repository::open(&bench.repo).unwrap();
    let base = repo
        .revparse_single(&bench.base)
        .unwrap()
        .peel_to_commit()
        .unwrap();
    let base_tree = base.tree().unwrap();
    // Paths of the repository's own files to change: one per branch, and four shared ones.
    let mut paths = Vec::new();
    base_tree
        .walk(git2::TreeWalkMode::PreOrder, |dir, entry| {
            if entry.kind() == Some(git2::ObjectType::Blob) && paths.len() < 20 {
                paths.push(format!("{dir}{}", entry.name().unwrap_or_default()));
            }
            git2::TreeWalkResult::Ok
        })
        .unwrap();
    let signature = git2::Signature::now("bench", "bench@example.com").unwrap();
    let mut branches = Vec::new();
    for index in 0..16 {
        let mut update = TreeUpdateBuilder::new();
        let own = repo
            .blob(format!("branch {index} was here\n").as_bytes())
            .unwrap();
        update.upsert(&paths[index], own, git2::FileMode::Blob);
        let shared = repo
            .blob(format!("shared, as branch {index} has it\n").as_bytes())
            .unwrap();
        update.upsert(&paths[16 + index % 4], shared, git2::FileMode::Blob);
        let tree = repo
            .find_tree(update.create_updated(&repo, &base_tree).unwrap())
            .unwrap();
        let commit = repo
            .commit(None, &signature, &signature, "radar", &tree, &[&base])
            .unwrap();
        let name = format!("bench-radar-{index}");
        repo.branch(&name, &repo.find_commit(commit).unwrap(), true)
            .unwrap();
        branches.push((format!("task-{index}"), name));
    }
    let target = repo
        .head()
        .ok()
        .and_then(|head| head.shorthand().ok().map(str::to_owned))
        .unwrap_or_else(|| "main".to_owned());
    let mut pairs = String::new();
    for left in 0..branches.len() {
        for right in left + 1..branches.len() {
            pairs.push_str(&format!("{} {}\n", branches[left].1, branches[right].1));
        }
        pairs.push_str(&format!("{} {target}\n", branches[left].1));
    }
    let mut crew_samples = Samples::default();
    let mut git_samples = Samples::default();
    let mut found = 0;
    for _ in 0..bench.rounds * 2 {
        let started = Instant::now();
        let overlaps =
            crew_worktree::radar::overlaps(&bench.repo, &branches, &[], Some(&target)).unwrap();
        crew_samples.push(started.elapsed());
        found = overlaps.len();
        let started = Instant::now();
        let mut merge = Command::new("git")
            .args(["merge-tree", "--write-tree", "--stdin"])
            .current_dir(&bench.repo)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        use std::io::Write as _;
        merge
            .stdin
            .take()
            .unwrap()
            .write_all(pairs.as_bytes())
            .unwrap();
        assert!(merge.wait().unwrap().code().is_some());
        git_samples.push(started.elapsed());
    }
    // Each group of four branches shares a file: 4 × 6 conflicting pairs.
    assert_eq!(found, 24, "the radar found {found} overlaps");
    Comparison {
        name: format!(
            "conflict radar, 16 branches ({} pairs)",
            pairs.lines().count()
        ),
        crew: crew_samples,
        reference: git_samples,
        reference_name: "git merge-tree --stdin".into(),
        target: Some(1.0),
        paired: true,
    }
    .print();
    for (_, name) in &branches {
        if let Ok(mut branch) = repo.find_branch(name, git2::BranchType::Local) {
            let _ = branch.delete();
        }
    }
}

/// Records `count` finished one-task runs in the state of the project at `root` (through the
/// store, without the agents), as a user's history is: worktree tasks, each leaving its branch
/// with a commit of its own on top of HEAD, none of them merged. (A history of runs without
/// branches hid what `crew runs list` cost a user: judging thousands of branches.)
fn synthesize_runs(root: &Utf8Path, count: usize) {
    use crew_core::model::{RunManifest, RunStatus, TaskRecord, TaskStatus, WorkspaceRecord};
    use crew_core::provider::WorkspaceKind;
    let workspace = Workspace::at_root(root.as_std_path()).unwrap();
    let store = crew_core::StateStore::new(workspace.id(), workspace.repo_root());
    let task = TaskId::parse("shell").unwrap();
    let mode = WorkspaceMode::Worktree;
    let repo = git2::Repository::open(root).unwrap();
    let head = repo.head().unwrap().peel_to_commit().unwrap();
    let signature = git2::Signature::now("crew", "crew@example.com").unwrap();
    for number in 0..count {
        let run = store
            .create_run(|run_id| {
                RunManifest::new(
                    run_id,
                    workspace.id().clone(),
                    mode,
                    vec![TaskRecord::new(
                        task.clone(),
                        "shell".into(),
                        "true".into(),
                        vec![],
                        mode,
                    )],
                )
            })
            .unwrap();
        let branch = {
            let name = format!("crew/{}-{task}", run.run_id);
            let blob = repo
                .blob(format!("the work of run {number}\n").as_bytes())
                .unwrap();
            let mut tree = repo.treebuilder(Some(&head.tree().unwrap())).unwrap();
            tree.insert(format!("history-{number}.txt"), blob, 0o100_644)
                .unwrap();
            let tree = repo.find_tree(tree.write().unwrap()).unwrap();
            let commit = repo
                .commit(None, &signature, &signature, "work", &tree, &[&head])
                .unwrap();
            repo.branch(&name, &repo.find_commit(commit).unwrap(), false)
                .unwrap();
            name
        };
        store
            .update_run(&run.run_id, |manifest| {
                for status in [
                    TaskStatus::Preparing,
                    TaskStatus::Running,
                    TaskStatus::Succeeded,
                ] {
                    manifest.set_task_status(&task, status)?;
                }
                let dir = root
                    .join(".worktrees")
                    .join(run.run_id.as_str())
                    .join("shell");
                manifest.task_mut(&task)?.workspace = Some(WorkspaceRecord {
                    kind: WorkspaceKind::Worktree,
                    root: dir.clone(),
                    dir,
                    branch: Some(branch.clone()),
                    base_commit: Some(head.id().to_string()),
                    reused: false,
                    identity: None,
                    writable: Vec::new(),
                    read_only: Vec::new(),
                });
                manifest.set_status(RunStatus::Completed)
            })
            .unwrap();
    }
}

/// CPU time (user and system) of this process, all its threads.
fn own_cpu() -> Duration {
    cpu_of(libc::RUSAGE_SELF)
}

fn cpu_of(who: libc::c_int) -> Duration {
    // SAFETY: getrusage writes into the struct it is given, nothing else.
    #[allow(unsafe_code)]
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(who, &mut usage);
        usage
    };
    timeval(usage.ru_utime) + timeval(usage.ru_stime)
}

fn timeval(time: libc::timeval) -> Duration {
    Duration::from_secs(time.tv_sec as u64) + Duration::from_micros(time.tv_usec as u64)
}

/// A run of 100 `true` tasks, 8 at once, in worktrees of a clone of the benchmark repository,
/// through the `crew` binary, from a full pool (as the pool's refill leaves it): the host's peak
/// memory, and its CPU per task beyond what the same 100 workspaces cost the worktree provider
/// alone (in this process, 8 threads, from the same full pool) and what 100 `sh -c true` cost.
fn hundred_tasks(bench: &Bench) {
    const TASKS: usize = 100;
    const PARALLEL: usize = 8;
    let crew = crew_binary();
    let project = clone_repository(bench, "hundred-project");
    let config = "[worktree]\npool_size = 8\n\n[retention]\nautomatic = false\n";
    std::fs::create_dir_all(project.join(".crew")).unwrap();
    std::fs::write(project.join(".crew/config.toml"), config).unwrap();
    let workspace = Workspace::at_root(project.as_std_path()).unwrap();
    let mut settings = ProjectConfig::default();
    settings.worktree.pool_size = PARALLEL;
    let provider = Arc::new(CrewWorkspaces::new(&settings));
    let head = Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(&project)
        .output()
        .unwrap();
    let base = String::from_utf8(head.stdout).unwrap().trim().to_owned();
    let empty_pool = || {
        crew_worktree::pool::empty(&project.join(".git"), &project, &settings.worktree);
    };
    let fill_pool = || {
        empty_pool();
        let filled = crew_worktree::pool::refill_at_head(&project, &settings.worktree, || false);
        assert_eq!(filled.ok(), Some(PARALLEL), "the pool fills");
    };

    // The workspaces alone: 8 workers, each preparing and tearing down task after task.
    fill_pool();
    let run_id = RunId::generate();
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let before = own_cpu();
    let workers: Vec<_> = (0..PARALLEL)
        .map(|_| {
            let (provider, next, run_id) = (provider.clone(), next.clone(), run_id.clone());
            let (id, project, base) = (workspace.id().clone(), project.clone(), base.clone());
            std::thread::spawn(move || {
                loop {
                    let index = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    if index >= TASKS {
                        break;
                    }
                    let task_id = TaskId::parse(&format!("task{index}")).unwrap();
                    let request = WorkspaceRequest {
                        workspace: id.clone(),
                        repo_root: Some(project.clone()),
                        invocation_dir: Utf8PathBuf::new(),
                        run_id: run_id.clone(),
                        task_id: task_id.clone(),
                        mode: WorkspaceMode::Worktree,
                        base: Some(base.clone()),
                        upstream: Vec::new(),
                        progress: None,
                        env: Vec::new(),
                        unconfined: false,
                    };
                    let allocated = provider.allocate(&request).unwrap();
                    let teardown = TeardownRequest {
                        workspace: id.clone(),
                        repo_root: Some(project.clone()),
                        run_id: run_id.clone(),
                        task_id,
                        agent_alive: false,
                        keep: false,
                        placed_for: None,
                    };
                    provider.teardown(&allocated, &teardown).unwrap();
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().unwrap();
    }
    let workspaces_cpu = own_cpu() - before;

    // The run, through the binary, from the same full pool; three rounds, the host's own
    // memory their median (the peak of eight checkouts and teardowns at once varies by a
    // third from round to round).
    let fan_out = |mode: &str| fan_out_true(&crew, &project, mode, TASKS, PARALLEL);
    let mut runs: Vec<Measured> = (0..3)
        .map(|_| {
            fill_pool();
            fan_out("worktree")
        })
        .collect();
    runs.sort_by_key(|run| run.peak_anonymous_kb);
    let own_memory = runs
        .iter()
        .map(|run| run.peak_anonymous_kb / 1024)
        .collect::<Vec<_>>();
    let run = runs.swap_remove(1);
    // crew's own work per task, with no git work at all: the same run in the project itself,
    // five rounds, each beside a round of the agents alone, as every other line takes its
    // median of rounds.
    let (mut own, mut agents, mut single) =
        (Samples::default(), Samples::default(), Samples::default());
    for _ in 0..5 {
        let agents_cpu = agents_alone_cpu(TASKS);
        let run = fan_out("single");
        own.push(run.cpu.saturating_sub(agents_cpu) / TASKS as u32);
        agents.push(agents_cpu / TASKS as u32);
        single.push(run.elapsed);
    }
    empty_pool();

    let per_task = |cpu: Duration| cpu / TASKS as u32;
    let own_mb = run.peak_anonymous_kb / 1024;
    println!(
        "{:<44} in {}; {} CPU per task, the workspaces alone {} ({:.2}×); host peak RSS {} MB, of which {} MB its own memory [{} … {} MB in 3 rounds] (≤ 64 MB: {}) and {} MB the repository's pack as libgit2 maps it",
        "100 tasks, 8 at once, worktrees (crew run)",
        seconds(run.elapsed),
        seconds(per_task(run.cpu)),
        seconds(per_task(workspaces_cpu)),
        run.cpu.as_secs_f64() / workspaces_cpu.as_secs_f64(),
        run.peak_rss_kb / 1024,
        own_mb,
        own_memory[0],
        own_memory[2],
        if own_mb <= 64 { "met" } else { "MISSED" },
        run.peak_pack_kb / 1024,
    );
    let times = own.median().as_secs_f64() / agents.median().as_secs_f64();
    println!(
        "{:<44} {} [{} … {}] per task, {times:.2}× an agent's own {} (≤ {OWN_CPU_TIMES:.0}×: {}); a run in {}",
        "100 tasks, 8 at once: crew's own CPU",
        seconds(own.median()),
        seconds(own.min()),
        seconds(own.max()),
        seconds(agents.median()),
        if times <= OWN_CPU_TIMES {
            "met"
        } else {
            "MISSED"
        },
        seconds(single.median()),
    );
}

/// What crew's own CPU for a task may be, against an agent's own (`sh -c true`, started by the
/// benchmark beside each round): what crew does to start, follow and end one agent, in units of
/// what the kernel and the dynamic loader cost the agent itself, which a slower host raises on
/// both sides (BENCHMARKS.md has where the figure came from).
const OWN_CPU_TIMES: f64 = 6.0;

/// `crew run --fan-out tasks` of the shell agent's `true` in `mode`, `parallel` at once,
/// measured.
fn fan_out_true(
    crew: &Utf8Path,
    project: &Utf8Path,
    mode: &str,
    tasks: usize,
    parallel: usize,
) -> Measured {
    let (tasks, parallel) = (tasks.to_string(), parallel.to_string());
    run_measured(
        crew,
        project,
        &[
            "run",
            "--agent",
            "shell",
            "--workspace-mode",
            mode,
            "--fan-out",
            &tasks,
            "--max-parallel",
            &parallel,
            "--quiet",
            "true",
        ],
    )
}

/// The CPU of `tasks` agents that do nothing (`sh -c true`), run one after another: what a run
/// of as many one-line tasks spends beyond crew's own work.
fn agents_alone_cpu(tasks: usize) -> Duration {
    let before = cpu_of(libc::RUSAGE_CHILDREN);
    for _ in 0..tasks {
        assert!(
            Command::new("sh")
                .args(["-c", "true"])
                .status()
                .unwrap()
                .success()
        );
    }
    cpu_of(libc::RUSAGE_CHILDREN) - before
}

/// A run of 1,000 one-line tasks against one of 100, in the project itself (no git work),
/// 16 at once: crew's own CPU per task (the run's, less the same number of agents run alone),
/// which must not grow with the run; the host's own memory; and how long `crew agents list`
/// and `crew runs show` take while the 1,000 run, against the same commands idle.
fn thousand_tasks(bench: &Bench) {
    let crew = crew_binary();
    let project = clone_repository(bench, "thousand-project");
    std::fs::create_dir_all(project.join(".crew")).unwrap();
    std::fs::write(
        project.join(".crew/config.toml"),
        "[retention]\nautomatic = false\n",
    )
    .unwrap();
    let run = |tasks: usize| fan_out_true(&crew, &project, "single", tasks, 16);
    let rounds = bench.rounds.min(3);
    let mut own = [Samples::default(), Samples::default()];
    let mut alone = Samples::default();
    let mut elapsed = [Samples::default(), Samples::default()];
    let mut memory_mb = 0;
    for _ in 0..rounds {
        for (side, tasks) in [100, 1000].into_iter().enumerate() {
            let agents = agents_alone_cpu(tasks);
            let measured = run(tasks);
            own[side].push(measured.cpu.saturating_sub(agents) / tasks as u32);
            alone.push(agents / tasks as u32);
            elapsed[side].push(measured.elapsed);
            memory_mb = memory_mb.max(measured.peak_anonymous_kb / 1024);
        }
    }
    // One more 1,000-task run, with a reader listing the agents and showing the run meanwhile.
    let running = project.join(".crew/state/running");
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (crew, project, done) = (crew.clone(), project.clone(), done.clone());
        std::thread::spawn(move || {
            let (mut list, mut show) = (Samples::default(), Samples::default());
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                let run = std::fs::read_dir(&running)
                    .ok()
                    .and_then(|mut dir| dir.next())
                    .and_then(|entry| entry.ok())
                    .map(|entry| entry.file_name().to_string_lossy().into_owned());
                let Some(run) = run else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                list.push(timed_crew(&crew, &project, &["agents", "list"]));
                show.push(timed_crew(&crew, &project, &["runs", "show", &run]));
            }
            (list, show)
        })
    };
    let during_run = run(1000);
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let (list_during, show_during) = reader.join().unwrap();
    let last = std::fs::read_dir(project.join(".crew/state/runs"))
        .unwrap()
        .filter_map(|entry| entry.ok())
        .max_by_key(|entry| entry.metadata().unwrap().modified().unwrap())
        .unwrap()
        .file_name()
        .to_string_lossy()
        .into_owned();
    let board = board_during_thousand(bench, &crew, &project, &run);
    let (mut list_idle, mut show_idle) = (Samples::default(), Samples::default());
    for _ in 0..bench.rounds {
        list_idle.push(timed_crew(&crew, &project, &["agents", "list"]));
        show_idle.push(timed_crew(&crew, &project, &["runs", "show", &last]));
    }

    let flat = own[1].median().as_secs_f64() / own[0].median().as_secs_f64();
    let times = own[1].median().as_secs_f64() / alone.median().as_secs_f64();
    println!(
        "{:<44} {:<28} {:<28} {:>6.2}×  ≤ 1.20× {}; {times:.2}× an agent's own {} (≤ {OWN_CPU_TIMES:.0}×: {})",
        "crew's own CPU a task, 1,000 against 100",
        own[1].show(),
        own[0].show(),
        flat,
        if flat <= 1.2 { "met" } else { "MISSED" },
        seconds(alone.median()),
        if times <= OWN_CPU_TIMES {
            "met"
        } else {
            "MISSED"
        },
    );
    println!(
        "{:<44} 1,000 tasks in {} ({} a task), 100 in {} ({} a task); host's own memory {} MB (≤ 64 MB: {})",
        "1,000 one-line tasks, 16 at once, single",
        elapsed[1].show(),
        seconds(elapsed[1].median() / 1000),
        elapsed[0].show(),
        seconds(elapsed[0].median() / 100),
        memory_mb,
        if memory_mb <= 64 { "met" } else { "MISSED" },
    );
    for (name, during, idle) in [
        (
            "crew agents list during a 1,000-task run",
            &list_during,
            &list_idle,
        ),
        (
            "crew runs show during a 1,000-task run",
            &show_during,
            &show_idle,
        ),
    ] {
        if during.0.is_empty() {
            println!("{name:<44} not measured: the run ended before a listing began");
            continue;
        }
        println!(
            "{:<44} {:<28} {:<28} {:>6.2}×  ({} times during a run of {}; idle after it)",
            name,
            during.show(),
            idle.show(),
            during.median().as_secs_f64() / idle.median().as_secs_f64(),
            during.0.len(),
            seconds(during_run.elapsed),
        );
    }
    if let Some(board) = board {
        println!("{board}");
    }
}

/// `crew watch` watching one more 1,000-task run of `run`: how long `?` takes to show and hide
/// the keys while the run goes, against the same board once the run is over and the board has
/// every task on it; how long after the run's end that took; the board's peak memory.
fn board_during_thousand(
    bench: &Bench,
    crew: &Utf8Path,
    project: &Utf8Path,
    run: &(dyn Fn(usize) -> Measured + Sync),
) -> Option<String> {
    if !tmux_installed() {
        println!(
            "{:<44} skipped: tmux is not installed",
            "crew watch during a 1,000-task run"
        );
        return None;
    }
    let board = Board::start(crew, project, &bench.root, "thousand-board");
    board.wait_for("the board", &|screen| screen.contains("crew watch"));
    let agents_shown = |screen: &str| {
        screen
            .split_once("agents: ")
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .and_then(|count| count.parse::<usize>().ok())
            .unwrap_or(0)
    };
    let before = agents_shown(&board.screen());
    let done = std::sync::atomic::AtomicBool::new(false);
    let (during, ended) = std::thread::scope(|scope| {
        let keys = scope.spawn(|| {
            let mut during = Samples::default();
            while !done.load(std::sync::atomic::Ordering::SeqCst) || during.0.is_empty() {
                during.push(board.toggle_keys());
            }
            during
        });
        run(1000);
        let ended = Instant::now();
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        (keys.join().unwrap(), ended)
    });
    board.wait_for("the run's 1,000 tasks", &|screen| {
        agents_shown(screen) >= before + 1000
    });
    let caught_up = ended.elapsed();
    let mut idle = Samples::default();
    for _ in 0..bench.rounds {
        idle.push(board.toggle_keys());
    }
    let line = format!(
        "{:<44} {:<28} {:<28} {:>6.2}×  ({} keys during the run; every task on the board {} after its end; board peak memory {})",
        "crew watch: a key on screen, 1,000-task run",
        during.show(),
        idle.show(),
        during.median().as_secs_f64() / idle.median().as_secs_f64(),
        during.0.len(),
        seconds(caught_up),
        board.peak_memory(),
    );
    board.quit();
    Some(line)
}

/// How long `crew args…` took in `dir`, which must succeed.
fn timed_crew(crew: &Utf8Path, dir: &Utf8Path, args: &[&str]) -> Duration {
    let started = Instant::now();
    let output = Command::new(crew)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    started.elapsed()
}

/// A task on a `local` placement (its agent in the clone `crew shim` keeps, its work back
/// through a pack, checked) against the same one-task run in a local worktree; and the host's
/// own memory per placed task, from a run of 1 placed task to one of 17 at once.
fn placement(bench: &Bench) {
    let crew = crew_binary();
    let project = clone_repository(bench, "placement-project");
    let shim = bench.root.join("placement-shim");
    std::fs::create_dir_all(project.join(".crew")).unwrap();
    std::fs::write(
        project.join(".crew/config.toml"),
        format!(
            "[retention]\nautomatic = false\n\n[placements.box]\nkind = \"local\"\ndir = \"{shim}\"\n"
        ),
    )
    .unwrap();
    let timed = |args: &[&str]| timed_crew(&crew, &project, args);
    let placed: &[&str] = &[
        "run",
        "--quiet",
        "--placement",
        "box",
        "--agent",
        "shell",
        "true",
    ];
    let local: &[&str] = &[
        "run",
        "--quiet",
        "--workspace-mode",
        "worktree",
        "--agent",
        "shell",
        "true",
    ];
    // Once each first: the clone takes in the base's history, and the pool fills.
    timed(placed);
    timed(local);
    let (mut crew_samples, mut reference) = (Samples::default(), Samples::default());
    for round in 0..bench.rounds * 2 {
        if round % 2 == 0 {
            crew_samples.push(timed(placed));
            reference.push(timed(local));
        } else {
            reference.push(timed(local));
            crew_samples.push(timed(placed));
        }
    }
    Comparison {
        name: "one task on a local placement (crew run)".into(),
        crew: crew_samples,
        reference,
        reference_name: "in a local worktree".into(),
        target: Some(1.5),
        paired: true,
    }
    .print();

    let fan_out = |count: &str| {
        run_measured(
            &crew,
            &project,
            &[
                "run",
                "--quiet",
                "--placement",
                "box",
                "--agent",
                "shell",
                "--fan-out",
                count,
                "--max-parallel",
                count,
                "sleep 2",
            ],
        )
    };
    let one = fan_out("1");
    let many = fan_out("17");
    let per_task_kb = many.peak_anonymous_kb.saturating_sub(one.peak_anonymous_kb) / 16;
    println!(
        "{:<44} {} KB of the host's own memory per placed task ({} MB with 1, {} MB with 17; ≤ 2 MB: {})",
        "placed tasks: host memory per task",
        per_task_kb,
        one.peak_anonymous_kb / 1024,
        many.peak_anonymous_kb / 1024,
        if per_task_kb <= 2048 { "met" } else { "MISSED" },
    );
}

/// What one `crew` command cost: its time, its CPU with its children's, its peak resident
/// memory, and — sampled from /proc every 20 ms — the peaks of its anonymous memory and of the
/// pack files mapped in it.
/// A load of the benchmark's own (`-- --load`): one thread per core, each alternating a short
/// stretch of arithmetic with system calls that enter the kernel and touch the file system
/// (`getppid`, `stat` of the working directory), until dropped.
struct HostLoad {
    stop: Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl HostLoad {
    fn start() -> Self {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let cores = std::thread::available_parallelism().map_or(2, |cores| cores.get());
        let threads = (0..cores)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut sum = 0u64;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        for step in 0..20_000u64 {
                            sum = std::hint::black_box(sum.wrapping_mul(31).wrapping_add(step));
                        }
                        for _ in 0..20 {
                            std::hint::black_box(rustix::process::getppid());
                            // The call is the load; what it found is not needed.
                            let _ = std::hint::black_box(std::fs::metadata("."));
                        }
                    }
                })
            })
            .collect();
        println!("under a load of {cores} threads (arithmetic and system calls), one per core");
        HostLoad { stop, threads }
    }
}

impl Drop for HostLoad {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            // A load thread that panicked leaves nothing to clean up.
            let _ = thread.join();
        }
    }
}

struct Measured {
    elapsed: Duration,
    cpu: Duration,
    peak_rss_kb: u64,
    peak_anonymous_kb: u64,
    peak_pack_kb: u64,
}

fn run_measured(crew: &Utf8Path, dir: &Utf8Path, args: &[&str]) -> Measured {
    // Reaped by the wait4 below, which also gives its resource usage.
    #[allow(clippy::zombie_processes)]
    let child = Command::new(crew)
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let pid = child.id();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let done = done.clone();
        std::thread::spawn(move || {
            let (mut anonymous, mut pack) = (0u64, 0u64);
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                if let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/smaps")) {
                    let (now_anonymous, now_pack) = mapped_kb(&maps);
                    anonymous = anonymous.max(now_anonymous);
                    pack = pack.max(now_pack);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            (anonymous, pack)
        })
    };
    // SAFETY: wait4 on our own child, with buffers it fills.
    #[allow(unsafe_code)]
    let (status, usage) = unsafe {
        let mut status = 0;
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::wait4(pid as libc::pid_t, &mut status, 0, &mut usage);
        (status, usage)
    };
    let elapsed = started.elapsed();
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let (peak_anonymous_kb, peak_pack_kb) = sampler.join().unwrap();
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{args:?} failed"
    );
    Measured {
        elapsed,
        cpu: timeval(usage.ru_utime) + timeval(usage.ru_stime),
        peak_rss_kb: usage.ru_maxrss as u64,
        peak_anonymous_kb,
        peak_pack_kb,
    }
}

/// The anonymous memory of a process, and the resident pages of the `.pack` files it maps, from
/// its `/proc/<pid>/smaps`.
fn mapped_kb(smaps: &str) -> (u64, u64) {
    let (mut anonymous, mut pack) = (0, 0);
    let mut in_pack = false;
    for line in smaps.lines() {
        let mut fields = line.split_whitespace();
        match fields.next() {
            Some("Anonymous:") => {
                anonymous += fields.next().and_then(|kb| kb.parse().ok()).unwrap_or(0)
            }
            Some("Rss:") if in_pack => {
                pack += fields
                    .next()
                    .and_then(|kb| kb.parse::<u64>().ok())
                    .unwrap_or(0)
            }
            Some(range) if range.contains('-') && !range.ends_with(':') => {
                in_pack = line.ends_with(".pack");
            }
            _ => {}
        }
    }
    (anonymous, pack)
}

/// A clone of the benchmark repository (`--shared`: its objects are the same files) at
/// `<root>/<name>`.
fn clone_repository(bench: &Bench, name: &str) -> Utf8PathBuf {
    let project = bench.root.join(name);
    let cloned = Command::new("git")
        .args([
            "clone",
            "-q",
            "--shared",
            bench.repo.as_str(),
            project.as_str(),
        ])
        .status()
        .unwrap();
    assert!(cloned.success());
    project
}

/// What a project's history costs: `crew runs list` and `crew run` of one `true` task with
/// 2,000 finished runs against the same with 20, and `crew agents list` with 2,000 finished
/// runs and 3 live runs of 16 agents against `git worktree list`.
///
/// The two histories are two clones of the repository, made first and written back; then each
/// round times a command in one and in the other, taking turns at going first, and the ratio is
/// the median of the rounds' ratios. (The first version timed 20 runs, then wrote 1,980 more
/// and timed again: the second side met a file system still writing those 6,000 files, and
/// printed 1.06–1.52× for the same code.)
fn history(bench: &Bench) {
    let crew = crew_binary();
    let with_runs = |name: &str, runs: usize| {
        let project = clone_repository(bench, name);
        // Retention would prune the history this measures.
        std::fs::create_dir_all(project.join(".crew")).unwrap();
        std::fs::write(
            project.join(".crew/config.toml"),
            "[retention]\nautomatic = false\n",
        )
        .unwrap();
        // As a user's history is: worktree tasks whose branches hold their work.
        synthesize_runs(&project, runs);
        project
    };
    let few = with_runs("history-few", 20);
    let project = with_runs("history-project", 2000);
    settle_disk();
    let rounds = bench.rounds * 4;
    let paired = |args: &[&str]| {
        let (mut many_samples, mut few_samples) = (Samples::default(), Samples::default());
        for round in 0..rounds {
            if round % 2 == 0 {
                many_samples.push(timed_crew(&crew, &project, args));
                few_samples.push(timed_crew(&crew, &few, args));
            } else {
                few_samples.push(timed_crew(&crew, &few, args));
                many_samples.push(timed_crew(&crew, &project, args));
            }
        }
        (many_samples, few_samples)
    };
    let run_true = [
        "run",
        "--agent",
        "shell",
        "--workspace-mode",
        "single",
        "true",
    ];
    let (list_2000, list_20) = paired(&["runs", "list"]);
    let (run_2000, run_20) = paired(&run_true);
    Comparison {
        name: "crew runs list, 2,000 runs of history".into(),
        crew: list_2000,
        reference: list_20,
        reference_name: "20 runs".into(),
        target: Some(1.5),
        paired: true,
    }
    .print();
    Comparison {
        name: "crew run (one `true`), 2,000 runs of history".into(),
        crew: run_2000,
        reference: run_20,
        reference_name: "20 runs".into(),
        target: Some(1.1),
        paired: true,
    }
    .print();

    agents_list_beside_live_runs(
        &project,
        bench.rounds,
        "crew agents list, 2,000 runs + 3 × 16 live",
        &["--workspace-mode", "single"],
    );
}

/// The share of a core process `pid` used over `span` (user and system time).
fn cpu_share(pid: u32, span: Duration) -> f64 {
    let ticks = || {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map_or(vec![], |(_, rest)| rest.split_whitespace().collect());
        // utime and stime are the 12th and 13th fields after the command.
        fields
            .get(11)
            .and_then(|utime| utime.parse::<u64>().ok())
            .unwrap_or(0)
            + fields
                .get(12)
                .and_then(|stime| stime.parse::<u64>().ok())
                .unwrap_or(0)
    };
    let before = ticks();
    std::thread::sleep(span);
    (ticks() - before) as f64 / 100.0 / span.as_secs_f64()
}

fn tmux_installed() -> bool {
    Command::new("tmux")
        .arg("-V")
        .output()
        .is_ok_and(|output| output.status.success())
}

/// `crew watch` in a terminal (tmux) beside runs of this process's own making:
/// - its CPU while 50 agents print a line a second each, and while 50 agents print nothing;
/// - beside 200 agents, one of them printing 100 MB: how long a key takes to show on the
///   screen, against the same key before that agent starts (the reference), and the board's
///   peak memory.
fn board(bench: &Bench) {
    if !tmux_installed() {
        println!("{:<44} skipped: tmux is not installed", "crew watch");
        return;
    }
    let project = bench.root.join("board-project");
    std::fs::create_dir_all(&project).unwrap();
    let crew = crew_binary();
    let board = Board::start(&crew, &project, &bench.root, "board");
    board.wait_for("the empty board", &|screen| screen.contains("no runs yet"));
    let wait_for = |what: &str, ready: &dyn Fn(&str) -> bool| board.wait_for(what, ready);
    let start = |agents: usize, script: &str| -> String {
        let output = Command::new(&crew)
            .args([
                "run",
                "--detach",
                "--agent",
                "shell",
                "--workspace-mode",
                "single",
            ])
            .args([
                "--fan-out",
                &agents.to_string(),
                "--max-parallel",
                &agents.to_string(),
            ])
            .arg(script)
            .current_dir(&project)
            .stderr(Stdio::null())
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stdout)
        );
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    };
    let cancel = |run: &str| {
        let _ = Command::new(&crew)
            .args(["runs", "cancel", "--force", run])
            .current_dir(&project)
            .output();
    };
    let working = |screen: &str| screen.matches(" working ").count();

    let printing = start(50, "while true; do echo line; sleep 1; done");
    wait_for("50 printing agents", &|screen| working(screen) >= 50);
    // Settled: the new host found, the listing's lookups over.
    std::thread::sleep(Duration::from_secs(8));
    let busy = cpu_share(board.pid, Duration::from_secs(10));
    cancel(&printing);
    wait_for("the printing run's end", &|screen| working(screen) == 0);

    let quiet = start(50, "sleep 600");
    wait_for("50 quiet agents", &|screen| working(screen) >= 50);
    std::thread::sleep(Duration::from_secs(8));
    let idle = cpu_share(board.pid, Duration::from_secs(10));
    println!(
        "{:<44} board CPU {:.2}% of a core (≤ 5%: {})",
        "crew watch, 50 agents printing 1 line/s",
        busy * 100.0,
        if busy <= 0.05 { "met" } else { "MISSED" }
    );
    println!(
        "{:<44} board CPU {:.2}% of a core (≤ 0.5%: {})",
        "crew watch, 50 quiet agents",
        idle * 100.0,
        if idle <= 0.005 { "met" } else { "MISSED" }
    );

    // 200 agents: how long `?` takes to open the keys and close them again.
    let more = start(149, "sleep 600");
    wait_for("199 agents", &|screen| screen.contains("working: 199 "));
    let toggle = || board.toggle_keys();
    let reference: Vec<Duration> = (0..5).map(|_| toggle()).collect();
    let flood = start(
        1,
        "head -c 100000000 /dev/zero | tr '\\0' x | fold -w 99; echo flood-done; sleep 600",
    );
    let flooding = Instant::now();
    let mut loaded = Vec::new();
    // Keys while it prints (at least one).
    while loaded.is_empty() || !board.screen().contains("flood-done") {
        loaded.push(toggle());
        assert!(
            flooding.elapsed() < Duration::from_secs(600),
            "the flood never ended"
        );
    }
    let flooded = flooding.elapsed();
    let peak = board.peak_memory();
    let median = |mut samples: Vec<Duration>| {
        samples.sort();
        samples[samples.len() / 2]
    };
    let keys = loaded.len();
    let (loaded, reference) = (median(loaded), median(reference));
    println!(
        "{:<44} a key on screen in {} (idle board: {}; {:.1}×; {keys} keys while 100 MB came in {}), board peak memory {peak}",
        "crew watch, 200 agents, one printing 100 MB",
        seconds(loaded),
        seconds(reference),
        loaded.as_secs_f64() / reference.as_secs_f64(),
        seconds(flooded),
    );
    for run in [&quiet, &more, &flood] {
        cancel(run);
    }
    board.quit();
}

/// `crew run` of 200 sleeping agents drawing its live block in a terminal (tmux): the host's
/// CPU while they sleep, against the same run printing to a pipe. The block redraws at most ten
/// times a second and once a second for the elapsed times; it must stay within the idle target.
fn live_block(bench: &Bench) {
    if !tmux_installed() {
        println!(
            "{:<44} skipped: tmux is not installed",
            "200 agents, live block"
        );
        return;
    }
    const AGENTS: &str = "200";
    let project = bench.root.join("block-project");
    std::fs::create_dir_all(&project).unwrap();
    let crew = crew_binary();
    let pid_file = bench.root.join("block.pid");
    let run = format!(
        "echo $$ > {pid_file}; exec {crew} run --agent shell --workspace-mode single --fan-out {AGENTS} 'sleep 20'"
    );
    // The host's CPU share over three seconds once every agent is asleep.
    let measure = |pid: u32| cpu_share(pid, Duration::from_secs(3));
    let wait_for_agents = || {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let listed = Command::new(&crew)
                .args(["agents", "list", "--json"])
                .current_dir(&project)
                .output()
                .unwrap();
            let running = serde_json::from_slice::<serde_json::Value>(&listed.stdout)
                .ok()
                .and_then(|agents| agents.as_array().map(Vec::len))
                .unwrap_or(0);
            if running >= 200 || Instant::now() > deadline {
                // Their starts are over; give the host a moment to settle.
                std::thread::sleep(Duration::from_secs(1));
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    let pid = || {
        std::fs::read_to_string(&pid_file)
            .unwrap()
            .trim()
            .parse::<u32>()
            .unwrap()
    };

    // In a terminal: the block.
    let socket = bench.root.join("block-tmux.sock");
    let tmux = |args: &[&str]| {
        Command::new("tmux")
            .args(["-u", "-S", socket.as_str()])
            .args(args)
            .current_dir(&project)
            .output()
            .unwrap()
    };
    tmux(&[
        "new-session",
        "-d",
        "-x",
        "120",
        "-y",
        "40",
        "sh",
        "-c",
        &run,
    ]);
    wait_for_agents();
    let host = pid();
    let with_block = measure(host);
    // crew ignores the hangup of its terminal: it goes by KILL, and its agents with it.
    let _ = Command::new("kill")
        .args(["-9", &host.to_string()])
        .status();
    tmux(&["kill-server"]);
    std::thread::sleep(Duration::from_secs(2));

    // Piped: appended lines.
    let mut piped = Command::new("sh")
        .args(["-c", &run])
        .current_dir(&project)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for_agents();
    let without = measure(pid());
    let _ = piped.kill();
    let _ = piped.wait();
    println!(
        "{:<44} host CPU {:.2}% of a core (piped: {:.2}%; ≤ 2%: {})",
        "200 sleeping agents, live block",
        with_block * 100.0,
        without * 100.0,
        if with_block <= 0.02 { "met" } else { "MISSED" }
    );
}
