//! `crew submit`

use crew_live::SubmittedTask;

use crate::ui::Ui;
use crate::{CliError, Outcome};

/// Add tasks to your own run, from inside an agent (an agent-authored plan).
///
/// The tasks run in the workspace mode the run chose; a plan cannot choose modes or paths.
/// `--task ID=PROMPT` adds one task (repeatable; `--after` makes them depend on a task), or
/// `--json FILE` (`-` for stdin) reads an array of `{"id", "prompt", "agent"?, "depends_on"?}`.
#[derive(Debug, clap::Args)]
pub struct SubmitArgs {
    /// A task `ID=PROMPT`.
    #[arg(long = "task", value_name = "ID=PROMPT")]
    pub tasks: Vec<String>,
    /// The agent definition the --task tasks run (default: the submitting agent's own).
    #[arg(long)]
    pub agent: Option<String>,
    /// Make the --task tasks depend on this task (repeatable).
    #[arg(long = "after", value_name = "TASK")]
    pub after: Vec<String>,
    /// Read the tasks as JSON from FILE, or from stdin with `-`.
    #[arg(long, value_name = "FILE", conflicts_with = "tasks")]
    pub json: Option<String>,
}

pub async fn cmd_submit(args: SubmitArgs, ui: Ui) -> Result<Outcome, CliError> {
    let tasks = match &args.json {
        Some(source) => {
            let text = if source == "-" {
                std::io::read_to_string(std::io::stdin())?
            } else {
                std::fs::read_to_string(source)?
            };
            serde_json::from_str::<Vec<SubmittedTask>>(&text).map_err(|error| {
                CliError::user(format!("the submitted plan is not valid: {error}"))
            })?
        }
        None => args
            .tasks
            .iter()
            .map(|task| {
                let (id, prompt) = task.split_once('=').ok_or_else(|| {
                    CliError::user(format!("--task {task:?} is not of the form ID=PROMPT"))
                })?;
                Ok(SubmittedTask {
                    id: id.to_owned(),
                    agent: args.agent.clone(),
                    prompt: prompt.to_owned(),
                    depends_on: args.after.clone(),
                })
            })
            .collect::<Result<_, CliError>>()?,
    };
    if tasks.is_empty() {
        return Err(CliError::user(
            "no tasks to submit: give --task ID=PROMPT or --json FILE",
        ));
    }
    let submitted = super::from_agent::connect("submit")
        .await?
        .submit(tasks)
        .await?;
    if !ui.quiet {
        say!("accepted {}", serde_json::to_string(&submitted.accepted)?);
    }
    Ok(Outcome::Success)
}
