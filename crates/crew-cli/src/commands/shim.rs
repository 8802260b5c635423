//! `crew shim --stdio DIR`: the other side of a placement (docs/distributed.md), served by
//! crew-live's `shim` on this process's stdin and stdout, its clones under DIR. TERM and
//! Ctrl-C cancel its runs gracefully (their work is still sent); it ends when its input does.

use std::sync::Arc;

use camino::Utf8PathBuf;
use crew_core::CancelCause;
use crew_live::project::shim::ShimOptions;
use crew_worktree::CrewWorkspaces;
use crew_worktree::incoming::GitClones;

use crate::ui::Ui;
use crate::{CliError, Outcome};

/// The other side of a placement: run tasks here for a crew host elsewhere.
///
/// A crew host reaches it through ssh, a pod or a child process and speaks JSON lines on its
/// stdin and stdout. It keeps a clone per project under DIR.
#[derive(Debug, clap::Args)]
pub struct ShimArgs {
    /// Speak the shim protocol on stdin and stdout (the only transport).
    #[arg(long, required = true)]
    pub stdio: bool,
    /// Where the shim keeps its clones, one directory per project (`~/…` is beneath its home:
    /// no shell expands it where `srun` starts the shim).
    pub dir: Utf8PathBuf,
}

pub async fn cmd_shim(mut args: ShimArgs, _ui: Ui) -> Result<Outcome, CliError> {
    // `--stdio` is the only transport: the flag says so, and asks nothing.
    let _ = args.stdio;
    if let (Some(rest), Ok(home)) = (args.dir.as_str().strip_prefix("~/"), std::env::var("HOME")) {
        args.dir = Utf8PathBuf::from(home).join(rest);
    }
    std::fs::create_dir_all(&args.dir).map_err(|error| {
        CliError::user(format!(
            "cannot use {} for the shim's clones: {error}",
            args.dir
        ))
    })?;
    let root = crew_core::paths::canonical_utf8(args.dir.as_std_path())
        .map_err(|error| CliError::user(error.to_string()))?;
    let (cancel, causes) = tokio::sync::mpsc::unbounded_channel();
    let signals = tokio::spawn(forward_signals(cancel));
    let options = ShimOptions {
        root,
        clones: Arc::new(GitClones),
        provider: Arc::new(|config| Arc::new(CrewWorkspaces::new(config))),
        crew_dir: std::env::current_exe()
            .ok()
            .and_then(|exe| exe.parent().map(std::path::Path::to_path_buf)),
    };
    let succeeded =
        crew_live::project::shim::serve(options, tokio::io::stdin(), tokio::io::stdout(), causes)
            .await;
    signals.abort();
    Ok(if succeeded {
        Outcome::Success
    } else {
        Outcome::TaskFailed
    })
}

/// TERM or Ctrl-C (the host stops its task, or its user the shim): each is a cancel.
async fn forward_signals(cancel: tokio::sync::mpsc::UnboundedSender<CancelCause>) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut interrupt)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return;
    };
    loop {
        let cause = tokio::select! {
            _ = term.recv() => CancelCause::Terminate,
            _ = interrupt.recv() => CancelCause::Interrupt,
        };
        if cancel.send(cause).is_err() {
            return;
        }
    }
}
