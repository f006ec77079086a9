//! Benchmarks and the memres command-line tool.
//!
//! - [`workload`]: allocation sequences (generated as RMM's replay harness
//!   does, or read from RMM log traces), decoded once into flat op lists.
//! - [`replay`]: the engine that drives one resource through a workload and
//!   measures ns per op, peak live bytes and peak upstream bytes.
//! - [`resources`]: the resources compared and the registry naming them.
//! - [`report`]: the rows the tool prints, as a table or JSON lines.

pub mod replay;
pub mod report;
pub mod resources;
pub mod workload;
