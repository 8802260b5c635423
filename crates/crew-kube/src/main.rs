//! `crew-kube-transport`: the transport of a `kubernetes` placement, a program of its own so
//! that the Kubernetes client stays out of `crew` (whose every command would otherwise pay for
//! loading it), in a crate of its own (so that a build of `crew` does not compile it either).
//! crew starts it for a placed task from beside itself; see the crate's library.

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
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => return crew_cli::exit(Err(crew_cli::CliError::internal(error))),
    };
    crew_cli::exit(runtime.block_on(crew_kube::cmd_kube_transport(args.transport)))
}
