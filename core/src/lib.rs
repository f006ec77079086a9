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
//! | [`Stream`] | record an event, wait on an event, query an event; `()` is the stream of resources for which streams mean nothing |
//! | [`Error`] | every failure as a typed value; out of memory carries its figures |
//! | [`lock`] | [`RawLock`](lock::RawLock), [`SpinLock`](lock::SpinLock) and [`Shared`], which turns any `&mut self` algorithm into a `&self` resource |
//! | [`pool`] | [`CoalescingPool`](pool::CoalescingPool): O(1) allocate and free over chunks from an upstream, and [`CoalescingIndex`](pool::CoalescingIndex), its two-level segregated-fit index over bare ranges |
//! | [`arena`] | [`ArenaResource`](arena::ArenaResource): RMM's arena, a global arena of superblocks lent to per-thread and per-stream arenas, built to scale with threads (feature `alloc`) |
//! | [`check`] | the invariant checker that tests and fuzz targets run after every step |
//!
//! # Features
//!
//! - `alloc` (default): metadata in `Vec`s, forwarding impls for `Box` and `Arc`.
//! - `std`: a lock over `std::sync::Mutex`.
//! - `heapless`: fixed-capacity metadata storage: no allocator at all.
//! - `critical-section`: a lock for bare-metal targets.
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

#[cfg(feature = "alloc")]
extern crate alloc;
#[cfg(feature = "std")]
extern crate std;

mod block;
mod error;
mod primitive;
mod range;
mod request;
mod resource;
mod stream;

#[cfg(feature = "alloc")]
pub mod arena;
pub mod check;
pub mod lock;
pub mod pool;
pub mod storage;
pub mod testing;

pub use block::Block;
pub use error::{Error, Result};
pub use lock::Shared;
pub use range::Range;
pub use request::Request;
pub use resource::{MemoryResource, MemoryResourceMut};
pub use stream::Stream;

/// The alignment every resource guarantees unless asked for more: 256 bytes,
/// as RMM and the CUDA allocators.
pub const DEFAULT_ALIGNMENT: u64 = 256;
