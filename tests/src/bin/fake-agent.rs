//! A small agent for crew's tests: a real process that behaves as told.
//!
//! fake-agent print <text>...           print the words on one line, exit 0
//! fake-agent exit <code>               exit with <code>
//! fake-agent sleep <seconds>           sleep, exit 0
//! fake-agent sleep-until <unix-ms> <code>   sleep until then, exit with <code>
//! fake-agent ignore-term <seconds>     ignore SIGTERM while sleeping
//! fake-agent handle-term <file>        on SIGTERM write <file> and exit 0; sleep until then
//! fake-agent fork-sleepers             start `sleep 600` twice in its group and a
//!                                      double-forked grandchild that leaves the group
//!                                      (setsid), print `ready`, sleep
//! fake-agent echo-stdin                print `got: <line>` per stdin line; exit on `quit`
//! fake-agent json-turns                per stdin line print `echo: <line>` then a result line
//! fake-agent flood <bytes>             write <bytes> of `x` without newline, then invalid
//!                                      UTF-8, then exit 0
//! fake-agent env                       print its environment, sorted, one `NAME=value` per line
//! fake-agent write <file> <text>       append a line to <file> (relative to its cwd), exit 0
//! fake-agent pwd                       print its working directory
//! fake-agent hold-lock <file> <seconds> open <file> read-only, take an exclusive lock on it
//!                                      (`flock`), print `held`, hold it that long
//! fake-agent keyring <description>     look for the user key <description> in its session
//!                                      keyring and read it: `ESCAPED keyring <secret>`, or
//!                                      `refused keyring: <error>`
//! fake-agent pipe-socket               send each stdin line to `$CREW_SOCKET` and print the
//!                                      answer line
//! fake-agent hold-socket <n> <seconds> open <n> connections to `$CREW_SOCKET`, send each a
//!                                      request's first bytes and never its end, print how many
//!                                      were accepted (not answered "busy"), hold them

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::io::{BufRead, Write};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

static TERM_RECEIVED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_term(_: libc::c_int) {
    TERM_RECEIVED.store(true, Ordering::SeqCst);
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut stdout = std::io::stdout();
    match args[0].as_str() {
        "print" => println!("{}", args[1..].join(" ")),
        "exit" => std::process::exit(args[1].parse().unwrap()),
        "sleep" => std::thread::sleep(Duration::from_secs_f64(args[1].parse().unwrap())),
        "sleep-until" => {
            let until: u128 = args[1].parse().unwrap();
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_millis();
            if until > now {
                std::thread::sleep(Duration::from_millis((until - now) as u64));
            }
            std::process::exit(args[2].parse().unwrap());
        }
        "ignore-term" => {
            set_term(libc::SIG_IGN);
            println!("ready");
            stdout.flush().unwrap();
            std::thread::sleep(Duration::from_secs_f64(args[1].parse().unwrap()));
        }
        "handle-term" => {
            set_term(on_term as *const () as libc::sighandler_t);
            println!("ready");
            stdout.flush().unwrap();
            while !TERM_RECEIVED.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(5));
            }
            std::fs::write(&args[1], "cleaned up\n").unwrap();
            std::process::exit(0);
        }
        "fork-sleepers" => {
            // Never waited for on purpose: they are the leftovers crew must clean up.
            #[allow(clippy::zombie_processes)]
            for _ in 0..2 {
                Command::new("sleep")
                    .arg("600")
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap();
            }
            // A double fork whose grandchild leaves the process group, as daemons do.
            Command::new("sh")
                .args([
                    "-c",
                    "setsid sh -c 'sleep 600' </dev/null >/dev/null 2>&1 &",
                ])
                .status()
                .unwrap();
            println!("ready");
            stdout.flush().unwrap();
            std::thread::sleep(Duration::from_secs(600));
        }
        "echo-stdin" => {
            println!("ready");
            stdout.flush().unwrap();
            for line in std::io::stdin().lock().lines() {
                let line = line.unwrap();
                if line == "quit" {
                    break;
                }
                println!("got: {line}");
                stdout.flush().unwrap();
            }
        }
        "json-turns" => {
            println!("ready");
            stdout.flush().unwrap();
            for line in std::io::stdin().lock().lines() {
                println!("echo: {}", line.unwrap());
                println!("{{\"type\":\"result\",\"subtype\":\"success\"}}");
                stdout.flush().unwrap();
            }
        }
        "flood" => {
            let total: usize = args[1].parse().unwrap();
            let chunk = vec![b'x'; 1024 * 1024];
            let mut written = 0;
            while written < total {
                let size = chunk.len().min(total - written);
                stdout.write_all(&chunk[..size]).unwrap();
                written += size;
            }
            stdout.write_all(b"\xff\xfe\xfd not utf-8").unwrap();
            stdout.flush().unwrap();
        }
        "env" => {
            let mut vars: Vec<String> = std::env::vars()
                .map(|(name, value)| format!("{name}={value}"))
                .collect();
            vars.sort();
            for var in vars {
                println!("{var}");
            }
        }
        "write" => {
            let mut file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&args[1])
                .unwrap();
            writeln!(file, "{}", args[2..].join(" ")).unwrap();
        }
        "pwd" => println!("{}", std::env::current_dir().unwrap().display()),
        "keyring" => read_key(&args[1]),
        "hold-lock" => {
            use std::os::fd::AsRawFd;
            let file = std::fs::File::open(&args[1]).unwrap();
            #[allow(unsafe_code)]
            // SAFETY: a lock on a descriptor this function owns.
            let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
            assert_eq!(locked, 0, "{}", std::io::Error::last_os_error());
            println!("held");
            std::io::stdout().flush().unwrap();
            std::thread::sleep(Duration::from_secs_f64(args[2].parse().unwrap()));
        }
        "pipe-socket" => {
            let socket = std::env::var("CREW_SOCKET").unwrap();
            let mut stream = connect(&socket).unwrap();
            let mut reader = std::io::BufReader::new(stream.try_clone().unwrap());
            for line in std::io::stdin().lock().lines() {
                writeln!(stream, "{}", line.unwrap()).unwrap();
                let mut answer = String::new();
                reader.read_line(&mut answer).unwrap();
                print!("{answer}");
            }
        }
        "hold-socket" => {
            let count: usize = args[1].parse().unwrap();
            let socket = std::env::var("CREW_SOCKET").unwrap();
            let mut held = Vec::new();
            for _ in 0..count {
                let Ok(mut stream) = connect(&socket) else {
                    continue;
                };
                let _ = stream.write_all(b"{\"workspace\":");
                held.push(stream);
            }
            // A refused connection is answered "busy" at once and closed; a held one says nothing.
            let mut accepted = 0;
            for stream in &mut held {
                stream
                    .set_read_timeout(Some(Duration::from_millis(300)))
                    .unwrap();
                let mut byte = [0u8; 1];
                if std::io::Read::read(stream, &mut byte).is_err() {
                    accepted += 1;
                }
            }
            println!("accepted {accepted}");
            stdout.flush().unwrap();
            std::thread::sleep(Duration::from_secs_f64(args[2].parse().unwrap()));
        }
        other => panic!("unknown behaviour {other}"),
    }
}

fn set_term(handler: libc::sighandler_t) {
    // SAFETY: installs a handler that only stores to an atomic, or ignores the signal.
    #[allow(unsafe_code)]
    unsafe {
        libc::signal(libc::SIGTERM, handler);
    }
}

/// Connects to the host's socket as crew says it: a path, or `@name`, an abstract socket (an
/// agent's own connection).
fn connect(socket: &str) -> std::io::Result<std::os::unix::net::UnixStream> {
    use std::os::linux::net::SocketAddrExt;
    match socket.strip_prefix('@') {
        Some(name) => std::os::unix::net::UnixStream::connect_addr(
            &std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?,
        ),
        None => std::os::unix::net::UnixStream::connect(socket),
    }
}

/// `keyctl(KEYCTL_SEARCH, KEY_SPEC_SESSION_KEYRING, "user", description)`, then
/// `keyctl(KEYCTL_READ)` of what it found.
#[allow(unsafe_code)]
fn read_key(description: &str) {
    const KEYCTL_SEARCH: libc::c_long = 10;
    const KEYCTL_READ: libc::c_long = 11;
    const KEY_SPEC_SESSION_KEYRING: libc::c_long = -3;
    let description = std::ffi::CString::new(description).unwrap();
    // SAFETY: two NUL-terminated strings, read by the kernel during the call.
    let key = unsafe {
        libc::syscall(
            libc::SYS_keyctl,
            KEYCTL_SEARCH,
            KEY_SPEC_SESSION_KEYRING,
            c"user".as_ptr(),
            description.as_ptr(),
            0,
        )
    };
    if key < 0 {
        println!("refused keyring: {}", std::io::Error::last_os_error());
        return;
    }
    let mut secret = [0u8; 256];
    // SAFETY: the kernel writes at most `secret.len()` bytes into it.
    let read = unsafe {
        libc::syscall(
            libc::SYS_keyctl,
            KEYCTL_READ,
            key,
            secret.as_mut_ptr(),
            secret.len(),
        )
    };
    match usize::try_from(read) {
        Ok(read) => println!(
            "ESCAPED keyring {}",
            String::from_utf8_lossy(&secret[..read.min(secret.len())])
        ),
        Err(_) => println!("refused keyring read: {}", std::io::Error::last_os_error()),
    }
}
