//! What a live agent gets and gives: its environment, its prompt, steers, follow-ups, output.

use super::*;

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_command_fails_that_agent_only() {
    let fixture = LiveFixture::new();
    let mut missing = fake(&[], SteerMode::None);
    missing.command = vec!["/nonexistent/agent-binary".into()];
    let error = fixture
        .host
        .start(fixture.spec("missing", missing))
        .await
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        format!(
            "failed to start agent {}: cannot run `/nonexistent/agent-binary`: no such file",
            fixture.agent_id("missing")
        )
    );
    let mut not_on_path = fake(&[], SteerMode::None);
    not_on_path.command = vec!["crew-no-such-agent".into()];
    let error = fixture
        .host
        .start(fixture.spec("not-on-path", not_on_path))
        .await
        .unwrap_err();
    assert!(
        error.to_string().ends_with(
            "cannot run `crew-no-such-agent`: it is not on the agent's PATH (agents see the PATH crew was started with)"
        ),
        "{error}"
    );
    let not_executable = fixture.env.root().join("not-executable");
    std::fs::write(&not_executable, "#!/bin/sh\n").unwrap();
    let mut denied = fake(&[], SteerMode::None);
    denied.command = vec![not_executable.to_string()];
    let error = fixture
        .host
        .start(fixture.spec("denied", denied))
        .await
        .unwrap_err();
    assert!(error.to_string().contains("permission denied"), "{error}");

    let fine = fixture
        .host
        .start(fixture.spec("fine", fake(&["exit", "0"], SteerMode::None)))
        .await
        .unwrap();
    assert_eq!(fine.wait_exited().await.exit.unwrap().code, Some(0));
    assert_eq!(fixture.host.registry().list(&fixture.workspace).len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn agents_see_only_their_allow_listed_environment() {
    let fixture = LiveFixture::new();
    let host = AgentHost::with_env(crew_live::agent::env::BaseEnv::from_vars(
        [
            ("PATH", std::env::var("PATH").unwrap().as_str()),
            ("HOME", "/home/someone"),
            ("GIT_DIR", "/somewhere/.git"),
            ("GIT_WORK_TREE", "/somewhere"),
            ("GIT_INDEX_FILE", "/somewhere/index"),
            ("AWS_SECRET_ACCESS_KEY", "leak"),
            ("OPENAI_API_KEY", "allowed"),
        ]
        .map(|(name, value)| (name.into(), value.into())),
    ))
    .unwrap();
    let mut definition = fake(&["env"], SteerMode::None);
    definition.pass_env = vec!["OPENAI_API_KEY".into()];
    definition.env.insert("AGENT_MODE".into(), "test".into());
    let spec = fixture.spec("env", definition);
    let log = spec.output_log.clone();
    host.start(spec).await.unwrap().wait_exited().await;
    let output = std::fs::read_to_string(log).unwrap();
    let names: Vec<&str> = output
        .lines()
        .map(|line| line.split('=').next().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "AGENT_MODE",
            "CREW_AGENT_ID",
            "CREW_PROJECT_ROOT",
            "CREW_RUN_ID",
            // Confined: what it starts knows.
            "CREW_SANDBOX",
            "CREW_TASK_ID",
            "CREW_WORKSPACE",
            // crew's own git settings for agents (no automatic maintenance).
            "GIT_CONFIG_COUNT",
            "GIT_CONFIG_KEY_0",
            "GIT_CONFIG_KEY_1",
            "GIT_CONFIG_VALUE_0",
            "GIT_CONFIG_VALUE_1",
            "HOME",
            "OPENAI_API_KEY",
            "PATH",
            "TMPDIR",
            // Its own, its private temp dir: the user's is out of its reach.
            "XDG_RUNTIME_DIR"
        ]
    );
    assert!(output.contains(&format!("CREW_AGENT_ID={}", fixture.agent_id("env"))));
}

/// An agent inherits nothing of its host but its stdio: not a descriptor a careless embedding
/// program left open across exec, not the pipe on which its warden reports to the host.
#[tokio::test(flavor = "multi_thread")]
#[allow(unsafe_code)]
async fn an_agent_inherits_no_descriptor_but_its_stdio() {
    use std::os::fd::AsRawFd;

    let fixture = LiveFixture::new();
    let secret = fixture.env.root().join("host-secret");
    std::fs::write(&secret, "the host's own file").unwrap();
    let open = std::fs::File::open(&secret).unwrap();
    // SAFETY: clears close-on-exec on a descriptor this test owns.
    assert_eq!(
        unsafe { libc::fcntl(open.as_raw_fd(), libc::F_SETFD, 0) },
        0
    );
    let mut spec = fixture.spec("fds", AgentDef::builtin_shell());
    // Nothing around the listing: in a pipeline the shell holds the pipe's end (fd 3) for a
    // moment after starting `ls`, and with a redirection it saves its stdout (fd 10), which a
    // busy machine lets `ls` see.
    spec.prompt = "ls /proc/$$/fd; readlink /proc/$$/fd/* | grep -c host-secret".into();
    let log = spec.output_log.clone();
    let handle = fixture.host.start(spec).await.unwrap();
    handle.wait_exited().await;
    assert_eq!(std::fs::read_to_string(log).unwrap(), "0\n1\n2\n0\n");
    drop(open);
}

/// The agent's environment reaches the agent only. Its warden, which no sandbox confines,
/// starts with an empty one: a loader variable such as `LD_LIBRARY_PATH=.` would otherwise
/// load into it a library the agent planted in its workspace.
#[tokio::test(flavor = "multi_thread")]
async fn the_agents_environment_never_reaches_its_unconfined_warden() {
    let fixture = LiveFixture::new();
    let mut definition = AgentDef::builtin_shell();
    definition.env.insert("LD_LIBRARY_PATH".into(), ".".into());
    let mut spec = fixture.spec("loader", definition);
    spec.prompt = "echo \"library path $LD_LIBRARY_PATH\"; exec sleep 30".into();
    let mut events = fixture.host.subscribe();
    let handle = fixture.host.start(spec).await.unwrap();
    wait_for_line(&mut events, handle.agent_id(), "library path .").await;
    let warden = handle.snapshot().pid.unwrap();
    assert_eq!(
        crew_live::procscan::parent_and_name(warden).map(|(_, name)| name),
        Some("crew-warden".to_owned())
    );
    assert_eq!(
        std::fs::read(format!("/proc/{warden}/environ")).unwrap(),
        b""
    );
    fixture
        .host
        .registry()
        .stop(&fixture.workspace, "loader")
        .await
        .unwrap();
    handle.wait_exited().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn prompt_is_one_argument_and_the_agent_runs_in_its_directory() {
    let fixture = LiveFixture::new();
    let mut definition = AgentDef::builtin_shell();
    definition.command = vec![
        "sh".into(),
        "-c".into(),
        "{prompt}".into(),
        "crew-agent".into(),
        "{task_id}".into(),
    ];
    let mut spec = fixture.spec("shell", definition);
    spec.prompt = "printf '%s|' \"$0\" \"$1\"; pwd".into();
    let log = spec.output_log.clone();
    fixture.host.start(spec).await.unwrap().wait_exited().await;
    assert_eq!(
        std::fs::read_to_string(log).unwrap(),
        format!("crew-agent|shell|{}\n", fixture.workspace)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn steer_writes_lines_json_or_is_refused() {
    let fixture = LiveFixture::new();
    let mut events = fixture.host.subscribe();
    let registry = fixture.host.registry();

    let lines = fixture
        .host
        .start(fixture.spec("lines", fake(&["echo-stdin"], SteerMode::StdinLines)))
        .await
        .unwrap();
    wait_for_line(&mut events, lines.agent_id(), "ready").await;
    registry
        .steer(&fixture.workspace, "lines", "turn left")
        .await
        .unwrap();
    wait_for_line(&mut events, lines.agent_id(), "got: turn left").await;

    let json = fixture
        .host
        .start(fixture.spec("json", fake(&["json-turns"], SteerMode::StdinJson)))
        .await
        .unwrap();
    wait_for_line(&mut events, json.agent_id(), "ready").await;
    registry
        .steer(&fixture.workspace, "json", "hi \"there\"")
        .await
        .unwrap();
    wait_for_line(
        &mut events,
        json.agent_id(),
        r#"echo: {"type":"user","message":{"role":"user","content":"hi \"there\""}}"#,
    )
    .await;

    let deaf = fixture
        .host
        .start(fixture.spec("deaf", fake(&["sleep", "30"], SteerMode::None)))
        .await
        .unwrap();
    let error = registry
        .steer(&fixture.workspace, "deaf", "hello?")
        .await
        .unwrap_err();
    assert!(
        matches!(error, AgentOpError::SteerUnsupported { .. }),
        "{error}"
    );
    for handle in [lines, json, deaf] {
        handle.stop().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn follow_ups_wait_for_the_turn_or_resume_an_exited_agent() {
    let fixture = LiveFixture::new();
    let mut events = fixture.host.subscribe();
    let registry = fixture.host.registry();

    // stdin-json: delivered when the agent prints its end-of-turn line.
    let json = fixture
        .host
        .start(fixture.spec("json", fake(&["json-turns"], SteerMode::StdinJson)))
        .await
        .unwrap();
    wait_for_line(&mut events, json.agent_id(), "ready").await;
    let (_, outcome) = registry
        .follow_up(&fixture.workspace, "json", "second")
        .await
        .unwrap();
    assert_eq!(outcome, FollowUpOutcome::Queued { position: 1 });
    registry
        .steer(&fixture.workspace, "json", "first")
        .await
        .unwrap();
    wait_for_line(
        &mut events,
        json.agent_id(),
        r#"echo: {"type":"user","message":{"role":"user","content":"first"}}"#,
    )
    .await;
    wait_for_line(
        &mut events,
        json.agent_id(),
        r#"echo: {"type":"user","message":{"role":"user","content":"second"}}"#,
    )
    .await;
    json.stop().await.unwrap();

    // An exited agent is resumed with the message, through its resume template.
    let mut definition = fake(&["print", "first run"], SteerMode::None);
    definition.resume = Some(vec![
        FAKE_AGENT.into(),
        "print".into(),
        "resumed with".into(),
        "{message}".into(),
    ]);
    let agent = fixture
        .host
        .start(fixture.spec("resumable", definition))
        .await
        .unwrap();
    agent.wait_exited().await;
    let (_, outcome) = registry
        .follow_up(&fixture.workspace, "resumable", "the answer")
        .await
        .unwrap();
    assert!(matches!(outcome, FollowUpOutcome::Resumed { .. }));
    wait_for_line(&mut events, agent.agent_id(), "resumed with the answer").await;
    let status = agent.wait_exited().await;
    assert_eq!(status.attempt, 2);

    // Resume without a message; resuming a running agent is refused.
    let sleeper = fixture
        .host
        .start(fixture.spec("sleeper", fake(&["sleep", "30"], SteerMode::None)))
        .await
        .unwrap();
    assert!(matches!(
        registry.resume(&fixture.workspace, "sleeper", None).await,
        Err(AgentOpError::AlreadyRunning { .. })
    ));
    sleeper.stop().await.unwrap();
    let (_, pid) = registry
        .resume(&fixture.workspace, "sleeper", None)
        .await
        .unwrap();
    assert!(pid > 0);
    assert_eq!(sleeper.status().state, AgentState::Running);
    assert_eq!(sleeper.stop().await.unwrap(), StopOutcome::Terminated);
}

#[tokio::test(flavor = "multi_thread")]
async fn timeout_stops_the_agent_and_says_so() {
    let fixture = LiveFixture::new();
    let mut spec = fixture.spec("slow", fake(&["sleep", "60"], SteerMode::None));
    spec.timeout = Some(Duration::from_millis(300));
    let handle = fixture.host.start(spec).await.unwrap();
    let exit = handle.wait_exited().await.exit.unwrap();
    assert!(exit.timed_out);
    assert_eq!(exit.stopped_by, Some(StopSignal::Term));
}

#[tokio::test(flavor = "multi_thread")]
async fn gigabyte_without_newline_keeps_memory_bounded_and_never_blocks_the_agent() {
    let fixture = LiveFixture::new();
    let rss_before = rss_kib();
    let size: usize = 1 << 30;
    let spec = fixture.spec(
        "flood",
        fake(&["flood", &size.to_string()], SteerMode::None),
    );
    let log = spec.output_log.clone();
    let handle = fixture.host.start(spec).await.unwrap();
    let status = tokio::time::timeout(Duration::from_secs(120), handle.wait_exited())
        .await
        .expect("the agent was never blocked");
    assert_eq!(status.exit.unwrap().code, Some(0));
    let rss_after = rss_kib();
    assert!(
        rss_after < rss_before + 64 * 1024,
        "host RSS grew from {rss_before} KiB to {rss_after} KiB"
    );
    // The log kept the newest output within its limit (64 MiB here): the gigabyte's tail and
    // its end, with the part before in output.log.1 and a line saying where it went.
    let limit = 64u64 << 20;
    let rotated = camino::Utf8PathBuf::from(format!("{log}.1"));
    let (current, before) = (
        std::fs::read(&log).unwrap(),
        std::fs::metadata(&rotated).unwrap().len(),
    );
    assert!(
        current.len() as u64 <= limit && before <= limit,
        "{} and {before}",
        current.len()
    );
    assert!(current.starts_with(b"[crew: the log reached its limit of 64MiB;"));
    assert!(current.ends_with(b"\xff\xfe\xfd not utf-8"));
    std::fs::remove_file(&log).unwrap();
    std::fs::remove_file(&rotated).unwrap();
    let lines = handle.snapshot().last_lines;
    assert_eq!(lines.len(), 1);
    assert!(lines[0].len() <= crew_live::agent::output::MAX_LINE_BYTES + 3);
    assert!(lines[0].ends_with('…'));
}
