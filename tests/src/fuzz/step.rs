//! One run of the harness: the operations applied to the resource and the
//! model, each answer judged against the model, the oracles after each step.

use super::{FuzzResource, Model, Op, MAX_STEPS};
use arbitrary::Unstructured;
use memres_core::{Block, Error, Request, Result};

/// Runs `data` as an operation sequence against `resource`.
///
/// # Panics
///
/// On the first disagreement between the resource and the oracles.
pub fn drive<R: FuzzResource>(resource: &mut R, u: &mut Unstructured<'_>) {
    let mut model = Model::default();
    after_step(resource, &mut model);
    while !u.is_empty() && model.step < MAX_STEPS {
        let op = match Op::decode_for(u, resource.streams()) {
            Ok(op) => op,
            Err(_) => break,
        };
        model.step += 1;
        apply(resource, &mut model, op);
        after_step(resource, &mut model);
    }
    resource.end_of_input();
    // Free everything: the resource must end with nothing in use.
    while let Some(live) = model.live.last().copied() {
        model.step += 1;
        model.note(format_args!("final free {:?}", live.block));
        if let Err(e) = resource.deallocate(live.block) {
            model.fail(&format!("final free of live {:?} failed: {e:?}", live.block));
        }
        let gb = resource.give_backs();
        model.remove(model.live.len() - 1, gb);
        after_step(resource, &mut model);
    }
    if let Some(Err(e)) = resource.release() {
        model.fail(&format!("final release failed: {e:?}"));
    }
    after_step(resource, &mut model);
}

fn after_step<R: FuzzResource>(resource: &R, model: &mut Model) {
    if let Err(v) = resource.check(model) {
        model.fail(&format!("check failed: {v}"));
    }
    let used = resource.used_bytes();
    if used != model.used {
        model.fail(&format!("resource counts {used} bytes in use, the model {}", model.used));
    }
    if model.blocks.bytes() > model.used {
        model.fail("LiveBlocks holds more bytes than the model's footprints");
    }
}

fn apply<R: FuzzResource>(r: &mut R, m: &mut Model, op: Op) {
    match op {
        Op::Allocate { size, align } => allocate(r, m, size, align),
        Op::Free { index, by_address } => {
            if m.live.is_empty() {
                return;
            }
            let i = index % m.live.len();
            let b = m.live[i].block;
            let block = if by_address { Block::from_addr(b.addr(), b.size()) } else { b };
            m.note(format_args!("free live {block:?}"));
            let before = r.summary();
            if by_address && !r.frees_by_address() {
                let got = r.deallocate(block);
                let want = Error::UnknownBlock { addr: b.addr() };
                expect_unchanged_err(r, m, got, &[want], &before, "address-only free (unsupported)");
                return;
            }
            let got = r.deallocate(block);
            freed_live(r, m, i, got, &before, "free of live");
        }
        Op::FreeWrongSize { index, by_address, delta } => {
            if m.live.is_empty() {
                return;
            }
            let i = index % m.live.len();
            let b = m.live[i].block;
            let size = wrong_size(b.size(), delta, r.odd_free_sizes());
            let block = if by_address {
                Block::from_addr(b.addr(), size)
            } else {
                Block::new(b.addr(), size, b.tag())
            };
            // Size 0 too: a block of zero bytes at an address is no empty
            // block (`Block::is_empty`), but a free with a wrong size.
            m.note(format_args!("free live {b:?} with size {size}"));
            let (fp_old, fp_new) = (r.size_class_of(&b, b.size()), r.size_class_of(&b, size));
            if fp_new != fp_old && r.undetected_bad_free(&block) {
                m.note(format_args!("skipped: a bad free the resource does not detect"));
                return;
            }
            let before = r.summary();
            let got = r.deallocate(block);
            if by_address && !r.frees_by_address() {
                let want = Error::UnknownBlock { addr: b.addr() };
                expect_unchanged_err(r, m, got, &[want], &before, "address-only free (unsupported)");
            } else if fp_new == fp_old {
                // The same footprint: a valid free of the block.
                freed_live(r, m, i, got, &before, &format!("free with size {size} (same footprint) of live"));
            } else {
                let want = r.mismatch_errors(b.addr(), fp_old, size);
                expect_unchanged_err(r, m, got, &want, &before, "free with a wrong size");
            }
        }
        Op::DoubleFree { index, by_address } => {
            if m.freed.is_empty() {
                return;
            }
            let f = m.freed[index % m.freed.len()];
            let b = f.block;
            let block = if by_address { Block::from_addr(b.addr(), b.size()) } else { b };
            m.note(format_args!("double free {block:?}"));
            let gave_back = r.give_backs() != f.give_backs;
            stale_or_foreign_free(r, m, block, gave_back, true);
        }
        Op::FreeForeign { base, offset, tag } => {
            let addr = match (base, m.live.is_empty()) {
                (0, false) => {
                    let l = m.live[offset as usize % m.live.len()];
                    // Inside a live block, past its start (granule steps or odd).
                    l.block.addr().wrapping_add(1 + (offset >> 8) % l.footprint.max(1))
                }
                (1, _) => offset,
                (2, _) => {
                    let bases = r.device_bases();
                    bases[(offset >> 48) as usize % bases.len()].wrapping_add(offset & 0xffff_ffff_ff00)
                }
                _ => offset & !255,
            };
            if m.live.iter().any(|l| l.block.addr() == addr) || addr.checked_add(256).is_none() {
                return; // handed out: not foreign
            }
            let block =
                if tag == Block::NO_TAG { Block::from_addr(addr, 256) } else { Block::new(addr, 256, tag) };
            m.note(format_args!("foreign free {block:?}"));
            stale_or_foreign_free(r, m, block, true, false);
        }
        Op::Release => {
            let before_used = r.used_bytes();
            match r.release() {
                None => {}
                Some(Ok(bytes)) => m.note(format_args!("release: {bytes} bytes back upstream")),
                Some(Err(e)) if r.refused_free(&e) => m.note(format_args!("release: {e:?}")),
                Some(Err(e)) => m.fail(&format!("release failed: {e:?}")),
            }
            if r.used_bytes() != before_used {
                m.fail("release changed the bytes in use");
            }
        }
        Op::FailNth { n } => {
            if r.fail_nth(n) {
                m.note(format_args!("upstream fails its call number {n} from now"));
            }
        }
        Op::Stream { .. } | Op::Advance | Op::Synchronize | Op::FailStream { .. } => {
            m.note(format_args!("{op:?}"));
            r.stream_op(op);
        }
    }
}

fn allocate<R: FuzzResource>(r: &mut R, m: &mut Model, size: u64, align: u64) {
    // Validation: exactly what `Request` promises.
    let expect = if !align.is_power_of_two() || align > Request::MAX_ALIGN {
        Err(Error::InvalidAlignment { align })
    } else if size > Request::MAX_SIZE {
        Err(Error::InvalidSize { size, what: "above Request::MAX_SIZE" })
    } else {
        Ok(())
    };
    let request = match (Request::aligned(size, align), expect) {
        (Ok(req), Ok(())) => req,
        (Err(got), Err(want)) if got == want => {
            m.note(format_args!("request({size}, {align}) rejected: {got:?}"));
            return;
        }
        (got, want) => m.fail(&format!("Request::aligned({size}, {align}) = {got:?}, expected {want:?}")),
    };
    if request.size() != size || request.align() != align.max(memres_core::DEFAULT_ALIGNMENT) {
        m.fail(&format!("Request::aligned({size}, {align}) became {request:?}"));
    }
    let before = r.summary();
    r.begin_allocate();
    match r.allocate(request) {
        Ok(block) => {
            m.note(format_args!("allocate({size}, {align}) = {block:?}"));
            let fp = if block.is_empty() { 0 } else { r.footprint_of(&request) };
            m.add(block, request, fp);
        }
        Err(e) => {
            m.note(format_args!("allocate({size}, {align}) failed: {e:?}"));
            if request.is_zero() {
                m.fail(&format!("zero-byte request failed: {e:?}"));
            }
            if r.used_bytes() != before[0] {
                m.fail("a failed allocation changed the bytes in use");
            }
            if let Err(why) = r.judge_alloc_failure(&request, &e, &before, m) {
                m.fail(&format!("allocate({size}, {align}) failed with {e:?}, illegitimately: {why}"));
            }
        }
    }
}

/// A free of a block that is not live (stale: freed before; foreign: never
/// handed out). By address, a stale address that is live again is a valid
/// free of that live block.
fn stale_or_foreign_free<R: FuzzResource>(
    r: &mut R,
    m: &mut Model,
    block: Block,
    gave_back: bool,
    stale: bool,
) {
    let addr = block.addr();
    let before = r.summary();
    let tagged = block.tag() != Block::NO_TAG;
    let forgets = r.forgets(&block);
    if r.undetected_bad_free(&block) {
        m.note(format_args!("skipped: a bad free the resource does not detect"));
        return;
    }
    if let Some(i) = m.live.iter().position(|l| l.block.addr() == addr) {
        let live = m.live[i];
        if tagged {
            // A stale tag for an address handed out again: never the new block.
            let got = r.deallocate(block);
            let mut allowed = vec![Error::DoubleFree { addr }];
            if forgets {
                allowed.push(Error::UnknownBlock { addr });
                allowed.extend(r.stale_errors(&block, Some(&live.block)));
            }
            expect_unchanged_err(r, m, got, &allowed, &before, "stale free of a reused address");
        } else if !r.frees_by_address() {
            let got = r.deallocate(block);
            let want = Error::UnknownBlock { addr };
            expect_unchanged_err(r, m, got, &[want], &before, "address-only free (unsupported)");
        } else if r.size_class_of(&live.block, block.size())
            == r.size_class_of(&live.block, live.block.size())
        {
            let got = r.deallocate(block);
            freed_live(r, m, i, got, &before, "address-only free of live");
        } else {
            let got = r.deallocate(block);
            let want = r.mismatch_errors(addr, r.size_class_of(&live.block, live.block.size()), block.size());
            expect_unchanged_err(r, m, got, &want, &before, "address-only free with another size");
        }
        return;
    }
    if stale && forgets && !tagged && r.frees_by_address() && m.live_at(addr).is_none() {
        // Memory that went straight back upstream may be the upstream's
        // again under another owner (a chunk of the resource itself): a
        // free by address there is undetectable, as a double free of any
        // allocator's memory that it handed out again.
        m.note(format_args!("skipped: address-only free of forgotten memory"));
        return;
    }
    let got = r.deallocate(block);
    if m.live_at(addr).is_some() {
        // Inside a live block: not a block start the resource handed out.
        let mut allowed = vec![Error::UnknownBlock { addr }];
        if forgets && tagged {
            allowed.push(Error::DoubleFree { addr });
        }
        expect_unchanged_err(r, m, got, &allowed, &before, "free inside a live block");
    } else if stale && !gave_back && !forgets {
        // Still in memory the resource holds, and free there.
        expect_unchanged_err(r, m, got, &[Error::DoubleFree { addr }], &before, "double free");
    } else {
        let mut allowed = vec![Error::DoubleFree { addr }, Error::UnknownBlock { addr }];
        if forgets {
            allowed.extend(r.stale_errors(&block, None));
        }
        expect_unchanged_err(
            r,
            m,
            got,
            &allowed,
            &before,
            if stale { "double free after memory went back upstream" } else { "free of a foreign address" },
        );
    }
}

fn expect_unchanged_err<R: FuzzResource>(
    r: &R,
    m: &mut Model,
    got: Result<()>,
    allowed: &[Error],
    before: &[u64],
    what: &str,
) {
    match got {
        Ok(()) => m.fail(&format!("{what} succeeded; expected one of {allowed:?}")),
        Err(e) if allowed.contains(&e) => {}
        // A free passed upstream, which refused it before judging it.
        Err(e) if r.refused_free(&e) => m.note(format_args!("{what}: the upstream refused the free")),
        Err(e) => m.fail(&format!("{what} failed with {e:?}; expected one of {allowed:?}")),
    }
    let after = r.summary();
    if after != before {
        m.fail(&format!("{what}: the failed call changed the resource: {before:?} -> {after:?}"));
    }
}

/// A size other than `size`, picked by `delta`; with `odd`, a quarter of
/// the picks are sizes no block has (0, above `Request::MAX_SIZE`).
fn wrong_size(size: u64, delta: u8, odd: bool) -> u64 {
    if odd && delta & 0x60 == 0x60 {
        return match delta % 3 {
            0 => 0,
            1 => Request::MAX_SIZE + 1 + u64::from(delta),
            _ => u64::MAX - u64::from(delta & 1),
        };
    }
    let d = match delta % 6 {
        0 => 1,
        1 => 255,
        2 => 256,
        3 => 257,
        4 => 4096,
        _ => size,
    };
    let s = if delta & 0x80 != 0 { size.saturating_sub(d) } else { size.saturating_add(d) };
    if s == 0 || s == size {
        size + 1
    } else {
        s
    }
}

/// Judges `got`, the answer of a valid free of live block `i`: the block
/// is freed, or the upstream refused its free, and then it stays live and
/// nothing changed.
fn freed_live<R: FuzzResource>(r: &R, m: &mut Model, i: usize, got: Result<()>, before: &[u64], what: &str) {
    let block = m.live[i].block;
    match got {
        Ok(()) => {
            let gb = r.give_backs();
            m.remove(i, gb);
        }
        Err(e) if r.refused_free(&e) => {
            m.note(format_args!("{what} {block:?}: the upstream refused it, the block stays live"));
            let after = r.summary();
            if after != before {
                m.fail(&format!("{what} {block:?}: refused upstream, yet changed {before:?} -> {after:?}"));
            }
        }
        Err(e) => m.fail(&format!("{what} {block:?} failed: {e:?} (summary before {before:?})")),
    }
}
