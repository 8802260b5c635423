//! Where an agent's tools write: the project's caches and stores, never the user's; a refused write named.

use super::*;

#[test]
fn a_listings_directory_swapped_for_a_link_is_never_read_written_or_swept_through() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let first = env.crew(&repo, ["run", "--agent", "shell", "true"]);
    assert!(first.status.success(), "{}", render_output(&first));
    // What an unconfined agent could leave: the listings' directory, a link to the user's.
    let outside = env.dir("outside");
    write(&outside.join("precious.json"), "{\"not\": \"a listing\"}\n");
    let before = tree_fingerprint(outside.as_std_path());
    let live = repo.join(".crew/state/live");
    if live.exists() {
        std::fs::remove_dir_all(&live).unwrap();
    }
    std::os::unix::fs::symlink(&outside, &live).unwrap();
    for args in [
        &["runs", "list"][..],
        &["agents", "list"],
        &["run", "--agent", "shell", "echo ran"],
    ] {
        let output = env.crew(&repo, args);
        assert!(
            output.status.success(),
            "{args:?}: {}",
            render_output(&output)
        );
    }
    assert_eq!(tree_fingerprint(outside.as_std_path()), before);
}

#[test]
fn pnpm_installs_into_the_project_s_store_inside_the_sandbox() {
    // pnpm, pinned with the agent programs; a dependency from a tarball, so no registry.
    let Some(programs) = crew_tests::agent_programs(
        "pnpm",
        "pnpm_installs_into_the_project_s_store_inside_the_sandbox",
    ) else {
        return;
    };
    let env = TestEnv::new();
    let repo = env.repo("project");
    write(
        &repo.join("package.json"),
        "{\"name\": \"app\", \"version\": \"1.0.0\"}\n",
    );
    write(
        &repo.join("dep/package/package.json"),
        "{\"name\": \"dep\", \"version\": \"1.0.0\"}\n",
    );
    write(&repo.join("dep/package/index.js"), "module.exports = 1;\n");
    let tar = std::process::Command::new("tar")
        .args(["czf", "dep.tgz", "-C", "dep", "package"])
        .current_dir(&repo)
        .status()
        .unwrap();
    assert!(tar.success());
    env.git(&repo, ["add", "."]);
    env.git(&repo, ["commit", "-q", "-m", "app"]);
    let mut command = env.crew_command(&repo);
    let path = format!(
        "{programs}:{}",
        command
            .get_envs()
            .find(|(name, _)| *name == "PATH")
            .and_then(|(_, value)| value.map(|value| value.to_string_lossy().into_owned()))
            .unwrap_or_default()
    );
    let run = command
        .env("PATH", path)
        .args([
            "run",
            "--quiet",
            "--agent",
            "shell",
            "pnpm add ./dep.tgz > pnpm.txt 2>&1; pnpm store path > store.txt",
        ])
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", render_output(&run));
    let said = std::fs::read_to_string(repo.join("pnpm.txt")).unwrap_or_default();
    assert!(
        repo.join("node_modules/dep/index.js").exists(),
        "the install failed inside the sandbox: {said}"
    );
    let store = std::fs::read_to_string(repo.join("store.txt")).unwrap();
    let caches = env.home().join(".local/state/crew/caches");
    assert!(store.trim().starts_with(caches.as_str()), "{store}");
    assert!(!env.home().join(".local/share/pnpm").exists());
}

#[test]
fn toolchains_write_the_project_s_caches_and_never_the_user_s() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let user_cargo = env.home().join(".cargo");
    write(&user_cargo.join("config.toml"), "[net]\nretry = 7\n");
    write(
        &user_cargo.join("credentials.toml"),
        "[registry]\ntoken = \"secret\"\n",
    );
    write(
        &user_cargo.join("registry/cache/kept.crate"),
        "the user's\n",
    );
    write(&env.home().join(".npm/kept"), "the user's\n");
    // Each tool's cache is written where the agent is pointed; then it tries the user's own,
    // and to swap the project's cargo settings for its own.
    let script = r#"set -u
for dir in "$npm_config_cache" "$YARN_CACHE_FOLDER" "$PIP_CACHE_DIR" "$UV_CACHE_DIR" "$GOMODCACHE" "$GOCACHE" "$CARGO_HOME/registry" "$XDG_CACHE_HOME/some-tool"; do
  mkdir -p "$dir" && echo warm > "$dir/probe" || echo "REFUSED $dir"
done
npm config get cache > npm-cache.txt
echo "$XDG_CACHE_HOME" > xdg-cache.txt
cat "$CARGO_HOME/config.toml" > cargo-config.txt
test -e "$CARGO_HOME/credentials.toml" && echo LEAKED > leaked.txt
echo poisoned > "$HOME/.cargo/registry/cache/kept.crate"
echo poisoned > "$HOME/.npm/kept"
rm -f "$CARGO_HOME/config.toml" && echo '[build]
rustc-wrapper = "/tmp/evil"' > "$CARGO_HOME/config.toml"
exit 0"#;
    let run = env.crew(&repo, ["run", "--quiet", "--agent", "shell", script]);
    assert!(run.status.success(), "{}", render_output(&run));
    let run_id = run_ids(&env, &repo).remove(0);
    let log = output_log(&repo, &run_id, "shell");
    assert!(!log.contains("REFUSED"), "{log}");
    let caches = env.home().join(".local/state/crew/caches");
    let npm_cache = std::fs::read_to_string(repo.join("npm-cache.txt")).unwrap_or_default();
    // npm itself reads the variable (where npm is installed: CI has it).
    if !npm_cache.is_empty() {
        assert!(npm_cache.trim().starts_with(caches.as_str()), "{npm_cache}");
    }
    // Any other program's cache (XDG's layout) is the project's too, never `~/.cache`.
    let xdg = std::fs::read_to_string(repo.join("xdg-cache.txt")).unwrap();
    assert!(xdg.trim().starts_with(caches.as_str()), "{xdg}");
    assert!(!env.home().join(".cache/some-tool").exists());
    assert_eq!(
        std::fs::read_to_string(repo.join("cargo-config.txt")).unwrap(),
        "[net]\nretry = 7\n",
        "the user's cargo settings reach the agent"
    );
    assert!(
        !repo.join("leaked.txt").exists(),
        "credentials are not linked"
    );
    assert_eq!(
        std::fs::read_to_string(user_cargo.join("registry/cache/kept.crate")).unwrap(),
        "the user's\n"
    );
    assert_eq!(
        std::fs::read_to_string(env.home().join(".npm/kept")).unwrap(),
        "the user's\n"
    );
    // The next start has the user's settings again, and the caches still warm.
    let again = env.crew(
        &repo,
        [
            "run",
            "--quiet",
            "--agent",
            "shell",
            "cat \"$CARGO_HOME/config.toml\" > again.txt; cat \"$npm_config_cache/probe\" >> again.txt",
        ],
    );
    assert!(again.status.success(), "{}", render_output(&again));
    assert_eq!(
        std::fs::read_to_string(repo.join("again.txt")).unwrap(),
        "[net]\nretry = 7\nwarm\n"
    );
}

#[test]
fn a_write_the_sandbox_refused_is_named_in_the_task_s_reason_with_what_to_add() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    // As a toolchain does in a fresh home: it makes its own directory there, and fails.
    let run = env.crew(
        &repo,
        [
            "run",
            "--quiet",
            "--agent",
            "shell",
            r#"mkdir "$HOME/.newtool" || exit 3"#,
        ],
    );
    assert_eq!(run.status.code(), Some(1), "{}", render_output(&run));
    let first = run_ids(&env, &repo).remove(0);
    let record = task(&manifest(&env, &repo, &first), "shell").clone();
    let reason = record["reason"].as_str().unwrap_or_default();
    let refused = env.home().join(".newtool");
    assert!(
        reason.contains(&format!("the sandbox refused writing {refused}"))
            && reason.contains("`[sandbox] write` of agent `shell`")
            && reason.contains("crew sandbox allow"),
        "{record:#}"
    );
    assert!(!refused.exists());
    // Every refusal is an event of the run too.
    let events = env.crew(&repo, ["events", "--run", &first]);
    assert!(
        String::from_utf8_lossy(&events.stdout)
            .contains(&format!("the sandbox refused writes to {refused}")),
        "{}",
        render_output(&events)
    );
    // One that succeeds anyway keeps it as a warning; a write it may make is never named.
    let run = env.crew(
        &repo,
        [
            "run",
            "--quiet",
            "--agent",
            "shell",
            r#"mkdir "$HOME/.other" 2>&1; echo "cannot write $PWD/inside: Permission denied"; true"#,
        ],
    );
    assert!(run.status.success(), "{}", render_output(&run));
    let second = run_ids(&env, &repo)
        .into_iter()
        .find(|run| *run != first)
        .unwrap();
    let record = task(&manifest(&env, &repo, &second), "shell").clone();
    let warnings = record["warnings"].to_string();
    assert!(
        warnings.contains(&format!(
            "the sandbox refused writing {}",
            env.home().join(".other")
        )),
        "{record:#}"
    );
    assert!(!warnings.contains("inside"), "{record:#}");
}
