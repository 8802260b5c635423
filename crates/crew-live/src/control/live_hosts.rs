//! Where a project's live hosts are, and what is left of runs whose host is gone.

use crew_core::model::HostRecord;
use crew_core::store::StateError;
use crew_core::{RunId, StateStore};

/// Reconciles the workspace's runs (runs whose host is gone become `interrupted`) and kills
/// what is left of their agents: processes that left their group but carry the run's marker.
pub fn reconcile_workspace(store: &StateStore) -> Result<Vec<RunId>, StateError> {
    let interrupted = store.reconcile()?;
    for run_id in &interrupted {
        crew_sandbox::procscan::kill_marked(&crew_sandbox::procscan::run_marker(run_id));
        // The socket its host never removed: only one a host would have made is touched.
        if let Ok(glance) = store.glance_run(run_id)
            && let Some(socket) = glance.host.and_then(|host| host.socket)
            && crate::control::socket::is_plausible_socket(&socket)
            && std::os::unix::net::UnixStream::connect(&socket).is_err()
            && let Err(error) = std::fs::remove_file(&socket)
        {
            // A leftover socket misleads nobody (nothing answers on it): note it and go on.
            tracing::debug!(%socket, "could not remove a dead host's socket: {error}");
        }
    }
    crate::control::publish::remove_stale_listings(store.state_dir());
    Ok(interrupted)
}

/// Every run of the workspace whose host is alive and serves a socket: where other processes
/// find the live agents of the workspace. Only running runs are read (the store's running
/// index); runs that cannot be read are no live host's.
pub fn live_hosts(store: &StateStore) -> Vec<(RunId, HostRecord)> {
    live_hosts_of(store, &store.running_run_ids().unwrap_or_default())
}

/// [`live_hosts`] among `runs` only.
pub fn live_hosts_of(store: &StateStore, runs: &[RunId]) -> Vec<(RunId, HostRecord)> {
    runs.iter()
        .filter_map(|run_id| store.glance_run(run_id).ok())
        .filter(|run| run.status == crew_core::model::RunStatus::Running)
        .filter_map(|run| {
            let host = run.host?;
            let socket = host.socket.as_deref()?;
            (host.identity.is_alive() && crate::control::socket::is_plausible_socket(socket))
                .then_some((run.run_id, host))
        })
        .collect()
}
