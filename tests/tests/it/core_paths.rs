//! Path safety against real symlinks: containment that resolves links, and the one removal
//! function, which never follows them.

use camino::Utf8Path;
use crew_core::paths::{RemoveError, Removed, remove_contained, resolve_real_contained_path};
use crew_tests::{TestEnv, tree_fingerprint, write};

#[test]
fn real_containment_sees_through_symlinks() {
    let env = TestEnv::new();
    let root = env.dir("root");
    let outside = env.dir("outside");
    std::os::unix::fs::symlink(&outside, root.join("escape")).unwrap();
    std::fs::create_dir(root.join("inside")).unwrap();
    std::os::unix::fs::symlink(root.join("inside"), root.join("alias")).unwrap();

    assert!(resolve_real_contained_path(&root, Utf8Path::new("escape/file")).is_err());
    assert!(resolve_real_contained_path(&root, Utf8Path::new("escape")).is_err());
    assert_eq!(
        resolve_real_contained_path(&root, Utf8Path::new("alias/new/file")).unwrap(),
        root.join("inside/new/file")
    );
    assert_eq!(
        resolve_real_contained_path(&root, Utf8Path::new("missing/x")).unwrap(),
        root.join("missing/x")
    );
    // A sibling whose name extends the root's is not inside it.
    let evil = env.dir("root-evil");
    assert!(resolve_real_contained_path(&root, &evil.join("x")).is_err());
}

#[test]
fn removal_never_follows_symlinks_and_stays_inside_its_roots() {
    let env = TestEnv::new();
    let root = env.dir("root");
    let canary = env.dir("canary");
    write(&canary.join("precious.txt"), "keep me\n");
    write(&env.home().join("notes.txt"), "home sweet home\n");
    let canary_before = tree_fingerprint(canary.as_std_path());
    let home_before = tree_fingerprint(env.home().as_std_path());

    let work = root.join("work");
    write(&work.join("a/file.txt"), "agent output\n");
    std::os::unix::fs::symlink(env.home(), work.join("home")).unwrap();
    std::os::unix::fs::symlink("../../..", work.join("a/up")).unwrap();
    std::os::unix::fs::symlink("/", work.join("abs")).unwrap();
    std::os::unix::fs::symlink(&canary, root.join("link-to-canary")).unwrap();

    // A link is removed as a link.
    assert_eq!(
        remove_contained(&root.join("link-to-canary"), &[&root]).unwrap(),
        Removed::Symlink
    );
    assert_eq!(
        remove_contained(&work, &[&root]).unwrap(),
        Removed::Directory
    );
    assert!(!work.exists());
    assert_eq!(remove_contained(&work, &[&root]).unwrap(), Removed::Absent);

    assert_eq!(canary_before, tree_fingerprint(canary.as_std_path()));
    assert_eq!(home_before, tree_fingerprint(env.home().as_std_path()));

    // Outside the roots, the root itself, a path through a link out of the root, `..`.
    std::os::unix::fs::symlink(&canary, root.join("via")).unwrap();
    for refused in [
        canary.join("precious.txt"),
        root.clone(),
        root.join("via/precious.txt"),
    ] {
        let error = remove_contained(&refused, &[&root]).unwrap_err();
        assert!(
            matches!(error, RemoveError::OutsideRoots { .. }),
            "{refused}: {error}"
        );
    }
    assert!(matches!(
        remove_contained(&root.join("../canary"), &[&root]),
        Err(RemoveError::NotNormalized { .. })
    ));
    assert_eq!(canary_before, tree_fingerprint(canary.as_std_path()));
}
