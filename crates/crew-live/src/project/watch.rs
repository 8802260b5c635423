//! Watching a project as it happens: every host of the project streams what its agents and
//! tasks do over its control socket, and [`ProjectWatch`] merges those streams into one, finding
//! hosts as they start. `crew watch` (the board) is its client.
//!
//! ```text
//! host side   Op::Watch on the control socket  -> ok {agents}, then WatchEvent lines
//!             (only the user may watch; only the caller's workspace is streamed)
//! client side Project::watch(recent)            -> ProjectWatch
//!   1. watch `.crew/state/live/` (inotify): every host publishes its listing there as it starts
//!   2. the newest `recent` runs, read once           -> Watched::Run
//!   3. each live host, watched over its socket      -> Watched::Agents, then Watched::Event
//!   4. a new listing name: find its host, watch it  -> (3); its runs -> Watched::Run
//!   5. a host's stream ends: its runs read again     -> Watched::Run
//! ```
//!
//! Nothing is read in a loop: the state is read when the watch starts, when a host or a run
//! first appears, and when a host ends. A client that falls behind makes the host drop output
//! lines for it (it hears [`WatchEvent::Lagged`]), never slows the host down.

use std::collections::{HashMap, HashSet};
use std::mem::MaybeUninit;
use std::sync::Arc;
use std::time::Duration;

use camino::{Utf8Path, Utf8PathBuf};
use crew_core::model::{HostRecord, RunManifest};
use crew_core::store::StateError;
use crew_core::{RunId, StateStore, WorkspaceId};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::UnixStream;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::control::registry::AgentSnapshot;
pub use crate::control::watch::WatchEvent;
use crate::control::watch::WatchLine;
use crate::control::{ControlClient, ControlError, Op};

/// What a [`ProjectWatch`] hears.
#[derive(Debug, Clone, PartialEq)]
pub enum Watched {
    /// A run's record as it is now: for the newest runs when the watch starts, for a run when it
    /// first appears, and for every run of a host when that host ends.
    Run(Box<RunManifest>),
    /// The live agents of a host the watch just reached.
    Agents(Vec<AgentSnapshot>),
    /// Something a host streamed.
    Event(WatchEvent),
}

/// A watch that could not start.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    /// The state directory could not be read.
    #[error(transparent)]
    State(#[from] StateError),
    /// The directory of live listings could not be made.
    #[error(transparent)]
    LiveDir(#[from] crew_core::fsutil::FileError),
    /// The directory of live listings could not be watched.
    #[error("failed to watch {path} for new hosts")]
    Notify {
        /// The directory.
        path: Utf8PathBuf,
        /// Why it could not be watched.
        #[source]
        source: std::io::Error,
    },
}

/// One stream of everything happening in a project, across its hosts (see the module doc).
/// Dropping it stops watching.
#[derive(Debug)]
pub struct ProjectWatch {
    events: mpsc::Receiver<Watched>,
    task: JoinHandle<()>,
}

impl ProjectWatch {
    /// The next thing heard; `None` only if the watch failed for good.
    pub async fn next(&mut self) -> Option<Watched> {
        self.events.recv().await
    }

    /// Something already heard, without waiting.
    pub fn try_next(&mut self) -> Option<Watched> {
        self.events.try_recv().ok()
    }
}

impl Drop for ProjectWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// How many heard things may wait for a slow client before the hosts' streams back up (and
/// the hosts drop output lines for it).
const QUEUE: usize = 4096;
/// When a new listing's host is looked up again while its run is not recorded yet (a host
/// publishes its listing before it records its run): after 100 ms, then twice as long each
/// time, the last time about six seconds after the listing appeared.
const FIND_HOST_RETRY: Duration = Duration::from_millis(100);
const FIND_HOST_LAST_RETRY: Duration = Duration::from_millis(3200);

/// Starts watching the project whose state `store` holds, as `workspace`. `recent` is how many
/// of the newest runs are read at the start.
pub(crate) fn start(
    store: Arc<StateStore>,
    workspace: WorkspaceId,
    recent: usize,
) -> Result<ProjectWatch, WatchError> {
    store.ensure_layout()?;
    let live_dir = store.state_dir().join(crate::control::publish::LIVE_DIR);
    crew_core::fsutil::ensure_real_dir(&live_dir)?;
    // Watching first: a host that starts while the runs are read is heard of.
    let listings = Listings::watch(&live_dir)?;
    let (out, events) = mpsc::channel(QUEUE);
    let task = tokio::spawn(async move {
        let mut watch = Watcher {
            store,
            workspace,
            out,
            hosts: HashMap::new(),
            runs: HashSet::new(),
            found: HashSet::new(),
        };
        watch.run(listings, recent).await;
    });
    Ok(ProjectWatch { events, task })
}

/// New listing names in `.crew/state/live/`, as the kernel reports them: a thread blocks on
/// the inotify descriptor (and on a pipe that closes when the watch is dropped).
struct Listings {
    names: mpsc::Receiver<Vec<String>>,
    _stop: std::io::PipeWriter,
}

impl Listings {
    fn watch(dir: &Utf8Path) -> Result<Self, WatchError> {
        use rustix::fs::inotify;
        let error = |source: std::io::Error| WatchError::Notify {
            path: dir.to_owned(),
            source,
        };
        let fd =
            inotify::init(inotify::CreateFlags::CLOEXEC).map_err(|errno| error(errno.into()))?;
        inotify::add_watch(
            &fd,
            dir.as_std_path(),
            inotify::WatchFlags::CREATE
                | inotify::WatchFlags::MOVED_TO
                | inotify::WatchFlags::ONLYDIR
                | inotify::WatchFlags::DONT_FOLLOW,
        )
        .map_err(|errno| error(errno.into()))?;
        let (stop_reader, stop) = std::io::pipe().map_err(error)?;
        let (sender, names) = mpsc::channel(16);
        std::thread::Builder::new()
            .name("crew-watch-listings".to_owned())
            .spawn(move || read_listings(&fd, &stop_reader, &sender))
            .map_err(error)?;
        Ok(Listings { names, _stop: stop })
    }

    /// The names of listings written since the last call, waiting for at least one; `None`
    /// once the kernel's watch failed.
    async fn next(&mut self) -> Option<Vec<String>> {
        self.names.recv().await
    }
}

/// Reads inotify events until `stop` closes or nobody listens.
fn read_listings(
    fd: &std::os::fd::OwnedFd,
    stop: &std::io::PipeReader,
    names: &mpsc::Sender<Vec<String>>,
) {
    use rustix::event::{PollFd, PollFlags, poll};
    let mut buffer = [MaybeUninit::<u8>::uninit(); 4096];
    loop {
        let mut fds = [
            PollFd::new(fd, PollFlags::IN),
            PollFd::new(stop, PollFlags::IN),
        ];
        match poll(&mut fds, None) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => return,
        }
        if !fds[1].revents().is_empty() {
            return;
        }
        let mut reader = rustix::fs::inotify::Reader::new(fd, &mut buffer);
        let mut found = Vec::new();
        loop {
            match reader.next() {
                Ok(event) => {
                    let name = event.file_name().and_then(|name| name.to_str().ok());
                    if let Some(name) = name
                        && name.ends_with(".json")
                        && !crew_core::fsutil::is_atomic_temp_name(name)
                    {
                        found.push(name.to_owned());
                    }
                }
                Err(rustix::io::Errno::INTR) => continue,
                Err(_) => break,
            }
            if reader.is_buffer_empty() {
                break;
            }
        }
        if !found.is_empty() && names.blocking_send(found).is_err() {
            return;
        }
    }
}

/// What a host's stream tells the watcher.
enum FromHost {
    Agents(Vec<AgentSnapshot>),
    Event(WatchEvent),
    Gone,
}

struct Watcher {
    store: Arc<StateStore>,
    workspace: WorkspaceId,
    out: mpsc::Sender<Watched>,
    /// The hosts watched, by socket, with the runs each hosts.
    hosts: HashMap<Utf8PathBuf, Vec<RunId>>,
    /// The runs whose record was sent.
    runs: HashSet<RunId>,
    /// The listing names whose host was found.
    found: HashSet<String>,
}

impl Watcher {
    async fn run(&mut self, mut listings: Listings, recent: usize) {
        let ids = self.store.run_ids().unwrap_or_default();
        for run_id in ids.into_iter().take(recent) {
            if !self.send_run(&run_id).await {
                return;
            }
        }
        let (from_hosts, mut heard) = mpsc::channel::<(Utf8PathBuf, FromHost)>(QUEUE);
        self.find_hosts(&from_hosts).await;
        let mut pending: HashSet<String> = HashSet::new();
        // The next lookup of pending listings' hosts, and the wait before it.
        let mut retry: Option<(tokio::time::Instant, Duration)> = None;
        loop {
            let retry_at = retry.map(|(at, _)| at);
            tokio::select! {
                names = listings.next() => {
                    let Some(names) = names else { return };
                    let new: Vec<String> =
                        names.into_iter().filter(|name| !self.found.contains(name)).collect();
                    if !new.is_empty() {
                        pending.extend(new);
                        self.find_hosts(&from_hosts).await;
                        pending.retain(|name| !self.found.contains(name));
                        retry = (!pending.is_empty()).then(|| {
                            (tokio::time::Instant::now() + FIND_HOST_RETRY, FIND_HOST_RETRY)
                        });
                    }
                }
                _ = tokio::time::sleep_until(retry_at.unwrap_or_else(tokio::time::Instant::now)),
                    if retry_at.is_some() =>
                {
                    self.find_hosts(&from_hosts).await;
                    pending.retain(|name| !self.found.contains(name));
                    retry = retry
                        .map(|(_, waited)| waited * 2)
                        .filter(|wait| !pending.is_empty() && *wait <= FIND_HOST_LAST_RETRY)
                        .map(|wait| (tokio::time::Instant::now() + wait, wait));
                    if retry.is_none() {
                        // A listing whose host records no run (one that hosts none yet) is
                        // looked up again when it is written again.
                        pending.clear();
                    }
                }
                heard = heard.recv() => {
                    let Some((socket, heard)) = heard else { return };
                    if !self.hear(socket, heard).await {
                        return;
                    }
                }
            }
        }
    }

    /// Sends what a host said on; `false` once nobody listens.
    async fn hear(&mut self, socket: Utf8PathBuf, heard: FromHost) -> bool {
        match heard {
            FromHost::Agents(agents) => self.out.send(Watched::Agents(agents)).await.is_ok(),
            FromHost::Event(event) => {
                if let WatchEvent::Task { run_id, .. } = &event
                    && !self.runs.contains(run_id)
                {
                    let run_id = run_id.clone();
                    self.hosts.entry(socket).or_default().push(run_id.clone());
                    if !self.send_run(&run_id).await {
                        return false;
                    }
                }
                self.out.send(Watched::Event(event)).await.is_ok()
            }
            FromHost::Gone => {
                let name = crate::control::publish::listing_path(self.store.state_dir(), &socket);
                if let Some(name) = name.file_name() {
                    self.found.remove(name);
                }
                for run_id in self.hosts.remove(&socket).unwrap_or_default() {
                    if !self.send_run(&run_id).await {
                        return false;
                    }
                }
                true
            }
        }
    }

    /// Watches every live host not watched yet, and sends the records of their runs.
    async fn find_hosts(&mut self, from_hosts: &mpsc::Sender<(Utf8PathBuf, FromHost)>) {
        let hosts: Vec<(RunId, HostRecord)> = crate::control::live_hosts::live_hosts(&self.store);
        for (run_id, host) in hosts {
            let Some(socket) = host.socket.clone() else {
                continue;
            };
            if !self.hosts.contains_key(&socket) {
                let name = crate::control::publish::listing_path(self.store.state_dir(), &socket);
                if let Some(name) = name.file_name() {
                    self.found.insert(name.to_owned());
                }
                tokio::spawn(follow_host(
                    socket.clone(),
                    self.workspace.clone(),
                    from_hosts.clone(),
                ));
            }
            let runs = self.hosts.entry(socket).or_default();
            if !runs.contains(&run_id) {
                runs.push(run_id.clone());
            }
            if !self.runs.contains(&run_id) {
                self.send_run(&run_id).await;
            }
        }
    }

    /// Reads `run_id`'s record and sends it; `false` once nobody listens. A record that cannot
    /// be read is skipped: the run shows when it can be.
    async fn send_run(&mut self, run_id: &RunId) -> bool {
        let Ok(manifest) = self.store.read_run(run_id) else {
            return true;
        };
        self.runs.insert(run_id.clone());
        self.out
            .send(Watched::Run(Box::new(manifest)))
            .await
            .is_ok()
    }
}

/// Watches the host at `socket` until its stream ends, then says it is gone.
async fn follow_host(
    socket: Utf8PathBuf,
    workspace: WorkspaceId,
    heard: mpsc::Sender<(Utf8PathBuf, FromHost)>,
) {
    if let Ok(mut lines) = subscribe(&socket, &workspace).await {
        if let Some(agents) = lines.take_agents()
            && heard
                .send((socket.clone(), FromHost::Agents(agents)))
                .await
                .is_err()
        {
            return;
        }
        while let Some(event) = lines.next().await {
            if heard
                .send((socket.clone(), FromHost::Event(event)))
                .await
                .is_err()
            {
                return;
            }
        }
    }
    let _gone_told = heard.send((socket, FromHost::Gone)).await;
}

/// A host's stream of [`WatchEvent`]s.
#[derive(Debug)]
pub struct WatchStream {
    agents: Option<Vec<AgentSnapshot>>,
    reader: BufReader<UnixStream>,
    line: String,
}

impl WatchStream {
    /// The host's live agents of the workspace when the watch began (once).
    pub fn take_agents(&mut self) -> Option<Vec<AgentSnapshot>> {
        self.agents.take()
    }

    /// The next event; `None` when the host is gone or said something unreadable.
    pub async fn next(&mut self) -> Option<WatchEvent> {
        loop {
            self.line.clear();
            match self.reader.read_line(&mut self.line).await {
                Ok(0) | Err(_) => return None,
                Ok(_) => {}
            }
            match serde_json::from_str::<WatchLine>(&self.line) {
                Ok(line) => return Some(line.event),
                // An event of a newer crew: skipped, the rest is still read.
                Err(_) if serde_json::from_str::<serde_json::Value>(&self.line).is_ok() => {}
                Err(_) => return None,
            }
        }
    }
}

/// Asks the host at `socket` to stream what happens to `workspace`'s agents and tasks.
pub async fn subscribe(
    socket: &Utf8Path,
    workspace: &WorkspaceId,
) -> Result<WatchStream, ControlError> {
    let mut client = ControlClient::connect(socket).await?;
    let response = client
        .call(workspace, Op::Watch, crate::control::REQUEST_TIMEOUT)
        .await?;
    let agents = response
        .answer
        .ok()
        .and_then(|mut result| serde_json::from_value(result["agents"].take()).ok())
        .ok_or_else(|| ControlError::Closed {
            path: socket.to_owned(),
        })?;
    Ok(WatchStream {
        agents: Some(agents),
        reader: client.into_reader(),
        line: String::new(),
    })
}
