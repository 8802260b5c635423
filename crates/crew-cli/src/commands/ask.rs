//! `crew ask`

use crate::ui::Ui;
use crate::{CliError, Outcome};

/// Ask the user a question from inside an agent, and stop for the answer.
///
/// Run by an agent (crew sets CREW_AGENT_ID, CREW_SOCKET and CREW_PROJECT_ROOT for it). The
/// question shows in `crew agents list`; the task waits with its workspace kept. End your turn
/// after asking: the answer comes back with `crew agents follow-up`, which resumes the agent in
/// the same workspace (as `{message}` of its resume template, or in CREW_MESSAGE).
#[derive(Debug, clap::Args)]
pub struct AskArgs {
    /// The question.
    pub question: String,
}

pub async fn cmd_ask(args: AskArgs, ui: Ui) -> Result<Outcome, CliError> {
    super::from_agent::connect("ask")
        .await?
        .ask(args.question)
        .await?;
    if !ui.quiet {
        say!("question recorded; end your turn now — the answer comes back as a follow-up");
    }
    Ok(Outcome::Success)
}
