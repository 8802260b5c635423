//! One mapping from what went wrong to what an MCP client receives, for every tool (jj's
//! `command_error.rs` keeps one per surface). What the caller can correct is the tool's
//! result with `isError` set, as the MCP specification asks of tool errors since 2025-11-25
//! (the model reads it and tries again): its message and hints as text, and as data in
//! `_meta` (`crew/kind`: `arguments` for arguments the tool cannot take, `refused` for what it
//! could not do as asked — a run or task that is not there, a host's refusal; `crew/hints`).
//! crew's own failure is a protocol error, "internal error" (-32603), its hints as its data.

use rmcp::ErrorData;
use rmcp::handler::server::tool::IntoCallToolResult;
use rmcp::model::{CallToolResponse, CallToolResult, ContentBlock, MetaObject};
use serde_json::json;

use crate::error::{CliError, ErrorKind};

/// Why a tool did not do what it was asked.
#[derive(Debug)]
pub(super) enum ToolError {
    /// Its arguments cannot be taken as given (`message` names the argument): nothing was
    /// done.
    Arguments(String),
    /// It could not do what was asked, as asked (the caller's mistake, a refusal).
    Refused {
        /// What went wrong, with its causes.
        message: String,
        /// What to do about it.
        hints: Vec<String>,
    },
    /// crew itself failed.
    Internal {
        /// What went wrong, with its causes.
        message: String,
        /// What to do about it.
        hints: Vec<String>,
    },
}

impl ToolError {
    /// Arguments that cannot be taken: `message` names the argument.
    pub(super) fn arguments(message: impl Into<String>) -> Self {
        ToolError::Arguments(message.into())
    }

    /// A refusal of what was asked, saying why.
    pub(super) fn refused(message: impl Into<String>) -> Self {
        ToolError::Refused {
            message: message.into(),
            hints: Vec::new(),
        }
    }
}

/// The message of a command's error and its causes, one a line, without its hints.
fn message_of(error: &CliError) -> String {
    let mut message = error.error.to_string();
    let mut source = error.error.source();
    while let Some(cause) = source {
        message.push_str(&format!("\ncaused by: {cause}"));
        source = cause.source();
    }
    message
}

impl From<CliError> for ToolError {
    /// A user's mistake is a refusal; a failure of crew (or a result not to take) internal.
    fn from(error: CliError) -> Self {
        let message = message_of(&error);
        let hints = error.hints;
        match error.kind {
            ErrorKind::User => ToolError::Refused { message, hints },
            ErrorKind::Internal | ErrorKind::Failure => ToolError::Internal { message, hints },
        }
    }
}

impl IntoCallToolResult for ToolError {
    fn into_call_tool_result(self) -> Result<CallToolResponse, ErrorData> {
        match self {
            ToolError::Arguments(message) => Ok(tool_error("arguments", message, &[])),
            ToolError::Refused { message, hints } => Ok(tool_error("refused", message, &hints)),
            ToolError::Internal { message, hints } => Err(ErrorData::internal_error(
                message,
                (!hints.is_empty()).then(|| json!({ "hints": hints })),
            )),
        }
    }
}

/// A tool's result that says why it did not do what it was asked.
fn tool_error(kind: &str, message: String, hints: &[String]) -> CallToolResponse {
    let mut text = message;
    for hint in hints {
        text.push_str(&format!("\nhint: {hint}"));
    }
    let mut result = CallToolResult::error(vec![ContentBlock::text(text)]);
    let mut meta = serde_json::Map::new();
    meta.insert("crew/kind".to_owned(), json!(kind));
    if !hints.is_empty() {
        meta.insert("crew/hints".to_owned(), json!(hints));
    }
    result.meta = Some(MetaObject(meta));
    result.into()
}
