//! Spend caps (DESIGN §8c): `max_cost_usd` of a task and of a run, and of a day in the user's
//! own configuration; what a program that reports its tokens and no cost is priced at
//! (`[prices]` of its definition); and the user's ledger of what each day cost.
//!
//! A cap is measured where a program reports what its turns cost (Claude Code's results, an
//! ACP agent's `usage_update`), or its tokens priced by its definition (Codex). Crew reads it at
//! the end of each turn: a task over a cap is paused before its next turn and asks whether to go
//! on (`crew agents resume` allows another cap's worth; `crew agents stop` ends it).

use std::fmt;
use std::io::Write;

use camino::{Utf8Path, Utf8PathBuf};
use serde::{Deserialize, Serialize};

use crate::model::Usage;

/// The most a cap may name: a bigger number is a typo, not a budget.
const MAX_CAP_USD: f64 = 1_000_000.0;

/// A cap in US dollars: more than nothing, finite.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Serialize, Deserialize)]
#[serde(try_from = "f64", into = "f64")]
pub struct CostCap(f64);

impl CostCap {
    /// Reads `2`, `0.5`; the error says what a cap takes.
    pub fn new(usd: f64) -> Result<Self, String> {
        if usd.is_finite() && usd > 0.0 && usd <= MAX_CAP_USD {
            Ok(CostCap(usd))
        } else {
            Err(format!(
                "a spend cap of {usd} is not an amount of US dollars: give a number above 0 (0.5 is fifty cents), at most {MAX_CAP_USD}"
            ))
        }
    }

    /// In US dollars.
    pub fn usd(self) -> f64 {
        self.0
    }

    /// The narrower of two caps, where either is named.
    pub fn narrowest(a: Option<CostCap>, b: Option<CostCap>) -> Option<CostCap> {
        match (a, b) {
            (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
            (a, b) => a.or(b),
        }
    }
}

impl TryFrom<f64> for CostCap {
    type Error = String;
    fn try_from(usd: f64) -> Result<Self, String> {
        CostCap::new(usd)
    }
}

impl From<CostCap> for f64 {
    fn from(cap: CostCap) -> f64 {
        cap.0
    }
}

impl fmt::Display for CostCap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&dollars(self.0))
    }
}

/// `$2.50`, `$0.0125`: cents, and the fractions of a cent that are there.
pub fn dollars(usd: f64) -> String {
    let four = format!("{usd:.4}");
    let trimmed = four.trim_end_matches('0');
    let decimals = trimmed.split_once('.').map_or(0, |(_, tail)| tail.len());
    if decimals < 2 {
        format!("${usd:.2}")
    } else {
        format!("${trimmed}")
    }
}

/// What a program that reports tokens and no cost is priced at (`[prices]` of its definition),
/// in US dollars per million tokens. Crew knows no price list: the model and the plan decide,
/// and only the user knows both.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Prices {
    /// A million tokens read, not from the cache.
    pub input: f64,
    /// A million tokens written.
    pub output: f64,
    /// A million tokens read from the prompt cache; as `input` when not named.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_input: Option<f64>,
    /// A million tokens written to the prompt cache; as `input` when not named.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write: Option<f64>,
}

impl Prices {
    /// What `usage` costs at these prices; `None` where its tokens are not known.
    pub fn cost_of(&self, usage: &Usage) -> Option<f64> {
        if usage.tokens_unknown {
            return None;
        }
        let per = |tokens: u64, price: f64| tokens as f64 * price / 1_000_000.0;
        Some(
            per(usage.input_tokens, self.input)
                + per(usage.output_tokens, self.output)
                + per(
                    usage.cache_read_input_tokens,
                    self.cached_input.unwrap_or(self.input),
                )
                + per(
                    usage.cache_creation_input_tokens,
                    self.cache_write.unwrap_or(self.input),
                ),
        )
    }

    /// What is wrong with these prices, if anything, as the message to show.
    pub fn check(&self) -> Result<(), String> {
        let all = [
            ("input", Some(self.input)),
            ("output", Some(self.output)),
            ("cached_input", self.cached_input),
            ("cache_write", self.cache_write),
        ];
        for (key, price) in all {
            if let Some(price) = price
                && !(price.is_finite() && price >= 0.0)
            {
                return Err(format!(
                    "prices.{key} = {price} is not a price: give US dollars per million tokens, 0 or more"
                ));
            }
        }
        Ok(())
    }
}

/// The user's own settings (`$XDG_CONFIG_HOME/crew/config.toml`, else
/// `~/.config/crew/config.toml`): what holds across every project.
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct UserConfig {
    /// The most every run of every project may spend in one day (UTC), together.
    pub max_cost_usd_per_day: Option<CostCap>,
}

/// The user's settings file, from the variables `env_var` gives; `None` without a home.
pub fn user_config_file(env_var: impl Fn(&str) -> Option<String>) -> Option<Utf8PathBuf> {
    let config = env_var("XDG_CONFIG_HOME")
        .filter(|dir| dir.starts_with('/'))
        .map(Utf8PathBuf::from)
        .or_else(|| {
            env_var("HOME")
                .filter(|home| home.starts_with('/'))
                .map(|home| Utf8PathBuf::from(home).join(".config"))
        })?;
    Some(config.join("crew").join("config.toml"))
}

impl UserConfig {
    /// The current user's settings: none when the file is not there; an error naming the file,
    /// line and key when it cannot be used.
    pub fn of_user() -> Result<UserConfig, super::LoadConfigError> {
        match user_config_file(|name| std::env::var(name).ok()) {
            Some(path) => UserConfig::load(&path),
            None => Ok(UserConfig::default()),
        }
    }

    /// The settings in `path`; the defaults where it is not there.
    pub fn load(path: &Utf8Path) -> Result<UserConfig, super::LoadConfigError> {
        match super::load::read_optional(path)? {
            Some(source) => super::locate::parse_toml(path, &source),
            None => Ok(UserConfig::default()),
        }
    }
}

/// What each day cost the user, across every project (`spent/<YYYY-MM-DD>` beneath the user's
/// state directory): one line per turn a cap was measured on, appended by whichever crew saw
/// it, so that hosts of several projects add up without a lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DayLedger {
    dir: Utf8PathBuf,
}

impl DayLedger {
    /// The current user's; `None` without a state directory.
    pub fn of_user() -> Option<Self> {
        let state = crate::env_vars::user_state_dir(|name| std::env::var(name).ok())?;
        Some(DayLedger::at(state.join("spent")))
    }

    /// The ledger kept in `dir`.
    pub fn at(dir: impl Into<Utf8PathBuf>) -> Self {
        DayLedger { dir: dir.into() }
    }

    /// Adds `usd` to today's (UTC) spend.
    pub fn add(&self, usd: f64) -> std::io::Result<()> {
        if usd <= 0.0 || !usd.is_finite() {
            return Ok(());
        }
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::create_dir_all(&self.dir)?;
        // Never through a link put in the file's place.
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
            .open(self.dir.join(today()))?;
        // One write of one short line: appends of several hosts never interleave within it.
        file.write_all(format!("{usd}\n").as_bytes())
    }

    /// What today (UTC) cost so far; lines that are not amounts (a crash mid-line) count nothing.
    pub fn spent_today(&self) -> f64 {
        std::fs::read_to_string(self.dir.join(today()))
            .map(|text| {
                text.lines()
                    .filter_map(|line| line.trim().parse::<f64>().ok())
                    .filter(|usd| usd.is_finite() && *usd > 0.0)
                    .sum()
            })
            .unwrap_or(0.0)
    }
}

/// Today's date in UTC, `YYYY-MM-DD`.
fn today() -> String {
    let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    now[..10].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_are_amounts_and_read_as_dollars() {
        assert!(CostCap::new(0.0).is_err());
        assert!(CostCap::new(-1.0).is_err());
        assert!(CostCap::new(f64::NAN).is_err());
        assert_eq!(CostCap::new(2.5).unwrap().to_string(), "$2.50");
        assert_eq!(dollars(0.0125), "$0.0125");
        assert_eq!(dollars(3.0), "$3.00");
        let (a, b) = (CostCap::new(1.0).ok(), CostCap::new(0.5).ok());
        assert_eq!(CostCap::narrowest(a, b), b);
        assert_eq!(CostCap::narrowest(None, a), a);
    }

    #[test]
    fn tokens_are_priced_per_million_and_the_cache_as_input_unless_named() {
        let prices = Prices {
            input: 2.0,
            output: 10.0,
            cached_input: Some(0.5),
            cache_write: None,
        };
        let usage = Usage {
            input_tokens: 1_000_000,
            output_tokens: 100_000,
            cache_read_input_tokens: 2_000_000,
            cache_creation_input_tokens: 500_000,
            ..Usage::default()
        };
        assert_eq!(prices.cost_of(&usage), Some(2.0 + 1.0 + 1.0 + 1.0));
        let unknown = Usage {
            tokens_unknown: true,
            ..Usage::default()
        };
        assert_eq!(prices.cost_of(&unknown), None);
        assert!(
            Prices {
                input: -1.0,
                ..prices
            }
            .check()
            .is_err()
        );
    }

    #[test]
    fn a_day_s_spend_adds_up_what_each_host_appended() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = DayLedger::at(Utf8PathBuf::from_path_buf(dir.path().join("spent")).unwrap());
        assert_eq!(ledger.spent_today(), 0.0);
        ledger.add(0.25).unwrap();
        DayLedger::at(ledger.dir.clone()).add(0.5).unwrap();
        ledger.add(-3.0).unwrap();
        assert!((ledger.spent_today() - 0.75).abs() < 1e-9);
    }
}
