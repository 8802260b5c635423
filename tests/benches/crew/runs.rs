//! Runs of a hundred and a thousand tasks: time, CPU, memory, the board meanwhile.

use super::*;

/// Records `count` finished one-task runs in the state of the project at `root` (through the
/// store, without the agents), as a user's history is: worktree tasks, each leaving its branch
/// with a commit of its own on top of HEAD, none of them merged. (A history of runs without
/// branches hid what `crew runs list` cost a user: judging thousands of branches.)
pub(super) fn synthesize_runs(root: &Utf8Path, count: usize) {
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
pub(super) fn own_cpu() -> Duration {
    cpu_of(libc::RUSAGE_SELF)
}

pub(super) fn cpu_of(who: libc::c_int) -> Duration {
    // SAFETY: getrusage writes into the struct it is given, nothing else.
    #[allow(unsafe_code)]
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(who, &mut usage);
        usage
    };
    timeval(usage.ru_utime) + timeval(usage.ru_stime)
}

pub(super) fn timeval(time: libc::timeval) -> Duration {
    Duration::from_secs(time.tv_sec as u64) + Duration::from_micros(time.tv_usec as u64)
}

/// A run of 100 `true` tasks, 8 at once, in worktrees of a clone of the benchmark repository,
/// through the `crew` binary, from a full pool (as the pool's refill leaves it): the host's peak
/// memory, and its CPU per task beyond what the same 100 workspaces cost the worktree provider
/// alone (in this process, 8 threads, from the same full pool) and what 100 `sh -c true` cost.
pub(super) fn hundred_tasks(bench: &Bench) {
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
pub(super) const OWN_CPU_TIMES: f64 = 6.0;

/// `crew run --fan-out tasks` of the shell agent's `true` in `mode`, `parallel` at once,
/// measured.
pub(super) fn fan_out_true(
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
pub(super) fn agents_alone_cpu(tasks: usize) -> Duration {
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
pub(super) fn thousand_tasks(bench: &Bench) {
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
pub(super) fn board_during_thousand(
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
