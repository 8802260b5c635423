//! Live agents as real processes: supervision, the signal ladder, output, steering and the
//! workspace-scoped registry.

use std::time::{Duration, Instant};

use crew_core::config::{AgentDef, SteerMode};
use crew_core::model::StopSignal;
use crew_core::{AgentId, RunId, TaskId, WorkspaceId};
use crew_live::procscan::session_of;
use crew_live::{AgentHost, AgentOpError, AgentState, FollowUpOutcome, StopOutcome};
use crew_tests::TestEnv;

use crate::common::live::{
    FAKE_AGENT, LiveFixture, assert_no_marked_processes, fake, live_helper_json, marked_processes,
    wait_for_line, wait_for_lines,
};

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

/// The pids of processes whose command line is exactly `argv`.
fn processes_running(argv: &[&str]) -> Vec<u32> {
    let wanted: Vec<u8> = argv
        .iter()
        .flat_map(|arg| [arg.as_bytes(), b"\0"].concat())
        .collect();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|line| line == wanted)
        })
        .collect()
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

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

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

/// Children of `parent` whose state letter is `state`.
fn children_in_state(parent: u32, state: char) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                return false;
            };
            let Some(close) = stat.rfind(')') else {
                return false;
            };
            let mut fields = stat[close + 1..].split_whitespace();
            let this_state = fields.next().and_then(|field| field.chars().next());
            let ppid = fields.next().and_then(|field| field.parse::<u32>().ok());
            this_state == Some(state) && ppid == Some(parent)
        })
        .collect()
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

/// Children of `parent` named `name` (their `comm`), alive (not zombies).
fn children_named(parent: u32, name: &str) -> Vec<u32> {
    let running = ['R', 'S', 'D', 'T', 't'];
    running
        .iter()
        .flat_map(|state| children_in_state(parent, *state))
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|comm| comm.trim_end() == name)
        })
        .collect()
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
