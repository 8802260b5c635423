//! `[placements.<name>]`: somewhere else tasks run (docs/placements.md), and the command that
//! reaches each kind's shim: `crew shim` here, over `ssh`, a Kubernetes Job's attach stream,
//! or a Slurm job's `srun`.

use serde::{Deserialize, Serialize};

use super::resources::Resources;

/// How a placement's shim is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PlacementKind {
    /// `crew shim` as a child process on this machine, its clones under `dir` (another disk,
    /// and the tests).
    Local,
    /// `ssh <host> <crew> shim`: the user's own ssh, keys and configuration.
    Ssh,
    /// A Kubernetes Job per task in the user's image, `crew shim` its container's command,
    /// reached through the pod's attach stream (`crew-kube-transport`).
    Kubernetes,
    /// A Slurm job per task, `crew shim --stdio` its step, reached through `srun`'s standard
    /// input and output.
    Slurm,
}

impl PlacementKind {
    /// Its name, as `kind` takes it.
    pub fn as_str(self) -> &'static str {
        match self {
            PlacementKind::Local => "local",
            PlacementKind::Ssh => "ssh",
            PlacementKind::Kubernetes => "kubernetes",
            PlacementKind::Slurm => "slurm",
        }
    }
}

/// Who a placement's transport serves: what a Kubernetes Job is named and labelled by, and
/// which variables its Secret holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlacedTask {
    /// The project's id.
    pub project: String,
    /// The run.
    pub run: String,
    /// The task.
    pub task: String,
    /// What the agent's `pass_env` names.
    pub pass_env: Vec<String>,
    /// The task's caps: a pod's limits (over the placement's `cpu` and `memory`), where the
    /// placement holds them so.
    pub resources: Resources,
}

/// `[placements.<name>]`: somewhere else tasks can run (docs/distributed.md). A task that
/// names it runs in a clone the shim keeps there, and its work comes back as its branch here.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PlacementDef {
    /// How the shim is reached.
    pub kind: PlacementKind,
    /// Where the shim keeps its clones, on its machine: an absolute path, or `~/…`.
    pub dir: String,
    /// The host `ssh` connects to (`ssh` only): a name from the user's ssh configuration, or
    /// `user@host`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// The `crew` program on the shim's machine (`ssh`, `kubernetes` and `slurm`; `crew` when
    /// absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crew: Option<String>,
    /// Options for `ssh` before the host (`ssh` only), such as `["-p", "2222"]` or
    /// `["-F", "/path/to/ssh_config"]`; ssh reads the user's own configuration anyway.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ssh_args: Vec<String>,
    /// The image of a task's pod (`kubernetes` only): it needs git, the `crew` binary (`crew`)
    /// and the agent's program.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The namespace of the Jobs (`kubernetes` only; the client configuration's when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The CPU a task's pod requests and may use (`kubernetes` only), such as `"2"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<String>,
    /// A pod template of the user's (`kubernetes` only): a YAML or JSON file (relative to the
    /// project's root) whose pod crew's Job runs, under the restricted settings crew always
    /// sets (see crew-kube).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_template: Option<String>,
    /// The memory a task's pod requests and may use (`kubernetes`, such as `"4Gi"`), or its
    /// job (`slurm`, `--mem`, such as `"4G"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<String>,
    /// The partition of a task's job (`slurm` only; the cluster's default when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    /// The time limit of a task's job (`slurm` only, `--time`: `"2:00:00"`, `"90"` minutes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_limit: Option<String>,
    /// The CPUs of a task's job (`slurm` only, `--cpus-per-task`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<u32>,
    /// The account a task's job is charged to (`slurm` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
    /// The quality of service of a task's job (`slurm` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos: Option<String>,
    /// Options for `srun` besides crew's own (`slurm` only), such as `["--constraint=gpu"]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub srun_args: Vec<String>,
}

/// The name of the Slurm job of a placed task: `squeue` tells crew's jobs apart by it.
pub fn slurm_job_name(task: &PlacedTask) -> String {
    format!("crew-{}-{}", task.run, task.task)
}

impl PlacementDef {
    /// The command that starts the placement's shim for `task`, speaking the shim protocol on
    /// its stdin and stdout. `crew` is this machine's crew program.
    pub fn transport(&self, crew: &str, task: &PlacedTask) -> Vec<String> {
        match self.kind {
            PlacementKind::Kubernetes => {
                // A program of its own beside crew (`crew-kube-transport`).
                let transport = format!("{crew}-kube-transport");
                let mut argv: Vec<String> = [
                    transport.as_str(),
                    "--image",
                    self.image.as_deref().unwrap_or_default(),
                    "--dir",
                    &self.dir,
                    "--crew",
                    self.crew.as_deref().unwrap_or("crew"),
                    "--project",
                    &task.project,
                    "--run",
                    &task.run,
                    "--task",
                    &task.task,
                ]
                .into_iter()
                .map(str::to_owned)
                .collect();
                // The task's caps are its container's limits, over the placement's own.
                let cpu = task
                    .resources
                    .cpus
                    .map(|cpus| format!("{}m", cpus.thousandths()))
                    .or_else(|| self.cpu.clone());
                let memory = task
                    .resources
                    .memory
                    .map(|memory| memory.0.to_string())
                    .or_else(|| self.memory.clone());
                let template =
                    self.pod_template
                        .as_ref()
                        .map(|template| match template.starts_with('/') {
                            true => template.clone(),
                            false => format!("{}/{template}", task.project.trim_end_matches('/')),
                        });
                for (flag, value) in [
                    ("--namespace", &self.namespace),
                    ("--cpu", &cpu),
                    ("--memory", &memory),
                    ("--pod-template", &template),
                ] {
                    if let Some(value) = value {
                        argv.extend([flag.to_owned(), value.clone()]);
                    }
                }
                for name in &task.pass_env {
                    argv.extend(["--pass-env".to_owned(), name.clone()]);
                }
                argv
            }
            PlacementKind::Slurm => {
                let mut argv = vec![
                    "srun".to_owned(),
                    // Its own notes (queued, allocated) would hide crew's, which say why.
                    "--quiet".to_owned(),
                    format!("--job-name={}", slurm_job_name(task)),
                    format!(
                        "--comment=crew project={} run={} task={}",
                        task.project, task.run, task.task
                    ),
                    "--nodes=1".to_owned(),
                    "--ntasks=1".to_owned(),
                    // Nothing of the host's environment goes with the job but what the shim
                    // is told over the connection.
                    "--export=PATH,HOME,USER,LANG".to_owned(),
                ];
                // The task's caps are its job's, over the placement's own; the crew there
                // holds them too, in a cgroup of the node's.
                let cpus = task
                    .resources
                    .cpus
                    .map(|cpus| cpus.thousandths().div_ceil(1000))
                    .or(self.cpus);
                let memory = task
                    .resources
                    .memory
                    .map(|memory| format!("{}M", memory.0.div_ceil(1 << 20)))
                    .or_else(|| self.memory.clone());
                let options = [
                    ("--partition", self.partition.clone()),
                    ("--time", self.time_limit.clone()),
                    ("--cpus-per-task", cpus.map(|cpus| cpus.to_string())),
                    ("--mem", memory),
                    ("--account", self.account.clone()),
                    ("--qos", self.qos.clone()),
                ];
                for (flag, value) in options {
                    if let Some(value) = value {
                        argv.push(format!("{flag}={value}"));
                    }
                }
                argv.extend(self.srun_args.iter().cloned());
                argv.extend([
                    "--".to_owned(),
                    self.crew.clone().unwrap_or_else(|| "crew".to_owned()),
                    "shim".to_owned(),
                    "--stdio".to_owned(),
                    self.dir.clone(),
                ]);
                argv
            }
            PlacementKind::Local => vec![
                crew.to_owned(),
                "shim".to_owned(),
                "--stdio".to_owned(),
                self.dir.clone(),
            ],
            PlacementKind::Ssh => ["ssh", "-T", "-o", "BatchMode=yes"]
                .into_iter()
                .map(str::to_owned)
                .chain(self.ssh_args.iter().cloned())
                .chain([
                    self.host.clone().unwrap_or_default(),
                    "--".to_owned(),
                    self.crew.clone().unwrap_or_else(|| "crew".to_owned()),
                    "shim".to_owned(),
                    "--stdio".to_owned(),
                    self.dir.clone(),
                ])
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ByteSize;

    #[test]
    fn a_kubernetes_task_s_caps_are_its_container_s_limits_over_the_placement_s() {
        let placement: PlacementDef = toml::from_str(
            "kind = \"kubernetes\"\ndir = \"/work\"\nimage = \"crew:1\"\ncpu = \"2\"\nmemory = \"4Gi\"\n",
        )
        .unwrap();
        let task = |resources: Resources| PlacedTask {
            project: "p".into(),
            run: "r".into(),
            task: "t".into(),
            pass_env: Vec::new(),
            resources,
        };
        let flag = |argv: &[String], name: &str| {
            argv.iter()
                .position(|arg| arg == name)
                .map(|at| argv[at + 1].clone())
        };
        let plain = placement.transport("crew", &task(Resources::default()));
        assert_eq!(flag(&plain, "--cpu").as_deref(), Some("2"));
        assert_eq!(flag(&plain, "--memory").as_deref(), Some("4Gi"));
        let capped = placement.transport(
            "crew",
            &task(Resources {
                memory: Some(ByteSize(1 << 30)),
                cpus: Some(crate::config::Cpus::parse(1.5).unwrap()),
                processes: None,
            }),
        );
        assert_eq!(flag(&capped, "--cpu").as_deref(), Some("1500m"));
        assert_eq!(flag(&capped, "--memory").as_deref(), Some("1073741824"));
        // A pod template is the project's file, found wherever the transport runs.
        let templated: PlacementDef = toml::from_str(
            "kind = \"kubernetes\"\ndir = \"/work\"\nimage = \"crew:1\"\npod_template = \"deploy/pod.yaml\"\n",
        )
        .unwrap();
        let argv = templated.transport("crew", &task(Resources::default()));
        assert_eq!(
            flag(&argv, "--pod-template").as_deref(),
            Some("p/deploy/pod.yaml")
        );
    }

    #[test]
    fn a_slurm_task_is_a_named_job_whose_step_is_the_shim_with_its_caps_as_the_job_s() {
        let placement: PlacementDef = toml::from_str(
            "kind = \"slurm\"\ndir = \"~/.crew-shim\"\npartition = \"gpu\"\ntime_limit = \"2:00:00\"\ncpus = 4\nmemory = \"8G\"\naccount = \"lab\"\nsrun_args = [\"--constraint=a100\"]\n",
        )
        .unwrap();
        let task = PlacedTask {
            project: "/home/me/app".into(),
            run: "r1".into(),
            task: "api".into(),
            pass_env: Vec::new(),
            resources: Resources {
                memory: Some(ByteSize(3 << 30)),
                cpus: Some(crate::config::Cpus::parse(1.5).unwrap()),
                processes: None,
            },
        };
        assert_eq!(
            placement.transport("crew", &task),
            [
                "srun",
                "--quiet",
                "--job-name=crew-r1-api",
                "--comment=crew project=/home/me/app run=r1 task=api",
                "--nodes=1",
                "--ntasks=1",
                "--export=PATH,HOME,USER,LANG",
                "--partition=gpu",
                "--time=2:00:00",
                "--cpus-per-task=2",
                "--mem=3072M",
                "--account=lab",
                "--constraint=a100",
                "--",
                "crew",
                "shim",
                "--stdio",
                "~/.crew-shim",
            ]
        );
    }
}
