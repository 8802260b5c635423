//! `crew serve --stdio` driven by an Agent Client Protocol client crew did not write: the
//! official TypeScript SDK (`tests/acp-client/drive.mjs`), as an editor would drive it.

use camino::Utf8PathBuf;
use crew_tests::{TestEnv, render_output, write};

/// The ACP client, when Node and its npm package are installed (`npm ci` in
/// `tests/acp-client`); `None` says why not. CI sets `CREW_TESTS_REQUIRE_NODE`: there a missing
/// client fails the test instead of skipping it.
fn acp_client() -> Result<Utf8PathBuf, String> {
    let dir = Utf8PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("acp-client");
    let node = std::process::Command::new("node").arg("--version").output();
    if !node.is_ok_and(|output| output.status.success()) {
        return Err("node is not installed".to_owned());
    }
    if !dir.join("node_modules/@agentclientprotocol/sdk").exists() {
        return Err(format!(
            "the ACP SDK is not installed: run `npm ci` in {dir}"
        ));
    }
    Ok(dir.join("drive.mjs"))
}

#[test]
fn an_acp_client_runs_teams_sees_only_its_folder_and_cancels() {
    let script = match acp_client() {
        Ok(script) => script,
        Err(why) if std::env::var_os("CREW_TESTS_REQUIRE_NODE").is_some() => {
            panic!("the editor-protocol test cannot run: {why}")
        }
        Err(why) => {
            eprintln!("SKIPPED an_acp_client_runs_teams_sees_only_its_folder_and_cancels: {why}");
            return;
        }
    };
    let env = TestEnv::new();
    let a = env.repo("editor-a");
    write(
        &a.join(".crew/teams/pair.toml"),
        "workspace_mode = \"worktree\"\n[[tasks]]\nid = \"left\"\nagent = \"shell\"\nprompt = \"echo hello from left > left.txt && cat left.txt\"\n\n[[tasks]]\nid = \"right\"\nagent = \"shell\"\nprompt = \"echo hello from right > right.txt && cat right.txt\"\n",
    );
    write(
        &a.join(".crew/teams/ask.toml"),
        "[[tasks]]\nid = \"asker\"\nagent = \"shell\"\nprompt = \"if [ -z \\\"$CREW_MESSAGE\\\" ]; then crew ask 'ship it?'; exit 0; fi; echo \\\"answer: $CREW_MESSAGE\\\"\"\n",
    );
    write(
        &a.join(".crew/teams/slow.toml"),
        "workspace_mode = \"worktree\"\n[[tasks]]\nid = \"slow\"\nagent = \"shell\"\nprompt = \"echo work > slow.txt && echo started && sleep 600\"\n",
    );
    let b = env.repo("editor-b");
    write(
        &b.join(".crew/config.toml"),
        "[run]\ndefault_agent = \"shell\"\n",
    );
    for repo in [&a, &b] {
        env.git(repo, ["add", ".crew"]);
        env.git(repo, ["commit", "-q", "-m", "crew files"]);
    }
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
    // The plain prompt ran in folder B (in its own root: an ad hoc task's default mode).
    assert_eq!(
        std::fs::read_to_string(b.join("solo.txt")).unwrap(),
        "solo\n"
    );
    assert!(!a.join("solo.txt").exists());
}
