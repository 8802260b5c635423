//! Starting an agent: its confinement planned, its temp dir and log made, its process
//! started under a warden (`crew_sandbox::spawn`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use camino::Utf8PathBuf;
use crew_core::config::{Protocol, SteerMode, fill_template};
use crew_core::env_vars;
use crew_core::model::{SandboxRecord, SandboxState, Timestamp};
use crew_sandbox::procscan;
use crew_sandbox::spawn::{AgentInput, AgentIo, LeftoverCount, WardedCommand, Warden};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::agent::acp::{AcpLink, AcpStart};
use crate::agent::confine::{confinement, private_temp_dir};
use crate::agent::credentials::{self, Reach};
use crate::agent::env::agent_env;
use crate::agent::error::SpawnAgentError;
use crate::agent::events::OutputStream;
use crate::agent::output::{LogWriter, OutputSink, OutputTail, drain};
use crate::agent::protocol::ProtocolEvent;
use crate::agent::refusals::Refusals;
use crate::agent::spec::{AgentSpec, Launcher};

/// How long a steering message may wait for the agent to read its stdin.
pub(super) const STEER_TIMEOUT: Duration = Duration::from_secs(5);

/// A process of the agent, running.
pub(super) struct Running {
    pub(super) child: Warden,
    pub(super) pid: u32,
    pub(super) stdin: Option<AgentInput>,
    pub(super) readers: Vec<JoinHandle<()>>,
    /// What the agent's protocol says: sessions, ends of turns (see `OutputSink::supervisor`).
    pub(super) protocol: mpsc::UnboundedReceiver<ProtocolEvent>,
    /// The client connection of an `acp` agent, which holds its stdin.
    pub(super) acp: Option<AcpLink>,
    pub(super) placed: Option<crate::agent::placed::PlacedLink>,
    pub(super) sandbox: SandboxRecord,
    /// The writes the sandbox refused, as the agent said them (a confined agent's).
    pub(super) refusals: Option<Arc<Mutex<Refusals>>>,
    /// How many processes the warden killed after the agent exited.
    pub(super) leftovers: LeftoverCount,
    /// Its proxy (`network = "proxy"`), serving as long as this process lives.
    pub(super) proxy: Option<crew_sandbox::proxy::Proxy>,
    /// The cgroup of its caps: read when it ended, then removed.
    pub(super) cgroup: Option<crew_sandbox::caps::AgentGroup>,
    /// Its own connection to its host, served as long as this process lives.
    pub(super) _own_connection: Option<Box<dyn std::any::Any + Send>>,
    /// The agent's private temp dir (its `TMPDIR`), removed when this process is done.
    pub(super) _temp_dir: crew_sandbox::temp_dirs::AgentTempDir,
    /// A placed task's transport ended before the task started there: once its output is
    /// read to the end, what it said last goes into the reason.
    pub(super) lost_before_start: bool,
    /// The agent's session is over (an `acp` agent's last turn ended with nothing more to
    /// say; a `claude-stream-json` agent gave its result): it should exit.
    pub(super) session_over: bool,
}

/// Builds and spawns one process of the agent: the `command` template, or the `resume`
/// template when resuming; never through a shell.
pub(super) async fn launch(
    spec: &AgentSpec,
    launcher: &Launcher,
    tail: &Arc<Mutex<OutputTail>>,
    resume_message: Option<&str>,
    session_id: Option<&str>,
    session_cost: Option<f64>,
) -> Result<Running, SpawnAgentError> {
    let definition = &spec.definition;
    let template = match (resume_message, &definition.resume) {
        (Some(_), Some(resume)) => resume,
        _ => &definition.command,
    };
    let uses = |placeholder: &str| {
        template
            .iter()
            .any(|arg| crew_core::config::placeholders(arg).any(|name| name == placeholder))
    };
    if uses("session_id") && session_id.is_none() {
        return Err(SpawnAgentError::NoSession {
            agent_id: spec.agent_id.clone(),
        });
    }
    let acp = definition.protocol == Protocol::Acp;
    let shim = definition.protocol == Protocol::Shim;
    // A stream-json agent takes what it is asked as its first input message, unless its
    // template passes it as an argument.
    let first_message = match resume_message {
        _ if definition.protocol != Protocol::ClaudeStreamJson => None,
        None => (!uses("prompt")).then_some(spec.prompt.as_str()),
        Some(message) => (!uses("message") && !message.is_empty()).then_some(message),
    };
    let dir = spec.dir.as_str();
    let run_id = spec.agent_id.run_id().as_str();
    let task_id = spec.agent_id.task_id().as_str();
    let message = resume_message.unwrap_or("");
    let values = [
        ("prompt", spec.prompt.as_str()),
        ("workspace", dir),
        ("run_id", run_id),
        ("task_id", task_id),
        ("message", message),
        ("session_id", session_id.unwrap_or("")),
    ];
    let mut argv: Vec<String> = template
        .iter()
        .map(|arg| fill_template(arg, &values))
        .collect();
    if argv.is_empty() {
        return Err(SpawnAgentError::EmptyCommand {
            agent_id: spec.agent_id.clone(),
        });
    }
    if !spec.dir.is_dir() {
        return Err(SpawnAgentError::MissingDir {
            agent_id: spec.agent_id.clone(),
            dir: spec.dir.clone(),
        });
    }
    // The workspace crew made, and no other: a level of its path swapped for a link while it
    // was made (or since) would start the agent, confined or not, wherever the link leads.
    // Its directory is held from this check on and entered by that handle, so a swap after
    // it leads the agent nowhere else either.
    let mut held_dir = None;
    if let (Some(identity), Some(root)) = (spec.sandbox.workspace, spec.sandbox.write.first()) {
        let within = if spec.dir.starts_with(root) {
            &spec.dir
        } else {
            root
        };
        match identity.open_checked(root, within) {
            Ok(handle) => held_dir = Some(handle).filter(|_| *within == spec.dir),
            Err(reason) => {
                return Err(SpawnAgentError::NotItsWorkspace {
                    agent_id: spec.agent_id.clone(),
                    reason,
                });
            }
        }
    }
    let mut crew_vars = vec![
        (env_vars::CREW_RUN_ID, run_id.to_owned()),
        (env_vars::CREW_TASK_ID, task_id.to_owned()),
        (env_vars::CREW_AGENT_ID, spec.agent_id.to_string()),
        (env_vars::CREW_WORKSPACE, dir.to_owned()),
        (env_vars::CREW_PROJECT_ROOT, spec.workspace.to_string()),
    ];
    if let Some(socket) = &spec.socket {
        crew_vars.push((env_vars::CREW_SOCKET, socket.to_string()));
    }
    if let Some(message) = resume_message {
        crew_vars.push((env_vars::CREW_MESSAGE, message.to_owned()));
    }
    let temp_dir = private_temp_dir(spec)?;
    let temp_path = Utf8PathBuf::from_path_buf(temp_dir.path().to_owned()).map_err(|path| {
        SpawnAgentError::TempDir {
            agent_id: spec.agent_id.clone(),
            source: std::io::Error::other(format!("{} is not UTF-8", path.display())),
        }
    })?;
    crew_vars.push((env_vars::TMPDIR, temp_path.to_string()));
    crew_vars.push((env_vars::XDG_RUNTIME_DIR, temp_path.to_string()));
    for (name, value) in &spec.workspace_env {
        crew_vars.push((name.as_str(), value.clone()));
    }
    let own_connection = launcher.own_connections.get().is_some();
    let (mut sandbox, caches) =
        confinement(spec, launcher, temp_path, own_connection).map_err(|source| {
            SpawnAgentError::Sandbox {
                agent_id: spec.agent_id.clone(),
                source,
            }
        })?;
    // With a connection of its own, that is the socket it knows.
    if let Some(name) = sandbox
        .namespace
        .as_ref()
        .and_then(|namespace| namespace.control.as_ref())
    {
        crew_vars.retain(|(variable, _)| *variable != env_vars::CREW_SOCKET);
        crew_vars.push((env_vars::CREW_SOCKET, format!("@{name}")));
    }
    // Confined by crew, the program's own sandbox stands down as its definition says, and
    // what it starts knows it is confined already.
    let confined = sandbox.record.state == SandboxState::Enforced;
    if confined {
        argv.extend(definition.sandbox.confined.args.iter().cloned());
        sandbox.record.stood_down = definition.sandbox.confined.given();
        crew_vars.push((
            env_vars::CREW_SANDBOX,
            SandboxState::Enforced.as_str().to_owned(),
        ));
    }
    if sandbox.proxy.is_some() {
        crew_vars.extend(
            crew_sandbox::proxy::PROXY_VARS
                .iter()
                .map(|(name, value)| (*name, (*value).to_owned())),
        );
    }
    // Its credentials: by reference behind its proxy, set over whatever its definition passes.
    let reach = if sandbox.proxy.is_some() {
        Reach::Proxy
    } else if confined && sandbox.record.network == crew_core::config::NetworkMode::None {
        Reach::Nothing
    } else {
        Reach::Direct
    };
    let given = credentials::give(definition, &launcher.env, reach);
    argv.extend(given.args.iter().cloned());
    crew_vars.extend(
        given
            .env
            .iter()
            .map(|(name, value)| (name.as_str(), value.clone())),
    );
    sandbox.record.by_reference = given.by_reference;
    sandbox.record.held_by_agent = given.held_by_agent;
    let (program, args) = argv
        .split_first()
        .ok_or_else(|| SpawnAgentError::EmptyCommand {
            agent_id: spec.agent_id.clone(),
        })?;
    let steerable = definition.steer != SteerMode::None || acp;
    let mut warded = WardedCommand::new(
        program,
        args,
        agent_env(
            &launcher.env,
            definition,
            confined.then(|| caches.as_ref().map_or(&[][..], |caches| &caches.env[..])),
            &crew_vars,
            &spec.git_config,
        ),
        &procscan::agent_marker(&spec.agent_id),
        sandbox.ruleset,
        sandbox.namespace.as_ref(),
        sandbox.proxy.map(|lists| crew_sandbox::proxy::Rules {
            lists,
            log: spec.network_log.clone(),
            credentials: given.held,
        }),
    )
    .map_err(|source| SpawnAgentError::Spawn {
        agent_id: spec.agent_id.clone(),
        program: program.clone(),
        source,
    })?;
    // Its caps: a cgroup of its own, which it joins before anything else.
    let cgroup = caps_group(spec, &mut sandbox.record)?;
    if let Some(group) = &cgroup {
        let procs = group.procs().and_then(|procs| warded.caps(procs).map(drop));
        if let Err(source) = procs {
            group.remove();
            return Err(SpawnAgentError::Caps {
                agent_id: spec.agent_id.clone(),
                reason: source.to_string(),
            });
        }
    }
    match held_dir {
        Some(handle) => warded.current_dir_handle(handle),
        None => warded.current_dir(&spec.dir),
    };
    warded.stdio(
        if steerable {
            AgentIo::Piped
        } else {
            AgentIo::Null
        },
        AgentIo::Piped,
        AgentIo::Piped,
    );

    let mut log = open_log(spec)?;
    if log.written() > 0 {
        // A resume or a follow-up appends to the same log: say where the new start begins. A
        // log that cannot be written to fails the agent's own output first, with its error.
        let _ = log.write(
            format!(
                "\n[crew: the agent started again at {}]\n",
                Timestamp::now()
            )
            .as_bytes(),
        );
    }
    let crew_sandbox::spawn::Spawned {
        mut child,
        leftovers,
        proxy,
        own_connection,
    } = launcher
        .spawner
        .spawn(warded)
        .await
        .map_err(|source| SpawnAgentError::Spawn {
            agent_id: spec.agent_id.clone(),
            program: program.clone(),
            source,
        })?;
    let pid = child.id().ok_or_else(|| SpawnAgentError::Spawn {
        agent_id: spec.agent_id.clone(),
        program: program.clone(),
        source: std::io::Error::other("the process exited before its pid was known"),
    })?;
    // Served as this agent (its warden's pid) for as long as this process lives.
    let own_connection = own_connection.and_then(|listener| {
        launcher
            .own_connections
            .get()
            .map(|connections| connections.serve(listener, pid))
    });
    let (protocol_tx, protocol_rx) = mpsc::unbounded_channel();
    let (acp_lines, acp_incoming) = mpsc::unbounded_channel();
    let sink = OutputSink {
        agent_id: spec.agent_id.clone(),
        log: Arc::new(Mutex::new(Some(log))),
        tail: tail.clone(),
        events: launcher.events.clone(),
        protocol: definition.protocol,
        supervisor: (definition.steer == SteerMode::StdinJson
            || definition.protocol != Protocol::Lines)
            .then_some(protocol_tx),
        acp: (acp || shim).then_some(acp_lines),
        refusals: confined
            .then(|| Arc::new(Mutex::new(Refusals::new(sandbox.record.write.clone())))),
    };
    let refusals = sink.refusals.clone();
    let mut stdin = child.stdin.take();
    let mut driver_lines = Some(acp_incoming);
    // An ACP agent's input belongs to its client connection, which sends the first prompt:
    // the task's, or the message it is resumed with, in the session it had.
    let acp = match stdin.take() {
        Some(input) if acp => Some(crate::agent::acp::start(
            AcpStart {
                workspace: spec.dir.clone(),
                first: resume_message
                    .filter(|message| !message.is_empty())
                    .unwrap_or(&spec.prompt)
                    .to_owned(),
                resume: resume_message.and(session_id).map(str::to_owned),
                prompt: spec.prompt.clone(),
                resume_cost: session_cost,
                terminals: crate::agent::acp::Terminals::new(launcher.clone(), spec.clone()),
            },
            input,
            driver_lines.take().expect("one driver reads the lines"),
            // Without the line sender: the connection ends when the agent's stdout does.
            OutputSink {
                acp: None,
                ..sink.clone()
            },
        )),
        input => {
            stdin = input;
            None
        }
    };
    // A placed task's transport speaks the shim protocol with its driver, which sends the
    // task's prompt (or, started again, the message) to the placement.
    let placed = match (stdin.take(), spec.placed.clone(), driver_lines.take()) {
        (Some(input), Some(placed), Some(lines)) if shim => Some(crate::agent::placed::start(
            placed,
            spec.agent_id.clone(),
            resume_message
                .filter(|message| !message.is_empty())
                .unwrap_or(&spec.prompt)
                .to_owned(),
            spec.dir.clone(),
            input,
            lines,
            OutputSink {
                acp: None,
                ..sink.clone()
            },
        )),
        (input, _, _) => {
            stdin = input;
            None
        }
    };
    if let (Some(message), Some(input)) = (first_message, stdin.as_mut()) {
        let line = format!("{}\n", user_message_line(message));
        let written = async {
            input.write_all(line.as_bytes()).await?;
            input.flush().await
        };
        if let Err(source) = tokio::time::timeout(STEER_TIMEOUT, written)
            .await
            .unwrap_or_else(|_| Err(std::io::Error::other("the agent did not read its input")))
        {
            // The agent exits without its prompt; its exit says the rest.
            tracing::warn!(agent = %spec.agent_id, "could not give the agent its first message: {source}");
        }
    }
    let mut readers = Vec::new();
    if let Some(stdout) = child.stdout.take() {
        readers.push(tokio::spawn(drain(
            stdout,
            OutputStream::Stdout,
            sink.clone(),
        )));
    }
    if let Some(stderr) = child.stderr.take() {
        readers.push(tokio::spawn(drain(stderr, OutputStream::Stderr, sink)));
    }
    Ok(Running {
        stdin,
        child,
        pid,
        readers,
        protocol: protocol_rx,
        acp,
        placed,
        sandbox: sandbox.record,
        refusals,
        leftovers,
        proxy,
        cgroup,
        _own_connection: own_connection,
        _temp_dir: temp_dir,
        lost_before_start: false,
        session_over: false,
    })
}

pub(super) fn open_log(spec: &AgentSpec) -> Result<LogWriter, SpawnAgentError> {
    let log_error = |source| SpawnAgentError::OutputLog {
        path: spec.output_log.clone(),
        source,
    };
    if let Some(parent) = spec.output_log.parent() {
        std::fs::create_dir_all(parent).map_err(log_error)?;
    }
    LogWriter::open(&spec.output_log, spec.output_log_limit)
        .map_err(|error| log_error(std::io::Error::other(error.to_string())))
}

/// A `stdin-json` agent's user message, `{"type":"user","message":{"role":"user","content":…}}`:
/// built from structs, so its keys come in this order however serde_json is configured.
pub(super) fn user_message_line(content: &str) -> String {
    #[derive(serde::Serialize)]
    struct Message<'a> {
        role: &'static str,
        content: &'a str,
    }
    #[derive(serde::Serialize)]
    struct Line<'a> {
        r#type: &'static str,
        message: Message<'a>,
    }
    let line = Line {
        r#type: "user",
        message: Message {
            role: "user",
            content,
        },
    };
    serde_json::to_string(&line).expect("a user message serializes")
}

/// The spare cgroups this host made ahead of starts are removed (the host ends): a host's
/// statics are never dropped, and the next host would otherwise have to.
pub fn drop_spare_cgroups() {
    if let Some(Ok(found)) = CGROUPS.get() {
        found.drop_spares();
    }
}

static CGROUPS: std::sync::OnceLock<Result<crew_sandbox::caps::Cgroups, String>> =
    std::sync::OnceLock::new();

/// The cgroups crew caps agents with here, found once: or why there are none.
fn cgroups() -> &'static Result<crew_sandbox::caps::Cgroups, String> {
    CGROUPS.get_or_init(crew_sandbox::caps::Cgroups::find)
}

/// The cgroup of this start's caps, made now; `None` without caps, or where none can be had
/// and its run allowed running uncapped (recorded). Refused where none can be had otherwise.
fn caps_group(
    spec: &AgentSpec,
    record: &mut SandboxRecord,
) -> Result<Option<crew_sandbox::caps::AgentGroup>, SpawnAgentError> {
    let caps = &spec.sandbox.caps;
    if caps.is_empty() {
        return Ok(None);
    }
    let found = match cgroups() {
        Ok(found) => found,
        Err(reason) if spec.sandbox.allow_uncapped => {
            record.uncapped = Some(reason.clone());
            return Ok(None);
        }
        Err(reason) => {
            return Err(SpawnAgentError::Caps {
                agent_id: spec.agent_id.clone(),
                reason: format!(
                    "{reason}; or run it without its caps ({}) with `crew run --allow-uncapped`",
                    caps.shown()
                ),
            });
        }
    };
    // One name per start: the agent, this host and a count (a resume is a start of its own);
    // a spare made ahead keeps its own.
    static STARTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let name: String = format!(
        "crew-{}-{}-{}",
        spec.agent_id,
        std::process::id(),
        STARTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    )
    .chars()
    .map(|c| {
        if c.is_ascii_alphanumeric() || c == '-' {
            c
        } else {
            '-'
        }
    })
    .collect();
    record.cgroup = Some(found.kind().as_str().to_owned());
    found
        .take(&name, caps)
        .map(Some)
        .map_err(|source| SpawnAgentError::Caps {
            agent_id: spec.agent_id.clone(),
            reason: format!("its cgroup could not be made: {source}"),
        })
}
