use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = crew_cli::Cli::parse();
    // Commands that host agents get every core; the others answer in a millisecond or two on
    // the calling thread.
    let mut builder = if cli.command.hosts_agents() {
        tokio::runtime::Builder::new_multi_thread()
    } else {
        tokio::runtime::Builder::new_current_thread()
    };
    let runtime = match builder.enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => return crew_cli::exit(Err(crew_cli::CliError::internal(error))),
    };
    let result = runtime.block_on(crew_cli::run(cli));
    crew_cli::exit(result)
}
