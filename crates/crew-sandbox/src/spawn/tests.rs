//! Tests of `spawn/mod.rs`.

use super::*;
use crate::sandbox::{Hidden, Namespace, namespaces_work};

fn command_hiding(hidden: Hidden) -> WardedCommand {
    let namespace = Namespace {
        hidden: vec![hidden],
        ..Namespace::default()
    };
    let marker = "CREW_AGENT_ID=r:t";
    WardedCommand::new(
        "sh",
        ["-c", "true"],
        [("PATH", "/usr/bin:/bin"), ("CREW_AGENT_ID", "r:t")],
        marker,
        None,
        Some(&namespace),
        None,
    )
    .unwrap()
}

/// An agent whose namespace cannot be entered (here: a directory to cover that is a file)
/// is refused with the step that failed, not as a program that cannot be run (`sh` is
/// there: an error of a mount is not one of `PATH`).
#[tokio::test]
async fn a_start_its_sandbox_refused_names_the_step() {
    if !namespaces_work() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = camino::Utf8PathBuf::from_path_buf(dir.path().join("file")).unwrap();
    std::fs::write(&file, "").unwrap();
    let Err(error) = command_hiding(Hidden::Directory(file)).start(&mut None) else {
        panic!("the agent started");
    };
    let said = error.to_string();
    assert!(
        said.contains("while entering its namespaces") && said.contains("Not a directory"),
        "{said}"
    );
}

/// A place to cover that is gone by the time the agent starts (another host's socket
/// directory, removed as that host ended) leaves nothing to cover: the agent starts.
#[tokio::test]
async fn a_place_to_cover_that_went_away_does_not_keep_the_agent_from_starting() {
    if !namespaces_work() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for hidden in [
        Hidden::Directory(camino::Utf8PathBuf::from_path_buf(dir.path().join("gone")).unwrap()),
        Hidden::File(camino::Utf8PathBuf::from_path_buf(dir.path().join("gone.sock")).unwrap()),
    ] {
        let mut spawned = command_hiding(hidden.clone())
            .start(&mut None)
            .unwrap_or_else(|error| panic!("{hidden:?}: {error}"));
        let status = spawned.child.wait().await.unwrap();
        assert!(status.success(), "{hidden:?}: {status:?}");
    }
}
