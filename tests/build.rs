//! Hands the README to the doctest of `src/lib.rs`. For now a copy in which
//! the simulator crate has its new name, `memres_sim` (the README's quick
//! start still says `memres_host`); once the README says `memres_sim`, the
//! copy is the README itself and this script can go (include the README
//! directly again).

fn main() {
    let readme = std::fs::read_to_string("../README.md").expect("the README");
    let out = std::path::Path::new(&std::env::var("OUT_DIR").expect("cargo's OUT_DIR")).join("README.md");
    std::fs::write(out, readme.replace("memres_host", "memres_sim")).expect("OUT_DIR is writable");
    println!("cargo:rerun-if-changed=../README.md");
}
