//! `crew init`

use crew_core::Workspace;

use crate::ui::Ui;
use crate::{CliError, Outcome};

/// The example set, as `crew init` writes it (the same files as `.crew.example/`).
pub const EXAMPLE_FILES: &[(&str, &str)] = &[
    (
        "config.toml",
        include_str!("../../../../.crew.example/config.toml"),
    ),
    (
        "agents/claude.toml",
        include_str!("../../../../.crew.example/agents/claude.toml"),
    ),
    (
        "agents/codex.toml",
        include_str!("../../../../.crew.example/agents/codex.toml"),
    ),
    (
        "agents/gemini.toml",
        include_str!("../../../../.crew.example/agents/gemini.toml"),
    ),
    (
        "agents/aider.toml",
        include_str!("../../../../.crew.example/agents/aider.toml"),
    ),
    (
        "agents/shell.toml",
        include_str!("../../../../.crew.example/agents/shell.toml"),
    ),
    (
        "teams/feature.toml",
        include_str!("../../../../.crew.example/teams/feature.toml"),
    ),
    (
        "teams/hello.toml",
        include_str!("../../../../.crew.example/teams/hello.toml"),
    ),
];

/// What a repository builds with, by the file at its root that says so, and the build output
/// a recycled worktree keeps for it (warm: the next task's first build starts from it).
const BUILD_OUTPUTS: &[(&str, &str, &str)] = &[
    ("Cargo.toml", "Cargo", "target"),
    ("pyproject.toml", "Python", ".venv"),
    ("requirements.txt", "Python", ".venv"),
    ("next.config.js", "Next.js", ".next"),
    ("next.config.mjs", "Next.js", ".next"),
];

/// `config.toml` with `keep_ignored` set to the build output of what the repository at `root`
/// builds with, said in a comment; as written otherwise.
fn warm_caches(config: &str, root: &camino::Utf8Path) -> String {
    let mut kept: Vec<&str> = Vec::new();
    let mut tools: Vec<&str> = Vec::new();
    for (file, tool, output) in BUILD_OUTPUTS {
        if root.join(file).is_file() && !kept.contains(output) {
            kept.push(output);
            tools.push(tool);
        }
    }
    if kept.is_empty() {
        return config.to_owned();
    }
    let line = format!(
        "# This repository builds with {} (crew init saw it): its build output stays warm in\n# recycled worktrees.\nkeep_ignored = [{}]",
        tools.join(" and "),
        kept.iter()
            .map(|path| format!("\"{path}\""))
            .collect::<Vec<_>>()
            .join(", ")
    );
    config.replacen("keep_ignored = []      # e.g. [\"target\"]", &line, 1)
}

/// Write `.crew/` with a commented example of each configuration file.
///
/// Existing files are never overwritten. The directory goes at the workspace root: the top of
/// the git repository, or the current directory outside git.
#[derive(Debug, clap::Args)]
pub struct InitArgs {}

pub fn cmd_init(_args: InitArgs, ui: Ui) -> Result<Outcome, CliError> {
    let cwd = crate::context::current_dir()?;
    let workspace = Workspace::discover(&cwd)?;
    let crew_dir = workspace.crew_dir();
    let mut written = Vec::new();
    let mut kept = Vec::new();
    for (relative, contents) in EXAMPLE_FILES {
        let path = crew_dir.join(relative);
        if std::fs::symlink_metadata(&path).is_ok() {
            kept.push(path);
            continue;
        }
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let contents = if *relative == "config.toml" {
            warm_caches(contents, workspace.root())
        } else {
            (*contents).to_owned()
        };
        std::fs::write(&path, contents)?;
        written.push(path);
    }
    // What crew writes is allowed for the user who ran it: its agents' state directories
    // (`[sandbox] write`) loosen the sandbox, as the user just chose.
    if let Some(list) = crew_core::config::AllowList::of_user() {
        for file in crew_core::config::ConfigDir::new(crew_dir.clone()).settings_files()? {
            if written.contains(&file.path) {
                list.allow_file(&file).map_err(CliError::internal)?;
            }
        }
    }
    if !ui.quiet {
        for path in &written {
            say!("wrote {path}");
        }
        for path in &kept {
            say!("kept  {path} (exists)");
        }
        say!("\nnext: `crew run hello` runs three shell agents in separate worktrees");
    }
    Ok(Outcome::Success)
}
