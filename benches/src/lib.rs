//! Benchmarks and the memres command-line tool.
