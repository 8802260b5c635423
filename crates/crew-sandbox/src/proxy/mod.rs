//! The network proxy of an agent with `network = "proxy"`.
//!
//! Such an agent runs in a network namespace of its own, with nothing but its loopback. Before
//! its program starts, its process listens on [`PROXY_PORT`] of that loopback and hands the
//! listening socket to its host (see `crate::spawn`); the host accepts there, in the agent's
//! namespace, and dials out from its own. What the agent reaches is therefore only what this
//! proxy lets through: a program that ignores the proxy variables finds no route at all.
//!
//! One request per connection: an HTTP `CONNECT host:port` (what HTTPS goes through) or a
//! plain-HTTP request in absolute form (`GET http://host/path`), whose head is passed on in
//! origin form. The host is decided by the agent's lists ([`crew_core::config::hosts`]) before
//! anything is resolved — an unlisted name is never looked up — and then by the addresses it
//! resolves to; the connection goes to an address that was decided on, so a name that
//! resolves differently the second time gains nothing. A refusal is answered `403` with the
//! reason (the key and the file to add the host to), and every request is reported to the
//! [`NetworkLog`].

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crew_core::config::hosts::{self, HostList, Verdict};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

pub mod credentials;
mod gate;
mod relay;
mod request;

pub use credentials::{HeldCredential, HeldKey, ValueSource};
use request::{Kind, endpoint, is_own_address, parse, read_head};

/// The port the proxy listens on, in the agent's own network namespace.
pub const PROXY_PORT: u16 = 3128;

/// The proxy's address as the agent's variables name it.
pub const PROXY_URL: &str = "http://127.0.0.1:3128";

/// The variables that point an agent's programs at its proxy, set over anything its
/// definition passes: the proxy for every scheme, and `NO_PROXY` empty — a host the user's
/// list bypasses would find no route, and a loopback address is the host's through the proxy
/// (listed exactly, as a model API's stand-in or gateway on this machine is).
pub const PROXY_VARS: &[(&str, &str)] = &[
    ("HTTP_PROXY", PROXY_URL),
    ("HTTPS_PROXY", PROXY_URL),
    ("ALL_PROXY", PROXY_URL),
    ("http_proxy", PROXY_URL),
    ("https_proxy", PROXY_URL),
    ("all_proxy", PROXY_URL),
    ("NO_PROXY", ""),
    ("no_proxy", ""),
];

/// The longest request head the proxy reads.
const MAX_HEAD: usize = 64 * 1024;

/// The most connections one agent's proxy serves at once; more wait in its listening queue
/// until one ends. Each costs the host two descriptors and, while bytes flow, a buffer per
/// direction (a few of them large, see `relay::BULK_READERS`): an agent cannot take the host's
/// descriptors or memory from its other tasks.
/// Package managers open a few dozen at most (npm 15 an origin).
const MAX_CONNECTIONS: usize = 128;

/// How long a client may take to send its request head, and the proxy to reach a host.
const HEAD_TIMEOUT: Duration = Duration::from_secs(30);

/// One request the proxy decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkRequest {
    /// The host asked for, as the agent wrote it.
    pub host: String,
    /// Its port.
    pub port: u16,
    /// Whether the rules let it through (it may still not have been reached).
    pub allowed: bool,
    /// Why it was refused, or why an allowed one could not be reached.
    pub reason: Option<String>,
}

/// Where the proxy reports each request: the run's events, for a task.
#[derive(Clone)]
pub struct NetworkLog(Arc<dyn Fn(NetworkRequest) + Send + Sync>);

impl NetworkLog {
    /// A log that hands each request to `report`.
    pub fn new(report: impl Fn(NetworkRequest) + Send + Sync + 'static) -> Self {
        NetworkLog(Arc::new(report))
    }
}

impl std::fmt::Debug for NetworkLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NetworkLog")
    }
}

/// What one agent's proxy lets through, and where it reports.
#[derive(Debug, Clone)]
pub struct Rules {
    /// Every list that applies (see [`crew_core::config::hosts`]).
    pub lists: Vec<HostList>,
    /// Where each request is reported.
    pub log: Option<NetworkLog>,
    /// The credentials it holds for the agent, each served at an endpoint of its own.
    pub credentials: Vec<HeldCredential>,
}

/// How many requests a proxy let through and refused, and why the first few hosts were.
#[derive(Debug, Default)]
pub struct Counts {
    allowed: AtomicU64,
    refused: AtomicU64,
    refusals: std::sync::Mutex<Vec<String>>,
    /// Since the last request that got through: requests the lists allowed that failed
    /// upstream (a name that cannot be resolved, a host that cannot be reached).
    unreachable: std::sync::Mutex<Option<FailingUpstream>>,
}

/// Requests the lists allowed that have all failed upstream, and none got through, for a while.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailingUpstream {
    /// Since the first of them.
    pub since: std::time::Instant,
    /// When the last of them failed.
    pub last_at: std::time::Instant,
    /// How many.
    pub failures: u64,
    /// Why the last one failed (`… cannot be resolved: …`).
    pub last: String,
}

/// How many distinct refusals a proxy keeps for its task's warning (every one is an event).
const KEPT_REFUSALS: usize = 8;

impl Counts {
    /// Why the lists refused requests, once per reason, the first few.
    pub fn refusals(&self) -> Vec<String> {
        self.refusals
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// The counts as a record keeps them.
    pub fn record(&self) -> crew_core::model::NetworkCounts {
        crew_core::model::NetworkCounts {
            allowed: self.allowed(),
            refused: self.refused(),
        }
    }

    /// Requests let through.
    pub fn allowed(&self) -> u64 {
        self.allowed.load(Ordering::Relaxed)
    }

    /// Requests refused.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Whether every request let through since the last that got through has failed
    /// upstream: since when, how many, and why the last did.
    pub fn unreachable(&self) -> Option<FailingUpstream> {
        self.unreachable
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Notes how a request the lists allowed went upstream: through (`None`), or failed for
    /// `reason`.
    fn upstream(&self, failed: Option<&str>) {
        let mut unreachable = self
            .unreachable
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let now = std::time::Instant::now();
        match (failed, unreachable.as_mut()) {
            (None, _) => *unreachable = None,
            (Some(reason), Some(down)) => {
                down.failures += 1;
                down.last_at = now;
                reason.clone_into(&mut down.last);
            }
            (Some(reason), None) => {
                *unreachable = Some(FailingUpstream {
                    since: now,
                    last_at: now,
                    failures: 1,
                    last: reason.to_owned(),
                });
            }
        }
    }
}

/// A running proxy: it serves until dropped, and its open connections end with it.
#[derive(Debug)]
pub struct Proxy {
    serving: tokio::task::JoinHandle<()>,
    counts: Arc<Counts>,
}

impl Proxy {
    /// Serves `listener` (the socket the agent's process listened on) under `rules`. Needs
    /// a tokio runtime.
    pub fn start(listener: std::net::TcpListener, rules: Rules) -> std::io::Result<Proxy> {
        listener.set_nonblocking(true)?;
        let listener = TcpListener::from_std(listener)?;
        let counts = Arc::new(Counts::default());
        let serving = tokio::spawn(serve(listener, Arc::new(rules), counts.clone()));
        Ok(Proxy { serving, counts })
    }

    /// What it let through and refused so far.
    pub fn counts(&self) -> &Counts {
        &self.counts
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.serving.abort();
    }
}

async fn serve(listener: TcpListener, rules: Arc<Rules>, counts: Arc<Counts>) {
    // Dropped with this task (aborted with its proxy): every connection ends with it.
    let mut connections = JoinSet::new();
    let bulk = relay::BulkReads::new();
    loop {
        tokio::select! {
            accepted = listener.accept(), if connections.len() < MAX_CONNECTIONS => match accepted {
                Ok((stream, _)) => {
                    connections.spawn(connection(stream, rules.clone(), counts.clone(), bulk.clone()));
                }
                // Out of descriptors and the like: the agent's next try may succeed.
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

async fn connection(
    mut client: TcpStream,
    rules: Arc<Rules>,
    counts: Arc<Counts>,
    bulk: relay::BulkReads,
) {
    let mut buffer = Vec::with_capacity(4096);
    let read = tokio::time::timeout(HEAD_TIMEOUT, read_head(&mut client, &mut buffer)).await;
    // A request the proxy cannot read is refused, and reported as every refusal is: it names
    // no host.
    let malformed = |reason: &str| {
        counts.refused.fetch_add(1, Ordering::Relaxed);
        if let Some(log) = &rules.log {
            (log.0)(NetworkRequest {
                host: String::new(),
                port: 0,
                allowed: false,
                reason: Some(format!("a request the proxy could not read: {reason}")),
            });
        }
    };
    let Ok(Ok(mut head_len)) = read else {
        let reason = "the proxy did not get a request head";
        malformed(reason);
        // The agent's client may be gone: its request failed either way, and is reported.
        let _ = respond(&mut client, 400, reason).await;
        return;
    };
    let mut request = match parse(&buffer[..head_len]) {
        Ok(request) => request,
        Err(reason) => {
            malformed(&reason);
            // The agent's client may be gone: its request failed either way, and is reported.
            let _ = respond(&mut client, 400, &reason).await;
            return;
        }
    };
    // A tunnel to the proxy's own address (a client that tunnels every request, a websocket):
    // the request inside it is one to an endpoint.
    if matches!(request.kind, Kind::Connect) && is_own_address(&request.host, request.port) {
        if client
            .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .await
            .is_err()
        {
            return;
        }
        buffer.drain(..head_len);
        let inner = tokio::time::timeout(HEAD_TIMEOUT, read_head(&mut client, &mut buffer)).await;
        let parsed = match inner {
            Ok(Ok(length)) => {
                head_len = length;
                parse(&buffer[..head_len])
            }
            _ => Err("the proxy did not get a request head in its tunnel".to_owned()),
        };
        request = match parsed {
            Ok(inner) if matches!(inner.kind, Kind::Endpoint(_)) => inner,
            Ok(_) => {
                let reason = "a tunnel to crew's proxy carries requests to its endpoints only";
                malformed(reason);
                // The agent's client may be gone: its request failed either way, and is reported.
                let _ = respond(&mut client, 400, reason).await;
                return;
            }
            Err(reason) => {
                malformed(&reason);
                // The agent's client may be gone: its request failed either way, and is reported.
                let _ = respond(&mut client, 400, &reason).await;
                return;
            }
        };
    }
    // A credential's stand-in goes to its own endpoint only; there it becomes the real value,
    // and the request goes to the credential's upstream.
    let mut tls = false;
    let mut gate_key: Option<String> = None;
    let checked = match &request.kind {
        Kind::Connect => Ok(None),
        Kind::Forward(head) => {
            match credentials::misplaced_stand_in(&rules.credentials, None, head, &request.host) {
                Some(reason) => Err((403, reason)),
                None => Ok(None),
            }
        }
        Kind::Endpoint(head) => endpoint(&rules.credentials, head).map(Some),
    };
    match checked {
        Ok(None) => {}
        Ok(Some(sent)) => {
            tls = sent.tls;
            gate_key = sent.gate;
            request.host = sent.host;
            request.port = sent.port;
            request.kind = Kind::Forward(sent.head);
        }
        Err((status, reason)) => {
            counts.refused.fetch_add(1, Ordering::Relaxed);
            if let Some(log) = &rules.log {
                (log.0)(NetworkRequest {
                    host: if request.host.is_empty() {
                        "127.0.0.1".to_owned()
                    } else {
                        request.host.clone()
                    },
                    port: request.port,
                    allowed: false,
                    reason: Some(reason.clone()),
                });
            }
            // The agent's client may be gone: its request failed either way, and is reported.
            let _ = respond(&mut client, status, &reason).await;
            return;
        }
    }
    let decided = decide(&rules.lists, &request.host, request.port).await;
    let report = |allowed: bool, reason: Option<String>| {
        if allowed {
            counts.allowed.fetch_add(1, Ordering::Relaxed);
            counts.upstream(reason.as_deref());
        } else {
            counts.refused.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(log) = &rules.log {
            (log.0)(NetworkRequest {
                host: request.host.clone(),
                port: request.port,
                allowed,
                reason,
            });
        }
    };
    let addresses = match decided {
        Ok(addresses) => addresses,
        Err((status, reason)) => {
            if status == 403 {
                let mut kept = counts
                    .refusals
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
                if kept.len() < KEPT_REFUSALS && !kept.contains(&reason) {
                    kept.push(reason.clone());
                }
            }
            // Allowed but not found (no such name) is no refusal of the rules.
            report(status != 403, Some(reason.clone()));
            // The agent's client may be gone: its request failed either way, and is reported.
            let _ = respond(&mut client, status, &reason).await;
            return;
        }
    };
    // A credential's endpoint: its provider's gate first (see `gate`).
    let passed = match &gate_key {
        Some(key) => Some(gate::pass(key).await),
        None => None,
    };
    let upstream = tokio::time::timeout(HEAD_TIMEOUT, TcpStream::connect(&addresses[..])).await;
    let mut upstream = match upstream {
        Ok(Ok(upstream)) => upstream,
        Ok(Err(error)) => {
            let reason = format!(
                "{}:{} cannot be reached: {error}",
                request.host, request.port
            );
            report(true, Some(reason.clone()));
            // The agent's client may be gone: its request failed either way, and is reported.
            let _ = respond(&mut client, 502, &reason).await;
            return;
        }
        Err(_) => {
            let reason = format!("{}:{} did not answer in time", request.host, request.port);
            report(true, Some(reason.clone()));
            // The agent's client may be gone: its request failed either way, and is reported.
            let _ = respond(&mut client, 504, &reason).await;
            return;
        }
    };
    if !tls {
        report(true, None);
    }
    // Only latency: the relay works without it (here and below).
    let _ = upstream.set_nodelay(true);
    // Only latency: the relay works without it.
    let _ = client.set_nodelay(true);
    if tls {
        // A credential's upstream: its head and what followed it go on over TLS.
        let Kind::Forward(head) = &request.kind else {
            return;
        };
        let secured = match credentials::tls_connector() {
            Ok(connector) => match rustls::pki_types::ServerName::try_from(request.host.clone()) {
                Ok(name) => connector
                    .connect(name, upstream)
                    .await
                    .map_err(|error| error.to_string()),
                Err(error) => Err(error.to_string()),
            },
            Err(reason) => Err(reason),
        };
        let mut secured = match secured {
            Ok(secured) => secured,
            Err(error) => {
                let reason = format!(
                    "{}:{} could not be reached over TLS: {error}",
                    request.host, request.port
                );
                report(true, Some(reason.clone()));
                // The agent's client may be gone: its request failed either way.
                let _ = respond(&mut client, 502, &reason).await;
                return;
            }
        };
        report(true, None);
        if secured.write_all(head).await.is_err()
            || secured.write_all(&buffer[head_len..]).await.is_err()
        {
            return;
        }
        drop(buffer);
        match passed {
            Some(passed) => gate::relay(&mut client, secured, passed).await,
            None => {
                // The connection ends either way; the request was counted when it was let
                // through.
                let _ = tokio::io::copy_bidirectional(&mut client, &mut secured).await;
            }
        }
        return;
    }
    let sent = match &request.kind {
        Kind::Connect | Kind::Endpoint(_) => {
            client
                .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                .await
        }
        Kind::Forward(head) => upstream.write_all(head).await,
    };
    // What the client sent after its head (a pipelined body) goes on as it came.
    if sent.is_err() || upstream.write_all(&buffer[head_len..]).await.is_err() {
        return;
    }
    drop(buffer);
    match passed {
        Some(passed) => gate::relay(&mut client, upstream, passed).await,
        None => {
            // The connection ends either way; the request was counted when it was let through.
            let _ = relay::relay(&client, &upstream, &bulk).await;
        }
    }
}

/// The addresses to connect to, or the status and reason of a refusal. The lists are asked
/// before any lookup, so that an unlisted name is never resolved (no way out through the
/// resolver), then again with the addresses found.
async fn decide(
    lists: &[HostList],
    host: &str,
    port: u16,
) -> Result<Vec<SocketAddr>, (u16, String)> {
    if let Verdict::Refused { reason, .. } = hosts::decide(lists, host, port, &[], &[]) {
        return Err((403, reason));
    }
    let addresses: Vec<SocketAddr> = match host.parse::<IpAddr>() {
        Ok(address) => vec![SocketAddr::new(address, port)],
        Err(_) => match tokio::net::lookup_host((host, port)).await {
            Ok(found) => found.collect(),
            Err(error) => return Err((502, format!("{host} cannot be resolved: {error}"))),
        },
    };
    if addresses.is_empty() {
        return Err((502, format!("{host} resolves to no address")));
    }
    let ips: Vec<IpAddr> = addresses.iter().map(SocketAddr::ip).collect();
    // Read at each request: an interface may come up (or get another address) meanwhile.
    let own = crate::sys::own_addresses();
    match hosts::decide(lists, host, port, &ips, &own) {
        Verdict::Allowed => Ok(addresses),
        Verdict::Refused { reason, .. } => Err((403, reason)),
    }
}

async fn respond(client: &mut TcpStream, status: u16, reason: &str) -> std::io::Result<()> {
    let phrase = match status {
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        502 => "Bad Gateway",
        _ => "Gateway Timeout",
    };
    let body = format!("crew: {reason}\n");
    let response = format!(
        "HTTP/1.1 {status} {phrase}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    client.write_all(response.as_bytes()).await?;
    client.shutdown().await
}

#[cfg(test)]
mod tests;
