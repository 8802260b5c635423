//! Helpers for the live-agent tests that need a process of their own.
//!
//! live-helper host <workspace> <run-id> <count> <fake-agent>
//!     hosts <count> agents running `fake-agent fork-sleepers`, prints `started` once all are
//!     ready, then waits to be killed
//! live-helper many <dir> <count> <grace-seconds>
//!     hosts <count> `sleep 600` agents, measures its own idle CPU share over 5 s and its RSS,
//!     stops them all and prints `{"idle_cpu_share", "rss_kib", "stop_seconds"}`
//! live-helper start <dir> <count> <on|whole|off|single|none|proxy|capped> [gap ms]
//!     starts <count> `sleep 600` agents one after another, sandboxed or not (`whole`: sandboxed
//!     with every directory read whole, none seen in part; `none`, `proxy`:
//!     sandboxed with that network; `capped`: sandboxed under caps, a cgroup each), prints
//!     `{"start_seconds", "hwm_kib"}` (this process's peak RSS; from the first start to the last agent's process running; with a
//!     gap, each start that long after the last and only the starts timed), then stops them
//!     all
//! live-helper umask-socket <dir>
//!     sets the process umask to 000, serves a control socket for <dir> and prints
//!     `{"socket", "socket_mode", "dir_mode"}` (the umask is process-wide: a test thread must
//!     never change it for the others)
//! live-helper dropped-cancel <dir>
//!     runs a one-task run (`sleep 1`, single mode) in the repository <dir> with the cancel
//!     sender and the command sender dropped, as an embedder might, and prints
//!     `{"status", "cpu_seconds"}`: this process's CPU time during the run
//! live-helper download <dir> <agents> <megabytes|stream> <proxy|connect|endpoint|direct>
//!     serves <megabytes> MB on 127.0.0.1, starts <agents> sandboxed agents at once that each
//!     download it with curl (through crew's proxy, or with the network open), and prints
//!     `{"seconds", "hwm_kib"}`: the slowest download's own time and this process's peak RSS
//! live-helper server-killed <workspace>
//!     starts a sandboxed agent (`sh -c 'exit 3'`) and waits for its end, then twenty times
//!     kills its own warden servers (its children named `crew-wardens`) and starts another the
//!     same way; prints `{"killed", "first", "after"}`: how many servers it killed, and each
//!     agent's exit code (or the start's error)
//! live-helper raw <socket> <line>
//!     sends one raw line to a control socket and prints the answer line (or the error)

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::io::{BufRead, BufReader, Write};
use std::time::Duration;

use crew_core::config::AgentDef;
use crew_core::{AgentId, RunId, TaskId, WorkspaceId};
use crew_live::{AgentEvent, AgentHost, AgentSpec};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args[0].as_str() {
        "host" => host(&args[1..]),
        "raw" => raw(&args[1], &args[2]),
        "many" => many(&args[1..]),
        "start" => start(&args[1..]),
        "download" => download(&args[1..]),
        "umask-socket" => umask_socket(&args[1]),
        "dropped-cancel" => dropped_cancel(&args[1]),
        "server-killed" => server_killed(&args[1]),
        other => panic!("unknown command {other}"),
    }
}

fn host(args: &[String]) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let workspace = WorkspaceId::from_path(std::path::Path::new(&args[0])).unwrap();
        let run_id = RunId::parse(&args[1]).unwrap();
        let count: usize = args[2].parse().unwrap();
        let host = AgentHost::new().unwrap();
        let mut events = host.subscribe();
        let mut definition = AgentDef::builtin_shell();
        definition.command = vec![args[3].clone(), "fork-sleepers".into()];
        for index in 0..count {
            host.start(confined_spec(
                &workspace,
                AgentId::new(
                    run_id.clone(),
                    TaskId::parse(&format!("agent-{index}")).unwrap(),
                ),
                &definition,
                workspace.as_path().join(format!("agent-{index}.log")),
            ))
            .await
            .unwrap();
        }
        let mut ready = 0;
        while ready < count {
            if let Ok(AgentEvent::Output { line, .. }) = events.recv().await
                && line == "ready"
            {
                ready += 1;
            }
        }
        // Let the double-forked grandchildren settle before announcing.
        tokio::time::sleep(Duration::from_millis(200)).await;
        println!("started");
        std::io::stdout().flush().unwrap();
        tokio::time::sleep(Duration::from_secs(600)).await;
    });
}

/// A spec of an agent of `definition` in `workspace`, confined to it, logging to `log`.
fn confined_spec(
    workspace: &WorkspaceId,
    agent_id: AgentId,
    definition: &AgentDef,
    log: camino::Utf8PathBuf,
) -> AgentSpec {
    AgentSpec {
        agent_id,
        workspace: workspace.clone(),
        dir: workspace.as_path().to_owned(),
        definition: definition.clone(),
        prompt: String::new(),
        timeout: None,
        stop_grace: Duration::from_secs(10),
        unreachable_timeout: None,
        output_log: log,
        output_log_limit: 64 << 20,
        socket: None,
        sandbox: crew_live::SandboxPlan::confined_to(workspace.as_path()),
        workspace_env: Vec::new(),
        git_config: Vec::new(),
        session_id: None,
        session_cost: None,
        placed: None,
        follow_ups: Vec::new(),
        network_log: None,
        spend: None,
        parent: None,
    }
}

fn server_killed(workspace: &str) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let workspace = WorkspaceId::from_path(std::path::Path::new(workspace)).unwrap();
        let host = AgentHost::new().unwrap();
        let run_id = RunId::generate();
        let mut definition = AgentDef::builtin_shell();
        definition.command = vec!["sh".into(), "-c".into(), "exit 3".into()];
        let run = |name: &str| {
            let spec = confined_spec(
                &workspace,
                AgentId::new(run_id.clone(), TaskId::parse(name).unwrap()),
                &definition,
                workspace.as_path().join(format!("{name}.log")),
            );
            let host = &host;
            async move {
                match host.start(spec).await {
                    Ok(handle) => serde_json::json!(handle.wait_exited().await.exit.unwrap().code),
                    Err(error) => serde_json::json!(error.to_string()),
                }
            }
        };
        let first = run("first").await;
        let own = std::process::id().to_string();
        // Killed and asked again at once, twenty times: a request can reach a server the
        // kernel has not yet finished killing.
        let mut killed = 0;
        let mut after = Vec::new();
        for round in 0..20 {
            for entry in std::fs::read_dir("/proc").unwrap().flatten() {
                let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
                    continue;
                };
                let ppid = stat
                    .rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1));
                if stat.contains("(crew-wardens)") && ppid == Some(own.as_str()) {
                    let pid: i32 = entry.file_name().to_str().unwrap().parse().unwrap();
                    rustix::process::kill_process(
                        rustix::process::Pid::from_raw(pid).unwrap(),
                        rustix::process::Signal::KILL,
                    )
                    .unwrap();
                    killed += 1;
                }
            }
            after.push(run(&format!("after-{round}")).await);
        }
        println!(
            "{}",
            serde_json::json!({ "killed": killed, "first": first, "after": after })
        );
    });
}

fn raw(socket: &str, line: &str) {
    match std::os::unix::net::UnixStream::connect(socket) {
        Ok(mut stream) => {
            // A server that refuses answers and closes without reading: the write may fail.
            let _ = stream.write_all(format!("{line}\n").as_bytes());
            let mut answer = String::new();
            let _ = BufReader::new(stream).read_line(&mut answer);
            print!("{answer}");
        }
        Err(error) => println!("connect error: {}", error.kind()),
    }
}

fn many(args: &[String]) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let workspace = WorkspaceId::from_path(std::path::Path::new(&args[0])).unwrap();
        let count: usize = args[1].parse().unwrap();
        let grace = Duration::from_secs(args[2].parse().unwrap());
        let logs = tempfile::tempdir().unwrap();
        let host = AgentHost::new().unwrap();
        let run_id = RunId::generate();
        let mut definition = AgentDef::builtin_shell();
        definition.command = vec!["sleep".into(), "600".into()];
        for index in 0..count {
            host.start(AgentSpec {
                stop_grace: grace,
                ..confined_spec(
                    &workspace,
                    AgentId::new(run_id.clone(), TaskId::parse(&format!("a{index}")).unwrap()),
                    &definition,
                    camino::Utf8PathBuf::from_path_buf(logs.path().join(format!("a{index}.log")))
                        .unwrap(),
                )
            })
            .await
            .unwrap();
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let cpu_before = cpu_time();
        let wall = std::time::Instant::now();
        tokio::time::sleep(Duration::from_secs(5)).await;
        let idle_cpu_share = (cpu_time() - cpu_before) / wall.elapsed().as_secs_f64();
        let rss_kib = std::fs::read_to_string("/proc/self/status")
            .unwrap()
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|value| value.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap();
        let started = std::time::Instant::now();
        let outcomes = host.stop_all().await;
        let stop_seconds = started.elapsed().as_secs_f64();
        assert_eq!(outcomes.len(), count);
        println!(
            "{}",
            serde_json::json!({ "idle_cpu_share": idle_cpu_share, "rss_kib": rss_kib, "stop_seconds": stop_seconds })
        );
    });
}

fn dropped_cancel(dir: &str) {
    use crew_core::config::{TaskDef, TeamDef};
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let workspace = crew_core::Workspace::at_root(std::path::Path::new(dir)).unwrap();
        let config = crew_core::ProjectConfig::default();
        let provider = std::sync::Arc::new(crew_worktree::CrewWorkspaces::new(&config));
        let runner = crew_live::Runner::new(AgentHost::new().unwrap(), provider, workspace, config);
        let team = crew_core::Team {
            def: TeamDef::new(
                "sleepy",
                vec![TaskDef::new(
                    TaskId::parse("sleepy").unwrap(),
                    "shell",
                    "sleep 1",
                )],
            ),
            agents: [("shell".to_owned(), AgentDef::builtin_shell())].into(),
        };
        let spec = crew_live::RunSpec::of(team);
        let manifest = runner.create(&spec, None).await.unwrap();
        let cancel = tokio::sync::watch::channel(crew_live::CancelLevel::None).1;
        let commands = tokio::sync::mpsc::channel(1).1;
        let cpu_before = cpu_time();
        let finished = runner
            .execute(&manifest.run_id, None, cancel, commands, Default::default())
            .await
            .unwrap();
        println!(
            "{}",
            serde_json::json!({
                "status": finished.status,
                "cpu_seconds": cpu_time() - cpu_before,
            })
        );
    });
}

fn umask_socket(dir: &str) {
    use std::os::unix::fs::PermissionsExt;
    rustix::process::umask(rustix::fs::Mode::empty());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let workspace = WorkspaceId::from_path(std::path::Path::new(dir)).unwrap();
        let host = AgentHost::new().unwrap();
        let server = crew_live::ControlServer::bind(host, &workspace)
            .await
            .unwrap();
        let mode =
            |path: &camino::Utf8Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
        let mut client = crew_live::ControlClient::connect(server.path())
            .await
            .unwrap();
        let answer = client
            .call(
                &workspace,
                crew_live::control::Op::Ping,
                Duration::from_secs(10),
            )
            .await
            .unwrap();
        println!(
            "{}",
            serde_json::json!({
                "socket": server.path(),
                "socket_mode": mode(server.path()),
                "dir_mode": mode(server.path().parent().unwrap()),
                "ping_ok": answer.answer.is_ok(),
            })
        );
    });
}

fn start(args: &[String]) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let workspace = WorkspaceId::from_path(std::path::Path::new(&args[0])).unwrap();
        let count: usize = args[1].parse().unwrap();
        let mode = match args[2].as_str() {
            "on" | "whole" | "single" | "none" | "proxy" | "capped" => {
                crew_core::config::SandboxMode::Enforce
            }
            _ => crew_core::config::SandboxMode::Off,
        };
        let network = match args[2].as_str() {
            "none" => crew_core::config::NetworkMode::None,
            "proxy" => crew_core::config::NetworkMode::Proxy,
            _ => crew_core::config::NetworkMode::Open,
        };
        // `single`: also what a single-mode task keeps read-only, as its provider names it, and
        // its private view of the git directory (one each).
        let single = args[2] == "single";
        let read_only: Vec<camino::Utf8PathBuf> = if single {
            [".git/config", ".git/hooks", ".crew", ".worktrees"]
                .iter()
                .map(|path| workspace.as_path().join(path))
                .filter(|path| path.exists())
                .collect()
        } else {
            Vec::new()
        };
        let logs = tempfile::tempdir().unwrap();
        let host = AgentHost::new().unwrap();
        let run_id = RunId::generate();
        let mut definition = AgentDef::builtin_shell();
        definition.command = vec!["sleep".into(), "600".into()];
        // With a gap (milliseconds, a fourth argument), each start comes that long after the
        // last, and only the starts are timed.
        let gap = args
            .get(3)
            .map(|gap| Duration::from_millis(gap.parse().unwrap()));
        let mut in_starts = Duration::ZERO;
        let started = std::time::Instant::now();
        for index in 0..count {
            if let Some(gap) = gap {
                tokio::time::sleep(gap).await;
            }
            let this_start = std::time::Instant::now();
            let handle = host
                .start(AgentSpec {
                    agent_id: AgentId::new(
                        run_id.clone(),
                        TaskId::parse(&format!("a{index}")).unwrap(),
                    ),
                    workspace: workspace.clone(),
                    dir: workspace.as_path().to_owned(),
                    definition: definition.clone(),
                    prompt: String::new(),
                    timeout: None,
                    stop_grace: Duration::from_secs(2),
                    unreachable_timeout: None,
                    output_log: camino::Utf8PathBuf::from_path_buf(
                        logs.path().join(format!("a{index}.log")),
                    )
                    .unwrap(),
                    output_log_limit: 64 << 20,
                    socket: None,
                    sandbox: crew_live::SandboxPlan {
                        mode,
                        write: vec![workspace.as_path().to_owned()],
                        read_only: read_only.clone(),
                        private: if single {
                            let view = camino::Utf8PathBuf::from_path_buf(
                                logs.path().join(format!("a{index}-git")),
                            )
                            .unwrap();
                            std::fs::create_dir_all(view.join("upper")).unwrap();
                            std::fs::create_dir_all(view.join("work")).unwrap();
                            let git = workspace.as_path().join(".git");
                            vec![crew_core::provider::PrivateView {
                                upper: view.join("upper"),
                                work: view.join("work"),
                                read_only_without: vec![git.join("packed-refs"), git.join("info")],
                                target: git,
                            }]
                        } else {
                            Vec::new()
                        },
                        network,
                        hosts: Vec::new(),
                        read: Vec::new(),
                        reads_in_part: args[2] != "whole",
                        network_named: true,
                        allow_open_network: false,
                        locks: Vec::new(),
                        workspace: None,
                        caps: if args[2] == "capped" {
                            crew_core::config::Resources {
                                memory: Some(crew_core::config::ByteSize(1 << 30)),
                                cpus: Some(crew_core::config::Cpus::parse(1.0).unwrap()),
                                processes: Some(256),
                            }
                        } else {
                            crew_core::config::Resources::default()
                        },
                        allow_uncapped: false,
                    },
                    workspace_env: Vec::new(),
                    git_config: Vec::new(),
                    session_id: None,
                    session_cost: None,
                    placed: None,
                    follow_ups: Vec::new(),
                    network_log: None,
                    spend: None,
                    parent: None,
                })
                .await
                .unwrap();
            in_starts += this_start.elapsed();
            let expected = if mode == crew_core::config::SandboxMode::Enforce {
                crew_core::SandboxState::Enforced
            } else {
                crew_core::SandboxState::Off
            };
            assert_eq!(
                handle.status().sandbox.map(|record| record.state),
                Some(expected)
            );
        }
        let start_seconds = match gap {
            Some(_) => in_starts.as_secs_f64(),
            None => started.elapsed().as_secs_f64(),
        };
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let hwm_kib: u64 = status
            .lines()
            .find_map(|line| line.strip_prefix("VmHWM:"))
            .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap();
        host.stop_all().await;
        println!(
            "{}",
            serde_json::json!({ "start_seconds": start_seconds, "hwm_kib": hwm_kib })
        );
    });
}

fn download(args: &[String]) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let workspace = WorkspaceId::from_path(std::path::Path::new(&args[0])).unwrap();
        let agents: usize = args[1].parse().unwrap();
        // `stream`: a model's streamed answer, 2,000 events of 100 bytes written one by one.
        let streamed = args[2] == "stream";
        let bytes: usize = if streamed {
            200_000
        } else {
            args[2].parse::<usize>().unwrap() * 1_000_000
        };
        let piece = if streamed { 100 } else { 1 << 16 };
        // `proxy` (curl's plain request through it), `connect` (curl tunnels through it),
        // `endpoint` (a credential's endpoint, the key added there), `direct` (network open).
        let mode = args[3].clone();
        let proxied = mode != "direct";
        let server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = server.local_addr().unwrap().port();
        std::thread::spawn(move || {
            let chunk = vec![b'x'; piece];
            for stream in server.incoming() {
                let Ok(mut stream) = stream else { continue };
                let chunk = chunk.clone();
                std::thread::spawn(move || {
                    let mut head = [0u8; 4096];
                    let _ = std::io::Read::read(&mut stream, &mut head);
                    let _ = write!(
                        stream,
                        "HTTP/1.1 200 OK\r\nContent-Length: {bytes}\r\nConnection: close\r\n\r\n"
                    );
                    let mut left = bytes;
                    while left > 0 {
                        let part = left.min(chunk.len());
                        if stream.write_all(&chunk[..part]).is_err() {
                            return;
                        }
                        left -= part;
                    }
                });
            }
        });
        let logs = tempfile::tempdir().unwrap();
        const KEY: &str = "sk-the-benchmark-key";
        let host = AgentHost::with_env(crew_live::agent::env::BaseEnv::from_vars(
            std::env::vars_os().chain([("MODEL_KEY".into(), KEY.into())]),
        ))
        .unwrap();
        let run_id = RunId::generate();
        let mut handles = Vec::new();
        for index in 0..agents {
            let took = logs.path().join(format!("took-{index}"));
            let mut definition = AgentDef::builtin_shell();
            let request = match mode.as_str() {
                "connect" => format!("-p http://127.0.0.1:{port}/v1/messages"),
                "endpoint" => {
                    "-H \"x-api-key: $MODEL_KEY\" \"$MODEL_BASE_URL/v1/messages\"".to_owned()
                }
                _ => format!("http://127.0.0.1:{port}/v1/messages"),
            };
            definition.command = vec![
                "sh".into(),
                "-c".into(),
                format!(
                    "curl -s -o /dev/null -w '%{{time_total}}' {request} > {}",
                    took.display()
                ),
            ];
            if mode == "endpoint" {
                definition.sandbox.credentials = vec![crew_core::config::credentials::Credential {
                    name: "model".into(),
                    upstream: format!("http://127.0.0.1:{port}"),
                    base_url_env: Some("MODEL_BASE_URL".into()),
                    base_url_args: Vec::new(),
                    keys: vec![crew_core::config::credentials::CredentialKey::Variable(
                        "MODEL_KEY".into(),
                    )],
                }];
            }
            let handle = host
                .start(AgentSpec {
                    agent_id: AgentId::new(
                        run_id.clone(),
                        TaskId::parse(&format!("a{index}")).unwrap(),
                    ),
                    workspace: workspace.clone(),
                    dir: workspace.as_path().to_owned(),
                    definition,
                    prompt: String::new(),
                    timeout: None,
                    stop_grace: Duration::from_secs(2),
                    unreachable_timeout: None,
                    output_log: camino::Utf8PathBuf::from_path_buf(
                        logs.path().join(format!("a{index}.log")),
                    )
                    .unwrap(),
                    output_log_limit: 64 << 20,
                    socket: None,
                    sandbox: crew_live::SandboxPlan {
                        mode: crew_core::config::SandboxMode::Enforce,
                        write: vec![
                            workspace.as_path().to_owned(),
                            camino::Utf8PathBuf::from_path_buf(logs.path().to_owned()).unwrap(),
                        ],
                        read_only: Vec::new(),
                        private: Vec::new(),
                        network: if proxied {
                            crew_core::config::NetworkMode::Proxy
                        } else {
                            crew_core::config::NetworkMode::Open
                        },
                        hosts: vec![crew_core::config::HostList {
                            file: "the benchmark".into(),
                            hosts: vec![
                                crew_core::config::HostPattern::parse(&format!("127.0.0.1:{port}"))
                                    .unwrap(),
                            ],
                        }],
                        read: Vec::new(),
                        reads_in_part: true,
                        network_named: true,
                        allow_open_network: false,
                        locks: Vec::new(),
                        workspace: None,
                        caps: crew_core::config::Resources::default(),
                        allow_uncapped: false,
                    },
                    workspace_env: Vec::new(),
                    git_config: Vec::new(),
                    session_id: None,
                    session_cost: None,
                    placed: None,
                    follow_ups: Vec::new(),
                    network_log: None,
                    spend: None,
                    parent: None,
                })
                .await
                .unwrap();
            handles.push((handle, took));
        }
        let mut slowest: f64 = 0.0;
        for (handle, took) in handles {
            let status = handle.wait_exited().await;
            assert_eq!(status.exit.map(|exit| exit.code), Some(Some(0)));
            let seconds: f64 = std::fs::read_to_string(&took)
                .unwrap()
                .trim()
                .parse()
                .unwrap();
            slowest = slowest.max(seconds);
        }
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let hwm_kib: u64 = status
            .lines()
            .find_map(|line| line.strip_prefix("VmHWM:"))
            .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap();
        println!(
            "{}",
            serde_json::json!({ "seconds": slowest, "hwm_kib": hwm_kib })
        );
    });
}

/// User plus system CPU seconds of this process.
fn cpu_time() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..]
        .split_whitespace()
        .collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    ticks as f64 / rustix::param::clock_ticks_per_second() as f64
}
