//! The fuzz target of a stack of adaptors, judged by a ledger of what
//! the caller handed out.

use super::super::Model;
use super::{Layers, SharedPool};
use memres_core::adaptor::{Limiting, Statistics};
use memres_core::{Block, Error, MemoryResource, Request, Result};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// What the caller handed out and freed through the top of a stack, to
/// judge the statistics (which count sizes as the caller states them).
#[derive(Debug, Default)]
struct Ledger {
    sizes: HashMap<u64, u64>,
    /// Sizes of every allocation, summed.
    allocated: u64,
    /// Allocations made.
    count: u64,
    /// Sum of the sizes the frees stated.
    freed: u64,
}

/// The top of the stack: forwards, and writes the ledger.
struct Recorder<R> {
    inner: R,
    ledger: Arc<Mutex<Ledger>>,
}

impl<R: MemoryResource> MemoryResource for Recorder<R> {
    fn allocate(&self, request: Request, stream: &()) -> Result<Block> {
        let block = self.inner.allocate(request, stream)?;
        if !block.is_empty() {
            let mut l = self.ledger.lock().expect("ledger");
            l.sizes.insert(block.addr(), block.size());
            l.allocated += block.size();
            l.count += 1;
        }
        Ok(block)
    }
    fn deallocate(&self, block: Block, stream: &()) -> Result<()> {
        self.inner.deallocate(block, stream)?;
        if !block.is_empty() {
            let mut l = self.ledger.lock().expect("ledger");
            l.sizes.remove(&block.addr());
            l.freed += block.size();
        }
        Ok(())
    }
}

/// The limit the input's first byte picks (`None`: an empty input), and
/// the rest of the input.
pub(super) fn decode_limit(data: &[u8]) -> Option<(u64, &[u8])> {
    let (&b, rest) = data.split_first()?;
    let limit = match b % 4 {
        0 => 0,
        1 => 256 * (u64::from(b) + 1),
        2 => 64 << 20,
        _ => 1 << 40,
    };
    Some((limit, rest))
}

/// `Statistics` over `Limiting` over `below`, as [`Layers`]: the
/// statistics agree with what was handed out and freed; the limit refuses
/// exactly when the model's bytes in use plus the request's footprint (its
/// size rounded to 256 bytes) exceed it. The limit's table of charges holds
/// live blocks only, so the layers forget freed blocks.
pub(super) fn limited_and_counted<R: MemoryResource + 'static>(below: R, limit: u64) -> Layers {
    let limited = Arc::new(Limiting::new(below, limit));
    let stats = Arc::new(Statistics::new(Arc::clone(&limited)));
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let top = Recorder { inner: Arc::clone(&stats), ledger: Arc::clone(&ledger) };
    let (l2, s2) = (Arc::clone(&limited), Arc::clone(&stats));
    let check = move |model: &Model| -> std::result::Result<(), String> {
        if l2.get_allocated_bytes() != model.used() {
            return Err(format!(
                "Limiting counts {} bytes, the model {}",
                l2.get_allocated_bytes(),
                model.used()
            ));
        }
        if l2.get_allocated_bytes() > limit {
            return Err(format!(
                "Limiting lets {} bytes be used over a limit of {limit}",
                l2.get_allocated_bytes()
            ));
        }
        let l = ledger.lock().expect("ledger");
        let (bytes, count) = (s2.get_bytes_counter(), s2.get_allocations_counter());
        let live = model.live().len() as i64;
        let live_bytes = l.allocated as i64 - l.freed as i64;
        let want_bytes: u64 = model.live().iter().map(|x| x.block.size()).sum();
        if l.sizes.len() as i64 != live || l.sizes.values().sum::<u64>() != want_bytes {
            return Err("the ledger lost track of the live blocks".into());
        }
        if count.value != live || count.total != l.count as i64 || count.peak < count.value {
            return Err(format!("allocation counter {count:?}, {live} live of {} made", l.count));
        }
        if bytes.value != live_bytes || bytes.total != l.allocated as i64 || bytes.peak < bytes.value {
            return Err(format!(
                "byte counter {bytes:?}; {} allocated, {} freed as stated",
                l.allocated, l.freed
            ));
        }
        Ok(())
    };
    let l3 = Arc::clone(&limited);
    let judge = move |request: &Request, err: &Error, model: &Model| {
        let fp = request.size().div_ceil(256) * 256;
        let over = fp > limit || model.used() > limit - fp;
        match (err, over) {
            (Error::LimitExceeded { requested, used, limit: lim }, true) => {
                Some(if *requested == request.size() && *used == model.used() && *lim == limit {
                    Ok(())
                } else {
                    Err(format!("wrong figures; used {}", l3.get_allocated_bytes()))
                })
            }
            (Error::LimitExceeded { .. }, false) => {
                Some(Err(format!("{} + {fp} bytes fit the limit {limit}", model.used())))
            }
            (_, true) => Some(Err(format!("{} + {fp} bytes exceed the limit {limit}", model.used()))),
            (_, false) => None,
        }
    };
    Layers { top: Box::new(top), check: Box::new(check), judge: Box::new(judge), forgets: true }
}

/// Fuzz target `stack`: `Statistics` over `Limiting` over a shared pool,
/// through `dyn MemoryResource`. The statistics agree with what was handed
/// out and freed; the limit refuses exactly when the model's bytes in use
/// plus the request's footprint exceed it.
pub fn run_stack_adaptors(data: &[u8]) {
    let Some((limit, rest)) = decode_limit(data) else { return };
    super::run_stack(rest, |pool: Arc<SharedPool>| limited_and_counted(pool, limit));
}
