//! The stand-in's limit on requests at once (see `ModelApi::limit_concurrency`): a provider
//! that answers so many at a time, each taking a while, and refuses the rest with 429.

use std::net::TcpStream;
use std::sync::Mutex;

use serde_json::json;

use super::{Shared, respond};

/// A limit on how many main requests the stand-in answers at once.
#[derive(Debug, Clone, Copy)]
pub(super) struct Concurrency {
    pub(super) most: usize,
    pub(super) hold: std::time::Duration,
    pub(super) retry_after: u64,
}

/// A main request being answered under the limit: counted until answered.
pub(super) struct InFlight<'a>(&'a Mutex<Shared>);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let mut shared = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        shared.in_flight = shared.in_flight.saturating_sub(1);
    }
}

/// Under a limit, a main request: admitted (held for the limit's while first), or refused
/// with the `retry-after` to answer; `None` without a limit.
pub(super) fn admit(shared: &Mutex<Shared>) -> Option<Result<InFlight<'_>, u64>> {
    let limit = shared.lock().unwrap().concurrency?;
    let mut held = shared.lock().unwrap();
    if held.in_flight >= limit.most {
        held.refused_at_once += 1;
        return Some(Err(limit.retry_after));
    }
    held.in_flight += 1;
    drop(held);
    std::thread::sleep(limit.hold);
    Some(Ok(InFlight(shared)))
}

/// Refuses a request over the limit: 429, and when to try again.
pub(super) fn refuse(out: &mut TcpStream, retry_after: u64) -> std::io::Result<()> {
    let body = json!({"type": "error", "error": {"type": "rate_limit_error", "message": "stand-in: too many requests at once"}});
    respond(
        out,
        429,
        "application/json",
        body.to_string().as_bytes(),
        Some(retry_after),
    )
}
