//! What an agent cannot reach: the user's terminals, servers, sockets, tmux, keyring, other processes' secrets, its host as anyone but itself.

use super::*;

#[test]
fn an_agent_has_terminals_of_its_own_and_never_the_user_s() {
    use std::io::{Read, Write};
    let env = TestEnv::new();
    let repo = env.repo("project");
    let (mut user, device) = user_terminal();
    // Held open as a shell in it would: the terminal is live while the agent runs.
    let _shell = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&device)
        .unwrap();
    // The agent starts a program in a terminal of its own (as a shell tool does), then goes
    // for the user's: it reads what they type, and types into it.
    let script = format!(
        r#"script -qc tty /dev/null > own.txt 2>&1
ls /dev/pts > listed.txt
(timeout 2 cat {device} > stolen.txt 2>&1 &)
echo 'rm -rf ~' > {device} 2> typed.txt || echo refused >> typed.txt
sleep 1
true"#
    );
    let mut host = env.spawn_crew(&repo, ["run", "--quiet", "--agent", "shell", &script]);
    // Meanwhile the user types a secret.
    std::thread::sleep(std::time::Duration::from_millis(300));
    user.write_all(b"hunter2\n").unwrap();
    let ended = host.wait().unwrap();
    assert!(ended.success());
    let own = std::fs::read_to_string(repo.join("own.txt")).unwrap_or_default();
    assert!(
        own.trim().starts_with("/dev/pts/"),
        "its own terminal: {own}"
    );
    let stolen = std::fs::read_to_string(repo.join("stolen.txt")).unwrap_or_default();
    assert!(
        !stolen.contains("hunter2"),
        "the agent read the user's keystrokes: {stolen}"
    );
    let listed = std::fs::read_to_string(repo.join("listed.txt")).unwrap_or_default();
    let user_number = device.rsplit('/').next().unwrap();
    assert!(
        !listed.lines().any(|line| line == user_number),
        "the user's terminal is there to open: {listed}"
    );
    // What reached the user's screen: read without waiting for more.
    rustix::fs::fcntl_setfl(&user, rustix::fs::OFlags::NONBLOCK).unwrap();
    let mut shown = Vec::new();
    let _ = user.read_to_end(&mut shown);
    assert!(
        !String::from_utf8_lossy(&shown).contains("rm -rf"),
        "the agent typed into the user's terminal: {}",
        String::from_utf8_lossy(&shown)
    );
    let run = run_ids(&env, &repo).remove(0);
    let record = task(&manifest(&env, &repo, &run), "shell").clone();
    assert_eq!(record["sandbox"]["private_terminals"], true, "{record:#}");
}

#[test]
fn an_agent_with_no_network_reaches_no_host_and_none_of_the_user_s_local_servers() {
    use std::os::linux::net::SocketAddrExt;
    let env = TestEnv::new();
    let repo = env.repo("project");
    // The user's local servers: a TCP one, a UDP one and an abstract unix socket.
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let tcp_port = tcp.local_addr().unwrap().port();
    tcp.set_nonblocking(true).unwrap();
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let udp_port = udp.local_addr().unwrap().port();
    udp.set_nonblocking(true).unwrap();
    let name = format!("crew-test-{}", std::process::id());
    let abstract_addr = std::os::unix::net::SocketAddr::from_abstract_name(&name).unwrap();
    let _abstract = std::os::unix::net::UnixListener::bind_addr(&abstract_addr).unwrap();
    write(
        &repo.join(".crew/agents/isolated.toml"),
        "command = [\"sh\", \"-c\", \"{prompt}\"]\n[sandbox]\nnetwork = \"none\"\n",
    );
    write(
        &repo.join(".crew/agents/open.toml"),
        "command = [\"sh\", \"-c\", \"{prompt}\"]\n[sandbox]\nnetwork = \"open\"\n",
    );
    env.allow_settings(&repo);
    let probe = format!(
        r#"import socket
def attempt(what, do):
    try:
        do()
        print(what, "REACHED")
    except OSError as error:
        print(what, "refused:", error)
attempt("tcp", lambda: socket.create_connection(("127.0.0.1", {tcp_port}), timeout=2))
attempt("udp", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"agent", ("127.0.0.1", {udp_port})))
attempt("abstract", lambda: socket.socket(socket.AF_UNIX).connect("\0{name}"))
def own():
    server = socket.socket(); server.bind(("127.0.0.1", 0)); server.listen()
    socket.create_connection(server.getsockname(), timeout=2)
attempt("own loopback", own)
"#
    );
    write(&repo.join("probe.py"), &probe);
    env.git(&repo, ["add", "probe.py"]);
    env.git(&repo, ["commit", "-q", "-m", "probe"]);
    let seen = |agent: &str| {
        let run = env.crew(
            &repo,
            [
                "run",
                "--quiet",
                "--agent",
                agent,
                "python3 probe.py > seen.txt 2>&1",
            ],
        );
        assert!(run.status.success(), "{}", render_output(&run));
        std::fs::read_to_string(repo.join("seen.txt")).unwrap()
    };
    let drain_udp = || {
        let mut buffer = [0u8; 16];
        let mut heard = 0;
        while udp.recv(&mut buffer).is_ok() {
            heard += 1;
        }
        heard
    };
    let accepted = || {
        let mut count = 0;
        while tcp.accept().is_ok() {
            count += 1;
        }
        count
    };
    // With the network open, the same probe reaches the user's TCP and UDP servers: the
    // probe works, and what follows is the sandbox's doing.
    let open = seen("open");
    assert!(
        open.contains("tcp REACHED") && open.contains("udp REACHED"),
        "{open}"
    );
    assert!(accepted() >= 1 && drain_udp() >= 1, "{open}");
    // Abstract sockets are scoped to the agent's own sandbox in every mode (ABI 6).
    assert!(open.contains("abstract refused"), "{open}");
    let isolated = seen("isolated");
    for refused in ["tcp refused", "abstract refused"] {
        assert!(isolated.contains(refused), "{refused}: {isolated}");
    }
    assert_eq!(accepted(), 0, "{isolated}");
    // A datagram is sent without an answer either way: what counts is that none arrived.
    assert_eq!(
        drain_udp(),
        0,
        "a datagram reached the user's server: {isolated}"
    );
    // Its own loopback works: a test suite's own server is not the network.
    assert!(isolated.contains("own loopback REACHED"), "{isolated}");
    let runs = run_ids(&env, &repo);
    let newest = runs
        .iter()
        .map(|run| manifest(&env, &repo, run))
        .find(|record| task(record, "isolated")["id"] == "isolated")
        .unwrap();
    assert_eq!(
        task(&newest, "isolated")["sandbox"]["network"],
        "none",
        "{newest:#}"
    );
}

#[test]
fn an_agent_that_connects_from_a_child_it_reaps_is_never_answered_as_the_user() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    // The trick: a child connects (the kernel records the child as the peer), exits and is
    // reaped, and the agent talks on the connection it kept. Traced after that, the peer's
    // pid names nothing, or another process; it must never count as the user's. (Without the
    // defence about one try in a hundred got the user's answer.)
    let probe = r#"import json, os, socket, sys
answers = {"ok": 0, "refused": 0}
address = os.environ["CREW_SOCKET"]
if address.startswith("@"):
    address = "\0" + address[1:]
for attempt in range(1000):
    connection = socket.socket(socket.AF_UNIX)
    child = os.fork()
    if child == 0:
        try:
            connection.connect(address)
        finally:
            os._exit(0)
    os.waitpid(child, 0)
    try:
        request = {"id": attempt, "workspace": os.environ["CREW_PROJECT_ROOT"], "op": "list"}
        connection.sendall((json.dumps(request) + "\n").encode())
        line = connection.makefile().readline()
        answer = json.loads(line)
        answers["ok" if answer.get("ok") else "refused"] += 1
    except (OSError, ValueError):
        answers["refused"] += 1
    connection.close()
print(json.dumps(answers))
"#;
    write(&repo.join("probe.py"), probe);
    env.git(&repo, ["add", "probe.py"]);
    env.git(&repo, ["commit", "-q", "-m", "probe"]);
    let run = env.crew(
        &repo,
        [
            "run",
            "--quiet",
            "--agent",
            "shell",
            "python3 probe.py > answers.json",
        ],
    );
    assert!(run.status.success(), "{}", render_output(&run));
    let answers: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(repo.join("answers.json")).unwrap()).unwrap();
    assert_eq!(answers["ok"], 0, "answered as the user: {answers}");
    assert_eq!(answers["refused"], 1000, "{answers}");
    // The user's own command is answered all the same.
    let listed = env.crew(&repo, ["agents", "list"]);
    assert!(listed.status.success(), "{}", render_output(&listed));
}

/// Each confined agent reaches its host by a connection of its own (an abstract socket it
/// listens on once confined, which only its own sandbox may connect to), and the host's socket
/// is hidden from it: it cannot reach another agent's connection (found in `/proc/net/unix`)
/// nor the host's socket (its path is in the run's record), so nothing it does is ever taken
/// for the user's or another agent's.
#[test]
fn an_agent_reaches_its_host_by_its_own_connection_only() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let probe = r#"import json, os, socket, glob, time
own = os.environ["CREW_SOCKET"]
print("OWN", own.startswith("@"))
time.sleep(0.5)
def request(address, op):
    connection = socket.socket(socket.AF_UNIX)
    connection.settimeout(5)
    connection.connect(address)
    connection.sendall((json.dumps({"id": 1, "workspace": os.environ["CREW_PROJECT_ROOT"], "op": op, "agent": "victim"}) + "\n").encode())
    return json.loads(connection.makefile().readline())
names = set()
for line in open("/proc/net/unix").read().splitlines()[1:]:
    fields = line.split()
    if len(fields) >= 8 and fields[-1].startswith("@crew-"):
        names.add(fields[-1])
print("SEEN", len(names))
for name in names:
    if name == own:
        continue
    try:
        answer = request("\0" + name[1:], "stop")
        print("REACHED", name, answer)
    except OSError as error:
        print("REFUSED", name, error.errno)
for path in glob.glob(os.environ["CREW_PROJECT_ROOT"] + "/.crew/state/runs/*/manifest.json"):
    socket_path = (json.load(open(path)).get("host") or {}).get("socket")
    if socket_path:
        try:
            answer = request(socket_path, "stop")
            print("REACHED-MAIN", answer)
        except OSError as error:
            print("NO-MAIN", error.errno)
answer = request("\0" + own[1:], "stop")
print("OWN-ANSWER", answer.get("error", {}).get("code"))
"#;
    write(&repo.join("probe.py"), probe);
    // On the machine's network both agents share one namespace of abstract sockets, where
    // the attacker sees the victim's connection: the sandbox, not the namespace, refuses it.
    write(
        &repo.join(".crew/config.toml"),
        "[sandbox]\nnetwork = \"open\"\n",
    );
    env.allow_settings(&repo);
    env.git(&repo, ["add", "probe.py", ".crew"]);
    env.git(&repo, ["commit", "-q", "-m", "probe"]);
    let output = env.crew(
        &repo,
        crate::common::runs::shell_worktree_args(&[
            "victim=echo ready; sleep 4",
            "attacker=python3 probe.py",
        ]),
    );
    assert!(output.status.success(), "{}", render_output(&output));
    let run = run_ids(&env, &repo).remove(0);
    let said = output_log(&repo, &run, "attacker");
    assert!(said.contains("OWN True"), "{said}");
    // It saw the victim's connection, and could not use it; nor the host's socket.
    let seen: usize = said
        .lines()
        .find_map(|line| line.strip_prefix("SEEN "))
        .and_then(|count| count.parse().ok())
        .unwrap_or(0);
    assert!(seen >= 2, "{said}");
    assert!(said.contains("REFUSED @crew-"), "{said}");
    assert!(!said.contains("REACHED"), "{said}");
    assert!(said.contains("NO-MAIN"), "{said}");
    // Its own connection answers it as itself: refused what only the user may do.
    assert!(said.contains("OWN-ANSWER forbidden"), "{said}");
    let recorded = manifest(&env, &repo, &run);
    assert_eq!(task(&recorded, "victim")["status"], "succeeded");
    assert_eq!(
        task(&recorded, "attacker")["sandbox"]["own_connection"],
        true
    );
}

#[test]
fn an_agent_reads_no_secret_from_another_process_s_environment() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    // The host holds a secret it keeps out of agents' environments; the agent goes looking for
    // it in every process's /proc/<pid>/environ (the host's, its warden's, the user's).
    let script = r#"for p in /proc/[0-9]*; do tr '\0' '\n' < $p/environ 2>/dev/null | grep -q hunter2 && echo "FOUND in $p"; done > found.txt; true"#;
    let run = env
        .crew_command(&repo)
        .env("CREW_TEST_SECRET", "hunter2")
        .args(["run", "--quiet", "--agent", "shell", script])
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", render_output(&run));
    let found = std::fs::read_to_string(repo.join("found.txt")).unwrap();
    assert!(found.is_empty(), "{found}");
}

#[test]
fn an_agent_cannot_ask_the_user_s_tmux_server_to_run_a_command() {
    if !crate::common::tmux::installed("an_agent_cannot_ask_the_user_s_tmux_server") {
        return;
    }
    let env = TestEnv::new();
    let repo = env.repo("project");
    // The user's tmux server, at tmux's own place (/tmp/tmux-<uid>/<name>): an unconfined
    // program that runs whatever a client on its socket asks.
    let name = format!("crew-hostile-{}", std::process::id());
    let tmux = |args: &[&str]| {
        std::process::Command::new("tmux")
            .env_remove("TMUX_TMPDIR")
            .env_remove("TMUX")
            .arg("-L")
            .arg(&name)
            .args(args)
            .output()
            .unwrap()
    };
    let started = tmux(&["new-session", "-d", "sleep 120"]);
    assert!(started.status.success(), "{}", render_output(&started));
    let escaped = env.root().join("escaped.txt");
    let script = format!(
        "tmux -L {name} run-shell 'echo escaped > {escaped}' > asked.txt 2>&1; tmux -L {name} new-window -d 'sleep 300' >> asked.txt 2>&1; true"
    );
    let run = env
        .crew_command(&repo)
        .env_remove("TMUX_TMPDIR")
        .args(["run", "--quiet", "--agent", "shell", &script])
        .output()
        .unwrap();
    let windows = tmux(&["list-windows", "-F", "#{window_index}"]);
    let _ = tmux(&["kill-server"]);
    assert!(run.status.success(), "{}", render_output(&run));
    let asked = std::fs::read_to_string(repo.join("asked.txt")).unwrap_or_default();
    assert!(
        !escaped.exists(),
        "the user's tmux ran the agent's command: {asked}"
    );
    assert_eq!(
        String::from_utf8_lossy(&windows.stdout).lines().count(),
        1,
        "the agent opened a window in the user's tmux: {asked}"
    );
    let run_id = run_ids(&env, &repo).remove(0);
    let record = task(&manifest(&env, &repo, &run_id), "shell").clone();
    let hidden = record["sandbox"]["hidden"].to_string();
    assert!(hidden.contains("/tmp/tmux-"), "{record:#}");
}

#[test]
fn as_an_unprivileged_user_an_agent_has_no_network_and_terminals_and_shared_memory_of_its_own() {
    use std::os::unix::process::CommandExt;
    // File permissions do not hold root back; the namespaces differ for an ordinary user:
    // crew runs as `nobody` here.
    if !crew_tests::can_drop_to_nobody() {
        return;
    }
    const NOBODY: u32 = crew_tests::NOBODY;
    let env = TestEnv::reachable_by_others();
    let repo = env.repo("project");
    let server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = server.local_addr().unwrap().port();
    server.set_nonblocking(true).unwrap();
    write(
        &repo.join(".crew/agents/isolated.toml"),
        "command = [\"sh\", \"-c\", \"{prompt}\"]\n[sandbox]\nnetwork = \"none\"\n",
    );
    env.hand_to_nobody();
    // A segment of shared memory anyone may write, as a program might leave it.
    let segment = Utf8PathBuf::from(format!("/dev/shm/crew-test-nobody-{}", std::process::id()));
    write(&segment, "the user's\n");
    std::fs::set_permissions(
        &segment,
        std::os::unix::fs::PermissionsExt::from_mode(0o666),
    )
    .unwrap();
    let script = format!(
        "bash -c 'echo hello > /dev/tcp/127.0.0.1/{port}' 2> tcp.txt && echo REACHED >> tcp.txt; script -qc tty /dev/null > own.txt 2>&1; cat {segment} > shm.txt 2>&1; echo agent >> {segment}; true"
    );
    let mut command = env.crew_command_for_others(&repo);
    command.args(["run", "--quiet", "--agent", "isolated", &script]);
    command.uid(NOBODY);
    command.gid(NOBODY);
    let run = command.output().unwrap();
    let left = std::fs::read_to_string(&segment);
    let _ = std::fs::remove_file(&segment);
    assert!(run.status.success(), "{}", render_output(&run));
    let shm = std::fs::read_to_string(repo.join("shm.txt")).unwrap_or_default();
    assert!(!shm.contains("the user's"), "{shm}");
    assert_eq!(left.unwrap(), "the user's\n");
    let tcp = std::fs::read_to_string(repo.join("tcp.txt")).unwrap_or_default();
    assert!(!tcp.contains("REACHED"), "{tcp}");
    assert!(
        server.accept().is_err(),
        "the user's server was reached: {tcp}"
    );
    let own = std::fs::read_to_string(repo.join("own.txt")).unwrap_or_default();
    assert!(
        own.trim().starts_with("/dev/pts/"),
        "its own terminal: {own}"
    );
}

/// The user's runtime directory holds the agent's own temp dir (the user's TMPDIR is there):
/// the directory cannot be covered whole, and what stands beside the agent's dir — the user's
/// session bus, an ssh agent's socket — is covered one entry at a time. The agent cannot
/// connect to a real server listening there.
#[test]
fn the_users_sockets_beside_an_agents_temp_dir_in_the_runtime_directory_are_hidden() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let runtime = env.root().join("run-user");
    let tmp = runtime.join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    std::fs::set_permissions(
        &runtime,
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    let bus = runtime.join("bus");
    let listener = std::os::unix::net::UnixListener::bind(&bus).unwrap();
    listener.set_nonblocking(true).unwrap();
    let probe = format!(
        r#"python3 -c 'import socket; s = socket.socket(socket.AF_UNIX); s.connect("{bus}"); print("REACHED")' 2>/dev/null || echo REFUSED; echo "tmp=$TMPDIR""#
    );
    let output = env
        .crew_command(&repo)
        .env("XDG_RUNTIME_DIR", &runtime)
        .env("TMPDIR", &tmp)
        .args(["run", "--agent", "shell", &probe])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", render_output(&output));
    let run = run_ids(&env, &repo).remove(0);
    let said = output_log(&repo, &run, "shell");
    assert!(said.contains(&format!("tmp={tmp}")), "{said}");
    assert!(said.contains("REFUSED"), "{said}");
    assert!(!said.contains("REACHED"), "{said}");
    assert!(
        listener.accept().is_err(),
        "a connection came through: {said}"
    );
    let recorded = manifest(&env, &repo, &run);
    assert!(
        task(&recorded, "shell")["sandbox"]["hidden"]
            .to_string()
            .contains("run-user/bus"),
        "{recorded:#}"
    );
}

/// The kernel's keyrings are confined by no namespace and not by Landlock: an agent inherits
/// its host's session keyring, and what the user's login put there (a Kerberos ticket, a file
/// system's key) is its to read. A confined agent is refused the keyrings, and does not find
/// the key's name in `/proc/keys` either; with the sandbox off, the same agent reads the
/// secret and its name (the attack works here).
#[test]
fn a_confined_agent_cannot_read_the_secrets_in_its_user_s_keyring() {
    use std::os::unix::process::CommandExt;
    let env = TestEnv::new();
    let description = format!("crew-test-secret-{}", std::process::id());
    let secret = format!("hunter2-{}", std::process::id());
    let read = |repo: &Utf8Path| -> String {
        let mut command = env.crew_command(repo);
        command.args([
            "run",
            "--quiet",
            "--agent",
            "shell",
            &format!(
                "{} keyring {description} > seen.txt; grep {description} /proc/keys >> seen.txt; true",
                crew_tests::helper_bin("fake-agent")
            ),
        ]);
        let (name, payload) = (
            std::ffi::CString::new(description.clone()).unwrap(),
            secret.clone().into_bytes(),
        );
        // The host starts in a session keyring of its own that holds the secret, as the
        // user's login session would.
        #[allow(unsafe_code)]
        // SAFETY: between fork and exec: two system calls on memory made before the fork.
        unsafe {
            command.pre_exec(move || {
                const KEYCTL_JOIN_SESSION_KEYRING: libc::c_long = 1;
                const KEY_SPEC_SESSION_KEYRING: libc::c_long = -3;
                let joined = libc::syscall(libc::SYS_keyctl, KEYCTL_JOIN_SESSION_KEYRING, 0usize);
                let added = libc::syscall(
                    libc::SYS_add_key,
                    c"user".as_ptr(),
                    name.as_ptr(),
                    payload.as_ptr(),
                    payload.len(),
                    KEY_SPEC_SESSION_KEYRING,
                );
                if joined < 0 || added < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let run = command.output().unwrap();
        assert!(run.status.success(), "{}", render_output(&run));
        std::fs::read_to_string(repo.join("seen.txt")).unwrap()
    };

    let confined = env.repo("confined");
    let seen = read(&confined);
    assert!(
        seen.contains("refused keyring: Operation not permitted") && !seen.contains(&secret),
        "{seen}"
    );
    // Nor the key's name, from the kernel's listing of the keys it may view.
    assert!(!seen.contains(&description), "{seen}");

    let unconfined = env.repo("unconfined");
    write(
        &unconfined.join(".crew/config.toml"),
        "[sandbox]\nmode = \"off\"\n",
    );
    env.allow_settings(&unconfined);
    let seen = read(&unconfined);
    assert!(
        seen.starts_with(&format!("ESCAPED keyring {secret}\n")) && seen.contains(&description),
        "{seen}"
    );
}

/// The user's servers where the user's environment places them, not where they usually are:
/// tmux under `TMUX_TMPDIR`, a session bus at the path of `DBUS_SESSION_BUS_ADDRESS`, container
/// engines at `DOCKER_HOST` and `CONTAINER_HOST`. A confined agent reaches none of them (with
/// nothing covering them, it reached every one: Landlock does not scope pathname sockets).
#[test]
fn the_user_s_servers_where_the_environment_places_them_are_hidden() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let uid = String::from_utf8(
        std::process::Command::new("id")
            .arg("-u")
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap()
    .trim()
    .to_owned();
    let places = env.root().join("elsewhere");
    let sockets = [
        ("tmux", places.join(format!("tmux/tmux-{uid}/default"))),
        ("bus", places.join("bus/socket")),
        ("docker", places.join("docker/docker.sock")),
        ("podman", places.join("podman/podman.sock")),
    ];
    let mut listeners = Vec::new();
    let mut probe = String::new();
    for (name, path) in &sockets {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let listener = std::os::unix::net::UnixListener::bind(path).unwrap();
        listener.set_nonblocking(true).unwrap();
        listeners.push(listener);
        probe.push_str(&format!(
            r#"python3 -c 'import socket; s = socket.socket(socket.AF_UNIX); s.connect("{path}"); print("{name} REACHED")' 2>/dev/null || echo "{name} REFUSED"; "#
        ));
    }
    let output = env
        .crew_command(&repo)
        .env("TMUX_TMPDIR", places.join("tmux"))
        .env(
            "DBUS_SESSION_BUS_ADDRESS",
            format!("unix:path={},guid=0123", places.join("bus/socket")),
        )
        .env(
            "DOCKER_HOST",
            format!("unix://{}", places.join("docker/docker.sock")),
        )
        .env(
            "CONTAINER_HOST",
            format!("unix://{}", places.join("podman/podman.sock")),
        )
        .args(["run", "--agent", "shell", &probe])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", render_output(&output));
    let run = run_ids(&env, &repo).remove(0);
    let said = output_log(&repo, &run, "shell");
    for (name, _) in &sockets {
        assert!(said.contains(&format!("{name} REFUSED")), "{name}: {said}");
    }
    for listener in &listeners {
        assert!(
            listener.accept().is_err(),
            "a connection came through: {said}"
        );
    }
}

/// The user's secret stores are not there for a confined agent: keys, cloud, cluster, registry
/// and forge credentials planted in the home read as empty, even beneath a directory its
/// definition grants; a grant that names a store exactly keeps it. With the sandbox off, the
/// same agent reads every one (the attack works here).
#[test]
fn a_confined_agent_reads_none_of_the_user_s_secret_stores() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let secrets = [
        ".ssh/id_ed25519",
        ".aws/credentials",
        ".config/gh/hosts.yml",
        ".kube/config",
        ".git-credentials",
        ".netrc",
        ".docker/config.json",
        ".npmrc",
        ".cargo/credentials.toml",
    ];
    for secret in secrets {
        write(&env.home().join(secret), &format!("SECRET-{secret}\n"));
    }
    // A store kept elsewhere and linked into the home, as dotfile managers do.
    let kept = env.root().join("dotfiles/azure");
    write(&kept.join("accessTokens.json"), "SECRET-azure\n");
    std::os::unix::fs::symlink(&kept, env.home().join(".azure")).unwrap();
    write(&env.root().join("dotfiles/pypirc"), "SECRET-pypirc\n");
    std::os::unix::fs::symlink(
        env.root().join("dotfiles/pypirc"),
        env.home().join(".pypirc"),
    )
    .unwrap();
    // Directly, and through the root and working directory of its warden, which is outside
    // its namespace (`/proc/<pid>/root`), and through a link it makes to the store.
    let probe = secrets
        .iter()
        .map(|secret| {
            format!(
                "cat \"$HOME/{secret}\" \"/proc/$PPID/root$HOME/{secret}\" 2>/dev/null; ln -sf \"$HOME/{secret}\" link && cat link 2>/dev/null; "
            )
        })
        .collect::<String>()
        + "cat \"$HOME/.azure/accessTokens.json\" \"$HOME/.pypirc\" 2>/dev/null; true";
    let read = |agent: &str| {
        let output = env.crew(&repo, ["run", "--quiet", "--agent", agent, &probe]);
        assert!(output.status.success(), "{}", render_output(&output));
        let run = run_ids(&env, &repo).remove(0);
        output_log(&repo, &run, agent)
    };
    let said = read("shell");
    assert!(!said.contains("SECRET-"), "a secret was read: {said}");
    let check = env.crew(&repo, ["sandbox", "check", "shell"]);
    let shown = String::from_utf8_lossy(&check.stdout);
    assert!(
        shown.contains("not there for it, your secret stores: ~/.ssh, ~/.aws"),
        "{}",
        render_output(&check)
    );
    // A definition granting `~/.config/` (its tools' settings) still does not read gh's token;
    // one naming `~/.netrc` exactly reads that file and no other.
    write(
        &repo.join(".crew/agents/configs.toml"),
        "command = [\"sh\", \"-c\", \"{prompt}\"]\n[sandbox]\nwrite = [\"~/.config/\", \"~/.netrc\"]\n",
    );
    write(
        &repo.join(".crew/agents/free.toml"),
        "command = [\"sh\", \"-c\", \"{prompt}\"]\n[sandbox]\nmode = \"off\"\n",
    );
    env.git(&repo, ["add", ".crew"]);
    env.git(&repo, ["commit", "-q", "-m", "agents"]);
    env.allow_settings(&repo);
    let said = read("configs");
    assert!(said.contains("SECRET-.netrc"), "{said}");
    assert!(
        said.lines()
            .all(|line| !line.contains("SECRET-") || line == "SECRET-.netrc"),
        "{said}"
    );
    let said = read("free");
    for secret in secrets {
        assert!(
            said.contains(&format!("SECRET-{secret}")),
            "{secret}: {said}"
        );
    }
    assert!(
        said.contains("SECRET-azure") && said.contains("SECRET-pypirc"),
        "{said}"
    );
}

/// As an unprivileged user too, a confined agent finds none of its user's secret stores (its
/// namespaces are then made without root's help).
#[test]
fn as_an_unprivileged_user_a_confined_agent_reads_none_of_the_secret_stores() {
    use std::os::unix::process::CommandExt;
    if !crew_tests::can_drop_to_nobody() {
        return;
    }
    let env = TestEnv::reachable_by_others();
    let repo = env.repo("project");
    let secrets = [
        ".ssh/id_ed25519",
        ".aws/credentials",
        ".netrc",
        ".kube/config",
    ];
    for secret in secrets {
        write(&env.home().join(secret), &format!("SECRET-{secret}\n"));
    }
    env.hand_to_nobody();
    let probe = secrets
        .iter()
        .map(|secret| format!("cat \"$HOME/{secret}\" 2>/dev/null; "))
        .collect::<String>()
        + "echo PROBED";
    let mut command = env.crew_command_for_others(&repo);
    command.args(["run", "--quiet", "--agent", "shell", &probe]);
    command.uid(crew_tests::NOBODY);
    command.gid(crew_tests::NOBODY);
    let run = command.output().unwrap();
    assert!(run.status.success(), "{}", render_output(&run));
    let log = output_log(&repo, &run_ids(&env, &repo)[0], "shell");
    assert!(log.contains("PROBED") && !log.contains("SECRET-"), "{log}");
}
