//! crew-cli: the `crew` command. It parses arguments, wires the library crates together and
//! renders their results as human tables or `--json`. Logic a library user would need lives
//! in the library crates, not here.

pub mod commands;
mod error;

pub use error::{CliError, ErrorKind, Outcome, exit, exit_code};

use clap::Parser;

/// crew runs a team of coding agents in parallel, each task in its own isolated workspace.
#[derive(Debug, Parser)]
#[command(name = "crew", bin_name = "crew", version)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<commands::Command>,
}

/// Runs the command line.
pub fn run(cli: Cli) -> Result<Outcome, CliError> {
    match cli.command {
        None => {
            let mut command = <Cli as clap::CommandFactory>::command();
            command.print_help().map_err(CliError::internal)?;
            Ok(Outcome::Success)
        }
        Some(command) => commands::run(command),
    }
}
