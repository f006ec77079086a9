//! The fuzz target of the adaptors straight over the spied device, whose
//! refusals of frees reach every layer.

use super::super::{drive, FuzzResource, Model};
use super::{decode_limit, limited_and_counted, Layers, Spy};
use arbitrary::Unstructured;
use memres_core::adaptor::{Counted, Gauge, Logging, Tracking};
use memres_core::{Block, Error, Inspect, MemoryResource, Request, Result};
use std::sync::Arc;

/// What the layers of [`limited_and_counted`] stand on: every free of a
/// live block goes through these three to the device.
type Below = Tracking<Logging<Counted<Spy>, Vec<u8>>>;

/// `Statistics` over `Limiting` over `Tracking` over `Logging` over
/// `Counted` over the spied `SimDevice`, driven through
/// `dyn MemoryResource`.
#[derive(Debug)]
struct DeviceStackTarget {
    layers: Layers,
    below: Arc<Below>,
    /// `Counted`'s.
    gauge: Arc<Gauge>,
    spy: Spy,
}

impl FuzzResource for DeviceStackTarget {
    fn allocate(&mut self, request: Request) -> Result<Block> {
        self.layers.top.allocate(request, &())
    }
    fn deallocate(&mut self, block: Block) -> Result<()> {
        self.layers.top.deallocate(block, &())
    }
    fn check(&self, model: &Model) -> std::result::Result<(), String> {
        self.below.check().map_err(|v| v.to_string())?;
        (self.layers.check)(model)?;
        // Tracking: exactly the live blocks, each with the size asked.
        let report = self.below.get_outstanding_allocations();
        let sizes: u64 = model.live().iter().map(|l| l.block.size()).sum();
        if report.count() != model.live().len() || report.bytes() != sizes {
            return Err(format!(
                "Tracking has {} blocks of {} bytes outstanding, the model {} of {sizes}",
                report.count(),
                report.bytes(),
                model.live().len()
            ));
        }
        if let Some(l) =
            model.live().iter().find(|l| self.below.size_of(l.block.addr()) != Some(l.block.size()))
        {
            return Err(format!("Tracking does not know the live {:?}", l.block));
        }
        // Logging: every free the device failed counted, refused or bad
        // (a stale tag of an address handed out again, with its size,
        // passes Tracking).
        let logging = self.below.upstream();
        if logging.refused_frees() != self.spy.failed_frees() || logging.write_errors() != 0 {
            return Err(format!(
                "Logging counts {} refused frees and {} write errors; the device failed {} frees",
                logging.refused_frees(),
                logging.write_errors(),
                self.spy.failed_frees()
            ));
        }
        // Counted: the sizes of the live blocks, as they were asked.
        if self.gauge.value() != sizes || self.gauge.peak() < sizes || self.gauge.total() < sizes {
            return Err(format!(
                "Counted holds {} bytes (peak {}, total {}), the live blocks {sizes}",
                self.gauge.value(),
                self.gauge.peak(),
                self.gauge.total()
            ));
        }
        Ok(())
    }
    fn used_bytes(&self) -> u64 {
        self.spy.inner.usage().held
    }
    fn footprint(&self, size: u64) -> u64 {
        size.div_ceil(256) * 256
    }
    fn size_class(&self, size: u64) -> u64 {
        // Tracking checks the exact size a block was asked with.
        size
    }
    fn summary(&self) -> Vec<u64> {
        let usage = self.spy.inner.usage();
        vec![
            usage.held,
            self.gauge.value(),
            usage.peak_held,
            self.below.get_allocated_bytes(),
            self.below.get_outstanding_allocations().count() as u64,
        ]
    }
    fn spy(&self) -> Option<&Spy> {
        Some(&self.spy)
    }
    fn forgets(&self, _block: &Block) -> bool {
        // Every table forgets a block freed, and the device reuses its
        // addresses.
        true
    }
    fn stale_errors(&self, block: &Block, _: Option<&Block>) -> Vec<Error> {
        // A stale tag for an address handed out again, with another size:
        // Tracking judges the size before the tag reaches the device.
        match self.below.size_of(block.addr()) {
            Some(size) if size != block.size() => {
                vec![Error::SizeMismatch { addr: block.addr(), expected: size, given: block.size() }]
            }
            _ => Vec::new(),
        }
    }
    fn judge_alloc_failure(
        &self,
        request: &Request,
        err: &Error,
        before: &[u64],
        model: &Model,
    ) -> std::result::Result<(), String> {
        let after = self.summary();
        if after != before {
            return Err(format!("the failed call changed {before:?} -> {after:?}"));
        }
        if let Some(verdict) = (self.layers.judge)(request, err, model) {
            return verdict;
        }
        let log = self.spy.log();
        match *err {
            // The request went to the device as it was, once.
            Error::OutOfMemory { requested, .. }
                if requested == request.size() && log.refused == [requested] =>
            {
                Ok(())
            }
            Error::Backend { .. } if log.failed_other => Ok(()),
            _ => Err(format!("upstream log {log:?}")),
        }
    }
}

/// Fuzz target `device_stack`: `Statistics` over `Limiting` over
/// `Tracking` over `Logging` over `Counted` over the spied `SimDevice`,
/// through `dyn MemoryResource`. Besides the
/// [`stack`](super::run_stack_adaptors) target's checks, `Tracking` and
/// `Counted` hold exactly the live blocks, and `Logging` counts exactly
/// the frees the device failed: a refused free of a live block reaches
/// every layer, which must keep it live.
pub fn run_device_stack(data: &[u8]) {
    let Some((limit, rest)) = decode_limit(data) else { return };
    let mut u = Unstructured::new(rest);
    let Ok(&capacity) = u.choose(&[64u64 << 20, 1 << 30, 1 << 44]) else { return };
    let spy = Spy::new(capacity);
    let gauge = Arc::new(Gauge::default());
    let counted = Counted::new(spy.clone(), Arc::clone(&gauge));
    let logging = Logging::new(counted, Vec::new()).expect("a log in memory takes its header");
    let below = Arc::new(Tracking::new(logging));
    let layers = limited_and_counted(Arc::clone(&below), limit);
    drive(&mut DeviceStackTarget { layers, below, gauge, spy }, &mut u);
}
