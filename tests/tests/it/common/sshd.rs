//! A real `sshd` of the test's own on a free port of localhost: its host key, the client's key
//! and `authorized_keys` are throwaway files of the test, and an ssh configuration of the test
//! (`ssh -F`; ssh reads `~/.ssh` from the password database, not `HOME`) gives it a host alias.
//! Killed when dropped.

use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use camino::Utf8Path;
use crew_tests::{TestEnv, write};

/// OpenSSH's server, where Debian's openssh-server puts it.
const SSHD: &str = "/usr/sbin/sshd";

/// A running sshd; `alias` is the host name its client configuration (`config`) gives it.
pub struct Sshd {
    child: Child,
    pub alias: &'static str,
    pub config: camino::Utf8PathBuf,
}

impl Sshd {
    /// `None` (and the test says it was skipped) when sshd is not installed, unless
    /// `CREW_TESTS_REQUIRE_SSHD` says it must be (CI installs openssh-server).
    pub fn start(env: &TestEnv, test: &str) -> Option<Sshd> {
        if !Utf8Path::new(SSHD).exists() {
            assert!(
                std::env::var_os("CREW_TESTS_REQUIRE_SSHD").is_none(),
                "{test} cannot run: {SSHD} is not installed (apt-get install openssh-server)"
            );
            eprintln!("SKIPPED {test}: {SSHD} is not installed");
            return None;
        }
        let dir = env.dir("sshd");
        for key in ["host_key", "client_key"] {
            let made = Command::new("ssh-keygen")
                .args(["-q", "-t", "ed25519", "-N", "", "-f"])
                .arg(dir.join(key))
                .status()
                .unwrap();
            assert!(made.success());
        }
        std::fs::copy(dir.join("client_key.pub"), dir.join("authorized_keys")).unwrap();
        // Privilege separation needs its directory, which a system that never ran sshd lacks.
        std::fs::create_dir_all("/run/sshd").unwrap();
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let user = std::env::var("USER").unwrap_or_else(|_| "root".to_owned());
        let config = dir.join("sshd_config");
        write(
            &config,
            &format!(
                "Port {port}\nListenAddress 127.0.0.1\nHostKey {dir}/host_key\nAuthorizedKeysFile {dir}/authorized_keys\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nPidFile none\nPermitRootLogin prohibit-password\nAllowUsers {user}\n"
            ),
        );
        let child = Command::new(SSHD)
            .args(["-D", "-e", "-f"])
            .arg(config.as_str())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let sshd = Sshd {
            child,
            alias: "crewbox",
            config: dir.join("ssh_config"),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "sshd did not listen on {port}");
            std::thread::sleep(Duration::from_millis(20));
        }
        write(
            &sshd.config,
            &format!(
                "Host {}\n  HostName 127.0.0.1\n  Port {port}\n  User {user}\n  IdentityFile {dir}/client_key\n  IdentitiesOnly yes\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n",
                sshd.alias
            ),
        );
        use std::os::unix::fs::PermissionsExt;
        for private in [sshd.config.clone(), dir.join("client_key")] {
            std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        Some(sshd)
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
