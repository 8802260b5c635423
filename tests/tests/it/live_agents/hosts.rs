//! Hosts of many agents, killed and dropped, and two workspaces in one.

use super::*;

#[tokio::test(flavor = "multi_thread")]
async fn two_hundred_agents_exiting_at_once_are_all_recorded_and_reaped() {
    let fixture = LiveFixture::new();
    let deadline = (std::time::SystemTime::now() + Duration::from_secs(3))
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        .to_string();
    let mut handles = Vec::new();
    for index in 0..200 {
        let code = (index % 5).to_string();
        let spec = fixture.spec(
            &format!("a{index}"),
            fake(&["sleep-until", &deadline, &code], SteerMode::None),
        );
        handles.push(fixture.host.start(spec).await.unwrap());
    }
    for (index, handle) in handles.iter().enumerate() {
        let exit = tokio::time::timeout(Duration::from_secs(30), handle.wait_exited())
            .await
            .unwrap()
            .exit
            .unwrap();
        assert_eq!(exit.code, Some((index % 5) as i32), "{}", handle.agent_id());
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The agents' own processes (their wardens), not every child of this process: other tests
    // run beside this one and reap their children in their own time.
    let wardens: Vec<u32> = handles
        .iter()
        .filter_map(|handle| handle.status().pid)
        .collect();
    assert_eq!(wardens.len(), 200);
    let zombies: Vec<u32> = children_in_state(std::process::id(), 'Z')
        .into_iter()
        .filter(|pid| wardens.contains(pid))
        .collect();
    assert!(zombies.is_empty(), "zombie agents: {zombies:?}");
}

/// Every warden is forked by a small server the host started (`spawn/warden/server.rs`); one
/// killed (an unconfined agent may, it runs as the user) costs the next start nothing but a
/// new server, even when the request reached it while the kernel was still killing it.
#[test]
fn a_warden_server_killed_is_started_again() {
    let env = TestEnv::new();
    let workspace = env.dir("project");
    let result = live_helper_json(&env, &["server-killed", workspace.as_str()]);
    assert!(result["killed"].as_u64() >= Some(20), "{result}");
    assert_eq!(result["first"], 3, "{result}");
    let after = result["after"].as_array().unwrap();
    assert_eq!(after.len(), 20, "{result}");
    assert!(after.iter().all(|code| code == 3), "{result}");
}

#[tokio::test(flavor = "multi_thread")]
async fn host_killed_with_five_agents_takes_them_and_their_grandchildren_along() {
    let env = TestEnv::new();
    let workspace = env.dir("project");
    let run_id = RunId::generate();
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_live-helper"));
    env.hermetic(&mut command)
        .args(["host", workspace.as_str(), run_id.as_str(), "5", FAKE_AGENT])
        .stdout(std::process::Stdio::piped());
    let mut host = command.spawn().unwrap();
    let mut stdout = std::io::BufReader::new(host.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
    assert_eq!(line, "started\n");
    let marker = format!("CREW_RUN_ID={run_id}");
    // 5 agents, 10 sleepers, and 5 daemons that left their agent's group and session (they
    // start in the background, so they may come a moment after `started`).
    let host_session = session_of(Some(host.id()));
    crew_tests::wait_until(10, "the 5 daemons to have started", || {
        let daemons = marked_processes(&marker)
            .into_iter()
            .filter(|&pid| session_of(Some(pid)) != host_session)
            .count();
        (daemons >= 5).then_some(())
    });
    assert!(marked_processes(&marker).len() >= 20);
    // Its warden server, which forked the five wardens, goes with it too.
    let servers = children_named(host.id(), "crew-wardens");
    assert!(!servers.is_empty(), "no warden server");
    // In `ps`, each warden names the agent it stands for (it is a fork of the server, whose
    // arguments it writes its title over), the server its host.
    let mut titles: Vec<String> = children_named(host.id(), "crew-warden")
        .into_iter()
        .map(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
            String::from_utf8_lossy(&cmdline)
                .trim_end_matches('\0')
                .to_owned()
        })
        .collect();
    titles.sort();
    let expected: Vec<String> = (0..5)
        .map(|index| format!("crew-warden {run_id}:agent-{index} {FAKE_AGENT}"))
        .collect();
    assert_eq!(titles, expected);
    for server in &servers {
        let cmdline = std::fs::read(format!("/proc/{server}/cmdline")).unwrap();
        let words: Vec<&[u8]> = cmdline
            .split(|&byte| byte == 0)
            .filter(|word| !word.is_empty())
            .collect();
        assert_eq!(words.len(), 4, "{}", String::from_utf8_lossy(&cmdline));
        assert_eq!(words[0], b"crew-wardens");
    }

    rustix::process::kill_process(
        rustix::process::Pid::from_child(&host),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    host.wait().unwrap();
    let started = Instant::now();
    loop {
        // The daemons too: each warden sweeps /proc for its agent's marker before killing
        // its group.
        let left = marked_processes(&marker);
        if left.is_empty() {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "still alive after the host died: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    crew_tests::wait_until(5, "the warden server to die with its host", || {
        let alive: Vec<&u32> = servers
            .iter()
            .filter(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                    stat.contains("(crew-wardens)")
                        && !stat
                            .rsplit_once(')')
                            .is_some_and(|(_, rest)| rest.starts_with(" Z"))
                })
            })
            .collect();
        alive.is_empty().then_some(())
    });
}

#[tokio::test(flavor = "multi_thread")]
async fn one_host_keeps_two_workspaces_apart() {
    let fixture = LiveFixture::new();
    let other_dir = fixture.env.dir("other");
    let other = WorkspaceId::from_path(other_dir.as_std_path()).unwrap();
    let mut events = fixture.host.subscribe();
    let ours = fixture
        .host
        .start(fixture.spec("api", fake(&["echo-stdin"], SteerMode::StdinLines)))
        .await
        .unwrap();
    let mut theirs_spec = fixture.spec("api", fake(&["echo-stdin"], SteerMode::StdinLines));
    theirs_spec.agent_id = AgentId::new(RunId::generate(), TaskId::parse("api").unwrap());
    theirs_spec.workspace = other.clone();
    theirs_spec.dir = other_dir.clone();
    theirs_spec.output_log = fixture.env.root().join("logs/other-api.log");
    let theirs = fixture.host.start(theirs_spec).await.unwrap();
    // The two start together: their lines may come in either order.
    wait_for_lines(
        &mut events,
        &[(ours.agent_id(), "ready"), (theirs.agent_id(), "ready")],
    )
    .await;

    let registry = fixture.host.registry();
    let listed: Vec<AgentId> = registry
        .list(&fixture.workspace)
        .into_iter()
        .map(|agent| agent.agent_id)
        .collect();
    assert_eq!(listed, [ours.agent_id().clone()]);
    let listed: Vec<AgentId> = registry
        .list(&other)
        .into_iter()
        .map(|agent| agent.agent_id)
        .collect();
    assert_eq!(listed, [theirs.agent_id().clone()]);

    // By task id, each workspace reaches its own agent only.
    registry.steer(&other, "api", "from other").await.unwrap();
    wait_for_line(&mut events, theirs.agent_id(), "got: from other").await;

    // By full id, the other workspace's agent is refused and receives nothing.
    let foreign = ours.agent_id().to_string();
    let error = registry
        .steer(&other, &foreign, "hijack")
        .await
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        format!("live agent '{foreign}' does not belong to workspace {other}")
    );
    assert!(matches!(
        registry.stop(&other, &foreign).await,
        Err(AgentOpError::ForeignWorkspace { .. })
    ));
    assert!(matches!(
        registry.follow_up(&other, &foreign, "x").await,
        Err(AgentOpError::ForeignWorkspace { .. })
    ));
    assert!(matches!(
        registry.resume(&other, &foreign, None).await,
        Err(AgentOpError::ForeignWorkspace { .. })
    ));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !ours
            .snapshot()
            .last_lines
            .iter()
            .any(|line| line.contains("hijack"))
    );
    assert_eq!(ours.status().state, AgentState::Running);

    // Two runs of one workspace with the same task id: a bare task id is ambiguous.
    let mut second = fixture.spec("api", fake(&["sleep", "30"], SteerMode::None));
    second.agent_id = AgentId::new(RunId::generate(), TaskId::parse("api").unwrap());
    second.output_log = fixture.env.root().join("logs/api-2.log");
    let second = fixture.host.start(second).await.unwrap();
    assert!(matches!(
        registry.stop(&fixture.workspace, "api").await,
        Err(AgentOpError::Ambiguous { .. })
    ));
    let prefix = format!("{}:api", &fixture.run_id.as_str()[..12]);
    registry
        .steer(&fixture.workspace, &prefix, "by prefix")
        .await
        .unwrap();
    wait_for_line(&mut events, ours.agent_id(), "got: by prefix").await;
    for handle in [ours, theirs, second] {
        handle.stop().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn dropping_the_host_kills_its_agents() {
    let fixture = LiveFixture::new();
    let mut events = fixture.host.subscribe();
    let handle = fixture
        .host
        .start(fixture.spec("orphan", fake(&["ignore-term", "60"], SteerMode::None)))
        .await
        .unwrap();
    wait_for_line(&mut events, handle.agent_id(), "ready").await;
    let marker = format!("CREW_AGENT_ID={}", handle.agent_id());
    let LiveFixture { host, env, .. } = fixture;
    drop(host);
    drop(handle);
    assert_no_marked_processes(&marker, Duration::from_secs(5)).await;
    drop(env);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_published_listing_carries_each_agents_newest_line_only() {
    let fixture = LiveFixture::new();
    let mut events = fixture.host.subscribe();
    let agent = fixture
        .host
        .start(fixture.spec("api", fake(&["echo-stdin"], SteerMode::StdinLines)))
        .await
        .unwrap();
    let registry = fixture.host.registry();
    for line in ["one", "two", "three"] {
        registry
            .steer(&fixture.workspace, "api", line)
            .await
            .unwrap();
    }
    wait_for_line(&mut events, agent.agent_id(), "got: three").await;
    let path = fixture.env.root().join("live/host.json");
    let _publisher = crew_live::control::publish::Publisher::start(
        fixture.host.clone(),
        None,
        fixture.workspace.clone(),
        path.clone(),
    );
    let published = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            if let Some(agents) =
                crew_live::control::publish::read_listing(&path, std::process::id())
            {
                return agents;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the listing is published");
    assert_eq!(published.len(), 1);
    assert_eq!(published[0].agent_id, *agent.agent_id());
    assert_eq!(published[0].last_lines, ["got: three"]);
    // The host itself keeps the whole tail.
    let tail = &registry.list(&fixture.workspace)[0].last_lines;
    assert_eq!(
        tail[tail.len() - 3..],
        ["got: one", "got: two", "got: three"]
    );
    registry.stop(&fixture.workspace, "api").await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_question_asked_before_the_host_registered_the_agent_reaches_it() {
    let fixture = LiveFixture::new();
    // The agent's process can ask the moment it runs, which may be before its host has
    // recorded it: here the host registers it 300 ms after the question.
    let host = fixture.host.clone();
    let spec = fixture.spec("late", fake(&["echo-stdin"], SteerMode::StdinLines));
    let starting = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        host.start(spec).await.unwrap()
    });
    let registry = fixture.host.registry();
    registry
        .ask(&fixture.workspace, &fixture.agent_id("late"), "which way?")
        .await
        .unwrap();
    let agent = starting.await.unwrap();
    assert_eq!(agent.status().question.as_deref(), Some("which way?"));
    // An agent that never comes is still refused, after the grace.
    let error = registry
        .ask(&fixture.workspace, &fixture.agent_id("ghost"), "anyone?")
        .await
        .unwrap_err();
    assert!(matches!(error, AgentOpError::NotFound { .. }), "{error}");
    registry.stop(&fixture.workspace, "late").await.unwrap();
}

#[test]
fn a_run_whose_canceller_is_dropped_does_not_spin() {
    // An embedder that keeps no cancel sender: the runner must wait, not poll. Measured in a
    // process of its own, whose CPU time is the run's alone.
    let env = TestEnv::new();
    let repo = env.repo("project");
    let result = live_helper_json(&env, &["dropped-cancel", repo.as_str()]);
    assert_eq!(result["status"], "completed");
    let cpu = result["cpu_seconds"].as_f64().unwrap();
    // The agent sleeps for a second; a spinning runner burns most of that second on a core.
    assert!(
        cpu < 0.2,
        "the runner used {cpu:.2} s of CPU during a 1 s run"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn each_start_of_an_agent_is_marked_in_its_log() {
    let fixture = LiveFixture::new();
    let spec = fixture.spec("twice", fake(&["print", "hello"], SteerMode::None));
    let log = spec.output_log.clone();
    let handle = fixture.host.start(spec).await.unwrap();
    handle.wait_exited().await;
    handle.resume(None).await.unwrap();
    handle.wait_exited().await;
    let text = std::fs::read_to_string(log).unwrap();
    let (first, second) = text
        .split_once("\n[crew: the agent started again at ")
        .unwrap();
    assert_eq!(first, "hello\n");
    assert!(second.ends_with("]\nhello\n"), "{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_follow_up_queued_before_a_stop_is_delivered_by_the_next_resume() {
    let fixture = LiveFixture::new();
    let mut events = fixture.host.subscribe();
    let mut definition = AgentDef::builtin_shell();
    definition.steer = SteerMode::None;
    definition.command = vec![
        "sh".into(),
        "-c".into(),
        "echo \"msg=$CREW_MESSAGE\"; exec sleep 30".into(),
    ];
    let handle = fixture
        .host
        .start(fixture.spec("patient", definition))
        .await
        .unwrap();
    wait_for_line(&mut events, handle.agent_id(), "msg=").await;
    handle.follow_up("then the docs").await.unwrap();
    handle.stop().await.unwrap();
    assert_eq!(handle.wait_exited().await.queued_follow_ups, 1);
    handle.resume(None).await.unwrap();
    wait_for_line(&mut events, handle.agent_id(), "msg=then the docs").await;
    handle.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn after_a_kill_the_daemons_of_an_agent_ignoring_term_are_found_by_their_marker() {
    let fixture = LiveFixture::new();
    let mut events = fixture.host.subscribe();
    let sleep = format!("{}", 7000 + std::process::id() % 1000);
    let mut definition = AgentDef::builtin_shell();
    definition.steer = SteerMode::None;
    // The KILL that ends the grace kills the warden too: nothing is left beneath it to catch
    // the daemon, so the host must find it by its marker.
    definition.command = vec![
        "sh".into(),
        "-c".into(),
        format!(
            "trap '' TERM; (setsid sh -c 'exec sleep {sleep}' </dev/null >/dev/null 2>&1 &); echo ready; while :; do sleep 1; done"
        ),
    ];
    let handle = fixture
        .host
        .start(fixture.spec("stubborn-daemon", definition))
        .await
        .unwrap();
    wait_for_line(&mut events, handle.agent_id(), "ready").await;
    assert_eq!(handle.stop().await.unwrap(), StopOutcome::Killed);
    let exit = handle.status().exit.unwrap();
    assert!(exit.leaked_processes >= 1, "{exit:?}");
    assert!(
        processes_running(&["sleep", &sleep]).is_empty(),
        "the daemon outlived its agent"
    );
}
