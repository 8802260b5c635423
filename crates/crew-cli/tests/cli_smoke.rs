//! The `crew` binary starts and explains itself. This test also makes cargo build the binary
//! that the black-box tests in the top-level `tests` package run.

use std::process::Command;

#[test]
fn help_and_version_work() {
    let help = Command::new(env!("CARGO_BIN_EXE_crew"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(help.status.success());
    let text = String::from_utf8(help.stdout).unwrap();
    assert!(
        text.starts_with("crew runs a team of coding agents"),
        "{text}"
    );
    assert!(text.contains("Usage: crew"), "{text}");
    let version = Command::new(env!("CARGO_BIN_EXE_crew"))
        .arg("--version")
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8(version.stdout).unwrap(),
        format!("crew {}\n", env!("CARGO_PKG_VERSION"))
    );
}
