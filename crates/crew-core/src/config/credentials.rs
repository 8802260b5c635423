//! `[[sandbox.credentials]]` of an agent definition: a secret its program needs, used by
//! reference (DESIGN §8a). The program gets a stand-in value and a base URL that reaches
//! crew's proxy; the proxy puts the real value into the requests it sends on to the
//! credential's upstream, and nowhere else.

use serde::{Deserialize, Serialize};

use super::checks::{check_env_name, check_sandbox_path};

/// One credential of a definition: the endpoint its program is pointed at, the upstream the
/// proxy sends that endpoint's requests to, and the variables whose values it holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Credential {
    /// Names the endpoint (`http://127.0.0.1:3128/<name>`) and the credential in records.
    pub name: String,
    /// Where the endpoint's requests go (`https://api.anthropic.com`), unless the user's
    /// environment sets `base_url_env`: then there (the user's gateway).
    pub upstream: String,
    /// The variable the program reads its base URL from: the agent gets the endpoint in it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_url_env: Option<String>,
    /// Arguments that point the program at the endpoint, `{url}` filled with it, added to its
    /// command and resume (a program that reads no base-URL variable).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub base_url_args: Vec<String>,
    /// The variables the program reads the secret from; each is held by reference where the
    /// user has a value for it.
    pub keys: Vec<CredentialKey>,
}

/// One variable a credential holds: its value comes from the user's environment (that
/// variable, or else `from_env`), or else from a file of the program's own login, read on the
/// host at each request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum CredentialKey {
    /// `"ANTHROPIC_API_KEY"`: the user's environment.
    Variable(String),
    /// `{ env = "CODEX_API_KEY", from_env = "OPENAI_API_KEY", file = "~/.codex/auth.json",
    /// json = "OPENAI_API_KEY" }`.
    Table {
        /// The variable the agent gets the stand-in in (and the user's environment may set).
        env: String,
        /// Another variable of the user's the value may come from.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        from_env: Option<String>,
        /// The JSON file the value is read from (`~/…` or absolute), with `json`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        file: Option<String>,
        /// Where in that file: keys joined by `.`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        json: Option<String>,
    },
}

impl CredentialKey {
    /// The variable the agent gets the stand-in in.
    pub fn variable(&self) -> &str {
        match self {
            CredentialKey::Variable(name) | CredentialKey::Table { env: name, .. } => name,
        }
    }

    /// The user's variables the value may come from, in order.
    pub fn sources(&self) -> impl Iterator<Item = &str> {
        let from = match self {
            CredentialKey::Table { from_env, .. } => from_env.as_deref(),
            CredentialKey::Variable(_) => None,
        };
        std::iter::once(self.variable()).chain(from)
    }

    /// The login file and the place in it the value may come from.
    pub fn file(&self) -> Option<(&str, &str)> {
        match self {
            CredentialKey::Table {
                file: Some(file),
                json: Some(json),
                ..
            } => Some((file, json)),
            _ => None,
        }
    }
}

/// The base URL crew's proxy serves a credential's endpoint at, in the agent's namespace.
pub fn endpoint_url(proxy_url: &str, name: &str) -> String {
    format!("{proxy_url}/{name}")
}

/// Checks one credential; the message says what is wrong and what to write.
pub(super) fn check_credential(credential: &Credential) -> Result<(), String> {
    let name = &credential.name;
    if name.is_empty()
        || !name
            .bytes()
            .all(|byte| byte.is_ascii_lowercase() || byte.is_ascii_digit() || byte == b'-')
    {
        return Err(format!(
            "`{name}` is not a credential's name: lowercase letters, digits and `-` (it names its endpoint)"
        ));
    }
    parse_upstream(&credential.upstream)?;
    if let Some(variable) = &credential.base_url_env {
        check_env_name(variable, false)?;
    }
    for arg in &credential.base_url_args {
        if let Some(other) = super::placeholders(arg).find(|placeholder| *placeholder != "url") {
            return Err(format!(
                "`base_url_args` take only `{{url}}` (the endpoint), not `{{{other}}}`"
            ));
        }
    }
    if credential.base_url_env.is_none() && credential.base_url_args.is_empty() {
        return Err(format!(
            "credential `{name}` needs `base_url_env` or `base_url_args`: how its program is pointed at crew's endpoint"
        ));
    }
    if credential.keys.is_empty() {
        return Err(format!(
            "credential `{name}` holds no key: list the variables its program reads the secret from in `keys`"
        ));
    }
    for key in &credential.keys {
        for variable in key.sources() {
            check_env_name(variable, false)?;
        }
        let CredentialKey::Table { file, json, .. } = key else {
            continue;
        };
        match (file, json) {
            (None, None) => {}
            (Some(file), Some(json)) => {
                check_sandbox_path(file)?;
                if json.is_empty() || json.split('.').any(str::is_empty) {
                    return Err(format!(
                        "`json = \"{json}\"` names no place in the file: write the keys joined by `.`, as \"claudeAiOauth.accessToken\""
                    ));
                }
            }
            _ => {
                return Err(format!(
                    "the key `{}` names `file` and `json` together: the login file and where in it the value is",
                    key.variable()
                ));
            }
        }
    }
    Ok(())
}

/// An upstream's parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    /// `https`.
    pub tls: bool,
    /// Its host, without brackets.
    pub host: String,
    /// Its port (443 or 80 unless given).
    pub port: u16,
    /// Its path, without a trailing `/` (`""` for none).
    pub path: String,
}

/// Reads an upstream URL; the error says what is wrong.
pub fn parse_upstream(upstream: &str) -> Result<Upstream, String> {
    let (tls, rest) = if let Some(rest) = upstream.strip_prefix("https://") {
        (true, rest)
    } else if let Some(rest) = upstream.strip_prefix("http://") {
        (false, rest)
    } else {
        return Err(format!(
            "`{upstream}` is not an upstream: write an http:// or https:// URL, as \"https://api.anthropic.com\""
        ));
    };
    let (authority, path) = match rest.find('/') {
        Some(at) => (&rest[..at], &rest[at..]),
        None => (rest, ""),
    };
    let bad = || format!("`{upstream}` names no host: write it as \"https://api.example.com\"");
    if authority.is_empty() || authority.contains('@') || path.contains(['?', '#']) {
        return Err(bad());
    }
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (host, after) = v6.split_once(']').ok_or_else(bad)?;
        (host, after.strip_prefix(':'))
    } else {
        match authority.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    let port = match port {
        Some(port) => port
            .parse::<u16>()
            .ok()
            .filter(|port| *port > 0)
            .ok_or_else(bad)?,
        None if tls => 443,
        None => 80,
    };
    if host.is_empty() {
        return Err(bad());
    }
    Ok(Upstream {
        tls,
        host: host.to_owned(),
        port,
        path: path.trim_end_matches('/').to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn credential(name: &str, upstream: &str) -> Credential {
        Credential {
            name: name.to_owned(),
            upstream: upstream.to_owned(),
            base_url_env: Some("API_BASE_URL".to_owned()),
            base_url_args: Vec::new(),
            keys: vec![CredentialKey::Variable("API_KEY".to_owned())],
        }
    }

    #[test]
    fn an_upstream_is_read_into_its_parts() {
        assert_eq!(
            parse_upstream("https://api.anthropic.com").unwrap(),
            Upstream {
                tls: true,
                host: "api.anthropic.com".into(),
                port: 443,
                path: String::new()
            }
        );
        assert_eq!(
            parse_upstream("http://127.0.0.1:8080/gateway/v1/").unwrap(),
            Upstream {
                tls: false,
                host: "127.0.0.1".into(),
                port: 8080,
                path: "/gateway/v1".into()
            }
        );
        assert_eq!(parse_upstream("https://[::1]:9/").unwrap().host, "::1");
        for bad in [
            "api.anthropic.com",
            "ftp://x",
            "https://",
            "https://u@x",
            "https://x:0",
            "https://x:99999",
            "https://x/?k=1",
        ] {
            assert!(parse_upstream(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_credential_names_its_endpoint_its_upstream_and_its_keys() {
        assert!(check_credential(&credential("anthropic", "https://api.anthropic.com")).is_ok());
        let bad_name = check_credential(&credential("Anthropic/x", "https://a")).unwrap_err();
        assert!(bad_name.contains("lowercase"), "{bad_name}");
        let no_keys = Credential {
            keys: Vec::new(),
            ..credential("a", "https://a")
        };
        assert!(
            check_credential(&no_keys)
                .unwrap_err()
                .contains("holds no key")
        );
        let unpointed = Credential {
            base_url_env: None,
            ..credential("a", "https://a")
        };
        assert!(
            check_credential(&unpointed)
                .unwrap_err()
                .contains("base_url_env")
        );
        let bad_json = Credential {
            keys: vec![CredentialKey::Table {
                env: "TOKEN".into(),
                from_env: None,
                file: Some("~/.login.json".into()),
                json: Some("a..b".into()),
            }],
            ..credential("a", "https://a")
        };
        assert!(check_credential(&bad_json).unwrap_err().contains("json"));
        let other_placeholder = Credential {
            base_url_args: vec!["--base={prompt}".into()],
            ..credential("a", "https://a")
        };
        assert!(
            check_credential(&other_placeholder)
                .unwrap_err()
                .contains("{prompt}")
        );
    }
}
