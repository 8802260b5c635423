//! Values people write in configuration files: durations (`90s`), sizes (`64MiB`), and a
//! parallelism that cannot be zero.

use std::fmt;
use std::num::NonZeroUsize;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A duration written as `"30m"`, `"1h 30m"`, `"10s"` or a number of seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct HumanDuration(pub Duration);

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Seconds(u64),
            Text(String),
        }
        let (duration, written) = match Raw::deserialize(deserializer)? {
            Raw::Seconds(seconds) => (Duration::from_secs(seconds), seconds.to_string()),
            Raw::Text(text) => match humantime::parse_duration(&text) {
                Ok(duration) => (duration, format!("`{text}`")),
                Err(error) => {
                    return Err(serde::de::Error::custom(format!(
                        "invalid duration `{text}` ({error}); write it like \"90s\", \"30m\" or \"1h 30m\""
                    )));
                }
            },
        };
        if duration.is_zero() || duration > HumanDuration::MAX.0 {
            return Err(serde::de::Error::custom(format!(
                "duration {written} is out of range: it must be longer than 0s and at most 365 days"
            )));
        }
        Ok(HumanDuration(duration))
    }
}

impl HumanDuration {
    /// The longest duration any setting takes: a year.
    pub const MAX: HumanDuration = HumanDuration(Duration::from_secs(365 * 86_400));
}

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", humantime::format_duration(self.0))
    }
}

impl Serialize for HumanDuration {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&humantime::format_duration(self.0).to_string())
    }
}

/// A size in bytes, written as a number of bytes or like `"64MiB"`, `"512KiB"`, `"2GB"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(pub u64);

impl ByteSize {
    /// The smallest `max_output_log`: below it a log would hold too little to read.
    pub const MIN_LOG: ByteSize = ByteSize(64 * 1024);
    /// The largest `max_output_log`.
    pub const MAX_LOG: ByteSize = ByteSize(64 * 1024 * 1024 * 1024);

    fn parse(text: &str) -> Option<u64> {
        let text = text.trim();
        let split = text
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len());
        let (digits, unit) = text.split_at(split);
        let number: u64 = digits.parse().ok()?;
        let multiplier: u64 = match unit.trim() {
            "" | "B" => 1,
            "KB" => 1000,
            "KiB" => 1 << 10,
            "MB" => 1000 * 1000,
            "MiB" => 1 << 20,
            "GB" => 1000 * 1000 * 1000,
            "GiB" => 1 << 30,
            _ => return None,
        };
        number.checked_mul(multiplier)
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [(u64, &str); 3] = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
        for (size, unit) in UNITS {
            if self.0 >= size && self.0.is_multiple_of(size) {
                return write!(f, "{}{unit}", self.0 / size);
            }
        }
        write!(f, "{}B", self.0)
    }
}

impl std::str::FromStr for ByteSize {
    type Err = String;

    /// `"64MiB"`, `"512KiB"`, `"2GB"`, a number of bytes; the error says how to write one.
    fn from_str(text: &str) -> Result<Self, String> {
        ByteSize::parse(text).map(ByteSize).ok_or_else(|| {
            format!("invalid size `{text}`; write it like \"64MiB\", \"512KiB\" or \"1GiB\"")
        })
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Bytes(u64),
            Text(String),
        }
        let bytes = match Raw::deserialize(deserializer)? {
            Raw::Bytes(bytes) => bytes,
            Raw::Text(text) => {
                text.parse::<ByteSize>()
                    .map_err(serde::de::Error::custom)?
                    .0
            }
        };
        // What range a size may take is its key's (an output log's, a memory cap's).
        Ok(ByteSize(bytes))
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.to_string())
    }
}

/// How many tasks may run at once: a whole number of at least 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct Parallelism(pub NonZeroUsize);

impl Parallelism {
    /// How many tasks may run at once (at least 1).
    pub fn get(self) -> usize {
        self.0.get()
    }
}

impl Parallelism {
    /// More agents at once than any machine serves.
    pub const MAX: usize = 1000;
}

impl<'de> Deserialize<'de> for Parallelism {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = i64::deserialize(deserializer)?;
        usize::try_from(value)
            .ok()
            .filter(|value| *value <= Parallelism::MAX)
            .and_then(NonZeroUsize::new)
            .map(Parallelism)
            .ok_or_else(|| {
                serde::de::Error::custom(format!(
                    "parallelism must be a whole number from 1 to {}, not {value}",
                    Parallelism::MAX
                ))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_like_people_write_them() {
        assert_eq!(ByteSize::parse("64MiB"), Some(64 << 20));
        assert_eq!(ByteSize::parse("2 GB"), Some(2_000_000_000));
        assert_eq!(ByteSize::parse("512"), Some(512));
        assert_eq!(ByteSize::parse("1TiB"), None);
        assert_eq!(ByteSize::parse("MiB"), None);
        assert_eq!(ByteSize(64 << 20).to_string(), "64MiB");
        assert_eq!(ByteSize(1500).to_string(), "1500B");
    }
}
