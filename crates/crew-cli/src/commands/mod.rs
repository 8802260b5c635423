//! One module per subcommand.

use crate::{CliError, Outcome};

#[derive(Debug, clap::Subcommand)]
pub enum Command {}

pub fn run(command: Command) -> Result<Outcome, CliError> {
    match command {}
}
