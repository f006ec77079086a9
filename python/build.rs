//! Records the commit the package is built from (`memres.__git_commit__`,
//! RMM's `rmm.__git_commit__`): empty when not built from a git checkout.

use std::process::Command;

fn main() {
    let commit = Command::new("git")
        .args(["rev-parse", "HEAD"])
        .output()
        .ok()
        .filter(|out| out.status.success())
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    println!("cargo:rustc-env=MEMRES_GIT_COMMIT={commit}");
    // A new commit changes HEAD or the branch it names.
    if let Ok(out) = Command::new("git").args(["rev-parse", "--git-dir"]).output() {
        let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if out.status.success() && !dir.is_empty() {
            println!("cargo:rerun-if-changed={dir}/HEAD");
            println!("cargo:rerun-if-changed={dir}/refs/heads");
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
}
