//! What the kernel keeps from a confined agent: modes and times, crew's locks, capabilities, namespaces, IPC, shared memory, a controlling terminal.

use super::*;

/// Landlock refuses an agent every write outside its places, but not a file's metadata: a
/// confined agent could `chmod` any file its user owns (as root, any of the system's: a
/// root-owned program made setuid) and `touch` it. In its namespace every mount is read-only
/// but its places: a private key it tries to make world-readable, the repository's packs it
/// tries to make unreadable, a program it tries to make setuid and a file it backdates stay as
/// they were, in a worktree and in single mode, while what it does in its own places works.
#[test]
fn a_confined_agent_changes_no_mode_or_time_of_what_it_may_not_write() {
    use std::os::unix::fs::PermissionsExt;
    let env = TestEnv::new();
    let repo = env.repo("project");
    env.git(&repo, ["gc", "-q"]);
    let key = env.home().join(".ssh/id_ed25519");
    write(&key, "private\n");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let program = env.root().join("bin/tool");
    write(&program, "#!/bin/sh\n");
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    let packs = repo.join(".git/objects/pack");
    let pack = std::fs::read_dir(&packs)
        .unwrap()
        .flatten()
        .map(|entry| entry.path())
        .find(|path| {
            path.extension()
                .is_some_and(|extension| extension == "pack")
        })
        .unwrap();
    // Modes, and the times of the files only the agent could touch (git freshens a pack's
    // time itself when it writes an object the pack holds).
    let state = |path: &std::path::Path| {
        let metadata = std::fs::metadata(path).unwrap();
        let time = (!path.starts_with(&repo)).then(|| metadata.modified().unwrap());
        (metadata.permissions().mode(), time)
    };
    let watched = [
        key.as_std_path(),
        program.as_std_path(),
        packs.as_std_path(),
        &pack,
    ];
    let before: Vec<_> = watched.iter().map(|path| state(path)).collect();
    let attempt = format!(
        "chmod 644 {key} && echo ESCAPED key; chmod 4755 {program} && echo ESCAPED setuid; \
         chmod 000 {packs} {pack} && echo ESCAPED packs; touch -d 2001-01-01 {key} && echo ESCAPED time; \
         echo mine > mine.sh && chmod +x mine.sh && touch -d 2001-01-01 mine.sh && echo OWN OK",
        pack = pack.display()
    );
    for mode in ["worktree", "single"] {
        let output = env.crew(
            &repo,
            [
                "run",
                "--quiet",
                "--workspace-mode",
                mode,
                "--agent",
                "shell",
                &attempt,
            ],
        );
        assert!(
            output.status.success(),
            "{mode}: {}",
            render_output(&output)
        );
        let run = run_ids(&env, &repo)[0].clone();
        let log = output_log(&repo, &run, "shell");
        // In single mode the git directory is the agent's private view: its chmod there
        // changes its view, and the repository's own packs are compared below.
        let escaped = log.lines().any(|line| {
            line.starts_with("ESCAPED") && !(mode == "single" && line == "ESCAPED packs")
        });
        assert!(!escaped, "{mode}: {log}");
        assert!(log.contains("OWN OK"), "{mode}: {log}");
        let after: Vec<_> = watched.iter().map(|path| state(path)).collect();
        assert_eq!(after, before, "{mode}: {log}");
        std::fs::remove_file(repo.join("mine.sh")).ok();
    }
    env.git(&repo, ["fsck", "--no-progress"]);
}

/// The same as an ordinary user, whose own files are the ones its agent could `chmod`: crew
/// run by `nobody`, whose private key its agent tries to make world-readable.
#[test]
fn as_an_unprivileged_user_a_confined_agent_changes_no_mode_of_its_user_s_files() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    if !crew_tests::can_drop_to_nobody() {
        return;
    }
    let env = TestEnv::reachable_by_others();
    let repo = env.repo("project");
    let key = env.home().join(".ssh/id_ed25519");
    write(&key, "private\n");
    env.hand_to_nobody();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut command = env.crew_command_for_others(&repo);
    command.args([
        "run",
        "--quiet",
        "--agent",
        "shell",
        &format!("chmod 644 {key} && echo ESCAPED key; echo mine > mine.sh && chmod +x mine.sh && echo OWN OK"),
    ]);
    command.uid(crew_tests::NOBODY);
    command.gid(crew_tests::NOBODY);
    let run = command.output().unwrap();
    assert!(run.status.success(), "{}", render_output(&run));
    let log = output_log(&repo, &run_ids(&env, &repo)[0], "shell");
    assert!(!log.contains("ESCAPED") && log.contains("OWN OK"), "{log}");
    let mode = std::fs::metadata(&key).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{log}");
}

/// A lock needs no right to write: an agent that opened crew's state lock or its repository
/// lock (both readable to it) and held it would stall its host's every record and every other
/// task's workspace for as long as it liked. In its namespace both files are covered: what it
/// locks is not theirs, and while it holds it, the real locks are free.
#[test]
fn an_agent_cannot_hold_crew_s_locks() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let warmup = env.crew(
        &repo,
        [
            "run",
            "--workspace-mode",
            "worktree",
            "--agent",
            "shell",
            "true",
        ],
    );
    assert!(warmup.status.success(), "{}", render_output(&warmup));
    let locks = [
        repo.join(".crew/state/lock"),
        repo.join(".git/crew-worktrees.lock"),
    ];
    let fake = crew_tests::helper_bin("fake-agent");
    for lock in &locks {
        let mut run = env
            .crew_command(&repo)
            .args([
                "run",
                "--quiet",
                "--workspace-mode",
                "worktree",
                "--agent",
                "shell",
                &format!("{fake} hold-lock {lock} 30"),
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        crate::common::runs::wait_for_agents_saying(&env, &repo, "held", 1);
        // While the agent holds what it took for the lock, the lock itself is free.
        let file = std::fs::File::open(lock).unwrap();
        let free = file.try_lock();
        let _ = run.kill();
        let _ = run.wait();
        assert!(free.is_ok(), "{lock} is held by the agent: {free:?}");
    }
}

/// What covers crew's lock files in an agent's namespace is the agent's own: a lock one agent
/// holds on it keeps no other agent from taking its own (with `/dev/null` over them, one inode
/// for the whole machine, the first agent's lock refused every other's, and a lock of a
/// hostile agent would hold every other agent's `crew` command up).
#[test]
fn an_agent_s_lock_on_its_cover_of_crew_s_lock_holds_up_no_other_agent() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let lock = repo.join(".crew/state/lock");
    let fake = crew_tests::helper_bin("fake-agent");
    let warmup = env.crew(&repo, ["run", "--agent", "shell", "true"]);
    assert!(warmup.status.success(), "{}", render_output(&warmup));
    let mut runs = Vec::new();
    for _ in 0..2 {
        runs.push(
            env.crew_command(&repo)
                .args([
                    "run",
                    "--quiet",
                    "--workspace-mode",
                    "worktree",
                    "--agent",
                    "shell",
                    &format!("{fake} hold-lock {lock} 30"),
                ])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap(),
        );
    }
    crate::common::runs::wait_for_agents_saying(&env, &repo, "held", 2);
    for mut run in runs {
        let _ = run.kill();
        let _ = run.wait();
    }
}

/// A confined agent keeps no capability, nor gains one by its exec: run by root, it would hold
/// every capability of its own namespace, and where the kernel gives it none (namespaces
/// refused) every capability of root's — loading a kernel module from its workspace, setting
/// the clock — which Landlock does not refuse. Nor does a program that carries capabilities
/// of its own (`setcap`, as root) give them to it. With the sandbox off, root's agent has
/// them (what the test reads is there to read).
#[test]
fn a_confined_agent_keeps_no_capability_with_or_without_a_namespace_of_its_own() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let mut show = "grep -E '^Cap(Inh|Prm|Eff|Amb)' /proc/self/status".to_owned();
    // A grep that carries a capability of its own, where one can be given (as root): in the
    // project's git directory, which the agent reads (the test's other directories are not
    // there for it).
    let carrying = repo.join(".git/grep-carrying");
    std::fs::create_dir_all(carrying.parent().unwrap()).unwrap();
    let given = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "PATH=$PATH:/usr/sbin:/sbin; cp \"$(command -v grep)\" {carrying} && setcap cap_dac_read_search+ep {carrying}"
        ))
        .output()
        .unwrap();
    let lines = if given.status.success() {
        show.push_str(&format!(
            "; {carrying} -E '^Cap(Prm|Eff)' /proc/self/status"
        ));
        6
    } else {
        // Only root may give a file a capability; CI (root, with setcap) must.
        assert!(
            std::env::var_os("CREW_TESTS_REQUIRE_SETCAP").is_none(),
            "setcap failed: {}",
            render_output(&given)
        );
        eprintln!(
            "skipped: a program carrying a capability (setcap failed: {})",
            String::from_utf8_lossy(&given.stderr).trim()
        );
        4
    };
    let show = show.as_str();
    // The sets the agent printed, and those of them that hold a capability.
    let sets = |dir: &Utf8Path, run: std::process::Output| -> (usize, Vec<String>) {
        assert!(run.status.success(), "{}", render_output(&run));
        let log = output_log(dir, &run_ids(&env, dir)[0], "shell");
        let shown: Vec<&str> = log.lines().filter(|line| line.starts_with("Cap")).collect();
        let held = shown
            .iter()
            .filter(|line| !line.ends_with("0000000000000000"))
            .map(|line| (*line).to_owned())
            .collect();
        (shown.len(), held)
    };

    let confined = env.crew(&repo, ["run", "--agent", "shell", show]);
    assert_eq!(sets(&repo, confined), (lines, Vec::new()));

    let without = crate::common::runs::crew_without_namespaces(&env, &repo)
        .args(["run", "--agent", "shell", show])
        .output()
        .unwrap();
    if crate::common::runs::namespace_refused_to_the_test(&without) {
        return;
    }
    assert_eq!(sets(&repo, without), (lines, Vec::new()));

    if rustix::process::geteuid().is_root() {
        let off = unconfined_repo(&env);
        let run = env.crew(&off, ["run", "--agent", "shell", show]);
        let (shown, held) = sets(&off, run);
        assert!(shown == lines && held.len() >= 3, "{held:?}");
    }
}

/// Confined agents of one host share a user namespace its host made once (cheaper than one of
/// their own at each start), and that gives none of them another's: an agent that finds a
/// sibling tries to read and enter its mount and network namespaces, from where it is and
/// from a user namespace of its own. With the sandbox off (root only, where the agents have
/// no namespaces and the capabilities to enter any) the same attempts get in: the attack
/// works where nothing stops it.
#[test]
fn agents_share_their_host_s_user_namespace_and_none_enters_another_s_namespaces() {
    let env = TestEnv::new();
    // The sibling says where it is and waits; the other goes at it, then lets it go (each
    // waits 30 s at most: a test that fails ends).
    let script = r#"own=$(readlink /proc/self/ns/user)
case "$CREW_AGENT_ID" in
*:shell-1) echo "own $own"; echo $$ > sibling.pid; for i in $(seq 600); do [ -e attacked ] && break; sleep 0.05; done; exit 0 ;;
esac
echo "own $own"
for i in $(seq 600); do [ -s sibling.pid ] && break; sleep 0.05; done
pid=$(cat sibling.pid)
{
echo "sibling $pid"
readlink /proc/$pid/ns/mnt && echo "ESCAPED read its mount namespace"
nsenter --mount=/proc/$pid/ns/mnt true && echo "ESCAPED into its mount namespace"
nsenter --net=/proc/$pid/ns/net true && echo "ESCAPED into its network namespace"
unshare -Ur nsenter --mount=/proc/$pid/ns/mnt true && echo "ESCAPED into its mount namespace from a namespace of its own"
} > attack.txt 2>&1
touch attacked"#;
    let attack = |repo: &Utf8Path| -> (String, Vec<String>) {
        let run = env.crew(
            repo,
            [
                "run",
                "--agent",
                "shell",
                "--fan-out",
                "2",
                "--max-parallel",
                "2",
                script,
            ],
        );
        assert!(run.status.success(), "{}", render_output(&run));
        let run_id = &run_ids(&env, repo)[0];
        let namespaces = ["shell-1", "shell-2"]
            .iter()
            .map(|task| {
                let log = output_log(repo, run_id, task);
                let own = log.lines().find_map(|line| line.strip_prefix("own "));
                own.unwrap_or_else(|| panic!("{task} said nothing: {log}"))
                    .to_owned()
            })
            .collect();
        let attack = std::fs::read_to_string(repo.join("attack.txt")).unwrap();
        assert!(attack.starts_with("sibling "), "{attack}");
        (attack, namespaces)
    };

    let repo = env.repo("project");
    let (attempts, namespaces) = attack(&repo);
    assert!(!attempts.contains("ESCAPED"), "{attempts}");
    let host = std::fs::read_link("/proc/self/ns/user").unwrap();
    assert_eq!(namespaces[0], namespaces[1], "{attempts}");
    assert_ne!(namespaces[0], host.to_string_lossy(), "{attempts}");

    if rustix::process::geteuid().is_root() {
        let off = unconfined_repo(&env);
        let (attempts, _) = attack(&off);
        assert!(
            attempts.contains("ESCAPED into its mount namespace\n"),
            "{attempts}"
        );
    }
}

/// System V shared memory and message queues are found by a number, not a path, so Landlock
/// does not see them: in the machine's IPC namespace an agent could list, read and remove
/// those of every program of its user (as root, of everyone's: a database's shared memory).
/// A confined agent has an IPC namespace of its own: it sees none of the host's objects,
/// removes none, and makes its own as before.
#[test]
fn a_confined_agent_reaches_no_system_v_ipc_object_outside_its_sandbox() {
    let env = TestEnv::new();
    // Made by `ipcmk` as the user's programs would, in this process's namespace; the ids are
    // what the agent goes for (as `ipcs` would have shown it).
    let make = |what: &str| -> String {
        let made = std::process::Command::new("ipcmk")
            .arg(what)
            .output()
            .unwrap();
        assert!(made.status.success(), "{}", render_output(&made));
        let said = String::from_utf8(made.stdout).unwrap();
        said.rsplit(' ').next().unwrap().trim().to_owned()
    };
    let listed = |table: &str, id: &str| {
        std::fs::read_to_string(format!("/proc/sysvipc/{table}"))
            .unwrap()
            .lines()
            .any(|line| line.split_whitespace().nth(1) == Some(id))
    };
    let remove = |flag: &str, id: &str| {
        let _ = std::process::Command::new("ipcrm")
            .args([flag, id])
            .output();
    };
    // What the agent says it did to a queue and a segment made for it, and whether each is
    // still there after (then removed).
    let attack = |repo: &Utf8Path| -> (String, bool, bool) {
        let (queue, memory) = (make("-Q"), make("-M4096"));
        let script = format!(
            r#"ipcs -q -m | grep -E '^0x' | sed 's/^/SEEN /' > attack.txt
ipcrm -q {queue} 2>/dev/null && echo 'ESCAPED removed the queue' >> attack.txt
ipcrm -m {memory} 2>/dev/null && echo 'ESCAPED removed the shared memory' >> attack.txt
own=$(ipcmk -Q) && echo "OWN $own" >> attack.txt && ipcrm -q "${{own##* }}"
true"#
        );
        let run = env.crew(repo, ["run", "--agent", "shell", &script]);
        let kept = (listed("msg", &queue), listed("shm", &memory));
        remove("-q", &queue);
        remove("-m", &memory);
        assert!(run.status.success(), "{}", render_output(&run));
        let attempts = std::fs::read_to_string(repo.join("attack.txt")).unwrap();
        (attempts, kept.0, kept.1)
    };

    let repo = env.repo("project");
    let (attempts, queue_kept, memory_kept) = attack(&repo);
    assert!(
        !attempts.contains("ESCAPED") && !attempts.contains("SEEN"),
        "{attempts}"
    );
    assert!(queue_kept && memory_kept, "{attempts}");
    assert!(attempts.contains("OWN Message queue id: "), "{attempts}");

    // With the sandbox off, the same agent removes both.
    let off = unconfined_repo(&env);
    let (attempts, queue_kept, memory_kept) = attack(&off);
    assert!(
        attempts.contains("ESCAPED removed the queue")
            && attempts.contains("ESCAPED removed the shared memory"),
        "{attempts}"
    );
    assert!(!queue_kept && !memory_kept, "{attempts}");
}

/// POSIX shared memory is files in `/dev/shm`, which every program may write: a confined
/// agent could read, fill or remove any other program's segment there (a browser's, a
/// database's, the sound server's). It gets a `/dev/shm` of its own: the user's segment is
/// not there, it stays as it was, and the agent's own shared memory works and goes with it.
#[test]
fn a_confined_agent_has_shared_memory_of_its_own_and_never_the_user_s() {
    let env = TestEnv::new();
    let segment = Utf8PathBuf::from(format!("/dev/shm/crew-test-{}", std::process::id()));
    let own = format!("crew-test-own-{}", std::process::id());
    // What the agent read of the user's segment, what it says of its own, and what is left
    // of the user's after it appended to it and removed it.
    let attack = |repo: &Utf8Path, agent: &str| -> (String, Option<String>) {
        write(&segment, "the user's\n");
        let script = format!(
            r#"cat {segment} > attack.txt 2>/dev/null
echo agent >> {segment} 2>/dev/null
rm -f {segment} 2>/dev/null
echo mine > /dev/shm/{own} && [ "$(cat /dev/shm/{own})" = mine ] && echo "OWN shared memory" >> attack.txt
true"#
        );
        let run = env.crew(repo, ["run", "--agent", agent, &script]);
        assert!(run.status.success(), "{}", render_output(&run));
        let left = std::fs::read_to_string(&segment).ok();
        let _ = std::fs::remove_file(&segment);
        (
            std::fs::read_to_string(repo.join("attack.txt")).unwrap(),
            left,
        )
    };

    let repo = env.repo("project");
    let (attempts, left) = attack(&repo, "shell");
    let own_left = std::path::Path::new("/dev/shm").join(&own).exists();
    assert!(!attempts.contains("the user's"), "{attempts}");
    assert_eq!(left.as_deref(), Some("the user's\n"), "{attempts}");
    assert!(attempts.contains("OWN shared memory"), "{attempts}");
    assert!(
        !own_left,
        "the agent's own segment landed in the user's /dev/shm"
    );

    // With the sandbox off, the same agent reads the user's, and removes it.
    let off = unconfined_repo(&env);
    let (attempts, left) = attack(&off, "shell");
    let _ = std::fs::remove_file(std::path::Path::new("/dev/shm").join(&own));
    assert!(attempts.contains("the user's"), "{attempts}");
    assert_eq!(left, None, "{attempts}");

    // A definition that grants the user's `/dev/shm` by name, allowed, shares it.
    let shared = env.repo("shared");
    write(
        &shared.join(".crew/agents/shared.toml"),
        "command = [\"sh\", \"-c\", \"{prompt}\"]\n[sandbox]\nwrite = [\"/dev/shm\"]\n",
    );
    env.allow_settings(&shared);
    let (attempts, left) = attack(&shared, "shared");
    let _ = std::fs::remove_file(std::path::Path::new("/dev/shm").join(&own));
    assert!(attempts.contains("the user's"), "{attempts}");
    assert_eq!(left, None, "{attempts}");
}

/// An agent started from the user's terminal had it as its controlling terminal: through
/// `/dev/tty` it could push keystrokes into it (`TIOCSTI`, which the user's shell reads once
/// crew is done) or read from it. No agent has a controlling terminal: `/dev/tty` does not
/// open for it, confined or not, and nothing it tries reaches the terminal crew runs in.
#[test]
fn an_agent_has_no_controlling_terminal_to_type_into() {
    use crate::common::tmux::{Tmux, crew_script_with};
    let env = TestEnv::new();
    // Its marker is built at run time: the screen never shows it unless it was typed.
    let inject = r#"python3 -c '
import fcntl, os, termios
try:
    fd = os.open("/dev/tty", os.O_RDONLY)
except OSError as error:
    print("no terminal:", error.strerror)
    raise SystemExit
try:
    for key in "pla" + "nted\n":
        fcntl.ioctl(fd, termios.TIOCSTI, key.encode())
    print("ESCAPED typed into the terminal")
except OSError as error:
    print("opened the terminal, refused:", error.strerror)
' > tried.txt 2>&1"#;
    for repo in [env.repo("project"), unconfined_repo(&env)] {
        let script = crew_script_with(
            &env,
            &repo,
            &[
                "run".into(),
                "--quiet".into(),
                "--agent".into(),
                "shell".into(),
                inject.into(),
            ],
            "inject.sh",
            &[],
        );
        let Some(terminal) = Tmux::start(&env, "an_agent_has_no_controlling_terminal", &script)
        else {
            return;
        };
        let screen = terminal.screen_when("crew to end", |screen| screen.contains("EXITED-"));
        let tried = std::fs::read_to_string(repo.join("tried.txt")).unwrap_or_default();
        assert!(screen.contains("EXITED-0"), "{screen}\n{tried}");
        assert_eq!(
            tried.trim(),
            "no terminal: No such device or address",
            "{screen}"
        );
        assert!(!screen.contains("planted"), "{screen}\n{tried}");
    }
}
