//! What a host refused, as the verbs give it to their callers.

/// What a host refused, and why: its code, for programs, and its message, for people.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Refusal {
    /// The code (`forbidden`, `foreign_workspace`, `steer_unsupported`, …).
    pub code: crate::control::ErrorCode,
    /// The host's message.
    pub message: String,
}

impl From<crate::control::ErrorBody> for Refusal {
    fn from(error: crate::control::ErrorBody) -> Self {
        Refusal {
            code: error.code,
            message: error.message,
        }
    }
}
