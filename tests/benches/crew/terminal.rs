//! The board and the live block in a real terminal.

use super::*;

pub(super) fn tmux_installed() -> bool {
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
pub(super) fn board(bench: &Bench) {
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
pub(super) fn live_block(bench: &Bench) {
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
