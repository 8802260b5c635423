//! The transport program starts and says when it has no cluster to reach. This test also makes
//! cargo build the binary that crew starts for a kubernetes placement, which the black-box tests
//! in the top-level `tests` package find beside `crew`.

use std::process::Command;

/// The arguments crew gives the transport, with an image no cluster needs to pull.
const ARGS: [&str; 12] = [
    "--image",
    "registry.invalid/agents:1",
    "--dir",
    "/tmp/crew-shim",
    "--crew",
    "crew",
    "--project",
    "p",
    "--run",
    "r",
    "--task",
    "t",
];

#[test]
fn without_a_cluster_the_transport_says_so_and_fails() {
    let home = std::env::temp_dir().join(format!("crew-kube-smoke-{}", std::process::id()));
    std::fs::create_dir_all(&home).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_crew-kube-transport"))
        .args(ARGS)
        .env_clear()
        .env("HOME", &home)
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .output()
        .unwrap();
    std::fs::remove_dir_all(&home).unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains("kubernetes: no cluster to reach"),
        "{stderr}"
    );
}
