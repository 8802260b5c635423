//! `crew agents list` answered before clap parses the command line and before an async runtime
//! exists. A listing is judged against `git worktree list` in milliseconds, and clap's parse
//! (the first touch of its code) and tokio's runtime were half a millisecond of it
//! (BENCHMARKS.md). Only the exact argument shapes below are answered here, with the same rows
//! and table as the command itself; anything else, and a listing that needs more than the
//! project's files (a live host whose listing cannot be read, an error to report), steps aside
//! for the full command line, which answers as it always did. See ARCHITECTURE.md, "Start-up".

use std::ffi::OsString;

use crate::commands::agents::list;
use crate::context::Context;
use crate::ui::{ColorChoice, Ui};

/// What a quickly answered listing was asked for.
#[derive(Debug, Default, PartialEq, Eq)]
struct Listing {
    color: Option<ColorChoice>,
    quiet: bool,
    json: bool,
    all_runs: bool,
}

/// Answers `crew agents list` (with `--json`, `--all-runs`, `--color`, `-q` in any order) and
/// returns its exit code, or `None` when the full command line must run instead.
pub fn answer(args: impl IntoIterator<Item = OsString>) -> Option<u8> {
    let listing = parse(args)?;
    // Inside an agent the command refuses, and says so (see `list::cmd_agents_list`).
    if std::env::var_os(crew_core::env_vars::CREW_AGENT_ID).is_some() {
        return None;
    }
    let ui = Ui::new(listing.color.unwrap_or_default(), listing.quiet);
    crate::init_tracing(0, listing.quiet);
    let ctx = Context::discover(ui).ok()?;
    let published = ctx.published_agents_now()?;
    let (rows, _) = list::rows_of(&ctx, published, listing.all_runs, listing.json).ok()?;
    Some(crate::exit_status(
        list::print(&ctx, &rows, listing.json).map(|()| crate::Outcome::Success),
    ))
}

/// The listing `args` (the program's name first) ask for, when they are one of the shapes
/// answered here. A flag given twice, a verbosity, help, or anything unknown is `None`: clap
/// says what it says about them.
fn parse(args: impl IntoIterator<Item = OsString>) -> Option<Listing> {
    let mut listing = Listing::default();
    let mut words = 0;
    let mut args = args.into_iter().skip(1);
    while let Some(arg) = args.next() {
        let arg = arg.into_string().ok()?;
        let value = match arg.as_str() {
            "--color" => Some(args.next()?.into_string().ok()?),
            other => other.strip_prefix("--color=").map(str::to_owned),
        };
        if let Some(value) = value {
            let choice = match value.as_str() {
                "auto" => ColorChoice::Auto,
                "always" => ColorChoice::Always,
                "never" => ColorChoice::Never,
                _ => return None,
            };
            listing.color.replace(choice).is_none().then_some(())?;
            continue;
        }
        let flag = match (arg.as_str(), words) {
            ("agents", 0) | ("list", 1) => {
                words += 1;
                continue;
            }
            ("-q" | "--quiet", _) => &mut listing.quiet,
            ("--json", 2) => &mut listing.json,
            ("--all-runs", 2) => &mut listing.all_runs,
            _ => return None,
        };
        (!std::mem::replace(flag, true)).then_some(())?;
    }
    (words == 2).then_some(listing)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(line: &str) -> Option<Listing> {
        parse(line.split_whitespace().map(OsString::from))
    }

    #[test]
    fn the_shapes_of_a_listing_are_answered_and_nothing_else() {
        assert_eq!(parsed("crew agents list"), Some(Listing::default()));
        assert_eq!(
            parsed("crew --color never agents -q list --all-runs --json"),
            Some(Listing {
                color: Some(ColorChoice::Never),
                quiet: true,
                json: true,
                all_runs: true,
            })
        );
        assert_eq!(
            parsed("crew agents list --color=always").and_then(|listing| listing.color),
            Some(ColorChoice::Always)
        );
        for other in [
            "crew",
            "crew agents",
            "crew list agents",
            "crew agents --json list",
            "crew agents list extra",
            "crew agents list --json --json",
            "crew -q agents list --quiet",
            "crew agents list -v",
            "crew agents list --help",
            "crew agents list --color",
            "crew agents list --color=sometimes",
            "crew --color never --color=never agents list",
            "crew agents list --all",
            "crew runs list",
        ] {
            assert_eq!(parsed(other), None, "{other}");
        }
    }

    /// Every shape answered here is one clap accepts with the same meaning.
    #[test]
    fn what_is_answered_here_is_what_clap_parses() {
        use clap::Parser as _;
        for line in [
            "crew agents list",
            "crew --color never agents -q list --all-runs --json",
            "crew agents list --color=always --quiet",
            "crew agents --color auto list --json",
        ] {
            let listing = parsed(line).expect(line);
            let cli = crate::Cli::try_parse_from(line.split_whitespace()).expect(line);
            let crate::commands::Command::Agents(crate::commands::agents::AgentsCommand::List(
                args,
            )) = cli.command
            else {
                panic!("{line}: clap parsed another command");
            };
            assert_eq!(
                (
                    listing.color.unwrap_or_default(),
                    listing.quiet,
                    listing.json,
                    listing.all_runs
                ),
                (cli.color, cli.quiet, args.json, args.all_runs),
                "{line}"
            );
        }
    }
}
