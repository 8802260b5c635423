//! Tokens and cost of an agent's turns, and the usage limits its API gave.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::model::status::Timestamp;

/// Tokens and cost of an agent's turns, as its protocol reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    /// Tokens read, not counting the cache.
    #[serde(default)]
    pub input_tokens: u64,
    /// Tokens written.
    #[serde(default)]
    pub output_tokens: u64,
    /// Tokens read from the prompt cache.
    #[serde(default)]
    pub cache_read_input_tokens: u64,
    /// Tokens written to the prompt cache.
    #[serde(default)]
    pub cache_creation_input_tokens: u64,
    /// In US dollars; `None` when any turn counted here did not say.
    #[serde(default)]
    pub cost_usd: Option<f64>,
    /// Turns of the agent's session.
    #[serde(default)]
    pub turns: u32,
    /// No turn counted here said its tokens (an agent that reports only its cost): the token
    /// counts are not zero, they are unknown.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tokens_unknown: bool,
}

/// A usage or rate limit an agent reported hitting: what it said, and when the limit lifts,
/// when it said that too.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageLimit {
    /// What the agent said about the limit.
    pub message: String,
    /// When the limit lifts, when the agent said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resets_at: Option<Timestamp>,
    /// When crew tries again a task paused on it, where the agent said nothing of when it
    /// lifts (a backoff from a minute to an hour).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_at: Option<Timestamp>,
    /// Whose limit it is (`anthropic`, see `crate::config::AgentDef::provider`), once the
    /// task pauses on it: no other task of that provider starts while it waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
}

/// A spend cap as a task or a run holds it: the cap, and how much may be spent before it
/// pauses (the cap, and another cap's worth for each time a person let it go on).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SpendCap {
    /// The cap, in US dollars.
    pub cap_usd: f64,
    /// What may be spent before it pauses, in US dollars.
    pub allowed_usd: f64,
}

impl SpendCap {
    /// `cap`, nothing spent past it allowed yet.
    pub fn new(cap: crate::config::CostCap) -> Self {
        SpendCap {
            cap_usd: cap.usd(),
            allowed_usd: cap.usd(),
        }
    }

    /// Another cap's worth, past what `spent` reached: a person let it go on.
    pub fn grant(&mut self, spent: f64) {
        self.allowed_usd = self.allowed_usd.max(spent) + self.cap_usd;
    }

    /// Whether `spent` reached what may be spent.
    pub fn reached(&self, spent: f64) -> bool {
        spent >= self.allowed_usd
    }
}

/// Which spend cap a task is paused at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CapKind {
    /// Its own (`max_cost_usd` of the task).
    Task,
    /// Its run's, its tasks together.
    Run,
    /// The user's of a day, every run together.
    Day,
}

impl CapKind {
    /// How a reason names it: `its cap`, `its run's cap`, `the day's cap`.
    pub fn named(self) -> &'static str {
        match self {
            CapKind::Task => "its spend cap",
            CapKind::Run => "its run's spend cap",
            CapKind::Day => "the day's spend cap",
        }
    }
}

impl UsageLimit {
    /// When a task paused on it goes on by itself: when it lifts, or crew's next try.
    pub fn continues_at(&self) -> Option<Timestamp> {
        self.resets_at.or(self.retry_at)
    }
}

impl fmt::Display for UsageLimit {
    /// `a usage limit, which lifts at <time>: <what the agent said>`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.resets_at {
            Some(at) => write!(f, "a usage limit, which lifts at {at}: {}", self.message),
            None => write!(f, "a usage limit: {}", self.message),
        }
    }
}

impl fmt::Display for Usage {
    /// `12.3k tokens in, 4.5k out, $0.0123, 3 turns` (cache reads count as input).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.tokens_unknown {
            f.write_str("tokens not reported")?;
        } else {
            write!(
                f,
                "{} tokens in, {} out",
                Usage::count(self.input_total()),
                Usage::count(self.output_tokens)
            )?;
        }
        if let Some(cost) = self.cost_usd {
            write!(f, ", {}", Usage::dollars(cost))?;
        }
        write!(f, ", {} turn(s)", self.turns)
    }
}

impl Usage {
    /// Every input token: fresh, read from the cache, and written to it.
    pub fn input_total(&self) -> u64 {
        self.input_tokens + self.cache_read_input_tokens + self.cache_creation_input_tokens
    }

    /// A cost as people read it: `$0.0123`, `$1.25`.
    pub fn dollars(cost: f64) -> String {
        if cost < 1.0 {
            format!("${cost:.4}")
        } else {
            format!("${cost:.2}")
        }
    }

    fn count(tokens: u64) -> String {
        match tokens {
            0..1_000 => tokens.to_string(),
            1_000..1_000_000 => format!("{:.1}k", tokens as f64 / 1e3),
            _ => format!("{:.1}M", tokens as f64 / 1e6),
        }
    }

    /// Both counted together. The cost is known only when both knew it.
    pub fn plus(self, other: Usage) -> Usage {
        Usage {
            input_tokens: self.input_tokens + other.input_tokens,
            output_tokens: self.output_tokens + other.output_tokens,
            cache_read_input_tokens: self.cache_read_input_tokens + other.cache_read_input_tokens,
            cache_creation_input_tokens: self.cache_creation_input_tokens
                + other.cache_creation_input_tokens,
            cost_usd: self.cost_usd.zip(other.cost_usd).map(|(a, b)| a + b),
            turns: self.turns + other.turns,
            // Known as soon as one of them said (the others counted nothing).
            tokens_unknown: self.tokens_unknown && other.tokens_unknown,
        }
    }

    /// Every usage of `usages` counted together; `None` when there is none.
    pub fn sum(usages: impl IntoIterator<Item = Usage>) -> Option<Usage> {
        usages.into_iter().reduce(Usage::plus)
    }
}
