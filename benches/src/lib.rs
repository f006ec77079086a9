//! Benchmarks and the memres command-line tool.

pub mod workload;
