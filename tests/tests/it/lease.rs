//! A task's lease (`[lease]`): its own ports, Compose project name and names, so that tasks of
//! one run start the project's servers at once without colliding (README, "Each task's own
//! ports and names").

use crew_tests::{TestEnv, render_output, wait_until, write};

use crate::common::runs::{manifest, run_ids, task};

/// The first port of a range below the kernel's ephemeral ports (where no other test's
/// connection lands meanwhile), held by another program (a listener of the test's): a lease
/// never includes it.
fn range_with_a_held_port() -> (std::net::TcpListener, u16) {
    let mut port = 20000 + (std::process::id() * 7919 + rand_offset()) % 9000;
    loop {
        if let Ok(held) = std::net::TcpListener::bind(("0.0.0.0", port as u16)) {
            return (held, port as u16);
        }
        port = 20000 + (port - 20000 + 97) % 9000;
    }
}

/// A different place for each test that asks, within one test process.
fn rand_offset() -> u32 {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    NEXT.fetch_add(1009, std::sync::atomic::Ordering::Relaxed)
}

/// A project whose checked-in `.crew/config.toml` holds `lease` (the `[lease]` table's keys).
fn project_leasing(env: &TestEnv, lease: &str) -> camino::Utf8PathBuf {
    let repo = env.repo("project");
    write(
        &repo.join(".crew/config.toml"),
        &format!("[lease]\n{lease}"),
    );
    env.git(&repo, ["add", "."]);
    env.git(&repo, ["commit", "-q", "-m", "lease"]);
    repo
}

#[test]
fn three_tasks_start_servers_on_their_own_ports_at_once() {
    let env = TestEnv::new();
    let (held, first) = range_with_a_held_port();
    let repo = project_leasing(
        &env,
        &format!(
            "ports = 2\nport_range = [{first}, {}]\nnames = [\"DATABASE_NAME\"]\n",
            first + 15
        ),
    );
    // Each serves on its first port and holds it while the others start theirs.
    let server = "python3 -c \"import os, socket, time; s = socket.socket(); s.bind(('0.0.0.0', int(os.environ['CREW_PORT']))); s.listen(); print('serving', os.environ['CREW_PORT'], os.environ['CREW_PORTS'], os.environ['COMPOSE_PROJECT_NAME'], os.environ['DATABASE_NAME']); time.sleep(1.5)\"";
    let run = env.crew(
        &repo,
        [
            "run",
            "--quiet",
            "--agent",
            "shell",
            "--max-parallel",
            "3",
            "--task",
            &format!("a={server}"),
            "--task",
            &format!("b={server}"),
            "--task",
            &format!("c={server}"),
        ],
    );
    assert!(run.status.success(), "{}", render_output(&run));
    let run_id = run_ids(&env, &repo).remove(0);
    let recorded = manifest(&env, &repo, &run_id);
    let mut ports = Vec::new();
    let mut names = Vec::new();
    for id in ["a", "b", "c"] {
        let record = task(&recorded, id);
        let lease = &record["lease"];
        let port = lease["port"].as_u64().unwrap() as u16;
        assert_eq!(lease["ports"], 2, "{record:#}");
        assert!(
            (first..=first + 15).contains(&port) && !(port..port + 2).contains(&first),
            "{first}: {lease}"
        );
        let log = std::fs::read_to_string(
            repo.join(format!(".crew/state/runs/{run_id}/tasks/{id}/output.log")),
        )
        .unwrap();
        let name = lease["name"].as_str().unwrap().to_owned();
        assert!(
            log.contains(&format!("serving {port} 2 {name} {name}")),
            "{log}"
        );
        ports.push(port);
        names.push(name);
    }
    ports.sort_unstable();
    ports.dedup();
    names.dedup();
    assert_eq!((ports.len(), names.len()), (3, 3), "{recorded:#}");
    // Released when they ended: another holder can lock the whole range now. And no file was
    // made for a lease: the one lock file is all there is.
    let leases = env.home().join(".local/state/crew/leases");
    assert!(
        range_is_free(&leases.join("ports"), first, 16),
        "a lease outlived its task"
    );
    let files: Vec<_> = std::fs::read_dir(&leases)
        .unwrap()
        .flatten()
        .map(|entry| entry.file_name())
        .collect();
    assert_eq!(files, ["ports"]);
    drop(held);
}

/// A range of four ports, one a task, and six tasks run one at a time in one host: the fifth
/// and sixth can have ports only if the tasks before released theirs when they ended, not
/// when their host exits.
#[test]
fn a_task_s_ports_are_released_when_it_ends_for_the_next_task_of_its_host() {
    let env = TestEnv::new();
    let (held, first) = range_with_a_held_port();
    let range = first + 1..=first + 4;
    let repo = project_leasing(
        &env,
        &format!(
            "ports = 1\nport_range = [{}, {}]\n",
            range.start(),
            range.end()
        ),
    );
    let tasks: Vec<String> = (0..6).map(|n| format!("t{n}=echo $CREW_PORT")).collect();
    let mut args = vec!["run", "--quiet", "--agent", "shell", "--max-parallel", "1"];
    for task in &tasks {
        args.extend(["--task", task.as_str()]);
    }
    let run = env.crew(&repo, args);
    assert!(run.status.success(), "{}", render_output(&run));
    let run_id = run_ids(&env, &repo).remove(0);
    let recorded = manifest(&env, &repo, &run_id);
    for n in 0..6 {
        let port = task(&recorded, &format!("t{n}"))["lease"]["port"]
            .as_u64()
            .unwrap_or_else(|| panic!("t{n} has no port: {recorded:#}"));
        assert!(range.contains(&(port as u16)), "t{n}: {port}");
    }
    drop(held);
}

/// A lock on the user's lease file needs only reading it: an agent that could open the file
/// could lock every free port of the range, and no task after it would get one. The file's
/// directory is hidden from agents.
#[test]
fn an_agent_cannot_lock_the_ports_other_tasks_lease() {
    let env = TestEnv::new();
    let (held, first) = range_with_a_held_port();
    let (low, high) = (first + 1, first + 4);
    let repo = project_leasing(&env, &format!("ports = 1\nport_range = [{low}, {high}]\n"));
    let leases = env.home().join(".local/state/crew/leases");
    let hostile = format!(
        "python3 -c \"\nimport fcntl, os, time\ntry:\n    fd = os.open('{leases}/ports', os.O_RDONLY)\n    said = 'OPENED'\n    for port in range({low}, {high} + 1):\n        try:\n            fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB, 1, port, 0)\n            said += ' locked ' + str(port)\n        except OSError:\n            pass\nexcept Exception as error:\n    said = 'REFUSED ' + type(error).__name__\nopen('tried.txt', 'w').write(said)\ntime.sleep(120)\n\""
    );
    let started = env.crew(
        &repo,
        ["run", "--detach", "-q", "--agent", "shell", &hostile],
    );
    assert!(started.status.success(), "{}", render_output(&started));
    let hostile_run = String::from_utf8(started.stdout).unwrap().trim().to_owned();
    // Read once written: the file exists, empty, between its `open` and its `write`.
    let tried = wait_until(30, "the agent to try the lease file", || {
        std::fs::read_to_string(repo.join("tried.txt"))
            .ok()
            .filter(|tried| !tried.is_empty())
    });
    // Another task of the user's, while the hostile agent lives: it gets its port.
    let run = env.crew(
        &repo,
        [
            "run",
            "--quiet",
            "--agent",
            "shell",
            "echo $CREW_PORT > port.txt",
        ],
    );
    let cancel = env.crew(&repo, ["runs", "cancel", "--force", "-q", &hostile_run]);
    assert!(cancel.status.success(), "{}", render_output(&cancel));
    assert!(
        run.status.success(),
        "the agent ({tried}) kept the next task from its port: {}",
        render_output(&run)
    );
    assert!(tried.starts_with("REFUSED"), "{tried}");
    let port: u16 = std::fs::read_to_string(repo.join("port.txt"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!((low..=high).contains(&port), "{port}");
    drop(held);
}

/// Whether this process can lock the `count` ports from `first` in the user's lease file as a
/// lease does (an open file description's lock on byte `port`): no host holds any of them.
#[allow(unsafe_code)]
fn range_is_free(lease_file: &camino::Utf8Path, first: u16, count: u16) -> bool {
    use std::os::fd::AsRawFd as _;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(lease_file)
        .unwrap();
    // SAFETY: `flock` is plain data, for which all zeroes is a valid value.
    let mut range: libc::flock = unsafe { std::mem::zeroed() };
    range.l_type = libc::F_WRLCK as libc::c_short;
    range.l_whence = libc::SEEK_SET as libc::c_short;
    range.l_start = libc::off_t::from(first);
    range.l_len = libc::off_t::from(count);
    // SAFETY: reads the `flock` above, on a descriptor `file` keeps open; the lock goes with
    // `file`.
    unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &mut range) == 0 }
}

#[test]
fn a_resumed_task_keeps_its_ports_and_a_bad_lease_setting_is_refused() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let (_held, first) = range_with_a_held_port();
    write(
        &repo.join(".crew/config.toml"),
        &format!("[lease]\nport_range = [{first}, {}]\n", first + 63),
    );
    env.git(&repo, ["add", "."]);
    env.git(&repo, ["commit", "-q", "-m", "lease"]);
    let mut host = env.spawn_crew(
        &repo,
        [
            "run",
            "--quiet",
            "--agent",
            "shell",
            "--name",
            "kept",
            "echo port $CREW_PORT >> ports.txt; sleep 600",
        ],
    );
    wait_until(30, "the agent to start", || {
        std::fs::read_to_string(repo.join("ports.txt")).ok()
    });
    // The live agent's listing, once its host listed it: the agent may write before its
    // host heard that it started.
    let listed = || {
        wait_until(30, "the agent to be listed", || {
            let listed = env.crew(&repo, ["agents", "list", "--json"]);
            let agents: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
            agents
                .as_array()
                .is_some_and(|agents| !agents.is_empty())
                .then_some(agents)
        })
    };
    // It shows the agent's lease.
    let agents = listed();
    let shown = std::fs::read_to_string(repo.join("ports.txt")).unwrap();
    assert_eq!(
        format!("port {}\n", agents[0]["lease"]["port"]),
        shown,
        "{agents:#}"
    );
    let stop = env.crew(&repo, ["agents", "stop", "kept:shell"]);
    assert!(stop.status.success(), "{}", render_output(&stop));
    let _ = host.wait();
    let before = task(&manifest(&env, &repo, "kept"), "shell")["lease"].clone();
    let mut again = env.spawn_crew(&repo, ["agents", "resume", "kept:shell"]);
    wait_until(30, "the second start", || {
        std::fs::read_to_string(repo.join("ports.txt"))
            .ok()
            .filter(|ports| ports.lines().count() == 2)
    });
    let ports = std::fs::read_to_string(repo.join("ports.txt")).unwrap();
    let lines: Vec<&str> = ports.lines().collect();
    assert_eq!(lines[0], lines[1], "{ports}");
    assert_eq!(lines[0], format!("port {}", before["port"]), "{before}");
    listed();
    let stop = env.crew(&repo, ["agents", "stop", "kept:shell"]);
    assert!(stop.status.success(), "{}", render_output(&stop));
    let _ = again.wait();
    // A setting that cannot be met is an error naming the key, and nothing runs.
    write(
        &repo.join(".crew/config.toml"),
        "[lease]\nport_range = [80, 70]\n",
    );
    let run = env.crew(&repo, ["run", "--agent", "shell", "touch ran"]);
    assert!(!run.status.success());
    assert!(
        render_output(&run).contains("lease.port_range"),
        "{}",
        render_output(&run)
    );
    assert!(!repo.join("ran").exists());
}

#[test]
fn a_worktree_s_setup_command_gets_its_task_s_lease() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    write(
        &repo.join(".crew/config.toml"),
        "[worktree]\nsetup = [\"sh\", \"-c\", \"echo $CREW_PORT $COMPOSE_PROJECT_NAME > setup.txt\"]\n",
    );
    env.git(&repo, ["add", "."]);
    env.git(&repo, ["commit", "-q", "-m", "setup"]);
    let run = env.crew(
        &repo,
        [
            "run",
            "--quiet",
            "--agent",
            "shell",
            "--workspace-mode",
            "worktree",
            "--name",
            "set",
            "echo $CREW_PORT $COMPOSE_PROJECT_NAME > agent.txt; cmp setup.txt agent.txt && echo the-same-lease; cat setup.txt",
        ],
    );
    assert!(run.status.success(), "{}", render_output(&run));
    let log =
        std::fs::read_to_string(repo.join(".crew/state/runs/set/tasks/shell/output.log")).unwrap();
    assert!(
        log.contains("the-same-lease") && log.contains("crew_set_shell"),
        "{log}"
    );
}
