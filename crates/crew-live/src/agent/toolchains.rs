//! Toolchains inside the sandbox: the caches that cargo, npm, yarn, pip, uv and go write
//! while they build, kept per project where a confined agent (and its check) may write them.
//!
//! A confined agent may not write the user's own caches (`~/.cargo/registry`, `~/.npm`, …):
//! a download there would fail, and a write allowed there could poison what the user's own
//! builds take. Instead each project gets a cache directory of its own, beneath crew's state
//! (`$XDG_STATE_HOME/crew/caches/<project>-<hash>`, else `~/.local/state/crew/…`), granted to
//! its agents and pointed at by each tool's documented variable. Per project, not per agent:
//! a project's tasks build the same dependencies, so the second task starts warm; what one
//! project's agent leaves there reaches that project's later agents only, never the user's
//! own builds nor another project's.
//!
//! cargo keeps its settings beside its caches (`CARGO_HOME`): the project's cargo home links
//! the user's `config.toml` and `bin/` (read-only for the agent, remade at every start), and
//! holds its own `registry/` and `git/`; the user's credentials are not linked.

use std::os::unix::fs::DirBuilderExt as _;

use camino::{Utf8Path, Utf8PathBuf};
use sha2::{Digest, Sha256};

/// Each tool's variable and the directory beneath the project's cache it names.
const CACHE_VARIABLES: &[(&str, &str)] = &[
    ("npm_config_cache", "npm"),
    ("YARN_CACHE_FOLDER", "yarn"),
    // pnpm's content-addressed store and its metadata cache: pnpm 11 and later read
    // `pnpm_config_*`, pnpm 10 `npm_config_*` (npm itself then warns of an unknown setting,
    // which costs less than pnpm 10 making its store inside the workspace).
    ("pnpm_config_store_dir", "pnpm/store"),
    ("pnpm_config_cache_dir", "pnpm/cache"),
    ("npm_config_store_dir", "pnpm/store"),
    ("npm_config_cache_dir", "pnpm/cache"),
    ("PIP_CACHE_DIR", "pip"),
    ("UV_CACHE_DIR", "uv"),
    ("GOMODCACHE", "go/mod"),
    ("GOCACHE", "go/build"),
    // Every other program's cache that follows the XDG layout (a model client's, a library's):
    // the project's, never the user's own `~/.cache`, which the user's next build trusts.
    ("XDG_CACHE_HOME", "xdg"),
];

/// What of the user's cargo home the project's cargo home links: settings and installed
/// commands, not credentials.
const CARGO_LINKED: &[&str] = &["config.toml", "config", "bin"];

/// The toolchains' homes beneath the user's home that a confined agent reads (where they are
/// there): what installs and runs the tools a task builds with, none of them a store of
/// secrets (cargo's credentials stay covered within `.cargo`, see
/// `crew_sandbox::sandbox::secret_stores`). And the user's global git excludes, which git in
/// the agent's workspace reads.
const TOOLCHAIN_HOMES: &[&str] = &[
    ".cargo",
    ".rustup",
    ".local/bin",
    ".local/lib",
    ".nvm",
    ".volta",
    ".bun",
    ".deno",
    "go",
    ".pyenv",
    ".rbenv",
    ".asdf",
    ".local/share/mise",
    ".sdkman",
    ".config/git/ignore",
];

/// The toolchains' homes the user's environment names (`RUSTUP_HOME`, `NVM_DIR`, …: see
/// [`crew_core::env_vars::TOOLCHAIN_VARIABLES`]), where they are absolute and there: read by a
/// confined agent as the usual homes are. One that holds `home` (`RUSTUP_HOME=$HOME`, `/`) is
/// no toolchain's home and is left out: it would make the whole home readable.
pub fn named_homes(home: &Utf8Path, var: impl Fn(&str) -> Option<String>) -> Vec<Utf8PathBuf> {
    crew_core::env_vars::TOOLCHAIN_VARIABLES
        .iter()
        .filter_map(|name| var(name))
        .filter(|path| path.starts_with('/'))
        .map(|path| crew_core::paths::normalize_lexically(Utf8Path::new(&path)))
        .filter(|path| !home.starts_with(path) && path.is_dir())
        .collect()
}

/// How many entries of one `PATH` directory are looked at for links leading into the home.
const LINKS_LOOKED_AT: usize = 512;

/// What a confined agent reads for its tools to run, in the directories it sees only in part
/// (DESIGN §8a: the home and every directory not the system's; see
/// `crew_sandbox::sandbox::partial_directories`): each of `TOOLCHAIN_HOMES` beneath `home`
/// that is there; each entry of `path_var` (its `PATH`) and where the links in it lead (`~/
/// .local/bin/claude` → its version's directory); and the directory of each of `programs` (its
/// command's, found on `PATH` when named bare, and each path among its words that is a program,
/// as a shell command runs one). Only a program's: a definition's command needs no allowing,
/// and a file it names that is not a program (`cat ~/notes/secret.txt`) would otherwise make
/// its directory readable. A `bin` beside a `lib` counts as the prefix
/// that holds both (`~/.nvm/versions/node/v20/bin` → `…/v20`, a virtual environment's `bin` →
/// the environment), and `node_modules/.bin` as its `node_modules`: what its programs load is
/// there. Never the home itself, what holds it, or `~/.local` that way.
pub fn reads(home: &Utf8Path, path_var: Option<&str>, programs: &[&str]) -> Vec<Utf8PathBuf> {
    // Found again only when a directory it looked in changed (a tool installed, a link made
    // or moved): looking costs a host a millisecond a start, where comparing their times
    // costs a few calls.
    static LAST: std::sync::Mutex<Option<Looked>> = std::sync::Mutex::new(None);
    let key = (
        home.to_owned(),
        path_var.map(str::to_owned),
        programs.join("\0"),
    );
    let stamps = stamps(home, path_var);
    let mut last = LAST.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(looked) = last.as_ref()
        && looked.key == key
        && looked.stamps == stamps
    {
        return looked.reads.clone();
    }
    let reads = look_for_reads(home, path_var, programs);
    *last = Some(Looked {
        key,
        stamps,
        reads: reads.clone(),
    });
    reads
}

/// What [`reads`] found last, for what, and the times of the directories it looked in.
struct Looked {
    key: (Utf8PathBuf, Option<String>, String),
    stamps: Vec<Option<std::time::SystemTime>>,
    reads: Vec<Utf8PathBuf>,
}

/// When each directory [`reads`] looks in last changed: the home and the directories of its
/// toolchains, and each `PATH` entry.
fn stamps(home: &Utf8Path, path_var: Option<&str>) -> Vec<Option<std::time::SystemTime>> {
    let changed = |path: &Utf8Path| {
        std::fs::metadata(path)
            .and_then(|metadata| metadata.modified())
            .ok()
    };
    [
        home.to_owned(),
        home.join(".local"),
        home.join(".local/share"),
        home.join(".config"),
    ]
    .iter()
    .map(|dir| changed(dir))
    .chain(
        path_var
            .unwrap_or_default()
            .split(':')
            .filter(|entry| entry.starts_with('/'))
            .map(|entry| changed(Utf8Path::new(entry))),
    )
    .collect()
}

/// [`reads`], looked for.
fn look_for_reads(home: &Utf8Path, path_var: Option<&str>, programs: &[&str]) -> Vec<Utf8PathBuf> {
    let real_home = home.canonicalize_utf8().unwrap_or_else(|_| home.to_owned());
    let too_wide = [
        home.to_owned(),
        real_home.clone(),
        home.join(".local"),
        real_home.join(".local"),
        Utf8PathBuf::from("/"),
    ];
    // A `bin` of a prefix (with its `lib` beside it) counts as the prefix; a
    // `node_modules/.bin` as its `node_modules`; never one that holds the home.
    let holder = |dir: &Utf8Path| -> Utf8PathBuf {
        let prefix = match (dir.file_name(), dir.parent()) {
            (Some("bin"), Some(parent)) if parent.join("lib").is_dir() => Some(parent),
            (Some(".bin"), Some(parent)) if parent.file_name() == Some("node_modules") => {
                Some(parent)
            }
            _ => None,
        };
        match prefix {
            Some(parent)
                if !too_wide.iter().any(|wide| wide == parent)
                    && !home.starts_with(parent)
                    && !real_home.starts_with(parent) =>
            {
                parent.to_owned()
            }
            _ => dir.to_owned(),
        }
    };
    let mut reads: Vec<Utf8PathBuf> = TOOLCHAIN_HOMES
        .iter()
        .map(|name| home.join(name))
        .filter(|path| path.exists())
        .collect();
    let entries: Vec<Utf8PathBuf> = path_var
        .unwrap_or_default()
        .split(':')
        .filter(|entry| entry.starts_with('/'))
        .map(Utf8PathBuf::from)
        .collect();
    // The system's are there whole, and what their links lead to is the system's too.
    let in_part = |path: &Utf8Path| {
        !crew_sandbox::sandbox::in_system(path)
            || path.starts_with(home)
            || path.starts_with(&real_home)
    };
    for entry in entries
        .iter()
        .filter(|entry| in_part(entry) && entry.is_dir())
    {
        reads.push(holder(entry));
        let Ok(listing) = entry.read_dir_utf8() else {
            continue;
        };
        for link in listing.flatten().take(LINKS_LOOKED_AT) {
            if link.file_type().is_ok_and(|kind| kind.is_symlink())
                && let Ok(target) = link.path().canonicalize_utf8()
                && !target.starts_with(entry)
                && let Some(dir) = target.parent()
            {
                reads.push(holder(dir));
            }
        }
    }
    // Named bare, found on `PATH`; by path, where it is — a word of a shell command too
    // (`sh -c "/opt/tools/agent {prompt}"`), which must be a file that may be run.
    let program_file = |path: &Utf8Path| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(path)
            .is_ok_and(|metadata| metadata.is_file() && metadata.permissions().mode() & 0o111 != 0)
    };
    let words: Vec<&str> = programs
        .iter()
        .flat_map(|program| {
            program.split(|c: char| {
                c.is_whitespace() || matches!(c, '\'' | '"' | ';' | '&' | '|' | '(' | ')')
            })
        })
        .filter(|word| !word.is_empty())
        .collect();
    for (index, program) in words.iter().enumerate() {
        // A bare word is a program only first (the command's own); later ones are arguments.
        if !program.contains('/') && index > 0 {
            continue;
        }
        let found = match (program.strip_prefix("~/"), program.contains('/')) {
            (Some(beneath), _) => Some(home.join(beneath)),
            (None, true) => Some(Utf8PathBuf::from(*program)),
            (None, false) => entries
                .iter()
                .map(|entry| entry.join(program))
                .find(|path| path.is_file()),
        };
        if let Some(dir) = found
            // The command's own is kept whatever it is: what fails to run is said as such.
            .filter(|path| index == 0 || program_file(path))
            .and_then(|path| path.canonicalize_utf8().ok())
            .filter(|path| in_part(path))
            .and_then(|path| path.parent().map(holder))
        {
            reads.push(dir);
        }
    }
    reads.sort();
    reads.dedup();
    reads
}

/// A project's toolchain caches, made for one start of a confined agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolchainCaches {
    /// The directory the agent may write: every cache beneath it.
    pub dir: Utf8PathBuf,
    /// The variables that point the tools there.
    pub env: Vec<(String, String)>,
}

/// The cache directory of `project` for the user whose variables `env_var` gives (`HOME`,
/// `XDG_STATE_HOME`); `None` without a home. Nothing is made here.
pub fn cache_dir(
    project: &Utf8Path,
    env_var: impl Fn(&str) -> Option<String>,
) -> Option<Utf8PathBuf> {
    let state = crew_core::env_vars::user_state_dir(env_var)?;
    let digest = Sha256::digest(project.as_str().as_bytes());
    let hash: String = digest
        .iter()
        .take(8)
        .map(|byte| format!("{byte:02x}"))
        .collect();
    let name = crew_core::safe_segment(project.file_name().unwrap_or("project"));
    Some(state.join("caches").join(format!("{name}-{hash}")))
}

/// Makes (or repairs) the caches beneath `dir`: each tool's directory, and the cargo home with
/// its links to the user's cargo home (`user_cargo`: their `CARGO_HOME`, else `~/.cargo`)
/// remade. Only beneath a home that exists (`home`): crew makes no home for anyone. `None`
/// when `dir` cannot be made: the agent then runs with the tools' defaults.
pub fn prepare(dir: &Utf8Path, home: &Utf8Path, user_cargo: &Utf8Path) -> Option<ToolchainCaches> {
    if !home.is_dir() {
        return None;
    }
    let make = |path: &Utf8Path| {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(path)
    };
    // Each tool's directory is made once in a host's life: a tool makes its own again if an
    // agent removed it, and one an agent replaced by a link leads nowhere its sandbox does
    // not already allow. The project's directory is looked at every time (removed by hand,
    // everything is made again); the cargo home's links, the user's settings, every time.
    let made = made_dirs().lock().is_ok_and(|made| made.contains(dir)) && dir.is_dir();
    if !made {
        make(dir).ok()?;
    }
    let mut env = Vec::new();
    let mut all_made = true;
    for (variable, sub) in CACHE_VARIABLES {
        let path = dir.join(sub);
        if made || make(&path).is_ok() {
            env.push(((*variable).to_owned(), path.to_string()));
        } else {
            all_made = false;
        }
    }
    let cargo = dir.join("cargo");
    let cargo_made = made || make(&cargo).is_ok();
    if !made
        && all_made
        && cargo_made
        && let Ok(mut made) = made_dirs().lock()
    {
        made.insert(dir.to_owned());
    }
    if cargo_made {
        for name in CARGO_LINKED {
            let link = cargo.join(name);
            let target = user_cargo.join(name);
            // Already the link it should be (the last task's): kept, not made again.
            let linked = std::fs::read_link(&link).is_ok_and(|points_to| points_to == target);
            if linked && target.exists() {
                continue;
            }
            // What an agent put in place of a link is not kept: the user's settings are.
            match std::fs::symlink_metadata(&link) {
                Ok(meta) if meta.is_dir() => {
                    // Whatever is in the link's place is made again below; a failure leaves the
                    // cache unlinked, which only costs a rebuild.
                    let _ = std::fs::remove_dir_all(&link);
                }
                Ok(_) => {
                    // As above.
                    let _ = std::fs::remove_file(&link);
                }
                Err(_) => {}
            }
            if target.exists() {
                // A cache not linked only costs the agent a rebuild.
                let _ = std::os::unix::fs::symlink(&target, &link);
            }
        }
        env.push(("CARGO_HOME".to_owned(), cargo.to_string()));
    }
    Some(ToolchainCaches {
        dir: dir.to_owned(),
        env,
    })
}

/// The cache directories this process has made, each with every tool's directory in it.
fn made_dirs() -> &'static std::sync::Mutex<std::collections::HashSet<Utf8PathBuf>> {
    static MADE: std::sync::OnceLock<std::sync::Mutex<std::collections::HashSet<Utf8PathBuf>>> =
        std::sync::OnceLock::new();
    MADE.get_or_init(Default::default)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_project_has_its_own_cache_beneath_crew_s_state() {
        let vars = |name: &str| (name == "HOME").then(|| "/home/me".to_owned());
        let a = cache_dir(Utf8Path::new("/src/app"), vars).unwrap();
        let b = cache_dir(Utf8Path::new("/other/app"), vars).unwrap();
        assert!(
            a.as_str()
                .starts_with("/home/me/.local/state/crew/caches/app-"),
            "{a}"
        );
        assert_ne!(a, b, "two projects of one name share nothing");
        let xdg = |name: &str| match name {
            "XDG_STATE_HOME" => Some("/state".to_owned()),
            _ => None,
        };
        assert!(
            cache_dir(Utf8Path::new("/src/app"), xdg)
                .unwrap()
                .starts_with("/state/crew/caches/")
        );
        assert_eq!(cache_dir(Utf8Path::new("/src/app"), |_| None), None);
    }

    #[test]
    fn the_caches_are_made_once_and_the_user_s_settings_linked_at_every_start() {
        let root = tempfile::tempdir().unwrap();
        let root = Utf8Path::from_path(root.path()).unwrap();
        let (home, user_cargo) = (root.join("home"), root.join("cargo-home"));
        std::fs::create_dir_all(user_cargo.join("bin")).unwrap();
        std::fs::create_dir_all(&home).unwrap();
        std::fs::write(user_cargo.join("config.toml"), "[net]\n").unwrap();
        let dir = home.join(".local/state/crew/caches/app-1");
        let named = |caches: &ToolchainCaches, variable: &str| {
            caches
                .env
                .iter()
                .find(|(name, _)| name == variable)
                .map(|(_, path)| Utf8PathBuf::from(path))
        };

        let first = prepare(&dir, &home, &user_cargo).unwrap();
        for (variable, sub) in CACHE_VARIABLES {
            assert_eq!(named(&first, variable), Some(dir.join(sub)));
            assert!(dir.join(sub).is_dir(), "{sub} is made");
        }
        let config = dir.join("cargo/config.toml");
        assert_eq!(
            std::fs::read_link(&config).unwrap(),
            user_cargo.join("config.toml")
        );

        // An agent replaced the user's settings by its own: the next start links them again.
        std::fs::remove_file(&config).unwrap();
        std::fs::write(&config, "[build]\nrustc-wrapper = \"/tmp/evil\"\n").unwrap();
        let again = prepare(&dir, &home, &user_cargo).unwrap();
        assert_eq!(
            std::fs::read_link(&config).unwrap(),
            user_cargo.join("config.toml")
        );
        assert_eq!(again.env, first.env);

        // The whole directory removed by hand: made again, every tool's directory in it.
        std::fs::remove_dir_all(&dir).unwrap();
        let remade = prepare(&dir, &home, &user_cargo).unwrap();
        assert_eq!(remade.env, first.env);
        for (_, sub) in CACHE_VARIABLES {
            assert!(dir.join(sub).is_dir(), "{sub} is made again");
        }
        assert!(dir.join("cargo/bin").is_symlink());
    }

    #[test]
    fn a_toolchain_home_the_environment_names_is_read_unless_it_holds_the_home() {
        let root = tempfile::tempdir().unwrap();
        let root = Utf8Path::from_path(root.path()).unwrap().to_owned();
        let home = root.join("home/me");
        let rustup = root.join("opt/rustup");
        std::fs::create_dir_all(&home).unwrap();
        std::fs::create_dir_all(&rustup).unwrap();
        let named = |values: &[(&str, Utf8PathBuf)]| {
            let values = values.to_vec();
            named_homes(&home, move |name| {
                values
                    .iter()
                    .find(|(variable, _)| *variable == name)
                    .map(|(_, path)| path.to_string())
            })
        };
        assert_eq!(named(&[("RUSTUP_HOME", rustup.clone())]), [rustup]);
        // The home itself, a directory above it, or one that is not there: not a toolchain.
        for wide in [
            home.clone(),
            root.join("home"),
            root.join("home/me/../me"),
            root.join("nowhere"),
        ] {
            assert!(named(&[("NVM_DIR", wide.clone())]).is_empty(), "{wide}");
        }
    }
}
