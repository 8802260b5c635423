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
pub(super) struct Server {
    pub(super) port: u16,
    hits: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl Server {
    pub(super) fn start(name: &'static str) -> Server {
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
    pub(super) fn hits(&self) -> usize {
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
pub(super) fn probe(listed: u16, unlisted: u16, udp: u16) -> String {
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

/// A project with the probe committed, an agent `proxied` that may reach `listed` only, an
/// agent `open` with the machine's network (allowed, as the user would), and an agent
/// `unnamed` defined with nothing about the network.
pub(super) fn probed_project(
    env: &TestEnv,
    listed: &Server,
    unlisted: &Server,
    udp: u16,
) -> Utf8PathBuf {
    let repo = env.repo("project");
    define(
        &repo,
        "proxied",
        &format!(
            "network = \"proxy\"\nallow_hosts = [\"127.0.0.1:{}\"]\n",
            listed.port
        ),
    );
    define(&repo, "open", "network = \"open\"\n");
    define(&repo, "unnamed", "");
    env.allow_settings(&repo);
    write(
        &repo.join("probe.py"),
        &probe(listed.port, unlisted.port, udp),
    );
    env.git(&repo, ["add", "."]);
    env.git(&repo, ["commit", "-q", "-m", "probe"]);
    repo
}

pub(super) fn define(repo: &Utf8Path, name: &str, sandbox: &str) {
    write(
        &repo.join(format!(".crew/agents/{name}.toml")),
        &format!("command = [\"sh\", \"-c\", \"{{prompt}}\"]\n[sandbox]\n{sandbox}"),
    );
}

/// Runs `agent` on the probe with `extra` arguments; what it printed and its run's id.
pub(super) fn probed(
    env: &TestEnv,
    repo: &Utf8Path,
    agent: &str,
    extra: &[&str],
) -> (String, String) {
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

pub(super) fn line<'a>(seen: &'a str, what: &str) -> &'a str {
    seen.lines()
        .find(|line| line.split(' ').next() == Some(what))
        .unwrap_or_else(|| panic!("no `{what}` line in:\n{seen}"))
}

pub(super) fn reached(seen: &str, what: &str) -> bool {
    line(seen, what).contains("REACHED")
}

/// A UDP server of the user's on 127.0.0.1, read without waiting, and its port.
fn udp_server() -> (std::net::UdpSocket, u16) {
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.set_nonblocking(true).unwrap();
    let port = udp.local_addr().unwrap().port();
    (udp, port)
}

#[test]
fn a_proxied_agent_reaches_its_listed_hosts_through_the_proxy_and_nothing_else() {
    let env = TestEnv::new();
    let listed = Server::start("listed");
    let unlisted = Server::start("unlisted");
    let (udp, udp_port) = udp_server();
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

/// The default is not the machine's network: an agent whose definition (the built-in `shell`
/// too) names no mode gets crew's proxy with no host beyond the lists, and the run says
/// nothing of an open network.
#[test]
fn an_agent_whose_settings_name_no_network_gets_the_proxy_and_no_host() {
    let env = TestEnv::new();
    let listed = Server::start("listed");
    let unlisted = Server::start("unlisted");
    let (udp, udp_port) = udp_server();
    let repo = probed_project(&env, &listed, &unlisted, udp_port);
    for agent in ["unnamed", "shell"] {
        let (seen, run) = probed(&env, &repo, agent, &[]);
        for refused in [
            "listed",
            "unlisted",
            "connect-listed",
            "direct",
            "curl-noproxy",
        ] {
            assert!(!reached(&seen, refused), "{agent}: {refused}: {seen}");
        }
        let mut buffer = [0u8; 16];
        assert!(udp.recv(&mut buffer).is_err(), "{agent}: {seen}");
        let record = task(&manifest(&env, &repo, &run), agent).clone();
        assert_eq!(record["sandbox"]["network"], "proxy", "{record:#}");
        assert!(
            record["warnings"]
                .to_string()
                .contains("no `allow_hosts` applies to the agent, so it reaches no host"),
            "{record:#}"
        );
    }
    assert_eq!((listed.hits(), unlisted.hits()), (0, 0));
    // The same probe with the machine's network, named: the run says so.
    let output = env.crew(
        &repo,
        ["run", "--agent", "open", "python3 probe.py > seen.txt 2>&1"],
    );
    let shown = render_output(&output);
    assert!(output.status.success(), "{shown}");
    assert!(shown.contains("network open"), "{shown}");
    assert!(
        reached(
            &std::fs::read_to_string(repo.join("seen.txt")).unwrap(),
            "direct"
        ),
        "{shown}"
    );
}

#[test]
fn the_command_line_names_the_network_of_a_run_and_a_definition_s_own_narrows_it() {
    let env = TestEnv::new();
    let listed = Server::start("listed");
    let unlisted = Server::start("unlisted");
    let repo = probed_project(&env, &listed, &unlisted, 9);
    let (seen, run_id) = probed(&env, &repo, "open", &["--network", "none"]);
    for refused in ["listed", "unlisted", "direct", "connect-listed"] {
        assert!(!reached(&seen, refused), "{refused}: {seen}");
    }
    let record = task(&manifest(&env, &repo, &run_id), "open").clone();
    assert_eq!(record["named_network"], "none", "{record:#}");
    assert_eq!(record["sandbox"]["network"], "none", "{record:#}");
    // `open` on the command line leaves a proxied agent proxied.
    let (seen, _) = probed(&env, &repo, "proxied", &["--network", "open"]);
    assert!(reached(&seen, "listed"), "{seen}");
    assert!(!reached(&seen, "unlisted"), "{seen}");
    assert!(!reached(&seen, "direct"), "{seen}");
    // And gives an agent whose definition names no mode the machine's network: the user
    // named it, and the run says so.
    let output = env.crew(
        &repo,
        [
            "run",
            "--agent",
            "unnamed",
            "--network",
            "open",
            "python3 probe.py > seen.txt 2>&1",
        ],
    );
    let shown = render_output(&output);
    assert!(output.status.success(), "{shown}");
    assert!(shown.contains("network open"), "{shown}");
    let seen = std::fs::read_to_string(repo.join("seen.txt")).unwrap();
    assert!(reached(&seen, "direct"), "{seen}");
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
            .args(["run", "--agent", "shell"])
            .args(extra)
            .arg("echo RAN")
            .output()
            .unwrap()
    };
    let refused = without_namespaces(&["--network", "none"]);
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
    let allowed = without_namespaces(&["--network", "none", "--allow-open-network"]);
    assert!(allowed.status.success(), "{}", render_output(&allowed));
    let run = crate::common::runs::run_ids(&env, &repo).remove(0);
    let manifest = crate::common::runs::manifest(&env, &repo, &run);
    let task = crate::common::runs::task(&manifest, "shell");
    assert_eq!(task["sandbox"]["network_unmet"], "none", "{task:#}");
    assert!(task["sandbox"]["network"].is_null(), "{task:#}");
    assert!(
        task["warnings"]
            .to_string()
            .contains("ran with the network open, as --allow-open-network allowed"),
        "{task:#}"
    );
    // crew's default, which nothing named, gives way where it cannot be had, and says so:
    // on the run's line and on the task.
    let defaulted = without_namespaces(&[]);
    let shown = render_output(&defaulted);
    assert!(defaulted.status.success(), "{shown}");
    assert!(shown.contains("network open"), "{shown}");
    let run = crate::common::runs::run_ids(&env, &repo).remove(0);
    let manifest = crate::common::runs::manifest(&env, &repo, &run);
    let task = crate::common::runs::task(&manifest, "shell");
    assert_eq!(task["sandbox"]["network_unmet"], "proxy", "{task:#}");
    assert!(
        task["warnings"]
            .to_string()
            .contains("ran with the network open, as crew's default does"),
        "{task:#}"
    );
}

mod credentials;
mod lists;
mod toolchains;
