//! What an agent asks its proxy: a request head read into its parts, and where a request to
//! a credential's endpoint goes.

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

use super::credentials::{self, HeldCredential};
use super::{MAX_HEAD, PROXY_PORT};

/// What the agent asked for.
pub(super) struct Request {
    pub(super) host: String,
    pub(super) port: u16,
    pub(super) kind: Kind,
}

pub(super) enum Kind {
    /// `CONNECT host:port`.
    Connect,
    /// Plain HTTP to `host`: the head to send on, in origin form.
    Forward(Vec<u8>),
    /// A request to the proxy itself (a credential's endpoint, `/<name>/…`): its head, in
    /// origin form, to be sent on to that credential's upstream.
    Endpoint(Head),
}

/// A request head in origin form, read into its parts.
pub(super) struct Head {
    pub(super) method: String,
    pub(super) path: String,
    pub(super) headers: Vec<(String, Vec<u8>)>,
}

impl Head {
    /// The head as sent, `Host` first.
    pub(super) fn bytes(&self, host: &str) -> Vec<u8> {
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

/// A request to a credential's endpoint, ready to go on to its upstream.
pub(super) struct SentOn {
    /// The provider's gate it passes (see `gate`): its credential's name and upstream; `None`
    /// for a websocket's upgrade, which lasts a session and is limited inside it.
    pub(super) gate: Option<String>,
    pub(super) tls: bool,
    pub(super) host: String,
    pub(super) port: u16,
    pub(super) head: Vec<u8>,
}

/// Where an endpoint request goes and its head with the real values, or the status and
/// reason of its refusal.
pub(super) fn endpoint(held: &[HeldCredential], head: &Head) -> Result<SentOn, (u16, String)> {
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
    let upgrade = head
        .headers
        .iter()
        .any(|(name, _)| name.eq_ignore_ascii_case("upgrade"));
    Ok(SentOn {
        gate: (!upgrade).then(|| format!("{name}@{}:{}", upstream.host, upstream.port)),
        tls: upstream.tls,
        host: upstream.host.clone(),
        port: upstream.port,
        head: sent,
    })
}

/// Reads until the end of a request head; its length.
pub(super) async fn read_head(
    client: &mut TcpStream,
    buffer: &mut Vec<u8>,
) -> std::io::Result<usize> {
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
pub(super) fn parse(head: &[u8]) -> Result<Request, String> {
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
pub(super) fn is_own_address(host: &str, port: u16) -> bool {
    port == PROXY_PORT && ["127.0.0.1", "localhost", "::1"].contains(&host)
}

/// `host:port`, `[v6]:port`, or (with a default port) a bare host.
pub(super) fn split_authority(authority: &str, default_port: Option<u16>) -> Option<(String, u16)> {
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
