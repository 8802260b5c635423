//! What a confined agent reads (DESIGN §8a): its workspace, the repository, the system's
//! programs and libraries, its tools and what its definition names; the rest of its user's
//! home and other projects are not there for it, however it asks — directly, through a link
//! in its workspace, through another process's `/proc/<pid>/root` or `/proc/<pid>/cwd`.

use camino::{Utf8Path, Utf8PathBuf};
use crew_tests::{TestEnv, render_output, write};

use crate::common::runs::{manifest, run_ids, task};

/// What the test plants in the home: a secret each place an agent should not find, a file it
/// is given by its definition, and two tools on `PATH` (one through a link into the home).
struct Planted {
    home: Utf8PathBuf,
    /// The project, beside another project, in the home (`~/code/project`).
    project: Utf8PathBuf,
    /// The `PATH` the agents run with: the tools first.
    path: String,
}

impl Planted {
    fn new(env: &TestEnv) -> Self {
        let home = env.home();
        for (file, text) in [
            ("notes/secret.txt", "SECRET-notes"),
            ("code/other/.env", "SECRET-other-project"),
            (".config/some-app/token", "SECRET-app-token"),
            ("secret-beside.txt", "SECRET-beside"),
            ("docs/readme.txt", "GIVEN-docs"),
            ("tools/bin/hello", "#!/bin/sh\necho HELLO-TOOL\n"),
            ("opt/linked/bin/linked", "#!/bin/sh\necho LINKED-TOOL\n"),
        ] {
            write(&home.join(file), &format!("{text}\n"));
        }
        for tool in ["tools/bin/hello", "opt/linked/bin/linked"] {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(home.join(tool), std::fs::Permissions::from_mode(0o755))
                .unwrap();
        }
        std::os::unix::fs::symlink(
            home.join("opt/linked/bin/linked"),
            home.join("tools/bin/linked"),
        )
        .unwrap();
        let project = home.join("code/project");
        std::fs::create_dir_all(&project).unwrap();
        env.git(&project, ["init", "-q", "-b", "main"]);
        write(&project.join("README.md"), "# the project\n");
        // Its command names a secret (a definition's command needs no allowing): a program's
        // directory is read, a file that is no program is not.
        write(
            &project.join(".crew/agents/prober.toml"),
            &format!(
                "command = [\"sh\", \"-c\", \": {home}/notes/secret.txt; {{prompt}}\"]\n[sandbox]\nread = [\"~/docs/\"]\n"
            ),
        );
        env.git(&project, ["add", "-A"]);
        env.git(&project, ["commit", "-q", "-m", "initial commit"]);
        let path = format!(
            "{}:{}",
            home.join("tools/bin"),
            std::env::var("PATH").unwrap_or_default()
        );
        Planted {
            home,
            project,
            path,
        }
    }

    /// The probe: every way to a secret, then what it is given.
    fn probe(&self) -> String {
        let home = &self.home;
        format!(
            "ln -sf {home}/code/other/.env linked-secret; \
             for f in {home}/notes/secret.txt {home}/code/other/.env {home}/.config/some-app/token \
               {home}/secret-beside.txt ./linked-secret; do cat \"$f\" 2>/dev/null; done; \
             for p in /proc/[0-9]*; do \
               cat $p/root{home}/notes/secret.txt $p/cwd/../other/.env 2>/dev/null; \
             done; \
             ls -a {home} | tr '\\n' ' '; echo; \
             rm -f linked-secret; \
             cat {home}/docs/readme.txt; hello; linked; echo PROBED"
        )
    }
}

/// The output of `task` of the newest run of `project`.
fn output_log(project: &Utf8Path, env: &TestEnv, task: &str) -> String {
    let run = run_ids(env, project).remove(0);
    std::fs::read_to_string(project.join(format!(".crew/state/runs/{run}/tasks/{task}/output.log")))
        .unwrap_or_default()
}

#[test]
fn a_confined_agent_reads_of_its_home_only_its_project_its_tools_and_what_it_is_given() {
    let env = TestEnv::new();
    let planted = Planted::new(&env);
    env.allow_settings(&planted.project);
    for mode in ["worktree", "single", "dedicated", "temp"] {
        let run = env
            .crew_command(&planted.project)
            .env("PATH", &planted.path)
            .args([
                "run",
                "--quiet",
                "--workspace-mode",
                mode,
                "--agent",
                "prober",
                &planted.probe(),
            ])
            .output()
            .unwrap();
        let shown = render_output(&run);
        assert!(run.status.success(), "{mode}: {shown}");
        let log = output_log(&planted.project, &env, "prober");
        assert!(
            log.contains("PROBED") && !log.contains("SECRET-"),
            "{mode}: {log}"
        );
        // What it is given is there: its definition's read, its tools on PATH and where a
        // link among them leads, and its project.
        for given in ["GIVEN-docs", "HELLO-TOOL", "LINKED-TOOL"] {
            assert!(log.contains(given), "{mode}: {given}: {log}");
        }
        // The home it sees holds what it was given, nothing else of the user's.
        let listing = log
            .lines()
            .find(|line| line.starts_with(". .."))
            .unwrap_or_default();
        for gone in ["notes", "secret-beside.txt", ".config"] {
            assert!(!listing.contains(gone), "{mode}: {gone}: {listing}");
        }
        let run = run_ids(&env, &planted.project).remove(0);
        let record = task(&manifest(&env, &planted.project, &run), "prober").clone();
        let partial = record["sandbox"]["partial"].to_string();
        assert!(partial.contains(planted.home.as_str()), "{record:#}");
    }
}

/// As an unprivileged user too (its namespaces then made without root's help), nothing of the
/// home beyond what it was given.
#[test]
fn as_an_unprivileged_user_a_confined_agent_reads_of_its_home_only_what_it_is_given() {
    use std::os::unix::process::CommandExt;
    if !crew_tests::can_drop_to_nobody() {
        return;
    }
    let env = TestEnv::reachable_by_others();
    let planted = Planted::new(&env);
    env.hand_to_nobody();
    let mut allow = env.crew_command_for_others(&planted.project);
    allow.args(["sandbox", "allow"]);
    allow.uid(crew_tests::NOBODY);
    allow.gid(crew_tests::NOBODY);
    let allowed = allow.output().unwrap();
    assert!(allowed.status.success(), "{}", render_output(&allowed));
    let mut command = env.crew_command_for_others(&planted.project);
    command.env(
        "PATH",
        format!("{}:{}", env.home().join("tools/bin"), "/usr/bin:/bin"),
    );
    command.args(["run", "--quiet", "--agent", "prober", &planted.probe()]);
    command.uid(crew_tests::NOBODY);
    command.gid(crew_tests::NOBODY);
    let run = command.output().unwrap();
    assert!(run.status.success(), "{}", render_output(&run));
    let log = output_log(&planted.project, &env, "prober");
    let run = run_ids(&env, &planted.project).remove(0);
    let record = task(&manifest(&env, &planted.project, &run), "prober").clone();
    assert!(
        log.contains("PROBED") && !log.contains("SECRET-"),
        "{log}\n{:#}",
        record["sandbox"]
    );
    for given in ["GIVEN-docs", "HELLO-TOOL", "LINKED-TOOL"] {
        assert!(log.contains(given), "{given}: {log}");
    }
}
