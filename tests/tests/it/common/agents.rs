//! Agent definitions the tests give their projects.

use camino::Utf8Path;
use crew_tests::{TestEnv, write};

/// Defines the agent `acp` in `repo`: the ACP stand-in (`fake-acp`, with the extra arguments
/// `args`, each a quoted TOML string after a comma), which keeps its sessions in `sessions/`
/// of the test's directory, the only place besides its workspace it may write.
pub fn define_fake_acp(env: &TestEnv, repo: &Utf8Path, args: &str) {
    let sessions = env.dir("sessions");
    let fake = crew_tests::helper_bin("fake-acp");
    write(
        &repo.join(".crew/agents/acp.toml"),
        &format!(
            "command = [\"{fake}\"{args}]\nprotocol = \"acp\"\nenv = {{ FAKE_ACP_STATE = \"{sessions}\" }}\n[sandbox]\nwrite = [\"{sessions}\"]\n"
        ),
    );
    // Its `write` loosens the sandbox: allowed, as its user would.
    env.allow_settings(repo);
}
