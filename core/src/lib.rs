//! Suballocation algorithms over abstract address ranges.
//!
//! `memres-core` is the heart of memres, a GPU memory manager in the spirit of
//! RAPIDS RMM. Every algorithm here works on *numbers*: a block is a range
//! `start..start + len` in some address space that the core never dereferences.
//! The same code therefore manages CUDA device memory, host memory, a Vulkan
//! heap or a range of integers in a fuzzer, and it is `#![no_std]` with no
//! required dependency.
//!
//! # What is inside
//!
//! | item | what it is |
//! | --- | --- |
//! | [`Range`], [`Request`], [`Block`] | an address range; a validated allocation request (size, power-of-two alignment, 256 bytes by default); what an allocation hands back |
//! | [`MemoryResource`], [`MemoryResourceMut`] | the stream-ordered resource trait (`&self`, shareable) and its `&mut self` form for plain algorithms |
//! | `Pending` (feature `std`) | a block taken from a resource and not yet handed over: freed back if the code in between panics or returns early (the logging adaptor, the containers) |
//! | [`in_destructor`] | runs user code a destructor calls; while the thread unwinds, catches its panic (and its payload's) so that the process does not abort |
//! | [`Allocate`], [`AllocateOn`] | the short path ([`shortcut`]): `allocate(size)` / `deallocate(block)` where the stream is `()`, `allocate_on(size, &stream)` where it is not |
//! | [`Stream`] | record an event, wait on an event, query an event, synchronize (the stream, or the whole device); `()` is the stream of resources for which streams mean nothing |
//! | `thread_number` (feature `std`) | a number for the calling thread, never reused and never 0: what names a per-thread stream or a lock's holder |
//! | [`Error`] | every failure as a typed value; out of memory carries its figures |
//! | [`Usage`], [`Inspect`] | one set of figures for every resource (bytes used, held from upstream, its peak, free, the largest free block) and the trait that reads them and runs the invariant checker |
//! | [`addr_map`] | [`AddrMap`](addr_map::AddrMap): what a layer keeps per live block, found by its address in a probe or two (feature `alloc`) |
//! | [`lock`] | [`RawLock`](lock::RawLock), [`SpinLock`](lock::SpinLock) and [`Shared`], which turns any `&mut self` algorithm into a `&self` resource |
//! | [`index`] | [`CoalescingIndex`](index::CoalescingIndex): the two-level segregated-fit index over bare ranges that the pools and the arena suballocate with |
//! | [`pool`] | [`CoalescingPool`](pool::CoalescingPool): O(1) allocate and free over chunks from an upstream |
//! | [`per_stream`] | [`PerStreamPool`](per_stream::PerStreamPool): a pool per stream over one upstream, as PyTorch's allocator; memory moves between streams as whole chunks, ordered by events; or a virtual pool per stream, each mapping a reservation of its own (feature `alloc`) |
//! | [`stream_ordered`] | [`StreamOrdered`]: RMM's stream-ordered layer, per-stream free lists over any stream-agnostic algorithm, with events to move blocks between streams |
//! | [`planned`] | [`Planned`](planned::Planned): lays out each step of a repeating workload from the step before it, with every lifetime known ([`placement`](planned::placement)); a steady step asks the upstream for nothing (feature `alloc`) |
//! | [`fixed`] | [`FixedSizeResource`](fixed::FixedSizeResource): blocks of one size carved from upstream chunks, O(1) allocate and free on an index stack outside the managed memory |
//! | `binning` (feature `alloc`) | `BinningResource`: routes each size to the smallest bin that holds it (fixed-size bins per power of two, bins picked from a measured size histogram, or any resource), the rest to upstream |
//! | [`arena`] | [`ArenaResource`](arena::ArenaResource): RMM's arena, a global arena of superblocks lent to per-thread and per-stream arenas, built to scale with threads (feature `alloc`) |
//! | [`callback`] | [`CallbackResource`](callback::CallbackResource): allocate and free given as two closures with a context (RMM's `callback_memory_resource`) |
//! | [`check`] | the invariant checker that tests and fuzz targets run after every step |
//! | [`copy`] | [`CopyEngine`](copy::CopyEngine): how containers move bytes to and from a backend's memory |
//! | [`vmem`] | [`ReservableSpace`](vmem::ReservableSpace): reserve an address range once, commit and decommit granules of it (CUDA virtual memory, `mmap`) |
//! | [`vpool`] | [`VirtualPool`](vpool::VirtualPool): the pool over one reserved range, physical memory mapped only where live blocks are (feature `alloc`) |
//! | [`stack`] | stacks described by a string, `stats(pool(sim, initial=1GiB))`: the parser, and the builder that turns the text into resources, with a name registered for each (backends register their leaves) (feature `alloc`) |
//! | [`snapshot`] | [`MemoryMap`](snapshot::MemoryMap): a resource's segments and blocks, as used and free runs and as a snapshot PyTorch's memory viewer opens (feature `alloc`; its file, written whole, feature `std`) |
//! | `trace` | RMM's log format: the rows the logging adaptor writes and the one reader of traces (feature `std`) |
//!
//! # Features
//!
//! - `alloc` (default): metadata in `Vec`s, forwarding impls for `Box` and `Arc`.
//! - `std`: a lock over `std::sync::Mutex`, the per-device registry, the
//!   logging adaptor and RMM's log format (`trace`), snapshot files written
//!   whole (`snapshot::write_file`).
//! - `heapless`: fixed-capacity metadata storage: no allocator at all.
//! - `critical-section`: a lock for bare-metal targets, and the atomics a
//!   target lacks built from critical sections (needed, and enough, where
//!   there is no compare-and-swap, as on `thumbv6m`, or no 64-bit atomics,
//!   as on `thumbv7m`; `alloc` needs compare-and-swap for `Arc`).
//! - `testing`: the test doubles of the `testing` module and the deliberately
//!   wrong `CrossStream::Unordered`, for tests, examples and fuzzing.
//!
//! # Example
//!
//! ```
//! use memres_core::{pool::CoalescingPool, MemoryResourceMut, Request};
//! # use memres_core::testing::BumpUpstream;
//! // Any `MemoryResource` can be the upstream; this one hands out numbers.
//! let upstream = BumpUpstream::new(1 << 30);
//! let mut pool = CoalescingPool::new(upstream);
//! let block = pool.allocate(Request::new(1000)?, &())?;
//! assert_eq!(block.addr() % 256, 0);
//! pool.deallocate(block, &())?;
//! # Ok::<(), memres_core::Error>(())
//! ```
#![no_std]
#![cfg_attr(docsrs, feature(doc_auto_cfg))]
#![warn(missing_docs)]
// The docs name what `alloc` adds (the per-stream pool, the virtual pool,
// the adaptors that count): without it those names are plain text.
#![cfg_attr(not(feature = "alloc"), allow(rustdoc::broken_intra_doc_links))]

#[cfg(feature = "alloc")]
extern crate alloc;
#[cfg(feature = "std")]
extern crate std;

mod block;
mod config;
mod error;
mod inspect;
mod plant;
mod primitive;
mod range;
mod request;
mod resource;
#[cfg(any(feature = "alloc", test, feature = "testing"))]
mod splitmix;
mod stream;

pub mod adaptor;
#[cfg(feature = "alloc")]
pub mod addr_map;
#[cfg(feature = "alloc")]
pub mod arena;
#[cfg(feature = "alloc")]
pub mod binning;
pub mod callback;
pub mod check;
pub mod chunks;
pub mod copy;
#[cfg(feature = "std")]
pub mod device;
pub mod fixed;
pub mod index;
pub mod lock;
#[cfg(feature = "alloc")]
pub mod per_stream;
#[cfg(feature = "alloc")]
pub mod planned;
pub mod pool;
pub mod shortcut;
#[cfg(feature = "alloc")]
pub mod snapshot;
#[cfg(feature = "alloc")]
pub mod stack;
pub mod storage;
#[cfg(feature = "alloc")]
pub mod stream_ordered;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
#[cfg(feature = "std")]
pub mod trace;
pub mod vmem;
#[cfg(feature = "alloc")]
pub mod vpool;

#[cfg(feature = "alloc")]
pub use adaptor::DynResource;
pub use block::Block;
pub use error::{Bytes, Error, Result};
pub use inspect::{Inspect, Usage};
pub use lock::Shared;
pub use range::Range;
pub use request::Request;
#[cfg(feature = "std")]
pub use resource::Pending;
pub use resource::{in_destructor, MemoryResource, MemoryResourceMut, ResourceId};
pub use shortcut::{Allocate, AllocateOn};
#[cfg(feature = "std")]
pub use stream::thread_number;
pub use stream::Stream;
#[cfg(feature = "alloc")]
pub use stream_ordered::StreamOrdered;

/// The alignment every resource guarantees unless asked for more: 256 bytes,
/// as RMM and the CUDA allocators.
pub const DEFAULT_ALIGNMENT: u64 = 256;
