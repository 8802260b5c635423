//! `crew watch`

use std::io::{IsTerminal as _, Read as _, Seek as _, SeekFrom, Write as _};
use std::time::Duration;

use ratatui::Terminal;
use ratatui::backend::CrosstermBackend;
use ratatui::crossterm::{cursor, event, execute, terminal};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crew_core::AgentId;
use crew_core::model::TaskRecord;
use crew_core::provider::WorkspaceKind;
use crew_live::{ControlAgentError, Project};

use crate::board::view::{self, Looks};
use crate::board::{Action, Board, Glance, Key, RECENT_RUNS};
use crate::context::Context;
use crate::ui::Ui;
use crate::{CliError, Outcome};

/// One terminal board of every agent of this project, waiting ones first.
///
/// Live and recent runs, one row per agent: state (a symbol each, not colour alone), branch,
/// lines added and removed, age and last output line, with a `waiting: N` count. Keys (`?`
/// shows them): j/k move, n next agent that needs you, enter output, d diff, a answer, i steer,
/// f follow-up, s stop (asks first), r resume, / filter, esc close, q quit. Quitting never stops
/// an agent.
#[derive(Debug, clap::Args)]
pub struct WatchArgs {
    /// No terminal bell when an agent starts waiting or fails (`[watch] bell = false` in
    /// `.crew/config.toml` for every board).
    #[arg(long)]
    pub no_bell: bool,
    /// ASCII symbols only (the default when the locale is not UTF-8).
    #[arg(long)]
    pub ascii: bool,
}

/// How often the board redraws at most while things happen.
const FRAME: Duration = Duration::from_millis(100);
/// How often ages move on when nothing happens.
const TICK: Duration = Duration::from_secs(1);
/// How often the board reads what capped agents hold (the hosts publish it about as often).
const METER: Duration = Duration::from_secs(2);
/// How much of an agent's log the output pane starts from.
const TAIL_BYTES: u64 = 256 * 1024;
/// How many heard things are taken in before the board is drawn again.
const BURST: usize = 4096;

pub async fn cmd_watch(args: WatchArgs, ui: Ui) -> Result<Outcome, CliError> {
    if !ui.terminal || !std::io::stdin().is_terminal() {
        return Err(CliError::user("crew watch draws a board on a terminal, and this is not one")
            .with_hint("`crew agents list` lists the agents; `crew events --follow --json` streams a run's events"));
    }
    let ctx = Context::discover(ui)?;
    ctx.reconcile()?;
    let project = ctx.project().clone();
    let mut watch = project
        .watch(RECENT_RUNS)
        .map_err(|error| CliError::internal(format!("cannot watch this project: {error}")))?;
    let bell = !args.no_bell && project.config().watch.bell;
    let looks = Looks {
        color: ui.color,
        unicode: !args.ascii && locale_is_utf8(),
    };
    let title = project
        .workspace()
        .id()
        .as_path()
        .file_name()
        .unwrap_or("")
        .to_owned();

    let mut screen = Screen::enter()?;
    let mut keys = read_keys();
    let (results_tx, mut results) = mpsc::channel::<Done>(64);
    let mut board = Board::default();
    let mut dirty = true;
    let mut watching = true;
    let mut last_draw = Instant::now() - FRAME;
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // What capped agents hold moves without an event: read from the hosts' listings.
    let mut metering = tokio::time::interval(METER);
    metering.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        if dirty && last_draw.elapsed() >= FRAME {
            screen.draw(&board, &title, looks)?;
            if std::mem::take(&mut board.bell) && bell {
                screen.ring();
            }
            dirty = false;
            last_draw = Instant::now();
        }
        let frame_due = last_draw + FRAME;
        tokio::select! {
            heard = watch.next(), if watching => {
                match heard {
                    Some(heard) => {
                        hear(&mut board, &project, heard);
                        for _ in 0..BURST {
                            let Some(more) = watch.try_next() else { break };
                            hear(&mut board, &project, more);
                        }
                        for glance in board.glances() {
                            tokio::spawn(perform(ctx.clone(), glance, results_tx.clone()));
                        }
                    }
                    None => {
                        // Keys still work (q quits); nothing more will be heard.
                        board.done("the watch ended: this board no longer changes".to_owned());
                        watching = false;
                    }
                }
                dirty = true;
            }
            input = keys.recv() => {
                match input {
                    Some(Input::Key(key)) => {
                        board.status = None;
                        let action = board.key(key);
                        record_seen(&project, board.newly_seen());
                        match action {
                            Some(Action::Quit) => break,
                            Some(action) => {
                                tokio::spawn(perform(ctx.clone(), action, results_tx.clone()));
                            }
                            None => {}
                        }
                    }
                    Some(Input::Resize) => screen.resized()?,
                    None => break,
                }
                dirty = true;
            }
            Some(result) = results.recv() => {
                match result {
                    Done::Status(message) => board.done(message),
                    Done::Diff(agent_id, text) => board.set_diff(&agent_id, text),
                    Done::Tail(agent_id, lines) => board.set_log_tail(&agent_id, lines),
                    Done::Using(using) => board.set_using(using),
                }
                dirty = true;
            }
            _ = metering.tick(), if board.has_running() => {
                let (ctx, results) = (ctx.clone(), results_tx.clone());
                tokio::spawn(async move {
                    let using = ctx
                        .project()
                        .published_agents()
                        .await
                        .agents
                        .into_iter()
                        .map(|(agent, _)| (agent.agent_id, agent.using))
                        .collect();
                    // The board is gone: nobody to tell.
                    let _ = results.send(Done::Using(using)).await;
                });
            }
            _ = tick.tick() => dirty = true,
            _ = tokio::time::sleep_until(frame_due), if dirty => {}
        }
    }
    drop(screen);
    Ok(Outcome::Success)
}

/// Whether the locale says the terminal takes UTF-8.
fn locale_is_utf8() -> bool {
    ["LC_ALL", "LC_CTYPE", "LANG"]
        .iter()
        .find_map(|name| std::env::var(name).ok().filter(|value| !value.is_empty()))
        .is_some_and(|locale| {
            let locale = locale.to_ascii_lowercase();
            locale.contains("utf-8") || locale.contains("utf8")
        })
}

/// The terminal in the board's mode (raw, alternate screen, no cursor) while it lives; put
/// back as it was when dropped, also on a panic.
struct Screen {
    terminal: Terminal<CrosstermBackend<std::io::Stdout>>,
}

impl Screen {
    fn enter() -> Result<Self, CliError> {
        let io_error = |error: std::io::Error| CliError::internal(format!("terminal: {error}"));
        terminal::enable_raw_mode().map_err(io_error)?;
        let mut stdout = std::io::stdout();
        if let Err(error) = execute!(stdout, terminal::EnterAlternateScreen, cursor::Hide) {
            leave();
            return Err(io_error(error));
        }
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            leave();
            previous(info);
        }));
        let terminal = Terminal::new(CrosstermBackend::new(stdout)).map_err(|error| {
            leave();
            io_error(error)
        })?;
        Ok(Screen { terminal })
    }

    fn draw(&mut self, board: &Board, title: &str, looks: Looks) -> Result<(), CliError> {
        self.terminal
            .draw(|frame| view::draw(frame, board, title, looks))
            .map_err(|error| CliError::internal(format!("terminal: {error}")))?;
        Ok(())
    }

    fn resized(&mut self) -> Result<(), CliError> {
        self.terminal
            .autoresize()
            .map_err(|error| CliError::internal(format!("terminal: {error}")))
    }

    fn ring(&mut self) {
        let out = self.terminal.backend_mut();
        // A bell that cannot be written is a bell not heard: the board goes on.
        let _unheard = out.write_all(b"\x07").and_then(|()| out.flush());
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        leave();
    }
}

/// Puts the terminal back: main screen, cursor, cooked mode.
fn leave() {
    // Each step is tried even if another failed: as much of the terminal as can be restored is.
    let _ = execute!(
        std::io::stdout(),
        terminal::LeaveAlternateScreen,
        cursor::Show
    );
    // Putting the terminal back: nothing else to do if it refuses.
    let _ = terminal::disable_raw_mode();
}

/// What the terminal sends.
enum Input {
    Key(Key),
    Resize,
}

/// Keys as they are typed, read by a thread of their own (reading blocks).
fn read_keys() -> mpsc::Receiver<Input> {
    let (sender, keys) = mpsc::channel(64);
    let spawned = std::thread::Builder::new()
        .name("crew-watch-keys".to_owned())
        .spawn(move || {
            loop {
                let input = match event::read() {
                    Ok(event::Event::Key(key)) if key.kind != event::KeyEventKind::Release => {
                        match board_key(key) {
                            Some(key) => Input::Key(key),
                            None => continue,
                        }
                    }
                    Ok(event::Event::Resize(..)) => Input::Resize,
                    Ok(_) => continue,
                    Err(_) => return,
                };
                if sender.blocking_send(input).is_err() {
                    return;
                }
            }
        });
    if spawned.is_err() {
        // No keys can be read: the receiver ends at once and the board quits.
        tracing::warn!("could not start the thread reading keys");
    }
    keys
}

fn board_key(key: event::KeyEvent) -> Option<Key> {
    use event::{KeyCode, KeyModifiers};
    if key.modifiers.contains(KeyModifiers::CONTROL) {
        return matches!(key.code, KeyCode::Char('c')).then_some(Key::Interrupt);
    }
    Some(match key.code {
        KeyCode::Char(c) => Key::Char(c),
        KeyCode::Enter => Key::Enter,
        KeyCode::Esc => Key::Esc,
        KeyCode::Backspace => Key::Backspace,
        KeyCode::Up => Key::Up,
        KeyCode::Down => Key::Down,
        KeyCode::PageUp => Key::PageUp,
        KeyCode::PageDown => Key::PageDown,
        _ => return None,
    })
}

/// What an action gave back.
enum Done {
    Status(String),
    Diff(AgentId, String),
    Tail(AgentId, Vec<String>),
    /// What the capped agents hold now, as their hosts last published it.
    Using(Vec<(AgentId, Option<crew_live::control::registry::Using>)>),
}

/// Carries out what the board asked, through the front door, and says how it went.
/// Takes in what the watch heard; a run's record comes with who looked at its tasks.
fn hear(board: &mut Board, project: &Project, heard: crew_live::Watched) {
    if let crew_live::Watched::Run(manifest) = &heard {
        // Unreadable, nobody is known to have looked: its finished work shows as news.
        let seen = project
            .store()
            .seen_tasks(&manifest.run_id)
            .unwrap_or_default();
        board.know_seen(&manifest.run_id, seen);
    }
    board.hear(heard);
}

/// Records in their runs that the user looked at these tasks here. Not recorded, the next
/// board shows them as news again: nothing worse.
fn record_seen(project: &Project, seen: Vec<crew_core::AgentId>) {
    for agent in seen {
        // A look not recorded shows the task as news again next time, nothing worse.
        let _ = project
            .store()
            .mark_seen(agent.run_id(), std::slice::from_ref(agent.task_id()));
    }
}

async fn perform(ctx: Context, action: Action, results: mpsc::Sender<Done>) {
    let project = ctx.project();
    let done = match action {
        Action::Answer(agent_id, message) => said(
            &agent_id,
            "answered",
            project.follow_up(&agent_id.to_string(), message).await,
        ),
        Action::FollowUp(agent_id, message) => said(
            &agent_id,
            "follow-up sent to",
            project.follow_up(&agent_id.to_string(), message).await,
        ),
        Action::Steer(agent_id, message) => said(
            &agent_id,
            "steered",
            project.steer(&agent_id.to_string(), message).await,
        ),
        Action::Stop(agent_id) => said(
            &agent_id,
            "stopped",
            project.stop(&agent_id.to_string()).await,
        ),
        Action::Resume(agent_id) => match project.resume(&agent_id.to_string(), None).await {
            // Its run has ended (a stopped agent was its last): a background host takes the
            // run up again for it, as `crew agents resume` does in the foreground.
            Err(ControlAgentError::NotLive { .. }) => resume_in_background(&ctx, &agent_id).await,
            resumed => said(&agent_id, "resumed", resumed),
        },
        Action::Diff(agent_id, task) => {
            let repo_root = project.workspace().repo_root().map(ToOwned::to_owned);
            let text = tokio::task::spawn_blocking(move || diff(repo_root.as_deref(), &task))
                .await
                .unwrap_or_else(|_| "the diff could not be computed".to_owned());
            Done::Diff(agent_id, text)
        }
        Action::ReadTail(agent_id, glance) => {
            let path = project
                .store()
                .output_log_path(agent_id.run_id(), agent_id.task_id());
            let lines = tokio::task::spawn_blocking(move || match glance {
                Glance::LastLine => crew_live::agent::output::last_line_of(&path)
                    .into_iter()
                    .collect(),
                Glance::Pane => read_tail(&path),
            })
            .await
            .unwrap_or_default();
            Done::Tail(agent_id, lines)
        }
        Action::Quit => return,
    };
    // The board quit meanwhile: nobody to tell.
    let _ = results.send(done).await;
}

/// Resumes `agent_id`, whose run no host holds, in a background host of its run; the
/// board's status line says how that went.
async fn resume_in_background(ctx: &Context, agent_id: &AgentId) -> Done {
    let spec = agent_id.to_string();
    let started = async {
        ctx.reconcile()?;
        let Some((manifest, task_id)) = crate::commands::agents::find_task(ctx, &spec)? else {
            return Err(crate::commands::agents::not_live(ctx, &spec));
        };
        crate::commands::agents::refuse_hosting_again(&manifest, &task_id, None)?;
        crate::foreground::host_detached(
            ctx,
            &manifest.run_id,
            crate::foreground::Detached::Run,
            Some(&task_id),
        )
        .await
    };
    Done::Status(match started.await {
        Ok(pid) => format!("resumed {agent_id}: its run is hosted in the background (pid {pid})"),
        Err(error) => format!("{agent_id}: {}", error.error),
    })
}

/// The board's status line after a verb on `agent_id`: what was done, or why not.
fn said<T>(agent_id: &AgentId, what: &str, done: Result<T, ControlAgentError>) -> Done {
    Done::Status(match done {
        Ok(_) => format!("{what} {agent_id}"),
        Err(error) => format!("{agent_id}: {error}"),
    })
}

/// A task's work against its base: its branch once torn down, its worktree while it runs.
fn diff(repo_root: Option<&camino::Utf8Path>, task: &TaskRecord) -> String {
    let patch = if let (Some(repo_root), Some((base, branch))) = (repo_root, task.work_range()) {
        crew_worktree::inspect::branch_patch(repo_root, &base, &branch)
    } else {
        match &task.workspace {
            Some(workspace)
                if workspace.kind == WorkspaceKind::Worktree
                    && task.teardown.is_none()
                    && let Some(base) = &workspace.base_commit =>
            {
                crew_worktree::inspect::worktree_patch(&workspace.root, base)
            }
            _ => {
                return format!(
                    "{}: no work on a branch to show ({})",
                    task.id,
                    task.status.as_str()
                );
            }
        }
    };
    patch.unwrap_or_else(|error| format!("the diff could not be computed: {}", error.message()))
}

/// The last lines of an output log (at most [`TAIL_BYTES`] of it), as the agent's protocol
/// showed them live: a Claude Code, Codex or ACP message is what it said, not its JSON.
fn read_tail(path: &camino::Utf8Path) -> Vec<String> {
    let Ok(mut file) = crew_core::fsutil::open_nofollow(path) else {
        return Vec::new();
    };
    let length = file.metadata().map(|metadata| metadata.len()).unwrap_or(0);
    let start = length.saturating_sub(TAIL_BYTES);
    let mut bytes = Vec::new();
    if file.seek(SeekFrom::Start(start)).is_err() || file.read_to_end(&mut bytes).is_err() {
        return Vec::new();
    }
    let text = String::from_utf8_lossy(&bytes);
    // The first line was cut by where the read began.
    let whole = text.lines().skip(usize::from(start > 0));
    crew_live::agent::protocol::shown_log(whole)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_output_pane_reads_a_protocol_agents_log_as_it_was_shown() {
        let dir = tempfile::tempdir().unwrap();
        let path = camino::Utf8PathBuf::from_path_buf(dir.path().join("output.log")).unwrap();
        let log = concat!(
            r#"{"type":"system","subtype":"init","session_id":"s-1","model":"m","tools":[]}"#,
            "\n",
            r#"{"type":"assistant","message":{"content":[{"type":"text","text":"Reading the code.\n\nDone"}]},"session_id":"s-1"}"#,
            "\n",
            "a plain line\n",
        );
        std::fs::write(&path, log).unwrap();
        assert_eq!(
            read_tail(&path),
            [
                "[session s-1, model m]",
                "Reading the code.",
                "Done",
                "a plain line"
            ]
        );
        assert_eq!(
            crew_live::agent::output::last_line_of(&path).as_deref(),
            Some("a plain line")
        );
    }
}
