//! The rules single values must follow: names, relative paths, branch prefixes, sandbox
//! paths and environment variable names.

use camino::Utf8Path;

use crate::ids::TaskId;
use crate::paths::normalize_lexically;

use super::load::LoadConfigError;

/// Checks one `[sandbox] write` entry: absolute or `~/…`, no `..`.
pub(super) fn check_sandbox_path(entry: &str) -> Result<(), String> {
    let rest = if entry == "~" {
        ""
    } else if let Some(rest) = entry.strip_prefix("~/") {
        rest
    } else if let Some(rest) = entry.strip_prefix('/') {
        rest
    } else {
        return Err(format!(
            "`{entry}` must be an absolute path or start with `~/` (the agent's home directory)"
        ));
    };
    if rest.split('/').any(|segment| segment == "..") {
        return Err(format!("`{entry}` must not contain `..`"));
    }
    Ok(())
}

pub(super) fn check_name(kind: &'static str, name: &str) -> Result<(), LoadConfigError> {
    TaskId::parse(name)
        .map(drop)
        .map_err(|error| LoadConfigError::InvalidName {
            kind,
            name: name.to_owned(),
            rule: error.rule,
        })
}

/// A path from configuration must stay inside the repository: relative, no `..`, not empty.
pub(super) fn check_relative_path(path: &Utf8Path) -> Result<(), &'static str> {
    if path.as_str().is_empty() {
        return Err("must not be empty");
    }
    if path.is_absolute() {
        return Err("must be relative to the repository root");
    }
    if path
        .components()
        .any(|c| matches!(c, camino::Utf8Component::ParentDir))
    {
        return Err("must not contain `..`");
    }
    if normalize_lexically(path).as_str().is_empty() {
        return Err("must name a path below the repository root");
    }
    Ok(())
}

/// Branch prefixes become part of ref names: letters, digits, `.`, `_`, `-` and `/` between
/// segments, following git's ref rules.
pub(super) fn check_branch_prefix(prefix: &str) -> Result<(), &'static str> {
    if prefix.is_empty() {
        return Err("must not be empty");
    }
    if !prefix
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/'))
    {
        return Err("may only contain letters, digits, `.`, `_`, `-` and `/`");
    }
    for segment in prefix.split('/') {
        if segment.is_empty() {
            return Err("must not start or end with `/` or contain `//`");
        }
        if segment.starts_with('.') || segment.starts_with('-') {
            return Err("segments must not start with `.` or `-`");
        }
        if segment.ends_with(".lock") || segment.ends_with('.') {
            return Err("segments must not end with `.lock` or `.`");
        }
    }
    let first = prefix.split('/').next().unwrap_or_default();
    if first == "HEAD" || first == "refs" {
        return Err(
            "must not start with `HEAD` or `refs`: branches would read like git's own names",
        );
    }
    if prefix.contains("..") {
        return Err("must not contain `..`");
    }
    Ok(())
}

/// Variables that locate or redirect a git repository. They never reach an agent: an agent must
/// work on the repository of its own workspace.
pub const GIT_LOCATION_VARIABLES: &[&str] = &[
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_INDEX_FILE",
    "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_COMMON_DIR",
    "GIT_NAMESPACE",
    "GIT_CEILING_DIRECTORIES",
    "GIT_DISCOVERY_ACROSS_FILESYSTEM",
    "GIT_PREFIX",
];

/// git's variables that say who commits and when, not where: an agent may have them (through
/// `pass_env` or `env`), so that its own `git commit` works where the identity lives only in
/// the environment. Globs may name them too (`GIT_AUTHOR_*`).
pub const GIT_IDENTITY_VARIABLES: &[&str] = &[
    "GIT_AUTHOR_NAME",
    "GIT_AUTHOR_EMAIL",
    "GIT_AUTHOR_DATE",
    "GIT_COMMITTER_NAME",
    "GIT_COMMITTER_EMAIL",
    "GIT_COMMITTER_DATE",
];

/// Whether `name` (or the glob `prefix*`) names only git identity variables.
pub(super) fn is_git_identity(name: &str) -> bool {
    match name.strip_suffix('*') {
        Some(prefix) => prefix == "GIT_AUTHOR_" || prefix == "GIT_COMMITTER_",
        None => GIT_IDENTITY_VARIABLES.contains(&name),
    }
}

pub(super) fn check_env_name(name: &str, allow_prefix_glob: bool) -> Result<(), String> {
    let base = if allow_prefix_glob {
        name.strip_suffix('*').unwrap_or(name)
    } else {
        name
    };
    let valid = !base.is_empty()
        && !base.starts_with(|c: char| c.is_ascii_digit())
        && base.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid {
        return Err(format!(
            "`{name}` is not a valid environment variable name (letters, digits and `_`, not starting with a digit)"
        ));
    }
    let names_git = base.starts_with("GIT_")
        || (allow_prefix_glob && name.ends_with('*') && "GIT_".starts_with(base));
    if names_git && !is_git_identity(name) {
        return Err(format!(
            "`{name}`: git's own variables never reach an agent, so each agent works on the repository of its workspace (only its identity may: GIT_AUTHOR_NAME, GIT_AUTHOR_EMAIL, GIT_COMMITTER_NAME, … or GIT_AUTHOR_*, GIT_COMMITTER_*)"
        ));
    }
    if base.starts_with("CREW_") {
        return Err(format!(
            "`{name}`: CREW_ variables are set by crew for each agent"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{AgentSandbox, SandboxMode};

    #[test]
    fn sandbox_paths_are_absolute_or_home() {
        for good in ["/var/cache/x", "~", "~/.claude", "~/a/b"] {
            assert!(check_sandbox_path(good).is_ok(), "{good:?}");
        }
        for bad in ["", "rel", "~user/x", "~/../etc", "/a/../b", "./x"] {
            assert!(check_sandbox_path(bad).is_err(), "{bad:?}");
        }
        let sandbox = AgentSandbox {
            mode: SandboxMode::Enforce,
            network: Default::default(),
            allow_hosts: None,
            read: Vec::new(),
            write: vec!["~/.claude".into(), "/opt/cache".into(), "~".into()],
            confined: Default::default(),
            credentials: Vec::new(),
        };
        assert_eq!(
            sandbox.write_paths(Some(Utf8Path::new("/home/u"))),
            ["/home/u/.claude", "/opt/cache", "/home/u"]
        );
        assert_eq!(sandbox.write_paths(None), ["/opt/cache"]);
    }

    #[test]
    fn branch_prefix_rules() {
        assert!(check_branch_prefix("crew").is_ok());
        assert!(check_branch_prefix("team/crew").is_ok());
        for bad in [
            "",
            "/x",
            "x/",
            "a//b",
            "a..b",
            ".x",
            "x.lock",
            "a b",
            "-x",
            "HEAD",
            "refs/tags/x",
        ] {
            assert!(check_branch_prefix(bad).is_err(), "{bad:?}");
        }
    }
}
