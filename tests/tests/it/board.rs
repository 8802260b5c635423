//! `crew watch`, the board, driven in a real terminal: tmux runs it beside a run of agents,
//! `send-keys` types, `capture-pane` reads the screen.

use camino::Utf8Path;
use crew_tests::{Redactor, TestEnv, render_output, wait_until};

use crate::common::runs::shell_worktree_args;
use crate::common::tmux::{Tmux, crew_script, crew_script_with};

/// The screen without its blank lines, ages and durations redacted.
fn shown(env: &TestEnv, screen: &str) -> String {
    let text: Vec<&str> = screen
        .lines()
        .map(str::trim_end)
        .filter(|line| !line.is_empty())
        .collect();
    let text: Vec<String> = text
        .iter()
        .map(|line| ports_redacted(line).trim_end().to_owned())
        .collect();
    Redactor::new(env).redact(&text.join("\n"))
}

/// A line's lease ports (`24652–24655`, each run's own) as `[PORTS]`, padded to their width.
fn ports_redacted(text: &str) -> String {
    text.split(' ')
        .map(|word| {
            let is_ports = word.split_once('–').is_some_and(|(first, last)| {
                [first, last]
                    .iter()
                    .all(|part| !part.is_empty() && part.chars().all(|c| c.is_ascii_digit()))
            });
            if is_ports {
                format!("{:<width$}", "[PORTS]", width = word.chars().count())
            } else {
                word.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The board's line of agent `id` (`board:<task>`).
fn row<'a>(screen: &'a str, id: &str) -> &'a str {
    screen
        .lines()
        .find(|line| line.split_whitespace().any(|word| word == id))
        .unwrap_or("")
}

/// Changes the board's filter from `from` (what `/` shows typed already) to `to`.
fn filter(tmux: &Tmux, from: &str, to: &str) {
    tmux.keys(&["/"]);
    for _ in from.chars() {
        tmux.keys(&["BSpace"]);
    }
    tmux.text(to);
    tmux.keys(&["Enter"]);
}

/// The states of the live agents of the project, by task.
fn live_states(env: &TestEnv, repo: &Utf8Path) -> Vec<(String, String)> {
    let output = env.crew(repo, ["agents", "list", "--json"]);
    assert!(output.status.success(), "{}", render_output(&output));
    let agents: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let mut states: Vec<(String, String)> = agents
        .as_array()
        .unwrap()
        .iter()
        .map(|agent| {
            (
                agent["task_id"].as_str().unwrap_or("").to_owned(),
                agent["state"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    states.sort();
    states
}

#[test]
fn the_board_shows_who_needs_you_and_answers_stops_and_quits_without_touching_others() {
    let env = TestEnv::reachable_by_others();
    let repo = env.repo("project");
    let script = crew_script(&env, &repo, &["watch".to_owned()]);
    let test = "the_board_shows_who_needs_you_and_answers_stops_and_quits_without_touching_others";
    let Some(tmux) = Tmux::start_sized(&env, test, &script, (104, 30)) else {
        return;
    };
    // Started before any run: it says so, and shows runs as they start.
    let empty = tmux.screen_when("the empty board", |screen| screen.contains("no runs yet"));
    insta::assert_snapshot!(shown(&env, &empty), @r"
    waiting: 0  working: 0  agents: 0  crew watch project
        AGENT DEF   STATE    BRANCH +/-         AGE  LAST OUTPUT
        no runs yet: start one with `crew run` (they show here as they start)
    ?: keys  n: next needing you  enter: output  d: diff  a: answer  q: quit
    ");

    let mut args = shell_worktree_args(&[
        "asker=if [ -n \"$CREW_MESSAGE\" ]; then echo \"$CREW_MESSAGE\" > color.txt; exit 0; fi; echo thinking; crew ask 'which color?'",
        "first=while true; do echo tick; sleep 0.2; done",
        "second=while true; do echo tock; sleep 0.2; done",
        "hello=echo hello > hello.txt; echo wrote hello",
        // An agent that clears the screen, moves the cursor and retitles the window.
        "hostile=printf '\\033[2J\\033[H\\033]0;pwned\\007hostile\\n'; sleep 600",
        "steered=read line; echo \"steered: $line\"; sleep 600",
    ]);
    args.extend(["--name", "board", "--max-parallel", "8", "--detach"].map(str::to_owned));
    let started = env.crew(&repo, &args);
    assert!(started.status.success(), "{}", render_output(&started));

    let board = tmux.screen_when("the run on the board", |screen| {
        screen.contains("waiting: 1")
            && row(screen, "board:hello").contains("done*")
            && row(screen, "board:first").contains("tick")
            && row(screen, "board:second").contains("tock")
            && row(screen, "board:hostile").contains("pwned")
            && row(screen, "board:hostile").contains("working")
            && row(screen, "board:hostile").contains("crew/board-hostile")
            && row(screen, "board:steered").contains("crew/board-steered")
    });
    // Waiting first, then finished work to review, then the rest in the run's order. The
    // hostile agent's escapes are text on its line: the board was not cleared or moved.
    insta::assert_snapshot!(shown(&env, &board), @r"
    waiting: 1  working: 4  agents: 6  crew watch project
        AGENT         DEF   STATE    BRANCH             +/-         AGE  PORTS       LAST OUTPUT
    › ? board:asker   shell waiting  crew/board-asker               [DURATION]   [PORTS]     question recorded; end…
      ★ board:hello   shell done*    crew/board-hello   +1 -0       [DURATION]               wrote hello
      ▶ board:first   shell working  crew/board-first               [DURATION]   [PORTS]     tick
      ▶ board:second  shell working  crew/board-second              [DURATION]   [PORTS]     tock
      ▶ board:hostile shell working  crew/board-hostile             [DURATION]   [PORTS]     �[2J�[H�]0;pwned�hosti…
      ▶ board:steered shell working  crew/board-steered             [DURATION]   [PORTS]
    ?: keys  n: next needing you  enter: output  d: diff  a: answer  q: quit
    ");
    assert!(!tmux.title().contains("pwned"), "{}", tmux.title());
    // The agent that started waiting rang the bell.
    assert!(tmux.bell_rang());

    // Esc with nothing open changes nothing, and touches no agent.
    let before = live_states(&env, &repo);
    tmux.keys(&["Escape"]);
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(shown(&env, &tmux.screen()), shown(&env, &board));
    assert_eq!(live_states(&env, &repo), before);

    // `n` goes to the agent that waits and shows its question; `a` answers it.
    tmux.keys(&["n"]);
    let question = tmux.screen_when("the question", |screen| screen.contains("board:asker asks"));
    let pane: Vec<&str> = question
        .lines()
        .skip_while(|line| !line.contains("board:asker asks"))
        .filter(|line| !line.trim().is_empty())
        .collect();
    insta::assert_snapshot!(pane.join("\n"), @r"
    ── board:asker asks ────────────────────────────────────────────────────────────────────────────────────
    which color?
    a: answer   esc: close
    ?: keys  n: next needing you  enter: output  d: diff  a: answer  q: quit
    ");
    tmux.keys(&["a"]);
    tmux.screen_when("the answer prompt", |screen| {
        screen.contains("answer board:asker:")
    });
    tmux.text("blue");
    tmux.keys(&["Enter"]);
    let answered = tmux.screen_when("the answered agent done", |screen| {
        row(screen, "board:asker").contains("done") && screen.contains("waiting: 0")
    });
    assert!(answered.contains("answered board:asker"), "{answered}");
    let color = env.git(&repo, ["show", "crew/board-asker:color.txt"]);
    assert_eq!(color.trim(), "blue");

    // `s` asks first; `y` stops that agent and no other.
    tmux.keys(&["Escape"]);
    filter(&tmux, "", "first");
    tmux.screen_when("the filtered board", |screen| {
        screen.contains("filter: first") && !row(screen, "board:second").contains("tock")
    });
    tmux.keys(&["s"]);
    tmux.screen_when("the stop prompt", |screen| {
        screen.contains("stop board:first? (y/n)")
    });
    tmux.keys(&["n"]);
    tmux.screen_when("the refusal", |screen| {
        screen.contains("board:first not stopped")
    });
    assert!(live_states(&env, &repo).contains(&("first".to_owned(), "running".to_owned())));
    tmux.keys(&["s"]);
    tmux.screen_when("the stop prompt", |screen| {
        screen.contains("stop board:first? (y/n)")
    });
    tmux.keys(&["y"]);
    tmux.screen_when("the stopped agent", |screen| {
        row(screen, "board:first").contains("stopped")
    });
    let states = live_states(&env, &repo);
    assert!(
        states.contains(&("second".to_owned(), "running".to_owned())),
        "{states:?}"
    );
    assert!(
        states.contains(&("hostile".to_owned(), "running".to_owned())),
        "{states:?}"
    );

    // `r` starts it again where it stopped.
    tmux.keys(&["r"]);
    tmux.screen_when("the resumed agent", |screen| {
        screen.contains("resumed board:first") && row(screen, "board:first").contains("working")
    });

    // `i` steers an agent: the message reaches it now.
    filter(&tmux, "first", "steered");
    tmux.keys(&["i"]);
    tmux.screen_when("the steer prompt", |screen| {
        screen.contains("steer board:steered:")
    });
    tmux.text("left");
    tmux.keys(&["Enter"]);
    tmux.screen_when("the steered agent", |screen| {
        row(screen, "board:steered").contains("steered: left")
    });

    // `d` shows a task's work against its base.
    filter(&tmux, "steered", "hello");
    tmux.keys(&["d"]);
    let diff = tmux.screen_when("the diff", |screen| screen.contains("+hello"));
    let pane: Vec<&str> = diff
        .lines()
        .skip_while(|line| !line.contains("work of board:hello"))
        .filter(|line| !line.trim().is_empty())
        .collect();
    insta::assert_snapshot!(pane.join("\n"), @r"
    ── work of board:hello against its base ────────────────────────────────────────────────────────────────
    diff --git a/hello.txt b/hello.txt
    new file mode 100644
    index 0000000..ce01362
    --- /dev/null
    +++ b/hello.txt
    @@ -0,0 +1 @@
    +hello
    ?: keys  n: next needing you  enter: output  d: diff  a: answer  q: quit
    ");

    // `enter` follows an agent's output.
    filter(&tmux, "hello", "second");
    tmux.keys(&["Enter"]);
    let following = |screen: &str| screen.lines().filter(|line| line.trim() == "tock").count();
    let output = tmux.screen_when("the output pane", |screen| {
        screen.contains("── output of board:second (following)") && following(screen) >= 3
    });
    let more = tmux.screen_when("more output", |screen| {
        following(screen) > following(&output) || following(screen) >= 20
    });
    assert!(more.contains("filter: second"), "{more}");

    // `?` lists the keys.
    tmux.keys(&["?"]);
    let help = tmux.screen_when("the keys", |screen| screen.contains("── keys"));
    let pane: Vec<&str> = help
        .lines()
        .skip_while(|line| !line.contains("── keys"))
        .filter(|line| !line.trim().is_empty())
        .collect();
    insta::assert_snapshot!(pane.join("\n"), @r"
    ── keys ────────────────────────────────────────────────────────────────────────────────────────────────
      j / k   move down / up
      n       jump to the next agent that needs you
      enter   its output (following)
      d       its work against its base (space / u scroll)
      a       answer its question
      i       steer it (a message now)
      f       follow up (a message at the end of its turn)
      s       stop it (asks first)
      r       resume it
      /       filter by id, agent, branch or state
      esc     close the pane or prompt (never touches an agent)
      q       quit (every agent keeps running)
    ?: keys  n: next needing you  enter: output  d: diff  a: answer  q: quit
    ");

    // Quitting leaves every agent running.
    tmux.keys(&["q"]);
    let end = tmux.screen_when("the board's end", |screen| screen.contains("EXITED-"));
    assert!(end.contains("EXITED-0"), "{end}");
    let states = live_states(&env, &repo);
    assert!(
        states.contains(&("second".to_owned(), "running".to_owned())),
        "{states:?}"
    );
    assert!(
        states.contains(&("hostile".to_owned(), "running".to_owned())),
        "{states:?}"
    );

    let cancelled = env.crew(&repo, ["runs", "cancel", "board"]);
    assert!(cancelled.status.success(), "{}", render_output(&cancelled));
    wait_until(60, "the run's end", || {
        let output = env.crew(&repo, ["runs", "show", "board", "--json"]);
        let run: serde_json::Value = serde_json::from_slice(&output.stdout).ok()?;
        (run["status"] != "running").then_some(())
    });
}

#[test]
fn the_board_draws_in_ascii_without_colour_on_a_narrow_terminal() {
    let env = TestEnv::reachable_by_others();
    let repo = env.repo("project");
    // A lead agent's sub-task shows under it.
    let mut args = shell_worktree_args(&[
        "good=echo hi > hi.txt; echo fine",
        "bad=echo oops; exit 2",
        "lead=crew submit --task 'kid=echo from the kid'",
    ]);
    args.extend(["--name", "plain"].map(str::to_owned));
    let finished = env.crew(&repo, &args);
    assert_eq!(
        finished.status.code(),
        Some(1),
        "{}",
        render_output(&finished)
    );
    let script = crew_script_with(
        &env,
        &repo,
        &["watch".to_owned()],
        "watch.sh",
        &[("LANG", "C"), ("NO_COLOR", "1")],
    );
    let test = "the_board_draws_in_ascii_without_colour_on_a_narrow_terminal";
    let Some(tmux) = Tmux::start_sized(&env, test, &script, (48, 10)) else {
        return;
    };
    let board = tmux.screen_when("the finished run", |screen| {
        row(screen, "plain:good").contains("fine")
            && row(screen, "plain:bad").contains("oops")
            && row(screen, "plain:kid").contains("from the kid")
    });
    // The run ended before the board started, and nobody looked at it (its summary went to
    // no terminal): its failure first, then its finished work, as news (`done*`).
    insta::assert_snapshot!(shown(&env, &board), @r#"
    waiting: 0  working: 0  agents: 4  crew watch pr
        AGENT       STATE    LAST OUTPUT
    > X plain:bad   failed   oops
      * plain:good  done*    fine
      * plain:lead  done*    accepted ["kid"]
      * ` plain:kid done*    from the kid
    ?: keys  n: next  q: quit
    "#);
    assert!(board.is_ascii(), "{board}");
    // Runs that ended before the board started ring no bell.
    assert!(!tmux.bell_rang());
    let styled = tmux.screen_with_styles();
    for colour in [
        "\x1b[31m", "\x1b[32m", "\x1b[33m", "\x1b[36m", "38;5;", "38;2;",
    ] {
        assert!(!styled.contains(colour), "{styled:?}");
    }
    tmux.keys(&["q"]);
    tmux.screen_when("the board's end", |screen| screen.contains("EXITED-0"));
}

#[test]
fn finished_work_nobody_looked_at_shows_as_news_until_someone_does() {
    let test = "finished_work_nobody_looked_at_shows_as_news_until_someone_does";
    let env = TestEnv::reachable_by_others();
    let repo = env.repo("project");
    // It finishes in the background before any board is open: nobody has looked at it.
    let started = env.crew(
        &repo,
        [
            "run",
            "--agent",
            "shell",
            "--name",
            "quiet",
            "--detach",
            "echo done quietly",
        ],
    );
    assert!(started.status.success(), "{}", render_output(&started));
    wait_until(30, "the run to end", || {
        crate::common::runs::try_manifest(&env, &repo, "quiet")
            .filter(|run| run["status"] == "completed")
    });
    let script = crew_script(&env, &repo, &["watch".to_owned()]);
    {
        let Some(tmux) = Tmux::start(&env, test, &script) else {
            return;
        };
        tmux.screen_when("the news", |screen| {
            row(screen, "quiet:shell").contains("done*")
        });
        // Its output opened: looked at.
        tmux.keys(&["Enter"]);
        tmux.screen_when("its output", |screen| {
            screen.contains("done quietly") && !row(screen, "quiet:shell").contains("done*")
        });
        tmux.keys(&["q"]);
        wait_until(10, "the look recorded", || {
            std::fs::read_to_string(repo.join(".crew/state/runs/quiet/seen"))
                .ok()
                .filter(|seen| seen.lines().any(|line| line == "shell"))
        });
    }
    // The next board knows it was looked at.
    let Some(tmux) = Tmux::start(&env, test, &script) else {
        return;
    };
    let board = tmux.screen_when("the run", |screen| {
        row(screen, "quiet:shell").contains("done")
    });
    assert!(!row(&board, "quiet:shell").contains("done*"), "{board}");
}

#[test]
fn r_resumes_a_stopped_agent_whose_run_has_ended() {
    let test = "r_resumes_a_stopped_agent_whose_run_has_ended";
    let env = TestEnv::reachable_by_others();
    let repo = env.repo("project");
    // Its first start waits to be stopped; a resume in its workspace finds its marker and ends.
    let mut host = env.spawn_crew(
        &repo,
        [
            "run",
            "--agent",
            "shell",
            "--workspace-mode",
            "worktree",
            "--name",
            "held",
            "if [ -e started ]; then echo second start; exit 0; fi; touch started; echo ready; while true; do sleep 0.1; done",
        ],
    );
    crate::common::runs::wait_for_agents_saying(&env, &repo, "ready", 1);
    let stop = env.crew(&repo, ["agents", "stop", "held:shell"]);
    assert!(stop.status.success(), "{}", render_output(&stop));
    // Its only agent stopped: the run ends, and no host is left to resume it.
    host.wait().unwrap();
    let script = crew_script(&env, &repo, &["watch".to_owned()]);
    let Some(tmux) = Tmux::start(&env, test, &script) else {
        return;
    };
    tmux.screen_when("the stopped agent", |screen| {
        row(screen, "held:shell").contains("stopped")
    });
    tmux.keys(&["r"]);
    let said = tmux.screen_when("the resume", |screen| {
        screen.contains("resumed held:shell: its run is hosted in the background")
            || screen.contains("held:shell: ")
    });
    assert!(
        said.contains("resumed held:shell: its run is hosted in the background"),
        "{said}"
    );
    wait_until(30, "the resumed task to succeed", || {
        crate::common::runs::try_manifest(&env, &repo, "held")
            .filter(|run| run["tasks"][0]["status"] == "succeeded")
    });
    let log =
        std::fs::read_to_string(repo.join(".crew/state/runs/held/tasks/shell/output.log")).unwrap();
    assert!(log.contains("second start"), "{log}");
    tmux.keys(&["q"]);
}
