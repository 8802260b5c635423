//! How `crew` is linked: see ARCHITECTURE.md, "Start-up".

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let target = std::env::var("TARGET").unwrap_or_default();
    if !target.contains("linux") {
        return;
    }
    // Every `crew` command pays for its relocations before `main`; position-dependent, there
    // are none to apply. Only where the platform's linker takes the flag (GNU and LLVM ones).
    println!("cargo:rustc-link-arg-bin=crew=-no-pie");
    // The unwinder linked in, as `-static-libgcc` links it for C++: the loader then maps no
    // `libgcc_s`, whose start asks the CPU its features (`cpuid`, slow under a hypervisor).
    // Only where the C compiler has the archive; elsewhere `libgcc_s` is loaded as before.
    if target.ends_with("-gnu")
        && let Some(archive) = compiler_file("libgcc_eh.a")
    {
        println!("cargo:rustc-link-arg-bin=crew=-Wl,--whole-archive,{archive},--no-whole-archive");
    }
}

/// The path of `name` in the C compiler's own libraries, when it has it.
fn compiler_file(name: &str) -> Option<String> {
    let compiler = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    let output = std::process::Command::new(compiler)
        .arg(format!("-print-file-name={name}"))
        .output()
        .ok()?;
    let path = String::from_utf8(output.stdout).ok()?.trim().to_owned();
    // A compiler without the file prints its bare name back.
    let found = std::path::Path::new(&path);
    (output.status.success() && found.is_absolute() && found.exists()).then_some(path)
}
