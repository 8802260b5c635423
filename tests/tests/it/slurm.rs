//! Tasks as Slurm jobs, against a real one-node cluster the tests start themselves
//! (`common/slurm.rs`): `srun` carries the shim protocol, Slurm's states are the task's.

use camino::{Utf8Path, Utf8PathBuf};
use crew_tests::{TestEnv, render_output, wait_until, write};

use crate::common::runs::{manifest, run_ids, task, task_once};
use crew_tests::slurm::Slurm;

/// A project whose placement `hpc` is the cluster's partition, its clones beneath the home of
/// whoever the job runs as (no shell expands `~` there: the shim does), `extra` added to it.
fn project(env: &TestEnv, extra: &str) -> Utf8PathBuf {
    let repo = env.repo("project");
    write(
        &repo.join(".crew/config.toml"),
        &format!(
            "[placements.hpc]\nkind = \"slurm\"\npartition = \"crew\"\ndir = \"~/far\"\ncrew = \"{}\"\n{extra}",
            crew_tests::crew_bin()
        ),
    );
    repo
}

/// `crew …` in `repo` with the cluster's `SLURM_CONF`.
fn crew(env: &TestEnv, slurm: &Slurm, repo: &Utf8Path, args: &[&str]) -> std::process::Output {
    env.crew_command(repo)
        .env("SLURM_CONF", slurm.conf.as_str())
        .args(args)
        .output()
        .unwrap()
}

fn spawn(env: &TestEnv, slurm: &Slurm, repo: &Utf8Path, args: &[&str]) -> Host {
    Host(
        env.crew_command(repo)
            .env("SLURM_CONF", slurm.conf.as_str())
            .args(args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    )
}

/// A `crew run` in the background, killed (with its agents, `srun` among them) should the
/// test end before it does.
struct Host(std::process::Child);

impl Host {
    fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        self.0.wait()
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        // Ended already (waited for), or killed now.
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A one-task run of the shell agent on `hpc`, in the background: the host, to wait for.
fn run_placed(env: &TestEnv, slurm: &Slurm, repo: &Utf8Path, prompt: &str) -> Host {
    let args = [
        "run",
        "--placement",
        "hpc",
        "--workspace-mode",
        "worktree",
        "--agent",
        "shell",
    ];
    let mut all = args.to_vec();
    all.push(prompt);
    spawn(env, slurm, repo, &all)
}

fn log(repo: &Utf8Path, run: &str, task: &str) -> String {
    std::fs::read_to_string(repo.join(format!(".crew/state/runs/{run}/tasks/{task}/output.log")))
        .unwrap_or_default()
}

#[test]
fn tasks_run_as_slurm_jobs_one_queued_behind_the_other_and_their_work_comes_back() {
    let env = TestEnv::new();
    let test =
        "slurm::tasks_run_as_slurm_jobs_one_queued_behind_the_other_and_their_work_comes_back";
    let Some(slurm) = Slurm::start(&env, test, 1) else {
        return;
    };
    let repo = project(&env, "");
    // One CPU: the second job waits for the first.
    write(
        &repo.join(".crew/teams/pair.toml"),
        "workspace_mode = \"worktree\"\nmax_parallel = 2\nplacement = \"hpc\"\n[[tasks]]\nid = \"first\"\nagent = \"shell\"\nprompt = \"echo one > one.txt; sleep 4; echo done\"\n[[tasks]]\nid = \"second\"\nagent = \"shell\"\nprompt = \"echo two > two.txt\"\n",
    );
    let mut host = spawn(&env, &slurm, &repo, &["run", "pair"]);
    let (run, _) = task_once(&env, &repo, "second", "the run to start", |_| true);
    // Whichever job Slurm took second waits, and its task says so.
    let queued = wait_until(60, "a task to say it is queued in Slurm", || {
        ["first", "second"]
            .into_iter()
            .find(|id| log(&repo, &run, id).contains("pending in Slurm: Resources (job "))
    });
    // Slurm's own listing tells crew's jobs apart: named and commented for project, run and task.
    let jobs = slurm.jobs();
    let project_id = std::fs::canonicalize(&repo).unwrap().display().to_string();
    for id in ["first", "second"] {
        assert!(
            jobs.lines()
                .any(|line| line.contains(&format!("|crew-{run}-{id}|"))
                    && line.ends_with(&format!("crew project={project_id} run={run} task={id}"))),
            "{jobs}"
        );
    }
    assert!(jobs.contains("|PENDING|Resources|"), "{jobs}");
    // The board's and the listings' view of it: its last line.
    wait_until(30, "the listing to show it queued", || {
        let listed = crew(&env, &slurm, &repo, &["agents", "list"]);
        String::from_utf8_lossy(&listed.stdout)
            .lines()
            .any(|line| {
                line.contains(&format!(":{queued} "))
                    && line.contains("pending in Slurm: Resources")
            })
            .then_some(())
    });
    let status = host.wait().unwrap();
    let recorded = manifest(&env, &repo, &run);
    assert!(
        status.success(),
        "{recorded:#}\n{}\n{}",
        log(&repo, &run, "second"),
        slurm.logs()
    );
    for (id, file, text) in [
        ("first", "one.txt", "one\n"),
        ("second", "two.txt", "two\n"),
    ] {
        assert_eq!(task(&recorded, id)["status"], "succeeded");
        assert_eq!(
            env.git(&repo, ["show", &format!("crew/{run}-{id}:{file}")]),
            text
        );
    }
    assert!(slurm.jobs().contains("|COMPLETED|"), "{}", slurm.jobs());
    // `crew sandbox check` says what the placement needs on its nodes.
    let check = crew(&env, &slurm, &repo, &["sandbox", "check"]);
    let said = String::from_utf8_lossy(&check.stdout).into_owned();
    assert!(
        said.contains("placement hpc (slurm): reached through `srun`, found here")
            && said.contains("on its nodes (partition crew): git,")
            && said.contains("caps are the job's (--mem, --cpus-per-task)"),
        "{}",
        render_output(&check)
    );
    // Another project lists nothing of it.
    let other = env.repo("other");
    let listed = crew(&env, &slurm, &other, &["agents", "list", "--all-runs"]);
    assert!(
        !String::from_utf8_lossy(&listed.stdout).contains(&run),
        "{}",
        render_output(&listed)
    );
}

#[test]
fn a_stop_ends_the_job_through_slurm_and_the_work_comes_back() {
    let env = TestEnv::new();
    let test = "slurm::a_stop_ends_the_job_through_slurm_and_the_work_comes_back";
    let Some(slurm) = Slurm::start(&env, test, 2) else {
        return;
    };
    let repo = project(&env, "");
    let mut host = run_placed(
        &env,
        &slurm,
        &repo,
        "echo kept > kept.txt; echo working; sleep 300",
    );
    let (run, _) = task_once(&env, &repo, "shell", "the task to run", |record| {
        record["status"] == "running"
    });
    wait_until(60, "the agent to work there", || {
        log(&repo, &run, "shell").contains("working").then_some(())
    });
    let stopped = crew(
        &env,
        &slurm,
        &repo,
        &["agents", "stop", &format!("{run}:shell")],
    );
    assert!(stopped.status.success(), "{}", render_output(&stopped));
    host.wait().unwrap();
    let record = task(&manifest(&env, &repo, &run), "shell").clone();
    assert_eq!(
        record["status"],
        "stopped",
        "{record:#}\n{}",
        log(&repo, &run, "shell")
    );
    assert_eq!(
        env.git(&repo, ["show", &format!("crew/{run}-shell:kept.txt")]),
        "kept\n"
    );
    let jobs = slurm.jobs();
    assert!(!jobs.contains("|RUNNING|"), "the job ended: {jobs}");
}

#[test]
fn a_failed_node_interrupts_the_task_naming_its_work_and_a_resume_brings_it_back() {
    let env = TestEnv::new();
    let test =
        "slurm::a_failed_node_interrupts_the_task_naming_its_work_and_a_resume_brings_it_back";
    let Some(slurm) = Slurm::start(&env, test, 2) else {
        return;
    };
    let repo = project(&env, "");
    // Works until stopped the first time; taken up again on its own work, it finishes.
    let prompt = "if [ -e begun.txt ]; then echo again >> begun.txt; else echo begun > begun.txt; echo working; sleep 600; fi";
    let mut host = run_placed(&env, &slurm, &repo, prompt);
    let (run, _) = task_once(&env, &repo, "shell", "the task to run", |record| {
        record["status"] == "running"
    });
    wait_until(60, "the agent to work there", || {
        log(&repo, &run, "shell").contains("working").then_some(())
    });
    let node = format!("nodename={}", slurm.node);
    let down = slurm
        .command("scontrol")
        .args(["update", &node, "state=down", "reason=crew-test"])
        .output()
        .unwrap();
    assert!(down.status.success(), "{}", render_output(&down));
    host.wait().unwrap();
    let record = task(&manifest(&env, &repo, &run), "shell").clone();
    assert_eq!(record["status"], "interrupted", "{record:#}");
    let reason = record["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("Slurm ended its job ")
            && reason.contains("when its node failed (NODE_FAIL)")
            && reason.contains("/far/")
            && reason.contains("on the branch crew/"),
        "{reason}"
    );
    // The node is back (resumed, or back by itself on its daemon's next word): the resume
    // takes the task up from the work it left there.
    wait_until(60, "the node to be back", || {
        let state = slurm
            .command("sinfo")
            .args(["-h", "-o", "%T"])
            .output()
            .unwrap();
        if String::from_utf8_lossy(&state.stdout).trim() == "idle" {
            return Some(());
        }
        // Refused while it is not down any more: the next look sees it.
        let _ = slurm
            .command("scontrol")
            .args(["update", &node, "state=resume"])
            .output();
        None
    });
    let resumed = crew(&env, &slurm, &repo, &["runs", "resume", &run]);
    let record = task(&manifest(&env, &repo, &run), "shell").clone();
    assert!(
        resumed.status.success(),
        "{}\n{record:#}\n{}",
        render_output(&resumed),
        log(&repo, &run, "shell")
    );
    assert_eq!(
        env.git(&repo, ["show", &format!("crew/{run}-shell:begun.txt")]),
        "begun\nagain\n"
    );
}

#[test]
fn a_task_over_slurm_s_time_limit_fails_naming_it() {
    let env = TestEnv::new();
    let test = "slurm::a_task_over_slurm_s_time_limit_fails_naming_it";
    let Some(slurm) = Slurm::start(&env, test, 2) else {
        return;
    };
    // Slurm's shortest limit is a minute, checked every half minute or so.
    let repo = project(&env, "time_limit = \"1\"\n");
    let mut host = run_placed(
        &env,
        &slurm,
        &repo,
        "echo begun > begun.txt; echo working; sleep 600",
    );
    let status = host.wait().unwrap();
    assert!(!status.success());
    let run = run_ids(&env, &repo).remove(0);
    let record = task(&manifest(&env, &repo, &run), "shell").clone();
    assert_eq!(record["status"], "failed", "{record:#}\n{}", slurm.jobs());
    let reason = record["reason"].as_str().unwrap();
    assert!(
        reason.contains("Slurm ended its job ") && reason.contains("at its time limit (TIMEOUT)"),
        "{reason}\n{}",
        log(&repo, &run, "shell")
    );
    assert!(
        reason.contains("its work came back") || reason.contains("/far/"),
        "where its work is: {reason}"
    );
    assert!(slurm.jobs().contains("|TIMEOUT|"), "{}", slurm.jobs());
}

#[test]
fn a_steer_reaches_the_agent_in_its_slurm_job() {
    let env = TestEnv::new();
    let test = "slurm::a_steer_reaches_the_agent_in_its_slurm_job";
    let Some(slurm) = Slurm::start(&env, test, 2) else {
        return;
    };
    let repo = project(&env, "");
    let mut host = run_placed(
        &env,
        &slurm,
        &repo,
        "echo waiting; read line; echo \"$line\" > steered.txt",
    );
    let (run, _) = task_once(&env, &repo, "shell", "the task to run", |record| {
        record["status"] == "running"
    });
    wait_until(60, "the agent to wait there", || {
        log(&repo, &run, "shell").contains("waiting").then_some(())
    });
    let steered = crew(
        &env,
        &slurm,
        &repo,
        &["agents", "steer", &format!("{run}:shell"), "over srun"],
    );
    assert!(steered.status.success(), "{}", render_output(&steered));
    assert!(
        host.wait().unwrap().success(),
        "{}",
        log(&repo, &run, "shell")
    );
    assert_eq!(
        env.git(&repo, ["show", &format!("crew/{run}-shell:steered.txt")]),
        "over srun\n"
    );
}
