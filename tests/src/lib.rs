//! Cross-crate integration tests, and the fuzz harness shared by the `fuzz/`
//! targets and the corpus replay (`tests/corpus.rs`).

pub mod fuzz;
