//! The one error type of the `crew` command, its exit codes and how it is printed.

use std::fmt::Write as _;
use std::process::ExitCode;

/// What kind of failure ended a command; each maps to a documented exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The user asked for something that cannot be done as asked (bad arguments, bad config,
    /// an unknown run, a dirty leader). Nothing was changed. Exit code 2.
    User,
    /// crew itself failed (a file it could not write, a process it could not start). Exit 1.
    Internal,
}

/// A command that failed: the message, its causes and what to do about it.
#[derive(Debug)]
pub struct CliError {
    pub kind: ErrorKind,
    pub error: Box<dyn std::error::Error + Send + Sync>,
    pub hints: Vec<String>,
}

impl CliError {
    pub fn user(error: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        CliError {
            kind: ErrorKind::User,
            error: error.into(),
            hints: Vec::new(),
        }
    }

    pub fn internal(error: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        CliError {
            kind: ErrorKind::Internal,
            error: error.into(),
            hints: Vec::new(),
        }
    }

    pub fn with_hint(mut self, hint: impl Into<String>) -> Self {
        self.hints.push(hint.into());
        self
    }

    /// `error:` with the message, `caused by:` for each source, then `hint:` lines.
    pub fn render(&self) -> String {
        let mut text = format!("error: {}\n", self.error);
        let mut source = self.error.source();
        while let Some(cause) = source {
            let _ = writeln!(text, "caused by: {cause}");
            source = cause.source();
        }
        for hint in &self.hints {
            let _ = writeln!(text, "hint: {hint}");
        }
        text
    }
}

/// The exit codes of `crew`, as documented in the README.
pub mod exit_code {
    /// Everything asked for was done.
    pub const SUCCESS: u8 = 0;
    /// A task failed, or crew failed at run time.
    pub const FAILURE: u8 = 1;
    /// Usage or configuration error, or another mistake of the request; nothing was changed.
    pub const USAGE: u8 = 2;
    /// Interrupted by Ctrl-C.
    pub const INTERRUPTED: u8 = 130;
}

/// What a command that did not fail reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Success,
    /// The command ran, but a task it ran failed.
    TaskFailed,
    Interrupted,
}

/// Prints the error (if any) to stderr and turns the result into the process exit code.
#[allow(clippy::print_stderr)]
pub fn exit(result: Result<Outcome, CliError>) -> ExitCode {
    match result {
        Ok(Outcome::Success) => ExitCode::from(exit_code::SUCCESS),
        Ok(Outcome::TaskFailed) => ExitCode::from(exit_code::FAILURE),
        Ok(Outcome::Interrupted) => ExitCode::from(exit_code::INTERRUPTED),
        Err(error) => {
            eprint!("{}", error.render());
            ExitCode::from(match error.kind {
                ErrorKind::User => exit_code::USAGE,
                ErrorKind::Internal => exit_code::FAILURE,
            })
        }
    }
}
