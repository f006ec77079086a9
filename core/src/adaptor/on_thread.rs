//! What runs on the calling thread now (feature `std`): how an adaptor
//! tells a call of its own code back into itself (a callback, a writer)
//! from another thread's call.

use core::cell::Cell;
use core::ptr;
use std::boxed::Box;

/// What tells one adaptor's code from another's on a thread: a field of
/// the adaptor, by its address. It is never of size zero, so no two live
/// keys share an address; the adaptor's own address would not do, as an
/// upstream it holds by value can begin at it.
#[derive(Debug, Default)]
pub(crate) struct Key(#[allow(dead_code)] u8);

/// One call of [`run`] in progress, linked into its thread's list while
/// the call runs. On the heap, not in the call's frame: a library that
/// switches stacks by copying them away (greenlet, under gevent) lets
/// another call write over a suspended call's frame.
struct Node {
    /// Compared by address only, never read.
    key: *const Key,
    /// The node linked in before this one, or null.
    outer: Cell<*const Node>,
}

std::thread_local! {
    /// The node linked in last, whose `outer` links lead through the
    /// others. A pointer, without a destructor: the list stays there while
    /// the thread's other thread-locals are destroyed, whose destructors
    /// may call adaptors too.
    static INNERMOST: Cell<*const Node> = const { Cell::new(ptr::null()) };
}

/// Runs `f` as code of the adaptor whose key is `key`; `None`, without
/// running it, if code of that adaptor runs on this thread already: the
/// caller is inside it, or another call on this thread that switched
/// stacks (a coroutine's) left it suspended inside it.
pub(crate) fn run<T>(key: &Key, f: impl FnOnce() -> T) -> Option<T> {
    if linked(key) {
        return None;
    }
    let _unlink = link(key);
    Some(f())
}

/// Whether a node of `key` is in this thread's list.
fn linked(key: &Key) -> bool {
    let mut at = INNERMOST.with(Cell::get);
    while !at.is_null() {
        // SAFETY: the list holds only live nodes: each is a `Box` that
        // `link` put in, owned by the `Unlink` it returned, whose drop
        // takes exactly that node out (wherever it is in the list then:
        // calls need not end in the order they began) before it frees it,
        // and nothing else frees one. An `Unlink` never dropped leaks its
        // node, which stays live. The list is this thread's own: the
        // thread-local is reached from this thread alone, and `Unlink` is
        // not `Send` (a raw pointer), so it is dropped on the thread that
        // linked its node.
        let node = unsafe { &*at };
        if ptr::eq(node.key, key) {
            return true;
        }
        at = node.outer.get();
    }
    false
}

/// Puts a node of `key` first in this thread's list, until the returned
/// guard is dropped.
fn link(key: &Key) -> Unlink {
    let node = Box::into_raw(Box::new(Node { key, outer: Cell::new(INNERMOST.with(Cell::get)) }));
    INNERMOST.with(|i| i.set(node));
    Unlink(node)
}

/// Owns a node of this thread's list: its drop takes the node out by
/// identity, wherever it is in the list now, and frees it.
struct Unlink(*mut Node);

impl Drop for Unlink {
    fn drop(&mut self) {
        let this: *const Node = self.0;
        // SAFETY: `self.0` came from `Box::into_raw` in `link` and is freed
        // only below, so it is live.
        let outer = unsafe { &*this }.outer.get();
        if INNERMOST.with(Cell::get) == this {
            INNERMOST.with(|i| i.set(outer));
        } else {
            let mut at = INNERMOST.with(Cell::get);
            let mut found = false;
            while !at.is_null() && !found {
                // SAFETY: as in `linked`: every node in the list is live.
                let node = unsafe { &*at };
                found = node.outer.get() == this;
                if found {
                    node.outer.set(outer);
                }
                at = node.outer.get();
            }
            debug_assert!(found, "a node that is not in its thread's list");
        }
        // SAFETY: made by `Box::into_raw` in `link`, freed only here, once,
        // and out of the list now: nothing reaches it any more.
        drop(unsafe { Box::from_raw(self.0) });
    }
}

#[cfg(test)]
mod tests {
    use super::{run, Key};

    #[test]
    fn a_key_runs_once_per_thread_until_its_call_returns() {
        let (a, b) = (Key::default(), Key::default());
        let nested = run(&a, || {
            // Refused as often as asked: a refusal leaves the call in force.
            assert!(run(&a, || ()).is_none(), "again on this thread");
            assert!(run(&a, || ()).is_none(), "and again");
            assert_eq!(run(&b, || run(&a, || ()).is_none()), Some(true), "inside another key's call");
            std::thread::scope(|s| {
                s.spawn(|| assert!(run(&a, || ()).is_some(), "another thread"));
            });
            7
        });
        assert_eq!(nested, Some(7));
        assert!(run(&a, || ()).is_some(), "after it returned");
        // A panic unwinding through the call takes it out too.
        assert!(std::panic::catch_unwind(|| run(&a, || panic!("out"))).is_err());
        assert!(run(&a, || ()).is_some(), "after it unwound");
    }

    /// Calls that end out of the order they began (a callback that
    /// switches stacks, as a coroutine library's safe `resume` or a
    /// greenlet's switch does) take their own node out, and no other: the
    /// list never holds a node that is gone. Before, a call put back the
    /// list as it was when it began, so it dropped the nodes of calls still
    /// in progress and kept ones whose calls had ended, freed with their
    /// frames.
    #[test]
    fn calls_that_end_out_of_order_take_out_their_own_node() {
        use super::{link, linked};
        let (a, b, c) = (Key::default(), Key::default(), Key::default());
        let ua = link(&a);
        let ub = link(&b);
        // `a`'s call ends first, under `b`'s.
        drop(ua);
        assert!(!linked(&a) && linked(&b));
        assert_eq!(run(&c, || (linked(&b), run(&b, || ()).is_none())), Some((true, true)));
        drop(ub);
        assert!(!linked(&b) && run(&b, || ()).is_some());
        // The middle one of three.
        let (ua, ub, uc) = (link(&a), link(&b), link(&c));
        drop(ub);
        assert!(linked(&a) && !linked(&b) && linked(&c));
        drop(ua);
        assert!(!linked(&a) && linked(&c));
        drop(uc);
        assert!(super::INNERMOST.with(std::cell::Cell::get).is_null());
    }

    /// An adaptor whose upstream, held by value, begins at its own
    /// address has a key of its own. Keyed by the adaptor's address, the
    /// upstream's code ran as the adaptor's: a free from a failure
    /// callback through a log under it lost its row.
    #[test]
    fn keys_of_an_adaptor_and_of_the_upstream_at_its_address_differ() {
        struct Adaptor {
            upstream: Inner,
            key: Key,
        }
        struct Inner {
            key: Key,
        }
        let x = Adaptor { upstream: Inner { key: Key::default() }, key: Key::default() };
        let outer = run(&x.key, || run(&x.upstream.key, || ()).is_some());
        assert_eq!(outer, Some(true));
    }

    /// The list lives while the thread's other thread-locals are
    /// destroyed: a call from a destructor of one is still refused inside
    /// itself. Before, the list was gone then and every call was let in.
    #[test]
    fn calls_from_thread_local_destructors_are_refused_inside_themselves() {
        use std::sync::atomic::{AtomicU8, Ordering::Relaxed};
        static KEY: Key = Key(0);
        // 0: not run, 1: refused inside itself, 2: let in.
        static SEEN: AtomicU8 = AtomicU8::new(0);
        struct AtExit;
        impl Drop for AtExit {
            fn drop(&mut self) {
                let inner = run(&KEY, || run(&KEY, || ()).is_some());
                SEEN.store(if inner == Some(false) { 1 } else { 2 }, Relaxed);
            }
        }
        std::thread_local! {
            static AT_EXIT: AtExit = const { AtExit };
            static LIST: std::cell::RefCell<std::vec::Vec<u8>> = const { std::cell::RefCell::new(std::vec::Vec::new()) };
        }
        std::thread::spawn(|| {
            AT_EXIT.with(|_| ());
            // Destroyed before `AT_EXIT` (in reverse order of first use).
            LIST.with(|l| l.borrow_mut().push(1));
            run(&KEY, || ());
        })
        .join()
        .unwrap();
        assert_eq!(SEEN.load(Relaxed), 1);
    }
}
