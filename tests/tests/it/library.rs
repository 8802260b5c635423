//! The library's front door as a program embedding crew uses it: its examples, and two
//! project folders held by one process.

use std::sync::Arc;
use std::time::Duration;

use crew_core::provider::land::LandError;
use crew_core::{CancelCause, CancelRecord, RunStatus};
use crew_live::control::{ErrorCode, Op};
use crew_live::{Host, HostOptions, LandOptions, LandWorkError, Project, RunSpec};
use crew_tests::{TestEnv, helper_bin, render_output, write};
use crew_worktree::CrewWorkspaces;

#[test]
fn the_examples_run_and_show_what_they_say() {
    let env = TestEnv::new();
    for (example, expected) in [
        (
            "run_team",
            &[
                "task greet succeeded",
                "task count succeeded",
                ":greet: said hello",
                "run completed",
                "greet: its work is on crew/",
            ][..],
        ),
        (
            "two_projects",
            &[
                ":left",
                ":right",
                "refused: no live agent",
                "left stopped",
                "cancelled",
            ][..],
        ),
    ] {
        let bin = helper_bin(&format!("examples/{example}"));
        assert!(
            bin.exists(),
            "{bin} is missing: run the tests with `cargo test --workspace`, which builds the examples"
        );
        let output = env
            .hermetic(&mut std::process::Command::new(&bin))
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{example}: {}",
            render_output(&output)
        );
        let stdout = String::from_utf8(output.stdout).unwrap();
        for line in expected {
            assert!(
                stdout.contains(line),
                "{example} printed no {line:?}:\n{stdout}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_project_folders_in_one_process_each_see_and_control_only_their_own() {
    let env = TestEnv::new();
    let mut projects = Vec::new();
    let mut hosts = Vec::new();
    let mut runs = Vec::new();
    for name in ["left", "right"] {
        let repo = env.repo(name);
        write(
            &repo.join(".crew/teams/work.toml"),
            &format!(
                "[[tasks]]\nid = \"{name}\"\nagent = \"shell\"\nprompt = \"echo {name} > {name}.txt; sleep 600\"\nworkspace_mode = \"worktree\"\n"
            ),
        );
        env.git(&repo, ["add", ".crew"]);
        env.git(&repo, ["commit", "-q", "-m", "a team"]);
        let project = Project::open(repo.as_std_path(), |config| {
            Arc::new(CrewWorkspaces::new(config))
        })
        .unwrap();
        let options = HostOptions {
            label: format!("test host of {name}"),
            crew_dir: None,
        };
        let host = Host::start(&project, options).await.unwrap();
        let spec = RunSpec::of(project.config_dir().load_team("work").unwrap());
        let manifest = host.create(&spec).await.unwrap();
        runs.push(host.start_run(&manifest.run_id, Default::default()));
        projects.push(project);
        hosts.push(host);
    }
    let mut seen = Vec::new();
    for project in &projects {
        let agents = loop {
            let live = project.live_agents().await;
            if !live.agents.is_empty() {
                break live.agents;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let ids: Vec<String> = agents
            .iter()
            .map(|(agent, _)| agent.agent_id.task_id().to_string())
            .collect();
        seen.push((ids, agents));
    }
    assert_eq!(seen[0].0, ["left"]);
    assert_eq!(seen[1].0, ["right"]);

    // The left folder reaches the right host's socket, and is refused there for every
    // operation on the right folder's agent: the agent receives nothing.
    let (right_agent, right_host) = &seen[1].1[0];
    let right = right_agent.agent_id.to_string();
    for op in [
        Op::Stop {
            agent: right.clone(),
        },
        Op::Steer {
            agent: right.clone(),
            message: "from the left".into(),
        },
        Op::FollowUp {
            agent: right.clone(),
            message: "from the left".into(),
        },
        Op::Resume {
            agent: right.clone(),
            message: None,
        },
    ] {
        let response = projects[0].call(right_host, op).await.unwrap();
        let error = response.answer.expect_err("refused");
        assert_eq!(error.code, ErrorCode::ForeignWorkspace, "{}", error.message);
    }
    let listed = projects[0].call(right_host, Op::List).await.unwrap();
    assert_eq!(
        listed.answer,
        Ok(serde_json::json!([])),
        "the right host lists nothing for the left folder"
    );
    // Cancelling the right folder's run from the left one: no run of the left's, said so.
    let right_run = right_agent.agent_id.run_id().clone();
    let refused = projects[0].cancel_run(&right_run, true).await;
    assert!(
        matches!(
            refused,
            Err(crew_live::CancelRunError::State(
                crew_core::store::StateError::UnknownRun { .. }
            ))
        ),
        "{refused:?}"
    );

    for (run, project) in runs.into_iter().zip(&projects) {
        run.canceller()
            .cancel(CancelRecord::new(CancelCause::Interrupt))
            .await;
        let finished = run.finish().await.unwrap();
        assert_eq!(finished.status, RunStatus::Cancelled);
        let task = &finished.tasks[0];
        let branch = task
            .teardown
            .as_ref()
            .and_then(|report| report.branch.clone())
            .unwrap();
        let repo = project.workspace().root();
        let files = env.git(repo, ["ls-tree", "-r", "--name-only", &branch]);
        assert!(
            files.contains(&format!("{}.txt", task.id)),
            "the work is on its branch: {files}"
        );
    }
}

/// A host that closes — by `close`, or dropped, as an editor closing a folder drops it — stops
/// its runs as a first Ctrl-C does: no agent goes on that nobody could reach, and the work is
/// on its branch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_or_dropping_a_host_stops_its_agents_and_keeps_their_work() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    write(
        &repo.join(".crew/teams/work.toml"),
        "[[tasks]]\nid = \"long\"\nagent = \"shell\"\nprompt = \"echo kept > kept.txt; sleep 600\"\nworkspace_mode = \"worktree\"\n",
    );
    env.git(&repo, ["add", ".crew"]);
    env.git(&repo, ["commit", "-q", "-m", "a team"]);
    let project = Project::open(repo.as_std_path(), |config| {
        Arc::new(CrewWorkspaces::new(config))
    })
    .unwrap();
    for closing in ["close", "drop"] {
        let options = HostOptions {
            label: format!("a host to {closing}"),
            crew_dir: None,
        };
        let host = Host::start(&project, options).await.unwrap();
        let spec = RunSpec::of(project.config_dir().load_team("work").unwrap());
        let manifest = host.create(&spec).await.unwrap();
        let running = host.start_run(&manifest.run_id, Default::default());
        // Running, and its work written.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let pid = loop {
            assert!(std::time::Instant::now() < deadline, "{closing}: never ran");
            let live = project.live_agents().await.agents;
            let written = project
                .store()
                .read_run(&manifest.run_id)
                .ok()
                .and_then(|manifest| manifest.tasks[0].workspace.clone())
                .is_some_and(|workspace| workspace.root.join("kept.txt").exists());
            if let Some(pid) = live.first().and_then(|(agent, _)| agent.pid)
                && written
            {
                break pid;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        match closing {
            "close" => host.close().await,
            _ => drop(host),
        }
        let finished = tokio::time::timeout(Duration::from_secs(60), running.finish())
            .await
            .unwrap_or_else(|_| panic!("{closing}: the run went on after its host closed"))
            .unwrap();
        assert_eq!(finished.status, RunStatus::Cancelled, "{closing}");
        assert_eq!(
            finished.cancelled_by.as_ref().map(|by| by.cause),
            Some(CancelCause::HostClosed),
            "{closing}"
        );
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "{closing}: the agent (pid {pid}) outlived its host"
        );
        let branch = finished.tasks[0]
            .teardown
            .as_ref()
            .and_then(|report| report.branch.clone())
            .unwrap();
        let files = env.git(&repo, ["ls-tree", "-r", "--name-only", &branch]);
        assert!(files.contains("kept.txt"), "{closing}: {files}");
        assert!(project.live_agents().await.agents.is_empty(), "{closing}");
    }
}

/// Landing through the front door: a conflict comes back as a typed error naming the task and
/// its agent, with the target where it was; the other task lands, and says what moved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_program_lands_work_and_reads_a_conflict_as_a_typed_error() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    write(
        &repo.join(".crew/teams/both.toml"),
        "workspace_mode = \"worktree\"\n[[tasks]]\nid = \"one\"\nagent = \"shell\"\nprompt = \"echo one > same.txt\"\n[[tasks]]\nid = \"two\"\nagent = \"shell\"\nprompt = \"echo two > same.txt\"\n",
    );
    env.git(&repo, ["add", ".crew"]);
    env.git(&repo, ["commit", "-q", "-m", "a team"]);
    let project = Project::open(repo.as_std_path(), |config| {
        Arc::new(CrewWorkspaces::new(config))
    })
    .unwrap();
    let host = Host::start(&project, HostOptions::default()).await.unwrap();
    let spec = RunSpec::of(project.config_dir().load_team("both").unwrap());
    let manifest = host.create(&spec).await.unwrap();
    let finished = host
        .start_run(&manifest.run_id, Default::default())
        .finish()
        .await
        .unwrap();
    assert_eq!(finished.status, RunStatus::Completed);
    let run = finished.run_id.to_string();
    let main = env.git(&repo, ["rev-parse", "main"]);

    let refused = project.land(std::slice::from_ref(&run), &LandOptions::default());
    let Err(LandWorkError::Land {
        error,
        into,
        agent,
        several,
    }) = refused
    else {
        panic!("expected the provider's refusal, got {refused:?}");
    };
    let LandError::Conflict { task, files, .. } = *error else {
        panic!("expected a typed conflict, got {error:?}");
    };
    assert_eq!((task.as_str(), into.as_str()), ("two", "main"));
    assert_eq!(files, ["same.txt"]);
    assert_eq!(agent.as_deref(), Some("shell"));
    assert!(several);
    assert_eq!(env.git(&repo, ["rev-parse", "main"]), main, "nothing moved");

    let landed = project
        .land(&[format!("{run}:one")], &LandOptions::default())
        .unwrap();
    assert_eq!(
        (landed.into.as_str(), landed.tasks.as_slice()),
        ("main", &["one".to_owned()][..])
    );
    assert_eq!(landed.from.trim(), main.trim());
    assert_eq!(env.git(&repo, ["rev-parse", "main"]).trim(), landed.to);
    assert_eq!(
        std::fs::read_to_string(repo.join("same.txt")).unwrap(),
        "one\n"
    );
    host.close().await;
}
