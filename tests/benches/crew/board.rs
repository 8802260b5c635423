//! `crew watch` in a real terminal (a tmux server of the benchmark's own), driven as a person
//! would: keys sent, the screen read back.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use camino::{Utf8Path, Utf8PathBuf};

/// A board started in `project`, 160 × 70, on its own tmux socket.
pub struct Board {
    socket: Utf8PathBuf,
    project: Utf8PathBuf,
    /// The board's process.
    pub pid: u32,
}

impl Board {
    /// Starts `crew watch --no-bell` in `project` and waits for its first screen, which must
    /// contain `first`. `scratch` holds the tmux socket and the pid file, named after `name`.
    pub fn start(crew: &Utf8Path, project: &Utf8Path, scratch: &Utf8Path, name: &str) -> Self {
        let socket = scratch.join(format!("{name}-tmux.sock"));
        let pid_file = scratch.join(format!("{name}.pid"));
        let mut board = Board {
            socket,
            project: project.to_owned(),
            pid: 0,
        };
        let watch = format!("echo $$ > {pid_file}; LANG=C.UTF-8 exec {crew} watch --no-bell");
        board.tmux(&[
            "new-session",
            "-d",
            "-x",
            "160",
            "-y",
            "70",
            "sh",
            "-c",
            &watch,
        ]);
        let deadline = Instant::now() + Duration::from_secs(60);
        board.pid = loop {
            if let Some(pid) = std::fs::read_to_string(&pid_file)
                .ok()
                .and_then(|pid| pid.trim().parse().ok())
            {
                break pid;
            }
            assert!(Instant::now() < deadline, "the board never started");
            std::thread::sleep(Duration::from_millis(20));
        };
        board
    }

    fn tmux(&self, args: &[&str]) -> Output {
        Command::new("tmux")
            .args(["-u", "-S", self.socket.as_str()])
            .args(args)
            .current_dir(&self.project)
            .output()
            .unwrap()
    }

    /// What the terminal shows now.
    pub fn screen(&self) -> String {
        String::from_utf8_lossy(&self.tmux(&["capture-pane", "-p"]).stdout).into_owned()
    }

    /// Waits (up to two minutes) until the screen satisfies `ready`.
    pub fn wait_for(&self, what: &str, ready: &dyn Fn(&str) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let shown = self.screen();
            if ready(&shown) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "never on the board: {what}\n{shown}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// How long `?` takes to open the keys on screen and, pressed again, to close them.
    pub fn toggle_keys(&self) -> Duration {
        let started = Instant::now();
        self.tmux(&["send-keys", "?"]);
        self.wait_for("the keys", &|screen| screen.contains("── keys"));
        self.tmux(&["send-keys", "?"]);
        self.wait_for("the keys closed", &|screen| !screen.contains("── keys"));
        started.elapsed()
    }

    /// The board's peak resident memory, as `/proc` says it (`VmHWM`).
    pub fn peak_memory(&self) -> String {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.pid)).unwrap_or_default();
        status
            .lines()
            .find_map(|line| line.strip_prefix("VmHWM:"))
            .map_or_else(String::new, |value| value.trim().to_owned())
    }

    /// Quits the board with `q` and stops its terminal.
    pub fn quit(self) {
        self.tmux(&["send-keys", "q"]);
        std::thread::sleep(Duration::from_secs(3));
        self.tmux(&["kill-server"]);
    }
}
