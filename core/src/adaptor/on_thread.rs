//! What runs on the calling thread now (feature `std`): how an adaptor
//! tells a call of its own code back into itself (a callback, a writer)
//! from another thread's call.

use core::cell::Cell;
use core::ptr;

/// What tells one adaptor's code from another's on a thread: a field of
/// the adaptor, by its address. It is never of size zero, so no two live
/// keys share an address; the adaptor's own address would not do, as an
/// upstream it holds by value can begin at it.
#[derive(Debug, Default)]
pub(crate) struct Key(#[allow(dead_code)] u8);

/// One call of [`run`] in progress: a local of that call, linked into
/// this thread's list while the call runs.
struct Node {
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
/// caller is inside it.
pub(crate) fn run<T>(key: &Key, f: impl FnOnce() -> T) -> Option<T> {
    if linked(key) {
        return None;
    }
    let node = Node { key, outer: Cell::new(ptr::null()) };
    let _unlink = link(&node);
    Some(f())
}

/// Whether a node of `key` is in this thread's list.
fn linked(key: &Key) -> bool {
    let mut at = INNERMOST.with(Cell::get);
    while !at.is_null() {
        // SAFETY: `at` is read from the list, which holds only live nodes.
        // `link` (private) is called by `run` alone, on a local declared
        // before the `Unlink` it returns, so the node is dropped after the
        // `Unlink`, whose drop, on return or unwind, takes exactly this
        // node out, whichever nodes were linked in and out meanwhile:
        // calls need not end in the order they began (a callback may
        // switch stacks). A stack switched away from and never resumed
        // is never freed either unless unwound, which drops the `Unlink`.
        // The list is this thread's own: a call ends on the thread it
        // began on, since a stack moved to another thread would break
        // `LocalKey::with` in safe code as well (a reference to a
        // thread-local held across the move), and `Node` is neither
        // `Send` nor `Sync`.
        let node = unsafe { &*at };
        if ptr::eq(node.key, key) {
            return true;
        }
        at = node.outer.get();
    }
    false
}

/// Puts `node` first in this thread's list, until the returned guard is
/// dropped.
fn link(node: &Node) -> Unlink<'_> {
    node.outer.set(INNERMOST.with(Cell::get));
    INNERMOST.with(|i| i.set(node));
    Unlink(node)
}

/// Takes its node out of this thread's list: by identity, wherever it is
/// in the list now.
struct Unlink<'a>(&'a Node);

impl Drop for Unlink<'_> {
    fn drop(&mut self) {
        let this: *const Node = self.0;
        let outer = self.0.outer.get();
        if INNERMOST.with(Cell::get) == this {
            INNERMOST.with(|i| i.set(outer));
            return;
        }
        let mut at = INNERMOST.with(Cell::get);
        while !at.is_null() {
            // SAFETY: as in `linked`: every node in the list is live.
            let node = unsafe { &*at };
            if node.outer.get() == this {
                node.outer.set(outer);
                return;
            }
            at = node.outer.get();
        }
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
    /// switches stacks, as a coroutine library's safe `resume` does) take
    /// their own node out, and no other: the list never holds a node that
    /// is gone. Before, a call put back the list as it was when it began,
    /// and the next call read a node freed meanwhile (Miri: a use after
    /// free).
    #[test]
    fn calls_that_end_out_of_order_take_out_their_own_node() {
        use super::{link, linked, Node};
        let (a, b, c) = (Key::default(), Key::default(), Key::default());
        let nb = Node { key: &b, outer: Default::default() };
        let ub = {
            let na = Node { key: &a, outer: Default::default() };
            let ua = link(&na);
            let ub = link(&nb);
            // `a`'s call ends first, under `b`'s, and its node is freed.
            drop(ua);
            assert!(!linked(&a) && linked(&b));
            ub
        };
        assert!(!linked(&c) && linked(&b), "the list is walked past where `a` was");
        assert!(run(&c, || (linked(&b), run(&b, || ()).is_none())) == Some((true, true)));
        drop(ub);
        assert!(!linked(&b) && run(&b, || ()).is_some());
        // The middle one of three.
        let (na, nb, nc) = [&a, &b, &c].map(|k| Node { key: k, outer: Default::default() }).into();
        let ua = link(&na);
        let ub = link(&nb);
        let uc = link(&nc);
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
