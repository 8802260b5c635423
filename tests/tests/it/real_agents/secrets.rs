//! The real programs hold their key only by reference: a tool call that dumps what the agent
//! can see of its environment, its home and its login finds the stand-in, never the user's key,
//! and nothing crew keeps holds it either; the model received the user's key through crew's
//! proxy (the user's gateway, `ANTHROPIC_BASE_URL`/`OPENAI_BASE_URL`, still in front of it).

use super::*;

/// What the dump writes in the workspace: the environment as seen by the shell and by
/// `/proc/self/environ`, every file of the home holding the key, and the program's login.
const DUMP: &str = "env > env.txt; tr '\\0' '\\n' < /proc/self/environ > environ.txt; \
     grep -rl -- \"$KEY\" \"$HOME\" > home.txt 2>/dev/null; \
     cat \"$HOME/$LOGIN\" > login.txt 2>&1; true";

/// The dump as the tool call says it: the key it looks for is written reversed, so that the
/// call itself (kept in the program's transcript) does not hold it.
fn dump(login: &str) -> String {
    let reversed: String = USERS_KEY.chars().rev().collect();
    format!("KEY=$(echo {reversed} | rev) LOGIN={login}; {DUMP}")
}

/// Plants the user's login file (with the key in it) in the test's home.
fn plant_login(project: &Project, login: &str, content: &str) {
    crew_tests::write(&project.env.home().join(login), content);
}

/// Asserts what the agent saw and what crew kept: the stand-in, never the key.
fn saw_only_the_stand_in(project: &Project, task_id: &str, stand_in_of: &str) {
    let run = run_ids(&project.env, &project.repo).remove(0);
    let branch = format!("crew/{run}-{task_id}");
    let show = |file: &str| {
        project
            .env
            .git(&project.repo, ["show", &format!("{branch}:{file}")])
    };
    for file in ["env.txt", "environ.txt", "home.txt", "login.txt"] {
        let seen = show(file);
        assert!(
            !seen.contains(USERS_KEY) && !seen.contains(LOGIN_TOKEN),
            "{file} holds the user's key:\n{seen}"
        );
    }
    // `/proc/self/environ` of an undumpable process is not readable: empty, or the stand-in.
    let stand_in = format!("crew-stand-in-{stand_in_of}-");
    assert!(show("env.txt").contains(&stand_in), "{}", show("env.txt"));
    let environ = show("environ.txt");
    assert!(
        environ.is_empty() || environ.contains(&stand_in),
        "{environ}"
    );
    assert!(
        show("home.txt").trim().is_empty(),
        "files of the home hold the key: {}",
        show("home.txt")
    );
    let login = show("login.txt");
    assert!(
        login.contains("No such file") || login.trim().is_empty(),
        "the login was readable: {login}"
    );
    // Nothing crew keeps — records, logs, events — nor the repository holds it.
    for path in walk(&project.repo) {
        if path.components().any(|part| part.as_str() == ".git") {
            continue;
        }
        let bytes = std::fs::read(&path).unwrap_or_default();
        let text = String::from_utf8_lossy(&bytes);
        assert!(
            !text.contains(USERS_KEY) && !text.contains(LOGIN_TOKEN),
            "{path} holds the user's key"
        );
    }
}

/// A token of the user's login, planted in its file: never readable to the agent.
const LOGIN_TOKEN: &str = "sk-ant-oat01-the-users-login-token";

#[test]
fn claude_code_holds_only_a_stand_in_and_the_model_gets_the_user_s_key() {
    let Some(project) = Project::new("claude", "claude_code_holds_only_a_stand_in") else {
        return;
    };
    let login = ".claude/.credentials.json";
    plant_login(
        &project,
        login,
        &format!(r#"{{"claudeAiOauth":{{"accessToken":"{LOGIN_TOKEN}"}}}}"#),
    );
    let dump = dump(login);
    let model = ModelApi::start(vec![
        Reply::tool(
            "Bash",
            json!({"command": dump, "description": "look around"}),
        ),
        Reply::say("Done."),
    ]);
    let run = project.crew(
        &model,
        &[
            "run",
            "--agent",
            "claude",
            "--workspace-mode",
            "worktree",
            "look around",
        ],
    );
    assert!(run.status.success(), "{}", render_output(&run));
    let (_, task) = project.only_task();
    through_the_proxy(&task, &model);
    assert_eq!(
        task["sandbox"]["by_reference"],
        json!([
            format!("ANTHROPIC_API_KEY for {}", model.url()),
            format!("CLAUDE_CODE_OAUTH_TOKEN for {}", model.url())
        ]),
        "{task:#}"
    );
    saw_only_the_stand_in(&project, "claude", "anthropic");
}

/// A user signed in only (no key in their environment): the program's login file, which the
/// agent cannot read, gives its key by reference; the model gets that and only that.
/// `held` names the key and what its gateway adds to the model's URL (Codex's `/v1`).
fn signed_in_only(program: &str, agent: &str, login: &str, content: &str, held: (&str, &str)) {
    let Some(project) = Project::new(program, &format!("{agent}_signed_in_only")) else {
        return;
    };
    plant_login(&project, login, content);
    let model = ModelApi::start(vec![Reply::say("Done.")]);
    let run = project
        .command(&model, &["run", "--agent", agent, "say done"])
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("OPENAI_API_KEY")
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}\n{}",
        render_output(&run),
        project.output_log_of(agent)
    );
    let (_, task) = project.only_task_of(agent);
    assert_eq!(
        task["sandbox"]["by_reference"],
        json!([format!("{} for {}{}", held.0, model.url(), held.1)]),
        "{task:#}"
    );
    let keys = model.keys();
    assert!(
        !keys.is_empty() && keys.iter().all(|key| key == LOGIN_TOKEN),
        "the model got {keys:?}"
    );
}

#[test]
fn claude_code_signed_in_only_gets_its_login_s_token_by_reference() {
    signed_in_only(
        "claude",
        "claude",
        ".claude/.credentials.json",
        &format!(r#"{{"claudeAiOauth":{{"accessToken":"{LOGIN_TOKEN}"}}}}"#),
        ("CLAUDE_CODE_OAUTH_TOKEN", ""),
    );
}

#[test]
fn codex_signed_in_with_a_key_only_gets_it_by_reference() {
    signed_in_only(
        "codex",
        "codex",
        ".codex/auth.json",
        &format!(r#"{{"OPENAI_API_KEY":"{LOGIN_TOKEN}"}}"#),
        ("CODEX_API_KEY", "/v1"),
    );
}

#[test]
fn codex_holds_only_a_stand_in_and_the_model_gets_the_user_s_key() {
    let Some(project) = Project::new("codex", "codex_holds_only_a_stand_in") else {
        return;
    };
    let login = ".codex/auth.json";
    plant_login(
        &project,
        login,
        &format!(r#"{{"OPENAI_API_KEY":"{LOGIN_TOKEN}"}}"#),
    );
    let dump = dump(login);
    let model = ModelApi::start(vec![
        Reply::tool(
            "exec",
            json!(format!(
                "const r = await tools.exec_command({{cmd: {}}});\ntext(r.output);",
                serde_json::to_string(&dump).unwrap()
            )),
        ),
        Reply::say("Done."),
    ]);
    let run = project.crew(
        &model,
        &[
            "run",
            "--agent",
            "codex",
            "--workspace-mode",
            "worktree",
            "look around",
        ],
    );
    assert!(
        run.status.success(),
        "{}\n{}",
        render_output(&run),
        project.output_log_of("codex")
    );
    let (_, task) = project.only_task_of("codex");
    through_the_proxy(&task, &model);
    saw_only_the_stand_in(&project, "codex", "openai");
}
