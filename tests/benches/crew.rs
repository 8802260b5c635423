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
#[path = "crew/worktrees.rs"]
mod worktrees;
use worktrees::*;
#[path = "crew/listing.rs"]
mod listing;
use listing::*;
#[path = "crew/agents.rs"]
mod agents;
use agents::*;
#[path = "crew/runs.rs"]
mod runs;
use runs::*;
#[path = "crew/placement.rs"]
mod placement;
use placement::*;
#[path = "crew/terminal.rs"]
mod terminal;
use terminal::*;

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
    "caps",
    "block",
    "board",
    "radar",
    "history",
    "hundred",
    "placement",
    "slurm",
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
    if wanted("caps") {
        caps(&bench);
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
    if wanted("slurm") {
        slurm(&bench);
    }
    if wanted("thousand") {
        thousand_tasks(&bench);
    }

    let _ = std::fs::remove_dir_all(&root);
    if let Some(installed) = INSTALLED_CREW.get().and_then(|crew| crew.parent()) {
        let _ = std::fs::remove_dir_all(installed);
    }
}
