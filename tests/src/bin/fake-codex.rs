//! A stand-in for `codex exec --json "<prompt>"` and `codex exec --json resume <thread>
//! "<prompt>"`, for tests of the `codex-json` protocol. It replays
//! `tests/fixtures/codex-json/turn.jsonl` once and exits; what the prompt asks decides the rest:
//! - `write <file>`: the turn writes that file in the current directory;
//! - `then fail`: the turn fails (`turn.failed`), and the program exits 1.

#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

const TURN: &str = include_str!("../../fixtures/codex-json/turn.jsonl");

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let resumed = args
        .iter()
        .position(|arg| arg == "resume")
        .map(|at| args.get(at + 1).cloned().expect("resume takes a thread id"));
    let prompt = args.last().cloned().expect("a prompt");
    let thread = resumed
        .clone()
        .unwrap_or_else(|| format!("th-{}", std::process::id()));
    let text = match &resumed {
        Some(id) => format!("resumed thread {id}: {prompt}"),
        None => format!("working on: {prompt}"),
    };
    let file = prompt
        .split_once("write ")
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .unwrap_or("notes.txt")
        .to_owned();
    if prompt.contains("write ") {
        std::fs::write(&file, "written by the codex stand-in\n").unwrap();
    }
    let fail = prompt.contains("then fail");
    for line in TURN.lines() {
        let line = if fail && line.contains(r#""type":"turn.completed""#) {
            r#"{"type":"turn.failed","error":{"message":"the stand-in was told to fail"}}"#
                .to_owned()
        } else {
            line.replace("{thread_id}", &thread)
                .replace("{text}", &json_text(&text))
                .replace("{file}", &json_text(&file))
        };
        println!("{line}");
    }
    if fail {
        std::process::exit(1);
    }
}

/// `text` as it goes inside a JSON string.
fn json_text(text: &str) -> String {
    let quoted = serde_json::to_string(text).unwrap();
    quoted[1..quoted.len() - 1].to_owned()
}
