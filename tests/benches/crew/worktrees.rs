//! The worktree lines: fresh and recycled worktrees, warm builds, teardowns, eight at once, linking.

use super::*;

/// Bytes of the files below `dir`, `.git` aside.
pub(super) fn du(dir: &Utf8Path) -> u64 {
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
pub(super) fn flush_writeback() {
    let _ = Command::new("sync").status();
}

pub(super) fn fresh_worktrees(bench: &mut Bench) {
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
pub(super) fn recycled(bench: &mut Bench) {
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
pub(super) fn warm_builds(bench: &Bench) {
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
pub(super) fn committed_teardown(bench: &Bench) {
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

pub(super) fn recycled_round(
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
pub(super) fn fresh_after_deletion(bench: &mut Bench) {
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
pub(super) enum Disk {
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
pub(super) fn eight_at_once(bench: &mut Bench, disk: Disk) {
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
pub(super) fn settle_disk() {
    // SAFETY: sync takes no arguments and only flushes the page cache.
    #[allow(unsafe_code)]
    unsafe {
        libc::sync();
    }
}

/// Linking `node_modules` into a worktree: 50,000 files against 10, measured alternately so that
/// neither meets the file system in another state.
pub(super) fn linking(bench: &Bench) {
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
