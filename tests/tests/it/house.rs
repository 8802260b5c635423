//! The house keeps its shape (ARCHITECTURE.md, "Crates" and "Rooms"): crew-live is three rooms
//! whose imports point one way, with no circle between its files; `unsafe` code lives in crew-sandbox alone; crew-kube does not
//! build on crew-cli. Read from the sources, as a
//! reviewer would, so that a change that breaks the shape fails here.

use std::collections::{BTreeMap, BTreeSet};

use camino::{Utf8Path, Utf8PathBuf};

/// crew-live's rooms, lowest first: a room may use the ones before it, never one after.
const ROOMS: [&str; 3] = ["agent", "control", "project"];

fn root() -> Utf8PathBuf {
    Utf8PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every `.rs` file beneath `dir`, with its path relative to `dir`.
fn sources(dir: &Utf8Path) -> Vec<(Utf8PathBuf, String)> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(next) = pending.pop() {
        for entry in next.read_dir_utf8().unwrap() {
            let path = entry.unwrap().into_path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension() == Some("rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                found.push((path.strip_prefix(dir).unwrap().to_owned(), text));
            }
        }
    }
    found.sort();
    found
}

/// The code of a file: comments (doc comments too) left out, line by line.
fn code_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines().enumerate().filter_map(|(index, line)| {
        let code = line.split("//").next().unwrap_or("").trim();
        (!code.is_empty()).then_some((index + 1, code))
    })
}

/// The module path of a file of a crate's `src` (`agent/supervisor/mod.rs`: `agent::supervisor`).
fn module_of(file: &Utf8Path) -> Vec<String> {
    let mut parts: Vec<String> = file
        .components()
        .map(|part| part.as_str().to_owned())
        .collect();
    let last = parts.pop().unwrap();
    let stem = last.trim_end_matches(".rs");
    if !["mod", "lib", "main"].contains(&stem) {
        parts.push(stem.to_owned());
    }
    parts
}

/// A file that holds a module's tests (`tests.rs`, `<module>_tests.rs`): compiled for tests
/// only, and no part of the house's imports.
fn is_test_file(file: &Utf8Path) -> bool {
    file.file_stem()
        .is_some_and(|stem| stem == "tests" || stem.ends_with("_tests"))
}

/// The code of a file as one string, comments and its `#[cfg(test)] mod tests` left out.
fn code_of(text: &str) -> String {
    let code: Vec<&str> = text
        .lines()
        .map(|line| line.split("//").next().unwrap_or(""))
        .collect();
    let code = code.join("\n");
    match code.find("#[cfg(test)]\nmod tests") {
        Some(at) => code[..at].to_owned(),
        None => code,
    }
}

/// A `use` tree (`a::{b, c::{d, e}}`, whitespace removed) as the paths it names.
fn expand_use(tree: &str) -> Vec<String> {
    let Some(open) = tree.find('{') else {
        return vec![tree.to_owned()];
    };
    let (prefix, inner) = (&tree[..open], &tree[open + 1..tree.len() - 1]);
    let (mut paths, mut depth, mut start) = (Vec::new(), 0, 0);
    for (at, c) in inner.char_indices().chain([(inner.len(), ',')]) {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                if at > start {
                    for path in expand_use(&inner[start..at]) {
                        paths.push(format!("{prefix}{path}"));
                    }
                }
                start = at + 1;
            }
            _ => {}
        }
    }
    paths
}

/// The paths a file's code names: its `use` trees expanded, and every path in its code that
/// starts at `crate`, `super`, `self` or a module the file declares.
fn named_paths(module: &[String], code: &str, modules: &BTreeSet<Vec<String>>) -> Vec<String> {
    let mut paths = Vec::new();
    for statement in code.split(';') {
        let statement: String = statement.split_whitespace().collect::<Vec<_>>().join(" ");
        let tree = statement
            .rsplit_once("use ")
            .filter(|(before, _)| {
                before.is_empty() || before.ends_with("pub ") || before.ends_with(") ")
            })
            .map(|(_, tree)| tree.replace(' ', ""));
        if let Some(tree) = tree {
            paths.extend(expand_use(&tree));
        }
    }
    let is_path_char = |c: char| c.is_alphanumeric() || c == '_' || c == ':';
    for word in code.split(|c: char| !is_path_char(c)) {
        let Some((first, _)) = word.split_once("::") else {
            continue;
        };
        let mut child = module.to_vec();
        child.push(first.to_owned());
        if ["crate", "super", "self"].contains(&first) || modules.contains(&child) {
            paths.push(word.to_owned());
        }
    }
    paths
}

/// The module a path from `module` names: the deepest module of the crate it goes through.
fn resolve(module: &[String], path: &str, modules: &BTreeSet<Vec<String>>) -> Vec<String> {
    let mut segments = path
        .split("::")
        .filter(|segment| !segment.is_empty())
        .peekable();
    let mut at: Vec<String> = match segments.peek() {
        Some(&"crate") => {
            segments.next();
            Vec::new()
        }
        Some(&"super" | &"self") => module.to_vec(),
        _ => module.to_vec(),
    };
    while let Some(&segment) = segments.peek() {
        match segment {
            "super" => drop(at.pop()),
            "self" => {}
            _ => break,
        }
        segments.next();
    }
    for segment in segments {
        let mut next = at.clone();
        next.push(segment.to_owned());
        if !modules.contains(&next) {
            break;
        }
        at = next;
    }
    at
}

/// crew-live's import graph, file by file: each file's module, and the modules it uses with
/// the first path that names each.
fn crew_live_imports() -> BTreeMap<Vec<String>, BTreeMap<Vec<String>, String>> {
    let src = root().join("crates/crew-live/src");
    let files: Vec<_> = sources(&src)
        .into_iter()
        .filter(|(file, _)| !is_test_file(file))
        .collect();
    let modules: BTreeSet<Vec<String>> = files.iter().map(|(file, _)| module_of(file)).collect();
    let mut graph = BTreeMap::new();
    for (file, text) in &files {
        let module = module_of(file);
        let mut edges = BTreeMap::new();
        for path in named_paths(&module, &code_of(text), &modules) {
            let target = resolve(&module, &path, &modules);
            if target != module {
                edges.entry(target).or_insert(path);
            }
        }
        graph.insert(module, edges);
    }
    graph
}

fn shown(module: &[String]) -> String {
    match module.is_empty() {
        true => "lib.rs".to_owned(),
        false => module.join("::"),
    }
}

/// The rank of a module's room, if it is in one.
fn rank(module: &[String]) -> Option<usize> {
    let room = module.first()?;
    ROOMS.iter().position(|name| name == room)
}

#[test]
fn crew_live_declares_its_three_rooms_and_nothing_else() {
    let lib = std::fs::read_to_string(root().join("crates/crew-live/src/lib.rs")).unwrap();
    let declared: Vec<&str> = code_lines(&lib)
        .map(|(_, line)| line)
        .filter(|line| line.starts_with("mod ") || line.starts_with("pub mod "))
        .collect();
    assert_eq!(
        declared,
        ["pub mod agent;", "pub mod control;", "pub mod project;"],
        "crew-live's lib.rs declares the three rooms and nothing else"
    );
}

#[test]
fn no_module_of_crew_live_uses_a_room_above_its_own() {
    let mut upward = Vec::new();
    for (module, edges) in crew_live_imports() {
        for (target, path) in edges {
            if let (Some(own), Some(named)) = (rank(&module), rank(&target))
                && named > own
            {
                upward.push(format!(
                    "{} uses {}: {path}",
                    shown(&module),
                    shown(&target)
                ));
            }
        }
    }
    assert!(
        upward.is_empty(),
        "a lower room uses a higher one (move the type it needs down, or invert the call):\n{}",
        upward.join("\n")
    );
}

#[test]
fn no_circle_of_imports_between_crew_live_s_files() {
    let graph = crew_live_imports();
    // A file is in a circle when a file it uses leads back to it.
    let mut circles = Vec::new();
    for (module, edges) in &graph {
        for (target, path) in edges {
            let mut seen = BTreeSet::from([target.clone()]);
            let mut pending = vec![(target.clone(), vec![shown(target)])];
            while let Some((at, trail)) = pending.pop() {
                if at == *module {
                    circles.push(format!(
                        "{} ({path}) -> {}",
                        shown(module),
                        trail.join(" -> ")
                    ));
                    break;
                }
                for next in graph.get(&at).into_iter().flat_map(BTreeMap::keys) {
                    if seen.insert(next.clone()) {
                        let mut trail = trail.clone();
                        trail.push(shown(next));
                        pending.push((next.clone(), trail));
                    }
                }
            }
        }
    }
    assert!(
        circles.is_empty(),
        "files of crew-live that use one another in a circle (a room's mod.rs declares and \
         re-exports; its files name the file that defines what they use):\n{}",
        circles.join("\n")
    );
}

/// A split file lists what it uses, so a reader sees its room from its first lines: no
/// `use super::*;` outside a test module, in any crate.
#[test]
fn every_file_lists_its_imports() {
    let mut globbed = Vec::new();
    for entry in root().join("crates").read_dir_utf8().unwrap() {
        let entry = entry.unwrap();
        if !entry.path().is_dir() {
            continue;
        }
        for (file, text) in sources(&entry.path().join("src")) {
            if !is_test_file(&file)
                && code_of(&text)
                    .lines()
                    .any(|line| line.trim() == "use super::*;")
            {
                globbed.push(format!("{}/src/{file}", entry.file_name()));
            }
        }
    }
    assert!(
        globbed.is_empty(),
        "files that import their parent whole (name what they use):\n{}",
        globbed.join("\n")
    );
}

/// A result dropped says why: every `let _ =` in crew's code (tests aside) has a comment on
/// its line or the line above.
#[test]
fn every_dropped_result_says_why() {
    let mut silent = Vec::new();
    for entry in root().join("crates").read_dir_utf8().unwrap() {
        let entry = entry.unwrap();
        if !entry.path().is_dir() {
            continue;
        }
        for (file, text) in sources(&entry.path().join("src")) {
            if is_test_file(&file) {
                continue;
            }
            let text = match text.find("#[cfg(test)]\nmod tests") {
                Some(at) => &text[..at],
                None => &text[..],
            };
            let lines: Vec<&str> = text.lines().collect();
            for (index, line) in lines.iter().enumerate() {
                let said = line.contains("//")
                    || index
                        .checked_sub(1)
                        .is_some_and(|above| lines[above].trim_start().starts_with("//"));
                if line.contains("let _ =") && !said {
                    silent.push(format!(
                        "{}/src/{file}:{}: {}",
                        entry.file_name(),
                        index + 1,
                        line.trim()
                    ));
                }
            }
        }
    }
    assert!(
        silent.is_empty(),
        "results dropped without a word (say why above, or handle them):\n{}",
        silent.join("\n")
    );
}

/// No file a reader must hold in their head whole is over 800 lines, tests included: a file
/// that grows past it is split by what it holds (tests go to a sibling file).
#[test]
fn no_file_is_over_800_lines() {
    let mut long = Vec::new();
    let mut dirs = vec![root().join("tests")];
    for entry in root().join("crates").read_dir_utf8().unwrap() {
        dirs.push(entry.unwrap().into_path());
    }
    for dir in dirs {
        for (file, text) in sources(&dir) {
            if file
                .components()
                .any(|part| part.as_str() == "node_modules")
            {
                continue;
            }
            let lines = text.lines().count();
            if lines > 800 {
                long.push(format!("{}: {lines} lines", dir.join(&file)));
            }
        }
    }
    assert!(
        long.is_empty(),
        "files over 800 lines:\n{}",
        long.join("\n")
    );
}

#[test]
fn unsafe_code_lives_in_crew_sandbox_alone() {
    let crates = root().join("crates");
    let mut found = Vec::new();
    for entry in crates.read_dir_utf8().unwrap() {
        let entry = entry.unwrap();
        if entry.file_name() == "crew-sandbox" || !entry.path().is_dir() {
            continue;
        }
        for (file, text) in sources(&entry.path().join("src")) {
            for (number, line) in code_lines(&text) {
                let words = line.split(|c: char| !(c.is_alphanumeric() || c == '_'));
                if words.clone().any(|word| word == "unsafe") {
                    found.push(format!("{}/src/{file}:{number}: {line}", entry.file_name()));
                }
            }
        }
        // And the compiler holds every other crate to it.
        let lib = entry.path().join("src/lib.rs");
        if lib.exists() {
            let text = std::fs::read_to_string(&lib).unwrap();
            assert!(
                text.contains("#![forbid(unsafe_code)]"),
                "{lib} does not forbid unsafe code"
            );
        }
    }
    assert!(
        found.is_empty(),
        "unsafe code outside crew-sandbox:\n{}",
        found.join("\n")
    );
}

#[test]
fn crew_kube_does_not_build_on_crew_cli() {
    let manifest = std::fs::read_to_string(root().join("crates/crew-kube/Cargo.toml")).unwrap();
    assert!(
        !manifest.contains("crew-cli"),
        "crew-kube's Cargo.toml names crew-cli: {manifest}"
    );
}
