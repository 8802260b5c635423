//! Usage and rate limits an agent hits: what it said, read for when the limit lifts, and when
//! crew tries again where it said nothing of that.
//!
//! The forms the programs print, all read here:
//! - Claude Code: `Claude AI usage limit reached|<unix seconds>` (the reset after the bar), or
//!   `You've hit your limit · resets 2am (Europe/Berlin)` (a clock time in a named zone);
//! - Codex: `… Try again in 2 hours 5 minutes.`, `… try again at 8:40 PM.` (this machine's clock,
//!   today) or `… Try again at Dec 3rd, 2026 8:40 PM.` (another day); an API's 429 it gave up on
//!   (`exceeded retry limit, last status: 429 Too Many Requests`) names no time.
//!
//! A limit without any of these (an API's 429 the program gave up on) lifts by
//! [`retry_backoff`]: crew tries again after a minute, then two, four, up to an hour.

use std::time::{Duration, SystemTime};

use crew_core::model::{Timestamp, UsageLimit};
use jiff::civil;
use jiff::tz::TimeZone;

/// The usage or rate limit an agent's account of a failed turn names, if it names one, with
/// when it lifts when that can be read from it (see the module's forms).
pub fn usage_limit(text: &str) -> Option<UsageLimit> {
    read_limit(text, jiff::Timestamp::now(), &TimeZone::system())
}

/// How long a task paused on a limit that said nothing of when it lifts waits before crew
/// tries again, at its `tries`-th wait (from 0): a minute, doubling, at most an hour.
pub fn retry_backoff(tries: u32) -> Duration {
    const FIRST: Duration = Duration::from_secs(60);
    const MOST: Duration = Duration::from_secs(3_600);
    FIRST.saturating_mul(1 << tries.min(6)).min(MOST)
}

/// [`usage_limit`] at the instant `now`, reading clock times without a zone in `local`.
fn read_limit(text: &str, now: jiff::Timestamp, local: &TimeZone) -> Option<UsageLimit> {
    let lower = text.to_ascii_lowercase();
    let names_a_limit = [
        "usage limit",
        "rate limit",
        "hit your limit",
        "session limit",
        "out of extra usage",
        "429 too many requests",
    ]
    .iter()
    .any(|phrase| lower.contains(phrase));
    if !names_a_limit {
        return None;
    }
    // `…usage limit reached|1762952400`
    if let Some((message, epoch)) = text.trim().rsplit_once('|')
        && let Ok(seconds) = epoch.trim().parse::<u64>()
    {
        return Some(UsageLimit {
            message: message.trim().to_owned(),
            resets_at: Some(Timestamp(
                std::time::UNIX_EPOCH + Duration::from_secs(seconds),
            )),
            retry_at: None,
            provider: None,
        });
    }
    let after = |phrase: &str| lower.find(phrase).map(|at| &lower[at + phrase.len()..]);
    let resets_at = after("try again in ")
        .and_then(spelled_duration)
        .map(|wait| Timestamp(SystemTime::from(now) + wait))
        .or_else(|| {
            after("try again at ")
                .or_else(|| after("resets "))
                .and_then(|words| clock_time(words, now, local))
        });
    Some(UsageLimit {
        message: text.trim().to_owned(),
        resets_at,
        retry_at: None,
        provider: None,
    })
}

/// `2 hours 5 minutes`, `1 day`, `30 seconds` (and `and`s and commas between): the duration the
/// words at the start of `text` spell, `None` when they spell none.
fn spelled_duration(text: &str) -> Option<Duration> {
    let mut total = 0u64;
    let mut words = text
        .split(|c: char| c.is_whitespace() || c == ',' || c == '.')
        .filter(|word| !word.is_empty() && *word != "and");
    let mut read_any = false;
    while let Some(number) = words.next() {
        let Ok(count) = number.parse::<u64>() else {
            break;
        };
        let unit = match words.next().map(|unit| unit.trim_end_matches('s')) {
            Some("day") => 86_400,
            Some("hour") => 3_600,
            Some("minute" | "min") => 60,
            Some("second" | "sec") => 1,
            _ => break,
        };
        total = total.saturating_add(count.saturating_mul(unit));
        read_any = true;
    }
    read_any.then(|| Duration::from_secs(total))
}

/// The end of the minute the (lowercase) words at the start of `text` name as a clock time: `8:40 pm`,
/// `2am`, `20:40`, after a date or not (`dec 3rd, 2026 8:40 pm`), and in a zone given in
/// parentheses after it (`2am (europe/berlin)`) or else in `local`. Without a date it is the
/// next such time from `now`. `None` when the words name no clock time.
fn clock_time(text: &str, now: jiff::Timestamp, local: &TimeZone) -> Option<Timestamp> {
    let (before_zone, zone) = match text.split_once('(') {
        Some((before, rest)) => (before, rest.split_once(')').map(|(zone, _)| zone.trim())),
        None => (text, None),
    };
    let zone = match zone {
        // Looked up without case (the words were lowered).
        Some(name) => TimeZone::get(name).ok()?,
        None => local.clone(),
    };
    let mut words = before_zone
        .split_whitespace()
        .map(|word| word.trim_end_matches(['.', ',', '·']))
        .filter(|word| !word.is_empty())
        .peekable();
    let today = now.to_zoned(zone.clone()).date();
    let date = match words.peek().and_then(|word| month(word)) {
        Some(month) => {
            words.next();
            let day = words.next()?;
            let day: i8 = day
                .trim_end_matches(|c: char| c.is_ascii_alphabetic())
                .parse()
                .ok()?;
            let year = match words.peek().and_then(|word| word.parse::<i16>().ok()) {
                Some(year) => {
                    words.next();
                    year
                }
                None => today.year(),
            };
            Some(civil::Date::new(year, month, day).ok()?)
        }
        None => None,
    };
    let time = words.next()?;
    let (digits, mut meridiem) = match time.find(|c: char| c.is_ascii_alphabetic()) {
        Some(at) => (&time[..at], Some(&time[at..])),
        None => (time, None),
    };
    if meridiem.is_none() && matches!(words.peek(), Some(&("am" | "pm"))) {
        meridiem = words.next();
    }
    let (hour, minute) = match digits.split_once(':') {
        Some((hour, minute)) => (hour.parse::<i8>().ok()?, minute.parse::<i8>().ok()?),
        None if meridiem.is_some() => (digits.parse::<i8>().ok()?, 0),
        None => return None,
    };
    let hour = match meridiem {
        Some("am") if (1..=12).contains(&hour) => hour % 12,
        Some("pm") if (1..=12).contains(&hour) => hour % 12 + 12,
        None => hour,
        Some(_) => return None,
    };
    let time = civil::Time::new(hour, minute, 0, 0).ok()?;
    // A clock time names its minute, not its second (Codex says `10:54 PM` of a limit that
    // lifts at 22:54:21): the limit has lifted by the minute's end.
    let on = |date: civil::Date| {
        date.to_datetime(time)
            .to_zoned(zone.clone())
            .ok()
            .and_then(|at| {
                at.timestamp()
                    .checked_add(jiff::SignedDuration::from_secs(60))
                    .ok()
            })
    };
    let at = match date {
        Some(date) => on(date)?,
        None => {
            let at = on(today)?;
            if at < now {
                on(today.tomorrow().ok()?)?
            } else {
                at
            }
        }
    };
    Some(Timestamp(SystemTime::from(at)))
}

/// The month a (lowercase) word names by its first three letters.
fn month(word: &str) -> Option<i8> {
    const MONTHS: [&str; 12] = [
        "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
    ];
    let prefix = word.get(..3)?;
    (word.chars().all(|c| c.is_ascii_alphabetic()))
        .then(|| MONTHS.iter().position(|month| *month == prefix))
        .flatten()
        .map(|index| index as i8 + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> jiff::Timestamp {
        text.parse().unwrap()
    }

    fn reset(text: &str, now: &str, local: &TimeZone) -> Option<String> {
        let limit = read_limit(text, at(now), local)?;
        limit
            .resets_at
            .map(|at| jiff::Timestamp::try_from(at.0).unwrap().to_string())
    }

    #[test]
    fn clock_times_are_the_next_such_time_in_their_zone() {
        let plus_two = TimeZone::fixed(jiff::tz::offset(2));
        // Codex, the same day: this machine's zone.
        assert_eq!(
            reset(
                "You've hit your usage limit. Upgrade to Pro, or try again at 8:40 PM.",
                "2026-12-02T10:00:00Z",
                &plus_two
            )
            .as_deref(),
            Some("2026-12-02T18:41:00Z")
        );
        // A time already past today is tomorrow's.
        assert_eq!(
            reset(
                "You've hit your usage limit. Try again at 8:40 AM.",
                "2026-12-02T10:00:00Z",
                &plus_two
            )
            .as_deref(),
            Some("2026-12-03T06:41:00Z")
        );
        // Codex, another day.
        assert_eq!(
            reset(
                "You've hit your usage limit. Try again at Dec 3rd, 2026 8:40 PM.",
                "2026-12-02T10:00:00Z",
                &plus_two
            )
            .as_deref(),
            Some("2026-12-03T18:41:00Z")
        );
        // Claude Code, a named zone (UTC needs no database).
        assert_eq!(
            reset(
                "You've hit your limit · resets 2am (UTC)",
                "2026-12-02T10:00:00Z",
                &plus_two
            )
            .as_deref(),
            Some("2026-12-03T02:01:00Z")
        );
        assert_eq!(
            reset(
                "You've hit your limit · resets 2:30pm (utc)",
                "2026-12-02T10:00:00Z",
                &plus_two
            )
            .as_deref(),
            Some("2026-12-02T14:31:00Z")
        );
        // A zone of the database, where this machine has one (lowered words, any case).
        if TimeZone::get("Europe/Berlin").is_ok() {
            assert_eq!(
                reset(
                    "You've hit your limit · resets 2am (Europe/Berlin)",
                    "2026-12-02T10:00:00Z",
                    &plus_two
                )
                .as_deref(),
                Some("2026-12-03T01:01:00Z")
            );
        }
        // Within the minute it names: that minute's end, today.
        assert_eq!(
            reset(
                "You've hit your usage limit. Try again at 10:54 PM.",
                "2026-12-02T20:54:10Z",
                &plus_two
            )
            .as_deref(),
            Some("2026-12-02T20:55:00Z")
        );
        // Words that name no time, or a zone no one knows, give no reset; the limit stays.
        for text in [
            "You've hit your usage limit. Try again later.",
            "exceeded retry limit, last status: 429 Too Many Requests",
            "You've hit your limit · resets soon",
            "You've hit your limit · resets 2am (Nowhere/Atlantis)",
            "You've hit your limit · resets 13pm",
        ] {
            let limit = read_limit(text, at("2026-12-02T10:00:00Z"), &plus_two).unwrap();
            assert_eq!(limit.resets_at, None, "{text}");
        }
    }

    #[test]
    fn spelled_waits_and_epochs_are_read() {
        let utc = TimeZone::UTC;
        assert_eq!(
            reset(
                "You've hit your usage limit. Try again in 2 hours 5 minutes.",
                "2026-12-02T10:00:00Z",
                &utc
            )
            .as_deref(),
            Some("2026-12-02T12:05:00Z")
        );
        assert_eq!(
            reset(
                "Claude AI usage limit reached|1762952400",
                "2026-12-02T10:00:00Z",
                &utc
            )
            .as_deref(),
            Some("2025-11-12T13:00:00Z")
        );
        assert_eq!(
            read_limit("stream error", at("2026-12-02T10:00:00Z"), &utc),
            None
        );
    }

    #[test]
    fn the_backoff_doubles_from_a_minute_to_an_hour() {
        let waits: Vec<u64> = (0..9).map(|tries| retry_backoff(tries).as_secs()).collect();
        assert_eq!(waits, [60, 120, 240, 480, 960, 1920, 3600, 3600, 3600]);
    }
}
