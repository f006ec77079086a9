//! The arena target's lanes (stream ids and threads), its helper thread,
//! and the rules the model follows (size classes, routing, sure fits).

use super::super::round256;
use memres_core::arena::{size_class, ArenaDump};
use memres_core::Request;
use std::sync::mpsc;

/// The lanes operations run on: a stream id, and whether the call is made
/// from the helper thread (stream 0 has an arena per thread).
pub(super) const LANES: [(u64, bool); 5] =
    [(0, false), (0, true), (1, false), (2, false), (0xdead_beef, false)];

/// Which arena a small request goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Key {
    /// Stream 0, on the main thread (`false`) or the helper thread.
    Thread(bool),
    /// Any other stream id.
    Stream(u64),
}

/// A live block as the model placed it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Placed {
    pub(super) large: bool,
    pub(super) key: Key,
    pub(super) stream: u64,
    pub(super) footprint: u64,
}

pub(super) type Job = Box<dyn FnOnce() + Send>;

/// A second thread that runs calls handed to it, one at a time.
#[derive(Debug)]
pub(super) struct Helper {
    pub(super) jobs: Option<mpsc::Sender<Job>>,
    pub(super) thread: Option<std::thread::JoinHandle<()>>,
}

impl Helper {
    pub(super) fn spawn() -> Self {
        let (tx, rx) = mpsc::channel::<Job>();
        let thread = std::thread::spawn(move || {
            for job in rx {
                job();
            }
        });
        Helper { jobs: Some(tx), thread: Some(thread) }
    }

    pub(super) fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = mpsc::sync_channel(1);
        let job: Job = Box::new(move || {
            let _ = tx.send(f());
        });
        self.jobs.as_ref().expect("helper running").send(job).expect("helper thread alive");
        rx.recv().expect("fuzz oracle: the call on the helper thread panicked")
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        self.jobs.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The configuration as the model knows it (`ArenaConfig` has no getters
/// for most of it).
#[derive(Clone, Copy, Debug)]
pub(super) struct Params {
    pub(super) superblock: u64,
    pub(super) threshold: u64,
    pub(super) max_arenas: u32,
    pub(super) size_classes: bool,
    pub(super) maximum: Option<u64>,
    /// The streams can synchronize the device.
    pub(super) device_sync: bool,
    /// Superblock requests between idle sweeps (0: never).
    pub(super) idle_after: u32,
}

impl Params {
    /// The size class of a small block of `size` bytes.
    pub(super) fn class(&self, size: u64) -> u64 {
        if self.size_classes {
            size_class(size)
        } else {
            round256(size.max(1))
        }
    }

    /// Whether the global arena serves `request` (documented routing).
    pub(super) fn is_large(&self, request: &Request) -> bool {
        request.size() > self.threshold
            || self.class(request.size()) + request.align() - 256 > self.superblock
    }
}

/// Bytes of a free range that surely serve `size` bytes at `align` in a
/// `CoalescingIndex` of 256-byte granules (its promise, as the `index`
/// target judges it).
pub(super) fn sure_fit(size: u64, align: u64) -> u64 {
    let need = size.div_ceil(256) + align / 256 - 1;
    256 * (need + need / 32)
}

/// What the model expected of the last allocation call.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Attempt {
    pub(super) large: bool,
    pub(super) key: Option<Key>,
    /// The caller had no arena and the table was full.
    pub(super) table_full: bool,
    /// A synchronization failed during the call.
    pub(super) stream_failed: bool,
    /// The call was small with idle sweeps on: the failed synchronization
    /// may be a sweep's, which fails nothing.
    pub(super) may_sweep: bool,
}

pub(super) fn dump_seen(dump: &ArenaDump) {
    assert!(dump.requested.is_some(), "fuzz oracle: a failure dump names no request");
    let _ = dump.to_string();
}
