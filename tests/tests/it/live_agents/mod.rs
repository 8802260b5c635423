//! Live agents as real processes: supervision, the signal ladder, output, steering and the
//! workspace-scoped registry.

use std::time::{Duration, Instant};

use crew_core::config::{AgentDef, SteerMode};
use crew_core::model::StopSignal;
use crew_core::{AgentId, RunId, TaskId, WorkspaceId};
use crew_live::procscan::session_of;
use crew_live::{AgentHost, AgentOpError, AgentState, FollowUpOutcome, StopOutcome};
use crew_tests::TestEnv;

use crate::common::live::{
    FAKE_AGENT, LiveFixture, assert_no_marked_processes, fake, live_helper_json, marked_processes,
    wait_for_line, wait_for_lines,
};

mod hosts;
mod io;
mod signals;

/// The pids of processes whose command line is exactly `argv`.
fn processes_running(argv: &[&str]) -> Vec<u32> {
    let wanted: Vec<u8> = argv
        .iter()
        .flat_map(|arg| [arg.as_bytes(), b"\0"].concat())
        .collect();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|line| line == wanted)
        })
        .collect()
}

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Children of `parent` whose state letter is `state`.
fn children_in_state(parent: u32, state: char) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                return false;
            };
            let Some(close) = stat.rfind(')') else {
                return false;
            };
            let mut fields = stat[close + 1..].split_whitespace();
            let this_state = fields.next().and_then(|field| field.chars().next());
            let ppid = fields.next().and_then(|field| field.parse::<u32>().ok());
            this_state == Some(state) && ppid == Some(parent)
        })
        .collect()
}

/// Children of `parent` named `name` (their `comm`), alive (not zombies).
fn children_named(parent: u32, name: &str) -> Vec<u32> {
    let running = ['R', 'S', 'D', 'T', 't'];
    running
        .iter()
        .flat_map(|state| children_in_state(parent, *state))
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|comm| comm.trim_end() == name)
        })
        .collect()
}
