//! `crew serve --stdio` driven by an Agent Client Protocol client crew did not write: the
//! official TypeScript SDK (`tests/acp-client/drive.mjs`), as an editor would drive it.

use camino::Utf8PathBuf;
use crew_tests::{TestEnv, render_output, write};

#[test]
fn an_acp_client_runs_teams_sees_only_its_folder_and_cancels() {
    let Some(script) = crew_tests::node_client(
        "acp-client",
        "@agentclientprotocol/sdk",
        "an_acp_client_runs_teams_sees_only_its_folder_and_cancels",
    ) else {
        return;
    };
    let env = TestEnv::new();
    let (a, b) = editor_folders(
        &env,
        "editor",
        &[
            (
                "pair",
                "workspace_mode = \"worktree\"\n[[tasks]]\nid = \"left\"\nagent = \"shell\"\nprompt = \"echo hello from left > left.txt && cat left.txt\"\n\n[[tasks]]\nid = \"right\"\nagent = \"shell\"\nprompt = \"echo hello from right > right.txt && cat right.txt\"\n",
            ),
            (
                "ask",
                "[[tasks]]\nid = \"asker\"\nagent = \"shell\"\nprompt = \"if [ -z \\\"$CREW_MESSAGE\\\" ]; then crew ask 'ship it?'; exit 0; fi; echo \\\"answer: $CREW_MESSAGE\\\"\"\n",
            ),
        ],
    );
    let output = env
        .hermetic(&mut std::process::Command::new("node"))
        .arg(&script)
        .arg(crew_tests::crew_bin())
        .arg(&a)
        .arg(&b)
        .current_dir(script.parent().unwrap())
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", render_output(&output));
    let seen: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(seen["ok"], true, "{seen:#}");

    // The work of every task is on its branch, the cancelled one's too.
    let branches = |repo: &camino::Utf8Path| -> Vec<(String, String)> {
        env.git(
            repo,
            [
                "for-each-ref",
                "--format=%(refname:short)",
                "refs/heads/crew/",
            ],
        )
        .lines()
        .map(|branch| {
            let files = env.git(repo, ["ls-tree", "-r", "--name-only", branch]);
            (branch.to_owned(), files)
        })
        .collect()
    };
    let in_a = branches(&a);
    for (task, file) in [
        ("left", "left.txt"),
        ("right", "right.txt"),
        ("slow", "slow.txt"),
    ] {
        assert!(
            in_a.iter()
                .any(|(branch, files)| branch.ends_with(&format!("-{task}"))
                    && files.lines().any(|line| line == file)),
            "{task}: {in_a:?}"
        );
    }
    // The plain prompt ran in folder B, in a worktree of its own: its work is on a branch,
    // and the user's checkout, open in the editor, is as it was.
    let in_b = branches(&b);
    assert!(
        in_b.iter().any(|(branch, files)| branch.ends_with("-task")
            && files.lines().any(|line| line == "solo.txt")),
        "{in_b:?}"
    );
    assert!(!b.join("solo.txt").exists());
    assert!(!a.join("solo.txt").exists());
    // `/task <agent> …` needs no default agent: folder A has none.
    assert!(
        in_a.iter().any(|(branch, files)| branch.ends_with("-shell")
            && files.lines().any(|line| line == "via.txt")),
        "{in_a:?}"
    );
}

/// The same flows through the Rust SDK's client side: a team run reported as a plan and
/// messages, an agent's question answered through the client, a second folder that sees
/// nothing of the first, and a cancel mid-run that ends the turn `cancelled` with the work on
/// its branch. An ACP agent that crew runs asks for permission too: crew asks the editor, and
/// the editor's answer reaches the agent, which goes on as it waited, alive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_acp_client_runs_answers_and_cancels() {
    use agent_client_protocol::schema::ProtocolVersion;
    use agent_client_protocol::v1::schema::{
        CancelNotification, ContentBlock, InitializeRequest, NewSessionRequest, PromptRequest,
        RequestPermissionOutcome, RequestPermissionRequest, RequestPermissionResponse,
        SelectedPermissionOutcome, SessionNotification, SessionUpdate, StopReason, TextContent,
    };
    use agent_client_protocol::{Client, on_receive_notification, on_receive_request};
    use std::sync::{Arc, Mutex};

    let env = TestEnv::new();
    let (a, b) = editor_folders(
        &env,
        "rust",
        &[(
            "work",
            "workspace_mode = \"worktree\"\n[[tasks]]\nid = \"asker\"\nagent = \"shell\"\nprompt = \"if [ -z \\\"$CREW_MESSAGE\\\" ]; then crew ask 'merge?'; exit 0; fi; echo \\\"got $CREW_MESSAGE\\\" > answer.txt; cat answer.txt\"\n",
        )],
    );
    crate::common::agents::define_fake_acp(&env, &a, "");
    write(
        &a.join(".crew/teams/perm.toml"),
        "workspace_mode = \"worktree\"\n[[tasks]]\nid = \"deploy\"\nagent = \"acp\"\nprompt = \"ask deploy\"\n",
    );
    env.git(&a, ["add", ".crew"]);
    env.git(&a, ["commit", "-q", "-m", "an ACP agent"]);
    let (crew, transport) = serve(&env, &a);

    // What each session was told, as text.
    let told: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let asked: Arc<Mutex<Vec<String>>> = Arc::default();
    let (told_in, asked_in) = (told.clone(), asked.clone());
    let transcript = move |session: &str| -> String {
        told.lock()
            .unwrap()
            .iter()
            .filter(|(id, _)| id == session)
            .map(|(_, text)| text.as_str())
            .collect()
    };
    let result = Client
        .v1()
        .name("crew-rust-test")
        .on_receive_notification(
            async move |notification: SessionNotification, _cx| {
                if let SessionUpdate::AgentMessageChunk(chunk) = notification.update
                    && let ContentBlock::Text(text) = chunk.content
                {
                    told_in
                        .lock()
                        .unwrap()
                        .push((notification.session_id.0.to_string(), text.text));
                }
                Ok(())
            },
            on_receive_notification!(),
        )
        .on_receive_request(
            async move |request: RequestPermissionRequest, responder, _cx| {
                asked_in
                    .lock()
                    .unwrap()
                    .push(request.tool_call.fields.title.unwrap_or_default());
                responder.respond(RequestPermissionResponse::new(
                    RequestPermissionOutcome::Selected(SelectedPermissionOutcome::new("yes")),
                ))
            },
            on_receive_request!(),
        )
        .connect_with(transport, async |cx| {
            let text = |text: &str| vec![ContentBlock::Text(TextContent::new(text))];
            cx.send_request(InitializeRequest::new(ProtocolVersion::V1))
                .block_task()
                .await?;
            let session_a = cx
                .send_request(NewSessionRequest::new(a.as_std_path()))
                .block_task()
                .await?
                .session_id;
            let done = cx
                .send_request(PromptRequest::new(session_a.clone(), text("/run work")))
                .block_task()
                .await?;
            assert_eq!(done.stop_reason, StopReason::EndTurn);
            let told_a = transcript(&session_a.0);
            assert!(told_a.contains("[asker] got yes"), "{told_a}");
            assert!(told_a.contains("asker succeeded"), "{told_a}");
            let permitted = cx
                .send_request(PromptRequest::new(session_a.clone(), text("/run perm")))
                .block_task()
                .await?;
            assert_eq!(permitted.stop_reason, StopReason::EndTurn);
            let told_a = transcript(&session_a.0);
            assert!(told_a.contains("deploy succeeded"), "{told_a}");

            let session_b = cx
                .send_request(NewSessionRequest::new(b.as_std_path()))
                .block_task()
                .await?
                .session_id;
            let solo = cx
                .send_request(PromptRequest::new(session_b.clone(), text("echo from b")))
                .block_task()
                .await?;
            assert_eq!(solo.stop_reason, StopReason::EndTurn);
            let told_b = transcript(&session_b.0);
            assert!(told_b.contains("[task] from b"), "{told_b}");
            assert!(
                !told_b.contains("asker"),
                "folder B heard of folder A: {told_b}"
            );

            let slow = cx.send_request(PromptRequest::new(session_a.clone(), text("/run slow")));
            let (sender, started) = futures::channel::oneshot::channel();
            let watch = transcript.clone();
            let watched = session_a.0.to_string();
            tokio::spawn(async move {
                while !watch(&watched).contains("[slow] started") {
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
                let _ = sender.send(());
            });
            let (cancelled, ()) = futures::join!(slow.block_task(), async {
                let _ = started.await;
                cx.send_notification(CancelNotification::new(session_a.clone()))
                    .unwrap();
            });
            assert_eq!(cancelled?.stop_reason, StopReason::Cancelled);
            Ok(())
        })
        .await;
    result.unwrap();
    let asked = asked.lock().unwrap().clone();
    assert_eq!(asked.len(), 2, "{asked:?}");
    assert!(asked[0].contains("merge?"), "{asked:?}");
    assert!(asked[1].contains("allow deploy?"), "{asked:?}");
    drop(crew);
    let files = |branch_suffix: &str| {
        let branch = env
            .git(
                &a,
                [
                    "for-each-ref",
                    "--format=%(refname:short)",
                    "refs/heads/crew/",
                ],
            )
            .lines()
            .find(|branch| branch.ends_with(branch_suffix))
            .unwrap_or_else(|| panic!("no branch for {branch_suffix}"))
            .to_owned();
        env.git(&a, ["ls-tree", "-r", "--name-only", &branch])
    };
    assert!(files("-asker").contains("answer.txt"));
    assert!(files("-deploy").contains("deploy.allowed"));
    assert!(
        files("-slow").contains("slow.txt"),
        "the cancelled task's work is on its branch"
    );
}

/// `crew serve --stdio` in `dir` (killed when dropped), and the Rust SDK's line transport over
/// its stdin and stdout.
fn serve(
    env: &TestEnv,
    dir: &camino::Utf8Path,
) -> (
    tokio::process::Child,
    agent_client_protocol::Lines<
        impl futures::Sink<String, Error = std::io::Error> + Send + 'static,
        impl futures::Stream<Item = std::io::Result<String>> + Send + 'static,
    >,
) {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let mut command = tokio::process::Command::from({
        let mut command = env.crew_command(dir);
        command.args(["serve", "--stdio"]);
        command
    });
    let mut crew = command
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdin = crew.stdin.take().unwrap();
    let stdout = tokio::io::BufReader::new(crew.stdout.take().unwrap()).lines();
    let outgoing = futures::sink::unfold(stdin, |mut stdin, line: String| async move {
        stdin.write_all(format!("{line}\n").as_bytes()).await?;
        Ok::<_, std::io::Error>(stdin)
    });
    let incoming = futures::stream::unfold(stdout, |mut lines| async move {
        match lines.next_line().await {
            Ok(Some(line)) => Some((Ok(line), lines)),
            Ok(None) => None,
            Err(error) => Some((Err(error), lines)),
        }
    });
    (crew, agent_client_protocol::Lines::new(outgoing, incoming))
}

/// Two project folders for an editor: `<name>-a` with the given teams and a team `slow` (one
/// worktree task that says `started` and sleeps), and `<name>-b` whose plain prompts go to
/// the `shell` agent; each with its `.crew/` committed.
fn editor_folders(env: &TestEnv, name: &str, teams: &[(&str, &str)]) -> (Utf8PathBuf, Utf8PathBuf) {
    let a = env.repo(&format!("{name}-a"));
    for (team, contents) in teams {
        write(&a.join(format!(".crew/teams/{team}.toml")), contents);
    }
    write(
        &a.join(".crew/teams/slow.toml"),
        "workspace_mode = \"worktree\"\n[[tasks]]\nid = \"slow\"\nagent = \"shell\"\nprompt = \"echo work > slow.txt && echo started && sleep 600\"\n",
    );
    let b = env.repo(&format!("{name}-b"));
    write(
        &b.join(".crew/config.toml"),
        "[run]\ndefault_agent = \"shell\"\n",
    );
    for repo in [&a, &b] {
        env.git(repo, ["add", ".crew"]);
        env.git(repo, ["commit", "-q", "-m", "crew files"]);
    }
    (a, b)
}

/// What an editor may send by mistake gets a JSON-RPC error, never a crash, and stdout carries
/// protocol messages only.
#[test]
fn malformed_messages_get_json_rpc_errors_and_the_server_goes_on() {
    use std::io::{BufRead, Write};
    let env = TestEnv::new();
    let repo = env.repo("project");
    let mut crew = env
        .crew_command(&repo)
        .args(["serve", "--stdio"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = crew.stderr.take().unwrap();
    let said = std::thread::spawn(move || {
        let mut said = String::new();
        std::io::Read::read_to_string(&mut stderr, &mut said).unwrap();
        said
    });
    let mut stdin = crew.stdin.take().unwrap();
    let mut lines = std::io::BufReader::new(crew.stdout.take().unwrap()).lines();
    let mut exchange = |line: &str| -> serde_json::Value {
        writeln!(stdin, "{line}").unwrap();
        let answer = lines.next().expect("an answer").unwrap();
        serde_json::from_str(&answer).unwrap_or_else(|_| panic!("not JSON-RPC: {answer}"))
    };
    let garbage = exchange("this is not json");
    assert_eq!(garbage["error"]["code"], -32700, "{garbage}");
    let init = exchange(
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{}}}"#,
    );
    assert_eq!(init["result"]["agentInfo"]["name"], "crew", "{init}");
    let relative = exchange(
        r#"{"jsonrpc":"2.0","id":2,"method":"session/new","params":{"cwd":"relative","mcpServers":[]}}"#,
    );
    assert_eq!(relative["error"]["code"], -32602, "{relative}");
    let mistyped =
        exchange(r#"{"jsonrpc":"2.0","id":3,"method":"session/prompt","params":{"sessionId":5}}"#);
    assert_eq!(mistyped["error"]["code"], -32602, "{mistyped}");
    let unknown = exchange(r#"{"jsonrpc":"2.0","id":4,"method":"_crew/nothing","params":{}}"#);
    assert_eq!(unknown["error"]["code"], -32601, "{unknown}");
    let session = exchange(&format!(
        r#"{{"jsonrpc":"2.0","id":5,"method":"session/new","params":{{"cwd":"{repo}","mcpServers":[]}}}}"#
    ));
    assert!(session["result"]["sessionId"].is_string(), "{session}");
    drop(stdin);
    assert!(
        crew.wait().unwrap().success(),
        "the server ends cleanly when its input does"
    );
    // The errors were the answers: the editor's log holds no warning of them.
    let said = said.join().unwrap();
    assert!(said.is_empty(), "{said}");
}
