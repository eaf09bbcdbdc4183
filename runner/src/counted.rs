//! A count of things in progress kept by a guard: one more while the guard lives, one less when
//! it drops (also when the future holding it is dropped unfinished).

use std::sync::atomic::{AtomicUsize, Ordering};

/// Counts one in `n` while it lives.
pub(crate) struct Counted<'a>(&'a AtomicUsize);

impl<'a> Counted<'a> {
    pub(crate) fn new(n: &'a AtomicUsize) -> Self {
        n.fetch_add(1, Ordering::Relaxed);
        Counted(n)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}
