//! A stand-in for `claude -p --input-format stream-json --output-format stream-json --verbose`
//! (`--resume <session>` takes a session up again), for tests of the `claude-stream-json`
//! protocol. Each turn replays `tests/fixtures/claude-stream-json/turn.jsonl`; what the user
//! message asks decides the rest:
//! - `write <file>`: the turn writes that file in the current directory;
//! - `wait for steer`: the turn reads one more message before it ends and says `steered: <it>`;
//! - `emit garbage`: a line that is not stream-json comes first;
//! - `then fail`: the turn ends in an error, and the program exits 1;
//! - `then hit the limit` (`… for <n> seconds`): the turn ends in Claude Code's usage-limit
//!   error (`Claude AI usage limit reached|<unix seconds>`, as its issue tracker shows it; the
//!   reset two hours on, or `n` seconds), and the program exits 1; `then hit a limit that
//!   says no reset`: the same error without the bar and the time;
//! - `then stay`: after its result it neither reads nor exits (as a program that lingers);
//! - `at every start`: with `then hit the limit`, every later start of the program in that
//!   directory hits the limit again at once (a limit that outlasts the reset it said).
//!
//! It reads user messages until its input ends, then exits 0.

#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, Write};

const TURN: &str = include_str!("../../fixtures/claude-stream-json/turn.jsonl");

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let resumed = args
        .iter()
        .position(|arg| arg == "--resume")
        .and_then(|at| args.get(at + 1).cloned());
    let session = resumed
        .clone()
        .unwrap_or_else(|| format!("sess-{}", std::process::id()));
    let cwd = std::env::current_dir().unwrap().display().to_string();
    let mut input = std::io::stdin().lock().lines();
    let mut first = true;
    while let Some(Ok(line)) = input.next() {
        let mut text = user_text(&line);
        if text.contains("at every start") {
            std::fs::write(".limited-at-every-start", &text).unwrap();
        } else if let Ok(first) = std::fs::read_to_string(".limited-at-every-start") {
            text = first;
        }
        if text.contains("emit garbage") {
            say("this line is not stream-json");
        }
        let mut answer = match &resumed {
            Some(id) if first => format!("resumed session {id}: {text}"),
            _ => format!("working on: {text}"),
        };
        if text.contains("wait for steer") {
            let steer = input.next().expect("a steer").unwrap();
            answer = format!("steered: {}", user_text(&steer));
        }
        let file = text
            .split_once("write ")
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .map(str::to_owned)
            .unwrap_or_else(|| "notes.txt".to_owned());
        if text.contains("write ") {
            std::fs::write(&file, "written by the stand-in\n").unwrap();
        }
        let limit = text.contains("then hit the limit") || text.contains("then hit a limit");
        let fail = text.contains("then fail") || limit;
        for (index, template) in TURN.lines().enumerate() {
            // The init message starts a session, or takes it up again: once per process.
            if index == 0 && !first {
                continue;
            }
            let template = if limit {
                let resets = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_secs()
                    + limit_seconds(&text);
                let result = if text.contains("says no reset") {
                    "Claude AI usage limit reached".to_owned()
                } else {
                    format!("Claude AI usage limit reached|{resets}")
                };
                template
                    .replace(r#""is_error":false"#, r#""is_error":true"#)
                    .replace(r#""result":"{text}""#, &format!(r#""result":"{result}""#))
            } else if fail {
                template.replace(
                    r#""subtype":"success","is_error":false"#,
                    r#""subtype":"error_during_execution","is_error":true"#,
                )
            } else {
                template.to_owned()
            };
            say(&template
                .replace("{session_id}", &session)
                .replace("{cwd}", &json_text(&cwd))
                .replace("{text}", &json_text(&answer))
                .replace("{file}", &json_text(&file)));
        }
        first = false;
        if fail {
            std::process::exit(1);
        }
        if text.contains("then stay") {
            loop {
                std::thread::park();
            }
        }
    }
}

/// The text of a stream-json user message.
fn user_text(line: &str) -> String {
    let message: serde_json::Value = serde_json::from_str(line).expect("a stream-json message");
    assert_eq!(message["type"], "user", "{line}");
    message["message"]["content"]
        .as_str()
        .expect("text content")
        .to_owned()
}

/// `text` as it goes inside a JSON string.
fn json_text(text: &str) -> String {
    let quoted = serde_json::to_string(text).unwrap();
    quoted[1..quoted.len() - 1].to_owned()
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").unwrap();
    out.flush().unwrap();
}

/// How long the limit of `then hit the limit for <n> seconds` lasts: two hours unless said.
fn limit_seconds(text: &str) -> u64 {
    text.split_once("then hit the limit for ")
        .and_then(|(_, rest)| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or(7200)
}
