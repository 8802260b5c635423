//! Work going both ways between the shim's clone and the host: what an earlier start of a
//! task left there, the work sent back as a pack and its claim, the history received in
//! chunks, and the clone's copy released once the host holds it.

use std::sync::Arc;

use base64::Engine as _;
use camino::{Utf8Path, Utf8PathBuf};
use crew_core::shim::{CloneStore, FromShim, PACK_CHUNK, WorkClaim};
use crew_core::{RunId, TaskId};

use super::session::{Out, Session, Tasks, refuse, unknown};
use crate::project::host::Host;

/// The work an earlier start of `task` of the host's run `run` left in the clone (the host
/// lost its connection before it came back): the branch of the newest such run of this
/// shim and its tip. A worktree a dead shim left with the agent's files in it is torn down
/// first, its work committed to its branch as any teardown does.
pub(super) async fn earlier_work(
    session: &Session,
    host: &Host,
    run: &RunId,
    task: &TaskId,
) -> Result<Option<(String, String)>, String> {
    let Some(project) = &session.project else {
        return Ok(None);
    };
    let store = host.runner().store().clone();
    let provider = project.provider().clone();
    let workspace = project.workspace().id().clone();
    let clone = session.clone.clone();
    let clones = session.options.clones.clone();
    let (team, task) = (format!("shim-{run}"), task.clone());
    tokio::task::spawn_blocking(move || {
        crate::control::live_hosts::reconcile_workspace(&store)
            .map_err(|error| error.to_string())?;
        let listings = store.list_runs().map_err(|error| error.to_string())?;
        for listing in listings {
            let Ok(manifest) = listing.manifest else {
                continue;
            };
            if manifest.team.as_deref() != Some(team.as_str()) || !manifest.status.is_finished() {
                continue;
            }
            let Some(record) = manifest.task(&task) else {
                continue;
            };
            let branch = match (&record.teardown, &record.workspace) {
                (Some(teardown), _) => teardown.branch.clone(),
                (None, Some(recorded)) if recorded.dir.exists() => {
                    let request = crew_core::provider::TeardownRequest {
                        workspace: workspace.clone(),
                        repo_root: Some(clone.clone()),
                        run_id: manifest.run_id.clone(),
                        task_id: task.clone(),
                        agent_alive: false,
                        keep: false,
                        placed_for: manifest.placed_for.clone(),
                    };
                    let saved = provider
                        .teardown(&recorded.to_task_workspace(), &request)
                        .map_err(|error| {
                            format!(
                                "the earlier work of {task} in {} could not be saved: {}",
                                recorded.dir, error.message
                            )
                        })?;
                    saved.branch
                }
                (None, recorded) => recorded
                    .as_ref()
                    .and_then(|recorded| recorded.branch.clone()),
            };
            let Some(branch) = branch else {
                continue;
            };
            if let Some(tip) = clones.branch_tip(&clone, &branch) {
                return Ok(Some((branch, tip)));
            }
        }
        Ok(None)
    })
    .await
    .map_err(|error| error.to_string())?
}

/// Sends the work on `kept` (branch and tip) as a pack and its claim; `None`: no work.
pub(super) async fn send_work(
    clones: &Arc<dyn CloneStore>,
    clone: &Utf8Path,
    out: &Out,
    task: &TaskId,
    base: &str,
    kept: Option<&(String, String)>,
) -> Result<(), String> {
    let Some((branch, _)) = kept else {
        // The writer ends only with the connection, and then there is no one to tell (here and
        // below).
        let _ = out.send(FromShim::Work {
            task: task.clone(),
            claim: None,
            kept_at: None,
        });
        return Ok(());
    };
    let (clones, clone, base, branch) = (
        clones.clone(),
        clone.to_owned(),
        base.to_owned(),
        branch.clone(),
    );
    let packed = tokio::task::spawn_blocking(move || -> Result<(Vec<u8>, WorkClaim), String> {
        let mut bytes = Vec::new();
        let claim = clones
            .pack_work(&clone, &base, &branch, &mut bytes)
            .map_err(|error| crate::agent::error::with_causes(&*error))?;
        Ok((bytes, claim))
    })
    .await
    .map_err(|error| error.to_string())??;
    let (bytes, claim) = packed;
    for chunk in bytes.chunks(PACK_CHUNK) {
        // The writer ends only with the connection: no one to tell.
        let _ = out.send(FromShim::Pack {
            data: base64::engine::general_purpose::STANDARD.encode(chunk),
        });
    }
    // The writer ends only with the connection: no one to tell.
    let _ = out.send(FromShim::Work {
        task: task.clone(),
        claim: Some(claim),
        kept_at: kept.map(|(branch, _)| branch.clone()),
    });
    Ok(())
}

/// The host holds the work now: the clone's copy of the branch goes, if it is still where it
/// was sent from.
pub(super) fn release(session: &Session, out: &Out, tasks: &Tasks, task: TaskId) {
    let held = {
        let mut held = tasks
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        match held.get(&task) {
            None => None,
            Some(running) if running.canceller.is_some() => {
                refuse(
                    out,
                    Some(task.clone()),
                    "release",
                    format!("task {task} still runs; stop it first"),
                );
                return;
            }
            Some(_) => held.remove(&task),
        }
    };
    let Some(held) = held else {
        unknown(out, &task);
        return;
    };
    for (branch, tip) in held.kept.iter().chain(held.prior.iter()) {
        if let Err(why) = session
            .options
            .clones
            .drop_branch(&session.clone, branch, tip)
        {
            refuse(
                out,
                Some(task.clone()),
                "release",
                format!(
                    "{branch} was kept in {}: {}",
                    session.clone,
                    crate::agent::error::with_causes(&*why)
                ),
            );
            return;
        }
    }
    // The writer ends only with the connection: no one to tell.
    let _ = out.send(FromShim::Released { task });
}

/// Pack chunks received so far, written to a file in the clone's git directory as they
/// arrive (a history may be large: it is never held whole).
#[derive(Default)]
pub(super) struct PackBuffer {
    file: Option<(Utf8PathBuf, std::fs::File)>,
}

impl PackBuffer {
    pub(super) fn push(&mut self, clone: &Utf8Path, data: &str) -> Result<(), String> {
        use std::io::Write as _;
        let chunk = base64::engine::general_purpose::STANDARD
            .decode(data)
            .map_err(|error| format!("a pack chunk is not base64: {error}"))?;
        if self.file.is_none() {
            // Of this process: another shim of the project may receive a pack at once.
            let path = clone
                .join(".git")
                .join(format!("crew-incoming-{}.pack", std::process::id()));
            let file = std::fs::File::create(&path)
                .map_err(|error| format!("failed to write {path}: {error}"))?;
            self.file = Some((path, file));
        }
        let (path, file) = self.file.as_mut().expect("opened above");
        file.write_all(&chunk)
            .map_err(|error| format!("failed to write {path}: {error}"))
    }

    /// The file of the chunks so far; the next chunk starts a new one.
    pub(super) fn take(&mut self) -> Result<Utf8PathBuf, String> {
        let (path, file) = self
            .file
            .take()
            .ok_or_else(|| "no pack chunk came before `base`".to_owned())?;
        file.sync_all()
            .map_err(|error| format!("failed to write {path}: {error}"))?;
        Ok(path)
    }
}
