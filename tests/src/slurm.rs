//! A real one-node Slurm cluster of the test's own (Debian's `slurmctld`, `slurmd`,
//! `slurm-client` and `munge`): `munged` on a private socket with a throwaway key, and the two
//! daemons in the foreground with a private `slurm.conf` on free ports of localhost, their
//! state in the test's directory. Every client command finds it through `SLURM_CONF`. Killed
//! when dropped.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{TestEnv, write};
use camino::{Utf8Path, Utf8PathBuf};

const SLURMCTLD: &str = "/usr/sbin/slurmctld";
const SLURMD: &str = "/usr/sbin/slurmd";
const MUNGED: &str = "/usr/sbin/munged";

/// A running cluster of one node, `node`, with `cpus` CPUs (as configured, whatever the
/// machine has) in its one partition `crew`.
#[derive(Debug)]
pub struct Slurm {
    children: Vec<Child>,
    /// Its `slurm.conf`: what `SLURM_CONF` names for every client.
    pub conf: Utf8PathBuf,
    /// Its node's name.
    pub node: String,
    dir: Utf8PathBuf,
}

impl Slurm {
    /// `None` (and the test says it was skipped) when Slurm is not installed, unless
    /// `CREW_TESTS_REQUIRE_SLURM` says it must be (CI installs it).
    pub fn start(env: &TestEnv, test: &str, cpus: u32) -> Option<Slurm> {
        let missing: Vec<&str> = [SLURMCTLD, SLURMD, MUNGED]
            .into_iter()
            .filter(|program| !Utf8Path::new(program).exists())
            .collect();
        if !missing.is_empty() {
            assert!(
                std::env::var_os("CREW_TESTS_REQUIRE_SLURM").is_none(),
                "{test} cannot run: {} not installed (apt-get install slurmctld slurmd slurm-client munge)",
                missing.join(", ")
            );
            eprintln!("SKIPPED {test}: {} not installed", missing.join(", "));
            return None;
        }
        Some(Slurm::start_in(env.dir("slurm"), cpus))
    }

    /// A cluster whose files are in `dir`; Slurm must be installed.
    pub fn start_in(dir: Utf8PathBuf, cpus: u32) -> Slurm {
        for sub in ["munge", "state", "spool", "log"] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.join("munge"), std::fs::Permissions::from_mode(0o700))
            .unwrap();
        let key = dir.join("munge/munge.key");
        let mut random = vec![0u8; 1024];
        use std::io::Read;
        std::fs::File::open("/dev/urandom")
            .unwrap()
            .read_exact(&mut random)
            .unwrap();
        std::fs::write(&key, random).unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o400)).unwrap();
        let socket = dir.join("munge/munge.sock");
        let mut children = vec![
            Command::new(MUNGED)
                .args(["--foreground", "--force"])
                .arg(format!("--socket={socket}"))
                .arg(format!("--key-file={key}"))
                .arg(format!("--log-file={dir}/log/munged.log"))
                .arg(format!("--pid-file={dir}/munge/munged.pid"))
                .arg(format!("--seed-file={dir}/munge/seed"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        ];
        wait_for(|| socket.exists(), "munged to make its socket");
        let node = String::from_utf8(Command::new("hostname").arg("-s").output().unwrap().stdout)
            .unwrap()
            .trim()
            .to_owned();
        let free = || {
            TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port()
        };
        let (ctld_port, slurmd_port) = (free(), free());
        let conf = dir.join("slurm.conf");
        write(
            &conf,
            &format!(
                "ClusterName=crewtest\nSlurmctldHost={node}(127.0.0.1)\nSlurmctldPort={ctld_port}\nSlurmdPort={slurmd_port}\n\
AuthType=auth/munge\nAuthInfo=socket={socket}\nCredType=cred/munge\nSlurmUser=root\nSlurmdUser=root\n\
StateSaveLocation={dir}/state\nSlurmdSpoolDir={dir}/spool\nSlurmctldPidFile={dir}/slurmctld.pid\nSlurmdPidFile={dir}/slurmd.pid\n\
SlurmctldLogFile={dir}/log/slurmctld.log\nSlurmdLogFile={dir}/log/slurmd.log\n\
ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nSchedulerType=sched/builtin\nSelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\n\
ReturnToService=2\nMpiDefault=none\nJobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\nJobCompType=jobcomp/none\n\
SlurmdParameters=config_overrides\nSlurmdTimeout=30\nInactiveLimit=0\nKillWait=10\nMinJobAge=600\nOverTimeLimit=0\n\
NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=4096 State=UNKNOWN\nPartitionName=crew Nodes={node} Default=YES MaxTime=INFINITE State=UP\n"
            ),
        );
        for daemon in [SLURMCTLD, SLURMD] {
            children.push(
                Command::new(daemon)
                    .args(["-D", "-f"])
                    .arg(conf.as_str())
                    .env("SLURM_CONF", conf.as_str())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap(),
            );
        }
        let slurm = Slurm {
            children,
            conf,
            node,
            dir,
        };
        wait_for(
            || {
                slurm
                    .command("sinfo")
                    .args(["-h", "-o", "%t"])
                    .output()
                    .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "idle")
            },
            "the node to be idle",
        );
        slurm
    }

    /// A Slurm client command (`squeue`, `scontrol` …) for this cluster.
    pub fn command(&self, program: &str) -> Command {
        let mut command = Command::new(program);
        command.env("SLURM_CONF", self.conf.as_str());
        command
    }

    /// `squeue` of every job it remembers: `id|name|state|reason|comment`, one a line.
    pub fn jobs(&self) -> String {
        let output = self
            .command("squeue")
            .args(["-h", "-t", "all", "-o", "%i|%j|%T|%r|%k"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// The daemons' logs, for a failing test to show.
    pub fn logs(&self) -> String {
        ["slurmctld.log", "slurmd.log"]
            .iter()
            .map(|log| {
                let text =
                    std::fs::read_to_string(self.dir.join("log").join(log)).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(30).collect();
                format!(
                    "--- {log}\n{}",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for Slurm {
    /// Its jobs are cancelled and given the time to end while the daemons still run (a step
    /// whose `slurmd` is gone is never cleaned up); then the daemons go, and whatever of a
    /// job still lives — a step's `slurmstepd`, which carries the cluster's `SLURM_CONF`, and
    /// everything under it — is killed.
    fn drop(&mut self) {
        let user = std::env::var("USER").unwrap_or_else(|_| "root".to_owned());
        // A cluster that no longer answers has nothing to cancel.
        let _ = self
            .command("scancel")
            .arg(format!("--user={user}"))
            .output();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            let going = self
                .command("squeue")
                .args([
                    "-h",
                    "-t",
                    "pending,running,completing,configuring",
                    "-o",
                    "%i",
                ])
                .output()
                .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
                .unwrap_or_default();
            if going.is_empty() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        for child in self.children.iter_mut().rev() {
            // Already gone, or killed now: either way not left behind.
            let _ = child.kill();
            let _ = child.wait();
        }
        let ours = format!("SLURM_CONF={}", self.conf);
        let steps: Vec<i32> = all_pids()
            .into_iter()
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|environ| {
                    environ
                        .split(|byte| *byte == 0)
                        .any(|entry| entry == ours.as_bytes())
                })
            })
            .collect();
        for step in steps {
            kill_tree(step);
        }
    }
}

/// Every process's pid.
fn all_pids() -> Vec<i32> {
    std::fs::read_dir("/proc")
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Kills `pid` and every process under it.
fn kill_tree(pid: i32) {
    let children: Vec<i32> = all_pids()
        .into_iter()
        .filter(|child| {
            std::fs::read_to_string(format!("/proc/{child}/stat")).is_ok_and(|stat| {
                stat.rsplit_once(") ")
                    .and_then(|(_, rest)| rest.split(' ').nth(1)?.parse::<i32>().ok())
                    == Some(pid)
            })
        })
        .collect();
    // Gone already: nothing left of it to kill.
    let _ = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status();
    for child in children {
        kill_tree(child);
    }
}

fn wait_for(mut ready: impl FnMut() -> bool, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ready() {
        assert!(
            Instant::now() < deadline,
            "Slurm: timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
