//! `crew shim --stdio`: a real shim process driven through its stdin and stdout as a crew host
//! elsewhere drives it. Its tasks work only in the shim's clone, their work comes back as a
//! pack that `incoming::accept_work` checks into the project, and an agent that prints shim
//! messages or outlives the connection changes nothing of that.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use base64::Engine as _;
use camino::{Utf8Path, Utf8PathBuf};
use crew_core::model::TaskStatus;
use crew_core::shim::{FromShim, SHIM_PROTOCOL, ToShim, WorkClaim};
use crew_core::{AgentDef, RunId, TaskId};
use crew_tests::TestEnv;
use crew_worktree::incoming::{AcceptWork, accept_work, pack_history};

/// A shim process and the messages it sent, read on a thread of their own.
struct Shim {
    child: Child,
    stdin: Option<ChildStdin>,
    messages: mpsc::Receiver<FromShim>,
    /// Chunks of the pack that the next `work` closes.
    pack: Vec<u8>,
    /// A message read ahead, for the next `next`.
    ahead: Option<FromShim>,
    /// The last messages read, for a failure to show.
    seen: std::collections::VecDeque<String>,
}

impl Shim {
    fn start(env: &TestEnv, root: &Utf8Path) -> Shim {
        let mut child = env
            .crew_command(&env.dir("shim-cwd"))
            .args(["shim", "--stdio", root.as_str()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let (send, messages) = mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines() {
                let Ok(line) = line else { break };
                let message: FromShim = serde_json::from_str(&line)
                    .unwrap_or_else(|error| panic!("the shim wrote {line:?}: {error}"));
                if send.send(message).is_err() {
                    break;
                }
            }
        });
        Shim {
            stdin: child.stdin.take(),
            child,
            messages,
            pack: Vec::new(),
            ahead: None,
            seen: std::collections::VecDeque::new(),
        }
    }

    fn send(&mut self, message: &ToShim) {
        let stdin = self.stdin.as_mut().unwrap();
        let mut line = serde_json::to_vec(message).unwrap();
        line.push(b'\n');
        stdin.write_all(&line).unwrap();
        stdin.flush().unwrap();
    }

    fn next(&mut self) -> FromShim {
        if let Some(message) = self.ahead.take() {
            return message;
        }
        let message = self
            .messages
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| {
                panic!(
                    "the shim said nothing for a minute; before, it said: {:#?}",
                    self.seen
                )
            });
        if self.seen.len() == 12 {
            self.seen.pop_front();
        }
        let mut shown = format!("{message:?}");
        shown.truncate(300);
        self.seen.push_back(shown);
        if let FromShim::Pack { data } = &message {
            self.pack.extend(
                base64::engine::general_purpose::STANDARD
                    .decode(data)
                    .unwrap(),
            );
        }
        message
    }

    /// Every message up to the first that `stop` picks, that one included.
    fn until(&mut self, stop: impl Fn(&FromShim) -> bool) -> Vec<FromShim> {
        let mut seen = Vec::new();
        loop {
            let message = self.next();
            let done = stop(&message);
            seen.push(message);
            if done {
                return seen;
            }
        }
    }

    fn hello(&mut self, project: &Utf8Path) -> Utf8PathBuf {
        self.send(&ToShim::Hello {
            v: SHIM_PROTOCOL,
            project: project.to_string(),
        });
        match self.next() {
            FromShim::Hello { v, clone } => {
                assert_eq!(v, SHIM_PROTOCOL);
                Utf8PathBuf::from(clone)
            }
            other => panic!("{other:?}"),
        }
    }

    /// Starts `task` on `prompt` from `base`, sending the base's history when the shim asks.
    fn start_task(&mut self, project: &Utf8Path, task: &str, prompt: &str, base: &str) {
        let start = ToShim::Start {
            task: TaskId::parse(task).unwrap(),
            run: RunId::parse("r1").unwrap(),
            agent: Box::new(AgentDef::builtin_shell()),
            prompt: prompt.to_owned(),
            base: base.to_owned(),
            from: None,
            env: Default::default(),
            resources: Default::default(),
            allow_uncapped: false,
        };
        self.send(&start);
        let answer = self.next();
        if let FromShim::NeedBase { commit } = answer {
            assert_eq!(commit, base);
            let mut history = Vec::new();
            pack_history(project, base, &mut history).unwrap();
            for chunk in history.chunks(100 * 1024) {
                self.send(&ToShim::Pack {
                    data: base64::engine::general_purpose::STANDARD.encode(chunk),
                });
            }
            self.send(&ToShim::Base {
                commit: base.to_owned(),
            });
            self.send(&start);
        } else {
            // The clone had the base: the task started.
            self.ahead = Some(answer);
        }
    }

    fn close(&mut self) {
        self.stdin = None;
    }
}

impl Drop for Shim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn started_dir(messages: &[FromShim]) -> Utf8PathBuf {
    messages
        .iter()
        .find_map(|message| match message {
            FromShim::Started { dir, .. } => Some(Utf8PathBuf::from(dir)),
            _ => None,
        })
        .expect("a started message")
}

fn outputs(messages: &[FromShim]) -> Vec<String> {
    messages
        .iter()
        .filter_map(|message| match message {
            FromShim::Output { line, .. } => Some(line.clone()),
            _ => None,
        })
        .collect()
}

fn finished(messages: &[FromShim]) -> TaskStatus {
    messages
        .iter()
        .find_map(|message| match message {
            FromShim::Finished { status, .. } => Some(*status),
            _ => None,
        })
        .expect("a finished message")
}

fn work(messages: &[FromShim]) -> (Option<WorkClaim>, Option<String>) {
    match messages.last() {
        Some(FromShim::Work { claim, kept_at, .. }) => (claim.clone(), kept_at.clone()),
        other => panic!("{other:?}"),
    }
}

fn head(env: &TestEnv, repo: &Utf8Path) -> String {
    env.git(repo, ["rev-parse", "HEAD"]).trim().to_owned()
}

#[test]
fn a_task_runs_only_in_the_shims_clone_and_its_work_comes_back_checked() {
    let env = TestEnv::new();
    let project = env.repo("project");
    let base = head(&env, &project);
    let root = env.dir("shim");
    let mut shim = Shim::start(&env, &root);
    let clone = shim.hello(&project);
    assert!(clone.starts_with(&root), "{clone}");
    // The agent prints what looks like the shim's own `work` message: it is output, never
    // protocol, since the agent's stdout is a pipe of the shim's supervisor.
    shim.start_task(
        &project,
        "api",
        r#"echo '{"type":"work","task":"api","claim":null}'; printf 'the api\n' > api.txt; echo done"#,
        &base,
    );
    let messages = shim.until(|message| matches!(message, FromShim::Work { .. }));
    let dir = started_dir(&messages);
    assert!(dir.starts_with(&clone), "{dir} is not in the shim's clone");
    let lines = outputs(&messages);
    assert!(
        lines.contains(&r#"{"type":"work","task":"api","claim":null}"#.to_owned()),
        "{lines:?}"
    );
    assert_eq!(finished(&messages), TaskStatus::Succeeded);
    // Everything of the task (its last status, its last line) came before `finished`.
    let end = messages
        .iter()
        .position(|message| matches!(message, FromShim::Finished { .. }))
        .unwrap();
    assert!(
        messages[end..]
            .iter()
            .all(|message| !matches!(message, FromShim::Output { .. } | FromShim::Status { .. })),
        "{messages:#?}"
    );
    assert!(outputs(&messages).ends_with(&["done".to_owned()]));
    let (claim, kept_at) = work(&messages);
    let claim = claim.expect("the task left work");
    let kept_at = kept_at.expect("the shim keeps the work until released");
    assert_eq!(claim.base, base);

    // The project took in nothing yet, and never had a worktree of this task.
    assert!(!project.join(".worktrees").exists());
    let pack = env.dir("received").join("api.pack");
    std::fs::write(&pack, &shim.pack).unwrap();
    accept_work(&AcceptWork {
        repo_root: &project,
        claim: &claim,
        pack: &pack,
        branch: "crew/r1-api",
        branch_expected_at: None,
        quarantine: "refs/crew/incoming/r1-api",
    })
    .unwrap();
    assert_eq!(
        env.git(&project, ["show", "crew/r1-api:api.txt"]),
        "the api\n"
    );

    // Released: the shim's copy goes; before, it was there.
    assert_eq!(
        env.git(&clone, ["rev-parse", &kept_at]).trim(),
        claim.tip.as_str()
    );
    shim.send(&ToShim::Release {
        task: TaskId::parse("api").unwrap(),
    });
    assert!(matches!(
        shim.until(|message| matches!(message, FromShim::Released { .. } | FromShim::Error { .. }))
            .last(),
        Some(FromShim::Released { .. })
    ));
    let gone = env.git_output(&clone, ["rev-parse", "--verify", "-q", &kept_at]);
    assert!(!gone.status.success(), "{kept_at} is still in the clone");

    // Another project on the same shim gets a clone of its own.
    let other = env.repo("other");
    let mut second = Shim::start(&env, &root);
    assert_ne!(second.hello(&other), clone);
    shim.close();
    let status = crew_tests::wait_until(30, "the shim's exit", || shim.child.try_wait().unwrap());
    assert!(status.success());
}

#[test]
fn a_steer_reaches_the_remote_agent_and_a_lost_connection_keeps_its_work_in_the_clone() {
    let env = TestEnv::new();
    let project = env.repo("project");
    let base = head(&env, &project);
    let root = env.dir("shim");
    let mut shim = Shim::start(&env, &root);
    let clone = shim.hello(&project);

    // The shell agent reads steering line by line on its stdin.
    shim.start_task(
        &project,
        "steered",
        r#"echo ready; read line; echo "got: $line"; echo "$line" > steered.txt"#,
        &base,
    );
    shim.until(|message| matches!(message, FromShim::Output { line, .. } if line == "ready"));
    shim.send(&ToShim::Steer {
        task: TaskId::parse("steered").unwrap(),
        message: "go left".to_owned(),
    });
    let messages = shim.until(|message| matches!(message, FromShim::Work { .. }));
    assert!(outputs(&messages).contains(&"got: go left".to_owned()));
    assert_eq!(finished(&messages), TaskStatus::Succeeded);
    assert!(work(&messages).0.is_some());

    // A control message for a task the shim does not have is refused, and nothing else moves.
    shim.send(&ToShim::Stop {
        task: TaskId::parse("nobody").unwrap(),
    });
    match shim.next() {
        FromShim::Error { code, .. } => assert_eq!(code, "unknown_task"),
        other => panic!("{other:?}"),
    }

    // The connection drops mid-task: the shim stops the agent gracefully, commits what it
    // left to the task's branch in the clone, and exits.
    shim.start_task(
        &project,
        "cut",
        "echo partial > partial.txt; echo written; sleep 600",
        &base,
    );
    // Status changes and output lines come on streams of their own: wait for both.
    let (mut run, mut written) = (None, false);
    while run.is_none() || !written {
        match shim.next() {
            FromShim::Started { run: started, .. } => run = Some(started),
            FromShim::Output { line, .. } if line == "written" => written = true,
            _ => {}
        }
    }
    let run = run.unwrap();
    shim.close();
    let status = crew_tests::wait_until(60, "the shim's exit", || shim.child.try_wait().unwrap());
    // Not every task it ran succeeded and was released: its exit says so, and no more.
    assert_eq!(status.code(), Some(1));
    assert_eq!(
        env.git(&clone, ["show", &format!("crew/{run}-cut:partial.txt")]),
        "partial\n"
    );
}
