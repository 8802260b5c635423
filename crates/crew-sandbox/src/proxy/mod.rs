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
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

pub mod credentials;
mod relay;

pub use credentials::{HeldCredential, HeldKey, ValueSource};

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

/// What the agent asked for.
struct Request {
    host: String,
    port: u16,
    kind: Kind,
}

enum Kind {
    /// `CONNECT host:port`.
    Connect,
    /// Plain HTTP to `host`: the head to send on, in origin form.
    Forward(Vec<u8>),
    /// A request to the proxy itself (a credential's endpoint, `/<name>/…`): its head, in
    /// origin form, to be sent on to that credential's upstream.
    Endpoint(Head),
}

/// A request head in origin form, read into its parts.
struct Head {
    method: String,
    path: String,
    headers: Vec<(String, Vec<u8>)>,
}

impl Head {
    /// The head as sent, `Host` first.
    fn bytes(&self, host: &str) -> Vec<u8> {
        let mut out = Vec::with_capacity(256);
        out.extend_from_slice(
            format!("{} {} HTTP/1.1\r\nHost: {host}\r\n", self.method, self.path).as_bytes(),
        );
        for (name, value) in &self.headers {
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"\r\n");
        out
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
        // The connection ends either way; the request was counted when it was let through.
        let _ = tokio::io::copy_bidirectional(&mut client, &mut secured).await;
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
    // The connection ends either way; the request was counted when it was let through.
    let _ = relay::relay(&client, &upstream, &bulk).await;
}

/// A request to a credential's endpoint, ready to go on to its upstream.
struct SentOn {
    tls: bool,
    host: String,
    port: u16,
    head: Vec<u8>,
}

/// Where an endpoint request goes and its head with the real values, or the status and
/// reason of its refusal.
fn endpoint(held: &[HeldCredential], head: &Head) -> Result<SentOn, (u16, String)> {
    let names = || {
        held.iter()
            .map(|credential| format!("/{}", credential.name))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if held.is_empty() {
        return Err((
            400,
            format!(
                "the proxy takes CONNECT or an absolute http:// URL, not `{}`",
                head.path
            ),
        ));
    }
    let rest = &head.path[1..];
    let (name, rest) = match rest.find(['/', '?']) {
        Some(at) => (&rest[..at], &rest[at..]),
        None => (rest, ""),
    };
    let Some(credential) = held.iter().find(|credential| credential.name == name) else {
        return Err((
            404,
            format!(
                "crew's proxy has no endpoint `/{name}`: this agent's are {}",
                names()
            ),
        ));
    };
    let upstream = &credential.upstream;
    let mut path = format!("{}{rest}", upstream.path);
    if !path.starts_with('/') {
        path.insert(0, '/');
    }
    let host = if upstream.host.contains(':') {
        format!("[{}]", upstream.host)
    } else {
        upstream.host.clone()
    };
    let default_port = if upstream.tls { 443 } else { 80 };
    let host = if upstream.port == default_port {
        host
    } else {
        format!("{host}:{}", upstream.port)
    };
    let sent = Head {
        method: head.method.clone(),
        path,
        headers: head.headers.clone(),
    }
    .bytes(&host);
    let destination = format!("crew's `{name}` endpoint");
    if let Some(reason) = credentials::misplaced_stand_in(held, Some(name), &sent, &destination) {
        return Err((403, reason));
    }
    let sent = credentials::with_values(credential, &sent).map_err(|reason| (502, reason))?;
    Ok(SentOn {
        tls: upstream.tls,
        host: upstream.host.clone(),
        port: upstream.port,
        head: sent,
    })
}

/// Reads until the end of a request head; its length.
async fn read_head(client: &mut TcpStream, buffer: &mut Vec<u8>) -> std::io::Result<usize> {
    loop {
        if let Some(end) = buffer.windows(4).position(|window| window == b"\r\n\r\n") {
            return Ok(end + 4);
        }
        if buffer.len() >= MAX_HEAD {
            return Err(std::io::Error::other("request head too long"));
        }
        let mut chunk = [0u8; 4096];
        let read = client.read(&mut chunk).await?;
        if read == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buffer.extend_from_slice(&chunk[..read]);
    }
}

/// The host, port and head of a request; the error says what the proxy takes.
fn parse(head: &[u8]) -> Result<Request, String> {
    let mut headers = [httparse::EMPTY_HEADER; 128];
    let mut parsed = httparse::Request::new(&mut headers);
    match parsed.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        _ => return Err("the proxy could not read this request head".to_owned()),
    }
    let (Some(method), Some(target)) = (parsed.method, parsed.path) else {
        return Err("the proxy could not read this request head".to_owned());
    };
    if method.eq_ignore_ascii_case("CONNECT") {
        let (host, port) = split_authority(target, None)
            .ok_or_else(|| format!("CONNECT takes host:port, not `{target}`"))?;
        return Ok(Request {
            host,
            port,
            kind: Kind::Connect,
        });
    }
    let endpoint = |path: &str| {
        // Sent on to a credential's upstream: one request a connection, and its own `Host`.
        let mut kept: Vec<(String, Vec<u8>)> = parsed
            .headers
            .iter()
            .filter(|header| {
                ![
                    "host",
                    "connection",
                    "keep-alive",
                    "proxy-connection",
                    "proxy-authorization",
                ]
                .iter()
                .any(|name| header.name.eq_ignore_ascii_case(name))
            })
            .map(|header| (header.name.to_owned(), header.value.to_vec()))
            .collect();
        // A websocket's upgrade goes on as asked: after it, no other head follows.
        let upgrade = parsed
            .headers
            .iter()
            .any(|header| header.name.eq_ignore_ascii_case("upgrade"));
        kept.push((
            "Connection".to_owned(),
            if upgrade { &b"Upgrade"[..] } else { b"close" }.to_vec(),
        ));
        Request {
            host: String::new(),
            port: PROXY_PORT,
            kind: Kind::Endpoint(Head {
                method: method.to_owned(),
                path: path.to_owned(),
                headers: kept,
            }),
        }
    };
    if target.starts_with('/') {
        return Ok(endpoint(target));
    }
    let Some(rest) = target.strip_prefix("http://") else {
        return Err(if target.starts_with("https://") {
            "an https:// request goes through CONNECT (set HTTPS_PROXY)".to_owned()
        } else {
            format!("the proxy takes CONNECT or an absolute http:// URL, not `{target}`")
        });
    };
    let (authority, path) = match rest.find(['/', '?']) {
        Some(at) => (&rest[..at], &rest[at..]),
        None => (rest, "/"),
    };
    let authority = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    let (host, port) =
        split_authority(authority, Some(80)).ok_or_else(|| format!("`{target}` names no host"))?;
    let path = if path.starts_with('?') {
        format!("/{path}")
    } else {
        path.to_owned()
    };
    // The proxy's own address, asked through itself (`NO_PROXY` is empty): an endpoint.
    if is_own_address(&host, port) {
        return Ok(endpoint(&path));
    }
    let mut out = Vec::with_capacity(head.len());
    out.extend_from_slice(method.as_bytes());
    out.push(b' ');
    out.extend_from_slice(path.as_bytes());
    out.extend_from_slice(format!(" HTTP/1.{}\r\n", parsed.version.unwrap_or(1)).as_bytes());
    for header in parsed.headers.iter() {
        if header.name.eq_ignore_ascii_case("proxy-connection")
            || header.name.eq_ignore_ascii_case("proxy-authorization")
        {
            continue;
        }
        out.extend_from_slice(header.name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(header.value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    Ok(Request {
        host,
        port,
        kind: Kind::Forward(out),
    })
}

/// Whether `host:port` is the proxy's own address in the agent's namespace.
fn is_own_address(host: &str, port: u16) -> bool {
    port == PROXY_PORT && ["127.0.0.1", "localhost", "::1"].contains(&host)
}

/// `host:port`, `[v6]:port`, or (with a default port) a bare host.
fn split_authority(authority: &str, default_port: Option<u16>) -> Option<(String, u16)> {
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        (host, after.strip_prefix(':'))
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) if !host.contains(':') => (host, Some(port)),
            Some(_) => return None,
            None => (authority, None),
        }
    };
    let port = match port {
        Some(port) => port.parse().ok().filter(|port| *port > 0)?,
        None => default_port?,
    };
    (!host.is_empty()).then(|| (host.to_owned(), port))
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
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_agent_s_connections_beyond_the_cap_wait_until_one_ends() {
        // The host the agent may reach: it counts connections and holds each open until its
        // client ends.
        let upstream = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = upstream.local_addr().unwrap().port();
        let reached = Arc::new(AtomicU64::new(0));
        let counted = reached.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = upstream.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut ignored = Vec::new();
                    let _ = stream.read_to_end(&mut ignored).await;
                });
            }
        });
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let proxy_address = listener.local_addr().unwrap();
        let lists = vec![HostList {
            file: "the test".into(),
            hosts: vec![
                crew_core::config::HostPattern::parse(&format!("127.0.0.1:{port}")).unwrap(),
            ],
        }];
        let _proxy = Proxy::start(
            listener,
            Rules {
                lists,
                log: None,
                credentials: Vec::new(),
            },
        )
        .unwrap();
        let connect = format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: x\r\n\r\n");
        let mut agents = Vec::new();
        for _ in 0..MAX_CONNECTIONS + 20 {
            let mut agent = TcpStream::connect(proxy_address).await.unwrap();
            agent.write_all(connect.as_bytes()).await.unwrap();
            agents.push(agent);
        }
        let settled = |want: u64| {
            let reached = reached.clone();
            async move {
                for _ in 0..500 {
                    if reached.load(Ordering::SeqCst) >= want {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                // Anything more would have come by now.
                tokio::time::sleep(Duration::from_millis(200)).await;
                reached.load(Ordering::SeqCst)
            }
        };
        assert_eq!(
            settled(MAX_CONNECTIONS as u64).await,
            MAX_CONNECTIONS as u64
        );
        // Ten end: ten of the waiting ones are served.
        agents.drain(..10);
        assert_eq!(
            settled(MAX_CONNECTIONS as u64 + 10).await,
            MAX_CONNECTIONS as u64 + 10
        );
    }

    #[test]
    fn a_plain_request_goes_on_in_origin_form() {
        let head = b"GET http://example.com:8080/a?b=1 HTTP/1.1\r\nHost: example.com:8080\r\nProxy-Connection: keep-alive\r\nAccept: */*\r\n\r\n";
        let request = parse(head).unwrap();
        assert_eq!((request.host.as_str(), request.port), ("example.com", 8080));
        let Kind::Forward(sent) = request.kind else {
            panic!("not sent on")
        };
        assert_eq!(
            String::from_utf8(sent).unwrap(),
            "GET /a?b=1 HTTP/1.1\r\nHost: example.com:8080\r\nAccept: */*\r\n\r\n"
        );
        let connect = parse(b"CONNECT [::1]:443 HTTP/1.1\r\nHost: [::1]:443\r\n\r\n").unwrap();
        assert_eq!((connect.host.as_str(), connect.port), ("::1", 443));
        assert!(matches!(connect.kind, Kind::Connect));
        assert_eq!(parse(b"GET http://h HTTP/1.1\r\n\r\n").unwrap().port, 80);
        // The proxy's own address, in origin form or through itself: an endpoint.
        for head in [
            &b"GET /model/v1 HTTP/1.1\r\nHost: 127.0.0.1:3128\r\n\r\n"[..],
            b"GET http://127.0.0.1:3128/model/v1 HTTP/1.1\r\nConnection: keep-alive\r\n\r\n",
        ] {
            let Kind::Endpoint(head) = parse(head).unwrap().kind else {
                panic!("not an endpoint")
            };
            assert_eq!(head.path, "/model/v1");
            assert_eq!(
                String::from_utf8(head.bytes("api.example.com")).unwrap(),
                "GET /model/v1 HTTP/1.1\r\nHost: api.example.com\r\nConnection: close\r\n\r\n"
            );
        }
        // Without credentials, the proxy says what it takes.
        let Kind::Endpoint(local) = parse(b"GET /local HTTP/1.1\r\n\r\n").unwrap().kind else {
            panic!("not an endpoint")
        };
        let (status, said) = endpoint(&[], &local).err().unwrap();
        assert_eq!(status, 400);
        assert!(said.contains("absolute http:// URL"), "{said}");
        for (head, said) in [
            (&b"GET https://h/ HTTP/1.1\r\n\r\n"[..], "CONNECT"),
            (b"CONNECT h HTTP/1.1\r\n\r\n", "host:port"),
            (b"\x16\x03\x01 garbage\r\n\r\n", "could not read"),
        ] {
            let error = parse(head).err().unwrap();
            assert!(error.contains(said), "{error}");
        }
    }

    /// A host that answers every request `ok` and keeps each head it read.
    async fn recording_host() -> (u16, Arc<std::sync::Mutex<Vec<String>>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let heads = Arc::new(std::sync::Mutex::new(Vec::new()));
        let kept = heads.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let kept = kept.clone();
                tokio::spawn(async move {
                    let mut buffer = Vec::new();
                    if let Ok(end) = read_head(&mut stream, &mut buffer).await {
                        kept.lock()
                            .unwrap()
                            .push(String::from_utf8_lossy(&buffer[..end]).into_owned());
                        let _ = stream
                            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
                            .await;
                    }
                });
            }
        });
        (port, heads)
    }

    /// Sends `request` through the proxy at `proxy`; what came back.
    async fn through(proxy: SocketAddr, request: &str) -> String {
        let mut agent = TcpStream::connect(proxy).await.unwrap();
        agent.write_all(request.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        agent.read_to_end(&mut answer).await.unwrap();
        String::from_utf8_lossy(&answer).into_owned()
    }

    fn held(upstream: &str, stand_in: &str, value: &str) -> HeldCredential {
        let value = value.to_owned();
        HeldCredential {
            name: "model".to_owned(),
            upstream: crew_core::config::credentials::parse_upstream(upstream).unwrap(),
            keys: vec![HeldKey {
                variable: "MODEL_API_KEY".to_owned(),
                stand_in: stand_in.to_owned(),
                value: Arc::new(move || Ok(value.clone())),
            }],
        }
    }

    #[tokio::test]
    async fn a_credential_s_endpoint_adds_the_real_value_for_its_upstream_only() {
        let (model, at_model) = recording_host().await;
        let (other, at_other) = recording_host().await;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let proxy = listener.local_addr().unwrap();
        let lists = vec![HostList {
            file: "the test".into(),
            hosts: [model, other]
                .iter()
                .map(|port| {
                    crew_core::config::HostPattern::parse(&format!("127.0.0.1:{port}")).unwrap()
                })
                .collect(),
        }];
        let reported = Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = {
            let reported = reported.clone();
            NetworkLog::new(move |request| reported.lock().unwrap().push(request))
        };
        let _proxy = Proxy::start(
            listener,
            Rules {
                lists,
                log: Some(log),
                credentials: vec![held(
                    &format!("http://127.0.0.1:{model}/gateway"),
                    "crew-stand-in-model-1",
                    "sk-real",
                )],
            },
        )
        .unwrap();
        // Through the proxy to its own address, as a program with HTTP_PROXY set sends it.
        let answer = through(
            proxy,
            "POST http://127.0.0.1:3128/model/v1/messages?beta=1 HTTP/1.1\r\nHost: 127.0.0.1:3128\r\nx-api-key: crew-stand-in-model-1\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\n{}",
        )
        .await;
        assert!(answer.ends_with("\r\n\r\nok"), "{answer}");
        let head = at_model.lock().unwrap().remove(0);
        assert!(
            head.starts_with(&format!(
                "POST /gateway/v1/messages?beta=1 HTTP/1.1\r\nHost: 127.0.0.1:{model}\r\n"
            )),
            "{head}"
        );
        assert!(head.contains("x-api-key: sk-real\r\n"), "{head}");
        assert!(head.contains("Connection: close\r\n"), "{head}");
        assert!(
            !head.contains("stand-in") && !head.contains("keep-alive"),
            "{head}"
        );
        // The stand-in sent to another host, even a listed one, is refused and reported.
        let refused = through(
            proxy,
            &format!("GET http://127.0.0.1:{other}/?k=crew-stand-in-model-1 HTTP/1.1\r\n\r\n"),
        )
        .await;
        assert!(refused.starts_with("HTTP/1.1 403"), "{refused}");
        assert!(refused.contains("MODEL_API_KEY"), "{refused}");
        assert!(at_other.lock().unwrap().is_empty());
        // An endpoint it does not have.
        let unknown = through(proxy, "GET /nothing/v1 HTTP/1.1\r\n\r\n").await;
        assert!(
            unknown.starts_with("HTTP/1.1 404") && unknown.contains("/model"),
            "{unknown}"
        );
        let reported = reported.lock().unwrap();
        assert!(
            reported.iter().any(|request| !request.allowed
                && request
                    .reason
                    .as_deref()
                    .is_some_and(|reason| reason.contains("stand-in"))),
            "{reported:?}"
        );
    }

    #[tokio::test]
    async fn an_https_upstream_is_reached_over_tls_with_the_system_s_roots() {
        let Some(dir) = tls_server_files() else {
            eprintln!("skipped: openssl cannot make a test certificate here");
            return;
        };
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut server = std::process::Command::new("openssl")
            .args(["s_server", "-quiet", "-www", "-accept"])
            .arg(format!("127.0.0.1:{port}"))
            .arg("-cert")
            .arg(dir.path().join("leaf.pem"))
            .arg("-key")
            .arg(dir.path().join("leaf.key"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // The test's CA is a root (the system's are not read in this test binary).
        use rustls::pki_types::pem::PemObject as _;
        let ca =
            rustls::pki_types::CertificateDer::from_pem_file(dir.path().join("ca.pem")).unwrap();
        credentials::TEST_ROOTS.set(vec![ca]).unwrap();
        for _ in 0..100 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let proxy = listener.local_addr().unwrap();
        let lists = vec![HostList {
            file: "the test".into(),
            hosts: vec![
                crew_core::config::HostPattern::parse(&format!("127.0.0.1:{port}")).unwrap(),
            ],
        }];
        let _proxy = Proxy::start(
            listener,
            Rules {
                lists,
                log: None,
                credentials: vec![held(&format!("https://127.0.0.1:{port}"), "s", "v")],
            },
        )
        .unwrap();
        let answer = through(proxy, "GET /model/ HTTP/1.1\r\nx-api-key: s\r\n\r\n").await;
        let _ = server.kill();
        let _ = server.wait();
        // openssl's status page, which names the cipher the connection used.
        assert!(answer.starts_with("HTTP/1.0 200"), "{answer}");
        assert!(answer.contains("Cipher"), "{answer}");
    }

    /// A CA and a certificate for 127.0.0.1 it signed, made by openssl; `None` without it.
    fn tls_server_files() -> Option<tempfile::TempDir> {
        let dir = tempfile::tempdir().ok()?;
        let script = "set -e
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 -subj /CN=crew-test-ca -keyout ca.key -out ca.pem
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=127.0.0.1 -keyout leaf.key -out leaf.csr
printf 'subjectAltName=IP:127.0.0.1\\nbasicConstraints=CA:FALSE\\n' > leaf.ext
openssl x509 -req -in leaf.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 -extfile leaf.ext -out leaf.pem";
        let made = std::process::Command::new("sh")
            .args(["-c", script])
            .current_dir(dir.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .ok()?;
        made.success().then_some(dir)
    }
}
