//! What one start of an agent is given of its definition's credentials (DESIGN §8a): behind
//! crew's proxy, a stand-in for each key the user has and the endpoint as its base URL, the
//! proxy holding the real values; without the proxy, the values themselves, said on the task.

use std::collections::BTreeMap;
use std::sync::Arc;

use camino::Utf8Path;
use crew_core::config::AgentDef;
use crew_core::config::credentials::{Credential, CredentialKey, endpoint_url, parse_upstream};
use crew_sandbox::proxy::{HeldCredential, HeldKey, PROXY_URL, ValueSource};

use crate::agent::env::BaseEnv;

/// What an agent of `definition` started from an environment `base` would hold by reference
/// behind crew's proxy, `NAME for upstream` (`crew sandbox check`).
pub fn by_reference(definition: &AgentDef, base: &BaseEnv) -> Vec<String> {
    give(definition, base, Reach::Proxy).by_reference
}

/// The values a placed task's credentials need where it runs, read here now: each key the
/// user has, under its variable, and the user's own base URL (their gateway). They cross the
/// placement's transport, never a disk, and the crew there holds them by reference in turn.
pub fn placed_values(definition: &AgentDef, base: &BaseEnv) -> BTreeMap<String, String> {
    let home = home_of(base);
    let mut values = BTreeMap::new();
    for credential in &definition.sandbox.credentials {
        for key in &credential.keys {
            if let Some(value) =
                source(key, &definition.env, base, home).and_then(|read| read().ok())
            {
                values.insert(key.variable().to_owned(), value);
            }
        }
        if let Some(variable) = &credential.base_url_env
            && let Some(url) = base
                .get(variable)
                .and_then(|value| value.to_str())
                .filter(|value| !value.is_empty())
        {
            values.insert(variable.clone(), url.to_owned());
        }
    }
    values
}

/// The home `base` names, where it is absolute: what `~/` of a login file means.
fn home_of(base: &BaseEnv) -> Option<&Utf8Path> {
    base.get("HOME")
        .and_then(|home| home.to_str())
        .filter(|home| home.starts_with('/'))
        .map(Utf8Path::new)
}

/// How the agent's network lets its credentials be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reach {
    /// Through crew's proxy: by reference.
    Proxy,
    /// No network: nothing a key would open is reachable; the agent gets stand-ins.
    Nothing,
    /// The machine's network (open, or unconfined): the agent holds the values.
    Direct,
}

/// What a start gives of its credentials.
#[derive(Debug, Default)]
pub(super) struct Given {
    /// For its proxy.
    pub(super) held: Vec<HeldCredential>,
    /// Set for the agent over everything else: stand-ins (or values), base URLs.
    pub(super) env: Vec<(String, String)>,
    /// Added to its command.
    pub(super) args: Vec<String>,
    /// The record's: each key held by reference, `NAME for upstream`.
    pub(super) by_reference: Vec<String>,
    /// The record's: each key the agent holds itself.
    pub(super) held_by_agent: Vec<String>,
}

/// The credentials of `definition` for one start that reaches the network as `reach`.
pub(super) fn give(definition: &AgentDef, base: &BaseEnv, reach: Reach) -> Given {
    let home = home_of(base);
    let mut given = Given::default();
    for credential in &definition.sandbox.credentials {
        give_one(credential, &definition.env, base, home, reach, &mut given);
    }
    given
}

fn give_one(
    credential: &Credential,
    definition_env: &std::collections::BTreeMap<String, String>,
    base: &BaseEnv,
    home: Option<&Utf8Path>,
    reach: Reach,
    given: &mut Given,
) {
    let present: Vec<(&CredentialKey, ValueSource)> = credential
        .keys
        .iter()
        .filter_map(|key| Some((key, source(key, definition_env, base, home)?)))
        .collect();
    // A program with none of its keys here is left as it is: its own login, or none.
    if present.is_empty() {
        return;
    }
    if reach == Reach::Direct {
        for (key, value) in present {
            if let Ok(value) = value() {
                given.env.push((key.variable().to_owned(), value));
                given.held_by_agent.push(key.variable().to_owned());
            }
        }
        return;
    }
    // The user's own base URL is the upstream (a gateway); the definition's otherwise.
    let users = credential
        .base_url_env
        .as_deref()
        .and_then(|variable| {
            definition_env
                .get(variable)
                .map(String::as_str)
                .or_else(|| base.get(variable).and_then(|value| value.to_str()))
        })
        .filter(|value| !value.is_empty());
    let upstream = users
        .and_then(|url| parse_upstream(url).ok())
        .or_else(|| parse_upstream(&credential.upstream).ok());
    let Some(upstream) = upstream else {
        return;
    };
    let url = endpoint_url(PROXY_URL, &credential.name);
    if let Some(variable) = &credential.base_url_env {
        given.env.push((variable.clone(), url.clone()));
    }
    given.args.extend(
        credential
            .base_url_args
            .iter()
            .map(|arg| crew_core::config::fill_template(arg, &[("url", url.as_str())])),
    );
    let shown = users.unwrap_or(&credential.upstream).to_owned();
    let mut keys = Vec::new();
    for (key, value) in present {
        let stand_in = format!(
            "crew-stand-in-{}-{}",
            credential.name,
            uuid::Uuid::new_v4().simple()
        );
        given
            .env
            .push((key.variable().to_owned(), stand_in.clone()));
        if reach == Reach::Proxy {
            given
                .by_reference
                .push(format!("{} for {shown}", key.variable()));
            keys.push(HeldKey {
                variable: key.variable().to_owned(),
                stand_in,
                value,
            });
        }
    }
    if reach == Reach::Proxy {
        given.held.push(HeldCredential {
            name: credential.name.clone(),
            upstream,
            keys,
        });
    }
}

/// Where `key`'s value is read on the host, if the user has one: the definition's `env` (a
/// placed task's, which carries the values its host sent), their environment, or the
/// program's own login file (read again at each request: a refreshed login is used).
fn source(
    key: &CredentialKey,
    definition_env: &std::collections::BTreeMap<String, String>,
    base: &BaseEnv,
    home: Option<&Utf8Path>,
) -> Option<ValueSource> {
    if let Some(value) = key.sources().find_map(|variable| {
        definition_env
            .get(variable)
            .map(String::as_str)
            .or_else(|| base.get(variable).and_then(|value| value.to_str()))
            .filter(|value| !value.is_empty())
    }) {
        let value = value.to_owned();
        return Some(Arc::new(move || Ok(value.clone())));
    }
    let (file, json) = key.file()?;
    let path = match file.strip_prefix("~/") {
        Some(rest) => home?.join(rest),
        None => file.into(),
    };
    let pointer: Vec<String> = json.split('.').map(str::to_owned).collect();
    let read = move || read_json(&path, &pointer);
    // Only a login that is there now is held.
    read().ok()?;
    Some(Arc::new(read))
}

/// The string at `pointer` in the JSON file at `path`.
fn read_json(path: &Utf8Path, pointer: &[String]) -> Result<String, String> {
    let text = std::fs::read_to_string(path).map_err(|error| format!("{path}: {error}"))?;
    let mut value: serde_json::Value =
        serde_json::from_str(&text).map_err(|error| format!("{path}: {error}"))?;
    for key in pointer {
        value = value
            .get_mut(key)
            .map(serde_json::Value::take)
            .ok_or_else(|| format!("{path} has no `{}`", pointer.join(".")))?;
    }
    match value {
        serde_json::Value::String(value) if !value.is_empty() => Ok(value),
        _ => Err(format!("{path}: `{}` is not a string", pointer.join("."))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn definition(keys: Vec<CredentialKey>) -> AgentDef {
        let mut definition = AgentDef::builtin_shell();
        definition.sandbox.credentials = vec![Credential {
            name: "model".to_owned(),
            upstream: "https://api.example.com".to_owned(),
            base_url_env: Some("MODEL_BASE_URL".to_owned()),
            base_url_args: vec!["--base={url}/v1".to_owned()],
            keys,
        }];
        definition
    }

    fn env(vars: &[(&str, &str)]) -> BaseEnv {
        BaseEnv::from_vars(
            vars.iter()
                .map(|(name, value)| ((*name).into(), (*value).into())),
        )
    }

    #[test]
    fn behind_the_proxy_the_agent_gets_stand_ins_and_the_endpoint_and_the_proxy_the_values() {
        let definition = definition(vec![
            CredentialKey::Variable("MODEL_KEY".into()),
            CredentialKey::Variable("MODEL_TOKEN".into()),
        ]);
        let base = env(&[
            ("MODEL_KEY", "sk-real"),
            ("MODEL_BASE_URL", "http://127.0.0.1:9/gw"),
        ]);
        let given = give(&definition, &base, Reach::Proxy);
        let value = |name: &str| {
            given
                .env
                .iter()
                .find(|(variable, _)| variable == name)
                .map(|(_, value)| value.clone())
        };
        assert_eq!(
            value("MODEL_BASE_URL").as_deref(),
            Some("http://127.0.0.1:3128/model")
        );
        assert_eq!(given.args, ["--base=http://127.0.0.1:3128/model/v1"]);
        let stand_in = value("MODEL_KEY").unwrap();
        assert!(stand_in.starts_with("crew-stand-in-model-"), "{stand_in}");
        // A key the user does not have is not given.
        assert_eq!(value("MODEL_TOKEN"), None);
        assert_eq!(given.held.len(), 1);
        assert_eq!(given.held[0].upstream.path, "/gw", "the user's gateway");
        assert_eq!(given.held[0].keys[0].stand_in, stand_in);
        assert_eq!((given.held[0].keys[0].value)().unwrap(), "sk-real");
        assert_eq!(given.by_reference, ["MODEL_KEY for http://127.0.0.1:9/gw"]);
        assert!(given.held_by_agent.is_empty());

        let direct = give(&definition, &base, Reach::Direct);
        assert_eq!(direct.env, [("MODEL_KEY".to_owned(), "sk-real".to_owned())]);
        assert_eq!(direct.held_by_agent, ["MODEL_KEY"]);
        let nothing = give(&definition, &base, Reach::Nothing);
        assert!(nothing.held.is_empty());
        assert!(!nothing.env.iter().any(|(_, value)| value == "sk-real"));
    }

    #[test]
    fn a_login_file_is_read_at_each_request_and_absent_it_gives_nothing() {
        let home = tempfile::tempdir().unwrap();
        let home_path = home.path().to_str().unwrap();
        let definition = definition(vec![CredentialKey::Table {
            env: "MODEL_TOKEN".into(),
            from_env: None,
            file: Some("~/.login.json".into()),
            json: Some("oauth.access".into()),
        }]);
        let base = env(&[("HOME", home_path)]);
        assert!(give(&definition, &base, Reach::Proxy).held.is_empty());
        let login = home.path().join(".login.json");
        std::fs::write(&login, r#"{"oauth":{"access":"first"}}"#).unwrap();
        let given = give(&definition, &base, Reach::Proxy);
        let value = &given.held[0].keys[0].value;
        assert_eq!(value().unwrap(), "first");
        std::fs::write(&login, r#"{"oauth":{"access":"refreshed"}}"#).unwrap();
        assert_eq!(value().unwrap(), "refreshed");
        std::fs::write(&login, r#"{"oauth":{}}"#).unwrap();
        assert!(value().unwrap_err().contains("oauth.access"));
    }
}
