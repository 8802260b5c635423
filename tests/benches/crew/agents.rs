//! Starting agents: sandboxed starts, the network proxy, many agents, the conflict radar.

use super::*;

/// The sandbox's cost at start: 200 agents started one after another in a host of their own,
/// each confined by Landlock, against the same starts unconfined; the two take turns.
pub(super) fn sandboxed_starts(bench: &Bench) {
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
    // The home and every directory not the system's seen only in part (a tmpfs over each,
    // what the agent may reach bound back), against the same sandbox reading them whole.
    let (partial, whole, per_agent) = paired_starts(&start, "on", "whole", AGENTS);
    Comparison {
        name: "200 agent starts, reads in part".into(),
        crew: partial,
        reference: whole,
        reference_name: "sandboxed, reads whole".into(),
        target: Some(START_EXTRAS),
        paired: true,
    }
    .print();
    print_per_agent(
        "reads in part added at each start",
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
pub(super) const START_EXTRAS: f64 = 1.50;

/// What `network = "proxy"` costs: a 100 MB download from a server on this machine through
/// crew's proxy against the same download with the network open, paired rounds taking turns;
/// what an agent's own network namespace (and, with `proxy`, its proxy) adds at each start;
/// and the host's peak memory with 50 agents streaming through their proxies at once, against
/// the same 50 with the network open.
pub(super) fn network(bench: &Bench) {
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
    // A model's streamed answer through a credential's endpoint (the key added there) against
    // the same answer through a plain `CONNECT` tunnel of the proxy.
    let mut endpoint = Samples::default();
    let mut tunnel = Samples::default();
    for round in 0..bench.rounds.max(15) {
        let took = |mode| {
            Duration::from_secs_f64(download(mode, "1", "stream")["seconds"].as_f64().unwrap())
        };
        if round % 2 == 0 {
            endpoint.push(took("endpoint"));
            tunnel.push(took("connect"));
        } else {
            tunnel.push(took("connect"));
            endpoint.push(took("endpoint"));
        }
    }
    Comparison {
        name: "a streamed answer, through a key's endpoint".into(),
        crew: endpoint,
        reference: tunnel,
        reference_name: "the proxy's CONNECT".into(),
        target: Some(1.05),
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
pub(super) fn paired_starts(
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
pub(super) fn print_per_agent(name: &str, per_agent: Duration, limit: Option<Duration>) {
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
pub(super) fn many_agents(bench: &Bench) {
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
pub(super) fn radar(bench: &Bench) {
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

/// What caps cost (`[resources]`): 200 capped agent starts (a cgroup each, joined before
/// anything else) against the same starts uncapped, taking turns; and the host's peak memory
/// with 100 capped agents against 100 uncapped. Skipped where no cgroup can be had.
pub(super) fn caps(bench: &Bench) {
    if let Err(why) = crew_live::caps::Cgroups::find() {
        println!("{:<44} skipped: no cgroup can be had here ({why})", "caps");
        return;
    }
    const AGENTS: u32 = 200;
    let start = |sandbox: &str| {
        let figures = live_helper(&["start", bench.repo.as_str(), &AGENTS.to_string(), sandbox]);
        Duration::from_secs_f64(figures["start_seconds"].as_f64().unwrap())
    };
    let (capped, uncapped, per_agent) = paired_starts(&start, "capped", "on", AGENTS);
    Comparison {
        name: "200 agent starts, capped".into(),
        crew: capped,
        reference: uncapped,
        reference_name: "sandboxed, uncapped".into(),
        target: Some(START_EXTRAS),
        paired: true,
    }
    .print();
    print_per_agent(
        "caps added at each start",
        per_agent,
        Some(Duration::from_micros(500)),
    );
    let peak = |mode: &str| {
        live_helper(&["start", bench.repo.as_str(), "100", mode])["hwm_kib"]
            .as_u64()
            .unwrap()
    };
    let (capped, uncapped) = (peak("capped"), peak("on"));
    println!(
        "{:<44} {} MiB host peak, {} MiB uncapped ({:+} KiB)",
        "100 capped agents",
        capped / 1024,
        uncapped / 1024,
        capped as i64 - uncapped as i64
    );
}
