//! `crew mcp`: crew as a Model Context Protocol server, so that a lead agent fans work out into
//! isolated, supervised, recorded sub-tasks.
//!
//! Scoped to the project folder it starts in: it lists, reads and controls only that folder's
//! runs. A run it starts is an ordinary run of the folder (`crew agents list` and `crew runs
//! show` see it), handed to a background host of its own as `crew run --detach` does: the
//! run goes on when the lead agent's session ends (its client closes this server's input, then
//! TERMs and KILLs it) or the lead agent crashes, and never loses a sub-agent's work; only a
//! `stop` or `crew runs cancel` stops it. A lead agent
//! says what to do (ids, prompts, agents, dependencies), never where: workspace modes, paths
//! and sandbox settings are the project's.

use std::sync::Arc;
use std::time::Duration;

use crew_core::config::{AdHocTeamError, PlannedTask};
use crew_core::model::{RunManifest, TaskStatus};
use crew_core::{AgentId, RunId};
use crew_live::{Host, HostOptions, RunSpec};
use crew_live::{SubmittedTask, WaitStep};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::model::{ProgressNotificationParam, ServerCapabilities, ServerConfig};
use rmcp::service::RequestContext;
use rmcp::{RoleServer, ServerHandler, ServiceExt, tool, tool_handler, tool_router};

use crate::context::Context;
use crate::foreground::Detached;
use crate::ui::Ui;
use crate::{CliError, Outcome};

mod error;
mod schema;

use error::ToolError;

use schema::*;

/// Serve the Model Context Protocol on stdio, for lead agents.
///
/// Tools: run_tasks, status, wait, answer, steer, stop, diff, land — on this project
/// folder's runs only.
#[derive(Debug, clap::Args)]
pub struct McpArgs {}

/// Patches longer than this are cut (the rest is in `git diff`).
const MAX_PATCH_BYTES: usize = 64 * 1024;

#[derive(Clone)]
struct CrewMcp {
    ctx: Context,
    host: Arc<tokio::sync::OnceCell<Arc<Host>>>,
    tool_router: ToolRouter<Self>,
}

/// The crew agent this server runs inside, when a crew agent started it (its environment says).
fn nested_caller() -> Option<AgentId> {
    std::env::var(crew_core::env_vars::CREW_AGENT_ID)
        .ok()
        .and_then(|id| AgentId::parse(&id).ok())
}

fn invalid(message: impl Into<String>) -> ToolError {
    ToolError::arguments(message)
}

#[tool_router]
impl CrewMcp {
    fn new(ctx: Context) -> Self {
        CrewMcp {
            ctx,
            host: Arc::default(),
            tool_router: Self::tool_router(),
        }
    }

    #[tool(
        description = "Start a run of tasks, each in its own isolated workspace (usually a git worktree on its own branch), under this project's configuration. Returns the run id; with `wait`, the outcome."
    )]
    async fn run_tasks(
        &self,
        Parameters(args): Parameters<RunTasksArgs>,
        context: RequestContext<RoleServer>,
    ) -> Result<Json<RunReport>, ToolError> {
        let config = self.ctx.config_dir();
        let team = match (&args.team, args.tasks.is_empty()) {
            (Some(team), true) => config
                .load_team(team)
                .map_err(|error| invalid(format!("team: {error}")))?,
            (None, false) => {
                let default_agent = self.ctx.config().run.default_agent.clone();
                let mut planned = Vec::new();
                for (index, task) in args.tasks.into_iter().enumerate() {
                    let agent = task.agent.or_else(|| default_agent.clone()).ok_or_else(|| {
                        invalid(format!(
                            "tasks[{index}].agent: none given, and the project has no `[run] default_agent`"
                        ))
                    })?;
                    planned.push(PlannedTask {
                        id: task.id,
                        agent,
                        prompt: task.prompt,
                        depends_on: task.depends_on,
                    });
                }
                let mut team =
                    config
                        .planned_team("mcp", planned)
                        .map_err(|error| match error {
                            AdHocTeamError::Agent(error) => invalid(format!("tasks: {error}")),
                            AdHocTeamError::Tasks(error) => invalid(format!("tasks: {error}")),
                        })?;
                // Sub-agents work in parallel: each in a worktree of its own where the folder
                // is a git repository.
                if self.ctx.workspace().repo_root().is_some() {
                    team.def.workspace_mode = Some(crew_core::WorkspaceMode::Worktree);
                }
                team
            }
            (Some(_), false) => return Err(invalid("give either `tasks` or `team`, not both")),
            (None, true) => return Err(invalid("tasks: give at least one task, or a `team`")),
        };
        if args
            .check
            .as_deref()
            .is_some_and(|check| check.trim().is_empty())
        {
            return Err(invalid("check: give a command, such as \"cargo test\""));
        }
        let spec = RunSpec {
            attempts: args.attempts,
            check: args.check,
            on_limit: args.on_limit.map(Into::into),
            ..RunSpec::of(team)
        };
        if let Some(caller) = nested_caller() {
            if spec.attempts.is_some() || spec.check.is_some() || spec.on_limit.is_some() {
                return Err(invalid(
                    "attempts, check and on_limit apply to a run of its own; inside a crew run, sub-tasks join the run as they are",
                ));
            }
            let team = spec.team;
            return self
                .submit_into_own_run(caller, team, args.wait.then_some(&context))
                .await;
        }
        let host = self.host().await?;
        let manifest = host
            .create(&spec)
            .await
            .map_err(|error| ToolError::from(CliError::from(error)))?;
        // Hosted by a background host of its own, not by this process: the SDKs close a
        // server's input, then TERM it, then KILL it, and the run goes on through all three.
        crate::foreground::host_detached(&self.ctx, &manifest.run_id, Detached::Mcp, None)
            .await
            .map_err(ToolError::from)?;
        if args.wait {
            return self
                .wait_for(&manifest.run_id, Duration::from_secs(3600), Some(&context))
                .await;
        }
        Ok(Json(report(&manifest)))
    }

    #[tool(
        description = "The runs of this project folder (or one run) with each task's status, branch, lines changed and question."
    )]
    async fn status(
        &self,
        Parameters(args): Parameters<StatusArgs>,
    ) -> Result<Json<StatusReport>, ToolError> {
        let runs = match &args.run {
            Some(prefix) => vec![report(&self.read(prefix)?)],
            // The newest ten, reading no other run.
            None => self
                .ctx
                .store()
                .list_newest_runs(10)
                .map_err(|error| ToolError::from(CliError::from(error)))?
                .0
                .into_iter()
                .filter_map(|listing| listing.manifest.ok())
                .map(|manifest| report(&manifest))
                .collect(),
        };
        Ok(Json(StatusReport { runs }))
    }

    #[tool(
        description = "Wait until a run ends or one of its tasks asks a question (whichever comes first), at most timeout_s seconds."
    )]
    async fn wait(
        &self,
        Parameters(args): Parameters<WaitArgs>,
        context: RequestContext<RoleServer>,
    ) -> Result<Json<RunReport>, ToolError> {
        let run_id = self.resolve(&args.run)?;
        let timeout = Duration::from_secs(args.timeout_s.unwrap_or(600));
        self.wait_for(&run_id, timeout, Some(&context)).await
    }

    #[tool(description = "Answer the question a task asks; its agent goes on with the answer.")]
    async fn answer(
        &self,
        Parameters(args): Parameters<MessageArgs>,
    ) -> Result<Json<DoneReport>, ToolError> {
        let message = args.message.clone();
        let done = self
            .control(&args.run, &args.task, Verb::FollowUp(message))
            .await?;
        // Answered once the task no longer waits: a `wait` right after sees it go on, not the
        // question just answered.
        let run_id = self.resolve(&args.run)?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while tokio::time::Instant::now() < deadline {
            let waits = self.ctx.read_run(&run_id).is_ok_and(|manifest| {
                manifest
                    .tasks
                    .iter()
                    .any(|task| task.id.as_str() == args.task && task.status == TaskStatus::Waiting)
            });
            if !waits {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(done)
    }

    #[tool(description = "Send a message to a task's running agent now.")]
    async fn steer(
        &self,
        Parameters(args): Parameters<MessageArgs>,
    ) -> Result<Json<DoneReport>, ToolError> {
        let message = args.message.clone();
        self.control(&args.run, &args.task, Verb::Steer(message))
            .await
    }

    #[tool(description = "Stop a task's agent (TERM, grace, KILL); its work is kept.")]
    async fn stop(
        &self,
        Parameters(args): Parameters<TaskRef>,
    ) -> Result<Json<DoneReport>, ToolError> {
        self.control(&args.run, &args.task, Verb::Stop).await
    }

    #[tool(
        description = "Land tasks' work on a branch (default: the branch the run started from), in dependency order: all of them, or none. On a conflict nothing moves, and `problem` names the task and the files."
    )]
    async fn land(
        &self,
        Parameters(args): Parameters<LandArgs>,
    ) -> Result<Json<LandReport>, ToolError> {
        let manifest = self.read(&args.run)?;
        let targets: Vec<String> = match &args.tasks {
            None => vec![manifest.run_id.to_string()],
            Some(tasks) => {
                let mut targets = Vec::new();
                for task in tasks {
                    let known = crew_core::TaskId::parse(task)
                        .ok()
                        .is_some_and(|id| manifest.task(&id).is_some());
                    if !known {
                        return Err(ToolError::refused(format!(
                            "tasks: run {} has no task {task:?}",
                            manifest.run_id
                        )));
                    }
                    targets.push(format!("{}:{task}", manifest.run_id));
                }
                targets
            }
        };
        let options = crew_live::LandOptions {
            into: args.into.clone(),
            mode: match args.mode.unwrap_or(LandModeArg::Merge) {
                LandModeArg::Merge => crew_core::provider::land::LandMode::Merge,
                LandModeArg::Squash => crew_core::provider::land::LandMode::Squash,
                LandModeArg::Rebase => crew_core::provider::land::LandMode::Rebase,
            },
            force: args.force,
        };
        let report = match self
            .ctx
            .project()
            .land(&targets, &options)
            .map_err(CliError::from)
        {
            Ok(landed) => LandReport {
                landed: true,
                into: Some(landed.into),
                tasks: landed.tasks,
                from: Some(landed.from),
                to: Some(landed.to),
                checkout_updated: landed.checkout_updated,
                problem: None,
            },
            Err(error) => LandReport {
                landed: false,
                into: args.into,
                tasks: Vec::new(),
                from: None,
                to: None,
                checkout_updated: false,
                problem: Some(
                    error
                        .render()
                        .trim_end()
                        .trim_start_matches("error: ")
                        .to_owned(),
                ),
            },
        };
        Ok(Json(report))
    }

    #[tool(description = "A task's work against its base, as git diff prints it (cut at 64 KiB).")]
    async fn diff(
        &self,
        Parameters(args): Parameters<TaskRef>,
    ) -> Result<Json<DiffReport>, ToolError> {
        let manifest = self.read(&args.run)?;
        let task = crew_core::TaskId::parse(&args.task)
            .ok()
            .and_then(|id| manifest.task(&id).cloned())
            .ok_or_else(|| {
                ToolError::refused(format!(
                    "task: run {} has no task {:?}",
                    manifest.run_id, args.task
                ))
            })?;
        let found = crate::commands::diff::task_patch(&self.ctx, &manifest, &task)
            .map_err(|message| ToolError::refused(format!("task: {message}")))?;
        let mut patch = found.patch;
        let truncated = patch.len() > MAX_PATCH_BYTES;
        if truncated {
            let mut end = MAX_PATCH_BYTES;
            while !patch.is_char_boundary(end) {
                end -= 1;
            }
            patch.truncate(end);
        }
        Ok(Json(DiffReport {
            agent_id: found.agent_id,
            branch: found.branch,
            base: found.base,
            patch,
            truncated,
        }))
    }
}

impl CrewMcp {
    /// The host of the runs this server starts, started with the first.
    async fn host(&self) -> Result<Arc<Host>, ToolError> {
        self.host
            .get_or_try_init(|| async {
                let crew_dir = std::env::current_exe()
                    .ok()
                    .and_then(|exe| exe.parent().map(std::path::Path::to_path_buf));
                let options = HostOptions {
                    label: "crew mcp".to_owned(),
                    crew_dir,
                };
                Host::start(self.ctx.project(), options)
                    .await
                    .map(Arc::new)
                    .map_err(|error| ToolError::from(CliError::internal(error)))
            })
            .await
            .cloned()
    }

    /// A lead agent that is itself a crew agent adds its tasks to its own run (no run, and no
    /// worktree, inside another): the run's mode is theirs.
    async fn submit_into_own_run(
        &self,
        caller: AgentId,
        team: crew_core::Team,
        wait: Option<&RequestContext<RoleServer>>,
    ) -> Result<Json<RunReport>, ToolError> {
        let tasks = team
            .def
            .tasks
            .iter()
            .map(|task| SubmittedTask {
                id: task.id.to_string(),
                agent: Some(task.agent.clone()),
                prompt: task.prompt.clone(),
                depends_on: task.depends_on.iter().map(ToString::to_string).collect(),
            })
            .collect();
        super::from_agent::connect("mcp")
            .await
            .map_err(ToolError::from)?
            .submit(tasks)
            .await
            .map_err(|error| match error {
                crew_live::AgentSelfError::Refused(refusal) => {
                    ToolError::refused(format!("tasks: {refusal}"))
                }
                error => ToolError::from(CliError::internal(error)),
            })?;
        let run_id = caller.run_id().clone();
        if let Some(context) = wait {
            return self
                .wait_for(&run_id, Duration::from_secs(3600), Some(context))
                .await;
        }
        let manifest = self.ctx.read_run(&run_id).map_err(ToolError::from)?;
        Ok(Json(report(&manifest)))
    }

    fn resolve(&self, prefix: &str) -> Result<RunId, ToolError> {
        self.ctx.resolve_run(prefix).map_err(ToolError::from)
    }

    fn read(&self, prefix: &str) -> Result<RunManifest, ToolError> {
        let run_id = self.resolve(prefix)?;
        self.ctx.read_run(&run_id).map_err(ToolError::from)
    }

    /// Waits until the run ends or a task asks — within a lead agent's own run, until every
    /// task but the lead's own has finished (the run cannot end while the lead waits in it).
    /// A client that sent a progress token hears how many tasks have finished, at each change.
    async fn wait_for(
        &self,
        run_id: &RunId,
        timeout: Duration,
        context: Option<&RequestContext<RoleServer>>,
    ) -> Result<Json<RunReport>, ToolError> {
        let own = nested_caller().filter(|caller| caller.run_id() == run_id);
        let progress = context.and_then(|context| {
            let token = context.meta.get_progress_token()?;
            Some((context.peer.clone(), token))
        });
        let ignore = own.map(|caller| caller.task_id().clone());
        let mut waiting = self.ctx.project().wait_run(run_id, timeout, ignore);
        loop {
            let step = waiting
                .next()
                .await
                .map_err(|error| ToolError::from(CliError::from(error)))?;
            match step {
                WaitStep::Progress { finished, of } => {
                    let Some((peer, token)) = &progress else {
                        continue;
                    };
                    let mut note = ProgressNotificationParam::new(token.clone(), finished as f64);
                    note.total = Some(of as f64);
                    note.message = Some(format!("{finished} of {of} task(s) finished"));
                    // A client that stopped listening does not stop the wait.
                    let _ = peer.notify_progress(note).await;
                }
                WaitStep::Over { manifest, .. } => return Ok(Json(report(&manifest))),
            }
        }
    }

    async fn control(
        &self,
        run: &str,
        task: &str,
        verb: Verb,
    ) -> Result<Json<DoneReport>, ToolError> {
        let run_id = self.resolve(run)?;
        let spec = format!("{run_id}:{task}");
        let project = self.ctx.project();
        let refused = |error: crew_live::ControlAgentError| ToolError::from(CliError::from(error));
        let (agent_id, result) = match verb {
            Verb::FollowUp(message) => {
                let done = project.follow_up(&spec, message).await.map_err(refused)?;
                (done.agent_id, done.follow_up.as_str())
            }
            Verb::Steer(message) => {
                let done = project.steer(&spec, message).await.map_err(refused)?;
                (done.agent_id, "done")
            }
            Verb::Stop => {
                let done = project.stop(&spec).await.map_err(refused)?;
                (done.agent_id, done.stop.as_str())
            }
        };
        Ok(Json(DoneReport {
            agent_id: agent_id.to_string(),
            result: result.to_owned(),
        }))
    }
}

/// What a lead agent does to one task's agent.
enum Verb {
    FollowUp(String),
    Steer(String),
    Stop,
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for CrewMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build()).with_instructions(
            "crew runs coding agents in parallel, each task in its own isolated workspace (a git worktree on its own branch), supervised and recorded. run_tasks fans work out; wait, status and diff follow it; answer, steer and stop act on one task.",
        )
    }
}

pub async fn cmd_mcp(_args: McpArgs, ui: Ui) -> Result<Outcome, CliError> {
    let ctx = Context::discover(ui)?;
    ctx.reconcile()?;
    let server = CrewMcp::new(ctx);
    let service = server
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|error| CliError::internal(format!("the MCP connection failed: {error}")))?;
    // The client went away (or closed its end); the runs it started go on in their own hosts.
    let _ = service.waiting().await;
    Ok(Outcome::Success)
}
