//! crew on a real terminal: tmux runs it, `capture-pane` reads the screen.

use std::process::Command;

use camino::Utf8PathBuf;
use crew_tests::{TestEnv, render_output};

use crate::common::runs::shell_worktree_args;
use crate::common::tmux::{Tmux, crew_script, crew_script_with};

/// The screen lines of task `id` in the block (`  <symbol> <id> …`).
fn task_lines<'a>(screen: &'a str, id: &str) -> Vec<&'a str> {
    screen
        .lines()
        .filter(|line| {
            let mut words = line.split_whitespace();
            line.starts_with("  ")
                && words
                    .next()
                    .is_some_and(|symbol| symbol.chars().count() == 1)
                && words.next() == Some(id)
        })
        .collect()
}

#[test]
fn a_run_on_a_terminal_draws_one_line_per_task_and_leaves_the_summary() {
    let env = TestEnv::reachable_by_others();
    let repo = env.repo("project");
    let go = crew_tests::signal(&repo, "go");
    let wait_for_go = format!("while [ ! -e {go} ]; do sleep 0.05; done");
    let b = "b=if [ -n \"$CREW_MESSAGE\" ]; then echo \"$CREW_MESSAGE\" > b.txt; exit 0; fi; crew ask 'which way?'";
    let args = shell_worktree_args(&[
        &format!("a=echo step-a; {wait_for_go}; echo more > a.txt"),
        b,
        "c=echo hi > c.txt",
        // An agent that tries to clear the screen, move the cursor and retitle the window.
        &format!("d=printf '\\033[2J\\033[H\\033]0;pwned\\007hostile\\n'; {wait_for_go}"),
    ]);
    let script = crew_script(&env, &repo, &args);
    let Some(tmux) = Tmux::start(
        &env,
        "a_run_on_a_terminal_draws_one_line_per_task_and_leaves_the_summary",
        &script,
    ) else {
        return;
    };
    // The header counts from the tasks' statuses, the lines from the agents' events: two
    // streams, so both are waited for.
    let live = tmux.screen_when("every task in its place", |screen| {
        screen.contains("1 waiting for you")
            && task_lines(screen, "a")
                .first()
                .is_some_and(|line| line.contains("step-a"))
            && task_lines(screen, "b")
                .first()
                .is_some_and(|line| line.contains("waiting for you: which way?"))
            && task_lines(screen, "c")
                .first()
                .is_some_and(|line| line.contains("succeeded"))
            && task_lines(screen, "d")
                .first()
                .is_some_and(|line| line.contains("hostile"))
    });
    // One line per task, redrawn in place; the header counts who needs the user.
    for id in ["a", "b", "c", "d"] {
        assert_eq!(task_lines(&live, id).len(), 1, "{id}:\n{live}");
    }
    assert!(live.contains("1 waiting for you"), "{live}");
    // The agent's escapes were shown as text: the screen was not cleared above the block.
    assert!(live.starts_with("crew: run "), "{live}");
    assert!(task_lines(&live, "d")[0].contains('\u{fffd}'), "{live}");

    let answered = env.crew(&repo, ["agents", "follow-up", "b", "left"]);
    assert!(answered.status.success(), "{}", render_output(&answered));
    crew_tests::write(&go, "");
    let end = tmux.screen_when("the run's end", |screen| screen.contains("EXITED-"));
    // The block gave way to the summary: each task once, in the table.
    assert!(end.contains("EXITED-0"), "{end}");
    assert!(end.contains("TASK") && end.contains("STATUS"), "{end}");
    for id in ["a", "b", "c", "d"] {
        let rows: Vec<&str> = end
            .lines()
            .filter(|line| line.split_whitespace().next() == Some(id))
            .collect();
        assert_eq!(rows.len(), 1, "{id}:\n{end}");
        assert!(rows[0].contains("succeeded"), "{id}:\n{end}");
    }
    assert!(
        !end.contains("waiting for you") && !end.contains('▸'),
        "{end}"
    );
}

/// A repository whose one commit holds `files` small files (made with `git fast-import`).
fn large_repo(env: &TestEnv, files: usize) -> Utf8PathBuf {
    use std::io::Write;
    let repo = env.dir("large");
    env.git(&repo, ["init", "-q", "-b", "main"]);
    let mut stream = String::new();
    for index in 0..files {
        let data = format!("file {index}\n");
        stream.push_str(&format!(
            "blob\nmark :{}\ndata {}\n{data}",
            index + 1,
            data.len()
        ));
    }
    stream.push_str(&format!(
        "commit refs/heads/main\nmark :{}\ncommitter t <t@example.com> 0 +0000\ndata 6\nfiles\n",
        files + 1
    ));
    for index in 0..files {
        stream.push_str(&format!(
            "M 100644 :{} d{}/f{index}.txt\n",
            index + 1,
            index / 1000
        ));
    }
    let mut import = env
        .hermetic(&mut Command::new("git"))
        .args(["fast-import", "--quiet"])
        .current_dir(&repo)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    import
        .stdin
        .take()
        .unwrap()
        .write_all(stream.as_bytes())
        .unwrap();
    assert!(import.wait().unwrap().success());
    env.git(&repo, ["reset", "-q", "--hard", "main"]);
    repo
}

#[test]
fn a_slow_checkout_shows_how_far_it_has_come() {
    let env = TestEnv::reachable_by_others();
    let repo = large_repo(&env, 20_000);
    let script = crew_script(&env, &repo, &shell_worktree_args(&["shell=true"]));
    let Some(tmux) = Tmux::start(&env, "a_slow_checkout_shows_how_far_it_has_come", &script) else {
        return;
    };
    let preparing = tmux.screen_when("checkout progress", |screen| {
        task_lines(screen, "shell")
            .first()
            .is_some_and(|line| line.contains("preparing") && line.contains(" of 20000 files)"))
    });
    let line = task_lines(&preparing, "shell")[0];
    assert!(
        line.contains("checkout ") && line.contains("% ("),
        "{preparing}"
    );
    let end = tmux.screen_when("the run's end", |screen| screen.contains("EXITED-"));
    assert!(
        end.contains("EXITED-0") && !end.contains(" of 20000 files)"),
        "{end}"
    );
}

#[test]
fn no_color_takes_the_colour_away_and_keeps_the_live_block() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let go = crew_tests::signal(&repo, "go");
    let args = shell_worktree_args(&[&format!(
        "slow=echo step-one; while [ ! -e {go} ]; do sleep 0.05; done"
    )]);
    let script = crew_script_with(
        &env,
        &repo,
        &args,
        "run.sh",
        &[("LANG", "C.UTF-8"), ("NO_COLOR", "1")],
    );
    let test = "no_color_takes_the_colour_away_and_keeps_the_live_block";
    let Some(tmux) = Tmux::start(&env, test, &script) else {
        return;
    };
    let live = tmux.screen_when("the task's line in the block", |screen| {
        task_lines(screen, "slow")
            .first()
            .is_some_and(|line| line.contains("step-one"))
    });
    // The block, not a line per change: the header, then one line for the task.
    assert!(live.starts_with("crew: run "), "{live}");
    assert_eq!(task_lines(&live, "slow").len(), 1, "{live}");
    let styles = tmux.screen_with_styles();
    assert!(
        !styles.contains("\u{1b}[3") && !styles.contains("\u{1b}[9"),
        "no colour with NO_COLOR:\n{styles}"
    );
    crew_tests::write(&go, "");
    let end = tmux.screen_when("the run's end", |screen| screen.contains("EXITED-"));
    assert!(end.contains("EXITED-0"), "{end}");
}

#[test]
fn crew_diff_on_a_terminal_shows_an_agents_escapes_as_text() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    // The agent writes a file that retitles the terminal and clears the screen when shown.
    let run = env.crew(
        &repo,
        [
            "run",
            "--agent",
            "shell",
            "--workspace-mode",
            "worktree",
            r"printf 'title \033]0;pwned\007 clear \033[2J done\n' > hostile.txt",
        ],
    );
    assert!(run.status.success(), "{}", render_output(&run));
    let script = crew_script(&env, &repo, &["diff".to_owned(), "shell".to_owned()]);
    let test = "crew_diff_on_a_terminal_shows_an_agents_escapes_as_text";
    let Some(tmux) = Tmux::start(&env, test, &script) else {
        return;
    };
    let shown = tmux.screen_when("the diff", |screen| screen.contains("EXITED-"));
    assert!(shown.contains("EXITED-0"), "{shown}");
    assert!(!tmux.title().contains("pwned"), "{}", tmux.title());
    let line = shown
        .lines()
        .find(|line| line.starts_with("+title"))
        .unwrap_or_else(|| panic!("{shown}"));
    assert!(
        line.contains('\u{fffd}') && line.contains("done"),
        "{shown}"
    );
    // Piped, the patch is git's, byte for byte.
    let piped = env.crew(&repo, ["diff", "shell"]);
    assert!(String::from_utf8_lossy(&piped.stdout).contains("\u{1b}]0;pwned\u{7}"));
}
