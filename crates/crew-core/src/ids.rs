//! Identifiers of runs, tasks, agents and workspaces, and `safe_segment`.
//!
//! Every id that ends up in a path, a branch name or a socket message is validated here,
//! once, when it enters crew. Nothing downstream rewrites an id.

use std::fmt;
use std::str::FromStr;
use std::time::{SystemTime, UNIX_EPOCH};

use camino::{Utf8Path, Utf8PathBuf};
use serde::{Deserialize, Serialize};

/// The longest a run id may be.
pub const RUN_ID_MAX_LEN: usize = 26;
/// The longest a task id may be.
pub const TASK_ID_MAX_LEN: usize = 64;
/// The longest string `safe_segment` returns.
pub const SAFE_SEGMENT_MAX_LEN: usize = 100;

/// Width of the base-36 millisecond timestamp in a run id: 36^9 ms reach the year 5000, so ids
/// stay fixed-width.
const RUN_ID_TIME_WIDTH: usize = 9;
/// Width of the random part: 36^8 ≈ 2^41 values, drawn fresh for every id.
const RUN_ID_RANDOM_WIDTH: usize = 8;

/// Identifies one run: `<random>-<time>`, lowercase base 36, e.g. `4k2j9x0p-mfk2x9a1c`.
///
/// The random part comes first so that a few leading characters tell runs apart even when
/// they started seconds apart (a prefix is what people type). Ids still order by creation time
/// (see the `Ord` impl), also the `<time>-<random>` ids of earlier crews. Two processes
/// creating runs in the same millisecond get different ids, and the state store creates each
/// run directory exclusively, so a collision is retried rather than shared.
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct RunId(String);

/// Oldest first: by the time part of the id (`<random>-<time>`, or `<time>-<random>` as
/// earlier crews wrote them), then by the whole id.
impl Ord for RunId {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.created_key()
            .cmp(other.created_key())
            .then_with(|| self.0.cmp(&other.0))
    }
}

impl PartialOrd for RunId {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl RunId {
    /// A new id for a run created now.
    pub fn generate() -> Self {
        let millis = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|elapsed| elapsed.as_millis())
            .unwrap_or(0);
        let random = u128::from_le_bytes(*uuid::Uuid::new_v4().as_bytes());
        let mut id = base36(random, RUN_ID_RANDOM_WIDTH);
        id.push('-');
        id.push_str(&base36(millis, RUN_ID_TIME_WIDTH));
        RunId(id)
    }

    /// A run id a person chose (`crew run --name refund-fix`): lowercase letters, digits and
    /// single `-` between them, at most 26 characters, and not shaped like a generated id.
    pub fn named(name: &str) -> Result<Self, InvalidIdError> {
        let invalid = |rule: &'static str| InvalidIdError {
            field: "run name",
            value: name.to_owned(),
            rule,
        };
        if name.is_empty() {
            return Err(invalid("must not be empty"));
        }
        if name.len() > RUN_ID_MAX_LEN {
            return Err(invalid("must be at most 26 characters"));
        }
        if !name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        {
            return Err(invalid(
                "may only contain lowercase letters, digits and `-`",
            ));
        }
        if name.starts_with('-') || name.ends_with('-') || name.contains("--") {
            return Err(invalid(
                "must start and end with a letter or digit, with single `-` between words",
            ));
        }
        let id = RunId(name.to_owned());
        if Self::time_part(&id.0).is_some() {
            return Err(invalid(
                "must not look like a generated run id (8 and 9 characters around a `-`)",
            ));
        }
        Ok(id)
    }

    /// When the run was created, in milliseconds since the epoch, read from a generated id;
    /// `None` for a run a person named.
    pub fn created_millis(&self) -> Option<u64> {
        Self::created_millis_of(&self.0)
    }

    /// [`RunId::created_millis`] of a valid id's text, without making the id.
    pub fn created_millis_of(id: &str) -> Option<u64> {
        Self::time_part(id)?
            .bytes()
            .try_fold(0u64, |millis, digit| {
                let value = (digit as char).to_digit(36)?;
                millis.checked_mul(36)?.checked_add(u64::from(value))
            })
    }

    /// Whether `name` follows the rules of [`RunId::parse`] (what a directory listing checks
    /// before it makes an id).
    pub fn is_valid(name: &[u8]) -> bool {
        !name.is_empty()
            && name.len() <= RUN_ID_MAX_LEN
            && name[0] != b'-'
            && name
                .iter()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
    }

    /// The timestamp of a generated id, wherever it stands.
    fn time_part(id: &str) -> Option<&str> {
        match id.split_once('-') {
            Some((random, time))
                if random.len() == RUN_ID_RANDOM_WIDTH && time.len() == RUN_ID_TIME_WIDTH =>
            {
                Some(time)
            }
            Some((time, random))
                if time.len() == RUN_ID_TIME_WIDTH && random.len() == RUN_ID_RANDOM_WIDTH =>
            {
                Some(time)
            }
            _ => None,
        }
    }

    /// Whether one of the two ids is the other followed by `-…`: their task branches
    /// (`<runId>-<taskId>`) could then be the same.
    pub fn overlaps(&self, other: &RunId) -> bool {
        let dash_prefix = |short: &str, long: &str| {
            long.strip_prefix(short)
                .is_some_and(|rest| rest.starts_with('-'))
        };
        self == other || dash_prefix(&self.0, &other.0) || dash_prefix(&other.0, &self.0)
    }

    /// The part of the id that orders runs by creation: the fixed-width timestamp of a
    /// generated id, wherever it stands; the whole id otherwise.
    fn created_key(&self) -> &str {
        Self::time_part(&self.0).unwrap_or(&self.0)
    }

    /// Checks a run id given from outside (a directory name, a manifest, a socket message).
    pub fn parse(value: &str) -> Result<Self, InvalidIdError> {
        let invalid = |rule: &'static str| InvalidIdError {
            field: "run id",
            value: value.to_owned(),
            rule,
        };
        if value.is_empty() {
            return Err(invalid("must not be empty"));
        }
        if value.len() > RUN_ID_MAX_LEN {
            return Err(invalid("must be at most 26 characters"));
        }
        if !value
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        {
            return Err(invalid("may only contain a-z, 0-9 and `-`"));
        }
        if value.starts_with('-') {
            return Err(invalid("must not start with `-`"));
        }
        Ok(RunId(value.to_owned()))
    }

    /// The id as written.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

fn base36(mut value: u128, width: usize) -> String {
    const DIGITS: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut digits = vec![b'0'; width];
    for slot in digits.iter_mut().rev() {
        *slot = DIGITS[(value % 36) as usize];
        value /= 36;
    }
    String::from_utf8(digits).expect("base-36 digits are ASCII")
}

/// Identifies a task within a run. Given by the user in a team file; validated, never
/// rewritten: `[A-Za-z0-9][A-Za-z0-9._-]{0,63}`, not ending in `.` or `.lock`, no `..`, and not
/// one of git's reserved ref names such as `HEAD`.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct TaskId(String);

/// Names git gives special meaning to; a task named like this would make branch and ref
/// listings ambiguous.
const RESERVED_TASK_IDS: &[&str] = &[
    "HEAD",
    "FETCH_HEAD",
    "ORIG_HEAD",
    "MERGE_HEAD",
    "CHERRY_PICK_HEAD",
    "REVERT_HEAD",
    "BISECT_HEAD",
    "AUTO_MERGE",
];

impl TaskId {
    /// Checks `value` against the task id rules.
    pub fn parse(value: &str) -> Result<Self, InvalidIdError> {
        let invalid = |rule: &'static str| InvalidIdError {
            field: "task id",
            value: value.to_owned(),
            rule,
        };
        let Some(first) = value.chars().next() else {
            return Err(invalid("must not be empty"));
        };
        if !first.is_ascii_alphanumeric() {
            return Err(invalid("must start with a letter or a digit"));
        }
        if value.chars().count() > TASK_ID_MAX_LEN {
            return Err(invalid("must be at most 64 characters"));
        }
        if !value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        {
            return Err(invalid(
                "may only contain letters, digits, `.`, `_` and `-` (no `/`, spaces or control characters)",
            ));
        }
        if value.contains("..") {
            return Err(invalid("must not contain `..`"));
        }
        if value.ends_with('.') {
            return Err(invalid("must not end with `.`"));
        }
        if value.to_ascii_lowercase().ends_with(".lock") {
            return Err(invalid("must not end with `.lock`"));
        }
        if RESERVED_TASK_IDS
            .iter()
            .any(|reserved| reserved.eq_ignore_ascii_case(value))
        {
            return Err(invalid("must not be a name git reserves, such as `HEAD`"));
        }
        Ok(TaskId(value.to_owned()))
    }

    /// The id as written.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The key under which two task ids collide: file systems that ignore case would put both
    /// tasks in one directory.
    pub fn collision_key(&self) -> String {
        self.0.to_ascii_lowercase()
    }
}

/// Identifies a live agent: `<runId>:<taskId>`.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct AgentId {
    run_id: RunId,
    task_id: TaskId,
}

impl AgentId {
    /// The agent of task `task_id` in run `run_id`.
    pub fn new(run_id: RunId, task_id: TaskId) -> Self {
        AgentId { run_id, task_id }
    }

    /// Parses `<runId>:<taskId>`, each part under its own rules.
    pub fn parse(value: &str) -> Result<Self, InvalidIdError> {
        let Some((run, task)) = value.split_once(':') else {
            return Err(InvalidIdError {
                field: "agent id",
                value: value.to_owned(),
                rule: "must have the form <runId>:<taskId>",
            });
        };
        Ok(AgentId {
            run_id: RunId::parse(run)?,
            task_id: TaskId::parse(task)?,
        })
    }

    /// The run the agent belongs to.
    pub fn run_id(&self) -> &RunId {
        &self.run_id
    }

    /// The task the agent works on.
    pub fn task_id(&self) -> &TaskId {
        &self.task_id
    }
}

/// A workspace: the canonical absolute path (symlinks resolved, UTF-8) of the project root
/// where a run was initiated. Two spellings of one directory give equal ids.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct WorkspaceId(Utf8PathBuf);

impl WorkspaceId {
    /// Canonicalizes `path` (resolving symlinks, `.`, `..` and trailing slashes).
    pub fn from_path(path: &std::path::Path) -> Result<Self, WorkspacePathError> {
        crate::paths::canonical_utf8(path).map(WorkspaceId)
    }

    /// Wraps a path that is already canonical, such as `manifest.cwd` read back from state.
    pub fn from_canonical(path: Utf8PathBuf) -> Self {
        WorkspaceId(path)
    }

    /// The canonical path.
    pub fn as_path(&self) -> &Utf8Path {
        &self.0
    }
}

pub use crate::paths::WorkspacePathError;

/// A string from outside made into exactly one safe path segment: keeps `[A-Za-z0-9._-]`,
/// replaces anything else with `_`, turns leading dots and runs of dots into `_` (so the result
/// is never `.`, `..`, hidden or a traversal), and caps the result at 100 characters.
/// `../../etc` becomes `______etc`.
pub fn safe_segment(value: &str) -> String {
    let mapped: Vec<char> = value
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    let mut out = String::with_capacity(mapped.len().min(SAFE_SEGMENT_MAX_LEN));
    let mut in_leading_dots = true;
    for (index, &c) in mapped.iter().enumerate() {
        let dot_beside_dot = c == '.'
            && (index > 0 && mapped[index - 1] == '.' || mapped.get(index + 1) == Some(&'.'));
        in_leading_dots &= c == '.';
        out.push(if c == '.' && (in_leading_dots || dot_beside_dot) {
            '_'
        } else {
            c
        });
        if out.len() == SAFE_SEGMENT_MAX_LEN {
            break;
        }
    }
    if out.is_empty() {
        out.push('_');
    }
    out
}

/// An id that breaks its rule. The message names the field, the value and the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {field} {value:?}: {rule}")]
pub struct InvalidIdError {
    /// What the id was meant to be, e.g. `task id`.
    pub field: &'static str,
    /// The value given.
    pub value: String,
    /// The rule it breaks.
    pub rule: &'static str,
}

macro_rules! string_id_impls {
    ($name:ident) => {
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({:?})", stringify!($name), self.as_str())
            }
        }
        impl FromStr for $name {
            type Err = InvalidIdError;
            fn from_str(value: &str) -> Result<Self, Self::Err> {
                Self::parse(value)
            }
        }
        impl TryFrom<String> for $name {
            type Error = InvalidIdError;
            fn try_from(value: String) -> Result<Self, Self::Error> {
                Self::parse(&value)
            }
        }
        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.as_str().to_owned()
            }
        }
    };
}

string_id_impls!(RunId);
string_id_impls!(TaskId);

impl fmt::Display for AgentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.run_id, self.task_id)
    }
}

impl fmt::Debug for AgentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AgentId({self})")
    }
}

impl FromStr for AgentId {
    type Err = InvalidIdError;
    fn from_str(value: &str) -> Result<Self, Self::Err> {
        Self::parse(value)
    }
}

impl TryFrom<String> for AgentId {
    type Error = InvalidIdError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::parse(&value)
    }
}

impl From<AgentId> for String {
    fn from(id: AgentId) -> String {
        id.to_string()
    }
}

impl fmt::Display for WorkspaceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl fmt::Debug for WorkspaceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "WorkspaceId({:?})", self.0.as_str())
    }
}

/// A hash of `text` that is the same on every machine and in every version of crew (FNV-1a,
/// 64 bits): what names derived from an id (a socket, a placement's clone, a label) use.
pub fn stable_hash(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_are_short_lowercase_and_sort_by_time() {
        let first = RunId::generate();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let second = RunId::generate();
        assert!(first < second, "{first} should sort before {second}");
        assert!(first.as_str().len() <= RUN_ID_MAX_LEN);
        assert_eq!(RunId::parse(first.as_str()).unwrap(), first);
    }

    #[test]
    fn run_ids_generated_together_differ_in_their_first_characters() {
        let ids: Vec<RunId> = (0..10_000).map(|_| RunId::generate()).collect();
        let unique: std::collections::HashSet<_> = ids.iter().collect();
        assert_eq!(unique.len(), 10_000);
        // Runs started together are told apart by a short prefix, as people type them.
        let prefixes: std::collections::HashSet<_> =
            ids.iter().take(100).map(|id| &id.as_str()[..4]).collect();
        assert!(prefixes.len() >= 95, "{prefixes:?}");
    }

    #[test]
    fn run_names_are_checked_and_never_pass_for_generated_ids() {
        assert_eq!(RunId::named("refund-fix").unwrap().as_str(), "refund-fix");
        assert_eq!(RunId::named("refund-fix").unwrap().created_millis(), None);
        for bad in [
            "",
            "Refund",
            "refund_fix",
            "-x",
            "x-",
            "a--b",
            "abcdefgh-abcdefghi",
            "abcdefghi-abcdefgh",
            &"x".repeat(27),
        ] {
            assert!(RunId::named(bad).is_err(), "{bad:?} must be refused");
        }
        let generated = RunId::generate();
        assert!(generated.created_millis().is_some());
        let refund = RunId::named("refund").unwrap();
        assert!(refund.overlaps(&RunId::named("refund-fix").unwrap()));
        assert!(RunId::named("refund-fix").unwrap().overlaps(&refund));
        assert!(!refund.overlaps(&RunId::named("refunds").unwrap()));
    }

    #[test]
    fn run_ids_of_earlier_crews_order_among_new_ones_by_time() {
        let old = RunId::parse("0mx3pd5k2-4k2j9x0p").unwrap();
        let new_later = RunId::parse("00000000-0mx3pd5k3").unwrap();
        let new_earlier = RunId::parse("zzzzzzzz-0mx3pd5k1").unwrap();
        let mut ids = vec![new_later.clone(), old.clone(), new_earlier.clone()];
        ids.sort();
        assert_eq!(ids, vec![new_earlier, old, new_later]);
    }

    #[test]
    fn task_id_rules_name_the_field_and_the_rule() {
        let error = TaskId::parse("a/b").unwrap_err();
        assert_eq!(
            error.to_string(),
            "invalid task id \"a/b\": may only contain letters, digits, `.`, `_` and `-` (no `/`, spaces or control characters)"
        );
        for bad in [
            "", "..", "a..b", "-x", ".x", "x.", "x.lock", "x.LOCK", "HEAD", "head", "a\0b", "a b",
            "é",
        ] {
            assert!(TaskId::parse(bad).is_err(), "{bad:?} must be rejected");
        }
        assert!(TaskId::parse(&"x".repeat(65)).is_err());
        for good in ["api", "Fix-1", "a.b_c-d", "0", &"x".repeat(64)] {
            assert!(TaskId::parse(good).is_ok(), "{good:?} must be accepted");
        }
    }

    #[test]
    fn agent_id_round_trips() {
        let id = AgentId::parse("abc-123:api").unwrap();
        assert_eq!(id.run_id().as_str(), "abc-123");
        assert_eq!(id.task_id().as_str(), "api");
        assert_eq!(id.to_string(), "abc-123:api");
        assert!(AgentId::parse("abc").is_err());
        assert!(AgentId::parse("ABC:api").is_err());
    }

    #[test]
    fn safe_segment_examples() {
        assert_eq!(safe_segment("../../etc"), "______etc");
        assert_eq!(safe_segment("api"), "api");
        assert_eq!(safe_segment("..."), "___");
        assert_eq!(safe_segment("a..b"), "a__b");
        assert_eq!(safe_segment("v1.2"), "v1.2");
        assert_eq!(safe_segment(".hidden"), "_hidden");
        assert_eq!(safe_segment("a b/c"), "a_b_c");
        assert_eq!(safe_segment(""), "_");
        assert_eq!(safe_segment(&"y".repeat(300)).len(), 100);
    }
}
