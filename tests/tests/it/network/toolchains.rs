//! The toolchains a task uses keep working inside crew's sandbox, with the reads in part, the
//! default network (crew's proxy, the registries listed) and crew's caches: cargo fetching a
//! crates.io dependency, `npm ci`, `pip install` into a virtual environment, and a git commit
//! with the user's identity. Real registries (the only hosts these machines reach).

use super::*;

/// An agent that runs its prompt in `sh`, through crew's proxy to the registries only.
fn builder(repo: &Utf8Path) {
    define(
        repo,
        "builder",
        "network = \"proxy\"\nallow_hosts = [\"index.crates.io\", \"static.crates.io\", \"registry.npmjs.org\", \"pypi.org\", \"files.pythonhosted.org\"]\n",
    );
}

/// Runs `script` as the builder in a worktree; the task's record.
fn built(env: &TestEnv, repo: &Utf8Path, script: &str) -> serde_json::Value {
    built_with(env, repo, &[], script)
}

/// [`built`], with `vars` in crew's environment; the user's git identity in their home.
fn built_with(
    env: &TestEnv,
    repo: &Utf8Path,
    vars: &[(&str, &str)],
    script: &str,
) -> serde_json::Value {
    let config = env.home().join(".gitconfig");
    if !config.exists() {
        write(
            &config,
            "[user]\n\tname = The User\n\temail = user@example.com\n",
        );
    }
    let output = env
        .crew_command(repo)
        .envs(vars.iter().copied())
        .args([
            "run",
            "--quiet",
            "--agent",
            "builder",
            "--workspace-mode",
            "worktree",
            script,
        ])
        .output()
        .unwrap();
    let run = run_ids(env, repo).remove(0);
    let recorded = task(&manifest(env, repo, &run), "builder").clone();
    let log = std::fs::read_to_string(
        repo.join(format!(".crew/state/runs/{run}/tasks/builder/output.log")),
    )
    .unwrap_or_default();
    assert!(
        output.status.success(),
        "{}\n{log}\n{recorded:#}",
        render_output(&output)
    );
    recorded
}

fn tool(name: &str) -> bool {
    std::process::Command::new(name)
        .arg("--version")
        .output()
        .is_ok_and(|output| output.status.success())
}

#[test]
fn cargo_fetches_a_crates_io_dependency_and_checks_the_crate_in_a_task() {
    if !tool("cargo") {
        eprintln!("skipped: no cargo");
        return;
    }
    let env = TestEnv::new();
    let repo = env.repo("project");
    write(
        &repo.join("Cargo.toml"),
        "[package]\nname = \"probe\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[dependencies]\nitoa = \"=1.0.11\"\n",
    );
    write(
        &repo.join("src/main.rs"),
        "fn main() { println!(\"{}\", itoa::Buffer::new().format(42)); }\n",
    );
    env.git(&repo, ["add", "-A"]);
    env.git(&repo, ["commit", "-q", "-m", "a crate"]);
    builder(&repo);
    // The user's rustup, wherever it is installed: named by RUSTUP_HOME, as a user whose
    // toolchains are not in their home names it.
    let rustup = std::env::var("RUSTUP_HOME")
        .unwrap_or_else(|_| format!("{}/.rustup", std::env::var("HOME").unwrap_or_default()));
    let recorded = built_with(
        &env,
        &repo,
        &[("RUSTUP_HOME", rustup.as_str())],
        "cargo check --quiet 2>&1 && cargo run --quiet > ran.txt && git add Cargo.lock ran.txt && git commit -q -m 'checked'",
    );
    let run = run_ids(&env, &repo).remove(0);
    assert_eq!(
        env.git(&repo, ["show", &format!("crew/{run}-builder:ran.txt")]),
        "42\n"
    );
    assert!(
        env.git(&repo, ["show", &format!("crew/{run}-builder:Cargo.lock")])
            .contains("itoa"),
        "{recorded:#}"
    );
    // Fetched through crew's proxy, into crew's cache of this project, not the user's.
    assert!(
        recorded["requests"]["allowed"].as_u64().unwrap_or(0) >= 1,
        "{recorded:#}"
    );
    assert!(
        !env.home().join(".cargo/registry/cache").exists(),
        "the user's cargo cache was written"
    );
}

#[test]
fn npm_ci_installs_a_locked_package_in_a_task() {
    if !tool("npm") {
        eprintln!("skipped: no npm");
        return;
    }
    let env = TestEnv::new();
    let repo = env.repo("project");
    write(
        &repo.join("package.json"),
        "{\"name\": \"probe\", \"version\": \"1.0.0\", \"dependencies\": {\"is-number\": \"7.0.0\"}}\n",
    );
    // The lock, as the user's own npm writes it, committed with the project.
    let locked = std::process::Command::new("npm")
        .args([
            "install",
            "--package-lock-only",
            "--no-audit",
            "--no-fund",
            "--loglevel=error",
        ])
        .current_dir(&repo)
        .env("HOME", env.home())
        .output()
        .unwrap();
    assert!(locked.status.success(), "{}", render_output(&locked));
    write(&repo.join(".gitignore"), "node_modules/\n");
    env.git(&repo, ["add", "-A"]);
    env.git(&repo, ["commit", "-q", "-m", "a package"]);
    builder(&repo);
    built(
        &env,
        &repo,
        "npm ci --no-audit --no-fund --loglevel=error && node -e 'console.log(require(\"is-number\")(5))' > ran.txt && git add ran.txt && git commit -q -m 'installed'",
    );
    let run = run_ids(&env, &repo).remove(0);
    assert_eq!(
        env.git(&repo, ["show", &format!("crew/{run}-builder:ran.txt")]),
        "true\n"
    );
}

#[test]
fn pip_installs_into_a_virtual_environment_in_a_task() {
    if !tool("python3") {
        eprintln!("skipped: no python3");
        return;
    }
    let env = TestEnv::new();
    let repo = env.repo("project");
    write(&repo.join(".gitignore"), ".venv/\n");
    env.git(&repo, ["add", "-A"]);
    env.git(&repo, ["commit", "-q", "-m", "ignore the venv"]);
    builder(&repo);
    built(
        &env,
        &repo,
        "python3 -m venv .venv && .venv/bin/pip install --quiet --disable-pip-version-check six==1.16.0 && .venv/bin/python -c 'import six; print(six.__version__)' > ran.txt && git add ran.txt && git commit -q -m 'installed'",
    );
    let run = run_ids(&env, &repo).remove(0);
    assert_eq!(
        env.git(&repo, ["show", &format!("crew/{run}-builder:ran.txt")]),
        "1.16.0\n"
    );
}

#[test]
fn an_agent_s_commit_carries_the_user_s_identity() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    write(
        &env.home().join(".gitconfig"),
        "[user]\n\tname = The User\n\temail = user@example.com\n",
    );
    builder(&repo);
    built(
        &env,
        &repo,
        "echo work > work.txt && git add work.txt && git commit -q -m 'by the agent'",
    );
    let run = run_ids(&env, &repo).remove(0);
    assert_eq!(
        env.git(
            &repo,
            [
                "log",
                "-1",
                "--format=%an <%ae>",
                &format!("crew/{run}-builder")
            ]
        ),
        "The User <user@example.com>\n"
    );
}
