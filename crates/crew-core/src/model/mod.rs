//! Runs and tasks: their records in the manifest, their statuses and the transitions between
//! them. A transition not listed here is an error, never applied.

mod event;
mod run;
mod status;
mod task;
mod usage;

pub use event::*;
pub use run::*;
pub use status::*;
pub use task::*;
pub use usage::*;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::WorkspaceMode;
    use crate::ids::{RunId, TaskId, WorkspaceId};

    fn manifest() -> RunManifest {
        RunManifest::new(
            RunId::generate(),
            WorkspaceId::from_canonical("/w".into()),
            WorkspaceMode::Single,
            vec![TaskRecord::new(
                TaskId::parse("api").unwrap(),
                "shell".into(),
                "true".into(),
                vec![],
                WorkspaceMode::Single,
            )],
        )
    }

    #[test]
    fn children_follow_their_parent_in_their_order() {
        let items = [
            ("lead", None),
            ("other", None),
            ("sub1", Some("lead")),
            ("deep", Some("sub1")),
            ("sub2", Some("lead")),
            ("orphan", Some("gone")),
            ("x", Some("y")),
            ("y", Some("x")),
        ];
        let ordered: Vec<(&str, usize)> = family_order(&items, |item| item.0, |item| item.1)
            .into_iter()
            .map(|(item, depth)| (item.0, depth))
            .collect();
        assert_eq!(
            ordered,
            [
                ("lead", 0),
                ("sub1", 1),
                ("deep", 2),
                ("sub2", 1),
                ("other", 0),
                ("orphan", 0),
                ("x", 0),
                ("y", 0),
            ]
        );
    }

    #[test]
    fn task_lifecycle_follows_the_model() {
        let mut run = manifest();
        let api = TaskId::parse("api").unwrap();
        run.set_task_status(&api, TaskStatus::Preparing).unwrap();
        run.set_task_status(&api, TaskStatus::Running).unwrap();
        run.set_task_status(&api, TaskStatus::Waiting).unwrap();
        run.set_task_status(&api, TaskStatus::Running).unwrap();
        let task = run.set_task_status(&api, TaskStatus::Succeeded).unwrap();
        assert!(task.finished_at.is_some());
        let error = run.set_task_status(&api, TaskStatus::Failed).unwrap_err();
        assert!(
            error
                .to_string()
                .ends_with("cannot go from succeeded to failed"),
            "{error}"
        );
        assert_eq!(run.task(&api).unwrap().status, TaskStatus::Succeeded);
    }

    #[test]
    fn invalid_transitions_are_errors() {
        use TaskStatus::*;
        for (from, to) in [
            (Pending, Succeeded),
            (Pending, Running),
            (Preparing, Succeeded),
            (Waiting, Pending),
            (Paused, Pending),
            (Succeeded, Running),
            (Skipped, Failed),
        ] {
            assert!(!from.can_become(to), "{from} -> {to} must be refused");
        }
        assert!(!RunStatus::Completed.can_become(RunStatus::Failed));
        assert!(!RunStatus::Running.can_become(RunStatus::Running));
        let mut run = manifest();
        run.set_status(RunStatus::Completed).unwrap();
        assert!(run.set_status(RunStatus::Interrupted).is_err());
    }

    #[test]
    fn timestamps_round_trip() {
        let now = Timestamp::now();
        let json = serde_json::to_string(&now).unwrap();
        let back: Timestamp = serde_json::from_str(&json).unwrap();
        let delta = now.0.duration_since(back.0).unwrap_or_default();
        assert!(delta < std::time::Duration::from_millis(1));
    }
}
