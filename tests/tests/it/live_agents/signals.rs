//! Stops, signals and exits of live agents.

use super::*;

#[tokio::test(flavor = "multi_thread")]
async fn stop_kills_whole_process_group_and_escaped_grandchildren() {
    let fixture = LiveFixture::new();
    let mut events = fixture.host.subscribe();
    let handle = fixture
        .host
        .start(fixture.spec("forker", fake(&["fork-sleepers"], SteerMode::None)))
        .await
        .unwrap();
    wait_for_line(&mut events, handle.agent_id(), "ready").await;
    let marker = format!("CREW_AGENT_ID={}", handle.agent_id());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        marked_processes(&marker).len() >= 4,
        "agent, two sleepers and the escaped grandchild"
    );

    let (_, outcome) = fixture
        .host
        .registry()
        .stop(&fixture.workspace, "forker")
        .await
        .unwrap();
    assert_eq!(outcome, StopOutcome::Terminated);
    let status = handle.wait_exited().await;
    let exit = status.exit.unwrap();
    assert_eq!(exit.signal, Some(libc::SIGTERM));
    assert_eq!(exit.stopped_by, Some(StopSignal::Term));
    assert!(
        exit.leaked_processes >= 1,
        "the escaped sleeper outlived the agent and was killed"
    );
    assert_no_marked_processes(&marker, Duration::from_secs(3)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn no_process_outlives_an_agent_that_exits_on_its_own() {
    let fixture = LiveFixture::new();
    let mut definition = AgentDef::builtin_shell();
    // Hostile: daemons that leave the group and the session, one with its environment (and so
    // crew's marker) wiped, then a clean exit.
    let sleep = format!("{}", 6000 + std::process::id() % 1000);
    definition.command = vec![
        "sh".into(),
        "-c".into(),
        format!(
            "(setsid env -i sleep {sleep} </dev/null >/dev/null 2>&1 &); \
             (setsid sh -c 'sleep {sleep}' </dev/null >/dev/null 2>&1 &); \
             sleep 0.2; exit 0"
        ),
    ];
    let handle = fixture
        .host
        .start(fixture.spec("daemons", definition))
        .await
        .unwrap();
    let status = handle.wait_exited().await;
    let exit = status.exit.unwrap();
    assert_eq!(exit.code, Some(0));
    assert!(
        exit.leaked_processes >= 2,
        "both daemons are counted: {exit:?}"
    );
    assert!(
        processes_running(&["sleep", &sleep]).is_empty(),
        "a daemon outlived its agent"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_ignoring_term_gets_kill_after_the_grace() {
    let fixture = LiveFixture::new();
    let mut events = fixture.host.subscribe();
    let handle = fixture
        .host
        .start(fixture.spec("stubborn", fake(&["ignore-term", "60"], SteerMode::None)))
        .await
        .unwrap();
    wait_for_line(&mut events, handle.agent_id(), "ready").await;
    let started = Instant::now();
    let outcome = handle.stop().await.unwrap();
    assert_eq!(outcome, StopOutcome::Killed);
    assert!(
        started.elapsed() >= Duration::from_millis(450),
        "KILL waits for the grace"
    );
    let exit = handle.status().exit.unwrap();
    assert_eq!(
        (exit.signal, exit.stopped_by),
        (Some(libc::SIGKILL), Some(StopSignal::Kill))
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_second_stop_kills_at_once() {
    let fixture = LiveFixture::new();
    let mut events = fixture.host.subscribe();
    let mut spec = fixture.spec("stubborn", fake(&["ignore-term", "60"], SteerMode::None));
    spec.stop_grace = Duration::from_secs(60);
    let handle = fixture.host.start(spec).await.unwrap();
    wait_for_line(&mut events, handle.agent_id(), "ready").await;
    let first = tokio::spawn({
        let handle = handle.clone();
        async move { handle.stop().await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    assert_eq!(handle.stop().await.unwrap(), StopOutcome::Killed);
    assert_eq!(first.await.unwrap().unwrap(), StopOutcome::Killed);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "no waiting for the 60 s grace"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_handling_term_exits_cleanly_without_kill() {
    let fixture = LiveFixture::new();
    let mut events = fixture.host.subscribe();
    let done = fixture.workspace.as_path().join("cleaned.txt");
    let handle = fixture
        .host
        .start(fixture.spec(
            "polite",
            fake(&["handle-term", done.as_str()], SteerMode::None),
        ))
        .await
        .unwrap();
    wait_for_line(&mut events, handle.agent_id(), "ready").await;
    assert_eq!(handle.stop().await.unwrap(), StopOutcome::Terminated);
    let exit = handle.status().exit.unwrap();
    assert_eq!((exit.code, exit.signal), (Some(0), None));
    assert_eq!(exit.stopped_by, Some(StopSignal::Term));
    assert_eq!(std::fs::read_to_string(&done).unwrap(), "cleaned up\n");
}

#[tokio::test(flavor = "multi_thread")]
async fn exit_codes_and_output_are_recorded() {
    let fixture = LiveFixture::new();
    let handle = fixture
        .host
        .start(fixture.spec("failing", fake(&["exit", "7"], SteerMode::None)))
        .await
        .unwrap();
    let status = handle.wait_exited().await;
    let exit = status.exit.clone().unwrap();
    assert_eq!(
        (exit.code, exit.signal, exit.leaked_processes),
        (Some(7), None, 0)
    );
    // Whoever looks after the exit still learns which process ran; listings show no pid.
    assert!(status.pid.is_some_and(|pid| pid > 0));
    assert_eq!(status.live_pid(), None);
    assert_eq!(handle.snapshot().pid, None);

    let spec = fixture.spec(
        "printer",
        fake(&["print", "hello", "world"], SteerMode::None),
    );
    let log = spec.output_log.clone();
    let handle = fixture.host.start(spec).await.unwrap();
    handle.wait_exited().await;
    assert_eq!(std::fs::read_to_string(log).unwrap(), "hello world\n");
    assert_eq!(handle.snapshot().last_lines, ["hello world"]);
}
