//! How crew talks to a person: colors (off when piped, with `NO_COLOR` or `--color never`),
//! tables, durations, and text from agents made harmless for a terminal.

use std::io::IsTerminal;
use std::time::Duration;

use crew_core::model::{RunStatus, TaskStatus, Timestamp};

/// When to color output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ColorChoice {
    /// Color when stdout is a terminal and `NO_COLOR` is not set.
    #[default]
    Auto,
    Always,
    Never,
}

/// Output settings of one command.
#[derive(Debug, Clone, Copy)]
pub struct Ui {
    pub color: bool,
    /// Standard output is a terminal (live progress may be richer).
    pub terminal: bool,
    pub quiet: bool,
    /// Progress may redraw in place: a terminal that is not `TERM=dumb`, and not `-q`.
    /// (`NO_COLOR` takes the colour away, nothing else.)
    pub live: bool,
}

/// A color for a piece of text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    Good,
    Bad,
    Warn,
    Dim,
    Bold,
}

impl Ui {
    pub fn new(choice: ColorChoice, quiet: bool) -> Self {
        let terminal = std::io::stdout().is_terminal();
        let no_color =
            std::env::var_os(crew_core::env_vars::NO_COLOR).is_some_and(|value| !value.is_empty());
        let color = match choice {
            ColorChoice::Always => true,
            ColorChoice::Never => false,
            ColorChoice::Auto => terminal && !no_color,
        };
        let dumb = std::env::var("TERM").is_ok_and(|term| term == "dumb");
        Ui {
            color,
            terminal,
            quiet,
            live: terminal && !dumb && !quiet,
        }
    }

    pub fn paint(&self, text: &str, style: Style) -> String {
        if !self.color {
            return text.to_owned();
        }
        let code = match style {
            Style::Good => "32",
            Style::Bad => "31",
            Style::Warn => "33",
            Style::Dim => "2",
            Style::Bold => "1",
        };
        format!("\x1b[{code}m{text}\x1b[0m")
    }

    /// Prints `warning: <message>` on stderr, unless `-q` asked for errors only.
    pub fn warn(&self, message: &str) {
        if !self.quiet {
            err!("{} {message}", self.paint("warning:", Style::Warn));
        }
    }

    pub fn task_status(&self, status: TaskStatus) -> String {
        self.paint(status.as_str(), task_style(status))
    }

    pub fn run_status(&self, status: RunStatus) -> String {
        self.paint(status.as_str(), run_style(status))
    }
}

/// Text from an agent or a file, safe to print: control characters (escape sequences
/// included) are shown as `�`, so agent output can never drive the terminal.
pub fn sanitize(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c == '\t' {
                ' '
            } else if c.is_control() {
                '\u{fffd}'
            } else {
                c
            }
        })
        .collect()
}

/// [`sanitize`] for text of several lines (a reason quoting an agent's output, a list of
/// conflicting files): each line is sanitized on its own, and the lines after the first start
/// with `continuation` instead of showing their newline as `�`.
pub fn sanitize_lines(text: &str, continuation: &str) -> String {
    text.trim_end_matches('\n')
        .split('\n')
        .map(|line| sanitize(line.trim_end_matches('\r')))
        .collect::<Vec<_>>()
        .join(&format!("\n{continuation}"))
}

/// Cuts `text` to `width` characters, marking the cut.
pub fn truncate(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        return text.to_owned();
    }
    let mut cut: String = text.chars().take(width.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

/// `1.2s`, `3m04s`, `2h05m`.
pub fn duration(duration: Duration) -> String {
    let seconds = duration.as_secs();
    if seconds < 60 {
        format!("{:.1}s", duration.as_secs_f64())
    } else if seconds < 3600 {
        format!("{}m{:02}s", seconds / 60, seconds % 60)
    } else {
        format!("{}h{:02}m", seconds / 3600, (seconds % 3600) / 60)
    }
}

/// Time between two points, when both are known.
pub fn between(start: Option<Timestamp>, end: Option<Timestamp>) -> Option<Duration> {
    let (start, end) = (start?, end.unwrap_or_else(Timestamp::now));
    end.0.duration_since(start.0).ok()
}

/// A plain-text table: a header row and rows, columns padded to their widest cell. Styles are
/// applied after padding so that escape codes never upset the alignment.
#[derive(Debug, Default)]
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<(String, Option<Style>)>>,
}

impl Table {
    pub fn new(header: &[&str]) -> Self {
        Table {
            header: header.iter().map(|cell| (*cell).to_owned()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<(String, Option<Style>)>) {
        self.rows.push(cells);
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    pub fn render(&self, ui: &Ui) -> String {
        let columns = self.header.len();
        let mut widths: Vec<usize> = self
            .header
            .iter()
            .map(|cell| cell.chars().count())
            .collect();
        for row in &self.rows {
            for (index, (cell, _)) in row.iter().enumerate().take(columns) {
                widths[index] = widths[index].max(cell.chars().count());
            }
        }
        let mut out = String::new();
        let line = |cells: Vec<(String, Option<Style>)>, out: &mut String| {
            let last = cells.len().saturating_sub(1);
            for (index, (cell, style)) in cells.into_iter().enumerate() {
                let padding = if index == last {
                    0
                } else {
                    widths[index] - cell.chars().count() + 2
                };
                let shown = match style {
                    Some(style) => ui.paint(&cell, style),
                    None => cell,
                };
                out.push_str(&shown);
                out.push_str(&" ".repeat(padding));
            }
            out.push('\n');
        };
        line(
            self.header
                .iter()
                .map(|cell| (cell.clone(), Some(Style::Bold)))
                .collect(),
            &mut out,
        );
        for row in &self.rows {
            line(row.clone(), &mut out);
        }
        out
    }
}

/// A plain cell.
pub fn cell(text: impl Into<String>) -> (String, Option<Style>) {
    (text.into(), None)
}

/// A styled cell.
pub fn styled(text: impl Into<String>, style: Style) -> (String, Option<Style>) {
    (text.into(), Some(style))
}

pub fn run_style(status: RunStatus) -> Style {
    match status {
        RunStatus::Completed => Style::Good,
        RunStatus::Failed => Style::Bad,
        RunStatus::Cancelled | RunStatus::Interrupted => Style::Warn,
        RunStatus::Running => Style::Dim,
    }
}

pub fn task_style(status: TaskStatus) -> Style {
    match status {
        TaskStatus::Succeeded => Style::Good,
        TaskStatus::Failed | TaskStatus::Stopped | TaskStatus::Interrupted => Style::Bad,
        TaskStatus::Waiting | TaskStatus::Cancelled | TaskStatus::Skipped => Style::Warn,
        _ => Style::Dim,
    }
}

/// `name` shown under its parent, `depth` levels down: `└ sub`, `  └ subsub`.
pub fn nested(name: &str, depth: usize) -> String {
    match depth {
        0 => name.to_owned(),
        depth => format!("{}└ {name}", "  ".repeat(depth - 1)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_stay_lines_and_escapes_stay_out() {
        assert_eq!(
            sanitize_lines("conflicts in:\n  a.txt\r\n  b\x1b[2J.txt\n", "    "),
            "conflicts in:\n      a.txt\n      b\u{fffd}[2J.txt"
        );
    }

    #[test]
    fn escapes_never_reach_the_terminal() {
        assert_eq!(
            sanitize("ok \x1b[2J\x07bell\ttab"),
            "ok \u{fffd}[2J\u{fffd}bell tab"
        );
    }

    #[test]
    fn tables_align_on_visible_width() {
        let ui = Ui {
            color: true,
            terminal: false,
            quiet: false,
            live: false,
        };
        let mut table = Table::new(&["A", "B"]);
        table.row(vec![styled("long cell", Style::Good), cell("x")]);
        let plain = Table::render(&table, &Ui { color: false, ..ui });
        assert_eq!(plain, "A          B\nlong cell  x\n");
    }
}
