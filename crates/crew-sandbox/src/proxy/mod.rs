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

mod relay;

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
    /// `None` for `CONNECT`; else the head to send on, in origin form.
    head: Option<Vec<u8>>,
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
    let Ok(Ok(head_len)) = read else {
        let reason = "the proxy did not get a request head";
        malformed(reason);
        // The agent's client may be gone: its request failed either way, and is reported.
        let _ = respond(&mut client, 400, reason).await;
        return;
    };
    let request = match parse(&buffer[..head_len]) {
        Ok(request) => request,
        Err(reason) => {
            malformed(&reason);
            // The agent's client may be gone: its request failed either way, and is reported.
            let _ = respond(&mut client, 400, &reason).await;
            return;
        }
    };
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
    report(true, None);
    // Only latency: the relay works without it (here and below).
    let _ = upstream.set_nodelay(true);
    // Only latency: the relay works without it.
    let _ = client.set_nodelay(true);
    let sent = match &request.head {
        None => {
            client
                .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                .await
        }
        Some(head) => upstream.write_all(head).await,
    };
    // What the client sent after its head (a pipelined body) goes on as it came.
    if sent.is_err() || upstream.write_all(&buffer[head_len..]).await.is_err() {
        return;
    }
    drop(buffer);
    // The connection ends either way; the request was counted when it was let through.
    let _ = relay::relay(&client, &upstream, &bulk).await;
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
            head: None,
        });
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
        head: Some(out),
    })
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
        let _proxy = Proxy::start(listener, Rules { lists, log: None }).unwrap();
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
        assert_eq!(
            String::from_utf8(request.head.unwrap()).unwrap(),
            "GET /a?b=1 HTTP/1.1\r\nHost: example.com:8080\r\nAccept: */*\r\n\r\n"
        );
        let connect = parse(b"CONNECT [::1]:443 HTTP/1.1\r\nHost: [::1]:443\r\n\r\n").unwrap();
        assert_eq!((connect.host.as_str(), connect.port), ("::1", 443));
        assert!(connect.head.is_none());
        assert_eq!(parse(b"GET http://h HTTP/1.1\r\n\r\n").unwrap().port, 80);
        for (head, said) in [
            (&b"GET /local HTTP/1.1\r\n\r\n"[..], "absolute http:// URL"),
            (b"GET https://h/ HTTP/1.1\r\n\r\n", "CONNECT"),
            (b"CONNECT h HTTP/1.1\r\n\r\n", "host:port"),
            (b"\x16\x03\x01 garbage\r\n\r\n", "could not read"),
        ] {
            let error = parse(head).err().unwrap();
            assert!(error.contains(said), "{error}");
        }
    }
}
