//! Writes the sandbox refused, told from what a confined agent printed: a line that says a
//! write was not permitted (`Permission denied`, `EACCES`, `Read-only file system`, `Operation
//! not permitted`) and names an absolute path outside what the agent may write. The task's
//! reason (or a warning, when it succeeded anyway) names those paths and what to add, so a
//! toolchain that failed inside the sandbox does not fail with no hint.
//!
//! Only words are read: a program that fails silently is not told apart, and a path the
//! agent could not read for another reason may be named too — the note says "if it needs to
//! write there".

use camino::{Utf8Path, Utf8PathBuf};

/// How many refused paths a task names at most.
const MOST: usize = 5;

/// The paths a confined agent was refused, as it said them.
#[derive(Debug, Default)]
pub struct Refusals {
    /// What the agent may write: a path beneath one of these was not the sandbox's refusal.
    grants: Vec<Utf8PathBuf>,
    found: Vec<String>,
}

impl Refusals {
    /// For an agent that may write beneath `grants`.
    pub fn new(grants: Vec<Utf8PathBuf>) -> Self {
        Refusals {
            grants,
            found: Vec::new(),
        }
    }

    /// Reads one line of the agent's output (or one message of its protocol).
    pub fn scan(&mut self, line: &str) {
        if self.found.len() >= MOST {
            return;
        }
        let Some(at) = refused_at(line) else {
            return;
        };
        // The refused path follows the words (`Permission denied: '/opt/x'`), or is the last
        // one before them: a shell's error starts with its script's path (`/opt/run.sh: line
        // 3: /etc/x: Permission denied`), which is not what was refused.
        let after = absolute_paths(&line[at..]);
        let named = if after.is_empty() {
            absolute_paths(&line[..at]).pop().into_iter().collect()
        } else {
            after
        };
        for path in named {
            let outside = !self
                .grants
                .iter()
                .any(|grant| Utf8Path::new(&path).starts_with(grant));
            let device = ["/dev/", "/proc/", "/sys/"]
                .iter()
                .any(|prefix| path.starts_with(prefix));
            if outside && !device && !self.found.contains(&path) && self.found.len() < MOST {
                self.found.push(path);
            }
        }
    }

    /// The refused paths, in the order they were said.
    pub fn found(&self) -> &[String] {
        &self.found
    }
}

/// What a task says of the writes its agent `agent` was refused.
pub fn note(paths: &[String], agent: &str) -> String {
    format!(
        "the sandbox refused writing {}: outside what this agent may write; if it needs to write there, add the directory to `[sandbox] write` of agent `{agent}` (.crew/agents/{agent}.toml), then run `crew sandbox allow`",
        paths.join(", ")
    )
}

/// Where `line` first says a write (or an open) was not permitted, if it does.
fn refused_at(line: &str) -> Option<usize> {
    let lower = line.to_ascii_lowercase();
    [
        "permission denied",
        "eacces",
        "read-only file system",
        "erofs",
        "operation not permitted",
        "eperm",
    ]
    .iter()
    .filter_map(|words| lower.find(words))
    .min()
}

/// The absolute paths `line` names: words that start with `/` once quotes, brackets and JSON
/// escapes around them are taken away, without trailing punctuation.
fn absolute_paths(line: &str) -> Vec<String> {
    // GNU's tools quote with ‘ ’ (or « », “ ”) in a UTF-8 locale.
    line.split(|c: char| {
        c.is_whitespace()
            || matches!(
                c,
                '\'' | '"'
                    | '`'
                    | '('
                    | ')'
                    | '['
                    | ']'
                    | '='
                    | '\\'
                    | '‘'
                    | '’'
                    | '“'
                    | '”'
                    | '«'
                    | '»'
            )
    })
    .filter(|word| word.starts_with('/') && word.len() > 1)
    .map(|word| word.trim_end_matches([':', ',', ';', '.', '}']).to_owned())
    .filter(|word| word.len() > 1)
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scanned(lines: &[&str]) -> Vec<String> {
        let mut refusals = Refusals::new(vec!["/work/app".into(), "/tmp/crew-agent-x".into()]);
        for line in lines {
            refusals.scan(line);
        }
        refusals.found().to_vec()
    }

    #[test]
    fn refused_paths_outside_the_grants_are_named_once() {
        assert_eq!(
            scanned(&[
                "error: could not create home directory: '/root/.rustup': Permission denied (os error 13)",
                "mkdir: cannot create directory '/root/.rustup': Permission denied",
                r#"{"type":"user","message":{"content":[{"type":"tool_result","content":"EACCES: permission denied, open '/etc/hosts.new'","is_error":true}]}}"#,
                "touch: cannot touch '/usr/lib/x': Read-only file system",
                "PermissionError: [Errno 13] Permission denied: '/opt/tool/cache'",
                "mkdir: cannot create directory ‘/var/cache/gnu’: Permission denied",
                "/opt/tools/build.sh: line 3: /etc/profile.d/x.sh: Permission denied",
            ]),
            [
                "/root/.rustup",
                "/etc/hosts.new",
                "/usr/lib/x",
                "/opt/tool/cache",
                "/var/cache/gnu",
            ]
        );
        // The script's path is not the refused write; the one after it is.
        assert_eq!(
            scanned(&["/opt/tools/build.sh: line 3: /etc/profile.d/x.sh: Permission denied"]),
            ["/etc/profile.d/x.sh"]
        );
    }

    #[test]
    fn what_the_agent_may_write_and_lines_that_refuse_nothing_are_not_named() {
        assert!(
            scanned(&[
                "touch: cannot touch '/work/app/locked': Permission denied",
                "wrote /etc/motd",
                "cat: /dev/tty: Permission denied",
                "Permission denied, and no path",
                "relative/path: Permission denied",
            ])
            .is_empty()
        );
    }

    #[test]
    fn at_most_five_are_kept() {
        let lines: Vec<String> = (0..9)
            .map(|n| format!("cannot write /outside/{n}: Permission denied"))
            .collect();
        let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
        assert_eq!(scanned(&lines).len(), MOST);
    }
}
