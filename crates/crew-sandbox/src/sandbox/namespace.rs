//! The namespace plan of a confined agent: what its process makes of a user, mount and
//! network namespace of its own before it applies its ruleset (private views, read-only
//! places, covered sockets, its own terminals, its own network), encoded for a process that
//! may not allocate to read.

use std::sync::OnceLock;

use camino::{Utf8Path, Utf8PathBuf};
use crew_core::provider::PrivateView;
use landlock::{ABI, Access, AccessFs};

use super::enter::{child_succeeds, enter_namespace};
use super::partial::{Kept, PartialView};
use super::{FS_ABI, kernel_abi};

/// A namespace plan's flag: private terminals.
pub(super) const PLAN_TERMINALS: u8 = 1;
/// A namespace plan's flag: a network namespace of its own.
pub(super) const PLAN_NO_NETWORK: u8 = 2;
/// A namespace plan's flag: a network namespace of its own, where the agent's process listens
/// on the proxy's port for its host (see [`crate::proxy`]).
pub(super) const PLAN_PROXY: u8 = 4;
/// A namespace plan's flag: every mount read-only but the places it may write (see
/// [`Namespace::writable`]).
pub(super) const PLAN_READ_ONLY_ELSEWHERE: u8 = 8;
/// A namespace plan's flag: shared memory of its own (see [`Namespace::shared_memory`]).
pub(super) const PLAN_SHARED_MEMORY: u8 = 16;
/// The flags with which a plan carries the ruleset's write rights after its flags byte.
pub(super) const PLAN_ACCESS: u8 = PLAN_TERMINALS | PLAN_SHARED_MEMORY;

/// What a confined agent's process makes of a user and mount namespace of its own, before its
/// ruleset (which then forbids changing mounts, so the agent cannot undo it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Namespace {
    /// Every mount made read-only, but `writable` (each bound onto itself first) and the
    /// private views. Landlock refuses writes elsewhere, but not a file's metadata: without
    /// this the agent could `chmod` (or `touch`, or set attributes of) any file its user owns,
    /// or, as root, any file of the system's — make a private key world-readable, a pack
    /// unreadable, a root-owned program setuid.
    pub read_only_elsewhere: bool,
    /// The places it may write, which stay writable when the rest is made read-only.
    pub writable: Vec<Utf8PathBuf>,
    /// Overlaid first, each with its changes going to crew's directory.
    pub private: Vec<PrivateView>,
    /// Bound onto themselves read-only (after the overlays, so beneath one too).
    pub read_only: Vec<Utf8PathBuf>,
    /// A private instance of the terminal devices mounted over `/dev/pts`, its `ptmx` over
    /// `/dev/ptmx`: the agent's programs get pseudo-terminals of their own (a shell tool's
    /// `forkpty`), and the user's terminals (`/dev/pts/N`) are not there for it to open.
    pub terminals: bool,
    /// A tmpfs of its own mounted over `/dev/shm`: POSIX shared memory (and the semaphores
    /// named there) works for the agent's programs, and none of the user's other programs'
    /// (a browser's, a database's, the sound server's) is there for it to read, fill or
    /// remove.
    pub shared_memory: bool,
    /// A network namespace of its own, with only its own loopback up: no network at all.
    pub isolated_network: bool,
    /// In that namespace, the proxy's listening socket, made before the agent's program
    /// starts and handed to its host (`network = "proxy"`).
    pub proxy: bool,
    /// The directories it sees only in part (see [`partial_views`](super::partial_views)), outermost first: made
    /// first, so that everything after finds its paths there.
    pub partial: Vec<PartialView>,
    /// The user's own servers' unix sockets, covered (see [`user_sockets`]).
    pub hidden: Vec<Hidden>,
    /// The name of the agent's own connection to its host: an abstract unix socket its process
    /// listens on once confined (so that only its own Landlock domain may connect) and hands
    /// to its host, which serves every connection on it as that agent (`CREW_SOCKET=@name`).
    pub control: Option<String>,
}

impl Namespace {
    /// The plan as the agent's process reads it between fork and exec: a byte of flags
    /// (`PLAN_TERMINALS`, `PLAN_NO_NETWORK`, `PLAN_PROXY`,
    /// `PLAN_READ_ONLY_ELSEWHERE`, `PLAN_SHARED_MEMORY`); with terminals or shared memory
    /// (granted in the agent's process, once mounted), the write rights of a directory and of
    /// a file as the ruleset handles them, eight bytes each; then entries of a kind byte and a
    /// path (or an overlay's options) ended by a NUL: each writable place (`w`, or `W` where a partial view binds it back), each overlay
    /// (`o` its target, `O` its options), each read-only path (`r`), each hidden directory
    /// (`d`) and file (`f`), and the name of the agent's own connection (`c`). The partial
    /// views come first, each its directory (`H`), then beneath it, relative, each directory
    /// (`K`) and file (`k`) bound back and each link made again (`L` the link, `T` where it
    /// leads).
    pub fn encode(&self) -> std::io::Result<Vec<u8>> {
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
        if self.read_only_elsewhere {
            flags |= PLAN_READ_ONLY_ELSEWHERE;
        }
        if self.shared_memory {
            flags |= PLAN_SHARED_MEMORY;
        }
        let mut plan = vec![flags];
        if self.terminals || self.shared_memory {
            let handled = AccessFs::from_write(FS_ABI)
                & AccessFs::from_all(ABI::from(kernel_abi().map_or(0, |abi| abi as i32)));
            let file = handled & AccessFs::from_file(FS_ABI);
            plan.extend_from_slice(&handled.bits().to_le_bytes());
            plan.extend_from_slice(&file.bits().to_le_bytes());
        }
        // A place its partial view binds back is a mount of its own already (`W`): bound
        // onto itself again, it would only cost a mount.
        let writable = self
            .writable
            .iter()
            .filter(|_| self.read_only_elsewhere)
            .map(
                |path| match self.partial.iter().any(|view| view.binds(path)) {
                    true => (b'W', path.to_string()),
                    false => (b'w', path.to_string()),
                },
            );
        let overlays = self.private.iter().flat_map(|view| {
            [
                (b'o', view.target.to_string()),
                (b'O', overlay_options(view).unwrap_or_default()),
            ]
        });
        let home = self.partial.iter().flat_map(|view| {
            std::iter::once((b'H', view.dir.to_string())).chain(view.kept.iter().flat_map(|kept| {
                match kept {
                    Kept::Directory(path) => vec![(b'K', path.to_string())],
                    Kept::File(path) => vec![(b'k', path.to_string())],
                    Kept::Link(path, target) => {
                        vec![(b'L', path.to_string()), (b'T', target.to_string())]
                    }
                }
            }))
        });
        let entries = home
            .chain(writable)
            .chain(overlays)
            .chain(
                self.read_only
                    .iter()
                    .map(|path| (b'r', path.to_string()))
                    // Beneath a directory seen in part, on none of its places, a cover
                    // would cover what is not there: none is made (the record names it).
                    .chain(
                        self.hidden
                            .iter()
                            .filter(|hidden| {
                                !self.partial.iter().any(|view| view.hides(hidden.path()))
                            })
                            .map(|hidden| match hidden {
                                Hidden::Directory(path) => (b'd', path.to_string()),
                                Hidden::File(path) => (b'f', path.to_string()),
                            }),
                    ),
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
pub(super) fn overlay_options(view: &PrivateView) -> Option<String> {
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
pub(super) fn overlays_work(view: &PrivateView) -> bool {
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
        unsafe { child_succeeds(|| enter_namespace(&plan, None, None).is_ok()) }
    })
}

/// A place the agent's namespace covers so that what is there cannot be reached from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hidden {
    /// A directory, covered by an empty one (a small tmpfs of the agent's own).
    Directory(Utf8PathBuf),
    /// A file (a socket), covered by an empty file of the agent's own.
    File(Utf8PathBuf),
}

impl Hidden {
    /// The place covered.
    pub fn path(&self) -> &Utf8Path {
        match self {
            Hidden::Directory(path) | Hidden::File(path) => path,
        }
    }
}

/// The places where the user's own programs listen on pathname unix sockets, which an agent's
/// sandbox cannot scope (Landlock scopes abstract sockets only): the per-user runtime
/// directory (session bus, ssh and gpg agents, a rootless container engine, the desktop), tmux's
/// and screen's socket directories, the X server's, the container engines' system sockets, and
/// wherever the user's environment places them instead (`XDG_RUNTIME_DIR` beside
/// `/run/user/<uid>`, `TMUX_TMPDIR` and `TMUX`, `DBUS_SESSION_BUS_ADDRESS`, `DOCKER_HOST`,
/// `CONTAINER_HOST`, `SSH_AUTH_SOCK`, `GNUPGHOME`). Those that exist are hidden from the agent,
/// unless `keep` holds them or lies beneath them (its workspace, its temp dir, a path its
/// definition grants).
pub fn user_sockets(home: Option<&Utf8Path>, keep: &[Utf8PathBuf]) -> Vec<Hidden> {
    let uid = rustix::process::getuid().as_raw();
    let variable = |name: &str| std::env::var(name).ok().filter(|value| !value.is_empty());
    let absolute = |path: &str| path.starts_with('/').then(|| Utf8PathBuf::from(path));
    let mut directories = vec![Utf8PathBuf::from(format!("/run/user/{uid}"))];
    directories.extend(variable("XDG_RUNTIME_DIR").and_then(|dir| absolute(&dir)));
    directories.extend([
        Utf8PathBuf::from(format!("/tmp/tmux-{uid}")),
        Utf8PathBuf::from("/tmp/.X11-unix"),
        Utf8PathBuf::from("/run/screen"),
        Utf8PathBuf::from(format!("/run/screen/S-{uid}")),
    ]);
    if let Some(dir) = variable("TMUX_TMPDIR").and_then(|dir| absolute(&dir)) {
        directories.push(dir.join(format!("tmux-{uid}")));
    }
    // `TMUX` is `<socket>,<pid>,<session>`: the server's socket directory.
    if let Some(socket) = variable("TMUX").and_then(|tmux| {
        let socket = tmux.split(',').next()?.to_owned();
        absolute(&socket)
    }) && let Some(dir) = socket.parent()
    {
        directories.push(dir.to_owned());
    }
    if let Some(home) = home {
        directories.push(home.join(".gnupg"));
    }
    directories.extend(variable("GNUPGHOME").and_then(|dir| absolute(&dir)));
    let mut files = vec![
        Utf8PathBuf::from("/var/run/docker.sock"),
        Utf8PathBuf::from("/run/docker.sock"),
        Utf8PathBuf::from("/run/podman/podman.sock"),
        Utf8PathBuf::from("/run/containerd/containerd.sock"),
    ];
    files.extend(variable("SSH_AUTH_SOCK").and_then(|agent| absolute(&agent)));
    for engine in ["DOCKER_HOST", "CONTAINER_HOST"] {
        files.extend(
            variable(engine).and_then(|host| host.strip_prefix("unix://").and_then(absolute)),
        );
    }
    // The session bus: `unix:path=<socket>` (or `dir=`, `tmpdir=` where it makes one), several
    // addresses separated by `;`; an abstract one is scoped by Landlock already.
    if let Some(bus) = variable("DBUS_SESSION_BUS_ADDRESS") {
        for address in bus.split(';') {
            let Some(keys) = address.strip_prefix("unix:") else {
                continue;
            };
            for (key, value) in keys.split(',').filter_map(|pair| pair.split_once('=')) {
                match key {
                    "path" => files.extend(absolute(value)),
                    "dir" | "tmpdir" => directories.extend(absolute(value)),
                    _ => {}
                }
            }
        }
    }
    hiding(directories, files, keep)
}

/// The user's stores of secrets beneath the home, by where their programs keep them: keys
/// (ssh), cloud and cluster credentials (AWS, Azure, Google Cloud, Kubernetes), registry and
/// forge tokens (Docker, npm, PyPI, cargo, RubyGems, GitHub's CLI, git's credential store,
/// netrc, Vault), password stores and keyrings, browser profiles.
const SECRET_DIRECTORIES: &[&str] = &[
    ".ssh",
    ".aws",
    ".azure",
    ".config/gcloud",
    ".kube",
    ".config/gh",
    ".config/hub",
    ".password-store",
    ".local/share/keyrings",
    ".mozilla",
    ".config/google-chrome",
    ".config/chromium",
    ".config/BraveSoftware",
    ".terraform.d",
];

/// Files of secrets beneath the home (see [`SECRET_DIRECTORIES`]).
const SECRET_FILES: &[&str] = &[
    ".git-credentials",
    ".config/git/credentials",
    ".netrc",
    ".docker/config.json",
    ".npmrc",
    ".pypirc",
    ".cargo/credentials.toml",
    ".cargo/credentials",
    ".gem/credentials",
    ".vault-token",
    // The agent programs' own logins: crew holds their keys by reference.
    ".claude/.credentials.json",
    ".codex/auth.json",
    ".gemini/oauth_creds.json",
];

/// The user's secret stores beneath `home` that exist, hidden from an agent whose grants are
/// `grants` even where one of them holds the store (`~/` granted whole, `~/.config/`): only a
/// grant that names a store exactly keeps it. A store holding a grant of the agent's is
/// covered around it, entry by entry.
pub fn secret_stores(home: &Utf8Path, grants: &[Utf8PathBuf]) -> Vec<Hidden> {
    let named = |path: &Utf8Path| grants.iter().any(|granted| granted == path);
    let within: Vec<Utf8PathBuf> = grants.to_vec();
    // A store that is a link (a dotfile manager's) is covered where it leads: the agent reads
    // through the link, and a mount on the link would land there anyway.
    let resolved = |path: Utf8PathBuf| -> Option<Utf8PathBuf> {
        let metadata = std::fs::symlink_metadata(&path).ok()?;
        match metadata.is_symlink() {
            true => path.canonicalize_utf8().ok(),
            false => Some(path),
        }
    };
    let mut hidden = Vec::new();
    for store in SECRET_DIRECTORIES.iter().map(|dir| home.join(dir)) {
        if named(&store) {
            continue;
        }
        let Some(directory) = resolved(store) else {
            continue;
        };
        let is_dir = std::fs::symlink_metadata(&directory).is_ok_and(|metadata| metadata.is_dir());
        if !is_dir || named(&directory) || covered(&hidden, &directory) {
            continue;
        }
        // Grants inside the store are kept (covered around); grants above it are not.
        let inside: Vec<Utf8PathBuf> = within
            .iter()
            .filter(|granted| granted.starts_with(&directory))
            .cloned()
            .collect();
        cover(&directory, &inside, &mut hidden, 0);
    }
    for store in SECRET_FILES.iter().map(|file| home.join(file)) {
        if named(&store) {
            continue;
        }
        let Some(file) = resolved(store) else {
            continue;
        };
        let is_file = std::fs::symlink_metadata(&file).is_ok_and(|metadata| metadata.is_file());
        if is_file && !named(&file) && !covered(&hidden, &file) {
            hidden.push(Hidden::File(file));
        }
    }
    hidden
}

/// The covers that hide `directories` and `files` (those that exist) from an agent whose
/// grants are `keep`: see [`user_sockets`].
pub(super) fn hiding(
    directories: Vec<Utf8PathBuf>,
    files: Vec<Utf8PathBuf>,
    keep: &[Utf8PathBuf],
) -> Vec<Hidden> {
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
        // Beneath a directory already covered it is gone with it, and a mount there would
        // find nothing to mount on (`/run/screen/S-<uid>` beneath `/run/screen`).
        if !covered(&hidden, &directory) {
            cover(&directory, keep, &mut hidden, 0);
        }
    }
    let files: Vec<Hidden> = files
        .into_iter()
        .filter(|path| is(path, false) && !kept(path))
        .filter(|path| !covered(&hidden, path))
        .map(Hidden::File)
        .collect();
    hidden.extend(files);
    hidden
}

/// Whether `path` is covered already by one of `hidden`, or lies beneath a directory that
/// is (and so is gone with it: nothing is there to mount on in the agent's namespace).
pub(super) fn covered(hidden: &[Hidden], path: &Utf8Path) -> bool {
    hidden.iter().any(|hidden| match hidden {
        Hidden::Directory(dir) => path.starts_with(dir),
        Hidden::File(file) => file == path,
    })
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
