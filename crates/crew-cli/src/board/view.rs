//! Drawing the board: a header with the waiting count, one line per agent, the pane of the
//! selected agent, and a line for prompts, results and key hints.
//!
//! Every piece of text from an agent reaches the screen through [`crate::ui::sanitize`] (done
//! when the board takes it in): an escape sequence is drawn as `�`, never written to the
//! terminal. Symbols tell states apart without colour, and have ASCII forms for terminals
//! without Unicode.

use std::time::SystemTime;

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Paragraph, Wrap};

use super::{Board, Pane, Row, RowState};
use crate::ui::{sanitize, truncate};

/// How the board draws: with colour or without, Unicode symbols or ASCII.
#[derive(Debug, Clone, Copy)]
pub struct Looks {
    pub color: bool,
    pub unicode: bool,
}

impl Looks {
    fn symbol(self, state: RowState) -> &'static str {
        let (unicode, ascii) = match state {
            RowState::Waiting => ("?", "?"),
            RowState::FailedUnread | RowState::Failed => ("✗", "X"),
            RowState::DoneUnread => ("★", "*"),
            RowState::CheckFailedUnread | RowState::CheckFailed => ("✘", "x"),
            RowState::Checking => ("◆", "c"),
            RowState::Done => ("✓", "v"),
            RowState::Working => ("▶", ">"),
            RowState::Idle => ("…", "~"),
            RowState::Paused => ("⏸", "="),
            RowState::AtCap => ("$", "$"),
            RowState::Queued => ("·", "."),
            RowState::Stopped => ("■", "#"),
            RowState::Skipped => ("-", "-"),
        };
        if self.unicode { unicode } else { ascii }
    }

    fn state_style(self, state: RowState) -> Style {
        if !self.color {
            return match state {
                RowState::Waiting
                | RowState::AtCap
                | RowState::FailedUnread
                | RowState::CheckFailedUnread
                | RowState::DoneUnread => Style::new().add_modifier(Modifier::BOLD),
                _ => Style::new(),
            };
        }
        match state {
            RowState::Waiting | RowState::AtCap => {
                Style::new().fg(Color::Yellow).add_modifier(Modifier::BOLD)
            }
            RowState::FailedUnread => Style::new().fg(Color::Red).add_modifier(Modifier::BOLD),
            RowState::Failed => Style::new().fg(Color::Red),
            RowState::CheckFailedUnread => {
                Style::new().fg(Color::Magenta).add_modifier(Modifier::BOLD)
            }
            RowState::CheckFailed => Style::new().fg(Color::Magenta),
            RowState::DoneUnread => Style::new().fg(Color::Green).add_modifier(Modifier::BOLD),
            RowState::Done => Style::new().fg(Color::Green),
            RowState::Working | RowState::Idle | RowState::Checking => Style::new().fg(Color::Cyan),
            RowState::Paused => Style::new().fg(Color::Yellow),
            RowState::Queued | RowState::Stopped | RowState::Skipped => {
                Style::new().add_modifier(Modifier::DIM)
            }
        }
    }

    fn rule(self) -> &'static str {
        if self.unicode { "─" } else { "-" }
    }

    fn pointer(self) -> &'static str {
        if self.unicode { "›" } else { ">" }
    }

    fn nested(self) -> &'static str {
        if self.unicode { "└ " } else { "` " }
    }
}

/// The keys, as `?` shows them.
pub const HELP: &[(&str, &str)] = &[
    ("j / k", "move down / up"),
    ("n", "jump to the next agent that needs you"),
    ("enter", "its output (following)"),
    ("d", "its work against its base (space / u scroll)"),
    ("a", "answer its question"),
    ("i", "steer it (a message now)"),
    ("f", "follow up (a message at the end of its turn)"),
    ("s", "stop it (asks first)"),
    ("r", "resume it"),
    ("/", "filter by id, agent, branch or state"),
    ("esc", "close the pane or prompt (never touches an agent)"),
    ("q", "quit (every agent keeps running)"),
];

/// Draws the whole board.
pub fn draw(frame: &mut Frame<'_>, board: &Board, title: &str, looks: Looks) {
    let area = frame.area();
    let rows = board.rows();
    let selected = board.selected(&rows);
    let pane_open = board.pane != Pane::None;
    let table_height = if pane_open {
        let wanted = u16::try_from(rows.len() + 1).unwrap_or(u16::MAX);
        wanted.clamp(3, (area.height.saturating_sub(2)) * 2 / 5)
    } else {
        area.height.saturating_sub(2)
    };
    let [header, table, pane, footer] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(table_height),
        Constraint::Fill(1),
        Constraint::Length(1),
    ])
    .areas(area);

    // The header counts every agent: a `/` filter narrows the table, not what needs the user.
    let all = board.all_rows();
    let count = |state: RowState| all.iter().filter(|row| row.state == state).count();
    let waiting = count(RowState::Waiting);
    // The waiting count first: it stays in view however narrow the terminal.
    let mut head = vec![
        Span::styled(
            format!("waiting: {waiting}"),
            if waiting > 0 {
                looks.state_style(RowState::Waiting)
            } else {
                Style::new().add_modifier(Modifier::BOLD)
            },
        ),
        Span::raw(format!(
            "  working: {}  agents: {}  ",
            count(RowState::Working) + count(RowState::Idle),
            all.len(),
        )),
        Span::styled("crew watch", Style::new().add_modifier(Modifier::BOLD)),
        Span::raw(format!(" {title}")),
    ];
    // Tasks at a spend cap ask whether to go on.
    let at_cap = count(RowState::AtCap);
    if at_cap > 0 {
        head.push(Span::styled(
            format!("  at a spend cap: {at_cap} (r goes on, s ends it)"),
            looks.state_style(RowState::AtCap),
        ));
    }
    // A provider's limit holds its tasks back: said, with when it goes on.
    for (provider, at) in board.limits() {
        let until = match at {
            Some(at) => format!("until {} UTC", &at.to_string()[11..16]),
            None => "until resumed".to_owned(),
        };
        head.push(Span::styled(
            format!("  paused: limit of {} {until}", sanitize(&provider)),
            looks.state_style(RowState::Waiting),
        ));
    }
    if !board.filter.is_empty() {
        head.push(Span::raw(format!("  filter: {}", board.filter)));
    }
    if board.missed > 0 {
        head.push(Span::raw(format!("  ({} lines skipped)", board.missed)));
    }
    frame.render_widget(Paragraph::new(Line::from(head)), header);

    draw_table(frame, table, &rows, selected.as_ref(), looks);
    if pane_open {
        draw_pane(frame, pane, board, selected.as_ref(), looks);
    }
    draw_footer(frame, footer, board);
}

/// Which columns fit: the narrowest terminal keeps the symbol, the id and the state.
struct Columns {
    id: usize,
    agent: Option<usize>,
    branch: Option<usize>,
    lines: bool,
    age: bool,
    /// Shown when a row holds ports, and there is room.
    ports: Option<usize>,
    /// MEM and CPU, shown when a row's agent is capped (measured), and there is room.
    metered: bool,
}

/// MEM and CPU together: `1234M 567.8s `.
const METER_WIDTH: usize = 14;

/// The widest state label (`checking`, `chk-fail`).
const STATE_WIDTH: usize = 8;

impl Columns {
    fn fitting(width: usize, rows: &[Row]) -> Self {
        let id = rows
            .iter()
            .map(|row| row.agent_id.to_string().chars().count() + 2 * row.depth)
            .max()
            .unwrap_or(2)
            .clamp(2, 40);
        let agent = rows
            .iter()
            .map(|row| row.agent.chars().count())
            .max()
            .unwrap_or(5)
            .clamp(5, 12);
        let branch = rows
            .iter()
            .filter_map(|row| row.branch.as_ref().map(|branch| branch.chars().count()))
            .max()
            .unwrap_or(6)
            .clamp(6, 30);
        let ports = rows
            .iter()
            .filter_map(|row| row.ports.as_ref().map(|ports| ports.chars().count()))
            .max()
            .map(|widest| widest.max(5));
        // Symbol, pointer, id, state: the least a row says.
        let base = 4 + id + 1 + STATE_WIDTH + 1;
        let with_branch = base + agent + 1 + 12 + 5 + branch + 1 + 20;
        Columns {
            id,
            agent: (width >= base + agent + 1 + 20).then_some(agent),
            lines: width >= base + agent + 1 + 12 + 20,
            age: width >= base + agent + 1 + 12 + 5 + 20,
            branch: (width >= with_branch).then_some(branch),
            ports: ports.filter(|ports| width > with_branch + ports),
            metered: rows.iter().any(|row| row.using.is_some())
                && width >= base + agent + 1 + 12 + 5 + METER_WIDTH + 20,
        }
    }
}

fn draw_table(
    frame: &mut Frame<'_>,
    area: Rect,
    rows: &[Row],
    selected: Option<&crew_core::AgentId>,
    looks: Looks,
) {
    let width = usize::from(area.width);
    let columns = Columns::fitting(width, rows);
    let mut lines = Vec::new();
    let mut heading = format!("    {:<id$} ", "AGENT", id = columns.id);
    if let Some(agent) = columns.agent {
        heading.push_str(&format!("{:<agent$} ", "DEF"));
    }
    heading.push_str(&format!("{:<STATE_WIDTH$} ", "STATE"));
    if let Some(branch) = columns.branch {
        heading.push_str(&format!("{:<branch$} ", "BRANCH"));
    }
    if columns.lines {
        heading.push_str(&format!("{:<12}", "+/-"));
    }
    if columns.age {
        heading.push_str(&format!("{:<5}", "AGE"));
    }
    if columns.metered {
        heading.push_str(&format!("{:<6}{:<8}", "MEM", "CPU"));
    }
    if let Some(ports) = columns.ports {
        heading.push_str(&format!("{:<ports$} ", "PORTS"));
    }
    heading.push_str("LAST OUTPUT");
    lines.push(Line::styled(
        heading,
        Style::new().add_modifier(Modifier::DIM),
    ));
    if rows.is_empty() {
        lines.push(Line::raw(
            "    no runs yet: start one with `crew run` (they show here as they start)",
        ));
    }
    // The selected row stays in view.
    let visible = usize::from(area.height).saturating_sub(1).max(1);
    let at = selected
        .and_then(|selected| rows.iter().position(|row| &row.agent_id == selected))
        .unwrap_or(0);
    let skip = (at + 1).saturating_sub(visible);
    let now = SystemTime::now();
    for row in rows.iter().skip(skip).take(visible) {
        let is_selected = selected == Some(&row.agent_id);
        let style = looks.state_style(row.state);
        let pointer = if is_selected { looks.pointer() } else { " " };
        let id = match row.depth {
            0 => row.agent_id.to_string(),
            depth => format!(
                "{}{}{}",
                "  ".repeat(depth - 1),
                looks.nested(),
                row.agent_id
            ),
        };
        let mut spans = vec![
            Span::raw(format!("{pointer} ")),
            Span::styled(format!("{} ", looks.symbol(row.state)), style),
            Span::raw(format!(
                "{:<width$} ",
                truncate(&id, columns.id),
                width = columns.id
            )),
        ];
        if let Some(agent) = columns.agent {
            spans.push(Span::raw(format!(
                "{:<agent$} ",
                truncate(&row.agent, agent)
            )));
        }
        spans.push(Span::styled(
            format!("{:<STATE_WIDTH$}", row.state.label()),
            style,
        ));
        spans.push(Span::raw(" "));
        if let Some(branch) = columns.branch {
            let name = row.branch.as_deref().unwrap_or("");
            spans.push(Span::raw(format!("{:<branch$} ", truncate(name, branch))));
        }
        if columns.lines {
            let lines = row
                .lines
                .map(|(added, removed)| format!("+{added} -{removed}"))
                .unwrap_or_default();
            spans.push(Span::raw(format!("{lines:<12}")));
        }
        if columns.age {
            let age = row
                .started_at
                .and_then(|started| now.duration_since(started).ok())
                .map(short_age)
                .unwrap_or_default();
            spans.push(Span::raw(format!("{age:<5}")));
        }
        if columns.metered {
            let (memory, cpu) = row.using.map_or_else(
                || (String::new(), String::new()),
                |using| {
                    (
                        format!("{}M", using.memory >> 20),
                        format!("{:.1}s", using.cpu_ms as f64 / 1000.0),
                    )
                },
            );
            spans.push(Span::raw(format!("{memory:<6}{cpu:<8}")));
        }
        if let Some(ports) = columns.ports {
            let held = row.ports.as_deref().unwrap_or("");
            spans.push(Span::raw(format!("{held:<ports$} ")));
        }
        let used: usize = spans.iter().map(|span| span.content.chars().count()).sum();
        spans.push(Span::styled(
            truncate(&row.last_line, width.saturating_sub(used).max(1)),
            Style::new().add_modifier(Modifier::DIM),
        ));
        let mut line = Line::from(spans);
        if is_selected {
            line = line.style(Style::new().add_modifier(Modifier::REVERSED));
        }
        lines.push(line);
    }
    frame.render_widget(Paragraph::new(lines), area);
}

fn draw_pane(
    frame: &mut Frame<'_>,
    area: Rect,
    board: &Board,
    selected: Option<&crew_core::AgentId>,
    looks: Looks,
) {
    let [title_area, body] =
        Layout::vertical([Constraint::Length(1), Constraint::Fill(1)]).areas(area);
    let height = usize::from(body.height);
    let width = usize::from(body.width);
    let (title, lines): (String, Vec<Line<'_>>) = match (&board.pane, selected) {
        (Pane::Help, _) => (
            "keys".to_owned(),
            HELP.iter()
                .map(|(key, what)| Line::raw(format!("  {key:<7} {what}")))
                .collect(),
        ),
        (Pane::Output, Some(agent_id)) => {
            let tail = board.tail(agent_id);
            let lines = tail
                .map(|tail| {
                    let skip = tail.len().saturating_sub(height);
                    tail.iter()
                        .skip(skip)
                        .map(|line| Line::raw(truncate(line, width)))
                        .collect()
                })
                .unwrap_or_default();
            (format!("output of {agent_id} (following)"), lines)
        }
        (Pane::Question, Some(agent_id)) => {
            let lines = match board.question(agent_id) {
                Some(question) => {
                    let mut lines: Vec<Line<'_>> = question
                        .lines()
                        .map(|line| Line::raw(crate::ui::sanitize(line)))
                        .collect();
                    lines.push(Line::raw(""));
                    let keys = match board.at_cap(agent_id) {
                        Some(_) => "r: go on (another cap's worth)   s: end it   esc: close",
                        None => "a: answer   esc: close",
                    };
                    lines.push(Line::styled(keys, Style::new().add_modifier(Modifier::DIM)));
                    lines
                }
                None => vec![Line::raw("no question: it is not waiting for you")],
            };
            (format!("{agent_id} asks"), lines)
        }
        (
            Pane::Diff {
                agent_id,
                text,
                scroll,
            },
            _,
        ) => {
            let lines = match text {
                None => vec![Line::raw("computing…")],
                Some(text) if text.is_empty() => vec![Line::raw("no changes")],
                Some(text) => text
                    .iter()
                    .skip(*scroll)
                    .take(height)
                    .map(|line| diff_line(line, width, looks))
                    .collect(),
            };
            (format!("work of {agent_id} against its base"), lines)
        }
        (_, None) => (String::new(), Vec::new()),
        (Pane::None, _) => return,
    };
    let rule = looks.rule();
    let title = format!("{rule}{rule} {title} ");
    let fill = width.saturating_sub(title.chars().count());
    frame.render_widget(
        Paragraph::new(Line::styled(
            format!("{title}{}", rule.repeat(fill)),
            Style::new().add_modifier(Modifier::DIM),
        )),
        title_area,
    );
    let paragraph = Paragraph::new(lines);
    let paragraph = if matches!(board.pane, Pane::Question) {
        paragraph.wrap(Wrap { trim: false })
    } else {
        paragraph
    };
    frame.render_widget(paragraph, body);
}

fn diff_line(line: &str, width: usize, looks: Looks) -> Line<'static> {
    let text = truncate(line, width);
    if !looks.color {
        return Line::raw(text);
    }
    let style = if line.starts_with('+') && !line.starts_with("+++") {
        Style::new().fg(Color::Green)
    } else if line.starts_with('-') && !line.starts_with("---") {
        Style::new().fg(Color::Red)
    } else if line.starts_with("@@") {
        Style::new().fg(Color::Cyan)
    } else {
        Style::new()
    };
    Line::styled(text, style)
}

fn draw_footer(frame: &mut Frame<'_>, area: Rect, board: &Board) {
    let line = if let Some(prompt) = &board.prompt {
        let label = prompt.label();
        let shown = format!("{label}{}", board.input);
        // The cursor sits after what was typed.
        let column = u16::try_from(shown.chars().count()).unwrap_or(u16::MAX);
        frame.set_cursor_position((area.x.saturating_add(column), area.y));
        Line::raw(shown)
    } else if let Some(status) = &board.status {
        Line::raw(status.clone())
    } else {
        let hint = if area.width >= 72 {
            "?: keys  n: next needing you  enter: output  d: diff  a: answer  q: quit"
        } else {
            "?: keys  n: next  q: quit"
        };
        Line::styled(hint, Style::new().add_modifier(Modifier::DIM))
    };
    frame.render_widget(Paragraph::new(line), area);
}

/// `12s`, `4m`, `3h`, `2d`.
fn short_age(age: std::time::Duration) -> String {
    let seconds = age.as_secs();
    match seconds {
        0..60 => format!("{seconds}s"),
        60..3600 => format!("{}m", seconds / 60),
        3600..86400 => format!("{}h", seconds / 3600),
        _ => format!("{}d", seconds / 86400),
    }
}
