//! The fuzz target of the fixed-size resource.

use super::super::{drive, FuzzResource, Model};
use super::{upstream_explains, Spy};
use arbitrary::Unstructured;
use memres_core::fixed::{FixedConfig, FixedSizeResource};
use memres_core::{Block, Error, Inspect, MemoryResourceMut, Request, Result};

/// `FixedSizeResource` over the spied `SimDevice`.
#[derive(Debug)]
struct FixedTarget {
    fixed: FixedSizeResource<Spy>,
    spy: Spy,
}

impl FuzzResource for FixedTarget {
    fn allocate(&mut self, request: Request) -> Result<Block> {
        self.fixed.allocate(request, &())
    }
    fn deallocate(&mut self, block: Block) -> Result<()> {
        self.fixed.deallocate(block, &())
    }
    fn release(&mut self) -> Option<Result<u64>> {
        let got = self.fixed.release(&());
        if got.is_ok() && self.fixed.used_blocks() == 0 && self.fixed.usage().held != 0 {
            panic!("fuzz oracle: release() kept {} bytes with nothing in use", self.fixed.usage().held);
        }
        Some(got)
    }
    fn check(&self, model: &Model) -> std::result::Result<(), String> {
        if super::super::invariant_checker_on() {
            self.fixed.check().map_err(|v| v.to_string())?;
        }
        if self.spy.inner.usage().held != self.fixed.usage().held {
            return Err(format!(
                "upstream holds {} bytes, the resource says {}",
                self.spy.inner.usage().held,
                self.fixed.usage().held
            ));
        }
        if self.fixed.used_blocks() != model.live().len() as u64 {
            return Err(format!("{} used blocks, {} live", self.fixed.used_blocks(), model.live().len()));
        }
        let align = self.fixed.alignment();
        if let Some(l) = model.live().iter().find(|l| l.block.addr() % align != 0) {
            return Err(format!("{:?} not aligned to {align}", l.block));
        }
        Ok(())
    }
    fn used_bytes(&self) -> u64 {
        self.fixed.usage().used
    }
    fn footprint(&self, size: u64) -> u64 {
        // Any size the resource takes occupies one block.
        if size <= self.fixed.block_size() {
            self.fixed.block_size()
        } else {
            size
        }
    }
    fn size_class(&self, size: u64) -> u64 {
        // It checks the exact size a block was asked with.
        size
    }
    fn summary(&self) -> Vec<u64> {
        vec![
            self.fixed.usage().used,
            self.fixed.usage().free,
            self.fixed.usage().held,
            self.fixed.chunk_count() as u64,
        ]
    }
    fn spy(&self) -> Option<&Spy> {
        Some(&self.spy)
    }
    fn judge_alloc_failure(
        &self,
        request: &Request,
        err: &Error,
        before: &[u64],
        _: &Model,
    ) -> std::result::Result<(), String> {
        let want_size = request.size() > self.fixed.block_size();
        let want_align = !want_size && request.align() > self.fixed.alignment();
        match err {
            Error::InvalidSize { size, .. } if want_size && *size == request.size() => Ok(()),
            Error::InvalidAlignment { align } if want_align && *align == request.align() => Ok(()),
            _ if want_size || want_align => Err("expected InvalidSize or InvalidAlignment".into()),
            _ if self.fixed.usage().held != before[2] => {
                Err("a failed allocation changed the bytes held".into())
            }
            _ if before[1] != 0 => Err(format!("{} bytes free in blocks and still failed", before[1])),
            _ => upstream_explains(&self.spy, err),
        }
    }
}

/// Fuzz target `fixed`: [`FixedSizeResource`] over a spied `SimDevice`.
pub fn run_fixed(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok(config) = (|| -> arbitrary::Result<FixedConfig> {
        let block = 256 * *u.choose(&[1u64, 1, 3, 16, 4096])?;
        let per_chunk = *u.choose(&[1u32, 2, 7, 128])?;
        let align = 256u64 << *u.choose(&[0u32, 0, 4, 13])?;
        Ok(FixedConfig::new(block).blocks_per_chunk(per_chunk).chunk_alignment(align))
    })() else {
        return;
    };
    let Ok(capacity) = u.choose(&[4u64 << 20, 256 << 20, 1 << 40]).copied() else { return };
    let spy = Spy::new(capacity);
    let fixed = FixedSizeResource::with_config(spy.clone(), config, &()).expect("a valid configuration");
    drive(&mut FixedTarget { fixed, spy }, &mut u);
}
