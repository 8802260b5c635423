//! Tests of `agent/protocol.rs`.

use super::*;

#[test]
fn a_session_what_the_agent_says_and_does_and_its_cost_are_read() {
    let init = read_claude_line(
        r#"{"type":"system","subtype":"init","session_id":"s-1","model":"claude-x","tools":[]}"#,
    )
    .unwrap();
    assert_eq!(init.event, Some(ProtocolEvent::Session("s-1".into())));
    let said = read_claude_line(
        r#"{"type":"assistant","message":{"content":[{"type":"text","text":"Looking.\n\nDone"},{"type":"tool_use","id":"t","name":"Bash","input":{"command":"ls -la\nmore"}}]},"session_id":"s-1"}"#,
    )
    .unwrap();
    assert_eq!(said.shown, ["Looking.", "Done", "→ Bash ls -la"]);
    // Its tools' results are counted: what failed, in its words.
    let results = read_claude_line(
        r#"{"type":"user","message":{"role":"user","content":[{"type":"tool_result","tool_use_id":"a","content":"EACCES: permission denied, open '/x'","is_error":true},{"type":"tool_result","tool_use_id":"b","content":[{"type":"text","text":"ok"}]}]},"session_id":"s-1"}"#,
    )
    .unwrap();
    assert_eq!(
        results.event,
        Some(ProtocolEvent::ToolsDone {
            succeeded: 1,
            failed: vec!["EACCES: permission denied, open '/x'".to_owned()],
            change_failed: false,
        })
    );
    // The program retrying the model's API shows, with what the API answered.
    let retry = read_claude_line(
        r#"{"type":"system","subtype":"api_retry","attempt":3,"max_retries":10,"retry_delay_ms":2017,"error_status":429,"error":"rate_limit","session_id":"s-1"}"#,
    )
    .unwrap();
    assert_eq!(
        retry.shown,
        ["[the model's API failed (HTTP 429 rate_limit): retry 3 of 10 in 2.0 s]"]
    );
    // Read back from a log, a message is what it showed, and a plain line itself.
    let logged = r#"{"type":"assistant","message":{"content":[{"type":"text","text":"Looking.\n\nDone"}]},"session_id":"s-1"}"#;
    assert_eq!(shown_lines(logged), ["Looking.", "Done"]);
    assert_eq!(shown_log([logged]), ["Looking.", "Done"]);
    assert_eq!(shown_lines("plain output"), ["plain output"]);
    assert_eq!(said.event, None);
    let result = read_claude_line(
        r#"{"type":"result","subtype":"success","is_error":false,"num_turns":3,"result":"ok","session_id":"s-1","total_cost_usd":0.25,"usage":{"input_tokens":10,"output_tokens":5,"cache_read_input_tokens":7,"cache_creation_input_tokens":1}}"#,
    )
    .unwrap();
    assert_eq!(
        result.event,
        Some(ProtocolEvent::TurnEnded {
            usage: Some(Usage {
                input_tokens: 10,
                output_tokens: 5,
                cache_read_input_tokens: 7,
                cache_creation_input_tokens: 1,
                cost_usd: Some(0.25),
                turns: 3,
                tokens_unknown: false,
            }),
            error: None,
            limit: None,
        })
    );
    let failed = read_claude_line(
        r#"{"type":"result","subtype":"error_max_turns","is_error":true,"num_turns":9,"session_id":"s-1"}"#,
    )
    .unwrap();
    assert_eq!(
        failed.event,
        Some(ProtocolEvent::TurnEnded {
            usage: None,
            error: Some("error_max_turns".into()),
            limit: None,
        })
    );
}

#[test]
fn a_codex_thread_its_commands_and_tokens_are_read() {
    let started = read_codex_line(r#"{"type":"thread.started","thread_id":"th-1"}"#).unwrap();
    assert_eq!(started.event, Some(ProtocolEvent::Session("th-1".into())));
    let command = read_codex_line(
        r#"{"type":"item.started","item":{"id":"item_1","type":"command_execution","command":"bash -lc ls","aggregated_output":"","status":"in_progress"}}"#,
    )
    .unwrap();
    assert_eq!(command.shown, ["→ $ bash -lc ls"]);
    let said = read_codex_line(
        r#"{"type":"item.completed","item":{"id":"item_2","type":"agent_message","text":"Done."}}"#,
    )
    .unwrap();
    assert_eq!(said.shown, ["Done."]);
    let edited = read_codex_line(
        r#"{"type":"item.completed","item":{"id":"item_3","type":"file_change","changes":[{"path":"a.txt","kind":"add"}],"status":"completed"}}"#,
    )
    .unwrap();
    assert_eq!(edited.shown, ["→ add a.txt"]);
    assert_eq!(
        edited.event,
        Some(ProtocolEvent::ToolsDone {
            succeeded: 1,
            failed: Vec::new(),
            change_failed: false
        })
    );
    // A failed change and a failed command are counted with their words.
    let refused = read_codex_line(
        r#"{"type":"item.completed","item":{"id":"item_4","type":"file_change","changes":[{"path":"b.txt","kind":"add"}],"status":"failed"}}"#,
    )
    .unwrap();
    assert_eq!(
        refused.event,
        Some(ProtocolEvent::ToolsDone {
            succeeded: 0,
            failed: vec!["the change add b.txt failed".to_owned()],
            change_failed: true
        })
    );
    let exited = read_codex_line(
        r#"{"type":"item.completed","item":{"id":"item_5","type":"command_execution","command":"bash -lc make","aggregated_output":"bwrap: setting up uid map: Permission denied\n","exit_code":1,"status":"failed"}}"#,
    )
    .unwrap();
    assert_eq!(exited.shown, ["  (exit 1)"]);
    assert_eq!(
        exited.event,
        Some(ProtocolEvent::ToolsDone {
            succeeded: 0,
            failed: vec![
                "`bash -lc make` exited 1: bwrap: setting up uid map: Permission denied".to_owned()
            ],
            change_failed: false
        })
    );
    let over = read_codex_line(
        r#"{"type":"turn.completed","usage":{"input_tokens":120,"cached_input_tokens":100,"output_tokens":9}}"#,
    )
    .unwrap();
    assert_eq!(
        over.event,
        Some(ProtocolEvent::TurnEnded {
            usage: Some(Usage {
                input_tokens: 20,
                cache_read_input_tokens: 100,
                output_tokens: 9,
                turns: 1,
                ..Usage::default()
            }),
            error: None,
            limit: None,
        })
    );
    let failed =
        read_codex_line(r#"{"type":"turn.failed","error":{"message":"stream error"}}"#).unwrap();
    assert_eq!(
        failed.event,
        Some(ProtocolEvent::TurnEnded {
            usage: None,
            error: Some("stream error".into()),
            limit: None,
        })
    );
    assert_eq!(
        shown_lines(r#"{"type":"turn.failed","error":{"message":"x"}}"#),
        ["[turn failed: x]"]
    );
    assert_eq!(shown_lines("plain"), ["plain"]);
}

#[test]
fn usage_limits_are_read_with_when_they_lift() {
    let claude = read_claude_line(
        r#"{"type":"result","subtype":"success","is_error":true,"num_turns":1,"result":"Claude AI usage limit reached|1762952400","session_id":"s"}"#,
    )
    .unwrap();
    let Some(ProtocolEvent::TurnEnded {
        limit: Some(limit), ..
    }) = claude.event
    else {
        panic!("{claude:?}");
    };
    assert_eq!(limit.message, "Claude AI usage limit reached");
    assert_eq!(
        limit.resets_at.unwrap().to_string(),
        "2025-11-12T13:00:00.000Z"
    );
    // A clock time in a named zone is the next such time there.
    let newer = usage_limit("You've hit your limit · resets 2am (UTC)").unwrap();
    let wait = newer
        .resets_at
        .unwrap()
        .0
        .duration_since(std::time::SystemTime::now());
    assert!(wait.unwrap().as_secs() <= 86_400, "{newer:?}");
    let before = std::time::SystemTime::now();
    let codex = read_codex_line(
        r#"{"type":"turn.failed","error":{"message":"You've hit your usage limit. Upgrade to Pro, or try again in 2 hours 5 minutes."}}"#,
    )
    .unwrap();
    let Some(ProtocolEvent::TurnEnded {
        limit: Some(limit), ..
    }) = codex.event
    else {
        panic!("{codex:?}");
    };
    let wait = limit.resets_at.unwrap().0.duration_since(before).unwrap();
    assert!((7_500..7_510).contains(&wait.as_secs()), "{wait:?}");
    // A failure that is not a limit is not one.
    assert_eq!(usage_limit("stream error"), None);
    let plain = read_claude_line(
        r#"{"type":"result","subtype":"success","is_error":false,"num_turns":1,"result":"I looked at the rate limit code","session_id":"s"}"#,
    )
    .unwrap();
    assert!(matches!(
        plain.event,
        Some(ProtocolEvent::TurnEnded { limit: None, .. })
    ));
}

#[test]
fn an_acp_log_reads_back_as_it_was_shown_live() {
    let transcript = include_str!("../../../../tests/fixtures/acp/turn.jsonl");
    assert_eq!(
        shown_log(transcript.lines()),
        [
            "→ Write notes.txt",
            "wrote notes.txt",
            "→ Read notes.txt",
            "read notes.txt: from the client",
            "→ Run echo hello",
            "ran `echo hello`: exit 0: hello",
            "[turn over: end_turn]",
        ]
    );
    // The other protocols and plain lines read as they do line by line.
    assert_eq!(
        shown_log(["plain", r#"{"type":"turn.failed","error":{"message":"x"}}"#]),
        ["plain", "[turn failed: x]"]
    );
}

#[test]
fn what_is_not_a_message_is_told_apart() {
    assert!(is_json_rpc(
        r#"{"jsonrpc":"2.0","method":"session/update","params":{}}"#
    ));
    assert!(!is_json_rpc(r#"{"jsonrpc":"1.0","id":1}"#));
    assert!(!is_json_rpc(r#"{"type":"result"}"#));
    assert!(!is_json_rpc(r#"{"jsonrpc":"2.0","id":"#));
    assert!(!is_json_rpc("this line is not JSON-RPC"));
    assert_eq!(read_claude_line("plain text"), None);
    assert_eq!(read_claude_line(r#"{"no":"type"}"#), None);
    assert_eq!(read_claude_line(r#"{"type":"result","usage":"#), None);
    // A message type this reader does not know is a message all the same.
    assert_eq!(
        read_claude_line(r#"{"type":"stream_event","event":{}}"#),
        Some(Reading::default())
    );
}

#[test]
fn long_lines_are_read_whole_up_to_the_limit() {
    let mut lines = MessageLines::default();
    let long = "x".repeat(100_000);
    assert!(lines.push(long.as_bytes()).is_empty());
    assert_eq!(lines.push(b"\nnext\n"), [Ok(long), Ok("next".to_owned())]);
    let overlong = vec![b'y'; MAX_MESSAGE_BYTES + 10];
    lines.push(&overlong);
    let completed = lines.push(b"\n");
    assert!(matches!(&completed[..], [Err(start)] if start.len() == MAX_MESSAGE_BYTES));
}
