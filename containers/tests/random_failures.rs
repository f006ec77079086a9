//! Random buffer operations over a resource, a copy engine and streams that
//! fail and panic at random, as a user's safe implementations of them may:
//! the resource refuses or panics in `allocate` and `deallocate` (a refused
//! or panicking free keeps its block live) and hands out blocks shorter than
//! asked, misaligned or larger; the engine and the streams return errors or
//! panic before they do anything. After every operation each buffer holds
//! what a `Vec<u8>` model says, one whose call failed or panicked is as it
//! was (but where its old block's free panicked in a growth: it then holds
//! the new block, the same bytes in it), and no block is freed twice; at
//! the end, every block still live is one whose free was refused: no
//! container lost one.

use memres_containers::{ContainerError, DeviceBuffer};
use memres_core::copy::{CopyEngine, MemoryOf};
use memres_core::testing::{steps, SplitMix64};
use memres_core::{Block, Error, MemoryResource, Request, Result as CoreResult, Stream};
use memres_sim::{HostCopy, HostMemory};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};

thread_local! {
    /// The faults' generator, and whether faults are on (off while the test
    /// reads the buffers back).
    static FAULTS: RefCell<(SplitMix64, bool)> = const { RefCell::new((SplitMix64::new(0xfa17), false)) };
}

/// Whether a fault happens now, one time in `n` while faults are on.
fn fault(n: u64) -> bool {
    FAULTS.with(|f| {
        let (rng, on) = &mut *f.borrow_mut();
        *on && rng.below(n) == 0
    })
}

fn faults_on(on: bool) {
    FAULTS.with(|f| f.borrow_mut().1 = on);
}

/// A backend's error, or a panic, at random; nothing touched.
fn maybe_fail(what: &'static str) -> CoreResult<()> {
    if fault(12) {
        return Err(Error::Backend { code: 1, what });
    }
    assert!(!fault(30), "{what} panics");
    Ok(())
}

/// Host memory behind a resource that breaks at random.
#[derive(Default)]
struct Faulty {
    host: HostMemory,
    /// Each block handed out and not freed, by address: the host's block
    /// it lies in, and the block as handed out.
    live: RefCell<HashMap<u64, (Block, Block)>>,
    /// Blocks whose free was refused (an error or a panic; they stay live).
    refused: RefCell<Vec<Block>>,
    /// Frees of blocks not live: freed twice, or never handed out.
    unknown: Cell<u32>,
}

impl<S: Stream + ?Sized> MemoryResource<S> for Faulty {
    fn allocate(&self, request: Request, stream: &S) -> CoreResult<Block> {
        maybe_fail("allocate")?;
        if request.is_zero() && !fault(3) {
            return Ok(Block::EMPTY);
        }
        let (size, align) = (request.size(), request.align());
        let host = |size: u64, align| self.host.allocate(Request::aligned(size.max(1), align)?, stream);
        // One block in four breaks the request: shorter than asked, 256
        // bytes past a multiple of twice the alignment (misaligned above
        // 256), or larger than asked.
        let (inner, block) = match if fault(4) { FAULTS.with(|f| f.borrow_mut().0.below(3)) } else { 3 } {
            0 => {
                let inner = host(size / 2, align)?;
                (inner, Block::new(inner.addr(), size / 2, 1))
            }
            1 => {
                let inner = host(size + 256, (2 * align).max(512))?;
                (inner, Block::new(inner.addr() + 256, size, 2))
            }
            2 => {
                let inner = host(size + 100, align)?;
                (inner, Block::new(inner.addr(), size + 100, 3))
            }
            _ => {
                let inner = host(size, align)?;
                (inner, Block::new(inner.addr(), size, 4))
            }
        };
        self.live.borrow_mut().insert(block.addr(), (inner, block));
        Ok(block)
    }

    fn deallocate(&self, block: Block, stream: &S) -> CoreResult<()> {
        if block == Block::EMPTY {
            return Ok(());
        }
        let Some(&(inner, handed)) = self.live.borrow().get(&block.addr()) else {
            self.unknown.set(self.unknown.get() + 1);
            return Err(Error::UnknownBlock { addr: block.addr() });
        };
        assert_eq!(block, handed, "a block goes back as it was handed out");
        self.refused.borrow_mut().push(block);
        maybe_fail("deallocate")?;
        self.refused.borrow_mut().retain(|b| *b != block);
        self.live.borrow_mut().remove(&block.addr());
        self.host.deallocate(inner, stream)
    }
}

// SAFETY: every block lies in one of `host`'s blocks, held until the block
// is freed through `deallocate`, and is handed to one holder at a time.
unsafe impl MemoryOf<HostCopy> for Faulty {}

/// `HostCopy`, failing or panicking at random before it copies (reads to
/// the host do not fail: the test reads the buffers back with them).
#[derive(Clone, Copy, Debug)]
struct FaultyCopy;

impl<S: Stream + ?Sized> CopyEngine<S> for FaultyCopy {
    type Kind = HostCopy;
    unsafe fn copy_from_host(&self, dst: u64, src: &[u8], stream: &S) -> CoreResult<()> {
        maybe_fail("copy_from_host")?;
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { HostCopy.copy_from_host(dst, src, stream) }
    }
    unsafe fn copy_to_host(&self, dst: &mut [u8], src: u64, stream: &S) -> CoreResult<()> {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { HostCopy.copy_to_host(dst, src, stream) }
    }
    unsafe fn copy(&self, dst: u64, src: u64, len: u64, stream: &S) -> CoreResult<()> {
        maybe_fail("copy")?;
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { HostCopy.copy(dst, src, len, stream) }
    }
    unsafe fn fill(&self, dst: u64, value: u8, len: u64, stream: &S) -> CoreResult<()> {
        maybe_fail("fill")?;
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { HostCopy.fill(dst, value, len, stream) }
    }
}

/// A stream whose events and synchronizations fail or panic at random.
#[derive(Clone, Debug)]
struct FaultyStream(u64);

impl Stream for FaultyStream {
    type Event = ();
    fn id(&self) -> u64 {
        self.0
    }
    fn record(&self) -> CoreResult<()> {
        maybe_fail("record")
    }
    fn wait(&self, _: &()) -> CoreResult<()> {
        maybe_fail("wait")
    }
    fn query(&self, _: &()) -> CoreResult<bool> {
        Ok(true)
    }
    fn synchronize(&self) -> CoreResult<()> {
        maybe_fail("synchronize")
    }
}

type Buffer<'a> = DeviceBuffer<&'a Faulty, FaultyCopy, FaultyStream>;

/// What a failed call must leave as it was: the bytes in use, the block,
/// the alignment, the stream.
fn state(b: &Buffer<'_>) -> (Vec<u8>, Block, u64, u64) {
    (b.to_vec().unwrap(), b.block(), b.alignment(), b.stream().id())
}

#[test]
fn random_operations_over_failing_parts_keep_every_buffer_and_lose_no_block() {
    let mr = Faulty::default();
    let mut rng = SplitMix64::new(0xbad);
    let mut live: Vec<(Buffer<'_>, Vec<u8>)> = Vec::new();
    // How often each operation failed (an error or a panic; `clear`, the
    // last, cannot).
    let mut failed = [0u32; 10];
    for step in 0..steps(50_000) as u64 {
        let op = if live.is_empty() { 0 } else { rng.below(10) as usize };
        let i = rng.below(live.len().max(1) as u64) as usize;
        let len = if rng.below(4) == 0 { 0 } else { rng.below(600) as usize };
        let before = live.get(i).map(|(b, _)| state(b));
        let refusals = |block: Block| mr.refused.borrow().iter().filter(|&&b| b == block).count();
        let refused_before = before.as_ref().map_or(0, |s| refusals(s.1));
        faults_on(true);
        let result = catch_unwind(AssertUnwindSafe(|| -> Result<(), ContainerError> {
            match op {
                0 if live.len() < 12 => {
                    let data: Vec<u8> = (0..len).map(|_| rng.below(256) as u8).collect();
                    live.push((
                        DeviceBuffer::from_slice_in(&data, FaultyStream(step), &mr, FaultyCopy)?,
                        data,
                    ));
                }
                0 | 1 => drop(live.swap_remove(i)),
                2 => {
                    live[i].0.resize(len as u64)?;
                    live[i].1.resize(len, 0);
                }
                3 => live[i].0.reserve(len as u64)?,
                4 => live[i].0.shrink_to_fit()?,
                5 => live[i].0.set_alignment(1 << rng.below(13))?,
                6 => live[i].0.set_stream(FaultyStream(step))?,
                7 if live.len() < 12 => {
                    let copy = live[i].0.try_clone_on(FaultyStream(step))?;
                    let model = live[i].1.clone();
                    live.push((copy, model));
                }
                8 => {
                    let value = rng.below(256) as u8;
                    live[i].0.fill(value)?;
                    live[i].1.fill(value);
                }
                _ => {
                    live[i].0.clear();
                    live[i].1.clear();
                }
            }
            Ok(())
        }));
        faults_on(false);
        if !matches!(result, Ok(Ok(()))) {
            failed[op] += 1;
            // A growth, a shrink, a change of alignment or stream, or a deep
            // copy (of `live[i]`) that failed changed nothing.
            if matches!(op, 3..=7) {
                let (now, before) = (state(&live[i].0), before.unwrap());
                let old_free_panicked = result.is_err() && refusals(before.1) > refused_before;
                if now != before && old_free_panicked {
                    assert_eq!(now.0, before.0, "step {step}: op {op}: moved, its bytes with it");
                } else {
                    assert_eq!(now, before, "step {step}: op {op}: {result:?}");
                }
            }
        }
        for (b, model) in &live {
            assert_eq!(&b.to_vec().unwrap(), model, "step {step}: op {op}");
            assert!(b.len() <= b.capacity() && b.addr() % b.alignment() == 0, "step {step}: {b:?}");
        }
        assert_eq!(mr.unknown.get(), 0, "step {step}: op {op}: a free of a block not live");
    }
    if !cfg!(miri) {
        assert!(failed[..9].iter().all(|&n| n > 0), "every operation failed at times: {failed:?}");
    }
    live.clear();
    let refused = mr.refused.take();
    for (_, (inner, block)) in mr.live.take() {
        assert!(refused.contains(&block), "{block:?} is live, and no free of it was refused");
        mr.host.deallocate(inner, &()).unwrap();
    }
    assert_eq!(mr.host.live_count(), 0);
}
