use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = crew_cli::Cli::parse();
    if !cli.command.hosts_agents() {
        quiet_on_closed_stdout();
    }
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

/// A reader that stops reading (`crew runs list | head`) ends the command quietly, as it ends
/// `git log`: SIGPIPE takes its default action again (Rust ignores it, and every print would
/// panic instead). Commands that host agents keep ignoring it: their printing stops, never
/// their agents (see `ui::out!`).
fn quiet_on_closed_stdout() {
    // SAFETY: setting a signal's disposition to its default, before any other thread exists.
    #[allow(unsafe_code)]
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}
