//! Where the command line's output goes: readers that stop, outputs that take no writes, closed descriptors.

use super::*;

#[test]
fn runs_list_shows_the_newest_runs_and_says_how_many_more_there_are() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    // Retention would prune beyond 20 by itself.
    write(
        &repo.join(".crew/config.toml"),
        "[retention]\nmax_kept_runs = 100\n",
    );
    for index in 0..22 {
        let output = env.crew(&repo, ["run", "--agent", "shell", &format!("echo {index}")]);
        assert!(output.status.success(), "{}", render_output(&output));
    }
    let ids = |args: &[&str]| -> Vec<String> {
        let output = env.crew(&repo, args);
        assert!(output.status.success(), "{}", render_output(&output));
        serde_json::from_slice::<serde_json::Value>(&output.stdout)
            .unwrap()
            .as_array()
            .unwrap()
            .iter()
            .map(|run| run["run_id"].as_str().unwrap().to_owned())
            .collect()
    };
    let all = ids(&["runs", "list", "--all", "--json"]);
    assert_eq!(all.len(), 22);
    assert_eq!(ids(&["runs", "list", "--json"]), all[..20]);
    assert_eq!(ids(&["runs", "list", "--limit", "2", "--json"]), all[..2]);
    let table = env.crew(&repo, ["runs", "list"]);
    let stdout = String::from_utf8(table.stdout).unwrap();
    assert_eq!(stdout.lines().count(), 21, "a header and 20 runs: {stdout}");
    assert!(
        stdout.lines().nth(1).unwrap().starts_with(all[0].as_str()),
        "newest first"
    );
    assert_eq!(
        String::from_utf8(table.stderr).unwrap(),
        "(the 20 newest of 22 runs; `--all` lists every one, `--limit N` the N newest)\n"
    );
}

#[test]
fn a_reader_that_stops_reading_ends_a_listing_quietly_and_never_a_run() {
    use std::os::unix::process::ExitStatusExt;
    let env = TestEnv::new();
    let repo = env.repo("project");
    let with_closed_stdout = |args: &[&str]| {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        env.crew_command(&repo)
            .args(args)
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap()
    };
    // A command that only prints ends as `git log | head` does: by SIGPIPE, saying nothing.
    let listing = with_closed_stdout(&["completions", "bash"]);
    assert_eq!(
        listing.status.signal(),
        Some(libc::SIGPIPE),
        "{}",
        render_output(&listing)
    );
    assert_eq!(String::from_utf8_lossy(&listing.stderr), "");
    // A command hosting agents stops printing, and its run goes on to its end.
    let run = with_closed_stdout(&[
        "run",
        "--agent",
        "shell",
        "--workspace-mode",
        "worktree",
        "echo done > done.txt",
    ]);
    assert!(run.status.success(), "{}", render_output(&run));
    assert!(
        !String::from_utf8_lossy(&run.stderr).contains("panicked"),
        "{}",
        render_output(&run)
    );
    let run_id = run_ids(&env, &repo).remove(0);
    assert_eq!(manifest(&env, &repo, &run_id)["status"], "completed");
    assert_eq!(
        env.git(&repo, ["show", &format!("crew/{run_id}-shell:done.txt")]),
        "done\n"
    );
}

#[test]
fn a_standard_output_that_takes_no_writes_ends_a_command_with_an_error_that_says_so() {
    // `println!` panics when its write fails: exit 101 and a message about crew's source.
    let env = TestEnv::new();
    let repo = env.repo("project");
    for args in [
        &["agents", "list"][..],
        &["agents", "list", "--json"],
        &["runs", "list"],
        &["completions", "bash"],
    ] {
        let full = std::fs::File::options()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let output = env
            .crew_command(&repo)
            .args(args)
            .stdout(full)
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.starts_with(
                "error: crew could not write to its standard output: No space left on device"
            ),
            "{args:?}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}

#[test]
fn a_standard_error_that_takes_no_writes_loses_the_message_never_the_exit_code() {
    // `eprint!` panics when its write fails: exit 101, whatever the command's own outcome.
    let env = TestEnv::new();
    let repo = env.repo("project");
    let full = || {
        std::fs::File::options()
            .write(true)
            .open("/dev/full")
            .unwrap()
    };
    // An error of the user's (exit 2), an error of the output's (exit 1), as they end with
    // standard error writable.
    for (args, stdout_full, code) in [
        (&["runs", "show", "no-such-run"][..], false, 2),
        (&["agents", "list"], true, 1),
    ] {
        let mut command = env.crew_command(&repo);
        command.args(args).stderr(full());
        if stdout_full {
            command.stdout(full());
        }
        let output = command.output().unwrap();
        assert_eq!(
            output.status.code(),
            Some(code),
            "{args:?}: {}",
            render_output(&output)
        );
        let mut writable = env.crew_command(&repo);
        writable.args(args);
        if stdout_full {
            writable.stdout(full());
        }
        assert_eq!(
            writable.output().unwrap().status.code(),
            Some(code),
            "{args:?}"
        );
    }
}

#[test]
fn a_crew_started_with_its_standard_descriptors_closed_prints_into_none_of_its_own_files() {
    // Without its standard descriptors, the first descriptors crew makes (its runtime's) would
    // be numbered 0 and 1, and its table printed into them: it fails, or writes where it must
    // not. Closed ones are opened on /dev/null before anything else.
    let env = TestEnv::new();
    let repo = env.repo("project");
    let mut shell = std::process::Command::new("sh");
    let shell = env
        .hermetic(&mut shell)
        .args(["-c", "exec \"$0\" agents list <&- >&-"])
        .arg(crew_tests::crew_bin().as_str())
        .current_dir(&repo)
        .output()
        .unwrap();
    assert!(shell.status.success(), "{}", render_output(&shell));
    assert_eq!(String::from_utf8_lossy(&shell.stderr), "");
    // And the /dev/null it opens stays open in the programs it starts (they too would take
    // the descriptor for a file of their own): not closed on exec.
    let crew = crew_tests::crew_bin();
    let mut shell = std::process::Command::new("sh");
    let mut running = env
        .hermetic(&mut shell)
        .args(["-c", "exec \"$0\" run -q --agent shell \"sleep 3\" <&-"])
        .arg(crew.as_str())
        .current_dir(&repo)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = running.id();
    let flags = wait_until(10, "crew's /dev/null on descriptor 0", || {
        // The shell's own descriptor 0 is the test's: only once it is crew.
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
        (exe == crew.as_std_path()).then_some(())?;
        let target = std::fs::read_link(format!("/proc/{pid}/fd/0")).ok()?;
        (target == std::path::Path::new("/dev/null")).then_some(())?;
        let info = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/0")).ok()?;
        let flags = info.lines().find_map(|line| line.strip_prefix("flags:"))?;
        u32::from_str_radix(flags.trim(), 8).ok()
    });
    assert_eq!(
        flags & libc::O_CLOEXEC as u32,
        0,
        "descriptor 0 is closed on exec (flags {flags:o})"
    );
    assert!(running.wait().unwrap().success());
}
