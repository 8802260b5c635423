//! What an `acp` agent asks of the files in its workspace (`fs/read_text_file`,
//! `fs/write_text_file`). The host serves these, and no sandbox confines the host, so every
//! path is held beneath the workspace by the kernel: `openat2` with `RESOLVE_BENEATH` from the
//! workspace's directory. `..` is refused before that, and missing directories are made one
//! name at a time, each beneath the workspace.

use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};

use agent_client_protocol::v1::schema::{
    ReadTextFileRequest, ReadTextFileResponse, WriteTextFileRequest, WriteTextFileResponse,
};

/// The largest file an agent may read or write through crew.
const MAX_FILE_BYTES: u64 = 16 << 20;

/// Why a file request was refused, as the agent is told.
pub(super) fn refused(path: &Path, why: impl std::fmt::Display) -> agent_client_protocol::Error {
    agent_client_protocol::Error::invalid_params()
        .data(serde_json::json!(format!("{}: {why}", path.display())))
}

/// The path below the workspace that an absolute path in it names. `..` is refused here, and
/// links are held beneath the workspace by the kernel when the file is opened.
pub(super) fn beneath(
    workspace: &Path,
    path: &Path,
) -> Result<PathBuf, agent_client_protocol::Error> {
    if !path.is_absolute() {
        return Err(refused(path, "paths must be absolute"));
    }
    let relative = path
        .strip_prefix(workspace)
        .map_err(|_| refused(path, "outside the task's workspace"))?;
    if relative
        .components()
        .any(|component| !matches!(component, Component::Normal(_)))
    {
        return Err(refused(path, "`..` is not followed"));
    }
    if relative.as_os_str().is_empty() {
        return Err(refused(path, "the workspace itself is not a file"));
    }
    Ok(relative.to_owned())
}

/// Opens `relative` beneath the workspace: every step of the path, links included, must stay
/// beneath it (`RESOLVE_BENEATH`), or the kernel refuses.
fn open_beneath(
    workspace: &Path,
    relative: &Path,
    flags: rustix::fs::OFlags,
) -> Result<OwnedFd, agent_client_protocol::Error> {
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    let root = rustix::fs::open(
        workspace,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|error| refused(workspace, error))?;
    rustix::fs::openat2(
        &root,
        relative,
        flags | OFlags::CLOEXEC,
        // openat2 takes a mode only with O_CREAT.
        if flags.contains(OFlags::CREATE) {
            Mode::from_raw_mode(0o644)
        } else {
            Mode::empty()
        },
        ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS,
    )
    .map_err(|error| {
        let path = workspace.join(relative);
        match error {
            // A file that is not there is the protocol's "resource not found" (-32002): an
            // agent tells it from a refusal (Gemini CLI writes a new file only after a read
            // said so).
            rustix::io::Errno::NOENT => {
                agent_client_protocol::v1::schema::Error::resource_not_found(Some(
                    path.display().to_string(),
                ))
                .into()
            }
            rustix::io::Errno::XDEV => refused(&path, "it leads outside the task's workspace"),
            error => refused(&path, std::io::Error::from(error)),
        }
    })
}

/// `fs/read_text_file`, beneath the workspace: the file, or `limit` lines of it from `line`
/// (1-based).
pub(super) fn read_file(
    workspace: &Path,
    request: &ReadTextFileRequest,
) -> Result<ReadTextFileResponse, agent_client_protocol::Error> {
    use std::io::Read;
    let relative = beneath(workspace, &request.path)?;
    let file = std::fs::File::from(open_beneath(
        workspace,
        &relative,
        rustix::fs::OFlags::RDONLY,
    )?);
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|error| refused(&request.path, error))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(refused(&request.path, "larger than 16 MiB"));
    }
    let text = String::from_utf8(bytes).map_err(|_| refused(&request.path, "not UTF-8 text"))?;
    let skip = request.line.map_or(0, |line| line.saturating_sub(1)) as usize;
    let content = match request.limit {
        None if skip == 0 => text,
        limit => text
            .split_inclusive('\n')
            .skip(skip)
            .take(limit.map_or(usize::MAX, |limit| limit as usize))
            .collect(),
    };
    Ok(ReadTextFileResponse::new(content))
}

/// `fs/write_text_file`, beneath the workspace: missing directories are made, one step at a
/// time, each beneath it.
pub(super) fn write_file(
    workspace: &Path,
    request: &WriteTextFileRequest,
) -> Result<WriteTextFileResponse, agent_client_protocol::Error> {
    use rustix::fs::OFlags;
    use std::io::Write;
    let relative = beneath(workspace, &request.path)?;
    if request.content.len() as u64 > MAX_FILE_BYTES {
        return Err(refused(&request.path, "larger than 16 MiB"));
    }
    if let Some(parent) = relative
        .parent()
        .filter(|parent| !parent.as_os_str().is_empty())
    {
        let mut made = PathBuf::new();
        for component in parent.components() {
            let below = made.clone();
            made.push(component);
            if open_beneath(workspace, &made, OFlags::PATH | OFlags::DIRECTORY).is_ok() {
                continue;
            }
            let at = if below.as_os_str().is_empty() {
                open_beneath_root(workspace)?
            } else {
                open_beneath(workspace, &below, OFlags::PATH | OFlags::DIRECTORY)?
            };
            // One name, made in a directory already held beneath the workspace: `mkdirat`
            // never follows a link in the last step.
            match rustix::fs::mkdirat(
                &at,
                component.as_os_str(),
                rustix::fs::Mode::from_raw_mode(0o755),
            ) {
                Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                Err(error) => {
                    return Err(refused(&workspace.join(&made), std::io::Error::from(error)));
                }
            }
        }
    }
    let mut file = std::fs::File::from(open_beneath(
        workspace,
        &relative,
        OFlags::WRONLY | OFlags::CREATE | OFlags::TRUNC,
    )?);
    file.write_all(request.content.as_bytes())
        .map_err(|error| refused(&request.path, error))?;
    Ok(WriteTextFileResponse::new())
}

fn open_beneath_root(workspace: &Path) -> Result<OwnedFd, agent_client_protocol::Error> {
    use rustix::fs::{Mode, OFlags};
    rustix::fs::open(
        workspace,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|error| refused(workspace, std::io::Error::from(error)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_requests_stay_beneath_the_workspace() {
        let dir = tempfile::tempdir().unwrap();
        let workspace = dir.path().join("ws");
        std::fs::create_dir(&workspace).unwrap();
        std::fs::write(dir.path().join("secret"), "outside").unwrap();
        std::os::unix::fs::symlink(dir.path().join("secret"), workspace.join("link")).unwrap();
        std::os::unix::fs::symlink(dir.path(), workspace.join("up")).unwrap();
        let write = |path: PathBuf| {
            write_file(&workspace, &WriteTextFileRequest::new("s", path, "written"))
        };
        let read = |path: PathBuf| read_file(&workspace, &ReadTextFileRequest::new("s", path));
        write(workspace.join("a/b/c.txt")).unwrap();
        assert_eq!(
            read(workspace.join("a/b/c.txt")).unwrap().content,
            "written"
        );
        for escape in [
            workspace.join("link"),
            workspace.join("up/secret"),
            workspace.join("up/new/file"),
            workspace.join("../secret"),
            dir.path().join("secret"),
            PathBuf::from("relative.txt"),
        ] {
            assert!(write(escape.clone()).is_err(), "{}", escape.display());
            assert!(read(escape.clone()).is_err(), "{}", escape.display());
        }
        assert_eq!(
            std::fs::read_to_string(dir.path().join("secret")).unwrap(),
            "outside"
        );
        assert!(!dir.path().join("new").exists());
        // A missing file is "not found", as the protocol says, not a refusal.
        let missing = read(workspace.join("new.txt")).unwrap_err();
        assert_eq!(
            missing.code,
            agent_client_protocol::ErrorCode::RESOURCE_NOT_FOUND,
            "{missing:?}"
        );
        assert_eq!(missing.message, "Resource not found");
        std::fs::write(workspace.join("lines.txt"), "1\n2\n3\n4\n").unwrap();
        let some = read_file(
            &workspace,
            &ReadTextFileRequest::new("s", workspace.join("lines.txt"))
                .line(2)
                .limit(2),
        )
        .unwrap();
        assert_eq!(some.content, "2\n3\n");
    }
}
