//! Credentials used by reference: the proxy's endpoints.
//!
//! An agent whose definition binds a secret to an upstream gets a stand-in value (worth
//! nothing anywhere) and a base URL on its proxy, `http://127.0.0.1:3128/<name>`. A request
//! there is sent on to that credential's upstream only — its path under the upstream's, its
//! `Host` the upstream's — with each stand-in of that credential replaced by the real value,
//! read on the host when the request comes (a login file refreshed meanwhile is read again).
//! One request per connection (`Connection: close` both ways), so that every head the
//! upstream reads went through here. A stand-in seen anywhere else — another credential's
//! endpoint, a plain-HTTP request to any host — is refused and reported.

use std::sync::{Arc, OnceLock};

use crew_core::config::credentials::Upstream;

/// Reads a credential's real value on the host; the error says why it could not.
pub type ValueSource = Arc<dyn Fn() -> Result<String, String> + Send + Sync>;

/// One credential an agent's proxy holds.
#[derive(Clone)]
pub struct HeldCredential {
    /// Its endpoint's name: the first segment of the path.
    pub name: String,
    /// Where its requests go.
    pub upstream: Upstream,
    /// The variables it holds, each with the agent's stand-in.
    pub keys: Vec<HeldKey>,
}

/// One variable of a credential: what the agent was given, and where the real value is read.
#[derive(Clone)]
pub struct HeldKey {
    /// The variable (for reasons and records; never its value).
    pub variable: String,
    /// The value the agent holds instead.
    pub stand_in: String,
    /// The real value.
    pub value: ValueSource,
}

impl std::fmt::Debug for HeldKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never a value: the stand-in too stays out of logs.
        f.debug_struct("HeldKey")
            .field("variable", &self.variable)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for HeldCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never a value: the stand-ins too stay out of logs.
        f.debug_struct("HeldCredential")
            .field("name", &self.name)
            .field("upstream", &self.upstream)
            .field("keys", &self.keys)
            .finish()
    }
}

/// Where a stand-in was found where it does not belong: the refusal's reason.
pub(super) fn misplaced_stand_in(
    credentials: &[HeldCredential],
    except: Option<&str>,
    head: &[u8],
    destination: &str,
) -> Option<String> {
    credentials
        .iter()
        .filter(|credential| Some(credential.name.as_str()) != except)
        .flat_map(|credential| {
            credential
                .keys
                .iter()
                .map(move |key| (credential.name.as_str(), key))
        })
        .find(|(_, key)| contains(head, key.stand_in.as_bytes()))
        .map(|(name, key)| {
            format!(
                "a request to {destination} carries the stand-in of {}: it is for crew's `{name}` endpoint only, which adds the real value",
                key.variable
            )
        })
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty()
        && haystack
            .windows(needle.len())
            .any(|window| window == needle)
}

/// `head` with every stand-in of `credential` replaced by its real value.
pub(super) fn with_values(credential: &HeldCredential, head: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = head.to_vec();
    for key in &credential.keys {
        let needle = key.stand_in.as_bytes();
        if !contains(&out, needle) {
            continue;
        }
        let value = (key.value)().map_err(|reason| {
            format!(
                "crew could not read the value of {} for its `{}` endpoint: {reason}",
                key.variable, credential.name
            )
        })?;
        if value.bytes().any(|byte| byte == b'\r' || byte == b'\n') {
            return Err(format!(
                "the value of {} holds a line break, which no request head can carry",
                key.variable
            ));
        }
        out = replace_all(&out, needle, value.as_bytes());
    }
    Ok(out)
}

fn replace_all(haystack: &[u8], needle: &[u8], with: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(haystack.len() + with.len());
    let mut rest = haystack;
    while let Some(at) = rest
        .windows(needle.len())
        .position(|window| window == needle)
    {
        out.extend_from_slice(&rest[..at]);
        out.extend_from_slice(with);
        rest = &rest[at + needle.len()..];
    }
    out.extend_from_slice(rest);
    out
}

/// The roots this crate's tests trust instead of the system's.
#[cfg(test)]
pub(super) static TEST_ROOTS: OnceLock<Vec<rustls::pki_types::CertificateDer<'static>>> =
    OnceLock::new();

/// The TLS settings a credential's upstream is reached with: the system's roots.
pub(super) fn tls_connector() -> Result<tokio_rustls::TlsConnector, String> {
    static CONFIG: OnceLock<Result<Arc<rustls::ClientConfig>, String>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            #[allow(unused_mut)]
            let mut found = rustls_native_certs::load_native_certs();
            #[cfg(test)]
            if let Some(roots) = TEST_ROOTS.get() {
                found.certs = roots.clone();
            }
            let mut roots = rustls::RootCertStore::empty();
            let (added, _) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                return Err(format!(
                    "this machine has no certificate roots crew can read (set SSL_CERT_FILE, or install ca-certificates){}",
                    found
                        .errors
                        .first()
                        .map(|error| format!(": {error}"))
                        .unwrap_or_default()
                ));
            }
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .map(|builder| {
                    Arc::new(
                        builder
                            .with_root_certificates(roots)
                            .with_no_client_auth(),
                    )
                })
                .map_err(|error| error.to_string())
        })
        .clone()
        .map(tokio_rustls::TlsConnector::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn credential(name: &str, stand_in: &str, value: &str) -> HeldCredential {
        let value = value.to_owned();
        HeldCredential {
            name: name.to_owned(),
            upstream: crew_core::config::credentials::parse_upstream("http://127.0.0.1:1").unwrap(),
            keys: vec![HeldKey {
                variable: "API_KEY".to_owned(),
                stand_in: stand_in.to_owned(),
                value: Arc::new(move || Ok(value.clone())),
            }],
        }
    }

    #[test]
    fn a_stand_in_is_replaced_at_its_own_endpoint_and_refused_everywhere_else() {
        let held = [
            credential("a", "crew-stand-in-a", "sk-real-a"),
            credential("b", "crew-stand-in-b", "sk-real-b"),
        ];
        let head = b"POST /v1 HTTP/1.1\r\nx-api-key: crew-stand-in-a\r\nauthorization: Bearer crew-stand-in-a\r\n\r\n";
        assert_eq!(
            with_values(&held[0], head).unwrap(),
            b"POST /v1 HTTP/1.1\r\nx-api-key: sk-real-a\r\nauthorization: Bearer sk-real-a\r\n\r\n"
        );
        assert!(misplaced_stand_in(&held, Some("a"), head, "x").is_none());
        let refused = misplaced_stand_in(&held, Some("b"), head, "crew's `b` endpoint").unwrap();
        assert!(
            refused.contains("API_KEY") && refused.contains("`a`"),
            "{refused}"
        );
        assert!(misplaced_stand_in(&held, None, head, "example.com").is_some());
        assert!(misplaced_stand_in(&held, None, b"GET / HTTP/1.1\r\n\r\n", "x").is_none());
    }

    #[test]
    fn a_value_that_cannot_be_read_or_would_split_the_head_is_refused() {
        let mut broken = credential("a", "s", "");
        broken.keys[0].value = Arc::new(|| Err("no such file".to_owned()));
        let error = with_values(&broken, b"x: s\r\n").unwrap_err();
        assert!(
            error.contains("API_KEY") && error.contains("no such file"),
            "{error}"
        );
        let split = credential("a", "s", "v\r\nHost: evil");
        assert!(with_values(&split, b"x: s\r\n").is_err());
    }
}
