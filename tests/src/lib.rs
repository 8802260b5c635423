//! The hermetic test environment shared by crew's black-box tests.
//!
//! Each test gets a temp directory with its own HOME and TMPDIR, git configured to read no
//! global or system config, and helpers to make real repositories with real `git`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::ffi::OsStr;
use std::path::Path;
use std::process::{Command, Output};

use camino::{Utf8Path, Utf8PathBuf};

pub mod model_api;
pub mod slurm;
pub mod synth;

/// A temp directory with a home, a temp dir and room for repositories.
#[derive(Debug)]
pub struct TestEnv {
    _dir: tempfile::TempDir,
    root: Utf8PathBuf,
}

impl Default for TestEnv {
    fn default() -> Self {
        Self::new()
    }
}

impl TestEnv {
    pub fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("crew-test-")
            .tempdir()
            .unwrap();
        Self::in_dir(dir)
    }

    /// Gives everything in the environment to [`NOBODY`], for a test that runs crew as that
    /// user.
    pub fn hand_to_nobody(&self) {
        let chown = Command::new("chown")
            .args(["-R", &format!("{NOBODY}:{NOBODY}"), self.root().as_str()])
            .status()
            .unwrap();
        assert!(chown.success());
    }

    /// An environment another user can reach, for the tests that drop to another uid: made in
    /// `/tmp` (the user's `TMPDIR` may be private) and opened to others (the umask may be 077).
    pub fn reachable_by_others() -> Self {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::Builder::new()
            .prefix("crew-test-")
            .tempdir_in("/tmp")
            .unwrap();
        let env = Self::in_dir(dir);
        for path in [env.root.clone(), env.home(), env.tmp()] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        env
    }

    /// A copy of `binary` another user can run, in this environment's `bin/`: under umask 077
    /// cargo links the test binaries 0700, so the uid a test drops to could not run them.
    pub fn runnable_by_others(&self, binary: &Utf8Path) -> Utf8PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let bin = self.root.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        let copy = bin.join(binary.file_name().unwrap());
        // Made once: a later copy over it would fail while a process crew left (the pool's
        // refill) still runs it.
        if copy.is_file() {
            return copy;
        }
        // Copied by `cp`, not by this process: while this process held the copy open for
        // writing, a child another test forks would inherit that descriptor until its exec,
        // and running the copy would fail with "Text file busy" (it did, twice, in CI).
        let copied = Command::new("cp").arg(binary).arg(&copy).status().unwrap();
        assert!(copied.success(), "cp {binary} {copy}");
        std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
        copy
    }

    fn in_dir(dir: tempfile::TempDir) -> Self {
        hermetic_libgit2();
        let root = Utf8PathBuf::from_path_buf(dir.path().canonicalize().unwrap()).unwrap();
        std::fs::create_dir(root.join("home")).unwrap();
        std::fs::create_dir(root.join("tmp")).unwrap();
        TestEnv { _dir: dir, root }
    }

    /// The temp directory; snapshots show it as `$TEST_ENV`.
    pub fn root(&self) -> &Utf8Path {
        &self.root
    }

    pub fn home(&self) -> Utf8PathBuf {
        self.root.join("home")
    }

    pub fn tmp(&self) -> Utf8PathBuf {
        self.root.join("tmp")
    }

    /// A new empty directory `name` under the test root.
    pub fn dir(&self, name: &str) -> Utf8PathBuf {
        let path = self.root.join(name);
        std::fs::create_dir_all(&path).unwrap();
        path
    }

    /// Applies the hermetic environment to a command: its own HOME and TMPDIR, no global or
    /// system git config, a fixed identity for commits made by the test itself.
    pub fn hermetic<'a>(&self, command: &'a mut Command) -> &'a mut Command {
        command
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", self.home())
            .env("TMPDIR", self.tmp())
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_CONFIG_SYSTEM", "/dev/null")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("LANG", "C")
            .env("NO_COLOR", "1")
    }

    /// Runs `git` in `dir` and returns its stdout; panics with its stderr when it fails.
    pub fn git<I, S>(&self, dir: &Utf8Path, args: I) -> String
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let output = self.git_output(dir, args);
        assert!(
            output.status.success(),
            "git failed in {dir}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap()
    }

    /// Runs `git` in `dir` and returns its whole output, whatever its status.
    #[must_use = "a command whose result is not checked may have failed unseen"]
    pub fn git_output<I, S>(&self, dir: &Utf8Path, args: I) -> Output
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut command = Command::new("git");
        self.hermetic(&mut command)
            .current_dir(dir)
            .env("GIT_AUTHOR_NAME", "Test Author")
            .env("GIT_AUTHOR_EMAIL", "author@example.com")
            .env("GIT_COMMITTER_NAME", "Test Author")
            .env("GIT_COMMITTER_EMAIL", "author@example.com")
            .args(args);
        command.output().unwrap()
    }

    /// A new repository `name` with one commit holding `README.md` and `src/lib.txt`.
    pub fn repo(&self, name: &str) -> Utf8PathBuf {
        let dir = self.dir(name);
        self.git(&dir, ["init", "-q", "-b", "main"]);
        write(&dir.join("README.md"), "# test repository\n");
        write(&dir.join("src/lib.txt"), "one\ntwo\nthree\n");
        self.git(&dir, ["add", "-A"]);
        self.git(&dir, ["commit", "-q", "-m", "initial commit"]);
        dir
    }

    /// Allows the settings of the project at `dir` that loosen the sandbox, as the user would
    /// (`crew sandbox allow`), and says what it allowed.
    pub fn allow_settings(&self, dir: &Utf8Path) -> String {
        let output = self.crew(dir, ["sandbox", "allow"]);
        assert!(output.status.success(), "{}", render_output(&output));
        String::from_utf8(output.stdout).unwrap()
    }

    /// Replaces the test root in `text` with `$TEST_ENV`, for snapshots.
    pub fn redact(&self, text: &str) -> String {
        text.replace(self.root.as_str(), "$TEST_ENV")
    }
}

/// Where a test puts a file that lets an agent of the project at `repo` go on: beside crew's
/// state of the project, which every agent of it reads in every workspace mode (the test's
/// other directories are not there for a confined agent) and none works in. (Not in the git
/// directory, which a `single` agent sees through an overlay that may not show what is made
/// beneath it later.)
pub fn signal(repo: &Utf8Path, name: &str) -> Utf8PathBuf {
    repo.join(".crew/state").join(format!("crew-test-{name}"))
}

/// Writes `contents` to `path`, creating parent directories.
/// The user (and group) tests drop to: file permissions do not hold root back, and an
/// ordinary user's namespaces differ from root's.
pub const NOBODY: u32 = 65534;

/// Whether this test can drop to another uid (it runs as root, as CI does); says it skipped
/// when it cannot.
pub fn can_drop_to_nobody() -> bool {
    let root = rustix::process::geteuid().is_root();
    if !root {
        eprintln!("SKIPPED: dropping to another uid needs root; CI runs as root");
    }
    root
}

pub fn write(path: &Utf8Path, contents: &str) {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    std::fs::write(path, contents).unwrap();
}

/// The error and each of its sources, one per line, as the CLI prints them.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = format!("error: {error}");
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(&format!("\ncaused by: {cause}"));
        source = cause.source();
    }
    text
}

/// Whether the directory `dir` carries the file system's "top of a hierarchy" flag (`chattr
/// +T`); an error where the file system has no file flags.
pub fn places_apart(dir: &camino::Utf8Path) -> std::io::Result<bool> {
    use rustix::fs::{IFlags, Mode, OFlags};
    let handle = rustix::fs::open(
        dir.as_std_path(),
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    Ok(rustix::fs::ioctl_getflags(&handle)?.contains(IFlags::TOPDIR))
}

/// A hash of every file under `dir` (paths, contents and link targets), to prove nothing
/// changed. Symlinks are recorded as links, never followed.
pub fn tree_fingerprint(dir: &Path) -> Vec<(String, String)> {
    let mut entries = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(current) = stack.pop() {
        let Ok(read) = std::fs::read_dir(&current) else {
            continue;
        };
        for entry in read {
            let entry = entry.unwrap();
            let path = entry.path();
            let relative = path
                .strip_prefix(dir)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            let kind = entry.file_type().unwrap();
            if kind.is_symlink() {
                let target = std::fs::read_link(&path).unwrap();
                entries.push((relative, format!("link:{}", target.display())));
            } else if kind.is_dir() {
                entries.push((relative, "dir".to_owned()));
                stack.push(path);
            } else {
                let contents = std::fs::read(&path).unwrap();
                entries.push((relative, format!("file:{}", fnv1a(&contents))));
            }
        }
    }
    entries.sort();
    entries
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The path of a binary built from this package (`fake-agent`, `state-hammer`).
pub fn helper_bin(name: &str) -> Utf8PathBuf {
    // Test binaries live in target/<profile>/deps; helper binaries one level up.
    let exe = std::env::current_exe().unwrap();
    let mut dir = exe.parent().unwrap().to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    Utf8PathBuf::from_path_buf(dir.join(name)).unwrap()
}

/// Points libgit2's global, XDG and system config search paths at nothing, so that the user's
/// own git configuration cannot change what an in-process test sees.
fn hermetic_libgit2() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        for level in [
            git2::ConfigLevel::Global,
            git2::ConfigLevel::XDG,
            git2::ConfigLevel::System,
            git2::ConfigLevel::ProgramData,
        ] {
            // SAFETY: called once, before any test of this process opens a repository, so no
            // other thread reads libgit2's search paths at the same time.
            #[allow(unsafe_code)]
            unsafe {
                git2::opts::set_search_path(level, "/nonexistent/crew-test-config").unwrap();
            }
        }
    });
}

/// Runs the `live-helper` binary with `args` in a process of its own (with `tmp` as its
/// `TMPDIR` when given) and returns the JSON it prints; panics with its stderr when it fails.
pub fn live_helper_json(args: &[&str], tmp: Option<&Utf8Path>) -> serde_json::Value {
    let mut command = Command::new(helper_bin("live-helper"));
    command.args(args);
    if let Some(tmp) = tmp {
        command.env("TMPDIR", tmp);
    }
    let output = command.output().unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

/// The `crew` binary under test.
pub fn crew_bin() -> Utf8PathBuf {
    let path = helper_bin("crew");
    assert!(
        path.exists(),
        "{path} is missing: run the tests with `cargo test --workspace`, which builds it"
    );
    path
}

impl TestEnv {
    /// A `crew` command in `dir`, hermetic, with `crew` itself first on PATH (agents call it).
    pub fn crew_command(&self, dir: &Utf8Path) -> Command {
        self.crew_command_with(&crew_bin(), dir)
    }

    /// As [`TestEnv::crew_command`], with a copy of `crew` another user can run (see
    /// [`TestEnv::runnable_by_others`]), for the tests that drop to another uid.
    pub fn crew_command_for_others(&self, dir: &Utf8Path) -> Command {
        self.crew_command_with(&self.runnable_by_others(&crew_bin()), dir)
    }

    fn crew_command_with(&self, crew: &Utf8Path, dir: &Utf8Path) -> Command {
        let mut command = Command::new(crew);
        self.hermetic(&mut command).current_dir(dir);
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut paths = vec![crew.parent().unwrap().as_std_path().to_path_buf()];
        paths.extend(std::env::split_paths(&path));
        command.env("PATH", std::env::join_paths(paths).unwrap());
        command
    }

    /// Runs `crew args…` in `dir` to its end.
    #[must_use = "a command whose result is not checked may have failed unseen"]
    pub fn crew<I, S>(&self, dir: &Utf8Path, args: I) -> Output
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.crew_command(dir).args(args).output().unwrap()
    }
}

/// A command's whole result, as a snapshot shows it: stdout, stderr and the exit status.
pub fn render_output(output: &Output) -> String {
    let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !stderr.is_empty() {
        text.push_str("----- stderr -----\n");
        text.push_str(&stderr);
    }
    text.push_str(&format!(
        "[exit status: {}]",
        output
            .status
            .code()
            .map_or_else(|| "signal".to_owned(), |code| code.to_string())
    ));
    text
}

/// Replaces what changes from run to run — temp paths, run ids, pids, durations, commit
/// hashes — with stable placeholders.
#[derive(Debug, Default)]
pub struct Redactor {
    literals: Vec<(String, String)>,
}

impl Redactor {
    pub fn new(env: &TestEnv) -> Self {
        Redactor {
            literals: vec![(env.root().to_string(), "$TEST_ENV".to_owned())],
        }
    }

    pub fn literal(mut self, value: impl Into<String>, placeholder: impl Into<String>) -> Self {
        self.literals.push((value.into(), placeholder.into()));
        self
    }

    pub fn redact(&self, text: &str) -> String {
        let mut text = text.to_owned();
        for (value, placeholder) in &self.literals {
            if !value.is_empty() {
                text = text.replace(value, placeholder);
            }
        }
        let text = redact_timestamps(&text);
        let mut out = String::with_capacity(text.len());
        let mut word = String::new();
        let mut previous_word = String::new();
        let flush = |word: &mut String, previous: &mut String, out: &mut String| {
            if word.is_empty() {
                return;
            }
            let replaced = redact_word(word, previous);
            out.push_str(&replaced);
            *previous = std::mem::take(word);
        };
        for c in text.chars() {
            if c.is_ascii_alphanumeric() || c == '.' {
                word.push(c);
            } else {
                flush(&mut word, &mut previous_word, &mut out);
                out.push(c);
            }
        }
        flush(&mut word, &mut previous_word, &mut out);
        out
    }
}

/// `2026-11-29T23:31:44.142Z` and `2026-11-29 23:31:44` become `[TIMESTAMP]`.
fn redact_timestamps(text: &str) -> String {
    let bytes = text.as_bytes();
    let shape = b"dddd-dd-ddTdd:dd:dd";
    let mut out = String::with_capacity(text.len());
    let mut index = 0;
    while index < bytes.len() {
        let matches = index + shape.len() <= bytes.len()
            && shape
                .iter()
                .zip(&bytes[index..])
                .all(|(expected, &actual)| match expected {
                    b'd' => actual.is_ascii_digit(),
                    b'T' => actual == b'T' || actual == b' ',
                    other => *other == actual,
                });
        if matches {
            let mut end = index + shape.len();
            while end < bytes.len() && (bytes[end] == b'.' || bytes[end].is_ascii_digit()) {
                end += 1;
            }
            if end < bytes.len() && bytes[end] == b'Z' {
                end += 1;
            }
            out.push_str("[TIMESTAMP]");
            index = end;
        } else {
            let c = text[index..]
                .chars()
                .next()
                .expect("index is on a char boundary");
            out.push(c);
            index += c.len_utf8();
        }
    }
    out
}

fn redact_word(word: &str, previous: &str) -> String {
    if word.contains("..") {
        return word
            .split("..")
            .map(|part| redact_word(part, previous))
            .collect::<Vec<_>>()
            .join("..");
    }
    let is_duration = {
        let body = word.strip_suffix('s').unwrap_or("");
        (!body.is_empty()
            && body
                .split('.')
                .all(|part| !part.is_empty() && part.chars().all(|c| c.is_ascii_digit())))
            || (word.ends_with('s')
                && word.contains('m')
                && word
                    .trim_end_matches('s')
                    .split('m')
                    .all(|part| !part.is_empty() && part.chars().all(|c| c.is_ascii_digit())))
            || (word.ends_with('m')
                && word.contains('h')
                && word
                    .trim_end_matches('m')
                    .split('h')
                    .all(|part| !part.is_empty() && part.chars().all(|c| c.is_ascii_digit())))
    };
    if is_duration {
        return "[DURATION]".to_owned();
    }
    if previous == "pid" && word.chars().all(|c| c.is_ascii_digit()) {
        return "[PID]".to_owned();
    }
    let hex = word
        .chars()
        .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase());
    if hex && (word.len() == 12 || word.len() == 40) && word.chars().any(|c| c.is_ascii_digit()) {
        return "[HASH]".to_owned();
    }
    word.to_owned()
}

/// Polls `check` every 50 ms until it returns `Some`, or panics after `seconds`.
pub fn wait_until<T>(seconds: u64, what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(seconds);
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

impl TestEnv {
    /// The worktrees git lists for `repo`, besides the leader and crew's recycling pool: the
    /// task worktrees still in place, as git itself sees them.
    pub fn task_worktrees(&self, repo: &Utf8Path) -> Vec<String> {
        let list = self.git(repo, ["worktree", "list", "--porcelain"]);
        let pool = format!("{repo}/.worktrees/.pool/");
        list.lines()
            .filter_map(|line| line.strip_prefix("worktree "))
            .filter(|path| *path != repo.as_str() && !path.starts_with(&pool))
            .map(str::to_owned)
            .collect()
    }
}

impl TestEnv {
    /// Starts `crew args…` in `dir` in the background, its output discarded.
    pub fn spawn_crew<I, S>(&self, dir: &Utf8Path, args: I) -> std::process::Child
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.crew_command(dir)
            .args(args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap()
    }

    /// `crew agents list --json` in `dir`, parsed; `None` while it cannot be read.
    pub fn agents_json(&self, dir: &Utf8Path) -> Option<serde_json::Value> {
        let output = self.crew(dir, ["agents", "list", "--json"]);
        serde_json::from_slice(&output.stdout).ok()
    }
}

/// The script `tests/<dir>/drive.mjs` of a protocol client crew did not write, when Node and
/// its npm `package` are installed (`npm ci` in `tests/<dir>`). Otherwise the test says it was
/// skipped and gets `None` — except where `CREW_TESTS_REQUIRE_NODE` is set (CI): there a
/// missing client fails the test.
pub fn node_client(dir: &str, package: &str, test: &str) -> Option<Utf8PathBuf> {
    let dir = Utf8PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(dir);
    let node = std::process::Command::new("node").arg("--version").output();
    let why = if !node.is_ok_and(|output| output.status.success()) {
        "node is not installed".to_owned()
    } else if !dir.join("node_modules").join(package).exists() {
        format!("{package} is not installed: run `npm ci` in {dir}")
    } else {
        return Some(dir.join("drive.mjs"));
    };
    assert!(
        std::env::var_os("CREW_TESTS_REQUIRE_NODE").is_none(),
        "{test} cannot run: {why}"
    );
    #[allow(clippy::print_stderr)]
    {
        eprintln!("SKIPPED {test}: {why}");
    }
    None
}

/// The directory of the real agent programs' commands (`claude`, `codex`, `gemini`,
/// `claude-code-acp`, `aider`), pinned in `tests/agent-programs` (`npm ci` there; aider in its
/// `.venv`, from `requirements.txt`), when `program` is installed. Otherwise the test says it was skipped and gets `None` — except
/// where `CREW_TESTS_REQUIRE_AGENTS` is set (CI): there a missing program fails the test.
pub fn agent_programs(program: &str, test: &str) -> Option<Utf8PathBuf> {
    let programs = Utf8PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("agent-programs");
    // The npm packages, and the Python ones (aider) in a virtual environment beside them.
    for bin in [
        programs.join("node_modules/.bin"),
        programs.join(".venv/bin"),
    ] {
        let runs = std::process::Command::new(bin.join(program))
            .arg("--version")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|status| status.success());
        if runs {
            return Some(bin);
        }
    }
    let why = format!(
        "{program} is not installed: run `npm ci` in tests/agent-programs (aider: `python3 -m venv .venv && .venv/bin/pip install -r requirements.txt` there)"
    );
    assert!(
        std::env::var_os("CREW_TESTS_REQUIRE_AGENTS").is_none(),
        "{test} cannot run: {why}"
    );
    eprintln!("SKIPPED {test}: {why}");
    None
}
