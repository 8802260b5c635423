//! Ids and `safe_segment`, over chosen and random inputs.

use crew_core::config::ConfigDir;
use crew_core::ids::{SAFE_SEGMENT_MAX_LEN, TASK_ID_MAX_LEN};
use crew_core::{TaskId, safe_segment};
use crew_tests::{TestEnv, write};
use proptest::prelude::*;

#[test]
fn hostile_task_ids_are_rejected_and_nothing_is_written() {
    let env = TestEnv::new();
    let root = env.repo("project");
    let before = crew_tests::tree_fingerprint(root.as_std_path());
    for bad in [
        "..",
        "a/b",
        "-x",
        "x.lock",
        "HEAD",
        "a\u{0}b",
        &"x".repeat(65),
    ] {
        let escaped = toml_string(bad);
        write(
            &root.join(".crew/teams/bad.toml"),
            &format!("[[tasks]]\nid = {escaped}\nagent = \"shell\"\nprompt = \"true\"\n"),
        );
        let error = ConfigDir::new(root.join(".crew"))
            .load_team("bad")
            .unwrap_err();
        let message = error.to_string();
        assert!(message.contains("key `tasks[0].id`"), "{message}");
        assert!(message.contains("invalid task id"), "{message}");
        assert!(
            !root.join(".crew/state").exists(),
            "nothing may be written for {bad:?}"
        );
    }
    std::fs::remove_dir_all(root.join(".crew")).unwrap();
    assert_eq!(before, crew_tests::tree_fingerprint(root.as_std_path()));
}

#[test]
fn task_ids_differing_only_in_case_collide() {
    let env = TestEnv::new();
    let root = env.dir("project");
    write(
        &root.join(".crew/teams/dup.toml"),
        "[[tasks]]\nid = \"Fix\"\nagent = \"shell\"\nprompt = \"true\"\n\n[[tasks]]\nid = \"fix\"\nagent = \"shell\"\nprompt = \"true\"\n",
    );
    let error = ConfigDir::new(root.join(".crew"))
        .load_team("dup")
        .unwrap_err();
    insta::assert_snapshot!(env.redact(&error.to_string()), @"$TEST_ENV/project/.crew/teams/dup.toml:7:6: key `tasks[1].id`: duplicate task id `fix`: task `Fix` already uses it (task ids must be unique ignoring case)");
}

fn toml_string(value: &str) -> String {
    let mut out = String::from("\"");
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The rules of ARCHITECTURE.md, "State" (its ids), written independently of the implementation.
fn task_id_is_valid(id: &str) -> bool {
    let chars: Vec<char> = id.chars().collect();
    !chars.is_empty()
        && chars.len() <= TASK_ID_MAX_LEN
        && chars[0].is_ascii_alphanumeric()
        && chars
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        && !id.ends_with('.')
        && !id.to_ascii_lowercase().ends_with(".lock")
        && !id.contains("..")
        && ![
            "head",
            "fetch_head",
            "orig_head",
            "merge_head",
            "cherry_pick_head",
            "revert_head",
            "bisect_head",
            "auto_merge",
        ]
        .contains(&id.to_ascii_lowercase().as_str())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn safe_segment_is_always_one_harmless_segment(input in any::<String>()) {
        let segment = safe_segment(&input);
        prop_assert!(!segment.is_empty());
        prop_assert!(segment.len() <= SAFE_SEGMENT_MAX_LEN);
        prop_assert!(segment.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')));
        prop_assert!(!segment.starts_with('.'));
        prop_assert!(!segment.contains(".."));
        prop_assert_ne!(segment.as_str(), ".");
        // Already-safe segments come back unchanged.
        prop_assert_eq!(safe_segment(&segment), segment);
    }

    #[test]
    fn safe_segment_keeps_plain_names(input in "[A-Za-z0-9_-][A-Za-z0-9._-]{0,60}") {
        prop_assume!(!input.contains(".."));
        prop_assert_eq!(safe_segment(&input), input);
    }

    #[test]
    fn task_id_validation_matches_the_rules(input in any::<String>()) {
        prop_assert_eq!(TaskId::parse(&input).is_ok(), task_id_is_valid(&input));
    }

    #[test]
    fn task_id_validation_matches_the_rules_near_the_edge(input in "[A-Za-z0-9._/ -]{0,70}(\\.lock)?") {
        prop_assert_eq!(TaskId::parse(&input).is_ok(), task_id_is_valid(&input));
    }
}
