//! Resource stacks described by a string, such as
//! `limit(stats(pool(sim, initial=1GiB, max=4GiB)), 2GiB)`: the parser and
//! the builder (feature `alloc`).
//!
//! [`parse()`] turns the text into a tree of [`Call`]s (a name, positional
//! arguments, `key=value` arguments); a [`StackBuilder`] turns the tree
//! into resources, through a constructor registered for each name. Every
//! error names the byte position it is about. A built stack
//! ([`Built`]) hands back the typed resources of its names, and the layers
//! that keep freed memory ([`ReleaseLayers`]; [`Release`] lists them), to
//! give that memory back (PyTorch's `empty_cache`).
//!
//! # Grammar
//!
//! ```text
//!  stack  := call
//!  call   := name [ '(' [ arg { ',' arg } ] ')' ]
//!  arg    := [ key '=' ] value
//!  value  := call | word
//!  name, key := [A-Za-z_][A-Za-z0-9_-]*
//!  word   := any run of characters other than  , ( ) =  and white space
//! ```
//!
//! White space between tokens is ignored: Unicode's, as [`char::is_whitespace`]
//! and [`str::trim`] take it (a no-break space too); error positions are
//! bytes of the text. A value that is a bare name
//! (`pool(sim)`) is a call with no arguments; any other word (`2GiB`,
//! `/tmp/x.csv`) is text, read as a size by [`Value::size`] (suffixes in
//! any case, [`parse_size`]: `B`; `K`/`KiB`, `M`/`MiB`, `G`/`GiB`,
//! `T`/`TiB`, powers of 1024; `KB`, `MB`, `GB`, `TB`, powers of 1000;
//! digits grouped by underscores between them, `1_000`).
//!
//! # Examples
//!
//! ```
//! use memres_core::stack::parse;
//! let call = parse("limit(stats(pool(sim, initial=1GiB)), 2GiB)")?;
//! assert_eq!(call.name, "limit");
//! let pool = call.resource(0)?.resource(0)?;
//! assert_eq!(pool.size_arg("initial")?, Some(1 << 30));
//! assert_eq!(call.positional(1).unwrap().size()?, 2 << 30);
//! # Ok::<(), memres_core::stack::StackError>(())
//! ```
//!
//! # The names
//!
//! [`StackBuilder::new`] knows the core's resources and adaptors but
//! `stream`, which [`StackBuilder::register_stream_layer`] adds for stream
//! types that clone; backends register their leaves, and any resource
//! joins with one [`StackBuilder::register`] call.
//!
//! | name | arguments | resource |
//! | --- | --- | --- |
//! | `pool` | `upstream, initial=, max=, growth=double\|default\|N, granule=, release=true\|false\|peak, large=SIZE\|none, per_stream=true\|false` | [`CoalescingPool`](crate::pool::CoalescingPool) behind [`Shared`](crate::Shared) (`N`: grow by 1/N of the pool in steps of `granule=`, default 32 MiB; `release=`: give wholly free chunks back before growing, default true, `peak`: only past the peak in use; `large=`: requests of at least this size get chunks of their own, default none); with `per_stream=true` a [`PerStreamPool`](crate::per_stream::PerStreamPool) of such pools behind `Shared`, one per stream, stream-ordered (no `max=`: limit the upstream; `initial=` is the build stream's pool) |
//! | `fixed` | `upstream, size` (or `size=`, default 1 MiB), `blocks=` (per chunk, default 128, at most 2^20) | [`FixedSizeResource`](crate::fixed::FixedSizeResource) behind `Shared` |
//! | `binning` | `upstream, bin(SIZE), bin(SIZE, RESOURCE)..., min_bin=, max_bin=, powers=` (a bin of each power of two from `min_bin=` to `max_bin=`, default 256 KiB and 4 MiB, none when bins are given without these keys or with `powers=false`; each `bin(...)` adds one, a fixed-size bin over the upstream or one served by `RESOURCE`, and replaces the power of two of its size) | [`BinningResource`](crate::binning::BinningResource), with [`add_fixed_bin`](crate::binning::BinningResource::add_fixed_bin) and [`add_counted_bin`](crate::binning::BinningResource::add_counted_bin) |
//! | `arena` | `upstream, initial=, max=, superblock=, max_arenas=` (a superblock above 32 MiB makes the global arena's chunks, its smallest growth, that size; `max_arenas=`: slots of the table of arenas, 1 to 255, default 64) | [`ArenaResource`](crate::arena::ArenaResource) |
//! | `stats` | `upstream` | [`Statistics`](crate::adaptor::Statistics) |
//! | `track` | `upstream, backtraces=true\|false` (a backtrace of each allocation, feature `std`; default false), `report_leaks=true\|false` (whether a drop with allocations outstanding writes them to standard error; default true, `false` as RMM's) | [`Tracking`](crate::adaptor::Tracking) |
//! | `limit` | `upstream, bytes` (or `bytes=`) | [`Limiting`](crate::adaptor::Limiting) |
//! | `planned` | `upstream` | [`Planned`](crate::planned::Planned): each step laid out from the step before it (steps are marked through [`Built::get`] and [`Planned::step`](crate::planned::Planned::step)) |
//! | `align` | `upstream, alignment=, threshold=` | [`Aligned`](crate::adaptor::Aligned) |
//! | `log` | `upstream, file=` | `Logging` to a file (feature `std`), made once the whole stack is built and every log file of the stack is opened: a stack refused (another of its log files too) leaves it as it was, and does not leave one it made |
//! | `stream` | `upstream` | [`StreamOrdered`](crate::StreamOrdered) behind `Shared`, inner calls on the build stream (registered by [`StackBuilder::register_stream_layer`], for stream types that clone) |
//!
//! A resource the program made, which no string can describe (a
//! [`CallbackResource`](crate::callback::CallbackResource): its closures
//! are code), joins under a name of the program's with
//! [`StackBuilder::register_resource`].
//!
//! # The keys
//!
//! A key means the same, in the same unit, in every name that takes it
//! (the backends' leaves included). Sizes are bytes, with or without a
//! unit (`4096`, `64KiB`, `1GiB`).
//!
//! | key | names | meaning |
//! | --- | --- | --- |
//! | `initial=` | `pool`, `arena`, `async` | bytes taken from upstream (or reserved) when made |
//! | `max=` | `pool`, `arena` | the most bytes ever held from upstream |
//! | `granule=` | `pool`, `vpool` | the unit, a power of two in bytes, that what is taken from upstream is rounded to (the pool's growth steps; the virtual pool's pages) |
//! | `release_threshold=` | `async`, `vpool`, `vmm` | bytes of free memory kept rather than given back to the device (RMM's and CUDA's release threshold) |
//! | `reserve=` | `vpool`, `vmm` | bytes of addresses per reservation |
//! | `slack=` | `vpool`, `vmm` | thousandths of the peak in use that committed memory may exceed before it is trimmed |
//! | `handle_granules=` | `vpool`, `vmm` | memory is held in pieces of up to this many granules, each given back whole (`vmm`: its physical handles, default 32; `vpool`: default none, any granule alone) |
//! | `trim_on_commit=` | `vpool`, `vmm` | `true` (default) or `false`: whether an allocation that needs fresh granules first gives Idle ones back, so that committed memory stays within the peak in use ([`VirtualConfig::trim_on_commit`](crate::vpool::VirtualConfig::trim_on_commit)) |
//! | `per_stream=` | `pool`, `vpool`, `vmm` | `true`: a pool per stream, stream-ordered ([`PerStreamPool`](crate::per_stream::PerStreamPool)); each virtual pool maps a reservation of its own |
//! | `size=` | `fixed` | the block size in bytes |
//! | `min_bin=`, `max_bin=` | `binning` | the smallest and largest bin size in bytes (powers of two) |
//! | `powers=` | `binning` | `false`: no power-of-two bins, only the bins given (none: every size goes upstream, as RMM's binning resource made without exponents); `true`: powers of two beside the bins given |
//! | `bytes=` | `limit` | the limit on bytes in use |
//! | `capacity=` | `sim` | the device's memory in bytes |
//!
//! The others belong to one name: `growth=`, `release=`, `large=`
//! (`pool`), `blocks=` (`fixed`: blocks per chunk), `superblock=`,
//! `max_arenas=` (`arena`), `backtraces=`, `report_leaks=` (`track`), `alignment=`, `threshold=`
//! (`align`), `file=` (`log`), `large_handles=` (`vmm`), `pool=`
//! (`async`: `own`, the device's `default` pool or its `managed` one),
//! `ipc=` (`async`: the handle its memory exports as, `none`, `posix_fd`
//! or `fabric`).
//!
//! The leaves come from the backends: `sim` (a simulated device), `host`
//! (host memory) and `vpool` (a virtual pool over a simulated address
//! space) from `memres-sim`; `cuda`, `async`, `managed`, `pinned` and
//! `vmm` from `memres-cuda`, with its layer `prefetch`. [`Unbacked`] stands
//! in for a device while a stack is only checked.
//!
//! The readers of each name's arguments ([`pool_config`],
//! [`fixed_config`], [`fixed_block_size`], [`binning_exponents`], [`binning_bins`], [`arena_config`],
//! [`log_file`], [`granule_arg`], [`one_of`]) are public, so that a leaf
//! with the same keys reads them alike and code that builds the same
//! resource typed (the replay tool's fast path) gives the keys the same
//! meaning.

mod build;
mod error;
#[cfg(feature = "std")]
mod log_env;
mod names;
mod parse;
mod release;

pub use build::{Built, Constructor, Context, LeafOf, OnStream, StackBuilder};
pub use error::{StackError, StackErrorKind};
#[cfg(feature = "std")]
pub use log_env::{check_log_file, log_file_of_device, log_from_env, LOG_FILE_VAR};
pub use names::{
    arena_config, binning_bins, binning_exponents, fixed_block_size, fixed_config, granule_arg, log_file,
    one_of, pool_config, Unbacked,
};
pub use parse::{parse, parse_size, Arg, Call, Value, MAX_DEPTH};
pub use release::{Release, ReleaseLayers};

#[cfg(test)]
mod tests;
