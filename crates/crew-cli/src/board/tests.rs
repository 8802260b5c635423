//! Tests of `board/mod.rs`.

use super::*;
use crew_core::config::WorkspaceMode;
use crew_core::{RunId, TaskId, WorkspaceId};

/// A board with one run whose tasks are in `statuses`, heard as a watch would tell it.
fn board(statuses: &[(&str, TaskStatus)]) -> (Board, RunId) {
    let run_id = RunId::parse("board-test").unwrap();
    let workspace = WorkspaceId::from_path(&std::env::temp_dir()).unwrap();
    let tasks = statuses
        .iter()
        .map(|(id, _)| {
            TaskRecord::new(
                TaskId::parse(id).unwrap(),
                "shell".into(),
                "true".into(),
                vec![],
                WorkspaceMode::Single,
            )
        })
        .collect();
    let manifest = RunManifest::new(run_id.clone(), workspace, WorkspaceMode::Single, tasks);
    let mut board = Board::default();
    board.hear(Watched::Run(Box::new(manifest)));
    for (id, status) in statuses {
        board.hear(Watched::Event(WatchEvent::Task {
            run_id: run_id.clone(),
            task_id: TaskId::parse(id).unwrap(),
            status: *status,
            task: None,
        }));
    }
    (board, run_id)
}

fn order(board: &Board) -> Vec<(String, RowState)> {
    board
        .rows()
        .into_iter()
        .map(|row| (row.agent_id.task_id().to_string(), row.state))
        .collect()
}

#[test]
fn who_needs_the_user_comes_first_and_rings_the_bell() {
    let (mut board, _) = board(&[
        ("working", TaskStatus::Running),
        ("done", TaskStatus::Succeeded),
        ("asks", TaskStatus::Waiting),
        ("broke", TaskStatus::Failed),
        ("later", TaskStatus::Pending),
    ]);
    assert_eq!(
        order(&board),
        [
            ("asks".to_owned(), RowState::Waiting),
            ("broke".to_owned(), RowState::FailedUnread),
            ("done".to_owned(), RowState::DoneUnread),
            ("working".to_owned(), RowState::Working),
            ("later".to_owned(), RowState::Queued),
        ]
    );
    assert!(board.bell, "a task that starts waiting or fails rings");
    // `n` opens the waiting one's question first, then the failure; opening marks it read.
    assert_eq!(board.key(Key::Char('n')), None);
    assert_eq!(board.pane, Pane::Question);
    let next = board.key(Key::Char('n'));
    assert!(matches!(next, Some(Action::ReadTail(_, Glance::Pane))));
    assert_eq!(board.pane, Pane::Output);
    let states: Vec<RowState> = order(&board).into_iter().map(|(_, state)| state).collect();
    assert!(states.contains(&RowState::Failed));
}

#[test]
fn esc_and_quit_never_touch_an_agent_and_stop_asks_first() {
    let (mut board, run_id) = board(&[("working", TaskStatus::Running)]);
    let agent = AgentId::new(run_id, TaskId::parse("working").unwrap());
    assert_eq!(board.key(Key::Esc), None);
    assert_eq!(board.key(Key::Char('s')), None);
    assert_eq!(board.prompt, Some(Prompt::ConfirmStop(agent.clone())));
    // Anything but `y` leaves it running.
    assert_eq!(board.key(Key::Esc), None);
    assert_eq!(board.prompt, None);
    assert_eq!(board.key(Key::Char('s')), None);
    assert_eq!(board.key(Key::Char('y')), Some(Action::Stop(agent.clone())));
    // A message typed for steering, then Esc: nothing is sent.
    assert_eq!(board.key(Key::Char('i')), None);
    for c in "left".chars() {
        assert_eq!(board.key(Key::Char(c)), None);
    }
    assert_eq!(board.key(Key::Esc), None);
    assert_eq!(board.key(Key::Char('q')), Some(Action::Quit));
    assert_eq!(board.key(Key::Interrupt), Some(Action::Quit));
}

#[test]
fn agent_output_is_kept_as_text_and_bounded() {
    let (mut board, run_id) = board(&[("loud", TaskStatus::Running)]);
    let agent = AgentId::new(run_id, TaskId::parse("loud").unwrap());
    for index in 0..5000 {
        board.hear(Watched::Event(WatchEvent::Output {
            agent_id: agent.clone(),
            line: format!("\x1b[2J\x1b]0;pwned\x07line {index} {}", "x".repeat(100)),
        }));
    }
    let tail = board.tail(&agent).unwrap();
    assert!(tail.len() <= TAIL_LINES);
    assert!(tail.iter().map(String::len).sum::<usize>() <= TAIL_BYTES + 200);
    assert!(
        tail.iter()
            .all(|line| !line.contains('\x1b') && !line.contains('\x07'))
    );
    assert!(tail.back().unwrap().contains("line 4999"));
}

#[test]
fn a_filter_narrows_the_table_and_not_the_header_counts() {
    let (mut board, _) = board(&[
        ("asks", TaskStatus::Waiting),
        ("working", TaskStatus::Running),
        ("done", TaskStatus::Succeeded),
    ]);
    board.filter = "done".to_owned();
    assert_eq!(board.rows().len(), 1);
    let header = header(&board, 80);
    assert!(
        header.starts_with("waiting: 1  working: 1  agents: 3"),
        "{header}"
    );
}

#[test]
fn a_task_holding_its_lease_shows_its_ports_and_a_finished_one_does_not() {
    let (mut board, _) = board(&[
        ("serving", TaskStatus::Running),
        ("done", TaskStatus::Succeeded),
    ]);
    for (task, port) in board.runs[0].tasks.iter_mut().zip([20_000, 20_004]) {
        task.lease = Some(crew_core::model::LeaseRecord {
            port: Some(port),
            ports: 4,
            name: format!("crew_{}", task.id),
            names: Vec::new(),
        });
    }
    let backend = ratatui::backend::TestBackend::new(140, 8);
    let mut terminal = ratatui::Terminal::new(backend).unwrap();
    let looks = view::Looks {
        color: false,
        unicode: true,
    };
    terminal
        .draw(|frame| view::draw(frame, &board, "project", looks))
        .unwrap();
    let screen: Vec<String> = (0..8)
        .map(|y| {
            (0..140)
                .map(|x| terminal.backend().buffer()[(x, y)].symbol().to_owned())
                .collect()
        })
        .collect();
    let line = |task: &str| {
        screen
            .iter()
            .find(|line| line.contains(&format!(":{task} ")))
            .cloned()
            .unwrap_or_default()
    };
    assert!(
        screen.iter().any(|line| line.contains("PORTS")),
        "{screen:#?}"
    );
    assert!(line("serving").contains("20000–20003"), "{screen:#?}");
    assert!(!line("done").contains("2000"), "{screen:#?}");
}

#[test]
fn a_stopped_task_shows_its_lease_while_its_run_goes_on_and_not_after() {
    let (mut board, _) = board(&[("held", TaskStatus::Stopped)]);
    board.runs[0].tasks[0].lease = Some(crew_core::model::LeaseRecord {
        port: Some(20_000),
        ports: 4,
        name: "crew_held".to_owned(),
        names: Vec::new(),
    });
    assert!(board.rows()[0].ports.is_some());
    board.runs[0].status = crew_core::model::RunStatus::Cancelled;
    assert_eq!(
        board.rows()[0].ports,
        None,
        "the ended run's host gave it back"
    );
}

#[test]
fn an_answer_leaves_the_question_for_the_agents_output() {
    let (mut board, run_id) = board(&[("asks", TaskStatus::Waiting)]);
    board.runs[0].tasks[0].question = Some("which color?".to_owned());
    assert_eq!(board.key(Key::Char('n')), None);
    assert_eq!(board.pane, Pane::Question);
    assert_eq!(board.key(Key::Char('a')), None);
    for c in "blue".chars() {
        assert_eq!(board.key(Key::Char(c)), None);
    }
    let agent = AgentId::new(run_id, TaskId::parse("asks").unwrap());
    assert_eq!(
        board.key(Key::Enter),
        Some(Action::Answer(agent, "blue".to_owned()))
    );
    assert_eq!(
        board.pane,
        Pane::Output,
        "no 'no question' pane after the answer"
    );
}

#[test]
fn a_provider_s_limit_is_said_in_the_header_with_when_it_goes_on() {
    let (mut board, run_id) = board(&[
        ("limited", TaskStatus::Paused),
        ("also", TaskStatus::Paused),
        ("working", TaskStatus::Running),
    ]);
    let at = |text: &str| -> crew_core::model::Timestamp {
        serde_json::from_value(serde_json::json!(text)).unwrap()
    };
    for (id, resets) in [
        ("limited", "2026-12-07T14:30:00Z"),
        ("also", "2026-12-07T14:02:00Z"),
    ] {
        let mut record = TaskRecord::new(
            TaskId::parse(id).unwrap(),
            "claude".into(),
            "work".into(),
            vec![],
            WorkspaceMode::Single,
        );
        record.status = TaskStatus::Paused;
        record.limit = Some(crew_core::model::UsageLimit {
            message: "429".into(),
            resets_at: Some(at(resets)),
            retry_at: None,
            provider: Some("anthropic".into()),
        });
        board.hear(Watched::Event(WatchEvent::Task {
            run_id: run_id.clone(),
            task_id: record.id.clone(),
            status: TaskStatus::Paused,
            task: Some(Box::new(record)),
        }));
    }
    assert_eq!(
        board.limits(),
        [("anthropic".to_owned(), Some(at("2026-12-07T14:02:00Z")))]
    );
    let header = header(&board, 160);
    assert!(
        header.contains("paused: limit of anthropic until 14:02 UTC"),
        "{header}"
    );
}

#[test]
fn a_task_at_its_spend_cap_asks_first_and_is_no_provider_s_limit() {
    let (mut board, run_id) = board(&[
        ("capped", TaskStatus::Paused),
        ("working", TaskStatus::Running),
    ]);
    let mut record = TaskRecord::new(
        TaskId::parse("capped").unwrap(),
        "claude".into(),
        "work".into(),
        vec![],
        WorkspaceMode::Single,
    );
    record.status = TaskStatus::Paused;
    record.capped = Some(crew_core::model::CapKind::Task);
    record.reason = Some("paused: it spent $1.02 and its spend cap is $1 (max_cost_usd)".into());
    board.hear(Watched::Event(WatchEvent::Task {
        run_id: run_id.clone(),
        task_id: record.id.clone(),
        status: TaskStatus::Paused,
        task: Some(Box::new(record)),
    }));
    assert!(board.limits().is_empty(), "a spend cap holds no provider");
    let rows = board.rows();
    assert_eq!(
        rows[0].agent_id.task_id().as_str(),
        "capped",
        "it comes first"
    );
    assert_eq!(rows[0].state, RowState::AtCap);
    assert!(rows[0].state.needs_you());
    let agent_id = rows[0].agent_id.clone();
    assert!(
        board
            .question(&agent_id)
            .is_some_and(|asked| asked.contains("its spend cap is $1")),
        "the pane shows what it asks"
    );
    let header = header(&board, 160);
    assert!(
        header.contains("at a spend cap: 1 (r goes on, s ends it)"),
        "{header}"
    );
}

/// The board's first line, drawn `width` wide without colour.
fn header(board: &Board, width: u16) -> String {
    screen(board, width).swap_remove(0)
}

/// The board's lines, drawn `width` wide (8 high) without colour.
fn screen(board: &Board, width: u16) -> Vec<String> {
    let backend = ratatui::backend::TestBackend::new(width, 8);
    let mut terminal = ratatui::Terminal::new(backend).unwrap();
    let looks = view::Looks {
        color: false,
        unicode: false,
    };
    terminal
        .draw(|frame| view::draw(frame, board, "project", looks))
        .unwrap();
    (0..8)
        .map(|y| {
            (0..width)
                .map(|x| terminal.backend().buffer()[(x, y)].symbol().to_owned())
                .collect()
        })
        .collect()
}

#[test]
fn a_capped_agent_shows_what_it_holds_now_and_its_cpu_time() {
    let (mut board, run_id) = board(&[("capped", TaskStatus::Running)]);
    let agent_id = AgentId::new(run_id.clone(), TaskId::parse("capped").unwrap());
    let snapshot: crew_live::AgentSnapshot = serde_json::from_value(serde_json::json!({
        "agent_id": agent_id, "run_id": run_id, "task_id": "capped",
        "workspace": std::env::temp_dir(), "agent": "shell", "dir": std::env::temp_dir(),
        "state": "running", "pid": 7, "attempt": 1, "started_at": "2026-12-07T14:00:00Z",
        "exit": null, "question": null, "queued_follow_ups": 0, "last_lines": [],
    }))
    .unwrap();
    board.hear(Watched::Agents(vec![snapshot]));
    assert!(board.has_running());
    board.set_using(vec![(
        agent_id,
        Some(crew_live::control::registry::Using {
            memory: 300 << 20,
            cpu_ms: 12_345,
        }),
    )]);
    let screen = screen(&board, 160);
    let (heading, row) = (&screen[1], &screen[2]);
    assert!(heading.contains("MEM   CPU"), "{heading}");
    assert!(row.contains("300M  12.3s"), "{row}");
}
