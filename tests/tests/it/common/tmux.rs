//! A real terminal for the tests: a tmux server of the test's own runs crew, `send-keys` types
//! and `capture-pane` reads the screen.

use std::process::Command;
use std::time::{Duration, Instant};

use camino::{Utf8Path, Utf8PathBuf};
use crew_tests::{TestEnv, render_output};

/// Whether tmux is installed; when not, `test` says it was skipped, or fails where
/// `CREW_TESTS_REQUIRE_TMUX` says it must run.
pub fn installed(test: &str) -> bool {
    let installed = Command::new("tmux")
        .arg("-V")
        .output()
        .is_ok_and(|output| output.status.success());
    if !installed {
        assert!(
            std::env::var_os("CREW_TESTS_REQUIRE_TMUX").is_none(),
            "{test} cannot run: tmux is not installed"
        );
        eprintln!("SKIPPED {test}: tmux is not installed");
    }
    installed
}

/// A tmux server of the test's own (its socket in the test's directory), killed when dropped.
pub struct Tmux {
    socket: Utf8PathBuf,
}

impl Tmux {
    /// `None` (and the test says it was skipped) when tmux is not installed, unless
    /// `CREW_TESTS_REQUIRE_TMUX` says it must be.
    pub fn start(env: &TestEnv, test: &str, script: &Utf8Path) -> Option<Tmux> {
        Self::start_sized(env, test, script, (110, 50))
    }

    /// [`Tmux::start`] on a terminal of `(columns, lines)`.
    pub fn start_sized(
        env: &TestEnv,
        test: &str,
        script: &Utf8Path,
        (columns, lines): (u16, u16),
    ) -> Option<Tmux> {
        if !installed(test) {
            return None;
        }
        // A socket of its own for each server: a test that opens a second terminal after the
        // first closed would otherwise reach the first server while it exits ("server exited
        // unexpectedly").
        static STARTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let number = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmux = Tmux {
            socket: env.root().join(format!("tmux-{number}.sock")),
        };
        let started = tmux
            .command()
            .args([
                "new-session",
                "-d",
                "-x",
                &columns.to_string(),
                "-y",
                &lines.to_string(),
            ])
            .arg("sh")
            .arg(script.as_str())
            .output()
            .unwrap();
        assert!(started.status.success(), "{}", render_output(&started));
        Some(tmux)
    }

    fn command(&self) -> Command {
        let mut command = Command::new("tmux");
        // UTF-8 whatever the locale of the test's process.
        command.args(["-u", "-S", self.socket.as_str()]);
        command
    }

    /// Types `keys` as tmux names them (`Enter`, `Escape`, `j`).
    pub fn keys(&self, keys: &[&str]) {
        let sent = self.command().arg("send-keys").args(keys).output().unwrap();
        assert!(sent.status.success(), "{}", render_output(&sent));
    }

    /// Types `text` as it is.
    pub fn text(&self, text: &str) {
        let sent = self
            .command()
            .args(["send-keys", "-l", text])
            .output()
            .unwrap();
        assert!(sent.status.success(), "{}", render_output(&sent));
    }

    /// The window title the program on the terminal set (or tmux's default).
    pub fn title(&self) -> String {
        let output = self
            .command()
            .args(["display-message", "-p", "#{pane_title}"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }

    /// Whether the program on the terminal rang its bell (tmux flags the window; the session
    /// has no client, so the current window is flagged too).
    pub fn bell_rang(&self) -> bool {
        let output = self
            .command()
            .args(["display-message", "-p", "#{window_bell_flag}"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&output.stdout).trim() == "1"
    }

    /// The screen as it is now, with the escape sequences of its colours and attributes.
    pub fn screen_with_styles(&self) -> String {
        let output = self
            .command()
            .args(["capture-pane", "-p", "-e"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// The screen as it is now.
    pub fn screen(&self) -> String {
        let output = self
            .command()
            .args(["capture-pane", "-p"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// The screen once `ready` holds for it; fails after 30 seconds with the last screen.
    pub fn screen_when(&self, what: &str, ready: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        loop {
            let screen = self.screen();
            if ready(&screen) {
                return screen;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "never on screen: {what}\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        // The server may be gone already; nothing else to clean up then.
        let _ = self.command().arg("kill-server").output();
    }
}

/// A shell script that runs `crew args…` in `dir` with the test's hermetic environment, then
/// says how it exited and waits (so that the screen stays).
pub fn crew_script(env: &TestEnv, dir: &Utf8Path, args: &[String]) -> Utf8PathBuf {
    crew_script_with(env, dir, args, "run.sh", &[("LANG", "C.UTF-8")])
}

/// [`crew_script`] written to `name`, with `vars` set (`NO_COLOR`, a locale) on top.
pub fn crew_script_with(
    env: &TestEnv,
    dir: &Utf8Path,
    args: &[String],
    name: &str,
    vars: &[(&str, &str)],
) -> Utf8PathBuf {
    let crew = crew_tests::crew_bin();
    let quote = |text: &str| format!("'{}'", text.replace('\'', r"'\''"));
    let path = format!(
        "{}:{}",
        crew.parent().unwrap(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut script = String::new();
    for (var, value) in [
        ("HOME", env.home().to_string()),
        ("TMPDIR", env.tmp().to_string()),
        ("PATH", path),
        ("GIT_CONFIG_GLOBAL", "/dev/null".to_owned()),
        ("GIT_CONFIG_SYSTEM", "/dev/null".to_owned()),
        ("GIT_CONFIG_NOSYSTEM", "1".to_owned()),
        ("TERM", "tmux-256color".to_owned()),
    ] {
        script.push_str(&format!("export {var}={}\n", quote(&value)));
    }
    script.push_str("unset NO_COLOR LANG LC_ALL LC_CTYPE\n");
    for (var, value) in vars {
        script.push_str(&format!("export {var}={}\n", quote(value)));
    }
    script.push_str(&format!("cd {}\n", quote(dir.as_str())));
    let args: Vec<String> = args.iter().map(|arg| quote(arg)).collect();
    script.push_str(&format!("{} {}\n", quote(crew.as_str()), args.join(" ")));
    script.push_str("echo \"EXITED-$?\"\nsleep 600\n");
    let path = env.root().join(name);
    crew_tests::write(&path, &script);
    path
}
