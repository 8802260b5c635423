//! Reproducible synthetic repositories and `node_modules` trees, for the benchmarks.
//!
//! The repository is written with `git fast-import` (history in seconds, not minutes), then
//! checked out. The same parameters and seed always give the same repository.

use std::io::Write;
use std::process::{Command, Stdio};

use camino::Utf8Path;

/// The shape of a synthetic repository.
#[derive(Debug, Clone, Copy)]
pub struct RepoSpec {
    pub files: usize,
    pub dirs: usize,
    /// Average file size in bytes; sizes vary from a tenth to twice this.
    pub average_size: usize,
    /// Commits in the history; each after the first changes `files_per_commit` files.
    pub commits: usize,
    pub files_per_commit: usize,
    pub seed: u64,
}

impl RepoSpec {
    /// ~20,000 files in ~2,000 directories, ~250 MB, 310 commits: the reference repository.
    pub fn reference() -> Self {
        RepoSpec {
            files: 20_000,
            dirs: 2_000,
            average_size: 12_500,
            commits: 310,
            files_per_commit: 10,
            seed: 7,
        }
    }

    /// 100,000 files in 10,000 directories, ~250 MB, 110 commits: a large monorepo's
    /// checkout, for `-- --large`.
    pub fn large() -> Self {
        RepoSpec {
            files: 100_000,
            dirs: 10_000,
            average_size: 2_500,
            commits: 110,
            ..Self::reference()
        }
    }

    /// A tenth of the reference, for quick runs.
    pub fn quick() -> Self {
        RepoSpec {
            files: 2_000,
            dirs: 200,
            commits: 31,
            ..Self::reference()
        }
    }
}

/// A small deterministic generator (xorshift64*): benchmarks must not depend on a crate's
/// idea of randomness changing between versions.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, bound: usize) -> usize {
        (self.next_u64() % bound.max(1) as u64) as usize
    }
}

const KEYWORDS: &[&str] = &[
    "fn", "let", "mut", "match", "struct", "impl", "return", "self", "pub", "use", "if", "else",
];

/// Source-like text of about `size` bytes. Like real code, it compresses well within a file
/// (keywords, indentation, a file's own identifiers) but files do not resemble each other, so
/// the pack holds mostly whole objects, as a real repository's does.
fn contents(rng: &mut Rng, size: usize) -> Vec<u8> {
    let identifiers: Vec<String> = (0..24)
        .map(|_| {
            (0..(4 + rng.below(9)))
                .map(|_| char::from(b'a' + rng.below(26) as u8))
                .collect()
        })
        .collect();
    let mut out = Vec::with_capacity(size + 64);
    while out.len() < size {
        let indent = rng.below(4) * 4;
        out.extend(std::iter::repeat_n(b' ', indent));
        for _ in 0..(3 + rng.below(8)) {
            if rng.below(3) == 0 {
                out.extend_from_slice(KEYWORDS[rng.below(KEYWORDS.len())].as_bytes());
            } else {
                out.extend_from_slice(identifiers[rng.below(identifiers.len())].as_bytes());
            }
            out.push(b' ');
        }
        out.extend_from_slice(format!("{};\n", rng.next_u64() % 100_000).as_bytes());
    }
    out
}

/// The path of file `index` of the spec.
fn file_path(spec: &RepoSpec, index: usize) -> String {
    let dir = index % spec.dirs.max(1);
    format!("src/m{:02}/d{dir:04}/file{index:05}.rs", dir % 50)
}

/// Creates the repository at `dir` (which must be empty or absent) and checks it out on `main`.
pub fn generate_repository(dir: &Utf8Path, spec: &RepoSpec) {
    std::fs::create_dir_all(dir).unwrap();
    run_git(dir, &["init", "-q", "-b", "main"]);
    let mut import = Command::new("git")
        .args(["fast-import", "--quiet", "--done"])
        .current_dir(dir)
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stream = std::io::BufWriter::new(import.stdin.take().unwrap());
    let mut rng = Rng::new(spec.seed);
    let mut mark = 0usize;
    let mut blob = |stream: &mut std::io::BufWriter<std::process::ChildStdin>, rng: &mut Rng| {
        mark += 1;
        let size = spec.average_size / 10 + rng.below(spec.average_size * 19 / 10);
        let data = contents(rng, size);
        write!(stream, "blob\nmark :{mark}\ndata {}\n", data.len()).unwrap();
        stream.write_all(&data).unwrap();
        stream.write_all(b"\n").unwrap();
        mark
    };
    let mut marks: Vec<usize> = (0..spec.files)
        .map(|_| blob(&mut stream, &mut rng))
        .collect();
    let readme = blob(&mut stream, &mut rng);
    for commit in 0..spec.commits.max(1) {
        let changed: Vec<usize> = if commit == 0 {
            (0..spec.files).collect()
        } else {
            (0..spec.files_per_commit)
                .map(|_| rng.below(spec.files))
                .collect()
        };
        if commit > 0 {
            for &index in &changed {
                marks[index] = blob(&mut stream, &mut rng);
            }
        }
        let message = format!("commit {commit}");
        write!(
            stream,
            "commit refs/heads/main\ncommitter bench <bench@localhost> {} +0000\ndata {}\n{message}\n",
            1_700_000_000 + commit * 60,
            message.len()
        )
        .unwrap();
        if commit == 0 {
            writeln!(stream, "M 100644 :{readme} README.md").unwrap();
        }
        for index in changed {
            writeln!(
                stream,
                "M 100644 :{} {}",
                marks[index],
                file_path(spec, index)
            )
            .unwrap();
        }
        stream.write_all(b"\n").unwrap();
    }
    stream.write_all(b"done\n").unwrap();
    drop(stream);
    assert!(import.wait().unwrap().success(), "git fast-import failed");
    run_git(
        dir,
        &["-c", "checkout.workers=0", "reset", "-q", "--hard", "main"],
    );
}

/// A `node_modules` directory with `files` small files in packages of 20.
pub fn generate_node_modules(dir: &Utf8Path, files: usize) {
    for index in 0..files {
        let path = dir.join(format!("pkg{:05}/lib/file{index}.js", index / 20));
        if index % 20 == 0 {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        }
        std::fs::write(&path, format!("module.exports = {index};\n")).unwrap();
    }
}

fn run_git(dir: &Utf8Path, args: &[&str]) {
    let status = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_SYSTEM", "/dev/null")
        .status()
        .unwrap();
    assert!(status.success(), "git {args:?} failed in {dir}");
}

/// A Cargo workspace of `crates` library crates shaped as applications usually are: a core
/// crate, libraries that each depend on it, and an application crate (the last) that depends on
/// them all; each of `modules` modules of `functions` small generic functions and a
/// trait implementation, committed on `main` with `target/` ignored: something whose first
/// `cargo check` takes a while and whose later ones redo only what changed. No dependency from
/// a registry: it builds offline.
pub fn generate_cargo_workspace(dir: &Utf8Path, crates: usize, modules: usize, functions: usize) {
    std::fs::create_dir_all(dir).unwrap();
    let members: Vec<String> = (0..crates)
        .map(|index| format!("\"crate{index}\""))
        .collect();
    std::fs::write(
        dir.join("Cargo.toml"),
        format!(
            "[workspace]\nresolver = \"2\"\nmembers = [{}]\n",
            members.join(", ")
        ),
    )
    .unwrap();
    std::fs::write(dir.join(".gitignore"), "/target\n").unwrap();
    for index in 0..crates {
        let root = dir.join(format!("crate{index}"));
        std::fs::create_dir_all(root.join("src")).unwrap();
        let dependency_on =
            |other: usize| format!("crate{other} = {{ path = \"../crate{other}\" }}\n");
        let dependency = match index {
            0 => String::new(),
            last if last + 1 == crates => (0..last).map(dependency_on).collect(),
            _ => dependency_on(0),
        };
        std::fs::write(
            root.join("Cargo.toml"),
            format!(
                "[package]\nname = \"crate{index}\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[dependencies]\n{dependency}"
            ),
        )
        .unwrap();
        let mut lib = String::new();
        for module in 0..modules {
            lib.push_str(&format!("pub mod m{module};\n"));
            let mut code = String::from("use std::collections::HashMap;\n\n");
            if index > 0 {
                code.push_str(&format!("pub use crate0::m{module}::Shape as Base;\n\n"));
            }
            code.push_str(
                "pub trait Shape {\n    fn area(&self) -> f64;\n    fn name(&self) -> String;\n}\n\n",
            );
            for function in 0..functions {
                code.push_str(&format!(
                    "#[derive(Debug, Clone, PartialEq)]\npub struct S{function} {{ pub w: f64, pub h: f64, pub tags: Vec<String> }}\n\n\
impl Shape for S{function} {{\n    fn area(&self) -> f64 {{ self.w * self.h + {function}.0 }}\n    fn name(&self) -> String {{ format!(\"s{function}-{{}}\", self.tags.join(\",\")) }}\n}}\n\n\
pub fn f{function}<T: Clone + std::fmt::Debug>(items: &[T], key: &str) -> HashMap<String, Vec<T>> {{\n    let mut map = HashMap::new();\n    for (at, item) in items.iter().enumerate() {{\n        map.entry(format!(\"{{key}}-{{}}\", at % {m})).or_insert_with(Vec::new).push(item.clone());\n    }}\n    map\n}}\n\n",
                    m = function + 2
                ));
            }
            std::fs::write(root.join(format!("src/m{module}.rs")), code).unwrap();
        }
        std::fs::write(root.join("src/lib.rs"), lib).unwrap();
    }
    run_git(dir, &["init", "-q", "-b", "main"]);
    run_git(dir, &["add", "-A"]);
    run_git(
        dir,
        &[
            "-c",
            "user.name=bench",
            "-c",
            "user.email=bench@example.com",
            "commit",
            "-q",
            "-m",
            "a cargo workspace",
        ],
    );
}
