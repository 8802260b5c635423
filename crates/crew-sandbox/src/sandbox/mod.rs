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
//!   and, where it has a namespace, every other mount is read-only in it, so that what it may
//!   not write it may not `chmod`, `touch` or give attributes either (Landlock does not cover
//!   metadata);
//! - signals to processes outside its own sandbox are refused (Landlock ABI 6 and newer), so an
//!   agent cannot kill its host or the user's other programs;
//! - the kernel's keyrings, which no namespace confines, are closed by a seccomp filter (see
//!   `keyrings`);
//! - it keeps no capability, nor gains one by its exec (its warden drops them all last, see
//!   `crate::spawn`).
//!
//! The ruleset is built in the host (opening the paths allocates); the agent's warden inherits
//! its descriptor, and the process it forks for the agent only makes the two system calls that
//! apply it.
//!
//! Where the kernel has no Landlock, or the user turned the sandbox off, agents run unconfined;
//! the task's record says so, and crew's own checks (the tripwire on the shared git directory,
//! teardown that acts only on the directory it created) still hold.
#![allow(unsafe_code)]

use std::os::fd::{AsFd, OwnedFd};
use std::sync::OnceLock;

use camino::{Utf8Path, Utf8PathBuf};
use crew_core::config::{HostList, NetworkMode, SandboxMode};
use crew_core::model::{SandboxRecord, SandboxState};
use crew_core::paths::DirIdentity;
use crew_core::provider::PrivateView;
use landlock::{
    ABI, Access, AccessFs, CompatLevel, Compatible, PathBeneath, Ruleset, RulesetAttr,
    RulesetCreatedAttr, Scope,
};

mod descriptors;
mod enter;
mod keyrings;
mod namespace;
mod partial;
mod user_namespace;

pub use keyrings::close_keyrings;

pub use descriptors::{
    listen_for_host, listen_for_own_connections, plan_control_name, plan_wants_proxy,
    receive_descriptor,
};
pub use enter::{enter_namespace, restrict_self};
pub use enter::{namespaces_work, private_terminals_work};
pub use namespace::{Hidden, Namespace, secret_stores, user_sockets};
use namespace::{overlay_options, overlays_work};
pub use partial::{Kept, PartialView, in_system, partial_directories, partial_views};
pub use user_namespace::shared_user_namespace;

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
    SHARED_MEMORY,
];

/// The kernel's listing of the keys a process may view, covered for a confined agent.
const KEYS_LISTING: &str = "/proc/keys";

/// Where POSIX shared memory lives: an agent with a namespace gets its own there.
pub const SHARED_MEMORY: &str = "/dev/shm";

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
    /// Beneath the user's home, what it may read besides what it may write (its definition's
    /// `read`, the toolchains): the rest of the home is not there for it, where the kernel
    /// has namespaces (see [`PartialView`]).
    pub read: Vec<Utf8PathBuf>,
    /// The home and every directory not the system's are seen only in part: what it may reach
    /// beneath (see [`PartialView`]). `false`: as its user sees them, for a library whose
    /// agents must read beyond what they name; crew's own tasks never.
    pub reads_in_part: bool,
    /// What it reaches of the network (the narrower of the project's and its definition's).
    pub network: NetworkMode,
    /// With `proxy`, the lists of hosts that apply besides its definition's (the project's):
    /// a request must be in every one.
    pub hosts: Vec<HostList>,
    /// A setting named `network` (see [`crew_core::config::Network`]): where the kernel cannot
    /// give it, the start is refused. Unnamed (crew's default), it gives way to the open
    /// network, recorded as `network_unmet`.
    pub network_named: bool,
    /// Where the kernel cannot give the narrower network, run with the open one (recorded as
    /// `network_unmet`) instead of refusing the start.
    pub allow_open_network: bool,
    /// Lock files crew takes (its state's, its repository's): covered in the agent's
    /// namespace, since holding a lock needs no right to write and an agent holding one would
    /// stall its host and every other task.
    pub locks: Vec<Utf8PathBuf>,
    /// Which directory `write[0]`, the workspace, is (recorded when crew made it): the rule
    /// granting it is written for that directory, reached with no link on the way, or the
    /// start is refused. `None`: whatever is there (a project folder of the user's).
    pub workspace: Option<DirIdentity>,
    /// Its caps (DESIGN §8c): a cgroup of its own holds it and all it starts to them (see
    /// [`crate::caps`]), with the sandbox on or off.
    pub caps: crew_core::config::Resources,
    /// Where no cgroup can be had, run it without its caps (said on the task) instead of
    /// refusing the start.
    pub allow_uncapped: bool,
}

impl SandboxPlan {
    /// Confined to `dir` (plus the agent's own temp dir and its definition's paths).
    pub fn confined_to(dir: impl Into<Utf8PathBuf>) -> Self {
        SandboxPlan {
            mode: SandboxMode::Enforce,
            write: vec![dir.into()],
            read_only: Vec::new(),
            private: Vec::new(),
            read: Vec::new(),
            reads_in_part: true,
            network: NetworkMode::Open,
            network_named: true,
            hosts: Vec::new(),
            allow_open_network: false,
            locks: Vec::new(),
            workspace: None,
            caps: crew_core::config::Resources::default(),
            allow_uncapped: false,
        }
    }
}

/// A ruleset built for one start of an agent, ready to be applied in its process.
#[derive(Debug)]
pub struct Prepared {
    /// The Landlock ruleset; `None` when the agent runs unconfined.
    pub ruleset: Option<OwnedFd>,
    /// The namespace the agent's process makes for itself before it applies the ruleset,
    /// where the kernel lets it.
    pub namespace: Option<Namespace>,
    /// With `network = "proxy"`, what its proxy lets through.
    pub proxy: Option<Vec<HostList>>,
    /// What the task's record says of its confinement.
    pub record: SandboxRecord,
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
pub fn prepare(
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
        if plan.network_named && !plan.allow_open_network {
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
                by_reference: Vec::new(),
                held_by_agent: Vec::new(),
                cgroup: None,
                uncapped: None,
                hidden: Vec::new(),
                partial: Vec::new(),
                kept: Vec::new(),
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
    if let (Some(identity), Some(workspace)) = (plan.workspace, plan.write.first()) {
        opened.push(open_workspace(workspace, identity)?);
        write.push(workspace.clone());
    }
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
    // Where the agent gets a namespace, it gets shared memory of its own there (see
    // `Namespace::shared_memory`), and the user's is not granted; unless its definition
    // grants the user's by name (to share it with a program outside, a display server's).
    let own_shared_memory = gets_own_shared_memory(&write);
    let devices = devices()
        .iter()
        .filter(|(path, _)| !(own_shared_memory && *path == SHARED_MEMORY))
        .map(|(_, beneath)| beneath);
    for beneath in opened.iter().chain(devices) {
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
    let home = std::env::var("HOME")
        .ok()
        .filter(|home| home.starts_with('/'))
        .map(Utf8PathBuf::from);
    // What it may reach: its reads, its places, its read-only places, its views and the
    // layers they are made of (mounted after the covers). A cover of the user's never hides
    // what lies within it.
    let reach: Vec<Utf8PathBuf> = plan
        .read
        .iter()
        .chain(&write)
        .chain(&plan.read_only)
        .cloned()
        .chain(private.iter().flat_map(layers))
        .collect();
    let mut namespace = (ruleset.is_some() && namespaces_work()).then(|| Namespace {
        read_only_elsewhere: true,
        // What stays writable when every mount is made read-only: its places (a view is an
        // overlay, writable as it is mounted).
        writable: write
            .iter()
            .filter(|path| !private.iter().any(|view| view.target == **path))
            .cloned()
            .collect(),
        shared_memory: own_shared_memory,
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
        hidden: user_sockets(home.as_deref(), &reach),
        partial: Vec::new(),
        control: None,
    });
    // The rest of the home and every directory not the system's: not there for it. What it
    // may reach beneath is bound back.
    // One where it may reach nothing is covered whole, by the empty cover its other hidden
    // directories share (a bind, where a file system of its own costs three times as much).
    if let Some(namespace) = namespace.as_mut().filter(|_| plan.reads_in_part) {
        let (empty, partial): (Vec<PartialView>, Vec<PartialView>) =
            partial_views(&partial_directories(home.as_deref()), &reach)
                .into_iter()
                .partition(|view| view.kept.is_empty());
        namespace.partial = partial;
        let whole: Vec<Hidden> = empty
            .into_iter()
            .map(|view| Hidden::Directory(view.dir))
            .collect();
        namespace.hidden.splice(0..0, whole);
    }
    // The user's secret stores in the home: not there for the agent, even beneath a grant.
    if let (Some(namespace), Some(home)) = (&mut namespace, &home) {
        let stores: Vec<Hidden> = secret_stores(home, &write)
            .into_iter()
            .filter(|store| !namespace::covered(&namespace.hidden, store.path()))
            .collect();
        namespace.hidden.extend(stores);
    }
    // The user's lease file: an agent that could open it could lock ports no task then gets.
    // A directory that is there (not a link) and holds no grant of the agent's, nor lies
    // within one, can be covered.
    let coverable = |dir: &Utf8Path, hidden: &[Hidden]| {
        std::fs::symlink_metadata(dir).is_ok_and(|metadata| metadata.is_dir())
            && !namespace::covered(hidden, dir)
            && !write
                .iter()
                .any(|granted| granted.starts_with(dir) || dir.starts_with(granted))
    };
    if let (Some(namespace), Some(leases)) = (&mut namespace, crate::lease::Leases::of_user())
        && coverable(leases.dir(), &namespace.hidden)
    {
        namespace
            .hidden
            .push(Hidden::Directory(leases.dir().to_owned()));
    }
    // The kernel's list of the keys the agent may view (`/proc/keys`): their descriptions,
    // which name what the user's login keeps in its keyrings; the keys themselves are closed
    // to it (see `close_keyrings`).
    if let Some(namespace) = &mut namespace
        && std::fs::symlink_metadata(KEYS_LISTING).is_ok_and(|metadata| metadata.is_file())
    {
        namespace
            .hidden
            .push(Hidden::File(Utf8PathBuf::from(KEYS_LISTING)));
    }
    // crew's lock files: a file that is there (not a link) is covered by an empty file of the agent's own (`enter.rs`, `FileCovers`).
    if let Some(namespace) = &mut namespace {
        let locks: Vec<Hidden> = plan
            .locks
            .iter()
            .filter(|lock| {
                std::fs::symlink_metadata(lock).is_ok_and(|metadata| metadata.is_file())
                    && !namespace::covered(&namespace.hidden, lock)
            })
            .map(|lock| Hidden::File(lock.clone()))
            .collect();
        namespace.hidden.extend(locks);
    }
    // Scoped to its own domain (Landlock ABI 6): the agent's own connection.
    if let (Some(namespace), Some(socket)) = (&mut namespace, own_socket)
        && abi.is_some_and(|abi| abi >= 6)
    {
        namespace.control = Some(format!("crew-{}", uuid::Uuid::new_v4().simple()));
        if let Some(dir) = socket
            .parent()
            .filter(|dir| coverable(dir, &namespace.hidden))
        {
            namespace.hidden.push(Hidden::Directory(dir.to_owned()));
        }
    }
    // A narrower network asked, and none to be had: refused, never a silent fallback to the
    // open one.
    if plan.network != NetworkMode::Open && ruleset.is_some() && namespace.is_none() {
        if plan.network_named && !plan.allow_open_network {
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
            by_reference: Vec::new(),
            held_by_agent: Vec::new(),
            cgroup: None,
            uncapped: None,
            unmade: Vec::new(),
            hidden: namespace
                .as_ref()
                .map(|namespace| {
                    namespace
                        .hidden
                        .iter()
                        .map(|hidden| hidden.path().to_owned())
                        .collect()
                })
                .unwrap_or_default(),
            partial: namespace
                .as_ref()
                .map(|namespace| {
                    namespace
                        .partial
                        .iter()
                        .map(|view| view.dir.clone())
                        .collect()
                })
                .unwrap_or_default(),
            kept: namespace
                .as_ref()
                .map(|namespace| {
                    namespace
                        .partial
                        .iter()
                        .flat_map(PartialView::places)
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

/// What an overlay of `view` is made of, as one mount (the kernel wants its upper and work
/// directories beneath the same one): the directory holding both, else each.
fn layers(view: &PrivateView) -> Vec<Utf8PathBuf> {
    match (view.upper.parent(), view.work.parent()) {
        (Some(upper), Some(work)) if upper == work => vec![upper.to_owned()],
        _ => vec![view.upper.clone(), view.work.clone()],
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

/// Opens the workspace crew made at `path` for its rule: reached with no link on the way, and
/// the very directory `identity` names; anything else (a level swapped for a link as it was
/// made, another directory put in its place) refuses the start.
fn open_workspace(path: &Utf8Path, identity: DirIdentity) -> Result<Beneath, BuildSandboxError> {
    let refused = |why: String| BuildSandboxError {
        message: format!("{why}: the task's workspace is not granted"),
    };
    let fd = crew_core::paths::open_dir_without_links(path.as_std_path()).map_err(|error| {
        refused(match identity.check(path) {
            Err(why) => why,
            Ok(()) => format!("{path}: {error}"),
        })
    })?;
    let stat = rustix::fs::fstat(&fd).map_err(|errno| refused(format!("{path}: {errno}")))?;
    if (stat.st_dev, stat.st_ino) != (identity.dev, identity.ino) {
        return Err(refused(format!(
            "{path} is no longer the directory crew created there (it was replaced)"
        )));
    }
    Ok(Beneath { fd, is_dir: true })
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

/// Whether an agent that may write `write` gets a `/dev/shm` of its own (see
/// `Namespace::shared_memory`): where it has a namespace and the user's `/dev/shm` is a
/// directory, unless `write` grants the user's by name.
pub fn gets_own_shared_memory(write: &[Utf8PathBuf]) -> bool {
    namespaces_work()
        && !write.iter().any(|path| path == SHARED_MEMORY)
        && devices()
            .iter()
            .any(|(path, beneath)| *path == SHARED_MEMORY && beneath.is_dir)
}

/// The device files every agent may write, each with its path, opened once per process.
fn devices() -> &'static [(&'static str, Beneath)] {
    static DEVICES: OnceLock<Vec<(&'static str, Beneath)>> = OnceLock::new();
    DEVICES.get_or_init(|| {
        DEVICE_FILES
            .iter()
            .filter_map(|path| Some((*path, open_beneath(Utf8Path::new(path))?)))
            .collect()
    })
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
    use super::user_namespace::id_map;
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
            read: Vec::new(),
            reads_in_part: true,
            network: NetworkMode::Open,
            network_named: true,
            hosts: Vec::new(),
            allow_open_network: false,
            locks: Vec::new(),
            workspace: None,
            caps: crew_core::config::Resources::default(),
            allow_uncapped: false,
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

    /// Two places to cover, one within the other (`/run/screen/S-<uid>` in `/run/screen`):
    /// the inner one is gone with the outer, and an agent's process enters the namespace.
    /// Mounting over both, it failed: nothing was left to mount the inner one on.
    #[test]
    fn places_to_cover_within_one_another_are_covered_once() {
        let dir = tempfile::tempdir().unwrap();
        let root = Utf8PathBuf::from_path_buf(dir.path().to_owned()).unwrap();
        let (outer, inner) = (root.join("screen"), root.join("screen/S-1000"));
        std::fs::create_dir_all(&inner).unwrap();
        std::fs::write(inner.join("socket"), "").unwrap();
        let hidden = namespace::hiding(
            vec![outer.clone(), inner.clone()],
            vec![inner.join("socket")],
            &[],
        );
        assert_eq!(hidden, [Hidden::Directory(outer)]);
        if !namespaces_work() {
            return;
        }
        let plan = Namespace {
            hidden,
            ..Namespace::default()
        }
        .encode()
        .unwrap();
        // SAFETY: the child makes only the namespace's system calls, on a plan made before
        // the fork.
        #[allow(unsafe_code)]
        let entered =
            unsafe { enter::child_succeeds(|| enter::enter_namespace(&plan, None, None).is_ok()) };
        assert!(entered);
    }
}
