//! Placements, a host under load, cloning and history.

use super::*;

/// How long `crew args…` took in `dir`, which must succeed.
pub(super) fn timed_crew(crew: &Utf8Path, dir: &Utf8Path, args: &[&str]) -> Duration {
    timed_crew_with(crew, dir, args, &[])
}

/// [`timed_crew`] with `env` set for it.
pub(super) fn timed_crew_with(
    crew: &Utf8Path,
    dir: &Utf8Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> Duration {
    let started = Instant::now();
    let output = Command::new(crew)
        .envs(env.iter().copied())
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
pub(super) fn placement(bench: &Bench) {
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
pub(super) struct HostLoad {
    stop: Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl HostLoad {
    pub(super) fn start() -> Self {
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

pub(super) struct Measured {
    pub(super) elapsed: Duration,
    pub(super) cpu: Duration,
    pub(super) peak_rss_kb: u64,
    pub(super) peak_anonymous_kb: u64,
    pub(super) peak_pack_kb: u64,
}

pub(super) fn run_measured(crew: &Utf8Path, dir: &Utf8Path, args: &[&str]) -> Measured {
    run_measured_with(crew, dir, args, &[])
}

/// [`run_measured`] with `env` set for it.
pub(super) fn run_measured_with(
    crew: &Utf8Path,
    dir: &Utf8Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> Measured {
    // Reaped by the wait4 below, which also gives its resource usage.
    #[allow(clippy::zombie_processes)]
    let child = Command::new(crew)
        .envs(env.iter().copied())
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
pub(super) fn mapped_kb(smaps: &str) -> (u64, u64) {
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
pub(super) fn clone_repository(bench: &Bench, name: &str) -> Utf8PathBuf {
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
pub(super) fn history(bench: &Bench) {
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
pub(super) fn cpu_share(pid: u32, span: Duration) -> f64 {
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

/// A task on a Slurm placement (a job of a one-node cluster the benchmark starts: `srun`, the
/// shim in the job's step, the work back over `srun`) against the same task on a `local`
/// placement in the same run of the benchmark; and the host's own memory per task placed
/// there, from 1 job to 17 at once.
pub(super) fn slurm(bench: &Bench) {
    if !Utf8Path::new("/usr/sbin/slurmctld").exists() {
        println!(
            "{:<44} skipped: Slurm is not installed",
            "one task on a Slurm placement"
        );
        return;
    }
    let cluster = crew_tests::slurm::Slurm::start_in(bench.root.join("slurm-cluster"), 24);
    let conf = cluster.conf.to_string();
    let env = [("SLURM_CONF", conf.as_str())];
    let crew = crew_binary();
    let project = clone_repository(bench, "slurm-project");
    std::fs::create_dir_all(project.join(".crew")).unwrap();
    std::fs::write(
        project.join(".crew/config.toml"),
        format!(
            "[retention]\nautomatic = false\n\n[placements.box]\nkind = \"local\"\ndir = \"{}\"\n\n[placements.hpc]\nkind = \"slurm\"\npartition = \"crew\"\ndir = \"{}\"\ncrew = \"{crew}\"\n",
            bench.root.join("slurm-box"),
            bench.root.join("slurm-hpc"),
        ),
    )
    .unwrap();
    let timed = |args: &[&str]| timed_crew_with(&crew, &project, args, &env);
    let on = |placement: &'static str| -> Vec<&'static str> {
        vec![
            "run",
            "--quiet",
            "--placement",
            placement,
            "--agent",
            "shell",
            "true",
        ]
    };
    let (slurm_args, local_args) = (on("hpc"), on("box"));
    // Once each first: each clone takes in the base's history.
    timed(&slurm_args);
    timed(&local_args);
    let (mut crew_samples, mut reference) = (Samples::default(), Samples::default());
    for round in 0..bench.rounds * 2 {
        if round % 2 == 0 {
            crew_samples.push(timed(&slurm_args));
            reference.push(timed(&local_args));
        } else {
            reference.push(timed(&local_args));
            crew_samples.push(timed(&slurm_args));
        }
    }
    Comparison {
        name: "one task on a Slurm placement (crew run)".into(),
        crew: crew_samples,
        reference,
        reference_name: "on a local placement".into(),
        target: Some(1.5),
        paired: true,
    }
    .print();
    let fan_out = |count: &str| {
        run_measured_with(
            &crew,
            &project,
            &[
                "run",
                "--quiet",
                "--placement",
                "hpc",
                "--agent",
                "shell",
                "--fan-out",
                count,
                "--max-parallel",
                count,
                "sleep 2",
            ],
            &env,
        )
    };
    let one = fan_out("1");
    let many = fan_out("17");
    let per_task_kb = many.peak_anonymous_kb.saturating_sub(one.peak_anonymous_kb) / 16;
    println!(
        "{:<44} {} KB of the host's own memory per task placed on Slurm ({} MB with 1, {} MB with 17; ≤ 2 MB: {})",
        "Slurm tasks: host memory per task",
        per_task_kb,
        one.peak_anonymous_kb / 1024,
        many.peak_anonymous_kb / 1024,
        if per_task_kb <= 2048 { "met" } else { "MISSED" },
    );
    drop(cluster);
}
