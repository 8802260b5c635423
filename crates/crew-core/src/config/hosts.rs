//! The hosts an agent with `network = "proxy"` reaches: `allow_hosts` entries, and the rule
//! that decides each request crew's proxy sees.
//!
//! An entry is `host`, `host:port`, `*.domain` (any name beneath the domain, not the domain
//! itself), `*.domain:port`, an IP address (`10.0.0.5`, `[::1]`, either with `:port`), or `*`
//! (any host). A host without a port matches every port. Names are compared without case and
//! without a trailing dot.
//!
//! Every list that applies must allow a request (the project's `[sandbox] allow_hosts` and
//! the agent definition's): a list can only narrow what another allows. With no list at all,
//! `proxy` reaches no host. A name that resolves to a loopback, private, link-local or
//! otherwise local address, or to one of the machine's own (the user's own servers, the
//! cloud's metadata service, a server bound to every interface) is reached only when every
//! list names it exactly — host and address alike, never by a wildcard.

use std::fmt;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

/// One `allow_hosts` entry.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct HostPattern {
    host: HostName,
    /// `None`: every port.
    port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum HostName {
    /// `*`: every host.
    Any,
    /// `*.domain`: every name beneath `domain`.
    Beneath(String),
    /// A name, compared as written (lowercase, no trailing dot).
    Name(String),
    /// An address.
    Address(IpAddr),
}

impl HostPattern {
    /// Parses one entry; the error says what is wrong with it and what is expected.
    pub fn parse(entry: &str) -> Result<HostPattern, String> {
        let expected = "write a host (`api.example.com`), `host:port`, `*.domain` or an IP address";
        if entry.contains("://") {
            return Err(format!(
                "`{entry}` is a URL: {expected}, without a scheme or path"
            ));
        }
        if entry.contains('/') {
            return Err(format!("`{entry}` has a path: {expected}"));
        }
        if entry.trim() != entry || entry.is_empty() {
            return Err(format!("`{entry}` is not a host: {expected}"));
        }
        let (host, port) = split_port(entry).map_err(|why| format!("`{entry}`: {why}"))?;
        let host = if host == "*" {
            HostName::Any
        } else if let Some(domain) = host.strip_prefix("*.") {
            let domain = normalize(domain);
            check_name(&domain).map_err(|why| format!("`{entry}`: {why}; {expected}"))?;
            HostName::Beneath(domain)
        } else if let Ok(address) = host.parse::<IpAddr>() {
            HostName::Address(address)
        } else {
            let name = normalize(host);
            check_name(&name).map_err(|why| format!("`{entry}`: {why}; {expected}"))?;
            HostName::Name(name)
        };
        Ok(HostPattern { host, port })
    }

    /// Whether a request to `host` (a name or an address, as the agent wrote it) on `port`
    /// matches this entry.
    pub fn matches(&self, host: &str, port: u16) -> bool {
        if self.port.is_some_and(|own| own != port) {
            return false;
        }
        match &self.host {
            HostName::Any => true,
            HostName::Beneath(domain) => {
                let host = normalize(host);
                host.len() > domain.len()
                    && host.ends_with(domain.as_str())
                    && host.as_bytes()[host.len() - domain.len() - 1] == b'.'
            }
            HostName::Name(name) => normalize(host) == *name,
            HostName::Address(address) => parse_address(host) == Some(*address),
        }
    }

    /// Whether this entry names `host` itself (no wildcard): what a request to a local
    /// address needs.
    pub fn names(&self, host: &str, port: u16) -> bool {
        matches!(self.host, HostName::Name(_) | HostName::Address(_)) && self.matches(host, port)
    }
}

impl fmt::Display for HostPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let host = match &self.host {
            HostName::Any => "*".to_owned(),
            HostName::Beneath(domain) => format!("*.{domain}"),
            HostName::Name(name) => name.clone(),
            HostName::Address(IpAddr::V6(address)) if self.port.is_some() => {
                format!("[{address}]")
            }
            HostName::Address(address) => address.to_string(),
        };
        match self.port {
            Some(port) => write!(f, "{host}:{port}"),
            None => f.write_str(&host),
        }
    }
}

impl TryFrom<String> for HostPattern {
    type Error = String;
    fn try_from(entry: String) -> Result<Self, String> {
        HostPattern::parse(&entry)
    }
}

impl From<HostPattern> for String {
    fn from(pattern: HostPattern) -> String {
        pattern.to_string()
    }
}

/// One list of hosts and where it was written (`.crew/config.toml`), for the message that
/// says where to add a refused host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostList {
    /// The file, as the user knows it.
    pub file: String,
    /// Its entries.
    pub hosts: Vec<HostPattern>,
}

/// What crew's proxy decided of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Every list allows it.
    Allowed,
    /// A list does not: the file to add the host to, and why.
    Refused {
        /// The file whose `allow_hosts` refused it (`None`: there is no list at all).
        file: Option<String>,
        /// What was refused, for the agent and the run's record.
        reason: String,
    },
}

/// Decides a request to `host:port` whose resolved addresses are `addresses` against every
/// list that applies (see the module's documentation); `own` are the machine's own addresses
/// (every interface's), local whatever their range.
pub fn decide(
    lists: &[HostList],
    host: &str,
    port: u16,
    addresses: &[IpAddr],
    own: &[IpAddr],
) -> Verdict {
    if lists.is_empty() {
        return Verdict::Refused {
            file: None,
            reason: format!(
                "{host}:{port} is not allowed: no `allow_hosts` applies to the agent, so it reaches no host (add \"{}\" to `allow_hosts` in its definition, .crew/agents/<name>.toml, or set `network = \"open\"` there)",
                display_host(host, port)
            ),
        };
    }
    let local = addresses
        .iter()
        .any(|address| is_local(*address) || own.contains(address));
    for list in lists {
        let allowed = if local {
            list.hosts.iter().any(|entry| entry.names(host, port))
        } else {
            list.hosts.iter().any(|entry| entry.matches(host, port))
        };
        if !allowed {
            let reason = if local && list.hosts.iter().any(|entry| entry.matches(host, port)) {
                format!(
                    "{host}:{port} is a local address, reached only when `allow_hosts` in {} names it exactly (not by a wildcard)",
                    list.file
                )
            } else {
                format!(
                    "{host}:{port} is not in `allow_hosts` of {}: add \"{}\" there to allow it",
                    list.file,
                    display_host(host, port)
                )
            };
            return Verdict::Refused {
                file: Some(list.file.clone()),
                reason,
            };
        }
    }
    Verdict::Allowed
}

/// `host:port` as an entry would name it.
fn display_host(host: &str, port: u16) -> String {
    match host.parse::<IpAddr>() {
        Ok(IpAddr::V6(address)) => format!("[{address}]:{port}"),
        _ => format!("{}:{port}", normalize(host)),
    }
}

/// Whether `address` is one of the machine's or its network's own: loopback, private,
/// link-local (the cloud metadata service), shared (CGNAT), unspecified, multicast, broadcast,
/// or an IPv6 unique-local or IPv4-mapped one of those.
pub fn is_local(address: IpAddr) -> bool {
    match address {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_multicast()
                || v4.is_broadcast()
                || a == 0
                || (a == 100 && (64..128).contains(&b))
                || a >= 240
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_local(IpAddr::V4(v4));
            }
            let first = v6.segments()[0];
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (first & 0xfe00) == 0xfc00
                || (first & 0xffc0) == 0xfe80
        }
    }
}

fn normalize(host: &str) -> String {
    host.trim_end_matches('.').to_ascii_lowercase()
}

fn parse_address(host: &str) -> Option<IpAddr> {
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .ok()
}

/// Splits `host:port`, `[v6]:port`, `[v6]`, a bare v6 address or a bare host.
fn split_port(entry: &str) -> Result<(&str, Option<u16>), String> {
    let port = |text: &str| -> Result<u16, String> {
        text.parse::<u16>()
            .ok()
            .filter(|port| *port > 0)
            .ok_or_else(|| format!("`{text}` is not a port (1 to 65535)"))
    };
    if let Some(rest) = entry.strip_prefix('[') {
        let (address, after) = rest
            .split_once(']')
            .ok_or("an IPv6 address in brackets needs its `]`")?;
        return match after {
            "" => Ok((address, None)),
            _ => match after.strip_prefix(':') {
                Some(text) => Ok((address, Some(port(text)?))),
                None => Err("write `[address]:port`".to_owned()),
            },
        };
    }
    if entry.parse::<IpAddr>().is_ok() {
        return Ok((entry, None));
    }
    match entry.rsplit_once(':') {
        Some((host, text)) if !host.contains(':') => Ok((host, Some(port(text)?))),
        Some(_) => Err("an IPv6 address with a port is written `[address]:port`".to_owned()),
        None => Ok((entry, None)),
    }
}

fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 253 {
        return Err("not a host name".to_owned());
    }
    // All digits and dots is an address or nothing (`999.1.1.1`, `1.2.3`, `1.2.3.4.5`): never a
    // name, which no resolver would look up as written.
    if name.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return Err("not an IP address (four numbers from 0 to 255, between dots)".to_owned());
    }
    for label in name.split('.') {
        if label.is_empty() || label.len() > 63 {
            return Err("a host name's parts are 1 to 63 characters, between dots".to_owned());
        }
        if let Some(bad) = label
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '_'))
        {
            return Err(format!("`{bad}` cannot be in a host name"));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(format!(
                "`{label}`: a part of a host name neither starts nor ends with `-`"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(file: &str, entries: &[&str]) -> HostList {
        HostList {
            file: file.to_owned(),
            hosts: entries
                .iter()
                .map(|entry| HostPattern::parse(entry).unwrap())
                .collect(),
        }
    }

    fn public() -> Vec<IpAddr> {
        vec!["93.184.216.34".parse().unwrap()]
    }

    #[test]
    fn entries_parse_and_print_as_written() {
        for entry in [
            "api.anthropic.com",
            "api.anthropic.com:443",
            "*.googleapis.com",
            "*.example.com:8443",
            "127.0.0.1:8080",
            "10.0.0.5",
            "[::1]:8080",
            "::1",
            "*",
        ] {
            assert_eq!(HostPattern::parse(entry).unwrap().to_string(), entry);
        }
        assert_eq!(
            HostPattern::parse("API.Example.COM.").unwrap().to_string(),
            "api.example.com"
        );
        for (entry, said) in [
            ("https://api.example.com", "is a URL"),
            ("api.example.com/v1", "has a path"),
            ("api.example.com:0", "is not a port"),
            ("api.example.com:https", "is not a port"),
            ("exa mple.com", "cannot be in a host name"),
            ("", "is not a host"),
            ("*.", "not a host name"),
            ("[::1", "needs its `]`"),
            ("999.1.1.1", "not an IP address"),
            ("1.2.3", "not an IP address"),
            ("1.2.3.4.5", "not an IP address"),
            ("-bad.com", "neither starts nor ends with `-`"),
            ("bad-.com:443", "neither starts nor ends with `-`"),
            ("*.-bad.com", "neither starts nor ends with `-`"),
        ] {
            let error = HostPattern::parse(entry).unwrap_err();
            assert!(error.contains(said), "{entry}: {error}");
        }
    }

    #[test]
    fn a_wildcard_matches_names_beneath_its_domain_only() {
        let pattern = HostPattern::parse("*.example.com").unwrap();
        assert!(pattern.matches("api.example.com", 443));
        assert!(pattern.matches("a.b.Example.com.", 80));
        assert!(!pattern.matches("example.com", 443));
        assert!(!pattern.matches("badexample.com", 443));
        assert!(!pattern.names("api.example.com", 443));
        let port = HostPattern::parse("api.example.com:443").unwrap();
        assert!(port.matches("api.example.com", 443));
        assert!(!port.matches("api.example.com", 22));
        let address = HostPattern::parse("[::1]:8080").unwrap();
        assert!(address.matches("[::1]", 8080));
        assert!(address.matches("::1", 8080));
    }

    #[test]
    fn every_list_must_allow_a_request() {
        let project = list(".crew/config.toml", &["*.example.com", "github.com"]);
        let agent = list(".crew/agents/a.toml", &["api.example.com"]);
        let lists = [project, agent];
        assert_eq!(
            decide(&lists, "api.example.com", 443, &public(), &[]),
            Verdict::Allowed
        );
        match decide(&lists, "github.com", 443, &public(), &[]) {
            Verdict::Refused { file, reason } => {
                assert_eq!(file.as_deref(), Some(".crew/agents/a.toml"));
                assert!(reason.contains("add \"github.com:443\""), "{reason}");
            }
            Verdict::Allowed => panic!("github.com is not in the agent's list"),
        }
        assert!(matches!(
            decide(&[], "api.example.com", 443, &public(), &[]),
            Verdict::Refused { file: None, .. }
        ));
    }

    #[test]
    fn a_local_address_needs_an_exact_entry() {
        let wildcard = [list("c", &["*"])];
        let loopback = vec!["127.0.0.1".parse().unwrap()];
        assert!(matches!(
            decide(&wildcard, "localhost", 5432, &loopback, &[]),
            Verdict::Refused { .. }
        ));
        let metadata = vec!["169.254.169.254".parse().unwrap()];
        assert!(matches!(
            decide(
                &[list("c", &["*.internal"])],
                "metadata.internal",
                80,
                &metadata,
                &[]
            ),
            Verdict::Refused { .. }
        ));
        let exact = [list("c", &["127.0.0.1:5432"])];
        assert_eq!(
            decide(&exact, "127.0.0.1", 5432, &loopback, &[]),
            Verdict::Allowed
        );
        assert!(matches!(
            decide(&exact, "127.0.0.1", 6379, &loopback, &[]),
            Verdict::Refused { .. }
        ));
        for address in [
            "10.1.2.3",
            "192.168.1.1",
            "100.64.0.1",
            "::1",
            "fd00::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "0.0.0.0",
        ] {
            assert!(is_local(address.parse().unwrap()), "{address}");
        }
        assert!(!is_local("93.184.216.34".parse().unwrap()));
        assert!(!is_local("2606:4700::1111".parse().unwrap()));
    }

    #[test]
    fn a_wildcard_never_reaches_an_address_of_the_machine_itself() {
        let wildcard = [list(".crew/config.toml", &["*"])];
        let own: Vec<IpAddr> = vec!["203.0.113.7".parse().unwrap()];
        let public_but_own = vec!["203.0.113.7".parse().unwrap()];
        assert!(matches!(
            decide(&wildcard, "my-server.example", 8080, &public_but_own, &own),
            Verdict::Refused { reason, .. } if reason.contains("local address")
        ));
        assert_eq!(
            decide(&wildcard, "my-server.example", 8080, &public_but_own, &[]),
            Verdict::Allowed
        );
        let exact = [list(".crew/config.toml", &["203.0.113.7:8080"])];
        assert_eq!(
            decide(&exact, "203.0.113.7", 8080, &public_but_own, &own),
            Verdict::Allowed
        );
    }
}
