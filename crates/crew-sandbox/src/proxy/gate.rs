//! A provider's rate limit as every agent of this host meets it, at its credential's endpoint.
//!
//! Each agent has a proxy of its own, but they share one provider: when it answers a request
//! with 429 (or 529, overloaded) and a short `retry-after`, the requests that follow from any
//! agent would only meet the same answer, and a program that gives up after a few of them
//! ends its turn on the limit. So the endpoint's requests pass a gate per provider (its
//! credential's name and upstream): after a refusal, none goes on until the wait it asked
//! for has passed, and then no more at once than were going when it refused, less one; each
//! answer after that lets one more go at once, until the gate is open again (additive
//! increase, as TCP's congestion window). The agents see slow answers, not refusals.
//!
//! A wait longer than [`LONGEST_COOLING`] (a usage limit that lifts in hours) is not held
//! here: the refusal reaches the agent, and its task pauses on the limit (the runner's
//! schedule). No request waits at the gate longer than [`LONGEST_WAIT`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::time::Instant;

/// The longest `retry-after` the gate holds requests for.
const LONGEST_COOLING: Duration = Duration::from_secs(60);

/// The longest a request waits at the gate before it goes on all the same.
const LONGEST_WAIT: Duration = Duration::from_secs(120);

/// The wait after a refusal that said none.
const DEFAULT_COOLING: Duration = Duration::from_secs(1);

/// How many requests at once a provider's gate allows before it is open again.
const OPEN_AGAIN_AT: usize = 64;

/// One provider's gate.
#[derive(Debug, Default)]
struct Gate {
    state: Mutex<State>,
    changed: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct State {
    /// Requests gone through and not yet answered in full.
    going: usize,
    /// How many may go at once, since the provider refused; `None`: as many as come.
    window: Option<usize>,
    /// None goes on before this, since the provider refused.
    cooling_until: Option<Instant>,
}

/// A request let through the gate of its provider: counted as going until dropped.
#[derive(Debug)]
pub(super) struct Passed {
    gate: Arc<Gate>,
}

/// The gate of the provider `key`, shared by every proxy of this process.
fn gate(key: &str) -> Arc<Gate> {
    static GATES: OnceLock<Mutex<HashMap<String, Arc<Gate>>>> = OnceLock::new();
    let mut gates = GATES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    gates.entry(key.to_owned()).or_default().clone()
}

/// Waits until the provider `key` lets one more request go (see the module's rules).
pub(super) async fn pass(key: &str) -> Passed {
    let gate = gate(key);
    let given_up_at = Instant::now() + LONGEST_WAIT;
    loop {
        let changed = gate.changed.notified();
        tokio::pin!(changed);
        // Registered before the state is read: a change after it wakes this wait.
        changed.as_mut().enable();
        let wake_at = {
            let mut state = gate
                .state
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let now = Instant::now();
            let cooling = state.cooling_until.filter(|until| *until > now);
            let full = state.window.is_some_and(|window| state.going >= window);
            if (cooling.is_none() && !full) || now >= given_up_at {
                state.going += 1;
                return Passed { gate: gate.clone() };
            }
            cooling.unwrap_or(given_up_at).min(given_up_at)
        };
        tokio::select! {
            () = &mut changed => {}
            () = tokio::time::sleep_until(wake_at) => {}
        }
    }
}

impl Passed {
    /// The provider answered it with HTTP `status`, asking to wait `retry_after` if it said.
    pub(super) fn answered(&self, status: u16, retry_after: Option<Duration>) {
        let mut state = self
            .gate
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match status {
            429 | 529 => {
                let wait = retry_after.unwrap_or(DEFAULT_COOLING);
                if wait <= LONGEST_COOLING {
                    let until = Instant::now() + wait;
                    state.cooling_until =
                        Some(state.cooling_until.map_or(until, |at| at.max(until)));
                    state.window = Some(state.going.saturating_sub(1).max(1));
                }
            }
            200..=299 => {
                state.window = state
                    .window
                    .map(|window| window + 1)
                    .filter(|window| *window < OPEN_AGAIN_AT);
            }
            _ => {}
        }
        drop(state);
        self.gate.changed.notify_waiters();
    }
}

impl Drop for Passed {
    fn drop(&mut self) {
        let mut state = self
            .gate
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        state.going = state.going.saturating_sub(1);
        drop(state);
        self.gate.changed.notify_waiters();
    }
}

/// The status of a response head's first line and its `retry-after` in seconds, if `head`
/// holds them (`HTTP/1.1 429 Too Many Requests\r\n…retry-after: 2\r\n`).
pub(super) fn status_of(head: &[u8]) -> Option<(u16, Option<Duration>)> {
    let text = std::str::from_utf8(&head[..head.len().min(16 * 1024)]).ok()?;
    let mut lines = text.split("\r\n");
    let status = lines
        .next()?
        .strip_prefix("HTTP/1.")?
        .get(2..5)?
        .parse::<u16>()
        .ok()?;
    let retry_after = lines
        .take_while(|line| !line.is_empty())
        .filter_map(|line| line.split_once(':'))
        .find(|(name, _)| name.trim().eq_ignore_ascii_case("retry-after"))
        .and_then(|(_, value)| value.trim().parse::<f64>().ok())
        .filter(|seconds| seconds.is_finite() && *seconds >= 0.0)
        .map(Duration::from_secs_f64);
    Some((status, retry_after))
}

/// Relays a request's connection both ways until the response has been relayed whole, the
/// response's head read on the way for `passed`'s gate.
pub(super) async fn relay<U>(client: &mut tokio::net::TcpStream, upstream: U, passed: Passed)
where
    U: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut from_client, mut to_client) = client.split();
    let (mut from_upstream, mut to_upstream) = tokio::io::split(upstream);
    let up = async {
        // The rest of the request's body; the connection ends with the response.
        if tokio::io::copy(&mut from_client, &mut to_upstream)
            .await
            .is_ok()
        {
            // A half-closed upstream still answers; an error here ends nothing.
            let _ = to_upstream.shutdown().await;
        }
        std::future::pending::<()>().await;
    };
    let down = async {
        let mut head = Vec::with_capacity(4096);
        let mut buffer = [0u8; 8192];
        loop {
            let read = from_upstream.read(&mut buffer).await?;
            if read == 0 {
                break;
            }
            head.extend_from_slice(&buffer[..read]);
            if head.windows(4).any(|window| window == b"\r\n\r\n") || head.len() > 16 * 1024 {
                break;
            }
        }
        if let Some((status, retry_after)) = status_of(&head) {
            passed.answered(status, retry_after);
        }
        to_client.write_all(&head).await?;
        tokio::io::copy(&mut from_upstream, &mut to_client).await?;
        to_client.shutdown().await
    };
    tokio::select! {
        () = up => {}
        // The connection ends either way; the request was counted when it was let through.
        _ = down => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_response_head_s_status_and_wait_are_read() {
        assert_eq!(
            status_of(
                b"HTTP/1.1 429 Too Many Requests\r\ncontent-type: x\r\nRetry-After: 2\r\n\r\n{}"
            ),
            Some((429, Some(Duration::from_secs(2))))
        );
        assert_eq!(status_of(b"HTTP/1.1 200 OK\r\n\r\n"), Some((200, None)));
        assert_eq!(
            status_of(b"HTTP/1.1 200 OK\r\nretry-after: soon\r\n\r\n"),
            Some((200, None))
        );
        assert_eq!(status_of(b"garbage"), None);
    }

    #[tokio::test]
    async fn after_a_refusal_none_goes_before_its_wait_and_then_fewer_at_once() {
        let key = "gate-test@127.0.0.1:1";
        let (a, b, c) = (pass(key).await, pass(key).await, pass(key).await);
        // Three going; the third refused, asking for half a second.
        c.answered(429, Some(Duration::from_millis(500)));
        drop(c);
        let refused_at = Instant::now();
        let waiting = tokio::spawn(async move {
            let passed = pass(key).await;
            (Instant::now(), passed)
        });
        // Past the wait, still two going in a window of two.
        tokio::time::sleep(Duration::from_millis(800)).await;
        assert!(!waiting.is_finished(), "more at once than when it refused");
        // An answer widens the window by one: the waiting request goes.
        a.answered(200, None);
        let (went_at, passed) = waiting.await.unwrap();
        assert!(went_at - refused_at >= Duration::from_millis(500));
        // A usage limit's long wait is not held here: nothing waits for it.
        passed.answered(429, Some(Duration::from_secs(3_600)));
        drop((a, b, passed));
        let started = Instant::now();
        let again = pass(key).await;
        assert!(started.elapsed() < Duration::from_millis(400));
        drop(again);
    }
}
