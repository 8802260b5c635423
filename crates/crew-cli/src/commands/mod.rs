//! One module per subcommand.

pub mod agents;
pub mod ask;
pub mod attempts;
pub mod completions;
pub mod conflicts;
pub mod demo;
pub mod diff;
pub mod events;
mod from_agent;
pub mod init;
pub mod land;
pub mod mcp;
pub mod run;
pub mod runs;
pub mod sandbox;
pub mod serve;
pub mod shim;
pub mod submit;
pub mod watch;
pub mod worktrees;

use crate::ui::Ui;
use crate::{CliError, Outcome};

#[derive(Debug, clap::Subcommand)]
// Each subcommand's arguments are built only when it is the one invoked: `crew agents list`
// answers in a couple of milliseconds, and building the whole command tree was a tenth of that.
#[command(defer = true)]
pub enum Command {
    /// Run a team of agents, each task in its own workspace.
    Run(run::RunArgs),
    /// One terminal board of every agent of this project, waiting ones first.
    Watch(watch::WatchArgs),
    /// List and control the live agents of this workspace.
    #[command(subcommand)]
    Agents(agents::AgentsCommand),
    /// Inspect and manage the runs of this workspace.
    #[command(subcommand)]
    Runs(runs::RunsCommand),
    /// Which task branches of a run would conflict, and in which files.
    Conflicts(conflicts::ConflictsArgs),
    /// A task's work against its base, as git diff prints it (a run: each of its tasks).
    Diff(diff::DiffArgs),
    /// Land tasks' work on a branch, in dependency order: all of them, or none.
    Land(land::LandArgs),
    /// A task's attempts side by side: status, files, lines, check, cost.
    Compare(attempts::CompareArgs),
    /// Keep one attempt as the task's result; delete the other attempts' branches.
    Pick(attempts::PickArgs),
    /// What happened in a run, in order (`--follow` as it happens, `--json` for scripts).
    Events(events::EventsArgs),
    /// crew's worktrees and task branches in this repository.
    #[command(subcommand)]
    Worktrees(worktrees::WorktreesCommand),
    /// What the kernel lets agents write, and whether this machine can confine them.
    #[command(subcommand)]
    Sandbox(sandbox::SandboxCommand),
    /// Ask the user a question from inside an agent, and stop for the answer.
    Ask(ask::AskArgs),
    /// Add tasks to your own run, from inside an agent (an agent-authored plan).
    Submit(submit::SubmitArgs),
    /// Serve the Model Context Protocol on stdio, for lead agents.
    Mcp(mcp::McpArgs),
    /// Serve the Agent Client Protocol on stdio, for editors.
    Serve(serve::ServeArgs),
    /// Write `.crew/` with a commented example of each configuration file.
    Init(init::InitArgs),
    /// See crew at work in ten seconds: three agents, three worktrees, one file.
    Demo(demo::DemoArgs),
    /// The other side of a placement: run tasks here for a crew host elsewhere.
    Shim(shim::ShimArgs),
    /// Print shell completions for crew.
    Completions(completions::CompletionsArgs),
    /// The background host of a detached run (started by `crew run --detach`).
    #[command(hide = true)]
    Host(run::HostArgs),
}

impl Command {
    /// Whether the command may host a run (and its agents) in this process.
    pub fn hosts_agents(&self) -> bool {
        match self {
            Command::Run(_)
            | Command::Host(_)
            | Command::Demo(_)
            | Command::Serve(_)
            | Command::Shim(_)
            | Command::Mcp(_) => true,
            Command::Runs(command) => matches!(command, runs::RunsCommand::Resume(_)),
            // A follow-up or resume whose run has no live host hosts it here.
            Command::Agents(command) => matches!(
                command,
                agents::AgentsCommand::FollowUp(_) | agents::AgentsCommand::Resume(_)
            ),
            _ => false,
        }
    }
}

pub async fn run(command: Command, ui: Ui) -> Result<Outcome, CliError> {
    match command {
        Command::Run(args) => run::cmd_run(args, ui).await,
        Command::Watch(args) => watch::cmd_watch(args, ui).await,
        Command::Agents(command) => agents::run(command, ui).await,
        Command::Runs(command) => runs::run(command, ui).await,
        Command::Conflicts(args) => conflicts::cmd_conflicts(args, ui).await,
        Command::Compare(args) => attempts::cmd_compare(args, ui).await,
        Command::Pick(args) => attempts::cmd_pick(args, ui).await,
        Command::Diff(args) => diff::cmd_diff(args, ui).await,
        Command::Events(args) => events::cmd_events(args, ui).await,
        Command::Land(args) => land::cmd_land(args, ui).await,
        Command::Worktrees(command) => worktrees::run(command, ui).await,
        Command::Sandbox(command) => sandbox::run(command, ui).await,
        Command::Ask(args) => ask::cmd_ask(args, ui).await,
        Command::Submit(args) => submit::cmd_submit(args, ui).await,
        Command::Serve(args) => serve::cmd_serve(args, ui).await,
        Command::Mcp(args) => mcp::cmd_mcp(args, ui).await,
        Command::Init(args) => init::cmd_init(args, ui),
        Command::Demo(args) => demo::cmd_demo(args, ui).await,
        Command::Shim(args) => shim::cmd_shim(args, ui).await,
        Command::Completions(args) => completions::cmd_completions(args),
        Command::Host(args) => run::cmd_host(args, ui).await,
    }
}
