//! crew-cli: the `crew` command. It parses arguments, wires the library crates together and
//! renders their results as human tables or `--json`. Logic a library user would need lives
//! in the library crates, not here.

// The kernel is asked for everything through crew-sandbox, the one crate with `unsafe`.
#![forbid(unsafe_code)]

/// `println!` for commands that host agents: a reader that stops reading (`crew run | head`)
/// stops what they print, never their agents (SIGPIPE stays ignored for them, and a failed
/// write is no reason to abandon a run). `out!(no_newline: …)` is `print!`.
macro_rules! out {
    (no_newline: $($arg:tt)*) => {{
        use std::io::Write as _;
        // A stdout its reader closed ends this command's printing, never its run.
        let _ = write!(std::io::stdout(), $($arg)*);
    }};
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        // A stdout its reader closed ends this command's printing, never its run.
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// `println!` for commands that answer and end: a standard output that cannot be written (a
/// full disk, a file opened read-only) ends the command with an error that says so, where
/// `println!` would panic. `say!(no_newline: …)` is `print!`. A reader that stopped reading
/// ends such a command by SIGPIPE before any write fails (see `main.rs`).
macro_rules! say {
    (no_newline: $($arg:tt)*) => {{
        use std::io::Write as _;
        write!(std::io::stdout(), $($arg)*).map_err(crate::CliError::stdout)?
    }};
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout(), $($arg)*).map_err(crate::CliError::stdout)?
    }};
}

/// `eprintln!` that never panics: a standard error that cannot be written (closed, a full
/// disk) loses the message, never the command, whose exit code still says how it ended.
/// `err!(no_newline: …)` is `eprint!`.
macro_rules! err {
    (no_newline: $($arg:tt)*) => {{
        use std::io::Write as _;
        // Nowhere left to say it: the exit code still tells.
        let _ = write!(std::io::stderr(), $($arg)*);
    }};
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        // Nowhere left to say it: the exit code still tells.
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

mod block;
mod board;
pub mod commands;
mod context;
mod error;
mod foreground;
pub mod quick;
mod summary;
pub mod ui;

pub use error::{CliError, ErrorKind, Outcome, exit, exit_code, exit_status};

use clap::Parser;

use crate::ui::{ColorChoice, Ui};

/// crew runs a team of coding agents in parallel, each task in its own isolated workspace.
#[derive(Debug, Parser)]
#[command(name = "crew", bin_name = "crew", version, propagate_version = true)]
#[command(
    after_help = "Exit codes: 0 ok, 1 a task failed, 2 usage or configuration error, 130 interrupted, 141 (in a shell) a listing whose reader stopped reading."
)]
pub struct Cli {
    /// When to color output (NO_COLOR turns `auto` off).
    #[arg(long, global = true, value_enum, default_value_t = ColorChoice::Auto)]
    pub color: ColorChoice,
    /// Say more about what crew does (repeat for debug output).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// Print only errors and what was asked for.
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    pub quiet: bool,
    #[command(subcommand)]
    pub command: commands::Command,
}

/// Runs the command line.
pub async fn run(cli: Cli) -> Result<Outcome, CliError> {
    init_tracing(cli.verbose, cli.quiet);
    let ui = Ui::new(cli.color, cli.quiet);
    commands::run(cli.command, ui).await
}

/// Diagnostics go to stderr: warnings by default, more with -v, errors only with -q;
/// `CREW_LOG` (a tracing filter such as `crew_live=debug`) wins when set.
fn init_tracing(verbose: u8, quiet: bool) {
    let level = match (quiet, verbose) {
        (true, _) => tracing::Level::ERROR,
        (false, 0) => tracing::Level::WARN,
        (false, 1) => tracing::Level::INFO,
        (false, _) => tracing::Level::DEBUG,
    };
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_target(false);
    // A filter is parsed only when asked for: most commands take a few milliseconds in all.
    let _ = match std::env::var(crew_core::env_vars::CREW_LOG)
        .ok()
        .and_then(|filter| tracing_subscriber::EnvFilter::try_new(filter).ok())
    {
        Some(filter) => builder
            .with_env_filter(filter)
            .try_init()
            .map_err(|error| error.to_string()),
        None => {
            use tracing_subscriber::layer::SubscriberExt;
            use tracing_subscriber::util::SubscriberInitExt;
            // The ACP library warns of each error it answers; an editor's ordinary refusal (an
            // unknown session, a folder with no project) is in the answer, and is no warning
            // of crew's on the editor's log.
            let quieter = tracing_subscriber::filter::Targets::new()
                .with_default(level)
                .with_target("agent_client_protocol", tracing::Level::ERROR);
            builder
                .with_max_level(level)
                .finish()
                .with(quieter)
                .try_init()
                .map_err(|error| error.to_string())
        }
    };
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// Subcommands are built lazily (`#[command(defer = true)]`): the one-line description a
    /// parent lists comes from the variant, the subcommand's own help from its arguments'
    /// struct. They must say the same.
    fn check_listed_descriptions(parent: &clap::Command, path: &str) {
        for listed in parent.get_subcommands() {
            if listed.is_hide_set() {
                continue;
            }
            let path = format!("{path} {}", listed.get_name());
            let mut built = listed.clone();
            built.build();
            let shown = |command: &clap::Command| command.get_about().map(ToString::to_string);
            assert!(
                shown(listed).is_some(),
                "`{path}` has no description in its parent's listing"
            );
            if built.get_about().is_some() {
                assert_eq!(shown(listed), shown(&built), "`{path}`");
            }
            check_listed_descriptions(&built, &path);
        }
    }

    #[test]
    fn every_listed_subcommand_is_described_as_its_own_help_says() {
        check_listed_descriptions(&super::Cli::command(), "crew");
    }
}
