//! Where in a TOML file a problem is: parsing that reports every bad key at once, each with
//! its line, column and dotted key.

use std::collections::HashMap;
use std::ops::Range;

use camino::Utf8Path;

use super::load::LoadConfigError;

/// Reads a TOML file into `T`. When it does not fit, every key that fails on its own is
/// named, not only the first.
pub(super) fn parse_toml<T: serde::de::DeserializeOwned>(
    path: &Utf8Path,
    source: &str,
) -> Result<T, LoadConfigError> {
    parse_toml_checked(path, source, |_, _, _| Vec::new())
}

/// Reads a TOML file into `T` and runs `check` (whose problems are placed by key in the
/// source) on it. When some keys do not fit, `check` still runs on the rest of the file, so
/// that every problem is named at once.
pub(super) fn parse_toml_checked<T: serde::de::DeserializeOwned>(
    path: &Utf8Path,
    source: &str,
    check: impl Fn(&Utf8Path, &str, &T) -> Vec<LoadConfigError>,
) -> Result<T, LoadConfigError> {
    let error = match toml::from_str(source) {
        Ok(value) => {
            let problems = check(path, source, &value);
            return if problems.is_empty() {
                Ok(value)
            } else {
                Err(several(problems))
            };
        }
        Err(error) => error,
    };
    let span = error.span().unwrap_or(0..0);
    let key = key_at(source, span.start);
    let first = invalid_at(
        path,
        source,
        span,
        key.clone(),
        error.message().trim_end().to_owned(),
    );
    let mut problems = problems_by_key::<T>(path, source);
    if let Some(rest) = without_keys::<T>(source, &problems) {
        problems.extend(check(path, source, &rest));
    }
    if problems.len() <= 1 {
        return Err(first);
    }
    // The first problem as the parser saw it, with its exact place.
    problems.retain(
        |problem| !matches!(problem, LoadConfigError::Invalid { key: other, .. } if *other == key),
    );
    problems.push(first);
    Err(several(problems))
}

/// Each key of `source` (each key of a table, one level down) read into `T` on its own: the
/// problems of those that do not fit, placed at their key. Arrays of tables are read whole by
/// the caller's first pass only; a file that is not TOML at all has no keys to try.
pub(super) fn problems_by_key<T: serde::de::DeserializeOwned>(
    path: &Utf8Path,
    source: &str,
) -> Vec<LoadConfigError> {
    let Ok(table) = source.parse::<toml::Table>() else {
        return Vec::new();
    };
    let alone = |key: &str, value: toml::Value| toml::Table::from_iter([(key.to_owned(), value)]);
    let mut entries = Vec::new();
    for (key, value) in table {
        match value {
            toml::Value::Table(inner) => {
                for (sub, value) in inner {
                    let dotted = format!("{key}.{sub}");
                    entries.push((dotted, alone(&key, toml::Value::Table(alone(&sub, value)))));
                }
            }
            toml::Value::Array(items) if items.iter().any(toml::Value::is_table) => {}
            value => entries.push((key.clone(), alone(&key, value))),
        }
    }
    let mut problems = Vec::new();
    for (dotted, entry) in entries {
        let Ok(text) = toml::to_string(&entry) else {
            continue;
        };
        let Err(error) = toml::from_str::<T>(&text) else {
            continue;
        };
        let message = error.message().trim_end();
        // Alone, a key misses the file's other required keys: not its problem.
        if message.starts_with("missing field") {
            continue;
        }
        let offset = find_key_offset(source, &dotted);
        problems.push(invalid_at(
            path,
            source,
            offset..offset,
            Some(dotted),
            message.to_owned(),
        ));
    }
    problems
}

/// `source` read into `T` without the keys `problems` name; `None` when even that fails.
pub(super) fn without_keys<T: serde::de::DeserializeOwned>(
    source: &str,
    problems: &[LoadConfigError],
) -> Option<T> {
    let mut table = source.parse::<toml::Table>().ok()?;
    for problem in problems {
        let LoadConfigError::Invalid { key: Some(key), .. } = problem else {
            continue;
        };
        match key.split_once('.') {
            Some((outer, inner)) => {
                if let Some(toml::Value::Table(outer)) = table.get_mut(outer) {
                    outer.remove(inner);
                }
            }
            None => {
                table.remove(key);
            }
        }
    }
    toml::from_str(&toml::to_string(&table).ok()?).ok()
}

/// One error for a file's problems, in the order they appear in it.
pub(super) fn several(mut problems: Vec<LoadConfigError>) -> LoadConfigError {
    problems.sort_by_key(|problem| match problem {
        LoadConfigError::Invalid { line, column, .. } => (*line, *column),
        _ => (usize::MAX, usize::MAX),
    });
    if problems.len() == 1 {
        problems.remove(0)
    } else {
        LoadConfigError::Several(problems)
    }
}

pub(super) fn invalid_at(
    path: &Utf8Path,
    source: &str,
    span: Range<usize>,
    key: Option<String>,
    message: String,
) -> LoadConfigError {
    let (line, column) = line_column(source, span.start);
    LoadConfigError::Invalid {
        path: path.to_owned(),
        line,
        column,
        key,
        message,
    }
}

/// 1-based line and column (in characters) of a byte offset.
pub(super) fn line_column(source: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(source.len());
    let before = &source[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |newline| newline + 1);
    let column = before[line_start..].chars().count() + 1;
    (line, column)
}

/// The dotted key a byte offset belongs to, from the `key = value` line it is on and the table
/// headers above it (`tasks[1].agent`). `None` when the offset is not on a key line.
pub(super) fn key_at(source: &str, offset: usize) -> Option<String> {
    let offset = offset.min(source.len());
    let mut table: Option<String> = None;
    let mut array_counts: HashMap<String, usize> = HashMap::new();
    let mut key = None;
    let mut line_start = 0;
    for line in source.split_inclusive('\n') {
        let line_end = line_start + line.len();
        let trimmed = line.trim();
        if let Some(name) = trimmed
            .strip_prefix("[[")
            .and_then(|rest| rest.split_once("]]"))
            .map(|(name, _)| name.trim().to_owned())
        {
            let count = array_counts.entry(name.clone()).or_insert(0);
            table = Some(format!("{name}[{count}]"));
            *count += 1;
        } else if let Some(name) = trimmed
            .strip_prefix('[')
            .and_then(|rest| rest.split_once(']'))
            .map(|(name, _)| name.trim().to_owned())
        {
            table = Some(name);
        }
        if offset < line_end || line_end == source.len() {
            key = trimmed
                .split_once('=')
                .map(|(name, _)| name.trim().trim_matches('"').to_owned())
                .filter(|name| {
                    !name.is_empty()
                        && name
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
                });
            break;
        }
        line_start = line_end;
    }
    match (table, key) {
        (Some(table), Some(key)) => Some(format!("{table}.{key}")),
        (None, Some(key)) => Some(key),
        (Some(table), None) => Some(table),
        (None, None) => None,
    }
}

/// The byte offset of `table.key` in a TOML source, or 0 when it cannot be found.
pub(super) fn find_key_offset(source: &str, dotted: &str) -> usize {
    let (table, key) = dotted.rsplit_once('.').unwrap_or(("", dotted));
    let mut in_table = table.is_empty();
    let mut offset = 0;
    for line in source.split_inclusive('\n') {
        let trimmed = line.trim();
        if trimmed.starts_with('[') {
            in_table = trimmed.trim_start_matches('[').trim_end_matches(']').trim() == table;
        } else if in_table
            && trimmed
                .split_once('=')
                .is_some_and(|(name, _)| name.trim().trim_matches('"') == key)
        {
            return offset + (line.len() - line.trim_start().len());
        }
        offset += line.len();
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_at_names_array_tables() {
        let source =
            "description = \"x\"\n[[tasks]]\nid = \"a\"\n[[tasks]]\nid = \"b\"\nagent = 3\n";
        let offset = source.find("agent = 3").unwrap() + 8;
        assert_eq!(key_at(source, offset).as_deref(), Some("tasks[1].agent"));
        assert_eq!(key_at(source, 3).as_deref(), Some("description"));
    }
}
