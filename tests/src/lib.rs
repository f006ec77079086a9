//! Cross-crate integration tests, and the fuzz harness shared by the `fuzz/`
//! targets and the corpus replay (`tests/corpus.rs`).

pub mod fuzz;

/// The README's Rust blocks, compiled and run as doctests by `cargo test`
/// (this crate depends on the core and the simulator, which they use).
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
