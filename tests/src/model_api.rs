//! A stand-in of the model APIs that the real agent programs call: an HTTP server on
//! 127.0.0.1 that answers Anthropic's Messages API (Claude Code), OpenAI's Responses API
//! (Codex), OpenAI's Chat Completions (aider) and Google's Gemini API (Gemini CLI), with
//! server-sent events and tool calls, as a
//! scripted model would. The agent program under test is real — its tools, its session files, its
//! retries; only the model's answers come from the test's script.
//!
//! A script is a list of [`Reply`]s. The conversation's main requests (streamed, with tools)
//! take the reply at the index of the assistant turns the request already holds, so a tool
//! call is followed by the next reply once the program sent the tool's result back, and a
//! follow-up turn or a resumed session goes on where the last one stopped. Side requests (a
//! title, a quota probe: no tools) get a short text. Every main request is kept for the test
//! to read.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

mod concurrency;
use concurrency::Concurrency;

/// One answer of the scripted model.
#[derive(Debug, Clone)]
pub enum Reply {
    /// Calls the program's tool `name` with `input`, then waits for the tool's result.
    Tool { name: String, input: Value },
    /// Says `text` and ends the turn.
    Say(String),
    /// Answers the request with HTTP `status` and the API's error body, with a `retry-after`
    /// header when given. The same reply is given again to every retry of this step.
    Fail {
        status: u16,
        message: String,
        retry_after: Option<u64>,
    },
}

impl Reply {
    /// A call of the tool `name`.
    pub fn tool(name: &str, input: Value) -> Self {
        Reply::Tool {
            name: name.to_owned(),
            input,
        }
    }

    /// A text that ends the turn.
    pub fn say(text: &str) -> Self {
        Reply::Say(text.to_owned())
    }
}

#[derive(Debug, Default)]
struct Shared {
    script: Vec<Reply>,
    requests: Vec<Value>,
    /// Failures that answer the next main requests, before the script goes on.
    failures: std::collections::VecDeque<Reply>,
    /// Failures that answer the next main requests at a step of the script, each with its step.
    failures_at: Vec<(usize, Reply)>,
    /// The keys requests carried.
    keys: Vec<String>,
    /// A limit on main requests at once (see [`ModelApi::limit_concurrency`]).
    concurrency: Option<Concurrency>,
    /// Main requests being answered now, under that limit.
    in_flight: usize,
    /// Main requests refused by it.
    refused_at_once: usize,
}

/// The running stand-in; it stops with the test process.
#[derive(Debug, Clone)]
pub struct ModelApi {
    url: String,
    shared: Arc<Mutex<Shared>>,
}

impl ModelApi {
    /// Starts the stand-in with `script` on a free port of 127.0.0.1.
    pub fn start(script: Vec<Reply>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let shared = Arc::new(Mutex::new(Shared {
            script,
            ..Shared::default()
        }));
        let serving = Arc::clone(&shared);
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let shared = Arc::clone(&serving);
                std::thread::spawn(move || {
                    let _ = serve(stream, &shared);
                });
            }
        });
        ModelApi { url, shared }
    }

    /// The base URL to give the program (`ANTHROPIC_BASE_URL`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Answers the next `times` main requests with HTTP `status` (and `retry-after`), whatever
    /// the script says; the script goes on after them where it was.
    pub fn fail_next(&self, times: usize, status: u16, retry_after: Option<u64>) {
        let failure = Reply::Fail {
            status,
            message: format!("stand-in says {status}"),
            retry_after,
        };
        self.shared
            .lock()
            .unwrap()
            .failures
            .extend(std::iter::repeat_n(failure, times));
    }

    /// Answers the next `times` main requests at step `turn` of the script (the requests that
    /// already hold `turn` of its replies) with HTTP `status` (and `retry-after`): a limit met
    /// in the middle of the work.
    pub fn fail_at(&self, turn: usize, times: usize, status: u16, retry_after: Option<u64>) {
        let failure = Reply::Fail {
            status,
            message: format!("stand-in says {status}"),
            retry_after,
        };
        self.shared
            .lock()
            .unwrap()
            .failures_at
            .extend(std::iter::repeat_n((turn, failure), times));
    }

    /// Answers Anthropic's main requests beyond `most` at once with 429 (`retry-after`), and
    /// takes `hold` over each it answers: a provider's limit on concurrent requests.
    pub fn limit_concurrency(&self, most: usize, hold: std::time::Duration, retry_after: u64) {
        self.shared.lock().unwrap().concurrency = Some(Concurrency {
            most,
            hold,
            retry_after,
        });
    }

    /// How many main requests the limit on concurrent requests refused.
    pub fn refused_at_once(&self) -> usize {
        self.shared.lock().unwrap().refused_at_once
    }

    /// The keys every request carried (`x-api-key`, a bearer token, `x-goog-api-key`, a `key`
    /// parameter), in order.
    pub fn keys(&self) -> Vec<String> {
        self.shared.lock().unwrap().keys.clone()
    }

    /// The main requests received so far, in order.
    pub fn requests(&self) -> Vec<Value> {
        self.shared.lock().unwrap().requests.clone()
    }

    /// Every text the program sent as the user's, in order: the prompts, follow-ups and tool
    /// results of all main requests, as one string for `contains` checks.
    pub fn user_texts(&self) -> String {
        let requests = self.requests();
        let Some(last) = requests.last() else {
            return String::new();
        };
        let mut texts = String::new();
        // Anthropic's `messages`, the Responses API's `input` items (tool outputs are the
        // items' `output`), or Gemini's `contents` (their `parts`).
        let items = last["messages"]
            .as_array()
            .or(last["input"].as_array())
            .or(last["contents"].as_array());
        for item in items.into_iter().flatten() {
            if let Some(output) = item["output"].as_str() {
                texts.push_str(output);
                texts.push('\n');
            }
            if item["role"] == "user" {
                collect_texts(&item["content"], &mut texts);
                collect_texts(&item["parts"], &mut texts);
            }
        }
        texts
    }
}

fn collect_texts(content: &Value, out: &mut String) {
    match content {
        Value::String(text) => {
            out.push_str(text);
            out.push('\n');
        }
        Value::Array(blocks) => {
            for block in blocks {
                if let Some(text) = block["text"].as_str() {
                    out.push_str(text);
                    out.push('\n');
                }
                collect_texts(&block["content"], out);
            }
        }
        _ => {}
    }
}

/// Whether `text` is one of the script's texts (not one the program added).
fn says(script: &[Reply], text: &str) -> bool {
    script
        .iter()
        .any(|reply| matches!(reply, Reply::Say(said) if said == text))
}

/// How many of the script's replies the conversation of `request` already holds: each reply
/// is one block of an assistant message, a tool call or one of the script's texts. Programs
/// merge consecutive assistant messages, and add texts of their own to a conversation (after
/// an interruption), so the script's blocks are counted, not the messages.
fn replies_given(request: &Value, script: &[Reply]) -> usize {
    let scripted = |text: &str| says(script, text);
    request["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|message| message["role"] == "assistant")
        .map(|message| match &message["content"] {
            Value::String(text) => usize::from(scripted(text)),
            Value::Array(blocks) => blocks
                .iter()
                .filter(|block| {
                    block["type"] == "tool_use"
                        || (block["type"] == "text" && block["text"].as_str().is_some_and(scripted))
                })
                .count(),
            _ => 0,
        })
        .sum()
}

/// A tool call by the name the request offers the tool under: an adapter that serves a tool
/// itself offers it under its own prefix (claude-code-acp's `mcp__acp__Bash` for `Bash`).
fn offered_name(reply: Reply, request: &Value) -> Reply {
    let Reply::Tool { name, input } = reply else {
        return reply;
    };
    let offered: Vec<&str> = request["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|tool| tool["name"].as_str())
        .collect();
    let name = if offered.contains(&name.as_str()) {
        name
    } else {
        let suffix = format!("__{name}");
        offered
            .iter()
            .find(|offered| offered.ends_with(&suffix))
            .map_or(name, |offered| (*offered).to_owned())
    };
    Reply::Tool { name, input }
}

/// Keeps `request` and takes the script's reply for it: the one after those its conversation
/// already holds, as `given` counts them.
fn next_reply(
    shared: &Mutex<Shared>,
    request: &Value,
    given: fn(&Value, &[Reply]) -> usize,
) -> Reply {
    let mut shared = shared.lock().unwrap();
    let turn = given(request, &shared.script);
    shared.requests.push(request.clone());
    if let Some(failure) = shared.failures.pop_front() {
        return failure;
    }
    if let Some(at) = shared.failures_at.iter().position(|(at, _)| *at == turn) {
        return shared.failures_at.remove(at).1;
    }
    shared
        .script
        .get(turn)
        .cloned()
        .unwrap_or_else(|| Reply::say("(the script has nothing more)"))
}

/// Serves one connection: one request, then the connection closes (the reply says so).
fn serve(stream: TcpStream, shared: &Mutex<Shared>) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    let mut length = 0usize;
    let mut keys = Vec::new();
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header)? == 0 || header == "\r\n" || header == "\n" {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            let name = name.trim().to_ascii_lowercase();
            if name == "content-length" {
                length = value.trim().parse().unwrap_or(0);
            }
            if ["x-api-key", "authorization", "x-goog-api-key"].contains(&name.as_str()) {
                keys.push(value.trim().trim_start_matches("Bearer ").to_owned());
            }
        }
    }
    if let Some((_, query)) = request_line
        .split_whitespace()
        .nth(1)
        .unwrap_or("")
        .split_once('?')
    {
        keys.extend(
            query
                .split('&')
                .filter_map(|pair| pair.strip_prefix("key="))
                .map(str::to_owned),
        );
    }
    shared.lock().unwrap().keys.extend(keys);
    let mut body = vec![0; length];
    reader.read_exact(&mut body)?;
    let mut out = stream;
    let path = request_line.split_whitespace().nth(1).unwrap_or("/");
    if request_line.starts_with("POST ") && path.starts_with("/v1/responses") {
        return openai_responses(&mut out, &body, shared);
    }
    if request_line.starts_with("POST ") && path.contains("/models/") {
        return gemini(&mut out, path, &body, shared);
    }
    if request_line.starts_with("POST ") && path.starts_with("/v1/chat/completions") {
        return chat_completions(&mut out, &body, shared);
    }
    if !request_line.starts_with("POST ") || !path.starts_with("/v1/messages") {
        return respond(&mut out, 404, "application/json", b"{}", None);
    }
    if path.starts_with("/v1/messages/count_tokens") {
        return respond(
            &mut out,
            200,
            "application/json",
            br#"{"input_tokens":10}"#,
            None,
        );
    }
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let streamed = request["stream"].as_bool() == Some(true);
    let main = streamed
        && request["tools"]
            .as_array()
            .is_some_and(|tools| !tools.is_empty());
    // Under a limit on requests at once: refused above it, held for a while within it.
    let _admitted = match main.then(|| concurrency::admit(shared)).flatten() {
        Some(Err(retry_after)) => return concurrency::refuse(&mut out, retry_after),
        Some(Ok(admitted)) => Some(admitted),
        None => None,
    };
    let reply = if main {
        next_reply(shared, &request, replies_given)
    } else {
        Reply::say("ok")
    };
    let reply = offered_name(reply, &request);
    let model = request["model"].as_str().unwrap_or("claude-stand-in");
    match reply {
        Reply::Fail {
            status,
            message,
            retry_after,
        } => {
            let kind = match status {
                401 => "authentication_error",
                429 => "rate_limit_error",
                529 => "overloaded_error",
                _ => "api_error",
            };
            let body = json!({"type": "error", "error": {"type": kind, "message": message}});
            respond(
                &mut out,
                status,
                "application/json",
                body.to_string().as_bytes(),
                retry_after,
            )
        }
        reply if streamed => {
            let events = anthropic_events(model, &reply);
            respond(&mut out, 200, "text/event-stream", events.as_bytes(), None)
        }
        reply => {
            let Reply::Say(text) = reply else {
                unreachable!("side requests are answered with text")
            };
            let body = json!({
                "id": "msg_side", "type": "message", "role": "assistant", "model": model,
                "content": [{"type": "text", "text": text}],
                "stop_reason": "end_turn", "stop_sequence": null,
                "usage": {"input_tokens": 1, "output_tokens": 1},
            });
            respond(
                &mut out,
                200,
                "application/json",
                body.to_string().as_bytes(),
                None,
            )
        }
    }
}

/// Answers OpenAI's Responses API (what Codex calls): the conversation is the request's
/// `input` items, and each reply one output item — a message, or a call of a tool: a custom
/// (freeform) tool when the reply's input is a string (Codex's `exec`, which runs JavaScript
/// calling its nested tools), a function with JSON arguments otherwise.
fn openai_responses(
    out: &mut TcpStream,
    body: &[u8],
    shared: &Mutex<Shared>,
) -> std::io::Result<()> {
    let request: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let reply = next_reply(shared, &request, responses_given);
    let item = match reply {
        Reply::Fail {
            status,
            message,
            retry_after,
        } => {
            let code = match status {
                401 => "invalid_api_key",
                429 => "rate_limit_exceeded",
                _ => "server_error",
            };
            return openai_error(out, status, &message, Some(code), retry_after);
        }
        Reply::Say(text) => json!({
            "type": "message", "role": "assistant", "id": format!("msg_{:08x}", next_call_id()),
            "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }),
        Reply::Tool { name, input } => {
            let id = next_call_id();
            match input {
                Value::String(input) => json!({
                    "type": "custom_tool_call", "id": format!("ctc_{id:08x}"),
                    "call_id": format!("call_{id:08x}"), "name": name, "input": input,
                    "status": "completed",
                }),
                input => json!({
                    "type": "function_call", "id": format!("fc_{id:08x}"),
                    "call_id": format!("call_{id:08x}"), "name": name,
                    "arguments": input.to_string(), "status": "completed",
                }),
            }
        }
    };
    let id = format!("resp_{:08x}", next_call_id());
    let mut events = String::new();
    let mut event = |data: Value| {
        let name = data["type"].as_str().unwrap_or_default().to_owned();
        events.push_str(&format!("event: {name}\ndata: {data}\n\n"));
    };
    event(json!({"type": "response.created", "response": {"id": id}}));
    event(json!({"type": "response.output_item.added", "output_index": 0, "item": item}));
    event(json!({"type": "response.output_item.done", "output_index": 0, "item": item}));
    event(
        json!({"type": "response.completed", "response": {"id": id, "usage": {
            "input_tokens": 120, "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 20, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 140,
        }}}),
    );
    respond(out, 200, "text/event-stream", events.as_bytes(), None)
}

/// An OpenAI API error: HTTP `status` and the API's error body.
fn openai_error(
    out: &mut TcpStream,
    status: u16,
    message: &str,
    code: Option<&str>,
    retry_after: Option<u64>,
) -> std::io::Result<()> {
    let body = json!({"error": {"message": message, "type": "invalid_request_error",
        "code": code, "param": null}});
    respond(
        out,
        status,
        "application/json",
        body.to_string().as_bytes(),
        retry_after,
    )
}

/// Answers OpenAI's Chat Completions API (what aider calls, through `OPENAI_API_BASE`): the
/// conversation is the request's `messages`; a reply is a text (aider's edits and commands are
/// in its words), streamed as chunks when the request streams.
fn chat_completions(
    out: &mut TcpStream,
    body: &[u8],
    shared: &Mutex<Shared>,
) -> std::io::Result<()> {
    let request: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let reply = next_reply(shared, &request, replies_given);
    let text = match reply {
        Reply::Fail {
            status,
            message,
            retry_after,
        } => return openai_error(out, status, &message, None, retry_after),
        Reply::Say(text) => text,
        Reply::Tool { name, .. } => panic!("a chat completion calls no tool ({name})"),
    };
    let id = format!("chatcmpl-{:08x}", next_call_id());
    let model = request["model"].as_str().unwrap_or("stand-in").to_owned();
    let usage = json!({"prompt_tokens": 120, "completion_tokens": 20, "total_tokens": 140});
    if request["stream"] != true {
        let body = json!({"id": id, "object": "chat.completion", "created": 0, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                "finish_reason": "stop"}], "usage": usage});
        return respond(
            out,
            200,
            "application/json",
            body.to_string().as_bytes(),
            None,
        );
    }
    let chunk = |delta: Value, finish: Value| {
        json!({"id": id, "object": "chat.completion.chunk", "created": 0, "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    };
    let mut events = String::new();
    for data in [
        chunk(json!({"role": "assistant", "content": text}), Value::Null),
        chunk(json!({}), json!("stop")),
    ] {
        events.push_str(&format!("data: {data}\n\n"));
    }
    events.push_str("data: [DONE]\n\n");
    respond(out, 200, "text/event-stream", events.as_bytes(), None)
}

/// Answers Google's Gemini API (what Gemini CLI calls, `GOOGLE_GEMINI_BASE_URL`): the
/// conversation is the request's `contents`, each reply one part of a `model` turn — a text or
/// a `functionCall`. `:streamGenerateContent` is answered with server-sent events, and
/// requests without tools (Gemini CLI's own checks) with a short text.
fn gemini(
    out: &mut TcpStream,
    path: &str,
    body: &[u8],
    shared: &Mutex<Shared>,
) -> std::io::Result<()> {
    let request: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    if path.contains(":countTokens") {
        return respond(out, 200, "application/json", br#"{"totalTokens":10}"#, None);
    }
    let main = request["tools"]
        .as_array()
        .is_some_and(|tools| !tools.is_empty());
    let config = &request["generationConfig"];
    let schema = config
        .get("responseJsonSchema")
        .or_else(|| config.get("responseSchema"));
    let reply = match schema {
        _ if main => next_reply(shared, &request, gemini_given),
        // Gemini CLI's own checks (which model, who speaks next) want JSON of a schema.
        Some(schema) => Reply::Say(satisfying(schema).to_string()),
        None => Reply::say("ok"),
    };
    let part = match reply {
        Reply::Fail {
            status,
            message,
            retry_after,
        } => {
            let code = match status {
                401 => "UNAUTHENTICATED",
                429 => "RESOURCE_EXHAUSTED",
                _ => "INTERNAL",
            };
            let body = json!({"error": {"code": status, "message": message, "status": code}});
            return respond(
                out,
                status,
                "application/json",
                body.to_string().as_bytes(),
                retry_after,
            );
        }
        Reply::Say(text) => json!({"text": text}),
        Reply::Tool { name, input } => json!({"functionCall": {
            "name": name, "args": input, "id": format!("call_{:08x}", next_call_id()),
        }}),
    };
    let chunk = json!({
        "candidates": [{"content": {"role": "model", "parts": [part]}, "finishReason": "STOP",
            "index": 0}],
        "usageMetadata": {"promptTokenCount": 120, "candidatesTokenCount": 20,
            "totalTokenCount": 140},
        "modelVersion": "gemini-stand-in",
    });
    if path.contains(":streamGenerateContent") {
        let events = format!("data: {chunk}\r\n\r\n");
        respond(out, 200, "text/event-stream", events.as_bytes(), None)
    } else {
        respond(
            out,
            200,
            "application/json",
            chunk.to_string().as_bytes(),
            None,
        )
    }
}

/// The plainest value of a JSON schema: each required property, the first of an enum, the
/// least of a number, an empty list.
fn satisfying(schema: &Value) -> Value {
    if let Some(first) = schema["enum"].as_array().and_then(|values| values.first()) {
        return first.clone();
    }
    let kind = schema["type"]
        .as_str()
        .unwrap_or("object")
        .to_ascii_lowercase();
    match kind.as_str() {
        "object" => {
            let mut object = serde_json::Map::new();
            let required = schema["required"].as_array().cloned().unwrap_or_default();
            for name in required.iter().filter_map(Value::as_str) {
                object.insert(name.to_owned(), satisfying(&schema["properties"][name]));
            }
            Value::Object(object)
        }
        "string" => json!("stand-in"),
        "integer" | "number" => schema.get("minimum").cloned().unwrap_or(json!(1)),
        "boolean" => json!(false),
        "array" => json!([]),
        _ => Value::Null,
    }
}

/// As [`replies_given`], for a Gemini request: the function calls and the script's texts
/// among the parts of its `model` turns.
fn gemini_given(request: &Value, script: &[Reply]) -> usize {
    let scripted = |text: &str| says(script, text);
    request["contents"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|content| content["role"] == "model")
        .flat_map(|content| content["parts"].as_array().into_iter().flatten())
        .filter(|part| {
            part.get("functionCall").is_some() || part["text"].as_str().is_some_and(scripted)
        })
        .count()
}

/// As [`replies_given`], for a Responses request: the tool calls and the script's texts among
/// its `input` items.
fn responses_given(request: &Value, script: &[Reply]) -> usize {
    let scripted = |text: &str| says(script, text);
    request["input"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|item| match item["type"].as_str() {
            Some("custom_tool_call" | "function_call") => true,
            Some("message") if item["role"] == "assistant" => item["content"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|part| part["text"].as_str().is_some_and(scripted)),
            _ => false,
        })
        .count()
}

/// The server-sent events of one streamed Messages reply.
fn anthropic_events(model: &str, reply: &Reply) -> String {
    let mut events = String::new();
    let mut event = |name: &str, data: Value| {
        events.push_str(&format!("event: {name}\ndata: {data}\n\n"));
    };
    event(
        "message_start",
        json!({"type": "message_start", "message": {
            "id": "msg_stand_in", "type": "message", "role": "assistant", "model": model,
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": 120, "output_tokens": 1},
        }}),
    );
    let stop_reason = match reply {
        Reply::Tool { name, input } => {
            event(
                "content_block_start",
                json!({"type": "content_block_start", "index": 0, "content_block": {
                    "type": "tool_use", "id": format!("toolu_{:08x}", next_call_id()),
                    "name": name, "input": {},
                }}),
            );
            event(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 0, "delta": {
                    "type": "input_json_delta", "partial_json": input.to_string(),
                }}),
            );
            "tool_use"
        }
        Reply::Say(text) => {
            event(
                "content_block_start",
                json!({"type": "content_block_start", "index": 0,
                    "content_block": {"type": "text", "text": ""}}),
            );
            event(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 0,
                    "delta": {"type": "text_delta", "text": text}}),
            );
            "end_turn"
        }
        Reply::Fail { .. } => unreachable!("failures are not streamed"),
    };
    event(
        "content_block_stop",
        json!({"type": "content_block_stop", "index": 0}),
    );
    event(
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": stop_reason,
            "stop_sequence": null}, "usage": {"output_tokens": 20}}),
    );
    event("message_stop", json!({"type": "message_stop"}));
    events
}

/// A tool call's id, different for each call of the process.
fn next_call_id() -> u32 {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

fn respond(
    out: &mut TcpStream,
    status: u16,
    content_type: &str,
    body: &[u8],
    retry_after: Option<u64>,
) -> std::io::Result<()> {
    let reason = match status {
        200 => "OK",
        401 => "Unauthorized",
        404 => "Not Found",
        429 => "Too Many Requests",
        _ => "Error",
    };
    let mut head = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n",
        body.len()
    );
    if let Some(seconds) = retry_after {
        head.push_str(&format!("retry-after: {seconds}\r\n"));
    }
    head.push_str("\r\n");
    out.write_all(head.as_bytes())?;
    out.write_all(body)?;
    out.flush()
}
