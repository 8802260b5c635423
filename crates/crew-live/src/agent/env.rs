//! The environment an agent sees: an allow-list of the host's variables, the agent's own `env`,
//! and crew's `CREW_*` variables. Nothing else of the user's environment leaks, and git's
//! location variables (`GIT_DIR`, `GIT_WORK_TREE`, `GIT_INDEX_FILE`, …) never reach an agent.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;

use crew_core::config::{AgentDef, GIT_LOCATION_VARIABLES};
use crew_core::env_vars::ALWAYS_PASSED;

/// The variables agents may draw from: usually the host process's environment.
#[derive(Debug, Clone, Default)]
pub struct BaseEnv {
    vars: Vec<(OsString, OsString)>,
}

impl BaseEnv {
    /// The environment of this process.
    pub fn from_process() -> Self {
        BaseEnv {
            vars: std::env::vars_os().collect(),
        }
    }

    /// A given set of variables (an editor host may pass the environment of its project).
    pub fn from_vars(vars: impl IntoIterator<Item = (OsString, OsString)>) -> Self {
        BaseEnv {
            vars: vars.into_iter().collect(),
        }
    }

    /// The same variables with `dir` first on `PATH`: a host puts the directory of its own
    /// `crew` there, so that agents find `crew ask` and `crew submit` however crew was started.
    pub fn with_path_first(mut self, dir: &std::path::Path) -> Self {
        let mut paths = vec![dir.to_path_buf()];
        if let Some(path) = self.get("PATH") {
            paths.extend(std::env::split_paths(path).filter(|entry| entry != dir));
        }
        if let Ok(joined) = std::env::join_paths(paths) {
            self.vars.retain(|(name, _)| name != "PATH");
            self.vars.push(("PATH".into(), joined));
        }
        self
    }

    /// The value the agent will see for `name`, if it will see one.
    pub fn get(&self, name: &str) -> Option<&OsStr> {
        self.vars
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_os_str())
    }
}

/// `pattern` is an exact name or a prefix ending in `*`.
fn matches(pattern: &str, name: &[u8]) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix.as_bytes()),
        None => name == pattern.as_bytes(),
    }
}

fn is_git_location(name: &[u8]) -> bool {
    GIT_LOCATION_VARIABLES
        .iter()
        .any(|variable| variable.as_bytes() == name)
}

/// This process's values of the variables `patterns` name (a trailing `*` matches a prefix),
/// git's location variables aside as for an agent: what an agent that passes them would see
/// here, for a placement to give it there (in `start`, or a Kubernetes Secret).
pub fn passed_values(patterns: &[String]) -> std::collections::BTreeMap<String, String> {
    std::env::vars_os()
        .filter_map(|(name, value)| Some((name.into_string().ok()?, value.into_string().ok()?)))
        .filter(|(name, _)| {
            !is_git_location(name.as_bytes())
                && patterns
                    .iter()
                    .any(|pattern| matches(pattern, name.as_bytes()))
        })
        .collect()
}

/// git settings every agent's git runs with, through git's own `GIT_CONFIG_COUNT` variables,
/// which outrank every config file: no automatic maintenance or gc after a commit. Inside the
/// sandbox it could not take the common directory's locks anyway, and what it left detached
/// in the background would be killed as a leaked process when the agent ends. The user's own
/// git keeps its maintenance.
pub const AGENT_GIT_CONFIG: &[(&str, &str)] = &[("maintenance.auto", "false"), ("gc.auto", "0")];

/// The complete environment of an agent, in the order it is applied: `git_config` goes into
/// git's `GIT_CONFIG_*` variables after crew's own [`AGENT_GIT_CONFIG`].
pub fn agent_env(
    base: &BaseEnv,
    definition: &AgentDef,
    confined: Option<&[(String, String)]>,
    crew: &[(&str, String)],
    git_config: &[(String, String)],
) -> Vec<(OsString, OsString)> {
    let mut env: Vec<(OsString, OsString)> = Vec::new();
    // crew's own variables may name git's (`GIT_CEILING_DIRECTORIES`); the user's never do.
    let mut set = |name: OsString, value: OsString, from_crew: bool| {
        if !from_crew && is_git_location(name.as_bytes()) {
            return;
        }
        env.retain(|(existing, _)| existing != &name);
        env.push((name, value));
    };
    let patterns: Vec<&str> = ALWAYS_PASSED
        .iter()
        .copied()
        .chain(definition.pass_env.iter().map(String::as_str))
        .collect();
    for (name, value) in &base.vars {
        let allowed = patterns
            .iter()
            .any(|pattern| matches(pattern, name.as_bytes()));
        if allowed {
            set(name.clone(), value.clone(), false);
        }
    }
    // Confined: its toolchains' caches (the project's), then what its definition says; the
    // definition's own `env` may still name another cache.
    for (name, value) in confined.into_iter().flatten() {
        set(name.into(), value.into(), false);
    }
    for (name, value) in &definition.env {
        set(name.into(), value.into(), false);
    }
    if confined.is_some() {
        for (name, value) in &definition.sandbox.confined.env {
            set(name.into(), value.into(), false);
        }
    }
    for (name, value) in crew {
        set((*name).into(), value.into(), true);
    }
    let settings: Vec<(&str, &str)> = AGENT_GIT_CONFIG
        .iter()
        .copied()
        .chain(
            git_config
                .iter()
                .map(|(key, value)| (key.as_str(), value.as_str())),
        )
        .collect();
    set(
        "GIT_CONFIG_COUNT".into(),
        settings.len().to_string().into(),
        true,
    );
    for (index, (key, value)) in settings.iter().enumerate() {
        set(format!("GIT_CONFIG_KEY_{index}").into(), key.into(), true);
        set(
            format!("GIT_CONFIG_VALUE_{index}").into(),
            value.into(),
            true,
        );
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_allowed_variables_pass_and_git_locations_never() {
        let base = BaseEnv::from_vars(
            [
                ("PATH", "/bin"),
                ("LC_ALL", "C"),
                ("SECRET_TOKEN", "x"),
                ("ANTHROPIC_API_KEY", "k"),
                ("GIT_DIR", "/elsewhere/.git"),
                ("GIT_INDEX_FILE", "/tmp/index"),
            ]
            .map(|(key, value)| (OsString::from(key), OsString::from(value))),
        );
        let mut definition = AgentDef::builtin_shell();
        definition.pass_env = vec!["ANTHROPIC_API_KEY".into()];
        definition.env.insert("MODE".into(), "fast".into());
        let env = agent_env(
            &base,
            &definition,
            None,
            &[("CREW_TASK_ID", "api".into())],
            &[],
        );
        let names: Vec<_> = env.iter().map(|(name, _)| name.to_str().unwrap()).collect();
        assert_eq!(
            names,
            [
                "PATH",
                "LC_ALL",
                "ANTHROPIC_API_KEY",
                "MODE",
                "CREW_TASK_ID",
                // crew's own git settings (no automatic maintenance), not the user's.
                "GIT_CONFIG_COUNT",
                "GIT_CONFIG_KEY_0",
                "GIT_CONFIG_VALUE_0",
                "GIT_CONFIG_KEY_1",
                "GIT_CONFIG_VALUE_1",
            ]
        );
    }
}
