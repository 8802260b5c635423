use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = crew_cli::Cli::parse();
    let result = crew_cli::run(cli);
    crew_cli::exit(result)
}
