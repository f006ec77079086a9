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

/// One call of [`run`] in progress: a local of that call.
struct Node {
    key: *const Key,
    /// The call it runs inside of, or null.
    outer: *const Node,
}

std::thread_local! {
    /// The innermost call of [`run`] on this thread, whose nodes link to
    /// the outer ones. A pointer, without a destructor: the list stays
    /// there while the thread's other thread-locals are destroyed, whose
    /// destructors may call adaptors too.
    static INNERMOST: Cell<*const Node> = const { Cell::new(ptr::null()) };
}

/// Runs `f` as code of the adaptor whose key is `key`; `None`, without
/// running it, if code of that adaptor runs on this thread already: the
/// caller is inside it.
pub(crate) fn run<T>(key: &Key, f: impl FnOnce() -> T) -> Option<T> {
    let outer = INNERMOST.with(Cell::get);
    let mut at = outer;
    while !at.is_null() {
        // SAFETY: the list holds only nodes of calls of `run` in progress
        // on this thread: each is linked in below, a local of its call, and
        // `Unlink` takes it out before that call returns or unwinds; the
        // list is this thread's own, and its calls nest (each returns
        // before the one it was made from: a thread runs one stack; a
        // coroutine library that switched stacks inside `f` would break
        // `scoped-tls`-like code everywhere, and cannot be safe to use).
        // So `at` points to a live `Node`.
        let node = unsafe { &*at };
        if ptr::eq(node.key, key) {
            return None;
        }
        at = node.outer;
    }
    let node = Node { key, outer };
    INNERMOST.with(|i| i.set(&node));
    let _unlink = Unlink(outer);
    Some(f())
}

/// Puts the list back as it was before a call of [`run`] linked its node.
struct Unlink(*const Node);

impl Drop for Unlink {
    fn drop(&mut self) {
        INNERMOST.with(|i| i.set(self.0));
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
