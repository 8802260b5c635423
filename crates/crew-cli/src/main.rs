//! `crew`'s entry. It is glibc's `main`, not Rust's (`no_main`): most commands answer in a
//! millisecond or two and are judged against `git`, and Rust's start-up (before its `main`)
//! reads and parses `/proc/self/maps` to find the main thread's stack, and sets up an
//! alternate signal stack to report a stack overflow: a tenth of a millisecond here, for a
//! message. What of it crew needs is done below: standard descriptors that are closed get
//! `/dev/null`, SIGPIPE is ignored where agents are hosted, a panic ends with Rust's exit code
//! (101), and standard output is flushed at the end (`std::process::exit` does). See
//! ARCHITECTURE.md, "Start-up".
#![no_main]

use std::io::Write as _;

use clap::Parser;

/// The exit code of a command that panicked, as Rust's own `main` gives it.
const PANICKED: i32 = 101;

// SAFETY: the one `main` symbol of the program, with the signature glibc calls it with.
#[allow(unsafe_code)]
#[unsafe(no_mangle)]
extern "C" fn main(_argc: libc::c_int, _argv: *const *const libc::c_char) -> libc::c_int {
    // Rust's standard library reads the arguments itself on glibc (from `.init_array`), so
    // `std::env::args` works here as after Rust's own start.
    standard_descriptors_open();
    let code = match std::panic::catch_unwind(run) {
        Ok(code) => code,
        // The panic hook has said what panicked.
        Err(_) => PANICKED,
    };
    std::process::exit(code)
}

fn run() -> i32 {
    few_malloc_arenas();
    // A listing, the command most often run, answers before clap's parse when it can.
    on_closed_stdout(false);
    if let Some(code) = crew_cli::quick::answer(std::env::args_os()) {
        return i32::from(code);
    }
    let cli = crew_cli::Cli::parse();
    on_closed_stdout(cli.command.hosts_agents());
    // Commands that host agents get every core; the others answer in a millisecond or two on
    // the calling thread.
    let mut builder = if cli.command.hosts_agents() {
        tokio::runtime::Builder::new_multi_thread()
    } else {
        tokio::runtime::Builder::new_current_thread()
    };
    let result = match builder.enable_all().build() {
        Ok(runtime) => runtime.block_on(crew_cli::run(cli)),
        Err(error) => Err(crew_cli::CliError::internal(error)),
    };
    i32::from(crew_cli::exit_status(result))
}

/// Opens `/dev/null` on each of descriptors 0, 1 and 2 that is closed (as Rust's start-up
/// does), so that no file crew opens later takes their place and gets its output.
fn standard_descriptors_open() {
    let mut fds = [0, 1, 2].map(|fd| libc::pollfd {
        fd,
        events: 0,
        revents: 0,
    });
    // SAFETY: `fds` is a valid array of three pollfd for the call's duration.
    #[allow(unsafe_code)]
    let polled = unsafe { libc::poll(fds.as_mut_ptr(), 3, 0) };
    if polled <= 0 {
        return;
    }
    for pollfd in fds {
        if pollfd.revents & libc::POLLNVAL != 0 {
            // The lowest free descriptor is this one: those below it are open or were just
            // opened. Kept open for the life of the process, and for the programs it starts
            // (not closed on exec, as std opens files).
            let opened = std::fs::File::options()
                .read(true)
                .write(true)
                .open("/dev/null")
                .and_then(|null| {
                    rustix::io::fcntl_setfd(&null, rustix::io::FdFlags::empty())?;
                    Ok(null)
                });
            match opened {
                Ok(null) => std::mem::forget(null),
                // As Rust's own start-up does, crew does not run on without them.
                Err(error) => {
                    // Standard error itself may be the closed one: the message is lost, then,
                    // and the exit code still says it.
                    let _ = writeln!(
                        std::io::stderr(),
                        "crew: descriptor {} is closed and /dev/null cannot be opened on it ({error}): start crew with its standard input, output and error open",
                        pollfd.fd
                    );
                    std::process::exit(1);
                }
            }
        }
    }
}

/// What a reader that stops reading does to crew. Commands that host agents ignore SIGPIPE:
/// their printing stops, never their agents (see `ui::out!`). The others take its default
/// action, so that `crew runs list | head` ends as quietly as `git log | head`. Both are set
/// explicitly: a disposition of "ignore" is inherited from whoever started crew.
fn on_closed_stdout(hosts_agents: bool) {
    let action = match hosts_agents {
        true => libc::SIG_IGN,
        false => libc::SIG_DFL,
    };
    // SAFETY: setting a signal's disposition, before any other thread exists.
    #[allow(unsafe_code)]
    unsafe {
        libc::signal(libc::SIGPIPE, action);
    }
}

/// glibc gives each thread that allocates a heap of its own, up to eight per core, and keeps
/// what was freed in each: a host whose blocking threads take turns reading 20,000-entry indexes
/// ended a 16-task run at 110 MB resident for 15 MB of live heap. Two heaps hold it to 50 MB at
/// the same speed (passes over worktrees run one per core at most anyway).
fn few_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes a malloc setting; called before any other thread exists.
    #[allow(unsafe_code)]
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

/// `pow`, the one function crew took from glibc's `libm` (for indicatif's and tokio's
/// averages): given here, the loader maps no `libm` at each start. See ARCHITECTURE.md,
/// "Start-up".
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
#[unsafe(no_mangle)]
extern "C" fn pow(base: f64, exponent: f64) -> f64 {
    libm::pow(base, exponent)
}
