//! The terminals an `acp` agent asks crew for (`terminal/create`, `output`, `wait_for_exit`,
//! `kill`, `release`): each command runs exactly as the agent's own processes do — in its
//! workspace (a `cwd` elsewhere is refused), confined by its Landlock sandbox, under a warden
//! that kills what it leaves behind, carrying the agent's marker so that a stop of the agent
//! sweeps it too, with the agent's environment plus the variables the request names. Its output
//! is kept in memory up to a bound, the newest part kept.

use std::collections::HashMap;
use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use agent_client_protocol::v1::schema::{
    CreateTerminalRequest, CreateTerminalResponse, KillTerminalResponse, ReleaseTerminalResponse,
    TerminalExitStatus, TerminalId, TerminalOutputResponse, WaitForTerminalExitResponse,
};
use camino::Utf8PathBuf;
use crew_core::env_vars;
use crew_sandbox::procscan;
use crew_sandbox::spawn::{AgentIo, WardedCommand};
use tokio::io::{AsyncRead, AsyncReadExt as _};
use tokio::sync::watch;

use super::files::refused;
use crate::agent::confine::{confinement, private_temp_dir};
use crate::agent::env::agent_env;
use crate::agent::spec::{AgentSpec, Launcher};

/// The most output a terminal keeps, whatever the agent asks for.
const MAX_OUTPUT_BYTES: usize = 4 << 20;
/// How many terminals an agent may hold at once: what they keep is the host's memory.
const MAX_OPEN: usize = 16;

/// The terminals of one start of an agent. Dropping them kills what still runs.
pub(crate) struct Terminals {
    launcher: Launcher,
    spec: AgentSpec,
    next: AtomicU64,
    open: Mutex<HashMap<String, Arc<Terminal>>>,
}

struct Terminal {
    /// The process group (its warden's pid).
    group: Option<u32>,
    output: Arc<Mutex<Output>>,
    exit: watch::Receiver<Option<TerminalExitStatus>>,
    /// Its private temp dir, removed with it.
    _temp_dir: crew_sandbox::temp_dirs::AgentTempDir,
}

impl Terminal {
    fn kill(&self) {
        if self.exit.borrow().is_none()
            && let Some(group) = self
                .group
                .and_then(|pid| rustix::process::Pid::from_raw(pid as i32))
        {
            // Fails only when the group is gone: nothing left to kill.
            let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
        }
    }
}

/// What a terminal printed (stdout and stderr as they came), its newest `limit` bytes.
#[derive(Debug)]
struct Output {
    bytes: Vec<u8>,
    limit: usize,
    truncated: bool,
}

impl Output {
    fn push(&mut self, chunk: &[u8]) {
        self.bytes.extend_from_slice(chunk);
        if self.bytes.len() > self.limit {
            let cut = self.bytes.len() - self.limit;
            self.bytes.drain(..cut);
            self.truncated = true;
        }
    }

    /// The text, from the first whole character kept.
    fn text(&self) -> String {
        let start = if self.truncated {
            self.bytes
                .iter()
                .position(|byte| (*byte as i8) >= -0x40)
                .unwrap_or(0)
        } else {
            0
        };
        String::from_utf8_lossy(&self.bytes[start..]).into_owned()
    }
}

impl Terminals {
    pub(crate) fn new(launcher: Launcher, spec: AgentSpec) -> Self {
        Terminals {
            launcher,
            spec,
            next: AtomicU64::new(1),
            open: Mutex::new(HashMap::new()),
        }
    }

    fn get(&self, id: &TerminalId) -> Result<Arc<Terminal>, agent_client_protocol::Error> {
        self.open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id.0.as_ref())
            .cloned()
            .ok_or_else(|| {
                agent_client_protocol::Error::invalid_params()
                    .data(serde_json::json!(format!("no terminal {}", id.0)))
            })
    }

    /// `terminal/create`: starts the command, confined like the agent, in the workspace. A
    /// command line without arguments (`cargo test 2>&1 | tail`, as claude-code-acp sends
    /// one) runs through `sh -c`, as editors run it; a program with its arguments runs as it
    /// is.
    pub(super) async fn create(
        &self,
        request: &CreateTerminalRequest,
    ) -> Result<CreateTerminalResponse, agent_client_protocol::Error> {
        if self.open.lock().unwrap_or_else(|e| e.into_inner()).len() >= MAX_OPEN {
            return Err(refused(
                Path::new(&request.command),
                format!("{MAX_OPEN} terminals are open: release one first"),
            ));
        }
        let workspace = self.spec.dir.as_std_path();
        let cwd = match &request.cwd {
            Some(cwd) => in_workspace(workspace, cwd)?,
            None => workspace.to_owned(),
        };
        for variable in &request.env {
            if variable.name.is_empty()
                || variable.name.contains(['=', '\0'])
                || variable.value.contains('\0')
            {
                return Err(refused(
                    Path::new(&variable.name),
                    "not a name and value an environment can carry",
                ));
            }
        }
        let failed = |why: String| refused(Path::new(&request.command), why);
        let temp_dir = private_temp_dir(&self.spec).map_err(|error| failed(error.to_string()))?;
        let temp_path = Utf8PathBuf::from_path_buf(temp_dir.path().to_owned())
            .map_err(|path| failed(format!("{} is not UTF-8", path.display())))?;
        let mut vars = vec![
            (
                env_vars::CREW_RUN_ID,
                self.spec.agent_id.run_id().to_string(),
            ),
            (
                env_vars::CREW_TASK_ID,
                self.spec.agent_id.task_id().to_string(),
            ),
            (env_vars::CREW_AGENT_ID, self.spec.agent_id.to_string()),
            (env_vars::CREW_WORKSPACE, self.spec.dir.to_string()),
            (env_vars::CREW_PROJECT_ROOT, self.spec.workspace.to_string()),
            (env_vars::TMPDIR, temp_path.to_string()),
            (env_vars::XDG_RUNTIME_DIR, temp_path.to_string()),
        ];
        for (name, value) in &self.spec.workspace_env {
            vars.push((name.as_str(), value.clone()));
        }
        let (prepared, caches) = confinement(&self.spec, &self.launcher, temp_path, false)
            .map_err(|error| failed(error.to_string()))?;
        let marker = procscan::agent_marker(&self.spec.agent_id);
        // The request's variables after the agent's: the later of two with one name wins.
        let caches = caches.as_ref().map(|caches| &caches.env[..]);
        if prepared.proxy.is_some() {
            vars.extend(
                crew_sandbox::proxy::PROXY_VARS
                    .iter()
                    .map(|(name, value)| (*name, (*value).to_owned())),
            );
        }
        let env = agent_env(
            &self.launcher.env,
            &self.spec.definition,
            caches,
            &vars,
            &self.spec.git_config,
        )
        .into_iter()
        .chain(request.env.iter().map(|variable| {
            (
                std::ffi::OsString::from(&variable.name),
                std::ffi::OsString::from(&variable.value),
            )
        }));
        let (program, args) = program_and_args(request);
        let mut warded = WardedCommand::new(
            program,
            &args,
            env,
            &marker,
            prepared.ruleset,
            prepared.namespace.as_ref(),
            prepared.proxy.map(|lists| crew_sandbox::proxy::Rules {
                lists,
                log: self.spec.network_log.clone(),
                credentials: Vec::new(),
            }),
        )
        .map_err(|error| failed(error.to_string()))?;
        warded
            .current_dir(&cwd)
            .stdio(AgentIo::Null, AgentIo::Piped, AgentIo::Piped);
        let crew_sandbox::spawn::Spawned {
            mut child, proxy, ..
        } = self
            .launcher
            .spawner
            .spawn(warded)
            .await
            .map_err(|error| failed(error.to_string()))?;
        let limit = request
            .output_byte_limit
            .map_or(MAX_OUTPUT_BYTES, |limit| {
                usize::try_from(limit).unwrap_or(usize::MAX)
            })
            .min(MAX_OUTPUT_BYTES);
        let output = Arc::new(Mutex::new(Output {
            bytes: Vec::new(),
            limit,
            truncated: false,
        }));
        let mut readers = Vec::new();
        if let Some(stdout) = child.stdout.take() {
            readers.push(tokio::spawn(read_into(stdout, output.clone())));
        }
        if let Some(stderr) = child.stderr.take() {
            readers.push(tokio::spawn(read_into(stderr, output.clone())));
        }
        let (exited, exit) = watch::channel(None);
        let group = child.id();
        tokio::spawn(async move {
            let status = child.wait().await;
            // Its proxy serves it as long as it lives.
            drop(proxy);
            // What it printed last is read before its exit is told.
            for reader in readers {
                // A reader that panicked has stopped reading: its output is over either way.
                let _ = tokio::time::timeout(std::time::Duration::from_millis(300), reader).await;
            }
            let status = match status {
                Ok(status) => exit_status(status),
                Err(_) => TerminalExitStatus::new().signal("SIGKILL".to_owned()),
            };
            // Nobody may be waiting: the exit is kept in the channel either way.
            let _ = exited.send(Some(status));
        });
        let id = format!("term-{}", self.next.fetch_add(1, Ordering::Relaxed));
        self.open.lock().unwrap_or_else(|e| e.into_inner()).insert(
            id.clone(),
            Arc::new(Terminal {
                group,
                output,
                exit,
                _temp_dir: temp_dir,
            }),
        );
        Ok(CreateTerminalResponse::new(id))
    }

    /// `terminal/output`: what it printed so far, and its exit once it has one.
    pub(super) fn output(
        &self,
        id: &TerminalId,
    ) -> Result<TerminalOutputResponse, agent_client_protocol::Error> {
        let terminal = self.get(id)?;
        let output = terminal.output.lock().unwrap_or_else(|e| e.into_inner());
        let exit = terminal.exit.borrow().clone();
        Ok(TerminalOutputResponse::new(output.text(), output.truncated).exit_status(exit))
    }

    /// `terminal/wait_for_exit`: its exit, once it has one.
    pub(super) async fn wait(
        &self,
        id: &TerminalId,
    ) -> Result<WaitForTerminalExitResponse, agent_client_protocol::Error> {
        let mut exit = self.get(id)?.exit.clone();
        let status = exit
            .wait_for(Option::is_some)
            .await
            .map(|status| status.clone().unwrap_or_default())
            .unwrap_or_default();
        Ok(WaitForTerminalExitResponse::new(status))
    }

    /// `terminal/kill`: kills its process group; the terminal stays for its output.
    pub(super) fn kill(
        &self,
        id: &TerminalId,
    ) -> Result<KillTerminalResponse, agent_client_protocol::Error> {
        self.get(id)?.kill();
        Ok(KillTerminalResponse::new())
    }

    /// `terminal/release`: kills what still runs and forgets the terminal.
    pub(super) fn release(
        &self,
        id: &TerminalId,
    ) -> Result<ReleaseTerminalResponse, agent_client_protocol::Error> {
        let terminal = self.get(id)?;
        terminal.kill();
        self.open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id.0.as_ref());
        Ok(ReleaseTerminalResponse::new())
    }
}

impl Drop for Terminals {
    fn drop(&mut self) {
        for terminal in self
            .open
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .values()
        {
            terminal.kill();
        }
    }
}

impl std::fmt::Debug for Terminals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Terminals")
            .field("agent", &self.spec.agent_id)
            .finish_non_exhaustive()
    }
}

/// A terminal's working directory: the workspace or a directory beneath it.
fn in_workspace(workspace: &Path, cwd: &Path) -> Result<PathBuf, agent_client_protocol::Error> {
    let outside = || refused(cwd, "outside the task's workspace");
    if !cwd.is_absolute() {
        return Err(refused(cwd, "paths must be absolute"));
    }
    // Links are followed to where they lead: that must be beneath the workspace too.
    let real = cwd.canonicalize().map_err(|error| refused(cwd, error))?;
    let root = workspace
        .canonicalize()
        .map_err(|error| refused(workspace, error))?;
    if real.starts_with(&root) {
        Ok(real)
    } else {
        Err(outside())
    }
}

async fn read_into(mut pipe: impl AsyncRead + Unpin, output: Arc<Mutex<Output>>) {
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        match pipe.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(read) => output
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(&buffer[..read]),
        }
    }
}

/// An exit as the protocol tells it: a code, or the signal's name.
fn exit_status(status: std::process::ExitStatus) -> TerminalExitStatus {
    match (status.code(), status.signal()) {
        (Some(code), _) => {
            TerminalExitStatus::new().exit_code(u32::try_from(code).unwrap_or(u32::MAX))
        }
        (None, Some(signal)) => TerminalExitStatus::new().signal(signal_name(signal)),
        (None, None) => TerminalExitStatus::new(),
    }
}

fn signal_name(signal: i32) -> String {
    match signal {
        libc::SIGHUP => "SIGHUP".to_owned(),
        libc::SIGINT => "SIGINT".to_owned(),
        libc::SIGABRT => "SIGABRT".to_owned(),
        libc::SIGKILL => "SIGKILL".to_owned(),
        libc::SIGSEGV => "SIGSEGV".to_owned(),
        libc::SIGPIPE => "SIGPIPE".to_owned(),
        libc::SIGTERM => "SIGTERM".to_owned(),
        other => format!("signal {other}"),
    }
}

/// The program and arguments of a terminal: `command` and `args` as given, or, for a command
/// line given alone (it holds a space or a shell's character), `sh -c <line>`.
fn program_and_args(request: &CreateTerminalRequest) -> (&str, Vec<String>) {
    let line = &request.command;
    let shell_line = request.args.is_empty()
        && line.contains(|c: char| c.is_whitespace() || "|&;<>()$`\\\"'*?[]#~=%".contains(c));
    if shell_line {
        ("sh", vec!["-c".to_owned(), line.clone()])
    } else {
        (line.as_str(), request.args.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_line_alone_runs_through_the_shell_and_a_program_with_arguments_as_it_is() {
        let line = CreateTerminalRequest::new("s", "cargo test 2>&1 | tail -3");
        assert_eq!(
            program_and_args(&line),
            (
                "sh",
                vec!["-c".to_owned(), "cargo test 2>&1 | tail -3".to_owned()]
            )
        );
        let program = CreateTerminalRequest::new("s", "cargo").args(vec!["test".to_owned()]);
        assert_eq!(
            program_and_args(&program),
            ("cargo", vec!["test".to_owned()])
        );
        let alone = CreateTerminalRequest::new("s", "ls");
        assert_eq!(program_and_args(&alone), ("ls", Vec::new()));
    }

    #[test]
    fn output_keeps_its_newest_bytes_from_a_whole_character() {
        let mut output = Output {
            bytes: Vec::new(),
            limit: 5,
            truncated: false,
        };
        output.push("ab".as_bytes());
        assert_eq!((output.text(), output.truncated), ("ab".to_owned(), false));
        output.push("cdé!".as_bytes());
        // "bcdé!" is 6 bytes: one goes, and the text starts at a whole character.
        assert!(output.truncated);
        assert_eq!(output.text(), "cdé!");
        output.push("xyzé".as_bytes());
        assert_eq!(output.text(), "xyzé");
        // Cut inside a character: the text starts after it.
        output.push("qqwv".as_bytes());
        assert_eq!(output.bytes[0], 0xA9);
        assert_eq!(output.text(), "qqwv");
    }
}
