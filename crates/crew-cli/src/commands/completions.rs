//! `crew completions`

use clap::CommandFactory;

use crate::{Cli, CliError, Outcome};

/// Print shell completions for crew.
///
/// For example: `crew completions bash > ~/.local/share/bash-completion/completions/crew`.
#[derive(Debug, clap::Args)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    pub shell: clap_complete::Shell,
}

pub fn cmd_completions(args: CompletionsArgs) -> Result<Outcome, CliError> {
    let mut command = Cli::command();
    // Written whole into memory first: clap_complete panics on a write that fails.
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut command, "crew", &mut script);
    std::io::Write::write_all(&mut std::io::stdout(), &script).map_err(CliError::stdout)?;
    Ok(Outcome::Success)
}
