//! Tasks on a placement (`[placements.<name>]`): `crew run` drives `crew shim` through its stdin
//! and stdout, the agent works only in the shim's clone (confined there as here), and its work
//! comes back checked as its branch in the project — in one run with tasks that work here.

use camino::Utf8PathBuf;
use crew_tests::{TestEnv, render_output, write};

use crate::common::runs::{manifest, run_ids, task};
use crate::common::sshd::Sshd;

/// A project with a local placement `box` whose clones live under the returned directory.
fn project_with_box(env: &TestEnv) -> (Utf8PathBuf, Utf8PathBuf) {
    let repo = env.repo("project");
    let shim = env.dir("box");
    write(
        &repo.join(".crew/config.toml"),
        &format!("[placements.box]\nkind = \"local\"\ndir = \"{shim}\"\n"),
    );
    (repo, shim)
}

/// Once the newest run's placed `task` said `written` there (and where it works), kills its
/// transport and the shim with it at once, as a machine that goes away would. The run's id.
fn cut_when_written(env: &TestEnv, repo: &camino::Utf8Path, task_id: &str) -> String {
    let run = crew_tests::wait_until(30, "the run", || run_ids(env, repo).into_iter().next());
    let log = repo.join(format!(".crew/state/runs/{run}/tasks/{task_id}/output.log"));
    // Its line, and where it works there (the two come on streams of their own).
    crew_tests::wait_until(30, "the remote agent's line", || {
        std::fs::read_to_string(&log)
            .ok()
            .filter(|log| log.contains("written") && log.contains("[box] working in"))
    });
    let pid = task(&manifest(env, repo, &run), task_id)["pid"]
        .as_u64()
        .unwrap();
    rustix::process::kill_process_group(
        rustix::process::Pid::from_raw(pid as i32).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    run
}

#[test]
fn a_task_on_a_local_placement_works_in_its_clone_and_its_work_comes_back_as_its_branch() {
    let env = TestEnv::new();
    let (repo, shim) = project_with_box(&env);
    // The agent also tries to write into the project it came from: it works in the shim's
    // clone, confined there, and the project is out of its reach.
    let prompt = format!(
        "printf 'the api\\n' > api.txt; touch {repo}/owned.txt 2>/dev/null && echo reached || echo refused; echo done"
    );
    let output = env.crew(
        &repo,
        ["run", "--placement", "box", "--agent", "shell", &prompt],
    );
    assert!(output.status.success(), "{}", render_output(&output));
    // The run says where its task works: on the placement, not in its scratch directory here.
    let said = render_output(&output);
    assert!(said.contains("1 task(s) (all on placements)"), "{said}");
    assert!(said.contains("on box"), "{said}");
    let run = run_ids(&env, &repo).remove(0);
    let recorded = manifest(&env, &repo, &run);
    let record = task(&recorded, "shell");
    assert_eq!(record["status"], "succeeded", "{record:#}");
    assert_eq!(record["placement"], "box", "{record:#}");
    let branch = format!("crew/{run}-shell");
    assert_eq!(record["teardown"]["branch"], branch.as_str(), "{record:#}");
    assert_eq!(
        env.git(&repo, ["show", &format!("{branch}:api.txt")]),
        "the api\n"
    );
    // crew's commit of what it left uncommitted names this run, not the shim's own.
    let message = env.git(&repo, ["log", "-1", "--format=%s", &branch]);
    assert_eq!(
        message.trim(),
        format!("crew: save the work of task shell (run {run})")
    );
    assert!(!repo.join("owned.txt").exists());
    // It never had a worktree here; its clone is the shim's.
    assert!(!repo.join(".worktrees").join(&run).exists());
    let clones: Vec<_> = std::fs::read_dir(&shim)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.join(".git").is_dir())
        .collect();
    assert_eq!(clones.len(), 1, "{clones:?}");
    // What it printed, and where it worked, are in its log here.
    let log = std::fs::read_to_string(
        repo.join(format!(".crew/state/runs/{run}/tasks/shell/output.log")),
    )
    .unwrap();
    assert!(log.contains("refused"), "{log}");
    assert!(!log.contains("reached"), "{log}");
    assert!(log.contains("done"), "{log}");
    assert!(log.contains(&format!("[box] working in {shim}")), "{log}");
    // The quarantine ref went once the branch held the work; the shim dropped its copy.
    let quarantine = env.git_output(
        &repo,
        [
            "rev-parse",
            "--verify",
            "-q",
            &format!("refs/crew/incoming/{run}-shell"),
        ],
    );
    assert!(!quarantine.status.success());

    // Its work is diffed and landed as a local task's is: it started from the run's base,
    // and what it changes is counted.
    assert_eq!(
        record["workspace"]["base_commit"], recorded["base"],
        "{record:#}"
    );
    assert_eq!(
        record["teardown"]["diffstat"],
        serde_json::json!({"files_changed": 1, "insertions": 1, "deletions": 0}),
        "{record:#}"
    );
    assert!(said.contains("+1 -0"), "{said}");
    let diff = env.crew(&repo, ["diff", "shell"]);
    assert!(
        String::from_utf8_lossy(&diff.stdout).contains("+the api"),
        "{}",
        render_output(&diff)
    );
    let landed = env.crew(&repo, ["land", &run]);
    let said = render_output(&landed);
    assert!(landed.status.success(), "{said}");
    assert!(said.contains("landed shell on main"), "{said}");
    assert_eq!(
        std::fs::read_to_string(repo.join("api.txt")).unwrap(),
        "the api\n"
    );
}

#[test]
fn a_placed_task_reaches_the_network_its_run_names_on_its_placement_too() {
    let env = TestEnv::new();
    let (repo, _shim) = project_with_box(&env);
    // A server of the user's on the machine the placement runs on (here, this one).
    let server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = server.local_addr().unwrap().port();
    let prompt = format!(
        "bash -c 'echo hi > /dev/tcp/127.0.0.1/{port}' 2>/dev/null && echo net-reached || echo net-refused"
    );
    let said = |extra: &[&str]| {
        let mut args = vec!["run", "--placement", "box", "--agent", "shell"];
        args.extend(extra);
        args.push(&prompt);
        let output = env.crew(&repo, &args);
        assert!(output.status.success(), "{}", render_output(&output));
        let run = run_ids(&env, &repo).remove(0);
        std::fs::read_to_string(repo.join(format!(".crew/state/runs/{run}/tasks/shell/output.log")))
            .unwrap()
    };
    // Open, it reaches the server: the probe works, and what follows is the sandbox's doing.
    let open = said(&["--network", "open"]);
    assert!(open.contains("net-reached"), "{open}");
    // Named by nothing, it gets crew's proxy there too, with no host.
    let default = said(&[]);
    assert!(
        default.contains("net-refused") && !default.contains("net-reached"),
        "{default}"
    );
    let closed = said(&["--network", "none"]);
    assert!(
        closed.contains("net-refused") && !closed.contains("net-reached"),
        "{closed}"
    );
}

#[test]
fn placed_and_local_tasks_make_one_run_and_a_failure_there_is_named_here_with_its_work_kept() {
    let env = TestEnv::new();
    let (repo, _shim) = project_with_box(&env);
    write(
        &repo.join(".crew/teams/mixed.toml"),
        r#"workspace_mode = "worktree"
[[tasks]]
id = "here"
agent = "shell"
prompt = "echo here > here.txt"

[[tasks]]
id = "there"
agent = "shell"
placement = "box"
prompt = "echo there > there.txt"

[[tasks]]
id = "broken"
agent = "shell"
placement = "box"
prompt = "echo trying > broken.txt; exit 3"
"#,
    );
    let output = env.crew(&repo, ["run", "mixed"]);
    assert!(!output.status.success(), "{}", render_output(&output));
    // crew's own lines in info/exclude (written for the worktree task) are not taken for a
    // placed task's change to the repository's git files.
    assert!(
        !render_output(&output).contains("SECURITY"),
        "{}",
        render_output(&output)
    );
    let run = run_ids(&env, &repo).remove(0);
    let recorded = manifest(&env, &repo, &run);
    for (id, file) in [("here", "here.txt"), ("there", "there.txt")] {
        let record = task(&recorded, id);
        assert_eq!(record["status"], "succeeded", "{record:#}");
        assert_eq!(
            env.git(&repo, ["show", &format!("crew/{run}-{id}:{file}")]),
            format!("{id}\n")
        );
    }
    assert_eq!(
        task(&recorded, "here")["placement"],
        serde_json::Value::Null
    );
    let broken = task(&recorded, "broken");
    assert_eq!(broken["status"], "failed", "{broken:#}");
    let reason = broken["reason"].as_str().unwrap();
    assert!(reason.contains("on box, the task failed"), "{reason}");
    assert!(reason.contains("code 3"), "{reason}");
    // What it did before it failed came back too.
    assert_eq!(
        env.git(&repo, ["show", &format!("crew/{run}-broken:broken.txt")]),
        "trying\n"
    );
}

#[test]
fn a_placement_that_is_not_defined_or_not_whole_is_refused_before_anything_starts() {
    let env = TestEnv::new();
    let (repo, _shim) = project_with_box(&env);
    let refused = env.crew(
        &repo,
        ["run", "--placement", "nowhere", "--agent", "shell", "true"],
    );
    assert!(!refused.status.success());
    let said = render_output(&refused);
    assert!(
        said.contains("`nowhere`") && said.contains("defines: box"),
        "{said}"
    );
    assert!(
        run_ids(&env, &repo).is_empty() || {
            let run = run_ids(&env, &repo).remove(0);
            manifest(&env, &repo, &run)["tasks"][0]["started_at"].is_null()
        }
    );
    // An ssh placement without a host, and a relative dir: named with file, line and key.
    write(
        &repo.join(".crew/config.toml"),
        "[placements.far]\nkind = \"ssh\"\ndir = \"shims\"\n",
    );
    let refused = env.crew(
        &repo,
        ["run", "--placement", "far", "--agent", "shell", "true"],
    );
    assert!(!refused.status.success());
    let said = env.redact(&render_output(&refused));
    assert!(said.contains("config.toml:"), "{said}");
    assert!(said.contains("needs `host`"), "{said}");
    assert!(said.contains("`shims` must be an absolute path"), "{said}");
    // A kubernetes placement needs the image its pods run.
    write(
        &repo.join(".crew/config.toml"),
        "[placements.pods]\nkind = \"kubernetes\"\ndir = \"/work\"\n",
    );
    let refused = env.crew(
        &repo,
        ["run", "--placement", "pods", "--agent", "shell", "true"],
    );
    assert!(!refused.status.success());
    assert!(
        render_output(&refused).contains("a kubernetes placement needs `image`"),
        "{}",
        render_output(&refused)
    );
}

#[test]
fn a_task_on_an_ssh_placement_goes_through_a_real_sshd_and_its_work_comes_back() {
    let env = TestEnv::new();
    let test =
        "placements::a_task_on_an_ssh_placement_goes_through_a_real_sshd_and_its_work_comes_back";
    let Some(sshd) = Sshd::start(&env, test) else {
        return;
    };
    let repo = env.repo("project");
    // The other machine is this one, reached as `crewbox` through a real ssh with the test's
    // own configuration; its crew is this build.
    let far = env.dir("far");
    write(
        &repo.join(".crew/config.toml"),
        &format!(
            "[placements.far]\nkind = \"ssh\"\nhost = \"{}\"\nssh_args = [\"-F\", \"{}\"]\ndir = \"{far}\"\ncrew = \"{}\"\n",
            sshd.alias,
            sshd.config,
            crew_tests::crew_bin()
        ),
    );
    write(
        &repo.join(".crew/teams/split.toml"),
        r#"workspace_mode = "worktree"
[[tasks]]
id = "near"
agent = "shell"
prompt = "echo near > near.txt"

[[tasks]]
id = "far"
agent = "keyed"
placement = "far"
prompt = "echo far > far.txt; printf '%s' \"$TEST_API_KEY\" > key.txt; echo done"
"#,
    );
    // An agent that passes a key from the user's environment: the shim's session over ssh
    // has no such variable, so the agent sees it only if it crossed the connection.
    write(
        &repo.join(".crew/agents/keyed.toml"),
        "command = [\"sh\", \"-c\", \"{prompt}\"]\npass_env = [\"TEST_API_KEY\"]\n",
    );
    let output = env
        .crew_command(&repo)
        .env("TEST_API_KEY", "k-12345")
        .args(["run", "split"])
        .output()
        .unwrap();
    let Some(run) = run_ids(&env, &repo).into_iter().next() else {
        panic!("no run: {}", render_output(&output));
    };
    let log = |task: &str| {
        std::fs::read_to_string(
            repo.join(format!(".crew/state/runs/{run}/tasks/{task}/output.log")),
        )
        .unwrap_or_default()
    };
    assert!(
        output.status.success(),
        "{}\n{}",
        render_output(&output),
        log("far")
    );
    assert!(
        !render_output(&output).contains("SECURITY"),
        "{}",
        render_output(&output)
    );
    let recorded = manifest(&env, &repo, &run);
    for id in ["near", "far"] {
        assert_eq!(task(&recorded, id)["status"], "succeeded", "{recorded:#}");
        assert_eq!(
            env.git(&repo, ["show", &format!("crew/{run}-{id}:{id}.txt")]),
            format!("{id}\n")
        );
    }
    let log = log("far");
    assert!(log.contains(&format!("[far] working in {far}")), "{log}");
    assert!(log.contains("done"), "{log}");
    assert_eq!(
        env.git(&repo, ["show", &format!("crew/{run}-far:key.txt")]),
        "k-12345"
    );
    // The key crossed the connection, and no file of either side's state holds it.
    for state in [repo.join(".crew/state"), far.clone()] {
        let found = std::process::Command::new("grep")
            .args(["-r", "-l", "--exclude-dir=objects", "k-12345"])
            .arg(state.as_str())
            .output()
            .unwrap();
        let files = String::from_utf8_lossy(&found.stdout);
        let leaked: Vec<&str> = files
            .lines()
            .filter(|file| !file.contains("/.worktrees/") && !file.contains("/.pool/"))
            .collect();
        assert!(leaked.is_empty(), "{leaked:?}");
    }
}

#[test]
fn a_lost_connection_interrupts_the_task_saying_where_its_work_is_there() {
    let env = TestEnv::new();
    let (repo, shim) = project_with_box(&env);
    let mut host = env.spawn_crew(
        &repo,
        [
            "run",
            "--placement",
            "box",
            "--agent",
            "shell",
            "echo partial > partial.txt; echo written; sleep 600",
        ],
    );
    let run = cut_when_written(&env, &repo, "shell");
    let ended = crew_tests::wait_until(60, "the run's end", || host.try_wait().unwrap());
    assert!(!ended.success());
    let record = task(&manifest(&env, &repo, &run), "shell").clone();
    assert_eq!(record["status"], "interrupted", "{record:#}");
    let reason = record["reason"].as_str().unwrap();
    assert!(
        reason.contains(
            "the connection to the placement `box` ended before the task's work came back"
        ),
        "{reason}"
    );
    // The work is where the reason says, there.
    let dir = reason
        .split("it is in ")
        .nth(1)
        .and_then(|rest| rest.split(" there").next())
        .unwrap();
    assert!(dir.starts_with(shim.as_str()), "{reason}");
    assert_eq!(
        std::fs::read_to_string(Utf8PathBuf::from(dir).join("partial.txt")).unwrap(),
        "partial\n"
    );
}

#[test]
fn runs_resume_takes_a_placed_task_up_from_the_work_it_left_there_or_brought_back() {
    let env = TestEnv::new();
    let (repo, _shim) = project_with_box(&env);
    // Lost: the transport and its shim die mid-task, the agent's file uncommitted there.
    let mut host = env.spawn_crew(
        &repo,
        [
            "run",
            "--placement",
            "box",
            "--agent",
            "shell",
            "--task",
            "lost=if [ -f partial.txt ]; then echo more > more.txt; else echo partial > partial.txt; echo written; sleep 600; fi",
        ],
    );
    let run = cut_when_written(&env, &repo, "lost");
    crew_tests::wait_until(60, "the run's end", || host.try_wait().unwrap());
    assert_eq!(
        task(&manifest(&env, &repo, &run), "lost")["status"],
        "interrupted"
    );
    let resumed = env.crew(&repo, ["runs", "resume", &run]);
    assert!(resumed.status.success(), "{}", render_output(&resumed));
    let record = task(&manifest(&env, &repo, &run), "lost").clone();
    assert_eq!(record["status"], "succeeded", "{record:#}");
    for (file, text) in [("partial.txt", "partial\n"), ("more.txt", "more\n")] {
        assert_eq!(
            env.git(&repo, ["show", &format!("crew/{run}-lost:{file}")]),
            text,
            "{record:#}"
        );
    }

    // Brought back: the task failed there and its work came back; taken up again, it goes
    // on from that work, and its branch moves on from where it was.
    let output = env.crew(
        &repo,
        [
            "run",
            "--placement",
            "box",
            "--agent",
            "shell",
            "--task",
            "again=if [ -f try.txt ]; then echo fixed > fixed.txt; else echo try > try.txt; exit 3; fi",
        ],
    );
    assert!(!output.status.success());
    let run = run_ids(&env, &repo).remove(0);
    let branch = format!("crew/{run}-again");
    let first = env.git(&repo, ["rev-parse", &branch]).trim().to_owned();
    let resumed = env.crew(&repo, ["runs", "resume", &run]);
    assert!(resumed.status.success(), "{}", render_output(&resumed));
    assert_eq!(
        env.git(&repo, ["show", &format!("{branch}:fixed.txt")]),
        "fixed\n"
    );
    assert_eq!(
        env.git(&repo, ["show", &format!("{branch}:try.txt")]),
        "try\n"
    );
    let ancestor = env.git_output(&repo, ["merge-base", "--is-ancestor", &first, &branch]);
    assert!(
        ancestor.status.success(),
        "the branch moved on from its first tip"
    );
}

/// Against a real cluster: it runs when `KUBECONFIG` names one as the tests are built (see
/// `tests/build.rs`), with `CREW_TEST_KUBE_IMAGE` an image that holds git, a shell and this
/// crew as `/usr/local/bin/crew`. Without a cluster it is reported as ignored, never as passed.
#[test]
#[cfg_attr(
    not(crew_kube_cluster),
    ignore = "needs a Kubernetes cluster: KUBECONFIG (and CREW_TEST_KUBE_IMAGE)"
)]
fn kubernetes_a_task_runs_in_a_pod_of_its_own_and_its_work_comes_back() {
    let kubeconfig =
        std::env::var("KUBECONFIG").expect("KUBECONFIG names the cluster this test runs against");
    let image = std::env::var("CREW_TEST_KUBE_IMAGE")
        .expect("CREW_TEST_KUBE_IMAGE names an image with git, sh and crew in /usr/local/bin");
    let env = TestEnv::new();
    let repo = env.repo("project");
    write(
        &repo.join(".crew/config.toml"),
        &format!(
            "[placements.pod]\nkind = \"kubernetes\"\nimage = \"{image}\"\ndir = \"/tmp/crew-shim\"\ncrew = \"/usr/local/bin/crew\"\n"
        ),
    );
    let output = env
        .crew_command(&repo)
        .env("KUBECONFIG", &kubeconfig)
        .args([
            "run",
            "--placement",
            "pod",
            "--agent",
            "shell",
            "echo pod > pod.txt",
        ])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", render_output(&output));
    let run = run_ids(&env, &repo).remove(0);
    assert_eq!(
        env.git(&repo, ["show", &format!("crew/{run}-shell:pod.txt")]),
        "pod\n"
    );
}

#[test]
fn a_placed_agents_question_is_listed_here_and_a_follow_up_answers_it_there() {
    let env = TestEnv::new();
    let (repo, _shim) = project_with_box(&env);
    let mut host = env.spawn_crew(
        &repo,
        [
            "run",
            "--placement",
            "box",
            "--agent",
            "shell",
            "if [ -z \"$CREW_MESSAGE\" ]; then echo draft > canvas.txt; crew ask 'which color?'; exit 0; fi; echo \"$CREW_MESSAGE\" >> canvas.txt",
        ],
    );
    // Asked there, listed here as this project's agent waiting for its user.
    let agents = crew_tests::wait_until(60, "the question", || {
        let agents = env.agents_json(&repo)?;
        (agents[0]["question"] == "which color?").then_some(agents)
    });
    assert_eq!(agents[0]["agent"], "shell@box", "{agents:#}");
    assert_eq!(agents[0]["activity"], "waiting_for_input", "{agents:#}");
    let answer = env.crew(&repo, ["agents", "follow-up", "shell", "blue"]);
    assert!(answer.status.success(), "{}", render_output(&answer));
    let status = crew_tests::wait_until(60, "the run's end", || host.try_wait().unwrap());
    assert!(status.success());
    let run = run_ids(&env, &repo).remove(0);
    assert_eq!(
        env.git(&repo, ["show", &format!("crew/{run}-shell:canvas.txt")]),
        "draft\nblue\n"
    );
}

/// `crew run --placement box --agent shell PROMPT` in the background, once its task printed
/// `line` there: the host, the run's id and the task's log here.
fn run_placed_until(
    env: &TestEnv,
    repo: &camino::Utf8Path,
    prompt: &str,
    line: &str,
) -> (std::process::Child, String, Utf8PathBuf) {
    let host = env.spawn_crew(
        repo,
        ["run", "--placement", "box", "--agent", "shell", prompt],
    );
    let run = crew_tests::wait_until(30, "the run", || run_ids(env, repo).into_iter().next());
    let log = repo.join(format!(".crew/state/runs/{run}/tasks/shell/output.log"));
    crew_tests::wait_until(60, "the remote agent's line", || {
        std::fs::read_to_string(&log)
            .ok()
            .filter(|log| log.contains(line))
    });
    (host, run, log)
}

#[test]
fn crew_agents_steer_reaches_a_placed_agent_mid_task() {
    let env = TestEnv::new();
    let (repo, _shim) = project_with_box(&env);
    let (mut host, run, log) = run_placed_until(
        &env,
        &repo,
        "echo ready; read line; echo \"got: $line\"; echo \"$line\" > steered.txt",
        "ready",
    );
    let steer = env.crew(&repo, ["agents", "steer", "shell", "go left"]);
    assert!(steer.status.success(), "{}", render_output(&steer));
    let status = crew_tests::wait_until(60, "the run's end", || host.try_wait().unwrap());
    assert!(status.success());
    assert!(
        std::fs::read_to_string(&log)
            .unwrap()
            .contains("got: go left")
    );
    assert_eq!(
        env.git(&repo, ["show", &format!("crew/{run}-shell:steered.txt")]),
        "go left\n"
    );
}

#[test]
fn crew_agents_stop_stops_a_placed_agent_and_its_work_still_comes_back() {
    let env = TestEnv::new();
    let (repo, _shim) = project_with_box(&env);
    let (mut host, run, _log) = run_placed_until(
        &env,
        &repo,
        "echo begun > begun.txt; echo written; sleep 600",
        "written",
    );
    let stop = env.crew(&repo, ["agents", "stop", "shell"]);
    assert!(stop.status.success(), "{}", render_output(&stop));
    crew_tests::wait_until(60, "the run's end", || host.try_wait().unwrap());
    let record = task(&manifest(&env, &repo, &run), "shell").clone();
    assert_eq!(record["status"], "stopped", "{record:#}");
    // Stopped there gracefully: what it did came back, checked, as its branch here.
    assert_eq!(
        env.git(&repo, ["show", &format!("crew/{run}-shell:begun.txt")]),
        "begun\n"
    );
}

#[test]
fn a_kubernetes_placement_without_a_cluster_says_why_in_the_tasks_reason() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    write(
        &repo.join(".crew/config.toml"),
        "[placements.pod]\nkind = \"kubernetes\"\nimage = \"registry.invalid/agents:1\"\ndir = \"/tmp/crew-shim\"\n",
    );
    // The hermetic environment names no cluster: no KUBECONFIG, an empty home, no pod's
    // service account.
    let output = env.crew(
        &repo,
        ["run", "--placement", "pod", "--agent", "shell", "true"],
    );
    assert!(!output.status.success(), "{}", render_output(&output));
    let run = run_ids(&env, &repo).remove(0);
    let recorded = crate::common::runs::manifest(&env, &repo, &run);
    let reason = crate::common::runs::task(&recorded, "shell")["reason"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        reason.contains("ended before the task started")
            && reason.contains("the transport said: error: kubernetes: no cluster to reach"),
        "{reason}"
    );
}
