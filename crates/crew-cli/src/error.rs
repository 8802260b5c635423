//! The one error type of the `crew` command, its exit codes and how it is printed.

use std::fmt::Write as _;
use std::process::ExitCode;

use crew_core::config::LoadConfigError;
use crew_core::discovery::DiscoverWorkspaceError;
use crew_core::provider::land::LandError;
use crew_core::store::StateError;
use crew_live::project::FindAgentError;
use crew_live::{
    AgentSelfError, CancelRunError, CleanRunError, ControlAgentError, LandWorkError, NotPicked,
    RunError,
};

/// What kind of failure ended a command; each maps to a documented exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The user asked for something that cannot be done as asked (bad arguments, bad config,
    /// an unknown run, a dirty leader). Nothing was changed. Exit code 2.
    User,
    /// crew itself failed (a file it could not write, a process it could not start). Exit 1.
    Internal,
    /// What was asked ran, and its result is not one to take (`[run] base_moved = "fail"`).
    /// Things were made (branches, records). Exit 1.
    Failure,
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

    pub fn failure(error: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        CliError {
            kind: ErrorKind::Failure,
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

    /// Standard output could not be written: what crew had to say is lost, not what it did.
    pub fn stdout(error: std::io::Error) -> Self {
        CliError::internal(format!(
            "crew could not write to its standard output: {error}"
        ))
        .with_hint(
            "check where standard output goes: a full disk, a file or device that takes no writes",
        )
    }

    pub fn with_hint(mut self, hint: impl Into<String>) -> Self {
        self.hints.push(hint.into());
        self
    }

    /// Adds each of `hints` (an `Option` adds one or none).
    pub fn with_hints<H: Into<String>>(mut self, hints: impl IntoIterator<Item = H>) -> Self {
        self.hints.extend(hints.into_iter().map(Into::into));
        self
    }

    /// `error:` with the message, `caused by:` for each source, then `hint:` lines.
    pub fn render(&self) -> String {
        let mut text = format!("error: {}\n", self.error);
        let mut source = self.error.source();
        while let Some(cause) = source {
            // Writing into a String cannot fail.
            let _ = writeln!(text, "caused by: {cause}");
            source = cause.source();
        }
        for hint in &self.hints {
            // Writing into a String cannot fail.
            let _ = writeln!(text, "hint: {hint}");
        }
        text
    }
}

// How library errors reach the user. Each conversion decides from the error itself whether
// the request was at fault (exit 2) and what to do about it, so that a command writes `?` and
// the same error reads the same from every command.

impl From<StateError> for CliError {
    fn from(error: StateError) -> Self {
        let hint = match error.root() {
            StateError::UnknownRun { .. } => {
                Some("`crew runs list` shows the runs of this workspace")
            }
            StateError::NameTaken { .. } => {
                Some("pick another name (`crew runs list` shows the runs of this project)")
            }
            _ => None,
        };
        let error = if state_error_is_users(&error) {
            CliError::user(error)
        } else {
            CliError::internal(error)
        };
        error.with_hints(hint)
    }
}

/// A state error about what the request named, not about crew or the machine: an unknown or
/// ambiguous run, a taken name, and a run record crew will not act on (corrupt, of another
/// schema, of another workspace). Nothing was changed: exit 2 from every command alike.
fn state_error_is_users(error: &StateError) -> bool {
    matches!(
        error.root(),
        StateError::UnknownRun { .. }
            | StateError::AmbiguousRun { .. }
            | StateError::NameTaken { .. }
            | StateError::Corrupt { .. }
            | StateError::NewerSchema { .. }
            | StateError::OlderSchema { .. }
            | StateError::ForeignManifest { .. }
    )
}

impl From<LoadConfigError> for CliError {
    fn from(error: LoadConfigError) -> Self {
        let hint = error.hint();
        // Every problem of a file on a line of its own, each read like a single one.
        let error = match error {
            LoadConfigError::Several(problems) => CliError::user(
                problems
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("\nerror: "),
            ),
            error => CliError::user(error),
        };
        error.with_hints(hint)
    }
}

impl From<RunError> for CliError {
    fn from(error: RunError) -> Self {
        let hint = error.hint();
        let user = matches!(
            error,
            RunError::Prepare(_)
                | RunError::Plan(_)
                | RunError::NotResumable { .. }
                | RunError::AlreadyHosted { .. }
        ) || matches!(&error, RunError::State(state) if state_error_is_users(state));
        let error = if user {
            CliError::user(error)
        } else {
            CliError::internal(error)
        };
        error.with_hints(hint)
    }
}

/// Errors of the request itself: nothing was changed.
macro_rules! user_errors {
    ($($error:ty),* $(,)?) => {$(
        impl From<$error> for CliError {
            fn from(error: $error) -> Self {
                CliError::user(error)
            }
        }
    )*};
}

/// Errors of crew or the machine, not of the request.
macro_rules! internal_errors {
    ($($error:ty),* $(,)?) => {$(
        impl From<$error> for CliError {
            fn from(error: $error) -> Self {
                CliError::internal(error)
            }
        }
    )*};
}

user_errors!(
    DiscoverWorkspaceError,
    crew_core::ids::InvalidIdError,
    crew_core::paths::WorkspacePathError,
);
internal_errors!(
    std::io::Error,
    serde_json::Error,
    tokio::task::JoinError,
    crew_live::ControlError,
    crew_worktree::ListWorktreesError,
);

/// A git error as the user reads it: its message, without libgit2's class and code; the
/// error itself is kept beneath.
#[derive(Debug)]
struct GitError(crew_worktree::GitError);

impl std::fmt::Display for GitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0.message())
    }
}

impl std::error::Error for GitError {}

impl From<crew_worktree::GitError> for CliError {
    fn from(error: crew_worktree::GitError) -> Self {
        CliError::internal(GitError(error))
    }
}

impl From<FindAgentError> for CliError {
    fn from(error: FindAgentError) -> Self {
        match error {
            FindAgentError::Ambiguous { .. } => CliError::user(error)
                .with_hint("name one as <runId>:<taskId>; a unique prefix of the run id is enough"),
            FindAgentError::Refused { .. } => CliError::user(error).with_hint(
                "an agent may ask and submit for itself only; steering, stopping and listing agents takes the user's own `crew`",
            ),
            FindAgentError::Unanswered { .. } => CliError::user(error).with_hint(
                "retry in a moment; a busy host answers again once its connections close",
            ),
            FindAgentError::State(error) => error.into(),
        }
    }
}

impl From<ControlAgentError> for CliError {
    fn from(error: ControlAgentError) -> Self {
        match error {
            ControlAgentError::Find(error) => error.into(),
            // A task waiting for an answer in a run nobody hosts any more (cancelled, or its
            // host died): say so, and what can be done with it.
            ControlAgentError::NotLive {
                waiting_in: Some(run_id),
                spec,
                ..
            } => {
                let task = spec.rsplit(':').next().unwrap_or(&spec).to_owned();
                CliError::user(format!(
                    "agent {run_id}:{task} is not running: it waits for an answer in run {run_id}, which no process hosts any more"
                ))
                .with_hint(format!(
                    "answer it with `crew agents follow-up {task} \"<answer>\"` (crew hosts the run again), or `crew runs clean {run_id}` to save its work and remove its workspace"
                ))
            }
            ControlAgentError::NotLive { .. } => CliError::user(error).with_hint(NOT_LIVE_HINT),
            ControlAgentError::Host(error) => CliError::internal(error),
            ControlAgentError::Refused(refusal) => CliError::user(refusal),
        }
    }
}

/// What to do about an agent that is not live.
pub const NOT_LIVE_HINT: &str =
    "`crew agents list --all-runs` shows the agents of this workspace, live or not";

impl From<CancelRunError> for CliError {
    fn from(error: CancelRunError) -> Self {
        match error {
            CancelRunError::OtherSession { ref run_id, .. } => {
                let hint = format!("cancel it anyway with `crew runs cancel {run_id} --force`");
                CliError::user(error).with_hint(hint)
            }
            CancelRunError::Ended { .. } | CancelRunError::Refused(_) => CliError::user(error),
            CancelRunError::State(error) => error.into(),
            CancelRunError::Host(error) => CliError::internal(error),
        }
    }
}

impl From<CleanRunError> for CliError {
    fn from(error: CleanRunError) -> Self {
        let error = match error {
            CleanRunError::State(error) => return error.into(),
            error => error,
        };
        let hint = match &error {
            CleanRunError::Newer { .. } => "clean it with the crew that made it".to_owned(),
            CleanRunError::Running { run_id } => {
                format!("cancel it first: `crew runs cancel {run_id}`")
            }
            CleanRunError::BeingMade { .. } => "try again in a few seconds".to_owned(),
            CleanRunError::OnlyCopy { run_id, .. } => format!(
                "copy out what you want to keep, then `crew runs clean {run_id} --force` removes it with the run"
            ),
            CleanRunError::Kept { .. } => "see `crew worktrees list`; `--force` removes the run's state anyway (the workspaces stay)".to_owned(),
            CleanRunError::State(_) => unreachable!("returned above"),
        };
        CliError::user(error).with_hint(hint)
    }
}

/// A task with attempts and no picked result, for a command that goes on to do `then` once
/// one is picked (`land again`).
pub fn not_picked(error: NotPicked, then: &str) -> CliError {
    let spec = &error.spec;
    let hint = format!(
        "compare them (`crew compare {spec}`), keep one (`crew pick {spec} <N>`), then {then}"
    );
    CliError::user(error).with_hint(hint)
}

impl From<LandWorkError> for CliError {
    fn from(error: LandWorkError) -> Self {
        let error = match error {
            LandWorkError::Find(error) => return error.into(),
            LandWorkError::State(error) => return error.into(),
            LandWorkError::NotPicked(error) => return not_picked(error, "land again"),
            error => error,
        };
        let hint = match &error {
            LandWorkError::CheckFailed { .. } => Some(
                "`crew runs show <run>` shows each check's output; land with --force to take the work all the same".to_owned(),
            ),
            LandWorkError::Land {
                error,
                into,
                agent,
                several,
            } => land_hint(error, into, agent.as_deref(), *several),
            _ => None,
        };
        CliError::user(error).with_hints(hint)
    }
}

/// What to do about a landing the provider refused: a conflict goes to an agent (or to the
/// user, for the shell agent, which runs its prompt as a script), a dirty checkout elsewhere.
fn land_hint(error: &LandError, into: &str, agent: Option<&str>, several: bool) -> Option<String> {
    match error {
        LandError::Conflict {
            task,
            files,
            both_sides: Some(both),
            ..
        } => {
            let others = if several {
                format!("; or land the others without {task}")
            } else {
                String::new()
            };
            let files = files.join(", ");
            Some(match agent {
                Some(agent) if agent != "shell" => format!(
                    "both sides are on {both}, with conflict markers in {files}; hand them to an agent: crew run --agent {agent} --workspace-mode worktree --base {both} \"Resolve the conflict markers in {files}, keeping what both sides meant, and remove the markers\", then `crew land <that run> --into {into}` in place of {task}{others}"
                ),
                _ => format!(
                    "both sides are on {both}, with conflict markers in {files}: resolve them there (`git switch {both}`, edit, commit), then `git merge {both}` into {into} in place of {task}{others}"
                ),
            })
        }
        LandError::Conflict { task, .. } if several => Some(format!(
            "land the others without {task}, or bring {task}'s branch up to date with {into} first (`crew diff {task}` shows its work)"
        )),
        LandError::Conflict { task, .. } => Some(format!(
            "bring {task}'s branch up to date with {into} first (`crew diff {task}` shows its work)"
        )),
        LandError::DirtyCheckout { .. } => Some(format!(
            "commit or stash your changes, or land into another branch: crew land … --into <branch>, then merge it into {into} yourself"
        )),
        LandError::TargetMoved { .. } | LandError::Failed(_) => None,
    }
}

impl From<AgentSelfError> for CliError {
    fn from(error: AgentSelfError) -> Self {
        match error {
            AgentSelfError::Host(error) => CliError::internal(error),
            error => CliError::user(error),
        }
    }
}

/// The exit codes of `crew`, as documented in docs/commands.md.
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
pub fn exit(result: Result<Outcome, CliError>) -> ExitCode {
    ExitCode::from(exit_status(result))
}

/// [`exit`]'s code as a number, for an entry that ends the process itself.
pub fn exit_status(result: Result<Outcome, CliError>) -> u8 {
    match result {
        Ok(Outcome::Success) => exit_code::SUCCESS,
        Ok(Outcome::TaskFailed) => exit_code::FAILURE,
        Ok(Outcome::Interrupted) => exit_code::INTERRUPTED,
        Err(error) => {
            err!(no_newline: "{}", error.render());
            match error.kind {
                ErrorKind::User => exit_code::USAGE,
                ErrorKind::Internal | ErrorKind::Failure => exit_code::FAILURE,
            }
        }
    }
}
