//! Tests of `spawn/warden/mod.rs`.

use std::process::Command;

use super::sweep::{EntryMatcher, environ_holds, parse_pid, sweep_marked};
use super::{WARDEN_ARG, parse_limit};

fn holds(stream: &[u8], marker: &str) -> bool {
    let mut matcher = EntryMatcher::new(marker.as_bytes());
    stream.iter().any(|&byte| matcher.feed(byte)) || matcher.finish()
}

#[test]
fn only_a_whole_entry_matches() {
    let marker = "CREW_AGENT_ID=r1:api";
    assert!(holds(b"A=1\0CREW_AGENT_ID=r1:api\0B=2\0", marker));
    assert!(holds(b"CREW_AGENT_ID=r1:api", marker));
    assert!(!holds(b"CREW_AGENT_ID=r1:api2\0", marker));
    assert!(!holds(b"XCREW_AGENT_ID=r1:api\0", marker));
    assert!(!holds(b"CREW_AGENT_ID=r1:ap\0", marker));
    assert!(!holds(b"", marker));
    assert!(!holds(b"\0\0", ""));
}

#[test]
fn proc_names_that_are_pids() {
    assert_eq!(parse_pid(b"1234\0\0\0"), Some(1234));
    assert_eq!(parse_pid(b"self\0"), None);
    assert_eq!(parse_pid(b"\0"), None);
    assert_eq!(parse_pid(b"12a\0"), None);
}

#[test]
fn an_open_files_limit_is_a_decimal_that_fits() {
    assert_eq!(parse_limit(b"1024"), Some(1024));
    assert_eq!(parse_limit(b"1073741816"), Some(1_073_741_816));
    assert_eq!(parse_limit(b""), None);
    assert_eq!(parse_limit(b"-"), None);
    assert_eq!(parse_limit(b"12x"), None);
    assert_eq!(parse_limit(b"99999999999999999999"), None);
}

/// A start of the executable as a warden, as an agent could try it, with `host` named as
/// its host; what it would start touches `flag`.
fn start_as_warden(host: &str, flag: &std::path::Path) -> std::process::Output {
    use std::os::unix::process::CommandExt;

    let touch = format!("touch {}", flag.display());
    let env = flag.with_extension("env");
    std::fs::write(&env, "PATH=/usr/bin:/bin\0CREW_AGENT_ID=r:t\0").unwrap();
    // Reports on stderr, takes the agent's environment on stdin.
    Command::new("/proc/self/exe")
        .args([
            WARDEN_ARG.to_str().unwrap(),
            host,
            "-",
            "2",
            "0",
            "-",
            "-",
            "-",
            "CREW_AGENT_ID=r:t",
            "-",
            "-",
        ])
        .args(["sh", "-c", &touch])
        .stdin(std::fs::File::open(&env).unwrap())
        // Its own group: a warden that kills itself kills its group.
        .process_group(0)
        .output()
        .unwrap()
}

#[test]
fn a_warden_whose_host_is_not_its_parent_starts_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let flag = dir.path().join("started");
    // In this test's own process group: it would kill the group, so it refuses.
    let grouped = Command::new("/proc/self/exe")
        .args([
            WARDEN_ARG.to_str().unwrap(),
            "1",
            "-",
            "2",
            "0",
            "-",
            "-",
            "-",
            "CREW_AGENT_ID=r:t",
            "-",
            "-",
            "true",
        ])
        .output()
        .unwrap();
    assert_eq!(grouped.status.code(), Some(127));
    assert_eq!(
        String::from_utf8_lossy(&grouped.stderr),
        "crew-warden: only crew starts a warden\n"
    );
    let bad = start_as_warden("not-a-pid", &flag);
    assert_eq!(bad.status.code(), Some(127));
    assert_eq!(
        String::from_utf8_lossy(&bad.stderr),
        "crew-warden: bad host pid\n"
    );
    // pid 1 is not this test's process, which started it.
    let orphan = start_as_warden("1", &flag);
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&orphan.status),
        Some(libc::SIGKILL)
    );
    assert!(!flag.exists(), "neither started the agent");
    let own = start_as_warden(&std::process::id().to_string(), &flag);
    assert!(own.status.success(), "{own:?}");
    assert!(
        flag.exists(),
        "with its host as its parent, the warden starts the agent"
    );
}

#[test]
fn a_sweep_kills_the_marked_process_and_no_other() {
    let marker = format!("CREW_AGENT_ID={}:sweep", std::process::id());
    let other_marker = format!("CREW_AGENT_ID={}:sweep-other", std::process::id());
    let spawn = |marker: &str| {
        let (name, value) = marker.split_once('=').unwrap();
        let child = Command::new("sleep")
            .arg("30")
            .env(name, value)
            .spawn()
            .unwrap();
        // `spawn` may return while the kernel is still setting up the new program's
        // environment (a vfork parent wakes up early in exec): wait until it shows.
        let started = std::time::Instant::now();
        while !environ_holds(child.id() as libc::pid_t, marker.as_bytes()) {
            assert!(started.elapsed() < std::time::Duration::from_secs(10));
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        child
    };
    let mut marked = spawn(&marker);
    let mut other = spawn(&other_marker);
    assert!(!environ_holds(other.id() as libc::pid_t, marker.as_bytes()));
    assert_eq!(sweep_marked(marker.as_bytes()), 1);
    let status = marked.wait().unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9)
    );
    assert!(other.try_wait().unwrap().is_none());
    other.kill().unwrap();
    other.wait().unwrap();
}
