//! The lists of hosts: what a checked-in file may add, what a refusal and a failure say, the
//! machine's own addresses, malformed requests, a list an open network leaves unused.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crew_tests::{TestEnv, render_output, write};

use super::{Server, define, probed, probed_project, reached};
use crate::common::runs::{manifest, run_ids, task};

#[test]
fn a_checked_in_definition_reaches_no_further_than_it_last_ran_until_allowed() {
    let env = TestEnv::new();
    let listed = Server::start("listed");
    let unlisted = Server::start("unlisted");
    let repo = probed_project(&env, &listed, &unlisted, 9);
    // The first run of a definition is the network crew remembers for its file.
    let (seen, _) = probed(&env, &repo, "proxied", &[]);
    assert!(
        reached(&seen, "listed") && !reached(&seen, "unlisted"),
        "{seen}"
    );

    // A teammate's commit (or a merged task branch) widens it, a host at a time or all at once.
    let file = ".crew/agents/proxied.toml";
    let widen = |sandbox: &str, said: &str| {
        define(&repo, "proxied", sandbox);
        env.git(&repo, ["commit", "-q", "--allow-empty", "-am", "widen"]);
        let (runs, hits) = (run_ids(&env, &repo), unlisted.hits());
        let output = env.crew(&repo, ["run", "--agent", "proxied", "python3 probe.py"]);
        let shown = render_output(&output);
        assert_eq!(output.status.code(), Some(2), "{shown}");
        assert!(
            shown.contains(&format!("{file} loosens the sandbox ({said}"))
                && shown.contains("crew sandbox allow"),
            "{shown}"
        );
        assert_eq!(run_ids(&env, &repo), runs, "nothing was made: {shown}");
        assert_eq!(unlisted.hits(), hits, "{shown}");
    };
    let both = format!(
        "network = \"proxy\"\nallow_hosts = [\"127.0.0.1:{}\", \"127.0.0.1:{}\"]\n",
        listed.port, unlisted.port
    );
    widen(
        &both,
        &format!("[sandbox] allow_hosts adds \"127.0.0.1:{}\"", unlisted.port),
    );
    // The machine's network named in a checked-in file is a loosening of its own: it is
    // wider than what a definition naming no mode gets.
    widen("network = \"open\"\n", "[sandbox] network = \"open\"");
    widen("", "[sandbox] allow_hosts removed (it had a list)");
    widen("network = \"open\"\n", "[sandbox] network = \"open\"");
    let listing = render_output(&env.crew(&repo, ["sandbox", "allow", "--list"]));
    assert!(
        listing.contains(file) && listing.contains("NOT allowed"),
        "{listing}"
    );

    // Allowed as it is now, it runs as it says.
    assert!(env.allow_settings(&repo).contains("allowed now"));
    let (seen, _) = probed(&env, &repo, "proxied", &[]);
    assert!(
        reached(&seen, "direct") && reached(&seen, "unlisted"),
        "{seen}"
    );

    // Narrowing needs nothing, and is remembered: widening back needs allowing again.
    define(
        &repo,
        "proxied",
        &format!(
            "network = \"proxy\"\nallow_hosts = [\"127.0.0.1:{}\"]\n",
            listed.port
        ),
    );
    let (seen, _) = probed(&env, &repo, "proxied", &[]);
    assert!(
        reached(&seen, "listed") && !reached(&seen, "direct"),
        "{seen}"
    );
    // Content allowed once is refused all the same: the network it last ran by was narrower.
    widen(
        "network = \"open\"\n",
        "[sandbox] allow_hosts removed (it had a list)",
    );

    // The project's `config.toml` likewise: its list is remembered, a host added to it is not
    // reached until allowed.
    define(
        &repo,
        "proxied",
        &format!(
            "network = \"proxy\"\nallow_hosts = [\"127.0.0.1:{}\"]\n",
            listed.port
        ),
    );
    write(
        &repo.join(".crew/config.toml"),
        "[sandbox]\nallow_hosts = [\"example.com\"]\n",
    );
    let (seen, _) = probed(&env, &repo, "proxied", &[]);
    assert!(!reached(&seen, "listed"), "{seen}");
    write(
        &repo.join(".crew/config.toml"),
        &format!(
            "[sandbox]\nallow_hosts = [\"example.com\", \"127.0.0.1:{}\"]\n",
            listed.port
        ),
    );
    let output = env.crew(&repo, ["run", "--agent", "proxied", "python3 probe.py"]);
    let shown = render_output(&output);
    assert_eq!(output.status.code(), Some(2), "{shown}");
    assert!(
        shown.contains(".crew/config.toml loosens the sandbox ([sandbox] allow_hosts adds"),
        "{shown}"
    );
}

#[test]
fn a_task_given_no_network_that_fails_says_so_in_its_reason() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    write(
        &repo.join(".crew/agents/offline.toml"),
        "command = [\"sh\", \"-c\", \"{prompt}\"]\n[sandbox]\nnetwork = \"none\"\n",
    );
    let output = env.crew(
        &repo,
        [
            "run",
            "--agent",
            "offline",
            "echo could not connect; exit 3",
        ],
    );
    let shown = render_output(&output);
    assert!(!output.status.success(), "{shown}");
    assert!(
        shown.contains("its network is `none`: it reached no host")
            && shown.contains(".crew/agents/offline.toml"),
        "{shown}"
    );
}

/// An agent whose model's host cannot be resolved retries for as long as it is let (Gemini CLI
/// for many minutes): once every request through its proxy has failed for
/// `[run] unreachable_timeout`, crew ends it, and its task fails saying what its proxy met.
#[test]
fn an_agent_that_can_reach_nothing_it_may_reach_is_ended_with_what_its_proxy_met() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    define(
        &repo,
        "offline",
        "network = \"proxy\"\nallow_hosts = [\"no-such-host.invalid\"]\n",
    );
    write(
        &repo.join(".crew/config.toml"),
        "[run]\nunreachable_timeout = \"3s\"\ntask_timeout = \"60s\"\n",
    );
    env.allow_settings(&repo);
    let run = env.crew(
        &repo,
        [
            "run",
            "--agent",
            "offline",
            "while true; do curl -s -m 2 http://no-such-host.invalid/ >/dev/null; sleep 0.2; done",
        ],
    );
    let shown = render_output(&run);
    assert_eq!(run.status.code(), Some(1), "{shown}");
    let run_id = run_ids(&env, &repo).remove(0);
    let record = manifest(&env, &repo, &run_id);
    let task = &record["tasks"][0];
    assert_eq!(task["status"], "failed", "{task:#}");
    let reason = task["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("crew ended the agent: for ")
            && reason.contains("every request it made through crew's proxy failed")
            && reason.contains("no-such-host.invalid cannot be resolved"),
        "{reason}"
    );
    assert_eq!(task["exit"]["timed_out"], false, "{task:#}");
    assert!(task["exit"]["stopped_by"].is_null(), "{task:#}");

    // One that gives up by itself first fails with what its proxy met in its reason.
    let run = env.crew(
        &repo,
        [
            "run",
            "--agent",
            "offline",
            "for i in 1 2; do curl -s -m 2 http://no-such-host.invalid/ >/dev/null; done; exit 7",
        ],
    );
    assert_eq!(run.status.code(), Some(1), "{}", render_output(&run));
    let record = manifest(&env, &repo, &run_ids(&env, &repo).remove(0));
    let reason = record["tasks"][0]["reason"].as_str().unwrap().to_owned();
    assert!(
        reason.starts_with("the agent exited with code 7")
            && reason.contains("its last 2 request(s) through crew's proxy failed")
            && reason.contains("no-such-host.invalid cannot be resolved"),
        "{reason}"
    );
}

/// The machine's own address that is not loopback: the first of `hostname -I`, if any.
fn own_address() -> Option<std::net::IpAddr> {
    let shown = std::process::Command::new("hostname")
        .arg("-I")
        .output()
        .ok()?;
    String::from_utf8_lossy(&shown.stdout)
        .split_whitespace()
        .filter_map(|word| word.parse::<std::net::IpAddr>().ok())
        .find(|address| address.is_ipv4() && !address.is_loopback())
}

/// A wildcard never reaches an address of the machine itself: a server of the user's bound to
/// every interface is reached through `*` at none of them (this machine's address is not a
/// private one, so only knowing it as the machine's own refuses it), and by an exact entry
/// only.
#[test]
fn a_wildcard_never_reaches_the_machine_s_own_address() {
    let Some(own) = own_address() else {
        eprintln!("skipped: this machine has no address but loopback");
        return;
    };
    let env = TestEnv::new();
    let listener = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let hits = Arc::new(AtomicUsize::new(0));
    let counted = hits.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            counted.fetch_add(1, Ordering::SeqCst);
            let _ = stream.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nConnection: close\r\n\r\nmine",
            );
        }
    });
    let repo = env.repo("project");
    define(
        &repo,
        "wildcard",
        "network = \"proxy\"\nallow_hosts = [\"*\"]\n",
    );
    define(
        &repo,
        "exact",
        &format!("network = \"proxy\"\nallow_hosts = [\"{own}:{port}\"]\n"),
    );
    let fetch = format!(
        "python3 -c \"import urllib.request as u\ntry: print('REACHED', u.urlopen('http://{own}:{port}/', timeout=10).read())\nexcept Exception as e: print('refused', e)\" > seen.txt 2>&1"
    );
    let fetched = |agent: &str| {
        let run = env.crew(&repo, ["run", "--quiet", "--agent", agent, &fetch]);
        assert!(run.status.success(), "{}", render_output(&run));
        std::fs::read_to_string(repo.join("seen.txt")).unwrap()
    };
    let seen = fetched("wildcard");
    assert!(
        !seen.contains("REACHED"),
        "{own}:{port} through `*`: {seen}"
    );
    assert!(seen.contains("403"), "{seen}");
    assert_eq!(hits.load(Ordering::SeqCst), 0, "{seen}");
    let seen = fetched("exact");
    assert!(seen.contains("REACHED"), "{seen}");
    assert_eq!(hits.load(Ordering::SeqCst), 1, "{seen}");
}

/// A request crew's proxy cannot read is refused and reported like every refusal: an event of
/// the run and a refusal on the task, though it names no host.
#[test]
fn a_request_the_proxy_cannot_read_is_an_event_of_the_run() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    define(
        &repo,
        "proxied",
        "network = \"proxy\"\nallow_hosts = [\"*\"]\n",
    );
    let send = "python3 -c \"import socket\ns = socket.create_connection(('127.0.0.1', 3128))\ns.sendall(b'NOT HTTP AT ALL\\r\\n\\r\\n')\nprint(s.recv(200))\" > seen.txt 2>&1";
    let run = env.crew(&repo, ["run", "--quiet", "--agent", "proxied", send]);
    assert!(run.status.success(), "{}", render_output(&run));
    let seen = std::fs::read_to_string(repo.join("seen.txt")).unwrap();
    assert!(seen.contains("400"), "{seen}");
    let run_id = run_ids(&env, &repo).remove(0);
    let events = env.crew(&repo, ["events", "--json", "--run", &run_id]);
    let refused: Vec<serde_json::Value> = String::from_utf8_lossy(&events.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|event| event["event"] == "network" && event["allowed"] == false)
        .collect();
    assert!(
        refused.iter().any(|event| event["reason"]
            .as_str()
            .unwrap_or("")
            .contains("could not read")),
        "{refused:?}: {seen}"
    );
    let record = task(&manifest(&env, &repo, &run_id), "proxied").clone();
    assert_eq!(record["requests"]["refused"], 1, "{record:#}");
    let shown = env.crew(&repo, ["events", "--run", &run_id]);
    assert!(
        String::from_utf8_lossy(&shown.stdout).contains("network: a request refused"),
        "{}",
        render_output(&shown)
    );
}

/// A definition whose network is open has no use for its list of hosts, and the task says so
/// rather than dropping it silently; narrowed to `proxy` (here by the command line), the list
/// applies and nothing is said.
#[test]
fn an_open_definition_s_list_of_hosts_is_said_to_be_unused() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    define(
        &repo,
        "listed",
        "network = \"open\"\nallow_hosts = [\"example.com\"]\n",
    );
    // The machine's network in a checked-in file waits for the user's word, like any
    // loosening; nothing is made before it.
    let refused = env.crew(&repo, ["run", "--quiet", "--agent", "listed", "true"]);
    let shown = render_output(&refused);
    assert_eq!(refused.status.code(), Some(2), "{shown}");
    assert!(
        shown.contains("listed.toml loosens the sandbox ([sandbox] network = \"open\")")
            && shown.contains("crew sandbox allow"),
        "{shown}"
    );
    assert!(run_ids(&env, &repo).is_empty(), "{shown}");
    env.allow_settings(&repo);
    let run = env.crew(&repo, ["run", "--quiet", "--agent", "listed", "true"]);
    assert!(run.status.success(), "{}", render_output(&run));
    let run_id = run_ids(&env, &repo).remove(0);
    let warnings = task(&manifest(&env, &repo, &run_id), "listed")["warnings"].to_string();
    assert!(
        warnings.contains("`allow_hosts` of .crew/agents/listed.toml is unused"),
        "{warnings}"
    );
    let run = env.crew(
        &repo,
        [
            "run",
            "--quiet",
            "--network",
            "proxy",
            "--agent",
            "listed",
            "true",
        ],
    );
    assert!(run.status.success(), "{}", render_output(&run));
    let run_id = run_ids(&env, &repo).remove(0);
    let warnings = task(&manifest(&env, &repo, &run_id), "listed")["warnings"].to_string();
    assert!(!warnings.contains("is unused"), "{warnings}");
}
