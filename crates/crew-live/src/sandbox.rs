//! The kernel's confinement of each agent (ARCHITECTURE.md, "Agents are untrusted"), with Linux
//! Landlock.
//!
//! An agent is a program with a shell, driven by a model that can be wrong or manipulated. Before
//! its program is executed, the agent's process (forked by its warden, see [`crate::spawn`])
//! restricts itself with a Landlock ruleset that everything it starts inherits:
//!
//! - reading and executing stay open everywhere, and so does the network;
//! - writing (creating, removing, renaming, truncating, linking) is allowed only beneath its
//!   workspace, its private temp dir (its `TMPDIR`), what its provider says a commit from there
//!   needs (for a worktree: its own git directory, never the repository's objects or refs), the
//!   paths its agent definition adds (`[sandbox] write`), and a few device
//!   files (`/dev/null`, `/dev/zero`, `/dev/full`, `/dev/random`, `/dev/urandom`, `/dev/shm`);
//! - signals to processes outside its own sandbox are refused (Landlock ABI 6 and newer), so an
//!   agent cannot kill its host or the user's other programs.
//!
//! The ruleset is built in the host (opening the paths allocates); the agent's warden inherits
//! its descriptor, and the process it forks for the agent only makes the two system calls that
//! apply it.
//!
//! Where the kernel has no Landlock, or the user turned the sandbox off, agents run unconfined;
//! the task's record says so, and crew's own checks (the tripwire on the shared git directory,
//! teardown that acts only on the directory it created) still hold.
#![allow(unsafe_code)]

use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::sync::OnceLock;

use camino::{Utf8Path, Utf8PathBuf};
use crew_core::config::{HostList, NetworkMode, SandboxMode};
use crew_core::model::{SandboxRecord, SandboxState};
use crew_core::provider::PrivateView;
use landlock::{
    ABI, Access, AccessFs, CompatLevel, Compatible, PathBeneath, Ruleset, RulesetAttr,
    RulesetCreatedAttr, Scope,
};

/// The Landlock ABI crew's rules are written for: its write rights (with `Refer`, `Truncate`
/// and `IoctlDev`). Older kernels get the subset they have.
const FS_ABI: ABI = ABI::V5;
/// The ABI that brought signal scoping.
const SCOPE_ABI: ABI = ABI::V6;

/// Device files every program may write to (or ioctl, for the random devices).
pub const DEVICE_FILES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/shm",
];

/// What an agent may write, decided by whoever starts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxPlan {
    /// `Off` runs the agent unconfined.
    pub mode: SandboxMode,
    /// Directories (or files) the agent may write beneath: its workspace root and what the
    /// provider adds. The agent definition's `[sandbox] write` and the private temp dir are
    /// added when it starts.
    pub write: Vec<Utf8PathBuf>,
    /// Beneath those, what the agent may not write all the same: mounted read-only in a user
    /// and mount namespace of the agent's own, where the kernel has them (Landlock alone
    /// cannot carve a read-only place out of a writable one).
    pub read_only: Vec<Utf8PathBuf>,
    /// Directories it gets a private view of: an overlay in its namespace, where the kernel
    /// has them, whose changes go to crew's directory (see [`PrivateView`]). Each is writable
    /// to it then (the view, not the directory).
    pub private: Vec<PrivateView>,
    /// What it reaches of the network (the narrower of the project's and its definition's).
    pub network: NetworkMode,
    /// With `proxy`, the lists of hosts that apply besides its definition's (the project's):
    /// a request must be in every one.
    pub hosts: Vec<HostList>,
    /// Where the kernel cannot give the narrower network, run with the open one (recorded as
    /// `network_unmet`) instead of refusing the start.
    pub allow_open_network: bool,
}

impl SandboxPlan {
    /// Confined to `dir` (plus the agent's own temp dir and its definition's paths).
    pub fn confined_to(dir: impl Into<Utf8PathBuf>) -> Self {
        SandboxPlan {
            mode: SandboxMode::Enforce,
            write: vec![dir.into()],
            read_only: Vec::new(),
            private: Vec::new(),
            network: NetworkMode::Open,
            hosts: Vec::new(),
            allow_open_network: false,
        }
    }
}

/// A ruleset built for one start of an agent, ready to be applied in its process.
#[derive(Debug)]
pub(crate) struct Prepared {
    /// The Landlock ruleset; `None` when the agent runs unconfined.
    pub ruleset: Option<OwnedFd>,
    /// The namespace the agent's process makes for itself before it applies the ruleset,
    /// where the kernel lets it.
    pub namespace: Option<Namespace>,
    /// With `network = "proxy"`, what its proxy lets through.
    pub proxy: Option<Vec<HostList>>,
    pub record: SandboxRecord,
}

/// A namespace plan's flag: private terminals.
const PLAN_TERMINALS: u8 = 1;
/// A namespace plan's flag: a network namespace of its own.
const PLAN_NO_NETWORK: u8 = 2;
/// A namespace plan's flag: a network namespace of its own, where the agent's process listens
/// on the proxy's port for its host (see [`crate::proxy`]).
const PLAN_PROXY: u8 = 4;

/// What a confined agent's process makes of a user and mount namespace of its own, before its
/// ruleset (which then forbids changing mounts, so the agent cannot undo it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Namespace {
    /// Overlaid first, each with its changes going to crew's directory.
    pub private: Vec<PrivateView>,
    /// Bound onto themselves read-only (after the overlays, so beneath one too).
    pub read_only: Vec<Utf8PathBuf>,
    /// A private instance of the terminal devices mounted over `/dev/pts`, its `ptmx` over
    /// `/dev/ptmx`: the agent's programs get pseudo-terminals of their own (a shell tool's
    /// `forkpty`), and the user's terminals (`/dev/pts/N`) are not there for it to open.
    pub terminals: bool,
    /// A network namespace of its own, with only its own loopback up: no network at all.
    pub isolated_network: bool,
    /// In that namespace, the proxy's listening socket, made before the agent's program
    /// starts and handed to its host (`network = "proxy"`).
    pub proxy: bool,
    /// The user's own servers' unix sockets, covered (see [`user_sockets`]).
    pub hidden: Vec<Hidden>,
    /// The name of the agent's own connection to its host: an abstract unix socket its process
    /// listens on once confined (so that only its own Landlock domain may connect) and hands
    /// to its host, which serves every connection on it as that agent (`CREW_SOCKET=@name`).
    pub control: Option<String>,
}

impl Namespace {
    /// The plan as the agent's process reads it between fork and exec: a byte of flags
    /// ([`PLAN_TERMINALS`], [`PLAN_NO_NETWORK`]); with terminals, the write rights of a
    /// directory and of a file as the ruleset handles them, eight bytes each; then entries of
    /// a kind byte and a path (or an overlay's options) ended by a NUL: each overlay (`o` its
    /// target, `O` its options), each read-only path (`r`), each hidden directory (`d`) and
    /// file (`f`), and the name of the agent's own connection (`c`).
    pub(crate) fn encode(&self) -> std::io::Result<Vec<u8>> {
        let mut flags = 0;
        if self.terminals {
            flags |= PLAN_TERMINALS;
        }
        if self.isolated_network {
            flags |= PLAN_NO_NETWORK;
        }
        if self.proxy {
            flags |= PLAN_PROXY;
        }
        let mut plan = vec![flags];
        if self.terminals {
            let handled = AccessFs::from_write(FS_ABI)
                & AccessFs::from_all(ABI::from(kernel_abi().map_or(0, |abi| abi as i32)));
            let file = handled & AccessFs::from_file(FS_ABI);
            plan.extend_from_slice(&handled.bits().to_le_bytes());
            plan.extend_from_slice(&file.bits().to_le_bytes());
        }
        let overlays = self.private.iter().flat_map(|view| {
            [
                (b'o', view.target.to_string()),
                (b'O', overlay_options(view).unwrap_or_default()),
            ]
        });
        let entries = overlays
            .chain(
                self.read_only
                    .iter()
                    .map(|path| (b'r', path.to_string()))
                    .chain(self.hidden.iter().map(|hidden| match hidden {
                        Hidden::Directory(path) => (b'd', path.to_string()),
                        Hidden::File(path) => (b'f', path.to_string()),
                    })),
            )
            .chain(self.control.iter().map(|name| (b'c', name.clone())));
        for (kind, path) in entries {
            if path.is_empty() || path.contains('\0') {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("{path} cannot be mounted over"),
                ));
            }
            plan.push(kind);
            plan.extend_from_slice(path.as_bytes());
            plan.push(0);
        }
        Ok(plan)
    }
}

/// The mount options of an overlay giving a private view of `view.target` (its changes in
/// `view.upper`); `None` where a path cannot be said in them (the options are split at `,`,
/// and a layer's path at `:`).
fn overlay_options(view: &PrivateView) -> Option<String> {
    let paths = [&view.target, &view.upper, &view.work];
    if paths
        .iter()
        .any(|path| path.as_str().contains([',', ':', '\\', '\0']) || !path.is_absolute())
    {
        return None;
    }
    // `userxattr`: an overlay a user namespace mounts keeps its own marks (whiteouts of what
    // the agent removed, directories it replaced) in `user.` attributes.
    Some(format!(
        "lowerdir={},upperdir={},workdir={},userxattr",
        view.target, view.upper, view.work
    ))
}

/// Whether an agent's process can lay an overlay (see [`Namespace::private`]) here: asked once,
/// with the first view an agent asks for, by a child that mounts it in a namespace of its own.
fn overlays_work(view: &PrivateView) -> bool {
    static WORKS: OnceLock<bool> = OnceLock::new();
    *WORKS.get_or_init(|| {
        let namespace = Namespace {
            private: vec![view.clone()],
            ..Namespace::default()
        };
        let Ok(plan) = namespace.encode() else {
            return false;
        };
        // SAFETY: the probe only makes the namespace's system calls, on a plan made before
        // the fork.
        unsafe { child_succeeds(|| enter_namespace(&plan, None).is_ok()) }
    })
}

/// A place the agent's namespace covers so that what is there cannot be reached from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hidden {
    /// A directory, covered by an empty one (a small tmpfs of the agent's own).
    Directory(Utf8PathBuf),
    /// A file (a socket), covered by `/dev/null`.
    File(Utf8PathBuf),
}

/// The places where the user's own programs listen on pathname unix sockets, which an agent's
/// sandbox cannot scope (Landlock scopes abstract sockets only): the per-user runtime
/// directory (session bus, ssh and gpg agents, a rootless container engine, the desktop), tmux's
/// and screen's socket directories, the X server's, and the container engines' system sockets.
/// Those that exist are hidden from the agent, unless `keep` holds them or lies beneath them
/// (its workspace, its temp dir, a path its definition grants).
pub fn user_sockets(home: Option<&Utf8Path>, keep: &[Utf8PathBuf]) -> Vec<Hidden> {
    let uid = rustix::process::getuid().as_raw();
    let runtime = std::env::var("XDG_RUNTIME_DIR")
        .ok()
        .filter(|dir| dir.starts_with('/'))
        .map(Utf8PathBuf::from)
        .unwrap_or_else(|| Utf8PathBuf::from(format!("/run/user/{uid}")));
    let mut directories = vec![
        runtime,
        Utf8PathBuf::from(format!("/tmp/tmux-{uid}")),
        Utf8PathBuf::from("/tmp/.X11-unix"),
        Utf8PathBuf::from("/run/screen"),
        Utf8PathBuf::from(format!("/run/screen/S-{uid}")),
    ];
    if let Some(home) = home {
        directories.push(home.join(".gnupg"));
    }
    let mut files = vec![
        Utf8PathBuf::from("/var/run/docker.sock"),
        Utf8PathBuf::from("/run/docker.sock"),
        Utf8PathBuf::from("/run/podman/podman.sock"),
        Utf8PathBuf::from("/run/containerd/containerd.sock"),
    ];
    if let Ok(agent) = std::env::var("SSH_AUTH_SOCK")
        && agent.starts_with('/')
    {
        files.push(Utf8PathBuf::from(agent));
    }
    let kept = |path: &Utf8Path| {
        keep.iter()
            .any(|kept| kept.starts_with(path) || path.starts_with(kept))
    };
    let is = |path: &Utf8Path, directory: bool| {
        std::fs::symlink_metadata(path)
            .is_ok_and(|metadata| metadata.is_dir() == directory && !metadata.is_symlink())
    };
    let mut hidden: Vec<Hidden> = Vec::new();
    for directory in directories.into_iter().filter(|path| is(path, true)) {
        cover(&directory, keep, &mut hidden, 0);
    }
    let files: Vec<Hidden> = files
        .into_iter()
        .filter(|path| is(path, false) && !kept(path))
        .filter(|path| {
            // Beneath a directory already hidden, it is gone with it (or covered already).
            !hidden.iter().any(|hidden| match hidden {
                Hidden::Directory(dir) => path.starts_with(dir),
                Hidden::File(file) => file == path,
            })
        })
        .map(Hidden::File)
        .collect();
    hidden.extend(files);
    hidden
}

/// Covers `directory` for an agent whose grants (`keep`) do not lie within it; where one does
/// (its temp dir in the user's runtime directory), covers each of its entries but the ones on
/// the way to a grant, and so on down: the user's sockets beside a grant are hidden too. A
/// directory within a grant is the agent's own, and stays.
fn cover(directory: &Utf8Path, keep: &[Utf8PathBuf], hidden: &mut Vec<Hidden>, depth: usize) {
    if keep.iter().any(|kept| directory.starts_with(kept)) {
        return;
    }
    if !keep.iter().any(|kept| kept.starts_with(directory)) {
        hidden.push(Hidden::Directory(directory.to_owned()));
        return;
    }
    // A grant lies within: what stands beside it is covered, one entry at a time.
    let Ok(entries) = directory.read_dir_utf8() else {
        return;
    };
    if depth > 8 {
        return;
    }
    for entry in entries.flatten() {
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        let path = entry.into_path();
        if kind.is_dir() {
            cover(&path, keep, hidden, depth + 1);
        } else if !kind.is_symlink() && !keep.iter().any(|kept| path.starts_with(kept)) {
            hidden.push(Hidden::File(path));
        }
    }
}

/// A ruleset the kernel refused to build.
#[derive(Debug, thiserror::Error)]
#[error("failed to build the sandbox of the agent: {message}")]
pub struct BuildSandboxError {
    /// What the kernel said.
    pub message: String,
}

/// The Landlock ABI version this kernel supports, or `None` without Landlock. Asked once.
pub fn kernel_abi() -> Option<u32> {
    static ABI_VERSION: OnceLock<Option<u32>> = OnceLock::new();
    *ABI_VERSION.get_or_init(|| {
        const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
        // SAFETY: with a null attribute and size 0, this flag only asks for the ABI version;
        // no memory is read or written.
        let version = unsafe {
            libc::syscall(
                libc::SYS_landlock_create_ruleset,
                std::ptr::null::<u8>(),
                0usize,
                LANDLOCK_CREATE_RULESET_VERSION,
            )
        };
        u32::try_from(version).ok().filter(|version| *version > 0)
    })
}

/// Builds the ruleset of one start of an agent: writes beneath `plan.write`, `extra` (its
/// definition's paths and its temp dir) and the device files; nothing else. Paths that do not
/// exist cannot be granted and are listed as missing.
///
/// With `own_socket` (the host's control socket, for an agent that gets a connection of its
/// own), a confined agent with a namespace gets one (see [`Namespace::control`]) and the host's
/// socket directory is covered in its namespace: it reaches its host by that connection only.
pub(crate) fn prepare(
    plan: &SandboxPlan,
    extra: &[Utf8PathBuf],
    own_socket: Option<&Utf8Path>,
) -> Result<Prepared, BuildSandboxError> {
    let abi = kernel_abi();
    let state = match (plan.mode, abi) {
        (SandboxMode::Off, _) => SandboxState::Off,
        (SandboxMode::Enforce, None) => SandboxState::Unsupported,
        (SandboxMode::Enforce, Some(_)) => SandboxState::Enforced,
    };
    // A narrower network is the kernel's to give: without Landlock (the rest of the sandbox
    // gone too, which crew says), never the open one in its place — unless the run allowed it,
    // and then it is said. Off by the user's choice, it is off.
    let mut network_unmet = None;
    if state == SandboxState::Unsupported && plan.network != NetworkMode::Open {
        if !plan.allow_open_network {
            return Err(BuildSandboxError {
                message: format!(
                    "`[sandbox] network = \"{}\"` needs the kernel's sandbox, and this kernel has no Landlock: run crew on Linux 5.13 or later with Landlock enabled (`lsm=landlock` among the boot's security modules), set `network = \"open\"`, or run with `--allow-open-network`",
                    plan.network.as_str()
                ),
            });
        }
        network_unmet = Some(plan.network);
    }
    if state != SandboxState::Enforced {
        return Ok(Prepared {
            ruleset: None,
            namespace: None,
            proxy: None,
            record: SandboxRecord {
                state,
                abi,
                write: Vec::new(),
                missing: Vec::new(),
                read_only: Vec::new(),
                private: Vec::new(),
                stood_down: Vec::new(),
                private_terminals: false,
                own_connection: false,
                network: NetworkMode::Open,
                network_unmet,
                hidden: Vec::new(),
                unmade: Vec::new(),
            },
        });
    }
    // A private view is the agent's to write: the overlay, never the directory beneath it
    // (whose own inode the grant names, the overlay's mount point).
    let private: Vec<PrivateView> = if namespaces_work() {
        plan.private
            .iter()
            .filter(|view| {
                overlay_options(view).is_some()
                    && open_beneath(&view.target).is_some()
                    && overlays_work(view)
            })
            .cloned()
            .collect()
    } else {
        Vec::new()
    };
    let mut write: Vec<Utf8PathBuf> = Vec::new();
    let mut missing = Vec::new();
    let mut opened = Vec::new();
    for path in plan
        .write
        .iter()
        .chain(extra)
        .chain(private.iter().map(|view| &view.target))
    {
        if write.contains(path) || missing.contains(path) {
            continue;
        }
        match open_beneath(path) {
            Some(beneath) => {
                opened.push(beneath);
                write.push(path.clone());
            }
            None => missing.push(path.clone()),
        }
    }
    let build_error = |error: landlock::RulesetError| BuildSandboxError {
        message: error.to_string(),
    };
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_write(FS_ABI))
        .and_then(|ruleset| ruleset.scope(Scope::from_all(SCOPE_ABI)))
        .and_then(|ruleset| ruleset.create())
        .map_err(build_error)?;
    for beneath in opened.iter().chain(devices()) {
        ruleset = ruleset
            .add_rule(PathBeneath::new(beneath.fd.as_fd(), beneath.access()))
            .map_err(build_error)?;
    }
    let ruleset: Option<OwnedFd> = ruleset.into();
    // A place that is not there, or a link, is not mounted over (a mount would follow it).
    // Where a view could not be laid, what it would have made harmless to write is kept from
    // the agent instead.
    let fallback: Vec<Utf8PathBuf> = plan
        .private
        .iter()
        .filter(|view| !private.contains(view))
        .flat_map(|view| view.read_only_without.iter().cloned())
        .collect();
    let mut namespace = (ruleset.is_some() && namespaces_work()).then(|| Namespace {
        private,
        read_only: plan
            .read_only
            .iter()
            .chain(&fallback)
            .filter(|path| open_beneath(path).is_some())
            .cloned()
            .collect(),
        terminals: private_terminals_work(),
        isolated_network: plan.network != NetworkMode::Open,
        proxy: plan.network == NetworkMode::Proxy,
        hidden: user_sockets(
            std::env::var("HOME")
                .ok()
                .filter(|home| home.starts_with('/'))
                .as_deref()
                .map(Utf8Path::new),
            &write,
        ),
        control: None,
    });
    // Scoped to its own domain (Landlock ABI 6): the agent's own connection.
    if let (Some(namespace), Some(socket)) = (&mut namespace, own_socket)
        && abi.is_some_and(|abi| abi >= 6)
    {
        namespace.control = Some(format!("crew-{}", uuid::Uuid::new_v4().simple()));
        if let Some(dir) = socket.parent().filter(|dir| {
            std::fs::symlink_metadata(dir).is_ok_and(|metadata| metadata.is_dir())
                && !write
                    .iter()
                    .any(|granted| granted.starts_with(dir) || dir.starts_with(granted))
        }) {
            namespace.hidden.push(Hidden::Directory(dir.to_owned()));
        }
    }
    // A narrower network asked, and none to be had: refused, never a silent fallback to the
    // open one.
    if plan.network != NetworkMode::Open && ruleset.is_some() && namespace.is_none() {
        if !plan.allow_open_network {
            return Err(BuildSandboxError {
                message: format!(
                    "`[sandbox] network = \"{}\"` needs a network namespace of the agent's own, and this kernel refuses unprivileged user namespaces (`sysctl kernel.unprivileged_userns_clone`, or AppArmor's `kernel.apparmor_restrict_unprivileged_userns` on Ubuntu): allow them, set `network = \"open\"`, or run with `--allow-open-network`",
                    plan.network.as_str()
                ),
            });
        }
        network_unmet = Some(plan.network);
    }
    let read_only = namespace
        .as_ref()
        .map(|namespace| namespace.read_only.clone())
        .unwrap_or_default();
    Ok(Prepared {
        record: SandboxRecord {
            state: if ruleset.is_some() {
                SandboxState::Enforced
            } else {
                SandboxState::Unsupported
            },
            abi,
            write,
            missing,
            read_only,
            private: namespace
                .as_ref()
                .map(|namespace| {
                    namespace
                        .private
                        .iter()
                        .map(|view| view.target.clone())
                        .collect()
                })
                .unwrap_or_default(),
            stood_down: Vec::new(),
            private_terminals: namespace
                .as_ref()
                .is_some_and(|namespace| namespace.terminals),
            own_connection: namespace
                .as_ref()
                .is_some_and(|namespace| namespace.control.is_some()),
            network: if network_unmet.is_some() {
                NetworkMode::Open
            } else {
                plan.network
            },
            network_unmet,
            unmade: Vec::new(),
            hidden: namespace
                .as_ref()
                .map(|namespace| {
                    namespace
                        .hidden
                        .iter()
                        .map(|hidden| match hidden {
                            Hidden::Directory(path) | Hidden::File(path) => path.clone(),
                        })
                        .collect()
                })
                .unwrap_or_default(),
        },
        proxy: namespace
            .as_ref()
            .is_some_and(|namespace| namespace.proxy)
            .then(|| plan.hosts.clone()),
        namespace,
        ruleset,
    })
}

/// Whether this kernel lets an unprivileged process make a user and mount namespace of its own
/// (some distributions turn that off). Asked once, by a child that tries.
pub fn namespaces_work() -> bool {
    static WORKS: OnceLock<bool> = OnceLock::new();
    *WORKS.get_or_init(|| {
        // SAFETY: the probe makes one system call.
        unsafe { child_succeeds(|| libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) == 0) }
    })
}

/// Whether `probe`, run in a child forked for it, says yes: what a kernel lets a process do to
/// itself (enter namespaces), asked without changing this one.
///
/// # Safety
/// `probe` runs between fork and exit in a copy of a multi-threaded process: only
/// async-signal-safe system calls, no allocation, no lock.
unsafe fn child_succeeds(probe: impl FnOnce() -> bool) -> bool {
    // SAFETY: the child runs `probe` (see above) and exits; the parent waits for it.
    unsafe {
        let child = libc::fork();
        if child == 0 {
            libc::_exit(if probe() { 0 } else { 1 });
        }
        if child < 0 {
            return false;
        }
        let mut status = 0;
        libc::waitpid(child, &mut status, 0) == child
            && libc::WIFEXITED(status)
            && libc::WEXITSTATUS(status) == 0
    }
}

/// Whether an agent's process can mount a private instance of the terminal devices (see
/// [`Namespace::terminals`]) here. Asked once, by a child that enters such a namespace.
pub fn private_terminals_work() -> bool {
    static WORKS: OnceLock<bool> = OnceLock::new();
    *WORKS.get_or_init(|| {
        if !namespaces_work() || std::fs::metadata("/dev/ptmx").is_err() {
            return false;
        }
        let mut plan = [0u8; 17];
        plan[0] = PLAN_TERMINALS;
        // SAFETY: the probe only makes the namespace's system calls, on a plan made before
        // the fork.
        unsafe { child_succeeds(|| enter_namespace(&plan, None).is_ok()) }
    })
}

/// Enters the namespace `plan` encodes (see [`Namespace::encode`]) for the calling process and
/// everything it starts: a user namespace of its own (mapping its own uid and gid, nothing
/// else), a mount namespace in it whose mounts no longer propagate, a private instance of the
/// terminal devices when asked, and each read-only path bound onto itself and marked
/// read-only. Landlock, applied next, forbids changing mounts: the agent cannot undo this.
///
/// # Safety
/// Runs between fork and exec: only async-signal-safe system calls, no allocation.
pub(crate) unsafe fn enter_namespace(
    plan: &[u8],
    ruleset: Option<libc::c_int>,
) -> std::io::Result<()> {
    let invalid = || std::io::Error::from_raw_os_error(libc::EINVAL);
    let Some((&flags, rest)) = plan.split_first() else {
        return Err(invalid());
    };
    let (terminals, paths) = if flags & PLAN_TERMINALS != 0 {
        if rest.len() < 16 {
            return Err(invalid());
        }
        let mut dir = [0u8; 8];
        let mut file = [0u8; 8];
        dir.copy_from_slice(&rest[..8]);
        file.copy_from_slice(&rest[8..16]);
        (
            Some((u64::from_le_bytes(dir), u64::from_le_bytes(file))),
            &rest[16..],
        )
    } else {
        (None, rest)
    };
    let network = if flags & (PLAN_NO_NETWORK | PLAN_PROXY) != 0 {
        libc::CLONE_NEWNET
    } else {
        0
    };
    /// `struct mount_attr` of `mount_setattr(2)`.
    #[repr(C)]
    struct MountAttr {
        attr_set: u64,
        attr_clr: u64,
        propagation: u64,
        userns_fd: u64,
    }
    const MOUNT_ATTR_RDONLY: u64 = 0x1;
    let error = std::io::Error::last_os_error;
    // SAFETY: plain system calls on this process, with NUL-terminated strings.
    unsafe {
        let (uid, gid) = (libc::getuid(), libc::getgid());
        if libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS | network) != 0 {
            return Err(error());
        }
        let mut line = [0u8; 32];
        write_proc(c"/proc/self/setgroups", b"deny")?;
        write_proc(c"/proc/self/uid_map", id_map(&mut line, uid))?;
        write_proc(c"/proc/self/gid_map", id_map(&mut line, gid))?;
        // A network of its own has its own loopback, down until raised: programs that talk to
        // themselves over 127.0.0.1 (a test suite's server) go on working, and reach nothing
        // else.
        if network != 0 {
            loopback_up()?;
        }
        let none = std::ptr::null::<libc::c_char>();
        if libc::mount(
            none,
            c"/".as_ptr(),
            none,
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        ) != 0
        {
            return Err(error());
        }
        if let Some((dir_access, file_access)) = terminals {
            if libc::mount(
                c"devpts".as_ptr(),
                c"/dev/pts".as_ptr(),
                c"devpts".as_ptr(),
                libc::MS_NOSUID | libc::MS_NOEXEC,
                c"newinstance,ptmxmode=0666,mode=0620".as_ptr().cast(),
            ) != 0
            {
                return Err(error());
            }
            if libc::mount(
                c"/dev/pts/ptmx".as_ptr(),
                c"/dev/ptmx".as_ptr(),
                none,
                libc::MS_BIND,
                std::ptr::null(),
            ) != 0
            {
                return Err(error());
            }
            // Granted here, where they are this instance's: beneath `/dev/pts`, and its `ptmx`
            // itself (reached through `/dev/ptmx`, a walk up from it never passes the
            // instance's root). Landlock ignores the mount points a walk up crosses, so a
            // grant of the user's `/dev/pts` would not reach these, nor these the user's.
            if let Some(ruleset) = ruleset {
                grant(ruleset, c"/dev/pts", dir_access)?;
                grant(ruleset, c"/dev/pts/ptmx", file_access)?;
            }
        }
        let attr = MountAttr {
            attr_set: MOUNT_ATTR_RDONLY,
            attr_clr: 0,
            propagation: 0,
            userns_fd: 0,
        };
        let mut start = 0;
        let mut overlay_target = std::ptr::null::<libc::c_char>();
        for (end, _) in paths.iter().enumerate().filter(|(_, byte)| **byte == 0) {
            let kind = paths[start];
            let path = paths.as_ptr().add(start + 1).cast::<libc::c_char>();
            start = end + 1;
            match kind {
                b'o' => {
                    overlay_target = path;
                    continue;
                }
                // An overlay on its own lower layer: the agent reads the directory as it is,
                // and what it changes goes to the upper layer.
                b'O' => {
                    if overlay_target.is_null()
                        || libc::mount(
                            c"crew-private".as_ptr(),
                            overlay_target,
                            c"overlay".as_ptr(),
                            libc::MS_NOSUID | libc::MS_NODEV,
                            path.cast(),
                        ) != 0
                    {
                        return Err(error());
                    }
                    overlay_target = std::ptr::null();
                    continue;
                }
                // Covered: by a small empty directory of its own, or by /dev/null.
                b'd' => {
                    if libc::mount(
                        c"crew-hidden".as_ptr(),
                        path,
                        c"tmpfs".as_ptr(),
                        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                        c"size=16k,mode=0700".as_ptr().cast(),
                    ) != 0
                    {
                        return Err(error());
                    }
                    continue;
                }
                b'f' => {
                    if libc::mount(
                        c"/dev/null".as_ptr(),
                        path,
                        none,
                        libc::MS_BIND,
                        std::ptr::null(),
                    ) != 0
                    {
                        return Err(error());
                    }
                    continue;
                }
                // Listened on once confined: see `listen_for_own_connections`.
                b'c' => continue,
                b'r' => {}
                _ => return Err(invalid()),
            }
            if libc::mount(
                path,
                path,
                none,
                libc::MS_BIND | libc::MS_REC,
                std::ptr::null(),
            ) != 0
            {
                return Err(error());
            }
            if libc::syscall(
                libc::SYS_mount_setattr,
                libc::AT_FDCWD,
                path,
                libc::AT_RECURSIVE as libc::c_uint,
                &attr as *const MountAttr,
                std::mem::size_of::<MountAttr>(),
            ) != 0
            {
                return Err(error());
            }
        }
    }
    Ok(())
}

/// The name of the agent's own connection a namespace plan holds (see [`Namespace::control`]).
///
/// Async-signal-safe: it only reads the plan.
pub(crate) fn plan_control_name(plan: &[u8]) -> Option<&[u8]> {
    let (&flags, rest) = plan.split_first()?;
    let mut entries = if flags & PLAN_TERMINALS != 0 {
        rest.get(16..)?
    } else {
        rest
    };
    while let Some(end) = entries.iter().position(|byte| *byte == 0) {
        let (entry, after) = entries.split_at(end);
        if let Some((&b'c', name)) = entry.split_first() {
            return Some(name);
        }
        entries = &after[1..];
    }
    None
}

/// Listens on the abstract unix socket `name` and sends the listening socket over `channel`
/// to the host, then closes it here: called once the agent's process is confined, so that the
/// socket is its Landlock domain's, which only that domain may connect to (ABI 6 scoping):
/// the agent and what it starts, never another agent. The host serves it as that agent.
///
/// # Safety
/// Async-signal-safe: a socket, bind, listen, one `sendmsg`, a close, all on this frame.
pub(crate) unsafe fn listen_for_own_connections(
    channel: libc::c_int,
    name: &[u8],
) -> std::io::Result<()> {
    // SAFETY: every structure is plain data on this frame, sized as the calls expect.
    unsafe {
        let mut address: libc::sockaddr_un = std::mem::zeroed();
        if name.is_empty() || name.len() + 1 > address.sun_path.len() {
            return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
        }
        address.sun_family = libc::AF_UNIX as libc::sa_family_t;
        // An abstract name: a leading NUL, then the name, no terminator.
        for (at, byte) in name.iter().enumerate() {
            address.sun_path[at + 1] = *byte as libc::c_char;
        }
        let length = std::mem::size_of::<libc::sa_family_t>() + 1 + name.len();
        let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let listening = libc::bind(
            fd,
            (&address as *const libc::sockaddr_un).cast(),
            length as libc::socklen_t,
        ) == 0
            && libc::listen(fd, 64) == 0;
        let result = if listening {
            send_descriptor(channel, fd)
        } else {
            Err(std::io::Error::last_os_error())
        };
        libc::close(fd);
        result
    }
}

/// Whether a namespace plan (see [`Namespace::encode`]) asks for the proxy's socket.
pub(crate) fn plan_wants_proxy(plan: &[u8]) -> bool {
    plan.first().is_some_and(|flags| flags & PLAN_PROXY != 0)
}

/// Listens on the proxy's port of the calling process's (own) loopback and sends the
/// listening socket over `channel` (a unix socket whose other end the host holds), then
/// closes it here: only the host accepts on it, and the agent's programs cannot take the port.
///
/// # Safety
/// Async-signal-safe: a socket, bind, listen, one `sendmsg` of a message on the stack, a close.
pub(crate) unsafe fn listen_for_host(channel: libc::c_int) -> std::io::Result<()> {
    // SAFETY: every structure is plain data on this frame, sized as the calls expect.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut address: libc::sockaddr_in = std::mem::zeroed();
        address.sin_family = libc::AF_INET as libc::sa_family_t;
        address.sin_port = crate::proxy::PROXY_PORT.to_be();
        address.sin_addr.s_addr = u32::from_be_bytes([127, 0, 0, 1]).to_be();
        let bound = libc::bind(
            fd,
            (&address as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        ) == 0
            && libc::listen(fd, 1024) == 0;
        let result = if bound {
            send_descriptor(channel, fd)
        } else {
            Err(std::io::Error::last_os_error())
        };
        libc::close(fd);
        result
    }
}

/// Room for one descriptor's control message, aligned as `cmsghdr` needs.
#[repr(C, align(8))]
struct Control([u8; 64]);

/// A message of one data byte (`data`) with room for a descriptor (`control`), both of the
/// caller's frame, which must outlive it.
fn rights_message(data: &mut libc::iovec, control: &mut Control) -> libc::msghdr {
    // SAFETY: a zeroed `msghdr` is a valid empty one; its pointers are set right below.
    let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
    message.msg_iov = data;
    message.msg_iovlen = 1;
    message.msg_control = control.0.as_mut_ptr().cast();
    message.msg_controllen = control.0.len() as _;
    message
}

/// Sends `fd` over the unix socket `channel` (`SCM_RIGHTS`), with one byte of data.
///
/// # Safety
/// Async-signal-safe; `channel` and `fd` are open descriptors.
unsafe fn send_descriptor(channel: libc::c_int, fd: libc::c_int) -> std::io::Result<()> {
    // SAFETY: the control buffer is aligned and sized for one descriptor; the header's
    // pointers point into this frame.
    unsafe {
        let mut control = Control([0; 64]);
        let mut byte = [1u8];
        let mut data = libc::iovec {
            iov_base: byte.as_mut_ptr().cast(),
            iov_len: 1,
        };
        let mut message = rights_message(&mut data, &mut control);
        message.msg_controllen = libc::CMSG_SPACE(std::mem::size_of::<libc::c_int>() as u32) as _;
        let header = libc::CMSG_FIRSTHDR(&message);
        (*header).cmsg_level = libc::SOL_SOCKET;
        (*header).cmsg_type = libc::SCM_RIGHTS;
        (*header).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<libc::c_int>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(header).cast::<libc::c_int>(), fd);
        if libc::sendmsg(channel, &message, libc::MSG_NOSIGNAL) != 1 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
}

/// Receives the descriptor [`listen_for_host`] sent on `channel`, without waiting: `None`
/// when nothing came.
pub(crate) fn receive_descriptor(channel: &OwnedFd) -> Option<OwnedFd> {
    let mut control = Control([0; 64]);
    let mut byte = [0u8];
    let mut data = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    let mut message = rights_message(&mut data, &mut control);
    // SAFETY: the message's buffers are this frame's; a descriptor received is owned at once.
    unsafe {
        let received = libc::recvmsg(
            channel.as_raw_fd(),
            &mut message,
            libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC,
        );
        if received != 1 {
            return None;
        }
        let header = libc::CMSG_FIRSTHDR(&message);
        if header.is_null()
            || (*header).cmsg_level != libc::SOL_SOCKET
            || (*header).cmsg_type != libc::SCM_RIGHTS
        {
            return None;
        }
        let fd = std::ptr::read_unaligned(libc::CMSG_DATA(header).cast::<libc::c_int>());
        (fd >= 0).then(|| OwnedFd::from_raw_fd(fd))
    }
}

/// Raises the loopback interface of the calling process's network namespace.
///
/// # Safety
/// Async-signal-safe: a socket, two ioctls on a request on the stack, a close.
unsafe fn loopback_up() -> std::io::Result<()> {
    // SAFETY: `ifreq` is plain data; the ioctls read and write only it.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut request: libc::ifreq = std::mem::zeroed();
        for (slot, byte) in request.ifr_name.iter_mut().zip(b"lo\0") {
            *slot = *byte as libc::c_char;
        }
        let mut result = Ok(());
        if libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut request) != 0 {
            result = Err(std::io::Error::last_os_error());
        } else {
            request.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
            if libc::ioctl(fd, libc::SIOCSIFFLAGS, &request) != 0 {
                result = Err(std::io::Error::last_os_error());
            }
        }
        libc::close(fd);
        result
    }
}

/// Adds to `ruleset` a rule that `access` is allowed beneath `path`.
///
/// # Safety
/// Async-signal-safe; `path` is NUL-terminated.
unsafe fn grant(ruleset: libc::c_int, path: &std::ffi::CStr, access: u64) -> std::io::Result<()> {
    /// `struct landlock_path_beneath_attr`, packed as the kernel declares it.
    #[repr(C, packed)]
    struct PathBeneathAttr {
        allowed_access: u64,
        parent_fd: i32,
    }
    const LANDLOCK_RULE_PATH_BENEATH: libc::c_int = 1;
    // SAFETY: open, one rule of a ruleset this process holds, close.
    unsafe {
        let fd = libc::open(
            path.as_ptr(),
            libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        );
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let attr = PathBeneathAttr {
            allowed_access: access,
            parent_fd: fd,
        };
        let added = libc::syscall(
            libc::SYS_landlock_add_rule,
            ruleset,
            LANDLOCK_RULE_PATH_BENEATH,
            &attr as *const PathBeneathAttr,
            0u32,
        );
        let result = if added == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        };
        libc::close(fd);
        result
    }
}

/// `<id> <id> 1`: a namespace's map of one id onto itself, in `line`.
fn id_map(line: &mut [u8; 32], id: u32) -> &[u8] {
    let mut digits = [0u8; 10];
    let digits = crate::spawn::decimal(id, &mut digits);
    let mut length = 0;
    for part in [digits, b" ", digits, b" 1"] {
        line[length..length + part.len()].copy_from_slice(part);
        length += part.len();
    }
    &line[..length]
}

/// Writes `contents` to a file of `/proc/self`.
///
/// # Safety
/// Async-signal-safe; `path` is NUL-terminated.
unsafe fn write_proc(path: &std::ffi::CStr, contents: &[u8]) -> std::io::Result<()> {
    // SAFETY: open, write and close of one file.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let written = libc::write(fd, contents.as_ptr().cast(), contents.len());
        let result = if written == contents.len() as isize {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        };
        libc::close(fd);
        result
    }
}

/// A path a rule is written for, opened once (`O_PATH`, never through a link).
#[derive(Debug)]
struct Beneath {
    fd: OwnedFd,
    is_dir: bool,
}

impl Beneath {
    /// Every write right beneath a directory; on a file, those a file can have.
    fn access(&self) -> landlock::BitFlags<AccessFs> {
        if self.is_dir {
            AccessFs::from_write(FS_ABI)
        } else {
            AccessFs::from_write(FS_ABI) & AccessFs::from_file(FS_ABI)
        }
    }
}

/// Opens `path` for a rule; `None` when it is missing or a link (a rule would follow a link the
/// agent could have planted).
fn open_beneath(path: &Utf8Path) -> Option<Beneath> {
    use rustix::fs::{FileType, Mode, OFlags};
    let fd = rustix::fs::open(
        path.as_std_path(),
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    let kind = FileType::from_raw_mode(rustix::fs::fstat(&fd).ok()?.st_mode);
    match kind {
        FileType::Symlink => None,
        _ => Some(Beneath {
            fd,
            is_dir: kind == FileType::Directory,
        }),
    }
}

/// The device files every agent may write, opened once per process.
fn devices() -> &'static [Beneath] {
    static DEVICES: OnceLock<Vec<Beneath>> = OnceLock::new();
    DEVICES.get_or_init(|| {
        DEVICE_FILES
            .iter()
            .filter_map(|path| open_beneath(Utf8Path::new(path)))
            .collect()
    })
}

/// Applies a ruleset built by [`prepare`] to the calling process: no new privileges (setuid
/// programs cannot lift the sandbox), then the ruleset.
///
/// # Safety
/// Runs between fork and exec: only async-signal-safe system calls, no allocation.
pub(crate) unsafe fn restrict_self(ruleset: libc::c_int) -> std::io::Result<()> {
    // SAFETY: plain system calls on this process.
    unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if libc::syscall(libc::SYS_landlock_restrict_self, ruleset, 0u32) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// What a real confined process could and could not do on this machine.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Probe {
    /// The kernel's Landlock ABI version, if it has Landlock.
    pub abi: Option<u32>,
    /// The confined process wrote inside the directory it was given.
    pub inside_written: bool,
    /// Its write beside that directory was refused.
    pub outside_refused: bool,
}

impl Probe {
    /// The sandbox works here as crew relies on it.
    pub fn confines(&self) -> bool {
        self.abi.is_some() && self.inside_written && self.outside_refused
    }
}

/// Checks, with a real process, that this machine confines agents: `sh`, confined the way an
/// agent is to a fresh temp dir, writes a file inside it and tries to write one beside it.
pub fn probe() -> std::io::Result<Probe> {
    use std::os::unix::process::CommandExt;
    let scratch = tempfile::Builder::new().prefix("crew-probe-").tempdir()?;
    let root = Utf8PathBuf::from_path_buf(scratch.path().to_owned())
        .map_err(|_| std::io::Error::other("the temp dir is not UTF-8"))?;
    let inside = root.join("inside");
    let outside = root.join("outside");
    std::fs::create_dir(&inside)?;
    let prepared = prepare(&SandboxPlan::confined_to(inside.clone()), &[], None)
        .map_err(|error| std::io::Error::other(error.to_string()))?;
    let mut command = std::process::Command::new("sh");
    command
        .arg("-c")
        .arg("echo x > inside/file; echo x > outside")
        .current_dir(&root)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    if let Some(ruleset) = prepared.ruleset {
        // SAFETY: the closure makes only the two system calls of `restrict_self`, and keeps the
        // ruleset open until the command is dropped.
        unsafe {
            command.pre_exec(move || restrict_self(std::os::fd::AsRawFd::as_raw_fd(&ruleset)));
        }
    }
    command.status()?;
    Ok(Probe {
        abi: kernel_abi(),
        inside_written: inside.join("file").exists(),
        outside_refused: !outside.exists(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_finds_this_machine_confines() {
        let probe = probe().unwrap();
        assert!(probe.confines(), "{probe:?}");
    }

    #[test]
    fn a_namespace_map_names_one_id_onto_itself() {
        let mut line = [0u8; 32];
        assert_eq!(id_map(&mut line, 0), b"0 0 1");
        assert_eq!(id_map(&mut line, 65534), b"65534 65534 1");
        assert_eq!(id_map(&mut line, u32::MAX), b"4294967295 4294967295 1");
    }

    #[test]
    fn off_builds_nothing_and_says_so() {
        let plan = SandboxPlan {
            mode: SandboxMode::Off,
            write: vec!["/tmp".into()],
            read_only: Vec::new(),
            private: Vec::new(),
            network: NetworkMode::Open,
            hosts: Vec::new(),
            allow_open_network: false,
        };
        let prepared = prepare(&plan, &[], None).unwrap();
        assert!(prepared.ruleset.is_none());
        assert_eq!(prepared.record.state, SandboxState::Off);
    }

    #[test]
    fn missing_and_linked_paths_are_not_granted() {
        let dir = tempfile::tempdir().unwrap();
        let root = Utf8PathBuf::from_path_buf(dir.path().to_owned()).unwrap();
        let link = root.join("link");
        std::os::unix::fs::symlink("/", &link).unwrap();
        let plan = SandboxPlan::confined_to(root.clone());
        let prepared = prepare(&plan, &[root.join("absent"), link.clone()], None).unwrap();
        assert!(
            kernel_abi().is_some(),
            "crew's machines have Landlock (see ARCHITECTURE.md); this kernel does not"
        );
        assert_eq!(prepared.record.state, SandboxState::Enforced);
        assert!(prepared.ruleset.is_some());
        assert_eq!(prepared.record.write, std::slice::from_ref(&root));
        assert_eq!(prepared.record.missing, [root.join("absent"), link]);
    }
}
