//! The house keeps its shape (ARCHITECTURE.md, "Crates" and "Rooms"): crew-live is three rooms
//! whose imports point one way; `unsafe` code lives in crew-sandbox alone; crew-kube does not
//! build on crew-cli. Read from the sources, as a
//! reviewer would, so that a change that breaks the shape fails here.

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

/// The module a file of crew-live is part of, as a unit of the import graph: `room` for a
/// room's own `mod.rs`, `room::module` for a module of a room (a file, or a folder whose files
/// are one unit).
fn unit_of(file: &Utf8Path) -> Option<String> {
    let parts: Vec<&str> = file.components().map(|part| part.as_str()).collect();
    match parts.as_slice() {
        [room, "mod.rs"] => Some((*room).to_owned()),
        [room, module] => Some(format!("{room}::{}", module.trim_end_matches(".rs"))),
        [room, module, ..] => Some(format!("{room}::{module}")),
        _ => None,
    }
}

/// The units a line names: `crate::room::module` (that module), `crate::room::Item` (the
/// room's own module), and `super::` from a room's direct file (its room).
fn named_units(file: &Utf8Path, line: &str) -> Vec<String> {
    let mut named = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        let path: Vec<&str> = rest
            .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
            .next()
            .unwrap_or("")
            .split("::")
            .collect();
        if let [room, next, ..] = path.as_slice()
            && ROOMS.contains(room)
        {
            let is_module = next.chars().next().is_some_and(char::is_lowercase)
                && crate_module_exists(room, next);
            named.push(match is_module {
                true => format!("{room}::{next}"),
                false => (*room).to_owned(),
            });
        } else if let [room] = path.as_slice()
            && ROOMS.contains(room)
        {
            named.push((*room).to_owned());
        }
    }
    let depth = file.components().count();
    if depth == 2 && file.file_name() != Some("mod.rs") && line.contains("super::") {
        named.push(file.components().next().unwrap().as_str().to_owned());
    }
    named
}

fn crate_module_exists(room: &str, module: &str) -> bool {
    let src = root().join("crates/crew-live/src").join(room);
    src.join(format!("{module}.rs")).exists() || src.join(module).join("mod.rs").exists()
}

/// The rank of a unit's room.
fn rank(unit: &str) -> usize {
    let room = unit.split("::").next().unwrap();
    ROOMS.iter().position(|name| *name == room).unwrap()
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
    let src = root().join("crates/crew-live/src");
    let mut upward = Vec::new();
    for (file, text) in sources(&src) {
        let Some(unit) = unit_of(&file) else { continue };
        for (number, line) in code_lines(&text) {
            for named in named_units(&file, line) {
                if rank(&named) > rank(&unit) {
                    upward.push(format!("{file}:{number}: {unit} uses {named}: {line}"));
                }
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
