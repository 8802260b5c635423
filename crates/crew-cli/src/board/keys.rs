//! What a key does to the board: moves the selection, opens a pane, starts a prompt (answer,
//! follow-up, steer) or asks before a stop, and the action it hands the command to carry out.

use crew_core::AgentId;

use super::{Action, Board, Glance, Key, Pane, Prompt, Row, RowState};

impl Board {
    pub(super) fn move_selection(&mut self, rows: &[Row], by: isize) {
        let Some(current) = self.selected(rows) else {
            return;
        };
        let at = rows
            .iter()
            .position(|row| row.agent_id == current)
            .unwrap_or(0);
        let next = at
            .saturating_add_signed(by)
            .min(rows.len().saturating_sub(1));
        self.selected = Some(rows[next].agent_id.clone());
    }

    /// Opens the pane of the selected agent that shows `pane`, marking its work as seen.
    pub(super) fn open(&mut self, agent_id: &AgentId, pane: Pane) -> Option<Action> {
        let was_unread = self.unread.remove(agent_id);
        if self.seen.insert(agent_id.clone()) || was_unread {
            self.newly_seen.push(agent_id.clone());
        }
        // Selected by its id, so that it stays selected as it leaves the "needs you" group.
        self.selected = Some(agent_id.clone());
        match pane {
            Pane::Output => {
                self.pane = Pane::Output;
                self.logs_read
                    .insert(agent_id.clone())
                    .then(|| Action::ReadTail(agent_id.clone(), Glance::Pane))
            }
            Pane::Diff { .. } => {
                let task = self.task(agent_id)?.clone();
                self.pane = Pane::Diff {
                    agent_id: agent_id.clone(),
                    text: None,
                    scroll: 0,
                };
                Some(Action::Diff(agent_id.clone(), Box::new(task)))
            }
            other => {
                self.pane = other;
                None
            }
        }
    }

    /// What `key` does. Esc only ever closes a prompt or a pane; no key but a confirmed `s`
    /// stops an agent, and quitting leaves every agent running.
    pub fn key(&mut self, key: Key) -> Option<Action> {
        if let Some(prompt) = self.prompt.clone() {
            return self.prompt_key(prompt, key);
        }
        let rows = self.rows();
        let selected = self.selected(&rows);
        match key {
            Key::Esc => {
                self.pane = Pane::None;
                None
            }
            Key::Char('q') | Key::Interrupt => Some(Action::Quit),
            Key::Char('j') | Key::Down => {
                self.move_selection(&rows, 1);
                self.follow_selection()
            }
            Key::Char('k') | Key::Up => {
                self.move_selection(&rows, -1);
                self.follow_selection()
            }
            Key::PageDown | Key::Char(' ') => {
                self.scroll(20);
                None
            }
            Key::PageUp | Key::Char('u') => {
                self.scroll(-20);
                None
            }
            Key::Char('n') => {
                let needing: Vec<&Row> = rows.iter().filter(|row| row.state.needs_you()).collect();
                // Until the user moves, the first row is selected without being chosen: the
                // first agent that needs them comes first.
                let at = self
                    .selected
                    .as_ref()
                    .and_then(|selected| needing.iter().position(|row| &row.agent_id == selected));
                let next = match at {
                    Some(at) => needing.get((at + 1) % needing.len()),
                    None => needing.first(),
                };
                match next {
                    Some(row) => {
                        let agent_id = row.agent_id.clone();
                        let pane = if row.state == RowState::Waiting {
                            Pane::Question
                        } else {
                            Pane::Output
                        };
                        self.open(&agent_id, pane)
                    }
                    None => {
                        self.status = Some("no agent needs you".to_owned());
                        None
                    }
                }
            }
            Key::Char('?') => {
                self.pane = if self.pane == Pane::Help {
                    Pane::None
                } else {
                    Pane::Help
                };
                None
            }
            Key::Char('/') => {
                self.input = self.filter.clone();
                self.prompt = Some(Prompt::Filter);
                None
            }
            Key::Enter => self.open(&selected?, Pane::Output),
            Key::Char('d') => {
                let agent_id = selected?;
                let pane = Pane::Diff {
                    agent_id: agent_id.clone(),
                    text: None,
                    scroll: 0,
                };
                self.open(&agent_id, pane)
            }
            Key::Char('a') => {
                let agent_id = selected?;
                if self.question(&agent_id).is_none() {
                    self.status = Some(format!("{agent_id} asks nothing"));
                    return None;
                }
                self.open(&agent_id, Pane::Question);
                self.start_prompt(Prompt::Answer(agent_id));
                None
            }
            Key::Char('i') => {
                self.start_prompt(Prompt::Steer(selected?));
                None
            }
            Key::Char('f') => {
                self.start_prompt(Prompt::FollowUp(selected?));
                None
            }
            Key::Char('s') => {
                self.start_prompt(Prompt::ConfirmStop(selected?));
                None
            }
            Key::Char('r') => Some(Action::Resume(selected?)),
            _ => None,
        }
    }

    pub(super) fn start_prompt(&mut self, prompt: Prompt) {
        self.input.clear();
        self.prompt = Some(prompt);
    }

    pub(super) fn prompt_key(&mut self, prompt: Prompt, key: Key) -> Option<Action> {
        if let Prompt::ConfirmStop(agent_id) = prompt {
            self.prompt = None;
            return match key {
                Key::Char('y' | 'Y') => Some(Action::Stop(agent_id)),
                _ => {
                    self.status = Some(format!("{agent_id} not stopped"));
                    None
                }
            };
        }
        match key {
            Key::Esc | Key::Interrupt => {
                self.prompt = None;
                self.input.clear();
                None
            }
            Key::Backspace => {
                self.input.pop();
                None
            }
            Key::Char(c) => {
                self.input.push(c);
                None
            }
            Key::Enter => {
                self.prompt = None;
                let text = std::mem::take(&mut self.input);
                match prompt {
                    Prompt::Filter => {
                        self.filter = text;
                        None
                    }
                    _ if text.trim().is_empty() => {
                        self.status = Some("nothing sent: the message was empty".to_owned());
                        None
                    }
                    Prompt::Answer(agent_id) => {
                        // Answered: its question is gone, and what it does next is its output.
                        if self.pane == Pane::Question {
                            self.pane = Pane::Output;
                        }
                        Some(Action::Answer(agent_id, text))
                    }
                    Prompt::Steer(agent_id) => Some(Action::Steer(agent_id, text)),
                    Prompt::FollowUp(agent_id) => Some(Action::FollowUp(agent_id, text)),
                    Prompt::ConfirmStop(_) => None,
                }
            }
            _ => None,
        }
    }

    pub(super) fn scroll(&mut self, by: isize) {
        if let Pane::Diff { scroll, .. } = &mut self.pane {
            *scroll = scroll.saturating_add_signed(by);
        }
    }

    /// A pane about one agent follows the selection.
    pub(super) fn follow_selection(&mut self) -> Option<Action> {
        let rows = self.rows();
        let selected = self.selected(&rows)?;
        match &self.pane {
            Pane::Output => self.open(&selected, Pane::Output),
            Pane::Diff { .. } => self.open(
                &selected,
                Pane::Diff {
                    agent_id: selected.clone(),
                    text: None,
                    scroll: 0,
                },
            ),
            _ => None,
        }
    }
}
