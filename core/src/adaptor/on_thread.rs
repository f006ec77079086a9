//! What runs on the calling thread now, by the address of the object that
//! runs it (feature `std`): how an adaptor tells a call of its own code
//! back into itself (a callback, a writer) from another thread's call.

use alloc::vec::Vec;
use core::cell::RefCell;

std::thread_local! {
    /// The objects, by address, whose code runs on this thread now.
    static RUNNING: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

/// The object at `at` running code on this thread, from [`enter`](Self::enter)
/// until dropped (a panic that unwinds through it included).
pub(crate) struct OnThread {
    at: usize,
}

impl OnThread {
    /// `None` if the object at `at` runs on this thread already: the
    /// caller is inside its code.
    pub(crate) fn enter<T>(object: &T) -> Option<OnThread> {
        let at = core::ptr::from_ref(object) as usize;
        // A thread being torn down has no list: nothing of its runs.
        let entered = RUNNING
            .try_with(|r| {
                let mut r = r.borrow_mut();
                (!r.contains(&at)).then(|| r.push(at)).is_some()
            })
            .unwrap_or(true);
        // Made only when entered: a guard made and dropped would take the
        // entry of the call in progress out.
        entered.then(|| OnThread { at })
    }
}

impl Drop for OnThread {
    fn drop(&mut self) {
        let _ = RUNNING.try_with(|r| r.borrow_mut().retain(|&a| a != self.at));
    }
}

#[cfg(test)]
mod tests {
    use super::OnThread;

    #[test]
    fn an_object_enters_once_per_thread_until_its_guard_goes() {
        let (a, b) = (1u64, 2u64);
        let first = OnThread::enter(&a).expect("first");
        // Refused as often as asked: a refusal leaves the entry in force.
        assert!(OnThread::enter(&a).is_none(), "again on this thread");
        assert!(OnThread::enter(&a).is_none(), "and again");
        assert!(OnThread::enter(&b).is_some(), "another object");
        std::thread::scope(|s| {
            s.spawn(|| assert!(OnThread::enter(&a).is_some(), "another thread"));
        });
        drop(first);
        assert!(OnThread::enter(&a).is_some());
    }
}
