//! Blocks a stack handed out that no caller took, and that it refused to
//! take back.
//!
//! A block the caller cannot be given (at an address that is live already,
//! at 0, of another size than asked, or from a stack retired meanwhile)
//! goes back through the stack it came from at once. If the stack refuses
//! it (a `CallbackMemoryResource` whose `deallocate_func` raises), it is
//! kept here with the resource to give it back to, never lost, and given
//! back again later: by `memres_py_empty_cache` for the C functions'
//! blocks (`current`), by `release()` for a resource object's
//! (`resource`). If the stack panics there, the block is left to it, as
//! the core's layers leave a block whose free panicked to the layer below:
//! it may have taken the block first, and a second give-back would free
//! it twice. A `callback` leaf refuses an address live already itself
//! (`callback`), and keeps what its `deallocate_func` refuses back in its
//! object's list.

use crate::backend::Stream;
use crate::errors::panic_message;
use memres_core::{Block, DynResource, MemoryResource};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;

/// Blocks refused back, each with the resource to give it back to.
pub(crate) type Kept = Mutex<Vec<(Block, DynResource<Stream>)>>;

/// What is wrong with `block`, handed out for a request of `asked` bytes,
/// if it cannot be handed on: at address 0 (the empty block included),
/// which the caller takes for no block (`zero` says how: in C, NULL, a
/// failure), so it would never be freed; or of another size than asked: one shorter would
/// be written past its end, one longer is kept at its own size, so the
/// caller's free of the size it asked for would be refused and the block
/// stay live for good.
pub(crate) fn misfit(block: Block, asked: u64, zero: &str) -> Option<String> {
    if block.addr() == 0 {
        return Some(format!("a block of {} bytes at address 0, {zero}", block.size()));
    }
    if block.size() == asked {
        return None;
    }
    let how = match block.size() < asked {
        true => "shorter than asked",
        false => "longer than asked, so a free of the size asked would be refused",
    };
    Some(format!("a block of {} bytes at {:#x} for a request of {asked}: {how}", block.size(), block.addr()))
}

/// Why a give-back did not free its block ([`freed`]).
#[derive(Debug)]
pub(crate) enum Unfreed {
    /// The resource refused it: it still holds the block, to be kept.
    Refused(String),
    /// The resource panicked: the block is left to it.
    Panicked(String),
}

impl std::fmt::Display for Unfreed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unfreed::Refused(e) => f.write_str(e),
            Unfreed::Panicked(what) => write!(f, "a panic ({what}); left to the resource"),
        }
    }
}

/// Frees `block` to `resource` on `s`, a panic there caught.
pub(crate) fn freed<R: MemoryResource<Stream> + ?Sized>(
    resource: &R,
    block: Block,
    s: &Stream,
) -> Result<(), Unfreed> {
    match catch_unwind(AssertUnwindSafe(|| resource.deallocate(block, s))) {
        Ok(done) => done.map_err(|e| Unfreed::Refused(e.to_string())),
        Err(payload) => {
            Err(Unfreed::Panicked(panic_message(payload).unwrap_or_else(|| "unknown".to_string())))
        }
    }
}

/// Gives `block`, which no caller can take, back to `stack` on `s` at
/// once: kept in `kept` with `below` (the resource to give it back to
/// later) if refused, left to `stack` if it panics. Answers what the error
/// adds, `later` naming the call that gives kept blocks back, and whether
/// the give-back failed.
pub(crate) fn refuse<R: MemoryResource<Stream> + ?Sized>(
    kept: &Kept,
    stack: &R,
    below: &DynResource<Stream>,
    block: Block,
    s: &Stream,
    later: &str,
) -> (String, bool) {
    match freed(stack, block, s) {
        Ok(()) => ("it was given back".to_string(), false),
        Err(e @ Unfreed::Panicked(_)) => (format!("giving it back failed: {e}"), true),
        Err(e @ Unfreed::Refused(_)) => {
            let waited = keep(kept, block, below.clone(), s);
            (format!("giving it back failed: {e}; kept to give back at the next {later}{waited}"), true)
        }
    }
}

/// Keeps `block`, handed out on `s` and refused back by `resource`, in
/// `kept`, once `s` is done with what it ordered before: it is given back
/// later on another stream. Answers what the error adds: that the wait
/// failed, or nothing.
pub(crate) fn keep(kept: &Kept, block: Block, resource: DynResource<Stream>, s: &Stream) -> String {
    let waited = match memres_core::Stream::synchronize(s) {
        Ok(()) => String::new(),
        Err(w) => format!(" (waiting for its stream failed: {w})"),
    };
    kept.lock().unwrap_or_else(|p| p.into_inner()).push((block, resource));
    waited
}

/// Gives each block of `kept` back to its resource on `s`, handing the
/// resource to `dropped` then (the last block of a stack no longer current
/// takes the stack with it); keeps those refused, leaves to its resource
/// one whose free panics, and answers the first failure.
pub(crate) fn give_back(
    kept: &Kept,
    s: &Stream,
    dropped: impl Fn(DynResource<Stream>),
) -> Result<(), String> {
    let taken = std::mem::take(&mut *kept.lock().unwrap_or_else(|p| p.into_inner()));
    let mut first = Ok(());
    for (block, resource) in taken {
        match freed(&*resource, block, s) {
            Ok(()) => dropped(resource),
            Err(e @ Unfreed::Panicked(_)) => {
                first = first.and(Err(e.to_string()));
                dropped(resource);
            }
            Err(e @ Unfreed::Refused(_)) => {
                first = first.and(Err(e.to_string()));
                kept.lock().unwrap_or_else(|p| p.into_inner()).push((block, resource));
            }
        }
    }
    first
}

/// A leaf for tests of what is done with a block no caller can take.
#[cfg(all(test, not(feature = "cuda")))]
pub(crate) mod testing {
    use super::*;
    use memres_core::Request;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// Hands out every block at `addr` (or `handing`, where set), and keeps
    /// those given back.
    #[derive(Default)]
    pub(crate) struct OneAddress {
        pub(crate) addr: u64,
        /// The block to hand out next, whatever is asked.
        pub(crate) handing: Mutex<Option<Block>>,
        pub(crate) back: Mutex<Vec<Block>>,
        /// Whether frees are refused.
        pub(crate) refusing: AtomicBool,
        /// Whether frees panic.
        pub(crate) panicking: AtomicBool,
    }

    impl MemoryResource<Stream> for OneAddress {
        fn allocate(&self, request: Request, _stream: &Stream) -> memres_core::Result<Block> {
            let handing = self.handing.lock().unwrap().take();
            Ok(handing.unwrap_or(Block::new(self.addr, request.size(), 7)))
        }

        fn deallocate(&self, block: Block, _stream: &Stream) -> memres_core::Result<()> {
            if self.panicking.load(Ordering::Relaxed) {
                panic!("a free that panics");
            }
            if self.refusing.load(Ordering::Relaxed) {
                return Err(memres_core::Error::Backend { code: 1, what: "refused" });
            }
            self.back.lock().unwrap().push(block);
            Ok(())
        }
    }
}
