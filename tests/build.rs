//! The Kubernetes test runs where a cluster is named (`KUBECONFIG` set when the tests are
//! built); elsewhere it is compiled as ignored, so that it is reported as ignored, never as
//! passed.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(crew_kube_cluster)");
    println!("cargo::rerun-if-env-changed=KUBECONFIG");
    if std::env::var_os("KUBECONFIG").is_some_and(|value| !value.is_empty()) {
        println!("cargo::rustc-cfg=crew_kube_cluster");
    }
}
