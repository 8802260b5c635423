//! `crew-kube-transport`: the transport of a `kubernetes` placement, a program of its own so
//! that the Kubernetes client stays out of `crew` (whose every command would otherwise pay for
//! loading it), in a crate of its own (so that a build of `crew` does not compile it either).
//! crew starts it for a placed task from beside itself; see the crate's library.

// The kernel is asked for everything through crew-sandbox, the one crate with `unsafe`.
#![forbid(unsafe_code)]

use std::io::Write as _;
use std::process::ExitCode;

use clap::Parser;

/// The transport of a kubernetes placement (started by crew for a placed task).
#[derive(Debug, clap::Parser)]
#[command(name = "crew-kube-transport", version)]
struct Args {
    #[command(flatten)]
    transport: crew_kube::KubeTransportArgs,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let ended = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|error| (error.to_string(), 1))
        .and_then(|runtime| {
            runtime
                .block_on(crew_kube::cmd_kube_transport(args.transport))
                // What kept the task's pod from running is a mistake of its placement's
                // settings or cluster: crew's usage code, as `crew` gives it.
                .map_err(|error| (error.to_string(), 2))
        });
    match ended {
        Ok(outcome) => ExitCode::from(outcome.exit_code()),
        Err((message, code)) => {
            // Standard error closed: the exit code still says it.
            let _ = writeln!(std::io::stderr(), "error: {message}");
            ExitCode::from(code)
        }
    }
}
