//! Where the state is laid on disk.

use super::*;

/// Each run's records are placed apart from the others' (the file system's "top of a
/// hierarchy" hint on `runs/`), so that a run's new files do not land among the inodes of runs
/// just removed; the flag is not inherited by a run's own directory.
#[test]
fn runs_directory_asks_the_file_system_to_place_runs_apart() {
    let env = TestEnv::new();
    let root = env.repo("project");
    if let Err(error) = places_apart(&root) {
        eprintln!("skipped: the file system under {root} has no file flags ({error})");
        return;
    }
    let (workspace, store) = store_at(&root);
    let run = new_run(&store, &workspace, &["a"]);
    assert!(
        places_apart(&store.runs_dir()).unwrap(),
        "{} is not marked as the top of a hierarchy",
        store.runs_dir()
    );
    assert!(!places_apart(&store.run_dir(&run.run_id)).unwrap());
}

#[test]
fn a_state_directory_planted_as_a_link_gets_nothing_made_in_its_target() {
    let env = TestEnv::new();
    let root = env.repo("project");
    let canary = env.dir("canary");
    std::fs::create_dir_all(root.join(".crew")).unwrap();
    std::os::unix::fs::symlink(&canary, root.join(".crew/state")).unwrap();
    let run = env.crew(&root, ["run", "--agent", "shell", "true"]);
    let shown = crew_tests::render_output(&run);
    assert!(!run.status.success(), "{shown}");
    assert!(shown.contains("it is a symlink"), "{shown}");
    assert_eq!(
        std::fs::read_dir(&canary).unwrap().count(),
        0,
        "nothing made through the link: {shown}"
    );
}
