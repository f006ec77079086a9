//! Benchmarks and the memres command-line tool.
//!
//! - [`workload`]: allocation sequences (generated as RMM's replay harness
//!   does, or read from RMM log traces), decoded once into flat op lists.
//! - [`family`]: the traces of `benches/data/` that `memres replay` runs
//!   by default, and which of them are held out from tuning.
//! - [`replay`]: the engine that drives one resource through a workload and
//!   measures ns per op, peak live bytes and peak upstream bytes.
//! - [`resources`]: the names `--resource` knows: aliases of stack strings,
//!   the peers and the plain CUDA rows.
//! - [`stack`]: replays through a stack built from its text by the core's
//!   builder, or typed for the shapes of [`typed`] (the fast path).
//! - [`peers`]: the allocators memres is compared with.
//! - [`offline`]: offline placement, knowing every lifetime: the reference
//!   for what a placement that never moves a block can reach.
//! - `cuda` (feature `cuda`): the CUDA upstreams and plain CUDA resources.
//! - [`report`]: the rows the tool prints, as a table, JSON lines or CSV.
//! - [`paths`]: the files a replay reads and writes, checked before it runs.
//! - [`names`]: the stack names and keys as `memres stacks` lists them.
//! - [`observe`]: an untimed replay that watches memory, and [`watch`]: what
//!   it writes, the [`timeline`], snapshots and the [`map`].
//!
//! # Example
//!
//! ```
//! use memres_bench::resources::{find, RunOptions};
//! use memres_bench::workload::Workload;
//! let w = Workload::load("random:1000:65536:42")?;
//! assert_eq!(w.ops.len(), 2000);
//! let pool = find("pool")?;
//! let m = pool.run(&w, &RunOptions::default(), &mut |_ops| {})?;
//! assert_eq!(m.peak_live, w.peak_live);
//! assert!(m.footprint().unwrap() >= 1.0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#[cfg(feature = "cuda")]
pub mod cuda;
pub mod family;
pub mod map;
pub mod names;
pub mod observe;
pub mod offline;
pub mod paths;
pub mod peers;
pub mod replay;
pub mod report;
pub mod resources;
pub mod stack;
pub mod timeline;
pub mod typed;
pub mod watch;
pub mod workload;
