//! A fresh repository for an example, with its `.crew/` files committed.

use std::path::Path;
use std::process::Command;

/// Makes `repo` a git repository whose one commit holds `files` (path, contents).
pub fn new_repository(
    repo: &Path,
    files: &[(&str, &str)],
) -> Result<(), Box<dyn std::error::Error>> {
    for (path, contents) in files {
        let path = repo.join(path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(path, contents)?;
    }
    for args in [
        &["init", "-q", "-b", "main"][..],
        &["add", "-A"],
        &[
            "-c",
            "user.name=example",
            "-c",
            "user.email=example@example.invalid",
            "commit",
            "-q",
            "-m",
            "start",
        ],
    ] {
        let status = Command::new("git").args(args).current_dir(repo).status()?;
        if !status.success() {
            return Err(format!("git {} failed", args.join(" ")).into());
        }
    }
    Ok(())
}
