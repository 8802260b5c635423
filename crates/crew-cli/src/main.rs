//! `crew`'s entry: Rust's own `main`, which opens `/dev/null` on a closed standard descriptor,
//! ends a panic with code 101 and flushes standard output at the end. What a host of agents
//! needs of the process besides (its malloc arenas, what a closed output does to it) is
//! crew-sandbox's `process`, the one crate with `unsafe` code. See ARCHITECTURE.md, "Start-up".

// The kernel is asked for everything through crew-sandbox, the one crate with `unsafe`.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    crew_live::process::few_malloc_arenas();
    // A listing, the command most often run, answers before clap's parse when it can.
    crew_live::process::on_closed_stdout(false);
    if let Some(code) = crew_cli::quick::answer(std::env::args_os()) {
        return ExitCode::from(code);
    }
    let cli = crew_cli::Cli::parse();
    crew_live::process::on_closed_stdout(cli.command.hosts_agents());
    // Commands that host agents get every core; the others answer in a millisecond or two on
    // the calling thread.
    let mut builder = if cli.command.hosts_agents() {
        tokio::runtime::Builder::new_multi_thread()
    } else {
        tokio::runtime::Builder::new_current_thread()
    };
    let result = match builder.enable_all().build() {
        Ok(runtime) => runtime.block_on(crew_cli::run(cli)),
        Err(error) => Err(crew_cli::CliError::internal(error)),
    };
    // Groups made ahead of starts that will not come (crew-sandbox `caps`).
    crew_live::agent::drop_spare_cgroups();
    ExitCode::from(crew_cli::exit_status(result))
}
