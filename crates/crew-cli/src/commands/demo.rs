//! `crew demo`

use std::collections::{BTreeMap, HashMap};

use camino::Utf8PathBuf;
use crew_core::config::{AgentDef, TaskDef, TeamDef, WorkspaceMode};
use crew_core::{TaskId, Team, Workspace};
use crew_live::RunSpec;

use crate::context::Context;
use crate::foreground::start_host;
use crate::summary::{SummaryFor, outcome, summary};
use crate::ui::{Style, Ui};
use crate::{CliError, Outcome};

const GREETING: &str = "Hello from the leader.\nThis line is shared by every agent.\n";

/// See crew at work in ten seconds: three agents, three worktrees, one file.
///
/// Needs no configuration and no repository: it makes a small git repository in a temp
/// directory, runs three `shell` agents in parallel, each in its own worktree, each editing the
/// same file its own way, and shows each task's branch and diff — while the original file stays
/// as it was.
#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Where to make the demo repository (default: a new temp directory, kept afterwards).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<Utf8PathBuf>,
}

pub async fn cmd_demo(args: DemoArgs, ui: Ui) -> Result<Outcome, CliError> {
    let dir = match args.dir {
        Some(dir) => {
            std::fs::create_dir_all(&dir)?;
            if std::fs::read_dir(&dir)?.next().is_some() {
                return Err(CliError::user(format!(
                    "{dir} is not empty; the demo needs an empty directory"
                )));
            }
            dir
        }
        None => {
            let temp = tempfile::Builder::new()
                .prefix("crew-demo-")
                .tempdir()?
                .keep();
            Utf8PathBuf::from_path_buf(temp).map_err(|path| {
                CliError::internal(format!("temp dir {} is not UTF-8", path.display()))
            })?
        }
    };
    crew_worktree::inspect::create_repository(
        &dir,
        &[("greeting.txt", GREETING), ("README.md", "# crew demo\n")],
    )
    .map_err(CliError::internal)?;
    let workspace = Workspace::at_root(dir.as_std_path())?;
    let ctx = Context::for_workspace(workspace, ui)?;
    let tasks = [
        (
            "shout",
            "tr a-z A-Z < greeting.txt > greeting.new && mv greeting.new greeting.txt",
        ),
        (
            "french",
            "sed 's/Hello/Bonjour/' greeting.txt > greeting.new && mv greeting.new greeting.txt",
        ),
        ("sign", "echo '-- signed by the sign agent' >> greeting.txt"),
    ];
    let team = Team {
        def: TeamDef {
            description: Some("three shell agents, one file, three worktrees".into()),
            workspace_mode: Some(WorkspaceMode::Worktree),
            ..TeamDef::new(
                "demo",
                tasks
                    .iter()
                    .map(|(id, prompt)| {
                        TaskDef::new(
                            TaskId::parse(id).expect("demo task ids are valid"),
                            "shell",
                            *prompt,
                        )
                    })
                    .collect(),
            )
        },
        agents: BTreeMap::from([("shell".to_owned(), AgentDef::builtin_shell())]),
    };
    if !ui.quiet {
        out!("crew demo: a repository at {dir} with greeting.txt:\n");
        for line in GREETING.lines() {
            out!("    {line}");
        }
        out!(
            "\nthree shell agents edit greeting.txt at the same time, each in its own worktree:\n"
        );
    }
    let host = start_host(&ctx, "crew demo").await?;
    let spec = RunSpec {
        max_parallel: Some(3),
        ..RunSpec::of(team)
    };
    let manifest = host.create(&spec).await?;
    let manifest =
        crate::foreground::run_here(&ctx, &host, &manifest.run_id, HashMap::new(), !ui.quiet)
            .await?;
    if ui.quiet {
        return Ok(outcome(&manifest));
    }
    out!(no_newline: "{}", summary(&ctx, &manifest, SummaryFor::RunEnd));
    out!();
    for task in &manifest.tasks {
        let (Some(branch), Some(base)) = (
            task.teardown
                .as_ref()
                .and_then(|report| report.branch.clone()),
            task.workspace
                .as_ref()
                .and_then(|workspace| workspace.base_commit.clone()),
        ) else {
            continue;
        };
        out!(
            "{}",
            ui.paint(&format!("── {} on {branch}", task.id), Style::Bold)
        );
        let patch = crew_worktree::inspect::branch_patch(&dir, &base, &branch)
            .map_err(CliError::internal)?;
        for line in patch.lines() {
            let style = if line.starts_with('+') && !line.starts_with("+++") {
                Some(Style::Good)
            } else if line.starts_with('-') && !line.starts_with("---") {
                Some(Style::Bad)
            } else {
                None
            };
            match style {
                Some(style) => out!("{}", ui.paint(line, style)),
                None => out!("{line}"),
            }
        }
        out!();
    }
    let leader = std::fs::read_to_string(dir.join("greeting.txt"))?;
    let untouched = if leader == GREETING {
        "untouched"
    } else {
        "CHANGED"
    };
    out!("the leader's greeting.txt is {untouched}; each agent's work waits on its own branch.");
    out!("look around: cd {dir} && git branch && git log --all --oneline");
    out!(
        "try next, there: `crew diff sign` shows one task's work, `crew land sign` puts it on main"
    );
    out!("the demo repository is kept; remove it with: rm -rf {dir}");
    Ok(outcome(&manifest))
}
