//! Agents as the untrusted party (ARCHITECTURE.md, "Agents are untrusted"): an agent that tries
//! each escape, against the real kernel sandbox and with the sandbox off, where crew's own
//! checks must still hold.
//!
//! Each attempt prints `ESCAPED <what>` when it worked; the tests read the agent's output, the
//! run's record, and fingerprints of everything outside crew's roots taken before and after.

use camino::{Utf8Path, Utf8PathBuf};
use crew_tests::{TestEnv, render_output, tree_fingerprint, write};

use crate::common::runs::{manifest, run_ids, task, try_manifest};

mod caches;
mod escapes;
mod kernel;
mod races;
mod reach;
mod reads;
mod settings;
mod tripwire;

/// What the world outside crew's roots looks like: the home directory, a sibling repository
/// (worktree, `.git` included), the leader's own files and its git config and hooks.
struct Canaries {
    paths: Vec<Utf8PathBuf>,
}

impl Canaries {
    fn new(env: &TestEnv, leader: &Utf8Path, sibling: &Utf8Path) -> Self {
        write(&env.home().join("canary.txt"), "do not touch\n");
        Canaries {
            paths: vec![
                env.home(),
                sibling.to_owned(),
                leader.join("README.md"),
                leader.join("src"),
                leader.join(".git/config"),
                leader.join(".git/hooks"),
                leader.join(".git/refs/heads/main"),
            ],
        }
    }

    fn fingerprint(&self) -> Vec<(Utf8PathBuf, Vec<(String, String)>)> {
        self.paths
            .iter()
            .map(|path| {
                let print = if path.is_dir() {
                    tree_fingerprint(path.as_std_path())
                } else {
                    vec![(String::new(), std::fs::read_to_string(path).unwrap())]
                };
                (path.clone(), print)
            })
            .collect()
    }
}

/// A repository whose checked-in settings switch the sandbox off, allowed by the user: the
/// control run in which an attack must work.
fn unconfined_repo(env: &TestEnv) -> Utf8PathBuf {
    let off = env.repo("unconfined");
    write(
        &off.join(".crew/config.toml"),
        "[sandbox]\nmode = \"off\"\n",
    );
    env.allow_settings(&off);
    off
}

/// A sibling repository with a tracked file, an untracked one and an ignored `prod.env`.
fn sibling_repo(env: &TestEnv) -> Utf8PathBuf {
    let sibling = env.repo("sibling");
    write(&sibling.join(".gitignore"), "prod.env\n");
    env.git(&sibling, ["add", ".gitignore"]);
    env.git(&sibling, ["commit", "-q", "-m", "ignore prod.env"]);
    write(&sibling.join("prod.env"), "SECRET=1\n");
    write(&sibling.join("untracked.txt"), "mine\n");
    sibling
}

/// The escapes a hostile agent tries from its worktree; each prints `ESCAPED <what>` if it
/// worked. Then it does its real work: a commit of its own and a file left uncommitted.
fn escapes(sibling: &Utf8Path) -> String {
    format!(
        r##"
warden=$PPID
echo work > work.txt
git add work.txt && git -c user.name=agent -c user.email=agent@example.com commit -q -m "agent's own commit"
echo uncommitted > uncommitted.txt
ln -s / root-link
echo tmp > "$TMPDIR/scratch" && echo "TMPDIR OK"
try() {{ name=$1; shift; if ( "$@" ) 2>/dev/null; then echo "ESCAPED $name"; fi; }}
try home sh -c 'echo pwned >> "$HOME/canary.txt"'
try home-new sh -c 'echo pwned > "$HOME/new.txt"'
try sibling sh -c 'echo pwned >> {sibling}/README.md'
try sibling-git sh -c 'echo "[core] fsmonitor = touch /tmp/x" >> {sibling}/.git/config'
try leader-file sh -c 'echo pwned >> "$CREW_PROJECT_ROOT/README.md"'
try leader-state sh -c 'echo pwned > "$CREW_PROJECT_ROOT/.crew/state/planted"'
try git-config git config core.fsmonitor "touch $HOME/fsmonitor-ran"
try git-hook sh -c 'printf "#!/bin/sh\ntouch $HOME/hook-ran\n" > "$CREW_PROJECT_ROOT/.git/hooks/post-merge"'
try git-info sh -c 'echo "* filter=evil" > "$CREW_PROJECT_ROOT/.git/info/attributes"'
try main-branch sh -c 'git update-ref refs/heads/main HEAD; test "$(git -C "$CREW_PROJECT_ROOT" rev-parse main)" = "$(git rev-parse HEAD)"'
try new-branch sh -c 'git branch planted; git -C "$CREW_PROJECT_ROOT" rev-parse -q --verify planted'
try objects sh -c 'touch "$CREW_PROJECT_ROOT/.git/objects/planted"'
try rename-workspace mv "$PWD" "$PWD.moved"
try grandchild sh -c 'sh -c "echo pwned > \"\$HOME/grandchild.txt\""'
try signal-warden kill -0 "$warden"
for p in /proc/[0-9]*; do
  if [ "$(cat "$p/comm" 2>/dev/null)" = crew-wardens ]; then
    echo "WARDEN SERVER SEEN"; try signal-server kill -0 "${{p#/proc/}}"
  fi
done
(setsid env -i sh -c 'cd /; exec sleep 6131' </dev/null >/dev/null 2>&1 &)
echo done
"##
    )
}

fn team(env: &TestEnv, repo: &Utf8Path, prompt: &str) {
    write(
        &repo.join(".crew/teams/hostile.toml"),
        &format!(
            "workspace_mode = \"worktree\"\n[[tasks]]\nid = \"hostile\"\nagent = \"shell\"\nprompt = '''{prompt}'''\n"
        ),
    );
    env.git(repo, ["add", ".crew"]);
    env.git(repo, ["commit", "-q", "-m", "crew team"]);
}

fn output_log(repo: &Utf8Path, run: &str, task: &str) -> String {
    std::fs::read_to_string(repo.join(format!(".crew/state/runs/{run}/tasks/{task}/output.log")))
        .unwrap()
}

/// A pseudo-terminal of this process, as a user's terminal is: its controlling side (what the
/// user types goes in there) and the device path programs in it read from.
fn user_terminal() -> (std::fs::File, String) {
    use rustix::pty::{OpenptFlags, grantpt, openpt, ptsname, unlockpt};
    let master = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY).unwrap();
    grantpt(&master).unwrap();
    unlockpt(&master).unwrap();
    let path = ptsname(&master, Vec::new()).unwrap();
    let path = path.to_string_lossy().into_owned();
    let master = std::fs::File::from(master);
    (master, path)
}

/// Runs a task `swap` three times in `mode` (its run directories made in `parent`) while a
/// racer swaps each run directory holding `swap/` for a link to a directory of the user's,
/// once `ready(<.crew/state/runs>, <run>)` says so; then checks that the agent never ran
/// there and crew wrote nothing there.
fn race_a_swapped_workspace(
    mode: &str,
    parent: &str,
    config: &str,
    ready: fn(&std::path::Path, &std::ffi::OsStr) -> bool,
) {
    let env = TestEnv::new();
    let repo = env.repo("project");
    write(
        &repo.join(".crew/config.toml"),
        &format!("[worktree]\npool_size = 0\n{config}"),
    );
    env.allow_settings(&repo);
    let victim = env.root().join("victim");
    let ws = repo.join(parent);
    std::fs::create_dir_all(&ws).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let racer = {
        let (ws, runs, victim, stop, aside) = (
            ws.clone().into_std_path_buf(),
            repo.join(".crew/state/runs").into_std_path_buf(),
            victim.clone().into_std_path_buf(),
            stop.clone(),
            env.root().join("aside").into_std_path_buf(),
        );
        std::thread::spawn(move || {
            let mut swapped = 0;
            std::fs::create_dir_all(&aside).unwrap();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for run in std::fs::read_dir(&ws).into_iter().flatten().flatten() {
                    let run_dir = run.path();
                    let name = run.file_name();
                    if run_dir.is_symlink()
                        || !run_dir.join("swap").is_dir()
                        || !ready(&runs, &name)
                    {
                        continue;
                    }
                    std::fs::create_dir_all(victim.join(&name).join("swap")).unwrap();
                    std::fs::write(victim.join(&name).join("swap/canary.txt"), "mine\n").unwrap();
                    if std::fs::rename(&run_dir, aside.join(&name)).is_ok() {
                        std::os::unix::fs::symlink(victim.join(&name), &run_dir).unwrap();
                        swapped += 1;
                    }
                }
                std::thread::yield_now();
            }
            swapped
        })
    };
    for _ in 0..3 {
        let output = env.crew(
            &repo,
            [
                "run",
                "--agent",
                "shell",
                "--workspace-mode",
                mode,
                "--task",
                "swap=rm -f canary.txt; echo ran > ran.txt",
            ],
        );
        let _ = render_output(&output);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let swapped = racer.join().unwrap();
    assert!(
        swapped > 0,
        "{mode} {config}: the racer never had its chance"
    );
    for run in std::fs::read_dir(&victim).unwrap().flatten() {
        let task = run.path().join("swap");
        // Neither the agent nor crew wrote there: the canary alone.
        let mut left: Vec<String> = std::fs::read_dir(&task)
            .unwrap()
            .flatten()
            .map(|entry| entry.file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(
            left,
            ["canary.txt"],
            "{mode} {config}: the agent or crew wrote in {}",
            task.display()
        );
    }
}
