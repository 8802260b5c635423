//! crew-kube: `crew-kube-transport` (a program beside `crew`), the transport of a `kubernetes` placement
//! (docs/distributed.md, "Transports"). A placed task's supervisor starts it as it starts
//! `crew shim` or `ssh` for the other kinds; it makes the task's Secret and Job, waits for the
//! pod, and joins its own stdin and stdout to the pod's attach stream, so that the host's driver
//! speaks the shim protocol with `crew shim` in the container.
//!
//! - The Job: one pod, `restartPolicy: Never` and `backoffLimit: 0` (crew, not Kubernetes,
//!   decides what a failed task does); the container `shim` runs the user's image with
//!   `crew shim --stdio DIR`, stdin open once (`stdinOnce`: the shim sees its input end when
//!   the attach does); resources as the placement says.
//! - Labels: `crew.dev/project` (the project's folder name and a hash of its id), `crew.dev/run`,
//!   `crew.dev/task`, on the Job, its pod and the Secret.
//! - The Secret holds the values of what the agent's `pass_env` names, from this transport's
//!   environment: the pod gets them through `envFrom`, so they never cross the attach stream.
//!   It is owned by the Job (an owner reference), so deleting the Job deletes it.
//! - When the stream ends, the transport exits as the container did; a Job whose shim
//!   succeeded is deleted (and its Secret with it), a failed one is kept for `kubectl` to
//!   look at (`ttlSecondsAfterFinished` clears it after a day).

// The kernel is asked for everything through crew-sandbox, the one crate with `unsafe`.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::io::Write as _;

use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    Container, EnvFromSource, Pod, PodSpec, PodTemplateSpec, ResourceRequirements, Secret,
    SecretEnvSource,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// How the transport ended, when nothing went wrong on its side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The shim exited 0: the Job is deleted.
    Success,
    /// The shim failed or did not end: the Job is kept for its logs.
    TaskFailed,
}

/// What kept the transport from running the task's pod.
#[derive(Debug, thiserror::Error)]
#[error("kubernetes: {0}")]
pub struct KubeTransportError(String);

impl Outcome {
    /// The exit code the placed task's supervisor reads: 0, or 1 for a failed task.
    pub fn exit_code(self) -> u8 {
        match self {
            Outcome::Success => 0,
            Outcome::TaskFailed => 1,
        }
    }
}

/// The transport of a kubernetes placement (started by crew for a placed task).
#[derive(Debug, Clone, clap::Args)]
pub struct KubeTransportArgs {
    /// The image of the task's pod.
    #[arg(long)]
    pub image: String,
    /// Where `crew shim` keeps its clones in the container.
    #[arg(long)]
    pub dir: String,
    /// The crew program in the image.
    #[arg(long)]
    pub crew: String,
    /// The project's id.
    #[arg(long)]
    pub project: String,
    /// The run.
    #[arg(long)]
    pub run: String,
    /// The task.
    #[arg(long)]
    pub task: String,
    /// The Jobs' namespace; the client configuration's when absent.
    #[arg(long)]
    pub namespace: Option<String>,
    /// The CPU the pod requests and may use.
    #[arg(long)]
    pub cpu: Option<String>,
    /// The memory the pod requests and may use.
    #[arg(long)]
    pub memory: Option<String>,
    /// A variable whose value (from this process's environment) goes into the task's Secret
    /// (a trailing `*` matches a prefix).
    #[arg(long = "pass-env")]
    pub pass_env: Vec<String>,
}

/// The task's Secret (holding `env`) and its Job, as they are created.
pub fn task_objects(args: &KubeTransportArgs, env: &BTreeMap<String, String>) -> (Secret, Job) {
    let name = object_name(&args.run, &args.task);
    let labels: BTreeMap<String, String> = [
        ("app.kubernetes.io/managed-by", "crew".to_owned()),
        ("crew.dev/project", project_label(&args.project)),
        ("crew.dev/run", label_value(&args.run)),
        ("crew.dev/task", label_value(&args.task)),
    ]
    .into_iter()
    .map(|(key, value)| (key.to_owned(), value))
    .collect();
    let meta = |name: &str| ObjectMeta {
        name: Some(name.to_owned()),
        namespace: args.namespace.clone(),
        labels: Some(labels.clone()),
        ..ObjectMeta::default()
    };
    let secret = Secret {
        metadata: meta(&name),
        type_: Some("Opaque".to_owned()),
        string_data: Some(env.clone()),
        ..Secret::default()
    };
    let resources: BTreeMap<String, Quantity> = [("cpu", &args.cpu), ("memory", &args.memory)]
        .into_iter()
        .filter_map(|(key, value)| Some((key.to_owned(), Quantity(value.clone()?))))
        .collect();
    let container = Container {
        name: "shim".to_owned(),
        image: Some(args.image.clone()),
        command: Some(vec![
            args.crew.clone(),
            "shim".to_owned(),
            "--stdio".to_owned(),
            args.dir.clone(),
        ]),
        stdin: Some(true),
        stdin_once: Some(true),
        tty: Some(false),
        env_from: Some(vec![EnvFromSource {
            secret_ref: Some(SecretEnvSource {
                name: name.clone(),
                optional: Some(false),
            }),
            ..EnvFromSource::default()
        }]),
        resources: (!resources.is_empty()).then(|| ResourceRequirements {
            requests: Some(resources.clone()),
            limits: Some(resources),
            ..ResourceRequirements::default()
        }),
        ..Container::default()
    };
    let job = Job {
        metadata: meta(&name),
        spec: Some(JobSpec {
            backoff_limit: Some(0),
            ttl_seconds_after_finished: Some(24 * 3600),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels.clone()),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    restart_policy: Some("Never".to_owned()),
                    containers: vec![container],
                    ..PodSpec::default()
                }),
            },
            ..JobSpec::default()
        }),
        ..Job::default()
    };
    (secret, job)
}

/// `crew-<run>-<task>`, as a Kubernetes object name allows (lowercase letters, digits and
/// `-`, at most 63 characters), with a hash of both when anything had to change.
pub fn object_name(run: &str, task: &str) -> String {
    let wanted = format!("crew-{run}-{task}");
    let mut name: String = wanted
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '-') => c,
            _ => '-',
        })
        .collect();
    if name != wanted || name.len() > 63 {
        let hash = format!("{:08x}", crew_core::ids::stable_hash(&wanted) as u32);
        name.truncate(63 - 9);
        name = format!("{}-{hash}", name.trim_end_matches('-'));
    }
    name
}

/// A label value for the project: its folder's name and a hash of its whole id.
fn project_label(project: &str) -> String {
    let folder = project
        .rsplit('/')
        .find(|part| !part.is_empty())
        .unwrap_or("project");
    label_value(&format!(
        "{folder}-{:016x}",
        crew_core::ids::stable_hash(project)
    ))
}

/// `value` as a label value allows (letters, digits, `-`, `_`, `.`; at most 63; alphanumeric
/// at both ends).
fn label_value(value: &str) -> String {
    let cleaned: String = value
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '-'
            }
        })
        .rev()
        .take(63)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    cleaned
        .trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_owned()
}

/// Runs the task's pod and relays the shim protocol over its attach stream (see the crate's
/// documentation).
pub async fn cmd_kube_transport(args: KubeTransportArgs) -> Result<Outcome, KubeTransportError> {
    use kube::api::{Api, AttachParams, DeleteParams, ListParams, Patch, PatchParams, PostParams};

    let failed = |what: &str| {
        let what = what.to_owned();
        move |error: kube::Error| KubeTransportError(format!("{what}: {error}"))
    };
    let client = kube::Client::try_default().await.map_err(failed(
        "no cluster to reach (KUBECONFIG, ~/.kube/config or in-cluster)",
    ))?;
    let namespace = args
        .namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_owned());
    let (secret, job) = task_objects(&args, &crew_live::agent::env::passed_values(&args.pass_env));
    let name = object_name(&args.run, &args.task);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let jobs: Api<Job> = Api::namespaced(client.clone(), &namespace);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .map_err(failed("could not create the task's Secret"))?;
    let created = match jobs.create(&PostParams::default(), &job).await {
        Ok(created) => created,
        Err(error) => {
            // Nothing owns it yet: it goes here.
            let _ = secrets.delete(&name, &DeleteParams::default()).await;
            return Err(failed("could not create the task's Job")(error));
        }
    };
    let owner = serde_json::json!({
        "metadata": { "ownerReferences": [{
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": name,
            "uid": created.metadata.uid.unwrap_or_default(),
        }]}
    });
    secrets
        .patch(&name, &PatchParams::default(), &Patch::Merge(&owner))
        .await
        .map_err(failed("could not make the Job own its Secret"))?;
    // A standard error that takes no writes loses the line, never the placed task.
    let _ = writeln!(
        std::io::stderr(),
        "kubernetes: job {namespace}/{name} created; waiting for its pod"
    );

    // Its pod, once it runs (or why it never will).
    let selector = ListParams::default().labels(&format!("job-name={name}"));
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(600);
    let pod = loop {
        let listed = pods
            .list(&selector)
            .await
            .map_err(failed("could not list the Job's pods"))?;
        if let Some(pod) = listed.items.into_iter().next() {
            let phase = pod
                .status
                .as_ref()
                .and_then(|status| status.phase.clone())
                .unwrap_or_default();
            match phase.as_str() {
                "Running" => break pod,
                "Failed" | "Succeeded" => {
                    return Err(KubeTransportError(format!(
                        "the pod of job {namespace}/{name} ended before crew could reach it ({phase}); `kubectl logs job/{name} -n {namespace}` says why"
                    )));
                }
                _ => {}
            }
        }
        if tokio::time::Instant::now() > deadline {
            return Err(KubeTransportError(format!(
                "the pod of job {namespace}/{name} did not start within 10 minutes; `kubectl describe job/{name} -n {namespace}` says why"
            )));
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    };
    let pod_name = pod.metadata.name.unwrap_or_default();
    let mut attached = pods
        .attach(
            &pod_name,
            &AttachParams {
                container: Some("shim".to_owned()),
                stdin: true,
                stdout: true,
                stderr: false,
                tty: false,
                ..AttachParams::default()
            },
        )
        .await
        .map_err(failed("could not attach to the pod"))?;
    let mut remote_in = attached.stdin().expect("attached with stdin");
    let mut remote_out = attached.stdout().expect("attached with stdout");
    let input = tokio::spawn(async move {
        let mut stdin = tokio::io::stdin();
        // Our input ended or the stream broke: either way the container's input is over.
        let _ = tokio::io::copy(&mut stdin, &mut remote_in).await;
        // Our input ended: so does the container's (stdinOnce), and the shim finishes.
        let _ = tokio::io::AsyncWriteExt::shutdown(&mut remote_in).await;
    });
    let mut stdout = tokio::io::stdout();
    // The stream ended or broke; the container's exit code below tells how it went.
    let _ = tokio::io::copy(&mut remote_out, &mut stdout).await;
    input.abort();
    // The attach is over either way; its status is the container's, read below.
    let _ = attached.join().await;

    // How the shim ended, as its container says.
    let mut code = None;
    for _ in 0..60 {
        let pod = pods
            .get(&pod_name)
            .await
            .map_err(failed("could not read the pod"))?;
        code = pod
            .status
            .and_then(|status| status.container_statuses)
            .and_then(|statuses| statuses.into_iter().next())
            .and_then(|status| status.state)
            .and_then(|state| state.terminated)
            .map(|terminated| terminated.exit_code);
        if code.is_some() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    match code {
        Some(0) => {
            // A Job not deleted is deleted by its TTL a day later.
            let _ = jobs.delete(&name, &DeleteParams::background()).await;
            Ok(Outcome::Success)
        }
        other => {
            // Nowhere left to say it: the exit code still tells.
            let _ = writeln!(
                std::io::stderr(),
                "kubernetes: job {namespace}/{name} is kept ({}); `kubectl logs job/{name} -n {namespace}`",
                other.map_or_else(
                    || "its shim did not end".to_owned(),
                    |code| format!("its shim exited with {code}")
                )
            );
            Ok(Outcome::TaskFailed)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> KubeTransportArgs {
        KubeTransportArgs {
            image: "registry.example/agents:1".to_owned(),
            dir: "/work/crew-shim".to_owned(),
            crew: "/usr/local/bin/crew".to_owned(),
            project: "/home/ada/projects/payments".to_owned(),
            run: "k3x9a2b1-0mx4r8t2p".to_owned(),
            task: "Api_v2".to_owned(),
            namespace: Some("agents".to_owned()),
            cpu: Some("2".to_owned()),
            memory: Some("4Gi".to_owned()),
            pass_env: vec!["ANTHROPIC_API_KEY".to_owned()],
        }
    }

    #[test]
    fn a_task_becomes_a_job_of_one_pod_and_a_secret_labelled_for_its_project_run_and_task() {
        let env: BTreeMap<String, String> =
            [("ANTHROPIC_API_KEY".to_owned(), "sk-test".to_owned())].into();
        let (secret, job) = task_objects(&args(), &env);
        let both = serde_json::json!({ "secret": secret, "job": job });
        insta::assert_snapshot!(serde_json::to_string_pretty(&both).unwrap());
    }

    #[test]
    fn object_names_and_labels_are_what_kubernetes_accepts() {
        assert_eq!(object_name("r1", "api"), "crew-r1-api");
        let odd = object_name("r1", "Api_v2.x");
        assert!(odd.starts_with("crew-r1-api-v2-x-"), "{odd}");
        let long = object_name("r1", &"t".repeat(100));
        assert!(long.len() <= 63, "{long}");
        assert_ne!(long, object_name("r1", &"t".repeat(99)));
        assert!(project_label(&format!("/{}", "p".repeat(100))).len() <= 63);
        assert_eq!(label_value("-x-"), "x");
    }
}
