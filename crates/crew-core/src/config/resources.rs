//! `[resources]`: the caps the kernel holds a task's agent and everything it starts to
//! (DESIGN §8c) — memory, CPU and processes — from the project's `config.toml`, a team, a task
//! and `crew run --memory/--cpus/--processes`; the narrowest of those that name a cap wins.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::values::ByteSize;

/// The caps of one task's agent; `None`: no cap of that kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Resources {
    /// The most memory it and everything it starts may hold (`"2GiB"`); no swap beyond it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<ByteSize>,
    /// How many CPUs' worth of time it may use (`1.5`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpus: Option<Cpus>,
    /// How many processes and threads it may have at once (`256`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub processes: Option<u32>,
}

/// The least memory a cap may name: below it an agent's program cannot start.
pub const MIN_MEMORY: ByteSize = ByteSize(32 << 20);

/// The fewest processes a cap may name: a shell, its command and a pipe's other end.
pub const MIN_PROCESSES: u32 = 8;

impl Resources {
    /// Whether no cap is named.
    pub fn is_empty(&self) -> bool {
        *self == Resources::default()
    }

    /// These caps and `other`'s together: for each kind, the narrower of the two.
    pub fn narrowed(self, other: Resources) -> Resources {
        fn least<T: Ord>(a: Option<T>, b: Option<T>) -> Option<T> {
            match (a, b) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            }
        }
        Resources {
            memory: least(self.memory, other.memory),
            cpus: least(self.cpus, other.cpus),
            processes: least(self.processes, other.processes),
        }
    }

    /// What is wrong with these caps, if anything, as the message to show.
    pub fn check(&self) -> Result<(), String> {
        if let Some(memory) = self.memory
            && memory < MIN_MEMORY
        {
            return Err(format!(
                "memory = \"{memory}\" is too little for any agent's program to start: give at least {MIN_MEMORY}"
            ));
        }
        if let Some(processes) = self.processes
            && processes < MIN_PROCESSES
        {
            return Err(format!(
                "processes = {processes} is too few for an agent and the commands it runs: give at least {MIN_PROCESSES}"
            ));
        }
        Ok(())
    }

    /// The caps as a person reads them: `memory 2GiB, 1.5 CPUs, 256 processes`.
    pub fn shown(&self) -> String {
        let mut parts = Vec::new();
        if let Some(memory) = self.memory {
            parts.push(format!("memory {memory}"));
        }
        if let Some(cpus) = self.cpus {
            parts.push(format!("{cpus} CPUs"));
        }
        if let Some(processes) = self.processes {
            parts.push(format!("{processes} processes"));
        }
        parts.join(", ")
    }
}

/// A share of CPUs in thousandths (`1.5` is 1500), more than none and at most 1024 CPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Cpus(u32);

impl Cpus {
    /// Reads `1.5`, `"0.25"`; the error says what a cap takes.
    pub fn parse(value: f64) -> Result<Cpus, String> {
        let thousandths = (value * 1000.0).round();
        if !value.is_finite() || !(1.0..=1_024_000.0).contains(&thousandths) {
            return Err(format!(
                "cpus = {value} is not a share of CPUs: give a number above 0 (0.5 is half a CPU, 2 two CPUs), at most 1024"
            ));
        }
        Ok(Cpus(thousandths as u32))
    }

    /// In thousandths of a CPU.
    pub fn thousandths(self) -> u32 {
        self.0
    }
}

impl fmt::Display for Cpus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let whole = self.0 / 1000;
        let rest = self.0 % 1000;
        if rest == 0 {
            write!(f, "{whole}")
        } else {
            let fraction = format!("{rest:03}");
            write!(f, "{whole}.{}", fraction.trim_end_matches('0'))
        }
    }
}

impl Serialize for Cpus {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_f64(f64::from(self.0) / 1000.0)
    }
}

impl<'de> Deserialize<'de> for Cpus {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Number(f64),
            Text(String),
        }
        let value = match Raw::deserialize(deserializer)? {
            Raw::Number(number) => number,
            Raw::Text(text) => text.trim().parse().map_err(|_| {
                serde::de::Error::custom(format!(
                    "cpus = \"{text}\" is not a number: write it as 1.5 (one and a half CPUs)"
                ))
            })?,
        };
        Cpus::parse(value).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_narrowest_cap_of_each_kind_wins_and_a_missing_one_takes_the_other() {
        let project = Resources {
            memory: Some(ByteSize(4 << 30)),
            cpus: Some(Cpus::parse(2.0).unwrap()),
            processes: None,
        };
        let task = Resources {
            memory: Some(ByteSize(1 << 30)),
            cpus: Some(Cpus::parse(4.0).unwrap()),
            processes: Some(64),
        };
        let both = project.narrowed(task);
        assert_eq!(both.memory, Some(ByteSize(1 << 30)));
        assert_eq!(both.cpus.unwrap().to_string(), "2");
        assert_eq!(both.processes, Some(64));
        assert_eq!(both.shown(), "memory 1GiB, 2 CPUs, 64 processes");
        assert!(
            Resources::default()
                .narrowed(Resources::default())
                .is_empty()
        );
    }

    #[test]
    fn caps_a_task_cannot_run_under_are_refused_with_what_to_give() {
        assert_eq!(Cpus::parse(0.25).unwrap().to_string(), "0.25");
        assert_eq!(Cpus::parse(1.5).unwrap().thousandths(), 1500);
        for bad in [0.0, -1.0, f64::NAN, 5000.0, 0.0001] {
            assert!(Cpus::parse(bad).is_err(), "{bad}");
        }
        let small = Resources {
            memory: Some(ByteSize(1 << 20)),
            ..Resources::default()
        };
        assert!(small.check().unwrap_err().contains("at least 32MiB"));
        let few = Resources {
            processes: Some(2),
            ..Resources::default()
        };
        assert!(few.check().unwrap_err().contains("at least 8"));
        let parsed: Resources =
            toml::from_str("memory = \"2GiB\"\ncpus = 1.5\nprocesses = 256\n").unwrap();
        assert_eq!(parsed.shown(), "memory 2GiB, 1.5 CPUs, 256 processes");
        assert!(toml::from_str::<Resources>("cpus = 0\n").is_err());
        // A cap of a large machine's memory: no output log's range holds it back.
        let large: Resources = toml::from_str("memory = \"128GiB\"\n").unwrap();
        assert_eq!(large.memory, Some(ByteSize(128 << 30)));
        assert!(toml::from_str::<Resources>("memroy = \"1GiB\"\n").is_err());
    }
}
