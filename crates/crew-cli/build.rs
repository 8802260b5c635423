//! Links `crew` as a position-dependent executable: see ARCHITECTURE.md, "Start-up".

fn main() {
    // Every `crew` command pays for its relocations before `main`; position-dependent, there
    // are none to apply. Only where the platform's linker takes the flag (GNU and LLVM ones).
    println!("cargo:rerun-if-changed=build.rs");
    let target = std::env::var("TARGET").unwrap_or_default();
    if target.contains("linux") {
        println!("cargo:rustc-link-arg-bin=crew=-no-pie");
    }
}
