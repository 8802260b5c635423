//! A task never takes the machine down (DESIGN §8c): its agent and everything it starts run
//! under caps the kernel holds — memory, CPU, processes — in a cgroup of its own, which the
//! agent cannot leave or change. Real cgroups: v1 here (root), v2 where crew has a delegated
//! subtree.

use camino::Utf8Path;
use crew_tests::{TestEnv, render_output, write};

use crate::common::runs::{manifest, run_ids, task};

/// The cgroups crew caps agents with here; `None` (the test says it was skipped) where there
/// are none — except where `CREW_TESTS_REQUIRE_CGROUPS` is set (CI): there that fails.
fn cgroups(test: &str) -> Option<crew_live::caps::Cgroups> {
    match crew_live::caps::Cgroups::find() {
        Ok(found) => Some(found),
        Err(why) => {
            assert!(
                std::env::var_os("CREW_TESTS_REQUIRE_CGROUPS").is_none(),
                "{test}: no cgroup can be had here: {why}"
            );
            eprintln!("skipped {test}: no cgroup can be had here: {why}");
            None
        }
    }
}

/// A team of shell tasks, each `(id, prompt, its [tasks.resources] lines)`.
fn team(repo: &Utf8Path, tasks: &[(&str, &str, &str)]) {
    let mut text = String::new();
    for (id, prompt, resources) in tasks {
        text.push_str(&format!(
            "[[tasks]]\nid = \"{id}\"\nagent = \"shell\"\nprompt = '''{prompt}'''\n"
        ));
        if !resources.is_empty() {
            text.push_str(&format!("[tasks.resources]\n{resources}\n"));
        }
    }
    write(&repo.join(".crew/teams/capped.toml"), &text);
}

/// `crew run --agent shell <args…> <script>` in `repo`: its output and its one task's record.
fn shell_run(
    env: &TestEnv,
    repo: &Utf8Path,
    args: &[&str],
    script: &str,
) -> (std::process::Output, serde_json::Value) {
    let mut all = vec!["run", "--agent", "shell"];
    all.extend(args);
    all.push(script);
    let output = env.crew(repo, &all);
    let recorded = run_ids(env, repo)
        .first()
        .map(|run| task(&manifest(env, repo, run), "shell").clone())
        .unwrap_or_default();
    (output, recorded)
}

#[test]
fn an_agent_over_its_memory_cap_fails_naming_it_and_keeps_its_work_while_a_sibling_finishes() {
    if cgroups("memory cap").is_none() {
        return;
    }
    let env = TestEnv::new();
    let repo = env.repo("project");
    team(
        &repo,
        &[
            (
                "greedy",
                "echo before > before.txt; exec python3 -c 'x = bytearray(400 << 20); import time; time.sleep(30)'",
                "memory = \"128MiB\"",
            ),
            ("modest", "echo fine > fine.txt", "memory = \"128MiB\""),
        ],
    );
    let output = env.crew(&repo, ["run", "capped", "--workspace-mode", "worktree"]);
    assert_eq!(output.status.code(), Some(1), "{}", render_output(&output));
    let run = run_ids(&env, &repo).remove(0);
    let recorded = manifest(&env, &repo, &run);
    let greedy = task(&recorded, "greedy");
    assert_eq!(greedy["status"], "failed", "{greedy:#}");
    let reason = greedy["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("memory cap (128MiB)") && reason.contains("MiB at most"),
        "{greedy:#}"
    );
    assert!(
        greedy["used"]["oom_kills"].as_u64().unwrap_or(0) >= 1,
        "{greedy:#}"
    );
    assert_eq!(greedy["sandbox"]["cgroup"], "cgroup v1", "{greedy:#}");
    // Its work before the cap is on its branch.
    assert_eq!(
        env.git(&repo, ["show", &format!("crew/{run}-greedy:before.txt")]),
        "before\n"
    );
    let modest = task(&recorded, "modest");
    assert_eq!(modest["status"], "succeeded", "{modest:#}");
    assert!(
        modest["used"]["peak_memory"].as_u64().unwrap_or(0) > 0,
        "{modest:#}"
    );
}

#[test]
fn a_process_of_the_agent_killed_at_the_cap_is_a_warning_and_the_agent_goes_on() {
    if cgroups("a process at the cap").is_none() {
        return;
    }
    let env = TestEnv::new();
    let repo = env.repo("project");
    let (output, recorded) = shell_run(
        &env,
        &repo,
        &["--memory", "128MiB"],
        "python3 -c 'x = bytearray(400 << 20)'; echo went on > after.txt",
    );
    assert!(output.status.success(), "{}", render_output(&output));
    assert_eq!(
        std::fs::read_to_string(repo.join("after.txt")).unwrap(),
        "went on\n"
    );
    assert!(
        recorded["warnings"]
            .to_string()
            .contains("killed 1 of the agent's processes at its memory cap (128MiB)"),
        "{recorded:#}"
    );
}

#[test]
fn a_fork_loop_stops_at_its_processes_cap_and_nothing_outlives_the_task() {
    if cgroups("processes cap").is_none() {
        return;
    }
    let env = TestEnv::new();
    let repo = env.repo("project");
    let (output, recorded) = shell_run(
        &env,
        &repo,
        &["--processes", "16"],
        "for i in $(seq 64); do sleep 30 & done; wait",
    );
    // The shell cannot fork past the cap and gives up (dash: "Cannot fork"): the loop ended.
    assert_eq!(output.status.code(), Some(1), "{}", render_output(&output));
    let run = run_ids(&env, &repo).remove(0);
    assert!(
        recorded["warnings"]
            .to_string()
            .contains("reached its cap of 16 processes"),
        "{recorded:#}"
    );
    // Its sleepers went with it.
    let marker = crew_live::procscan::run_marker(&crew_core::RunId::parse(&run).unwrap());
    let left: Vec<u32> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
        .filter(|pid| crew_live::procscan::carries_marker(*pid, &marker))
        .collect();
    assert!(left.is_empty(), "{left:?} outlived the task");
}

#[test]
fn a_spinning_task_with_half_a_cpu_uses_about_half_a_cpu() {
    if cgroups("cpu cap").is_none() {
        return;
    }
    let env = TestEnv::new();
    let repo = env.repo("project");
    let (output, recorded) = shell_run(
        &env,
        &repo,
        &["--cpus", "0.5"],
        "timeout 3 sh -c 'while :; do :; done'; true",
    );
    assert!(output.status.success(), "{}", render_output(&output));
    let cpu = recorded["used"]["cpu_ms"].as_u64().unwrap_or(u64::MAX);
    // Three seconds spinning: 3,000 ms of CPU uncapped on an idle core, 1,500 at half a CPU.
    assert!(
        cpu <= 2_000,
        "{cpu} ms of CPU in 3 s at half a CPU: {recorded:#}"
    );
}

#[test]
fn a_hostile_agent_cannot_leave_its_cgroup_or_raise_its_caps() {
    if cgroups("hostile caps").is_none() {
        return;
    }
    let env = TestEnv::new();
    let repo = env.repo("project");
    // Its own group in each hierarchy, from /proc/self/cgroup: raise its memory cap, move itself
    // to its parent group, then allocate past the cap it had.
    let script = r#"
for line in $(cat /proc/self/cgroup); do
  path=${line#*:*:}; names=${line#*:}; names=${names%%:*}
  for name in $(echo $names | tr , ' '); do
    dir=/sys/fs/cgroup/$name$path
    [ -d "$dir" ] || continue
    echo 99999999999 > $dir/memory.limit_in_bytes 2>/dev/null && echo "raised $name" >> tried.txt
    echo max > $dir/pids.max 2>/dev/null && echo "raised pids $name" >> tried.txt
    echo $$ > $dir/../cgroup.procs 2>/dev/null && echo "left $name" >> tried.txt
  done
done
touch tried.txt
exec python3 -c 'x = bytearray(400 << 20)'
"#;
    let (output, recorded) = shell_run(&env, &repo, &["--memory", "128MiB"], script);
    assert_eq!(output.status.code(), Some(1), "{}", render_output(&output));
    assert_eq!(
        std::fs::read_to_string(repo.join("tried.txt")).unwrap(),
        "",
        "the agent changed its cgroup"
    );
    assert!(
        recorded["reason"]
            .as_str()
            .is_some_and(|reason| reason.contains("memory cap (128MiB)")),
        "{recorded:#}"
    );
}

#[test]
fn caps_that_no_cgroup_can_hold_refuse_the_start_unless_running_uncapped_was_allowed() {
    use std::os::unix::process::CommandExt;
    // An ordinary user without a delegated cgroup has none to hold caps with: `nobody` here.
    if !crew_tests::can_drop_to_nobody() {
        return;
    }
    let env = TestEnv::reachable_by_others();
    let repo = env.repo("project");
    env.hand_to_nobody();
    let as_nobody = |args: &[&str]| {
        let mut command = env.crew_command_for_others(&repo);
        command
            .args(["run", "--agent", "shell", "--memory", "1GiB"])
            .args(args)
            .uid(crew_tests::NOBODY)
            .gid(crew_tests::NOBODY);
        command.output().unwrap()
    };
    let refused = as_nobody(&["echo hi > ran.txt"]);
    let shown = render_output(&refused);
    assert!(!refused.status.success(), "{shown}");
    assert!(
        shown.contains("its caps cannot be held") && shown.contains("--allow-uncapped"),
        "{shown}"
    );
    assert!(!repo.join("ran.txt").exists(), "the agent ran uncapped");
    let allowed = as_nobody(&["--allow-uncapped", "echo hi > ran.txt"]);
    assert!(allowed.status.success(), "{}", render_output(&allowed));
    assert_eq!(
        std::fs::read_to_string(repo.join("ran.txt")).unwrap(),
        "hi\n"
    );
    let run = run_ids(&env, &repo).remove(0);
    let recorded = task(&manifest(&env, &repo, &run), "shell").clone();
    assert!(
        recorded["warnings"]
            .to_string()
            .contains("ran without its caps, as --allow-uncapped allowed"),
        "{recorded:#}"
    );
}

#[test]
fn caps_no_task_can_run_under_are_refused_before_anything_starts() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let (output, _) = shell_run(&env, &repo, &["--processes", "2"], "echo hi");
    let shown = render_output(&output);
    assert_eq!(output.status.code(), Some(2), "{shown}");
    assert!(shown.contains("give at least 8"), "{shown}");
    assert!(run_ids(&env, &repo).is_empty(), "a run was made");
}

#[test]
fn a_placed_task_is_held_to_its_caps_where_it_runs() {
    if cgroups("placed caps").is_none() {
        return;
    }
    let env = TestEnv::new();
    let repo = env.repo("project");
    let shim = env.dir("box");
    write(
        &repo.join(".crew/config.toml"),
        &format!("[placements.box]\nkind = \"local\"\ndir = \"{shim}\"\n"),
    );
    let (output, recorded) = shell_run(
        &env,
        &repo,
        &["--placement", "box", "--memory", "128MiB"],
        "exec python3 -c 'x = bytearray(400 << 20); import time; time.sleep(30)'",
    );
    assert_eq!(output.status.code(), Some(1), "{}", render_output(&output));
    assert!(
        recorded["reason"]
            .to_string()
            .contains("memory cap (128MiB)"),
        "{recorded:#}"
    );
}

#[test]
fn crew_agents_list_shows_a_capped_agent_s_memory_and_cpu_now() {
    if cgroups("memory now").is_none() {
        return;
    }
    let env = TestEnv::new();
    let repo = env.repo("project");
    let go = crew_tests::signal(&repo, "memory-now");
    let script = format!(
        "python3 -c 'import os, time\nx = bytearray(64 << 20)\nwhile not os.path.exists(\"{go}\"): time.sleep(0.05)'"
    );
    let mut host = env.spawn_crew(
        &repo,
        ["run", "--agent", "shell", "--memory", "256MiB", &script],
    );
    let using = crew_tests::wait_until(30, "the agent's memory to be listed", || {
        let agents = env.agents_json(&repo)?;
        let using = agents.as_array()?.first()?["using"].clone();
        (using["memory"].as_u64()? >= 64 << 20).then_some(using)
    });
    assert!(using["cpu_ms"].as_u64().is_some(), "{using}");
    let shown = env.crew(&repo, ["agents", "list"]);
    let text = String::from_utf8_lossy(&shown.stdout).into_owned();
    assert!(text.contains("MEM") && text.contains(" MiB"), "{text}");
    write(&go, "");
    host.wait().unwrap();
}
