//! A repository with crew's workspace provider, for tests that allocate and tear down task
//! workspaces directly.

use camino::{Utf8Path, Utf8PathBuf};
use crew_core::config::{ProjectConfig, WorkspaceMode};
use crew_core::provider::{TaskWorkspace, TeardownRequest, WorkspaceProvider, WorkspaceRequest};
use crew_core::{RunId, TaskId, Workspace};
use crew_tests::{TestEnv, tree_fingerprint};
use crew_worktree::CrewWorkspaces;

/// A repository (`project`, one commit) and the provider, with a run id for its tasks.
pub struct Fixture {
    pub env: TestEnv,
    pub repo: Utf8PathBuf,
    pub workspace: Workspace,
    pub provider: CrewWorkspaces,
    pub run_id: RunId,
}

impl Fixture {
    pub fn new() -> Self {
        Self::with_config(ProjectConfig::default())
    }

    pub fn with_config(config: ProjectConfig) -> Self {
        let env = TestEnv::new();
        let repo = env.repo("project");
        Self::in_dir(env, repo, config)
    }

    pub fn in_dir(env: TestEnv, dir: Utf8PathBuf, config: ProjectConfig) -> Self {
        let workspace = Workspace::discover(dir.as_std_path()).unwrap();
        let provider = CrewWorkspaces::new(&config).with_temp_root(env.tmp());
        Fixture {
            env,
            repo: dir,
            workspace,
            provider,
            run_id: RunId::generate(),
        }
    }

    pub fn request(&self, task: &str, mode: WorkspaceMode) -> WorkspaceRequest {
        WorkspaceRequest {
            workspace: self.workspace.id().clone(),
            repo_root: self.workspace.repo_root().map(Utf8Path::to_owned),
            invocation_dir: self.workspace.relative_invocation_dir(),
            run_id: self.run_id.clone(),
            task_id: TaskId::parse(task).unwrap(),
            mode,
            base: None,
            upstream: Vec::new(),
            progress: None,
            env: Vec::new(),
            unconfined: false,
        }
    }

    pub fn allocate(&self, task: &str) -> TaskWorkspace {
        self.provider
            .allocate(&self.request(task, WorkspaceMode::Worktree))
            .unwrap()
    }

    pub fn teardown_request(&self, task: &str) -> TeardownRequest {
        TeardownRequest {
            workspace: self.workspace.id().clone(),
            repo_root: self.workspace.repo_root().map(Utf8Path::to_owned),
            run_id: self.run_id.clone(),
            task_id: TaskId::parse(task).unwrap(),
            agent_alive: false,
            keep: false,
            placed_for: None,
        }
    }

    pub fn git(&self, args: &[&str]) -> String {
        self.env.git(&self.repo, args)
    }

    /// HEAD, the index and every file of the leader, byte for byte (crew's own directories
    /// and git's object store and worktree admin aside).
    pub fn leader_snapshot(&self) -> Vec<(String, String)> {
        let mut snapshot: Vec<(String, String)> = tree_fingerprint(self.repo.as_std_path())
            .into_iter()
            .filter(|(path, _)| {
                !path.starts_with(".git/")
                    && !path.starts_with(".worktrees")
                    && path != ".crew"
                    && !path.starts_with(".crew/state")
            })
            .collect();
        for file in ["HEAD", "index"] {
            let bytes = std::fs::read(self.repo.join(".git").join(file)).unwrap_or_default();
            snapshot.push((format!(".git/{file}"), format!("{bytes:?}")));
        }
        snapshot
    }

    /// No task worktree is registered (the leader and crew's pool aside), and git's own
    /// consistency check passes.
    pub fn assert_git_is_clean(&self) {
        assert_eq!(self.env.task_worktrees(&self.repo), Vec::<String>::new());
        let fsck = self.env.git_output(&self.repo, ["fsck", "--no-progress"]);
        assert!(
            fsck.status.success(),
            "{}",
            String::from_utf8_lossy(&fsck.stderr)
        );
    }

    pub fn branch_exists(&self, branch: &str) -> bool {
        self.env
            .git_output(
                &self.repo,
                [
                    "rev-parse",
                    "--verify",
                    "--quiet",
                    &format!("refs/heads/{branch}"),
                ],
            )
            .status
            .success()
    }
}
