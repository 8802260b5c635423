//! What an agent reaches of the network (README, "Agents are sandboxed"): `proxy` lets it reach
//! the hosts of its `allow_hosts` through crew's proxy and nothing else — not an unlisted host,
//! not a listed one directly, not a local address by a wildcard — against real servers of the
//! user's on this machine, with the kernel's namespaces.
//!
//! Each probe prints `<what> REACHED <what the server said>` or `<what> refused: …`; the
//! servers count who reached them, so a probe that lies cannot pass.

use std::io::{Read, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use camino::{Utf8Path, Utf8PathBuf};
use crew_tests::{TestEnv, render_output, write};

use crate::common::runs::{manifest, run_ids, task};

/// A plain HTTP server of the user's on 127.0.0.1, answering every request with its name.
struct Server {
    port: u16,
    hits: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl Server {
    fn start(name: &'static str) -> Server {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let hits = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (counted, stopped) = (hits.clone(), stop.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stopped.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(mut stream) = stream else { continue };
                counted.fetch_add(1, Ordering::SeqCst);
                let _ = stream.set_read_timeout(Some(std::time::Duration::from_secs(5)));
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).unwrap_or(0) == 1 {
                    head.push(byte[0]);
                }
                let body = format!("hello-from-{name}");
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        Server { port, hits, stop }
    }

    /// How many connections reached it so far.
    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = std::net::TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// The probe an agent runs: through the proxy (the variables crew set, and a `CONNECT` by
/// hand), around it (a direct connection, UDP, curl told to ignore the proxy).
fn probe(listed: u16, unlisted: u16, udp: u16) -> String {
    format!(
        r#"import socket, subprocess, urllib.request
def attempt(what, do):
    try:
        print(what, do(), flush=True)
    except Exception as error:
        print(what, "refused:", type(error).__name__, error, flush=True)
def get(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{{port}}/", timeout=5) as answer:
        return "REACHED " + answer.read().decode()
def connect(port):
    proxy = socket.create_connection(("127.0.0.1", 3128), timeout=5)
    proxy.sendall(f"CONNECT 127.0.0.1:{{port}} HTTP/1.1\r\nHost: 127.0.0.1:{{port}}\r\n\r\n".encode())
    status = proxy.recv(4096).decode().split("\r\n")[0]
    if " 200 " not in status:
        raise OSError(status)
    proxy.sendall(b"GET / HTTP/1.1\r\nHost: here\r\n\r\n")
    answer = b""
    while chunk := proxy.recv(4096):
        answer += chunk
    return "REACHED " + answer.decode().split("\r\n\r\n", 1)[-1]
def direct(port):
    socket.create_connection(("127.0.0.1", port), timeout=3)
    return "REACHED"
def udp(port):
    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"agent", ("127.0.0.1", port))
    return "sent"
def curl(port):
    said = subprocess.run(["curl", "-s", "--noproxy", "*", "-m", "3", f"http://127.0.0.1:{{port}}/"], capture_output=True, text=True).stdout
    return "REACHED " + said if said else "refused: nothing"
attempt("listed", lambda: get({listed}))
attempt("unlisted", lambda: get({unlisted}))
attempt("connect-listed", lambda: connect({listed}))
attempt("connect-unlisted", lambda: connect({unlisted}))
attempt("direct", lambda: direct({listed}))
attempt("udp", lambda: udp({udp}))
attempt("curl-noproxy", lambda: curl({listed}))
"#
    )
}

/// A project with the probe committed, an agent `proxied` that may reach `listed` only, and
/// an agent `open` defined with nothing about the network.
fn probed_project(env: &TestEnv, listed: &Server, unlisted: &Server, udp: u16) -> Utf8PathBuf {
    let repo = env.repo("project");
    define(
        &repo,
        "proxied",
        &format!(
            "network = \"proxy\"\nallow_hosts = [\"127.0.0.1:{}\"]\n",
            listed.port
        ),
    );
    define(&repo, "open", "");
    write(
        &repo.join("probe.py"),
        &probe(listed.port, unlisted.port, udp),
    );
    env.git(&repo, ["add", "."]);
    env.git(&repo, ["commit", "-q", "-m", "probe"]);
    repo
}

fn define(repo: &Utf8Path, name: &str, sandbox: &str) {
    write(
        &repo.join(format!(".crew/agents/{name}.toml")),
        &format!("command = [\"sh\", \"-c\", \"{{prompt}}\"]\n[sandbox]\n{sandbox}"),
    );
}

/// Runs `agent` on the probe with `extra` arguments; what it printed and its run's id.
fn probed(env: &TestEnv, repo: &Utf8Path, agent: &str, extra: &[&str]) -> (String, String) {
    let before = run_ids(env, repo);
    let mut args = vec!["run", "--quiet", "--agent", agent];
    args.extend(extra);
    args.push("python3 probe.py > seen.txt 2>&1");
    let run = env.crew(repo, &args);
    assert!(run.status.success(), "{}", render_output(&run));
    let run_id = run_ids(env, repo)
        .into_iter()
        .find(|run| !before.contains(run))
        .unwrap();
    (
        std::fs::read_to_string(repo.join("seen.txt")).unwrap(),
        run_id,
    )
}

fn line<'a>(seen: &'a str, what: &str) -> &'a str {
    seen.lines()
        .find(|line| line.split(' ').next() == Some(what))
        .unwrap_or_else(|| panic!("no `{what}` line in:\n{seen}"))
}

fn reached(seen: &str, what: &str) -> bool {
    line(seen, what).contains("REACHED")
}

#[test]
fn a_proxied_agent_reaches_its_listed_hosts_through_the_proxy_and_nothing_else() {
    let env = TestEnv::new();
    let listed = Server::start("listed");
    let unlisted = Server::start("unlisted");
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.set_nonblocking(true).unwrap();
    let udp_port = udp.local_addr().unwrap().port();
    let drain_udp = || {
        let mut buffer = [0u8; 16];
        std::iter::from_fn(|| udp.recv(&mut buffer).ok()).count()
    };
    let repo = probed_project(&env, &listed, &unlisted, udp_port);
    // Any host by a wildcard, which never names a local address.
    define(
        &repo,
        "wildcard",
        "network = \"proxy\"\nallow_hosts = [\"*\"]\n",
    );

    // Undefended, the same probe reaches every server every way: what follows is the
    // sandbox's doing.
    let (open, _) = probed(&env, &repo, "open", &[]);
    for what in ["listed", "unlisted", "direct", "curl-noproxy"] {
        assert!(reached(&open, what), "{what}: {open}");
    }
    assert!(drain_udp() >= 1, "{open}");

    let (hits_listed, hits_unlisted) = (listed.hits(), unlisted.hits());
    let (seen, run_id) = probed(&env, &repo, "proxied", &[]);
    assert!(
        line(&seen, "listed").contains("REACHED hello-from-listed"),
        "{seen}"
    );
    assert!(
        line(&seen, "connect-listed").contains("REACHED hello-from-listed"),
        "{seen}"
    );
    for refused in [
        "unlisted",
        "connect-unlisted",
        "direct",
        "udp",
        "curl-noproxy",
    ] {
        assert!(!reached(&seen, refused), "{refused}: {seen}");
    }
    assert!(line(&seen, "unlisted").contains("403"), "{seen}");
    assert_eq!(
        unlisted.hits(),
        hits_unlisted,
        "the unlisted server was reached: {seen}"
    );
    // Through the proxy twice; the direct connection and curl never arrived.
    assert_eq!(listed.hits(), hits_listed + 2, "{seen}");
    assert_eq!(drain_udp(), 0, "a datagram got out: {seen}");
    let record = task(&manifest(&env, &repo, &run_id), "proxied").clone();
    assert_eq!(record["sandbox"]["network"], "proxy", "{record:#}");
    assert_eq!(record["requests"]["allowed"], 2, "{record:#}");
    assert_eq!(record["requests"]["refused"], 2, "{record:#}");
    let warnings = record["warnings"].to_string();
    assert!(
        warnings.contains(&format!("add \\\"127.0.0.1:{}\\\"", unlisted.port))
            && warnings.contains(".crew/agents/proxied.toml"),
        "the refusal names what to add and where: {warnings}"
    );
    // Every request is an event of the run.
    let events = env.crew(&repo, ["events", "--json", "--run", &run_id]);
    let network: Vec<serde_json::Value> = String::from_utf8_lossy(&events.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|event| event["event"] == "network")
        .collect();
    let refused_port = u64::from(unlisted.port);
    assert!(
        network.iter().any(|event| event["allowed"] == false
            && event["port"] == refused_port
            && event["task"] == "proxied"),
        "{network:?}"
    );
    assert_eq!(
        network
            .iter()
            .filter(|event| event["allowed"] == true)
            .count(),
        2,
        "{network:?}"
    );
    let show = env.crew(&repo, ["runs", "show", &run_id]);
    assert!(
        String::from_utf8_lossy(&show.stdout).contains("2 request(s) let through, 2 refused"),
        "{}",
        render_output(&show)
    );

    // `*` matches every host, but a local address only by its exact entry.
    let hits_listed = listed.hits();
    let (seen, _) = probed(&env, &repo, "wildcard", &[]);
    for refused in ["listed", "connect-listed", "unlisted", "direct"] {
        assert!(!reached(&seen, refused), "{refused}: {seen}");
    }
    assert!(line(&seen, "listed").contains("403"), "{seen}");
    assert_eq!(listed.hits(), hits_listed, "{seen}");
}

#[test]
fn the_command_line_narrows_the_network_of_a_run_and_never_widens_it() {
    let env = TestEnv::new();
    let listed = Server::start("listed");
    let unlisted = Server::start("unlisted");
    let repo = probed_project(&env, &listed, &unlisted, 9);
    let (seen, run_id) = probed(&env, &repo, "open", &["--network", "none"]);
    for refused in ["listed", "unlisted", "direct", "connect-listed"] {
        assert!(!reached(&seen, refused), "{refused}: {seen}");
    }
    let record = task(&manifest(&env, &repo, &run_id), "open").clone();
    assert_eq!(record["network"], "none", "{record:#}");
    assert_eq!(record["sandbox"]["network"], "none", "{record:#}");
    // `open` on the command line leaves a proxied agent proxied.
    let (seen, _) = probed(&env, &repo, "proxied", &["--network", "open"]);
    assert!(reached(&seen, "listed"), "{seen}");
    assert!(!reached(&seen, "unlisted"), "{seen}");
    assert!(!reached(&seen, "direct"), "{seen}");
    // A project's own list narrows an agent's: a request must be in both.
    write(
        &repo.join(".crew/config.toml"),
        "[sandbox]\nallow_hosts = [\"example.com\"]\n",
    );
    let (seen, run_id) = probed(&env, &repo, "proxied", &[]);
    assert!(!reached(&seen, "listed"), "{seen}");
    let record = task(&manifest(&env, &repo, &run_id), "proxied").clone();
    assert!(
        record["warnings"].to_string().contains(".crew/config.toml"),
        "{record:#}"
    );
    std::fs::remove_file(repo.join(".crew/config.toml")).unwrap();
    // A team's task narrows its agent the same way, and so does its check, which runs
    // confined like the agent: through the agent's proxy.
    write(
        &repo.join(".crew/teams/t.toml"),
        "[[tasks]]\nid = \"cut\"\nagent = \"open\"\nprompt = \"python3 probe.py > seen.txt 2>&1\"\nnetwork = \"none\"\n\n[[tasks]]\nid = \"checked\"\nagent = \"proxied\"\nprompt = \"true\"\ncheck = \"python3 probe.py > checked.txt 2>&1\"\ndepends_on = [\"cut\"]\n",
    );
    let run = env.crew(&repo, ["run", "--quiet", "t"]);
    assert!(run.status.success(), "{}", render_output(&run));
    let seen = std::fs::read_to_string(repo.join("seen.txt")).unwrap();
    assert!(
        !reached(&seen, "listed") && !reached(&seen, "direct"),
        "{seen}"
    );
    let checked = std::fs::read_to_string(repo.join("checked.txt")).unwrap();
    assert!(reached(&checked, "listed"), "{checked}");
    for refused in ["unlisted", "direct", "curl-noproxy"] {
        assert!(!reached(&checked, refused), "{refused}: {checked}");
    }
    let run_id = run_ids(&env, &repo).remove(0);
    let recorded = manifest(&env, &repo, &run_id);
    assert_eq!(task(&recorded, "cut")["network"], "none", "{recorded:#}");
}

#[test]
fn a_host_entry_that_is_not_a_host_is_refused_naming_the_file_and_starts_nothing() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    for (file, entry, said) in [
        (".crew/config.toml", "https://api.example.com", "is a URL"),
        (
            ".crew/agents/bad.toml",
            "api.example.com:99999",
            "is not a port",
        ),
    ] {
        let text = if file.ends_with("config.toml") {
            format!("[sandbox]\nnetwork = \"proxy\"\nallow_hosts = [\"{entry}\"]\n")
        } else {
            format!(
                "command = [\"sh\", \"-c\", \"{{prompt}}\"]\n[sandbox]\nnetwork = \"proxy\"\nallow_hosts = [\"{entry}\"]\n"
            )
        };
        write(&repo.join(file), &text);
        let agent = if file.ends_with("config.toml") {
            "shell"
        } else {
            "bad"
        };
        let run = env.crew(&repo, ["run", "--agent", agent, "touch ran"]);
        assert!(!run.status.success(), "{}", render_output(&run));
        let said_text = render_output(&run);
        assert!(
            said_text.contains(file)
                && said_text.contains(said)
                && said_text.contains("allow_hosts"),
            "{said_text}"
        );
        assert!(!repo.join("ran").exists());
        std::fs::remove_file(repo.join(file)).unwrap();
    }
    let run = env.crew(
        &repo,
        ["run", "--network", "closed", "--agent", "shell", "true"],
    );
    assert!(!run.status.success());
    assert!(
        render_output(&run).contains("none\", \"proxy\" or \"open\""),
        "{}",
        render_output(&run)
    );
}

#[test]
fn as_an_unprivileged_user_a_proxied_agent_reaches_its_listed_host_only() {
    use std::os::unix::process::CommandExt;
    if !crew_tests::can_drop_to_nobody() {
        return;
    }
    const NOBODY: u32 = crew_tests::NOBODY;
    let env = TestEnv::reachable_by_others();
    let listed = Server::start("listed");
    let unlisted = Server::start("unlisted");
    let repo = probed_project(&env, &listed, &unlisted, 9);
    env.hand_to_nobody();
    let mut command = env.crew_command_for_others(&repo);
    command.args([
        "run",
        "--quiet",
        "--agent",
        "proxied",
        "python3 probe.py > seen.txt 2>&1",
    ]);
    command.uid(NOBODY);
    command.gid(NOBODY);
    let run = command.output().unwrap();
    assert!(run.status.success(), "{}", render_output(&run));
    let seen = std::fs::read_to_string(repo.join("seen.txt")).unwrap();
    assert!(
        line(&seen, "listed").contains("REACHED hello-from-listed"),
        "{seen}"
    );
    for refused in ["unlisted", "connect-unlisted", "direct", "curl-noproxy"] {
        assert!(!reached(&seen, refused), "{refused}: {seen}");
    }
    assert_eq!(unlisted.hits(), 0, "{seen}");
}

/// A kernel that refuses unprivileged user namespaces (made so for crew by starting it in a
/// user namespace of its own with `user.max_user_namespaces` at 0) cannot give an agent a
/// network of its own: `--network none` is refused before the agent starts, never run open in
/// its place; `--allow-open-network` runs it with the network open, and its task says so.
#[test]
fn where_namespaces_are_refused_a_narrower_network_runs_open_only_when_allowed() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let without_namespaces = |extra: &[&str]| {
        crate::common::runs::crew_without_namespaces(&env, &repo)
            .args(["run", "--agent", "shell", "--network", "none"])
            .args(extra)
            .arg("echo RAN")
            .output()
            .unwrap()
    };
    let refused = without_namespaces(&[]);
    if crate::common::runs::namespace_refused_to_the_test(&refused) {
        return;
    }
    let shown = render_output(&refused);
    assert!(!refused.status.success(), "{shown}");
    assert!(
        shown.contains("refuses unprivileged user namespaces")
            && shown.contains("--allow-open-network"),
        "{shown}"
    );
    let allowed = without_namespaces(&["--allow-open-network"]);
    assert!(allowed.status.success(), "{}", render_output(&allowed));
    let run = crate::common::runs::run_ids(&env, &repo).remove(0);
    let manifest = crate::common::runs::manifest(&env, &repo, &run);
    let task = crate::common::runs::task(&manifest, "shell");
    assert_eq!(task["sandbox"]["network_unmet"], "none", "{task:#}");
    assert!(task["sandbox"]["network"].is_null(), "{task:#}");
    assert!(
        task["warnings"]
            .to_string()
            .contains("ran with the network open"),
        "{task:#}"
    );
}

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
    widen("", "[sandbox] network = \"open\" (it was \"proxy\")");
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
    widen("", "[sandbox] network = \"open\" (it was \"proxy\")");

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
