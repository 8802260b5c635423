//! Agent command templates: `{placeholder}`s checked when a file is read and filled per
//! argument when an agent starts (never through a shell).

/// Placeholders an agent's `command` template may use.
pub const COMMAND_PLACEHOLDERS: &[&str] = &["prompt", "workspace", "run_id", "task_id"];
/// Placeholders an agent's `resume` template may use.
pub const RESUME_PLACEHOLDERS: &[&str] = &[
    "prompt",
    "workspace",
    "run_id",
    "task_id",
    "message",
    "session_id",
];

/// Checks an argv template: a program, and only known `{placeholders}`.
pub(super) fn check_template(argv: &[String], allowed: &[&str]) -> Result<(), String> {
    if argv.first().is_none_or(|program| program.is_empty()) {
        return Err(
            "needs a program as its first element, e.g. [\"claude\", \"-p\", \"{prompt}\"]"
                .to_owned(),
        );
    }
    for arg in argv {
        if arg.contains('\0') {
            return Err(format!(
                "argument {arg:?} holds a NUL byte, which no program argument can carry"
            ));
        }
        if let Some(open) = unclosed_placeholder(arg, allowed) {
            return Err(format!(
                "argument {arg:?} opens the placeholder `{{{open}` and never closes it: write `{{{open}}}`"
            ));
        }
        for placeholder in placeholders(arg) {
            if !allowed.contains(&placeholder) {
                return Err(format!(
                    "unknown placeholder `{{{placeholder}}}`; available: {}",
                    allowed
                        .iter()
                        .map(|name| format!("{{{name}}}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
        }
    }
    Ok(())
}

/// A known placeholder's name opened by `{` in `arg` and not closed by `}` right after it
/// (`--task={task_id`): it would pass through as it is written. Braces around anything else
/// (`{"a": 1}`) are the argument's own.
fn unclosed_placeholder<'a>(arg: &str, allowed: &[&'a str]) -> Option<&'a str> {
    arg.split('{').skip(1).find_map(|rest| {
        let name_end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        let closed = rest[name_end..].starts_with('}');
        let known = allowed.iter().find(|known| **known == &rest[..name_end])?;
        (!closed).then_some(*known)
    })
}

/// The `{name}` placeholders in a template argument.
pub fn placeholders(arg: &str) -> impl Iterator<Item = &str> {
    arg.split('{').skip(1).filter_map(|rest| {
        let (name, _) = rest.split_once('}')?;
        let is_name =
            !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        is_name.then_some(name)
    })
}

/// Fills `{name}` placeholders of one template argument. Each argument stays one argument: a
/// prompt with spaces or quotes is never split or interpreted.
pub fn fill_template(arg: &str, values: &[(&str, &str)]) -> String {
    let mut out = String::with_capacity(arg.len());
    let mut rest = arg;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let replaced = after.split_once('}').and_then(|(name, tail)| {
            values
                .iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| (*value, tail))
        });
        match replaced {
            Some((value, tail)) => {
                out.push_str(value);
                rest = tail;
            }
            None => {
                out.push('{');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_fill_each_argument_separately() {
        let values = [("prompt", "say \"hi\"; rm -rf /"), ("task_id", "api")];
        assert_eq!(fill_template("{prompt}", &values), "say \"hi\"; rm -rf /");
        assert_eq!(fill_template("--task={task_id}", &values), "--task=api");
        assert_eq!(fill_template("{unknown} {", &values), "{unknown} {");
        assert_eq!(placeholders("a{b}c{d}").collect::<Vec<_>>(), ["b", "d"]);
    }

    #[test]
    fn an_unclosed_placeholder_is_refused_and_other_braces_are_not() {
        let argv = |arg: &str| vec!["agent".to_owned(), arg.to_owned()];
        let refused = check_template(&argv("--task={task_id"), COMMAND_PLACEHOLDERS);
        assert!(
            refused
                .as_ref()
                .is_err_and(|error| error.contains("`{task_id`") && error.contains("`{task_id}`")),
            "{refused:?}"
        );
        assert!(check_template(&argv("{prompt"), COMMAND_PLACEHOLDERS).is_err());
        for fine in [r#"{"a": 1}"#, "{", "x{y", "{prompt}", "{{prompt}}"] {
            assert_eq!(
                check_template(&argv(fine), COMMAND_PLACEHOLDERS),
                Ok(()),
                "{fine}"
            );
        }
    }
}
