//! The control socket against real connections: permissions, other users, hostile input,
//! workspace isolation and load.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use crew_core::WorkspaceId;
use crew_core::config::SteerMode;
use crew_live::control::{ControlError, ErrorCode, Op};
use crew_live::{ControlClient, ControlServer};

use crate::common::live::{LiveFixture, fake, wait_for_line};

/// The uid the permission tests drop to when they run as root (CI does): `nobody`.
const UNPRIVILEGED: u32 = 65534;

/// A host serving its control socket, and the socket's path.
async fn serving() -> (LiveFixture, ControlServer, camino::Utf8PathBuf) {
    let fixture = LiveFixture::new();
    let server = ControlServer::bind(fixture.host.clone(), &fixture.workspace)
        .await
        .unwrap();
    let path = server.path().to_owned();
    (fixture, server, path)
}

/// A host with one agent (`api`, echoing its input) that is ready, serving its socket.
async fn one_agent_serving() -> (
    LiveFixture,
    crew_live::AgentHandle,
    tokio::sync::broadcast::Receiver<crew_live::AgentEvent>,
    ControlServer,
) {
    let fixture = LiveFixture::new();
    let mut events = fixture.host.subscribe();
    let handle = fixture
        .host
        .start(fixture.spec("api", fake(&["echo-stdin"], SteerMode::StdinLines)))
        .await
        .unwrap();
    wait_for_line(&mut events, handle.agent_id(), "ready").await;
    let server = ControlServer::bind(fixture.host.clone(), &fixture.workspace)
        .await
        .unwrap();
    (fixture, handle, events, server)
}

/// Sends raw bytes on a fresh connection and returns the answer line.
fn raw_exchange(path: &camino::Utf8Path, bytes: &[u8]) -> serde_json::Value {
    let mut stream = std::os::unix::net::UnixStream::connect(path).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    stream.write_all(bytes).unwrap();
    stream.shutdown(std::net::Shutdown::Write).unwrap();
    let mut answer = String::new();
    BufReader::new(stream).read_line(&mut answer).unwrap();
    serde_json::from_str(&answer).unwrap_or_else(|_| panic!("not JSON: {answer:?}"))
}

fn ping_line(workspace: &WorkspaceId) -> Vec<u8> {
    format!(
        "{{\"workspace\":{:?},\"op\":\"ping\"}}\n",
        workspace.as_path().as_str()
    )
    .into_bytes()
}

#[test]
fn socket_is_private_even_under_umask_000() {
    // In a process of its own: the umask is the whole process's, and other tests run beside.
    let env = crew_tests::TestEnv::new();
    let answer =
        crate::common::live::live_helper_json(&env, &["umask-socket", env.dir("project").as_str()]);
    assert_eq!(
        (&answer["socket_mode"], &answer["dir_mode"]),
        (&serde_json::json!(0o600), &serde_json::json!(0o700))
    );
    assert!(answer["socket"].as_str().unwrap().len() < 108);
    assert_eq!(answer["ping_ok"], true);
}

#[tokio::test(flavor = "multi_thread")]
async fn another_user_is_refused() {
    let fixture = LiveFixture::in_env(crew_tests::TestEnv::reachable_by_others());
    let server = ControlServer::bind_in(
        fixture.host.clone(),
        &fixture.workspace,
        &fixture.env.root().join("sockets"),
    )
    .await
    .unwrap();
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: dropping to another uid needs root; CI runs as root");
        return;
    }
    let helper = fixture
        .env
        .runnable_by_others(camino::Utf8Path::new(env!("CARGO_BIN_EXE_live-helper")));
    let raw_as_nobody = |path: &str| {
        let mut command = std::process::Command::new(&helper);
        command.args(["raw", path, "{\"workspace\":\"/\",\"op\":\"ping\"}"]);
        std::os::unix::process::CommandExt::uid(&mut command, UNPRIVILEGED);
        std::os::unix::process::CommandExt::gid(&mut command, UNPRIVILEGED);
        let output = command.output().unwrap();
        String::from_utf8(output.stdout).unwrap()
    };
    // The directory and the socket keep other users out.
    assert_eq!(
        raw_as_nobody(server.path().as_str()),
        "connect error: permission denied\n"
    );

    // Even with the file system opened up, the peer's uid is checked before anything is read.
    let dir = server.path().parent().unwrap();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711)).unwrap();
    std::fs::set_permissions(server.path(), std::fs::Permissions::from_mode(0o666)).unwrap();
    let answer: serde_json::Value =
        serde_json::from_str(&raw_as_nobody(server.path().as_str())).unwrap();
    assert_eq!(answer["ok"], false);
    assert_eq!(answer["error"]["code"], "permission_denied");
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    assert_eq!(
        raw_exchange(server.path(), &ping_line(&fixture.workspace))["ok"],
        true
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn hostile_input_gets_structured_errors_and_the_server_goes_on() {
    let (fixture, _server, path) = serving().await;
    let workspace = fixture.workspace.clone();
    tokio::task::spawn_blocking(move || {
        let huge = vec![b'a'; 16 * 1024 * 1024];
        let answer = raw_exchange(&path, &huge);
        assert_eq!(answer["error"]["code"], "request_too_large");

        let answer = raw_exchange(&path, b"{this is not json\n");
        assert_eq!(answer["error"]["code"], "invalid_request");

        let mut deep = "[".repeat(10_000);
        deep.push_str(&"]".repeat(10_000));
        deep.push('\n');
        let answer = raw_exchange(&path, deep.as_bytes());
        assert_eq!(answer["error"]["code"], "invalid_request");

        let answer = raw_exchange(&path, b"{\"workspace\":\"\xff\xfe\",\"op\":\"list\"}\n");
        assert_eq!(answer["error"]["code"], "invalid_request");

        let answer = raw_exchange(&path, b"{\"workspace\":\"/\",\"op\":\"launch_missiles\"}\n");
        assert_eq!(answer["error"]["code"], "invalid_request");

        // A too-large line followed by a good one on the same connection: both answered.
        let mut stream = std::os::unix::net::UnixStream::connect(&path).unwrap();
        let mut bytes = vec![b'x'; 2 * 1024 * 1024];
        bytes.push(b'\n');
        bytes.extend_from_slice(&ping_line(&workspace));
        stream.write_all(&bytes).unwrap();
        let mut reader = BufReader::new(stream);
        let mut first = String::new();
        reader.read_line(&mut first).unwrap();
        let mut second = String::new();
        reader.read_line(&mut second).unwrap();
        assert!(first.contains("request_too_large"), "{first}");
        assert!(second.contains("\"ok\":true"), "{second}");

        let answer = raw_exchange(&path, &ping_line(&workspace));
        assert_eq!(answer["ok"], true, "still serving");
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn other_workspaces_are_refused_whatever_their_spelling() {
    let (fixture, handle, mut events, server) = one_agent_serving().await;
    let other = fixture.env.dir("other");
    std::fs::create_dir_all(other.join("sub")).unwrap();
    let link_to_other = fixture.env.root().join("link-to-other");
    std::os::unix::fs::symlink(&other, &link_to_other).unwrap();
    let link_to_ours = fixture.env.root().join("link-to-project");
    std::os::unix::fs::symlink(fixture.workspace.as_path(), &link_to_ours).unwrap();
    let agent = handle.agent_id().to_string();

    for spelling in [
        other.to_string(),
        link_to_other.to_string(),
        format!("{other}/sub/.."),
        format!("{other}/"),
    ] {
        let workspace = WorkspaceId::from_canonical(spelling.clone().into());
        let mut client = ControlClient::connect(server.path()).await.unwrap();
        for op in [
            Op::Steer {
                agent: agent.clone(),
                message: "hijack".into(),
            },
            Op::Stop {
                agent: agent.clone(),
            },
            Op::FollowUp {
                agent: agent.clone(),
                message: "hijack".into(),
            },
            Op::Resume {
                agent: agent.clone(),
                message: None,
            },
        ] {
            let response = client
                .call(&workspace, op, Duration::from_secs(10))
                .await
                .unwrap();
            let error = response.answer.unwrap_err();
            assert_eq!(error.code, ErrorCode::ForeignWorkspace, "{spelling}");
            assert!(error.message.starts_with(&format!(
                "live agent '{agent}' does not belong to workspace "
            )));
        }
        let listed = client
            .call(&workspace, Op::List, Duration::from_secs(10))
            .await
            .unwrap();
        assert_eq!(listed.answer.unwrap(), serde_json::json!([]), "{spelling}");
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !handle
            .snapshot()
            .last_lines
            .iter()
            .any(|line| line.contains("hijack"))
    );
    assert_eq!(handle.status().state, crew_live::AgentState::Running);

    // The same workspace spelled through a symlink is the same workspace.
    let mut client = ControlClient::connect(server.path()).await.unwrap();
    let ours_via_link = WorkspaceId::from_canonical(link_to_ours.clone());
    let response = client
        .call(
            &ours_via_link,
            Op::Steer {
                agent: "api".into(),
                message: "via link".into(),
            },
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    assert!(response.answer.is_ok(), "{response:?}");
    wait_for_line(&mut events, handle.agent_id(), "got: via link").await;
    handle.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dead_host_is_reported_at_once() {
    let fixture = LiveFixture::new();
    let dir = fixture.env.root().join("sockets");
    std::fs::create_dir(&dir).unwrap();
    let path = dir.join("host.sock");
    // A socket file whose listener is gone, as a crashed host leaves it.
    let stale = path.with_extension("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    let started = Instant::now();
    let error = ControlClient::connect(&stale).await.unwrap_err();
    assert!(matches!(error, ControlError::HostGone { .. }), "{error}");
    assert!(started.elapsed() < Duration::from_secs(1));
    assert!(matches!(
        ControlClient::connect(&path.with_extension("missing.sock")).await,
        Err(ControlError::HostGone { .. })
    ));
}

#[tokio::test(flavor = "multi_thread")]
async fn long_project_paths_still_get_a_socket() {
    let fixture = LiveFixture::new();
    let deep = fixture.env.dir(&"very-long-directory-name/".repeat(8));
    let workspace = WorkspaceId::from_path(deep.as_std_path()).unwrap();
    assert!(workspace.as_path().as_str().len() > 200);
    let server = ControlServer::bind(fixture.host.clone(), &workspace)
        .await
        .unwrap();
    let mut client = ControlClient::connect(server.path()).await.unwrap();
    let response = client
        .call(&workspace, Op::List, Duration::from_secs(5))
        .await
        .unwrap();
    assert!(response.answer.is_ok());
}

#[tokio::test(flavor = "multi_thread")]
async fn five_thousand_concurrent_requests_while_agents_come_and_go() {
    let (fixture, _server, path) = serving().await;
    let host = fixture.host.clone();
    let churn_specs: Vec<_> = (0..40)
        .map(|index| {
            fixture.spec(
                &format!("churn-{index}"),
                fake(&["sleep", "0.05"], SteerMode::StdinLines),
            )
        })
        .collect();
    let churn = tokio::spawn(async move {
        for spec in churn_specs {
            let agent_id = spec.agent_id.clone();
            let handle = host.start(spec).await.unwrap();
            if agent_id.task_id().as_str().ends_with('0') {
                let _ = handle.stop().await;
            }
            handle.wait_exited().await;
            host.registry().remove(&agent_id);
        }
    });
    let started = Instant::now();
    let clients: Vec<_> = (0..50)
        .map(|client_index| {
            let path = path.clone();
            let workspace = fixture.workspace.clone();
            tokio::spawn(async move {
                let mut client = ControlClient::connect(&path).await.unwrap();
                for request in 0..100 {
                    let agent = format!("churn-{}", (client_index + request) % 40);
                    let op = match request % 3 {
                        0 => Op::List,
                        1 => Op::Steer {
                            agent,
                            message: "hello".into(),
                        },
                        _ => Op::Stop { agent },
                    };
                    // Every request gets an answer, a refusal being one: the unwrap is the
                    // check.
                    client
                        .call(&workspace, op, Duration::from_secs(30))
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    let all = async {
        for client in clients {
            client.await.unwrap();
        }
        churn.await.unwrap();
    };
    tokio::time::timeout(Duration::from_secs(120), all)
        .await
        .expect("no deadlock");
    eprintln!("5000 requests in {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_flooding_the_socket_cannot_lock_the_user_out() {
    let (fixture, _server, path) = serving().await;
    let mut events = fixture.host.subscribe();
    let mut spec = fixture.spec(
        "flooder",
        fake(&["hold-socket", "70", "60"], SteerMode::None),
    );
    spec.socket = Some(path.clone());
    let flooder = fixture.host.start(spec).await.unwrap();
    // One agent holds at most its share of the connections.
    wait_for_line(
        &mut events,
        flooder.agent_id(),
        &format!("accepted {}", crew_live::control::MAX_CONNECTIONS_PER_PEER),
    )
    .await;
    // The user's own clients, many at once, are all served while the agent holds its share.
    let clients: Vec<_> = (0..40)
        .map(|_| {
            let path = path.clone();
            let workspace = fixture.workspace.clone();
            tokio::spawn(async move {
                let mut client = ControlClient::connect(&path).await.unwrap();
                let response = client
                    .call(&workspace, Op::List, Duration::from_secs(10))
                    .await
                    .unwrap();
                assert!(response.answer.is_ok(), "{response:?}");
                (client, response)
            })
        })
        .collect();
    let mut listed = 0;
    let mut held = Vec::new();
    for client in clients {
        let (client, response) = client.await.unwrap();
        listed += usize::from(response.answer.unwrap().as_array().unwrap().len() == 1);
        held.push(client);
    }
    assert_eq!(listed, 40);
    flooder.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_may_ask_for_itself_but_never_control_another() {
    let (fixture, _server, path) = serving().await;
    let mut events = fixture.host.subscribe();
    let victim = fixture
        .host
        .start(fixture.spec("victim", fake(&["echo-stdin"], SteerMode::StdinLines)))
        .await
        .unwrap();
    wait_for_line(&mut events, victim.agent_id(), "ready").await;
    // The attacker speaks the protocol itself, as a hostile program would, from a grandchild.
    let requests = [
        r#"{"op":"stop","agent":"victim"}"#.to_owned(),
        r#"{"op":"steer","agent":"victim","message":"rm -rf ~"}"#.to_owned(),
        r#"{"op":"list"}"#.to_owned(),
        // Watching would stream every agent's output and state to it.
        r#"{"op":"watch"}"#.to_owned(),
        format!(
            r#"{{"op":"ask","agent":"{}","question":"may I?"}}"#,
            fixture.agent_id("victim")
        ),
        format!(
            r#"{{"op":"ask","agent":"{}","question":"which file?"}}"#,
            fixture.agent_id("attacker")
        ),
    ];
    let workspace = fixture.workspace.as_path().to_string();
    let script: String = requests
        .iter()
        .map(|request| {
            let request = request.replacen('{', &format!("{{\"workspace\":\"{workspace}\","), 1);
            format!(
                "printf '%s\\n' '{request}' | {} pipe-socket\n",
                crate::common::live::FAKE_AGENT
            )
        })
        .collect();
    let mut attacker_definition = crew_core::config::AgentDef::builtin_shell();
    attacker_definition.command = vec!["sh".into(), "-c".into(), script];
    let mut spec = fixture.spec("attacker", attacker_definition);
    spec.socket = Some(path.clone());
    let log = spec.output_log.clone();
    let attacker = fixture.host.start(spec).await.unwrap();
    attacker.wait_exited().await;
    let answers: Vec<serde_json::Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|_| panic!("{line}")))
        .collect();
    let codes: Vec<&str> = answers
        .iter()
        .map(|answer| answer["error"]["code"].as_str().unwrap_or("ok"))
        .collect();
    assert_eq!(
        codes,
        [
            "forbidden",
            "forbidden",
            "forbidden",
            "forbidden",
            "forbidden",
            "ok"
        ],
        "{answers:#?}"
    );
    // The victim got nothing and runs on; the attacker's own question was taken.
    assert_eq!(victim.status().state, crew_live::AgentState::Running);
    assert!(victim.status().question.is_none());
    assert_eq!(attacker.status().question.as_deref(), Some("which file?"));
    // The user's own client may do all of it.
    let mut client = ControlClient::connect(&path).await.unwrap();
    let response = client
        .call(
            &fixture.workspace,
            Op::Stop {
                agent: "victim".into(),
            },
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    assert!(response.answer.is_ok(), "{response:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn only_sockets_a_host_would_make_are_trusted_from_state() {
    use crew_live::control::is_plausible_socket;
    let fixture = LiveFixture::new();
    let server = ControlServer::bind(fixture.host.clone(), &fixture.workspace)
        .await
        .unwrap();
    assert!(is_plausible_socket(server.path()));
    // What an edited manifest could point at instead: a file, a link to the real socket, a
    // socket in a directory others may enter, a path climbing out.
    let open_dir = fixture.env.dir("open");
    std::fs::set_permissions(&open_dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let open_socket = open_dir.join("other.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&open_socket).unwrap();
    let link = fixture.env.root().join("link.sock");
    std::os::unix::fs::symlink(server.path(), &link).unwrap();
    let climbing = camino::Utf8PathBuf::from(format!(
        "{}/../{}",
        server.path().parent().unwrap(),
        server.path().parent().unwrap().file_name().unwrap()
    ))
    .join(server.path().file_name().unwrap());
    for forged in [
        camino::Utf8Path::new("/etc/passwd"),
        &open_socket,
        &link,
        &climbing,
        camino::Utf8Path::new("relative.sock"),
    ] {
        assert!(!is_plausible_socket(forged), "{forged}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_turned_away_learns_the_host_is_busy() {
    let (fixture, _server, path) = serving().await;
    let mut held = Vec::new();
    for _ in 0..crew_live::control::MAX_CONNECTIONS {
        let mut client = ControlClient::connect(&path).await.unwrap();
        let response = client
            .call(&fixture.workspace, Op::Ping, Duration::from_secs(10))
            .await
            .unwrap();
        assert!(response.answer.is_ok());
        held.push(client);
    }
    let mut turned_away = ControlClient::connect(&path).await.unwrap();
    let response = turned_away
        .call(&fixture.workspace, Op::List, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(response.answer.unwrap_err().code, ErrorCode::Busy);
    drop(held);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_watch_streams_only_its_own_workspaces_agents() {
    let (fixture, handle, _events, server) = one_agent_serving().await;
    let other = WorkspaceId::from_canonical(fixture.env.dir("other").to_string().into());
    let mut ours = crew_live::project::watch::subscribe(server.path(), &fixture.workspace)
        .await
        .unwrap();
    let mut theirs = crew_live::project::watch::subscribe(server.path(), &other)
        .await
        .unwrap();
    assert_eq!(ours.take_agents().unwrap().len(), 1);
    assert_eq!(theirs.take_agents().unwrap(), []);

    handle.steer("hello from the user").await.unwrap();
    let heard = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match ours.next().await {
                Some(crew_live::WatchEvent::Output { line, .. }) if line.contains("hello") => {
                    return line;
                }
                Some(_) => {}
                None => panic!("the watch ended"),
            }
        }
    })
    .await
    .expect("the owner's watch never heard the line");
    assert!(heard.contains("hello from the user"), "{heard}");
    // Another workspace's watcher hears nothing of it.
    let leaked = tokio::time::timeout(Duration::from_millis(500), theirs.next()).await;
    assert!(leaked.is_err(), "{leaked:?}");
    handle.stop().await.unwrap();
}
