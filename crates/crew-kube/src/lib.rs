//! crew-kube: `crew-kube-transport` (a program beside `crew`), the transport of a `kubernetes` placement
//! (docs/distributed.md, "Transports"). A placed task's supervisor starts it as it starts
//! `crew shim` or `ssh` for the other kinds; it makes the task's Secret and Job, waits for the
//! pod, and joins its own stdin and stdout to the pod's attach stream, so that the host's driver
//! speaks the shim protocol with `crew shim` in the container.
//!
//! - The Job: one pod, `restartPolicy: Never` and `backoffLimit: 0` (crew, not Kubernetes,
//!   decides what a failed task does); the container `shim` runs the user's image with
//!   `crew shim --stdio DIR`, stdin open once (`stdinOnce`: the shim sees its input end when
//!   the attach does); resources as the placement says. A pod template of the user's
//!   (`pod_template`) is the pod's base; crew's container, labels and the `restricted` Pod
//!   Security settings ([`restrict`]) win over it.
//! - Labels: `crew.dev/project` (the project's folder name and a hash of its id), `crew.dev/run`,
//!   `crew.dev/task`, on the Job, its pod and the Secret.
//! - The Secret holds the values of what the agent's `pass_env` names, from this transport's
//!   environment: the pod gets them through `envFrom`, so they never cross the attach stream.
//!   It is owned by the Job (an owner reference), so deleting the Job deletes it.
//! - When the stream ends, the transport exits as the container did; a Job whose shim
//!   succeeded is deleted (and its Secret with it), a failed one is kept for `kubectl` to
//!   look at (`ttlSecondsAfterFinished` clears it after a day).
//! - What crew needs of a namespace, and nothing more, is [`rbac`]: the Role and RoleBinding
//!   docs/placements.md gives a platform team (a test keeps the two the same).

// The kernel is asked for everything through crew-sandbox, the one crate with `unsafe`.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::io::Write as _;

use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, EnvFromSource, Pod, PodSpec, PodTemplateSpec, ResourceRequirements,
    SeccompProfile, Secret, SecretEnvSource,
};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
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
    /// The user's pod template (YAML or JSON): the pod the Job runs, under crew's restricted
    /// settings.
    #[arg(long)]
    pub pod_template: Option<String>,
}

/// Reads the user's pod template: a `PodTemplateSpec` (`metadata`, `spec`) in YAML or JSON;
/// the error names the file and what is wrong.
pub fn read_pod_template(path: &str) -> Result<PodTemplateSpec, KubeTransportError> {
    let text = std::fs::read_to_string(path).map_err(|error| {
        KubeTransportError(format!("cannot read the pod template {path}: {error}"))
    })?;
    serde_norway::from_str(&text).map_err(|error| {
        KubeTransportError(format!(
            "the pod template {path} is not a pod template (`metadata` and `spec` of a pod, as a Job's `spec.template` holds them): {error}"
        ))
    })
}

/// The task's Secret (holding `env`) and its Job, as they are created: its pod is the user's
/// `template` (nothing when none) with crew's container and labels, under the restricted
/// settings crew always sets ([`restrict`]).
pub fn task_objects(
    args: &KubeTransportArgs,
    env: &BTreeMap<String, String>,
    template: Option<PodTemplateSpec>,
) -> (Secret, Job) {
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
    let template = template.unwrap_or_default();
    let mut spec = template.spec.unwrap_or_default();
    // The user's container named `shim`, if any, is the base of crew's (its mounts, its
    // environment); what crew sets of it wins.
    let theirs = spec
        .containers
        .iter()
        .position(|container| container.name == "shim")
        .map(|at| spec.containers.remove(at))
        .unwrap_or_default();
    let mut env_from = theirs.env_from.clone().unwrap_or_default();
    env_from.push(EnvFromSource {
        secret_ref: Some(SecretEnvSource {
            name: name.clone(),
            optional: Some(false),
        }),
        ..EnvFromSource::default()
    });
    let container = Container {
        name: "shim".to_owned(),
        image: Some(args.image.clone()),
        command: Some(vec![
            args.crew.clone(),
            "shim".to_owned(),
            "--stdio".to_owned(),
            args.dir.clone(),
        ]),
        args: None,
        stdin: Some(true),
        stdin_once: Some(true),
        tty: Some(false),
        env_from: Some(env_from),
        resources: match resources.is_empty() {
            true => theirs.resources.clone(),
            false => Some(ResourceRequirements {
                requests: Some(resources.clone()),
                limits: Some(resources),
                ..ResourceRequirements::default()
            }),
        },
        ..theirs
    };
    spec.containers.insert(0, container);
    spec.restart_policy = Some("Never".to_owned());
    restrict(&mut spec);
    let mut pod_labels = template
        .metadata
        .as_ref()
        .and_then(|meta| meta.labels.clone())
        .unwrap_or_default();
    pod_labels.extend(labels.clone());
    let job = Job {
        metadata: meta(&name),
        spec: Some(JobSpec {
            backoff_limit: Some(0),
            ttl_seconds_after_finished: Some(24 * 3600),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    annotations: template.metadata.and_then(|meta| meta.annotations),
                    ..ObjectMeta::default()
                }),
                spec: Some(spec),
            },
            ..JobSpec::default()
        }),
        ..Job::default()
    };
    (secret, job)
}

/// The settings crew always sets on a task's pod, whatever its template says — Kubernetes'
/// `restricted` Pod Security Standard: no service account token, no host namespaces, and every
/// container (init containers too) as a non-root user without privilege, privilege escalation
/// or capabilities, under the runtime's default seccomp profile.
pub fn restrict(spec: &mut PodSpec) {
    spec.automount_service_account_token = Some(false);
    spec.host_network = Some(false);
    spec.host_pid = Some(false);
    spec.host_ipc = Some(false);
    let pod = spec.security_context.get_or_insert_with(Default::default);
    pod.run_as_non_root = Some(true);
    pod.seccomp_profile = Some(SeccompProfile {
        type_: "RuntimeDefault".to_owned(),
        localhost_profile: None,
    });
    let containers = spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten());
    for container in containers {
        let context = container
            .security_context
            .get_or_insert_with(Default::default);
        context.run_as_non_root = Some(true);
        context.privileged = Some(false);
        context.allow_privilege_escalation = Some(false);
        context.capabilities = Some(Capabilities {
            drop: Some(vec!["ALL".to_owned()]),
            add: None,
        });
        context.seccomp_profile = Some(SeccompProfile {
            type_: "RuntimeDefault".to_owned(),
            localhost_profile: None,
        });
        if context.run_as_user == Some(0) {
            context.run_as_user = None;
        }
    }
    if pod.run_as_user == Some(0) {
        pod.run_as_user = None;
    }
}

/// What crew needs of a namespace to run its tasks there, and nothing more: the Role (Jobs
/// made and deleted; their pods read and attached to; the tasks' Secrets made, owned and
/// deleted) and its binding to `service_account`, as a platform team applies them.
pub fn rbac(namespace: &str, service_account: &str) -> (Role, RoleBinding) {
    let rule = |group: &str, resources: &[&str], verbs: &[&str]| PolicyRule {
        api_groups: Some(vec![group.to_owned()]),
        resources: Some(resources.iter().map(|r| (*r).to_owned()).collect()),
        verbs: verbs.iter().map(|v| (*v).to_owned()).collect(),
        ..PolicyRule::default()
    };
    let meta = ObjectMeta {
        name: Some("crew-placement".to_owned()),
        namespace: Some(namespace.to_owned()),
        labels: Some([("app.kubernetes.io/managed-by".to_owned(), "crew".to_owned())].into()),
        ..ObjectMeta::default()
    };
    let role = Role {
        metadata: meta.clone(),
        rules: Some(vec![
            rule("batch", &["jobs"], &["create", "delete"]),
            rule("", &["pods"], &["get", "list"]),
            rule("", &["pods/attach"], &["create", "get"]),
            rule("", &["secrets"], &["create", "delete", "patch"]),
        ]),
    };
    let binding = RoleBinding {
        metadata: meta,
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".to_owned(),
            kind: "Role".to_owned(),
            name: "crew-placement".to_owned(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".to_owned(),
            name: service_account.to_owned(),
            namespace: Some(namespace.to_owned()),
            ..Subject::default()
        }]),
    };
    (role, binding)
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
    let template = args
        .pod_template
        .as_deref()
        .map(read_pod_template)
        .transpose()?;
    let (secret, job) = task_objects(
        &args,
        &crew_live::agent::env::passed_values(&args.pass_env),
        template,
    );
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
            pod_template: None,
        }
    }

    #[test]
    fn a_task_becomes_a_job_of_one_pod_and_a_secret_labelled_for_its_project_run_and_task() {
        let env: BTreeMap<String, String> =
            [("ANTHROPIC_API_KEY".to_owned(), "sk-test".to_owned())].into();
        let (secret, job) = task_objects(&args(), &env, None);
        let both = serde_json::json!({ "secret": secret, "job": job });
        insta::assert_snapshot!(serde_json::to_string_pretty(&both).unwrap());
    }

    /// A platform team's template: where pods go, a volume for the clones, a sidecar — and what
    /// a template may not loosen (host network, privilege, root, the service account's token).
    const TEMPLATE: &str = r#"
metadata:
  labels:
    team: payments
    crew.dev/task: forged
  annotations:
    cluster-autoscaler.kubernetes.io/safe-to-evict: "false"
spec:
  serviceAccountName: agents
  automountServiceAccountToken: true
  hostNetwork: true
  nodeSelector:
    pool: agents
  tolerations:
    - key: dedicated
      value: agents
      effect: NoSchedule
  securityContext:
    runAsUser: 0
    fsGroup: 2000
  volumes:
    - name: clones
      emptyDir: {}
  containers:
    - name: shim
      command: ["sh", "-c", "rm -rf /"]
      volumeMounts:
        - name: clones
          mountPath: /work/crew-shim
      securityContext:
        privileged: true
        capabilities:
          add: ["SYS_ADMIN"]
    - name: proxy-sidecar
      image: registry.example/egress:2
"#;

    #[test]
    fn a_user_s_pod_template_is_merged_under_the_restricted_settings_crew_always_sets() {
        let path =
            std::env::temp_dir().join(format!("crew-kube-template-{}.yaml", std::process::id()));
        std::fs::write(&path, TEMPLATE).unwrap();
        let template = read_pod_template(path.to_str().unwrap()).unwrap();
        std::fs::remove_file(&path).unwrap();
        let (_, job) = task_objects(&args(), &BTreeMap::new(), Some(template));
        let pod = job.spec.unwrap().template;
        let spec = pod.spec.clone().unwrap();
        // Crew's: its command, its labels, and the restricted settings on every container.
        assert_eq!(spec.containers[0].command.as_ref().unwrap()[1], "shim");
        assert_eq!(spec.automount_service_account_token, Some(false));
        assert_eq!(spec.host_network, Some(false));
        for container in &spec.containers {
            let context = container.security_context.as_ref().unwrap();
            assert_eq!(context.privileged, Some(false), "{}", container.name);
            assert_eq!(context.allow_privilege_escalation, Some(false));
            assert_eq!(context.run_as_non_root, Some(true));
            let capabilities = context.capabilities.as_ref().unwrap();
            assert_eq!(capabilities.drop.as_deref(), Some(&["ALL".to_owned()][..]));
            assert_eq!(capabilities.add, None);
        }
        // The user's: where it runs, its volume, its mounts, its sidecar.
        insta::assert_snapshot!(serde_norway::to_string(&pod).unwrap());
    }

    #[test]
    fn a_template_that_is_no_pod_template_is_refused_naming_its_file() {
        let path = std::env::temp_dir().join(format!("crew-kube-bad-{}.yaml", std::process::id()));
        std::fs::write(&path, "spec:\n  containers: 3\n").unwrap();
        let error = read_pod_template(path.to_str().unwrap())
            .unwrap_err()
            .to_string();
        std::fs::remove_file(&path).unwrap();
        assert!(
            error.contains(path.to_str().unwrap()) && error.contains("is not a pod template"),
            "{error}"
        );
    }

    #[test]
    fn the_role_crew_needs_is_what_the_docs_give_a_platform_team() {
        let (role, binding) = rbac("agents", "crew");
        let yaml = format!(
            "{}---\n{}",
            serde_norway::to_string(&role).unwrap(),
            serde_norway::to_string(&binding).unwrap()
        );
        insta::assert_snapshot!(yaml);
        let docs = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../docs/placements.md"
        ))
        .unwrap();
        assert!(
            docs.contains(&yaml),
            "docs/placements.md gives the Role and RoleBinding as rbac() makes them:\n{yaml}"
        );
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
