use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = crew_cli::Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => return crew_cli::exit(Err(crew_cli::CliError::internal(error))),
    };
    let result = runtime.block_on(crew_cli::run(cli));
    crew_cli::exit(result)
}
