//! Published listings: a host keeps a small file in the workspace's state with its agents, so
//! that `crew agents list` in another process reads a file instead of waking every host over its
//! socket.
//!
//! `.crew/state/live/<socket name>.json` holds `{schema_version, pid, written_at, agents}`. It is
//! rewritten (atomically) as soon as an agent starts, changes status, asks a question or exits,
//! and at most once a second for new output lines. Each agent's `last_lines` holds only its
//! newest line, what listings show: a busy agent's tail (up to 20 lines of 4 KiB) would make the
//! file, its rewrites and every reader's parse many times larger. A reader trusts it only while
//! the host that wrote it is alive (the run's manifest says which host that is); otherwise, or
//! when the file is missing or unreadable, it asks the host over its socket.

use std::time::Duration;

use camino::{Utf8Path, Utf8PathBuf};
use crew_core::WorkspaceId;
use crew_core::model::{HostRecord, Timestamp};
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast::error::RecvError;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::agent::events::AgentEvent;
use crate::control::agents::AgentHost;
use crate::control::registry::AgentSnapshot;

/// The directory of published listings, under a workspace's state directory.
pub const LIVE_DIR: &str = "live";
const SCHEMA_VERSION: u32 = 1;
/// A listing's temp file older than this was left by a writer that died.
const ABANDONED_TEMP_AGE: Duration = Duration::from_secs(60);
/// How long new output lines may wait before they are published.
const OUTPUT_DELAY: Duration = Duration::from_secs(1);
/// The least time between two writes of a listing: a change after a quiet spell is written at
/// once, and the changes of a busy run (a hundred short tasks, each starting and ending) are
/// written together at most this often.
const WRITE_GAP: Duration = Duration::from_millis(20);
/// How often a listing with capped agents is written again, for their memory and CPU now.
const METER_INTERVAL: Duration = Duration::from_secs(2);

/// A host's published listing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PublishedAgents {
    /// The listing's format.
    pub schema_version: u32,
    /// The host process that wrote it.
    pub pid: u32,
    /// That host's record, as the manifests of its runs hold it: a reader that finds it alive
    /// trusts the listing without reading a manifest. Absent in a listing of an older crew.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<HostRecord>,
    /// When it was written.
    pub written_at: Timestamp,
    /// The host's agents, as listings show them.
    pub agents: Vec<AgentSnapshot>,
}

/// Where the host serving `socket` publishes its listing for a workspace whose state directory
/// is `state_dir`.
pub fn listing_path(state_dir: &Utf8Path, socket: &Utf8Path) -> Utf8PathBuf {
    let stem = socket.file_stem().unwrap_or("host");
    state_dir.join(LIVE_DIR).join(format!("{stem}.json"))
}

/// The listings' directory of `state_dir`, when it is a real directory: one that became a link
/// (planted by an unconfined agent) is never read, written or swept through.
fn live_dir(state_dir: &Utf8Path) -> Option<Utf8PathBuf> {
    let dir = state_dir.join(LIVE_DIR);
    std::fs::symlink_metadata(&dir)
        .is_ok_and(|metadata| metadata.is_dir())
        .then_some(dir)
}

/// Every listing in `state_dir` that can be read and parses, with its path; `None` when there
/// is none at all. Every host publishes one as it starts, so none means no host is live:
/// nothing else needs reading. Whether to trust one is [`PublishedAgents::live_writer`]'s.
pub fn read_listings(state_dir: &Utf8Path) -> Option<Vec<(Utf8PathBuf, PublishedAgents)>> {
    let entries = live_dir(state_dir)?.read_dir_utf8().ok()?;
    let mut any = false;
    let mut listings = Vec::new();
    for entry in entries.flatten() {
        if !entry.file_name().ends_with(".json")
            || crew_core::fsutil::is_atomic_temp_name(entry.file_name())
        {
            continue;
        }
        any = true;
        if let Some(published) = read_published(entry.path()) {
            listings.push((entry.path().to_owned(), published));
        }
    }
    any.then_some(listings)
}

impl PublishedAgents {
    /// The host that wrote this listing, when the listing says which and that host is alive,
    /// wrote it, and serves the socket whose listing is at `path` in `state_dir`.
    pub fn live_writer(&self, state_dir: &Utf8Path, path: &Utf8Path) -> Option<&HostRecord> {
        let host = self.host.as_ref()?;
        let socket = host.socket.as_deref()?;
        (self.schema_version == SCHEMA_VERSION
            && host.identity.pid == self.pid
            && listing_path(state_dir, socket) == path
            && crate::control::socket::is_plausible_socket(socket)
            && host.identity.is_alive())
        .then_some(host)
    }
}

/// A listing read whole and parsed, never while it is being exchanged with its spare.
fn read_published(path: &Utf8Path) -> Option<PublishedAgents> {
    let read = || {
        let (bytes, steady) = crew_core::fsutil::read_nofollow_steady(path).ok()?;
        steady
            .then(|| serde_json::from_slice::<PublishedAgents>(&bytes).ok())
            .flatten()
    };
    // A listing is exchanged with a spare at each write: one opened just before two writes may
    // change while it is read (`fsutil::write_replace`); the next read finds the current one.
    read().or_else(read)
}

/// Reads a published listing, when it exists, parses, and was written by `pid`.
pub fn read_listing(path: &Utf8Path, pid: u32) -> Option<Vec<AgentSnapshot>> {
    if path.parent().is_some_and(|dir| {
        std::fs::symlink_metadata(dir).is_ok_and(|metadata| metadata.is_symlink())
    }) {
        return None;
    }
    let published = read_published(path)?;
    (published.pid == pid && published.schema_version == SCHEMA_VERSION).then_some(published.agents)
}

/// Removes the listings of hosts that are gone (a host killed before it could remove its own).
pub fn remove_stale_listings(state_dir: &Utf8Path) {
    let Some(Ok(entries)) = live_dir(state_dir).map(|dir| dir.read_dir_utf8()) else {
        return;
    };
    for entry in entries.flatten() {
        // Temp files of a write under way belong to their writer; one left for a minute was
        // left by a writer that died.
        if crew_core::fsutil::is_atomic_temp_name(entry.file_name()) {
            let abandoned = entry
                .metadata()
                .and_then(|metadata| metadata.modified())
                .ok()
                .and_then(|modified| modified.elapsed().ok())
                .is_some_and(|age| age > ABANDONED_TEMP_AGE);
            if abandoned {
                // Tried again by the next sweep; a leftover temp file is never read.
                let _ = std::fs::remove_file(entry.path());
            }
            continue;
        }
        let path = entry.path();
        // Only whose it is matters here: the agents are not built.
        #[derive(Deserialize)]
        struct Writer {
            pid: u32,
        }
        let read = match crew_core::fsutil::read_nofollow_steady(path) {
            // Being rewritten by its host as it was read: that host is alive.
            Ok((_, false)) => continue,
            Ok((bytes, true)) => Some(bytes),
            Err(_) => None,
        };
        let stale = read
            .and_then(|bytes| serde_json::from_slice::<Writer>(&bytes).ok())
            .is_none_or(|published| {
                crew_core::host::HostIdentity::of_pid(published.pid)
                    .ok()
                    .flatten()
                    .is_none()
            });
        if stale {
            // A stale listing is told apart by its dead pid wherever it is read.
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Keeps the listing of `workspace`'s agents in `host` published at `path` until dropped; the
/// file is removed then.
#[derive(Debug)]
pub struct Publisher {
    path: Utf8PathBuf,
    task: JoinHandle<()>,
}

impl Publisher {
    /// Publishes `host`'s agents of `workspace` to `path` until dropped, signed with the
    /// host's `record` when it has one.
    pub fn start(
        host: AgentHost,
        record: Option<HostRecord>,
        workspace: WorkspaceId,
        path: Utf8PathBuf,
    ) -> Self {
        let task = tokio::spawn(publish_loop(host, record, workspace, path.clone()));
        Publisher { path, task }
    }

    /// Where the listing is written.
    pub fn path(&self) -> &Utf8Path {
        &self.path
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.task.abort();
        // Left behind, the listing names a dead pid and is swept as stale; so does its spare.
        let _ = std::fs::remove_file(&self.path);
        if let (Some(dir), Some(name)) = (self.path.parent(), self.path.file_name()) {
            // A spare left behind is written over by the next host of this socket name, or swept as
            // stale.
            let _ = std::fs::remove_file(dir.join(crew_core::fsutil::spare_name(name)));
        }
    }
}

async fn publish_loop(
    host: AgentHost,
    record: Option<HostRecord>,
    workspace: WorkspaceId,
    path: Utf8PathBuf,
) {
    let mut events = host.subscribe();
    let mut metered = write(&host, record.as_ref(), &workspace, &path).await;
    let mut written_at = Instant::now();
    let mut pending_output: Option<Instant> = None;
    loop {
        // Capped agents' memory and CPU move without an event: written again now and then.
        if metered {
            pending_output.get_or_insert(written_at + METER_INTERVAL - OUTPUT_DELAY);
        }
        let deadline = pending_output.map(|since| since + OUTPUT_DELAY);
        let urgent = tokio::select! {
            // Events of every workspace of the host count: an agent of this workspace may not
            // be registered yet when its first event is sent, and a spare write is cheap.
            event = events.recv() => match event {
                Ok(AgentEvent::Output { .. }) => {
                    pending_output.get_or_insert_with(Instant::now);
                    false
                }
                Ok(_) | Err(RecvError::Lagged(_)) => true,
                Err(RecvError::Closed) => return,
            },
            _ = tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => true,
        };
        if urgent {
            tokio::time::sleep_until(written_at + WRITE_GAP).await;
            // A burst (a run starting its agents) becomes one write.
            while events.try_recv().is_ok() {}
            pending_output = None;
            metered = write(&host, record.as_ref(), &workspace, &path).await;
            written_at = Instant::now();
        }
    }
}

/// Writes the listing; whether an agent in it is capped and alive (its figures move).
async fn write(
    host: &AgentHost,
    record: Option<&HostRecord>,
    workspace: &WorkspaceId,
    path: &Utf8Path,
) -> bool {
    let mut agents = host.registry().list(workspace);
    let metered = agents.iter().any(|agent| agent.using.is_some());
    for agent in &mut agents {
        let older = agent.last_lines.len().saturating_sub(1);
        agent.last_lines.drain(..older);
    }
    let published = PublishedAgents {
        schema_version: SCHEMA_VERSION,
        pid: std::process::id(),
        host: record.cloned(),
        written_at: Timestamp::now(),
        agents,
    };
    let Ok(json) = serde_json::to_vec(&published) else {
        return metered;
    };
    let path = path.to_owned();
    let written = tokio::task::spawn_blocking(move || {
        // Never through a link in place of the listings' directory.
        if let Some(dir) = path.parent()
            && std::fs::symlink_metadata(dir).is_ok_and(|metadata| metadata.is_symlink())
        {
            return Err(format!("{dir} is a link, not crew's directory"));
        }
        if crew_core::fsutil::write_replace(&path, &json).is_ok() {
            return Ok(());
        }
        // The state directory may not have existed when the host started (the first run of a
        // project makes it): make the listing's directory now, and write again.
        if let Some(dir) = path.parent() {
            let state = dir.parent();
            if state.is_some_and(|state| !state.exists()) {
                // No state directory yet: no run has started here, so there is nothing to list.
                return Ok(());
            }
            // Made through handles from two levels above the state directory down (the project
            // folder, for `.crew/state/live`): a level that is a link is refused, never made
            // beneath.
            let crew = state.and_then(Utf8Path::parent);
            let levels = [crew, state, Some(dir)].map(|level| level.and_then(Utf8Path::file_name));
            match (crew.and_then(Utf8Path::parent), levels) {
                (Some(base), [Some(crew), Some(state), Some(live)]) => {
                    crew_core::fsutil::ensure_dirs_beneath(base, &[crew, state, live])
                        .map_err(|error| error.to_string())?;
                }
                _ => return Err(format!("{dir} is not beneath a project folder")),
            }
        }
        crew_core::fsutil::write_replace(&path, &json).map_err(|error| error.to_string())
    })
    .await;
    // Other processes then see this host's agents through its socket only (`crew agents list`
    // asks the hosts when there is no listing): worth a warning, not a failure.
    if let Ok(Err(error)) = written {
        tracing::warn!("could not publish the live agents' listing: {error}");
    }
    metered
}
