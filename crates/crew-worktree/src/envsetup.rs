//! Making a fresh worktree ready to build: linked dependency directories, copied ignored files,
//! and the project's setup command.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use camino::{Utf8Path, Utf8PathBuf};
use crew_core::config::{GIT_LOCATION_VARIABLES, LinkMode, WorktreeSettings};

use crate::error::PrepareWorktreeError;

/// Links each configured `link` path from the leader into the worktree when the leader has it
/// as a directory and the worktree does not have it at all. Returns the links made (worktree
/// paths), which are never counted as the agent's work. A missing source is not an error.
pub fn link_paths(
    settings: &WorktreeSettings,
    leader_root: &Utf8Path,
    worktree_root: &Utf8Path,
) -> Result<Vec<Utf8PathBuf>, PrepareWorktreeError> {
    let mut made = Vec::new();
    // Where the worktree really is (the path given may be a held directory's handle).
    let real_root = worktree_root.canonicalize_utf8().ok();
    for relative in &settings.link {
        let source = leader_root.join(relative);
        let target = worktree_root.join(relative);
        if !source.is_dir() || std::fs::symlink_metadata(&target).is_ok() {
            continue;
        }
        // The parent must be a real directory of the worktree, never a link leading out.
        let parent_ok = target.parent().is_some_and(|parent| {
            std::fs::create_dir_all(parent).is_ok()
                && parent.canonicalize_utf8().is_ok_and(|real| {
                    real_root
                        .as_ref()
                        .is_some_and(|root| real.starts_with(root))
                })
        });
        if !parent_ok {
            continue;
        }
        let linked = match settings.link_mode {
            LinkMode::Symlink => std::os::unix::fs::symlink(&source, &target),
            LinkMode::Copy => copy_keeping_links(&source, &target),
        };
        linked.map_err(|error| PrepareWorktreeError::Link {
            source_path: source.clone(),
            target: target.clone(),
            source: error,
        })?;
        made.push(target);
    }
    Ok(made)
}

/// Copies each configured `copy` path (typically ignored files such as `.env`) from the leader
/// into the worktree when the worktree does not have it. Symlinks are never followed: a linked
/// source, or a link inside a copied directory, is skipped and named in the returned warnings.
pub fn copy_paths(
    settings: &WorktreeSettings,
    leader_root: &Utf8Path,
    worktree_root: &Utf8Path,
) -> Result<Vec<String>, PrepareWorktreeError> {
    let mut warnings = Vec::new();
    for relative in &settings.copy {
        let source = leader_root.join(relative);
        let target = worktree_root.join(relative);
        let Ok(metadata) = std::fs::symlink_metadata(&source) else {
            continue;
        };
        if std::fs::symlink_metadata(&target).is_ok() {
            continue;
        }
        let copy_error = |error| PrepareWorktreeError::Copy {
            source_path: source.clone(),
            source: error,
        };
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(copy_error)?;
        }
        copy_tree(&source, &target, &metadata, &mut warnings).map_err(copy_error)?;
    }
    Ok(warnings)
}

fn copy_tree(
    source: &Utf8Path,
    target: &Utf8Path,
    metadata: &std::fs::Metadata,
    warnings: &mut Vec<String>,
) -> std::io::Result<()> {
    let kind = metadata.file_type();
    if kind.is_symlink() {
        warnings.push(format!("not copied: {source} is a symlink"));
    } else if kind.is_file() {
        std::fs::copy(source, target)?;
    } else if kind.is_dir() {
        std::fs::create_dir(target)?;
        for entry in source.read_dir_utf8()? {
            let entry = entry?;
            let child_metadata = std::fs::symlink_metadata(entry.path())?;
            copy_tree(
                entry.path(),
                &target.join(entry.file_name()),
                &child_metadata,
                warnings,
            )?;
        }
    } else {
        warnings.push(format!("not copied: {source} is not a regular file"));
    }
    Ok(())
}

/// Copies the directory `source` to `target` as it is: files, directories, and symlinks as
/// symlinks (a package manager's `.bin` links keep pointing where they did).
fn copy_keeping_links(source: &Utf8Path, target: &Utf8Path) -> std::io::Result<()> {
    std::fs::create_dir(target)?;
    for entry in source.read_dir_utf8()? {
        let entry = entry?;
        let to = target.join(entry.file_name());
        let kind = entry.file_type()?;
        if kind.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(entry.path())?, &to)?;
        } else if kind.is_dir() {
            copy_keeping_links(entry.path(), &to)?;
        } else if kind.is_file() {
            std::fs::copy(entry.path(), &to)?;
        }
    }
    Ok(())
}

/// How much of a failed setup command's output an error shows.
const OUTPUT_TAIL: usize = 4 * 1024;

/// Runs the configured setup command in `dir`, without a shell, in its own process group,
/// killed with its group when it exceeds the timeout.
pub fn run_setup(
    settings: &WorktreeSettings,
    dir: &Utf8Path,
    env: &[(String, String)],
) -> Result<(), PrepareWorktreeError> {
    let Some(argv) = &settings.setup else {
        return Ok(());
    };
    let Some((program, args)) = argv.split_first() else {
        return Ok(());
    };
    let rendered = argv.join(" ");
    let mut command = Command::new(program);
    command
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    for variable in GIT_LOCATION_VARIABLES {
        command.env_remove(variable);
    }
    command.envs(env.iter().map(|(name, value)| (name, value)));
    let mut child = command
        .spawn()
        .map_err(|source| PrepareWorktreeError::SetupSpawn {
            command: rendered.clone(),
            dir: dir.to_owned(),
            source,
        })?;
    let output = collect_output(&mut child);
    let timeout = settings.setup_timeout.0;
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if started.elapsed() < timeout => {
                std::thread::sleep(Duration::from_millis(20));
            }
            _ => break None,
        }
    };
    // Whatever the setup command left running in its group (a daemon, a watcher) goes with it,
    // and its pipes close so that the output can be collected.
    let kill_group = || {
        if let Some(pid) = rustix::process::Pid::from_raw(child.id() as i32) {
            // Fails only when the group is already gone: nothing left to kill.
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
    };
    kill_group();
    let Some(status) = status else {
        // Reaps the killed child; its status is not the answer (the timeout is).
        let _ = child.wait();
        return Err(PrepareWorktreeError::SetupTimeout {
            command: rendered,
            timeout,
            output: output.finish(),
        });
    };
    let output = output.finish();
    if status.success() {
        Ok(())
    } else {
        Err(PrepareWorktreeError::SetupFailed {
            command: rendered,
            status: status.to_string(),
            output,
        })
    }
}

/// Drains a child's stdout and stderr on threads, keeping the last bytes of both.
struct OutputTail {
    readers: Vec<std::thread::JoinHandle<Vec<u8>>>,
}

fn collect_output(child: &mut std::process::Child) -> OutputTail {
    let mut readers = Vec::new();
    let pipes: [Option<Box<dyn Read + Send>>; 2] = [
        child
            .stdout
            .take()
            .map(|pipe| Box::new(pipe) as Box<dyn Read + Send>),
        child
            .stderr
            .take()
            .map(|pipe| Box::new(pipe) as Box<dyn Read + Send>),
    ];
    for mut pipe in pipes.into_iter().flatten() {
        readers.push(std::thread::spawn(move || {
            let mut tail = Vec::new();
            let mut buffer = [0u8; 8192];
            while let Ok(read) = pipe.read(&mut buffer) {
                if read == 0 {
                    break;
                }
                tail.extend_from_slice(&buffer[..read]);
                if tail.len() > 2 * OUTPUT_TAIL {
                    tail.drain(..tail.len() - OUTPUT_TAIL);
                }
            }
            tail
        }));
    }
    OutputTail { readers }
}

impl OutputTail {
    fn finish(self) -> String {
        let mut all = Vec::new();
        for reader in self.readers {
            if let Ok(bytes) = reader.join() {
                all.extend_from_slice(&bytes);
            }
        }
        let start = all.len().saturating_sub(OUTPUT_TAIL);
        String::from_utf8_lossy(&all[start..]).trim_end().to_owned()
    }
}
