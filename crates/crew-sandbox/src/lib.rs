//! crew-sandbox: starting one process confined by the kernel and keeping it so.
//!
//! An agent is a program with a shell, driven by a model that can be wrong or manipulated: every
//! promise crew makes holds against it. This crate is where the kernel is asked to hold them, one
//! module a mechanism — [`spawn`] (the warden that starts and outlives each agent, and its
//! server), [`sandbox`] (Landlock, the namespaces, seccomp, capabilities, private terminals and
//! IPC, hidden sockets), [`proxy`] (the network proxy of `network = "proxy"`), [`lease`] (each
//! task's ports), [`procscan`], [`open_files`] and [`temp_dirs`] (what serves them) — over the
//! system calls in `sys`. It is the only crate of crew with `unsafe` code; it knows no runner,
//! agent protocol, git or state store (crew-core's value types it takes).

#![warn(missing_docs)]

#[cfg(not(target_os = "linux"))]
compile_error!(
    "crew runs on Linux only: it relies on /proc, PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER and Landlock"
);

pub mod caps;
pub mod lease;
pub mod open_files;
pub mod process;
pub mod procscan;
pub mod proxy;
pub mod sandbox;
pub mod spawn;
mod sys;
pub mod temp_dirs;
