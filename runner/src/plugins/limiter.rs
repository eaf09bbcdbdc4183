//! What one plugin instance may hold: its memory cap counts every linear memory of the instance
//! together, and its core instances, memories and tables are capped per instance, so no plugin
//! can take the allocator's slots from another (the pool has room for every instance at its caps).

use wasmtime::{ResourceLimiter, Result, bail};

/// Core instances one plugin instance may hold (a component of several modules needs a few:
/// the samples built with Rust hold 3, with jco 8, with componentize-py 14).
pub const CORE_INSTANCES: u32 = 32;
/// Linear memories one plugin instance may hold (the samples hold 1 or 2).
pub const MEMORIES: u32 = 4;
/// Tables one plugin instance may hold.
pub const TABLES: u32 = 16;
/// Elements of one table (the allocator's slots are this big).
pub const TABLE_ELEMENTS: usize = 20_000;
/// The most memory an admin can give a plugin (a 32-bit wasm memory's whole space).
pub const MAX_MEMORY_BYTES: usize = 4 << 30;

/// How a refused growth's message starts; `explain_trap` looks for it.
pub const OVER_MEMORY: &str = "the plugin needed more than its memory limit";

/// The limits of one instance's store.
#[derive(Debug)]
pub struct Limiter {
    /// Bytes of all its linear memories together (the plugin's `memory_bytes`).
    cap: usize,
    /// Bytes its memories hold now.
    used: usize,
    /// The growth asked last, undone if the allocator could not give it.
    last: usize,
}

impl Limiter {
    pub fn new(cap: usize) -> Limiter {
        Limiter {
            cap,
            used: 0,
            last: 0,
        }
    }

    /// A new cap for the next call (a plugin's `memory_bytes` changed); false when the instance
    /// already holds more than it (it can't give memory back: drop it).
    pub fn set_cap(&mut self, cap: usize) -> bool {
        self.cap = cap;
        self.used <= cap
    }
}

impl ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> Result<bool> {
        let grow = desired.saturating_sub(current);
        let total = self.used.saturating_add(grow);
        if total > self.cap {
            bail!(
                "{OVER_MEMORY} of {} MiB (it held {} MiB and asked for {} KiB more)",
                self.cap >> 20,
                self.used >> 20,
                grow >> 10
            );
        }
        self.used = total;
        self.last = grow;
        Ok(true)
    }

    fn memory_grow_failed(&mut self, _error: wasmtime::Error) -> Result<()> {
        self.used -= self.last;
        self.last = 0;
        Ok(())
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> Result<bool> {
        if desired > TABLE_ELEMENTS {
            bail!("the plugin asked for a table of {desired} elements (at most {TABLE_ELEMENTS})");
        }
        Ok(true)
    }

    fn instances(&self) -> usize {
        CORE_INSTANCES as usize
    }

    fn tables(&self) -> usize {
        TABLES as usize
    }

    fn memories(&self) -> usize {
        MEMORIES as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_counts_every_memory_together() {
        let mut l = Limiter::new(10 << 20);
        assert!(l.memory_growing(0, 6 << 20, None).unwrap());
        // a second memory of 6 MiB would pass a per-memory cap of 10 MiB: not this one
        let e = l.memory_growing(0, 6 << 20, None).unwrap_err();
        assert!(e.to_string().contains(OVER_MEMORY), "{e}");
        assert!(l.memory_growing(0, 4 << 20, None).unwrap());
        assert_eq!(l.used, 10 << 20);
        // growing the first by one page more is refused too
        assert!(l.memory_growing(6 << 20, (6 << 20) + 65536, None).is_err());
    }

    #[test]
    fn a_failed_growth_gives_its_bytes_back() {
        let mut l = Limiter::new(10 << 20);
        assert!(l.memory_growing(0, 8 << 20, None).unwrap());
        l.memory_grow_failed(wasmtime::format_err!("no room"))
            .unwrap();
        assert_eq!(l.used, 0);
        assert!(l.memory_growing(0, 8 << 20, None).unwrap());
    }

    #[test]
    fn a_smaller_cap_says_whether_the_instance_still_fits() {
        let mut l = Limiter::new(10 << 20);
        assert!(l.memory_growing(0, 4 << 20, None).unwrap());
        assert!(l.set_cap(4 << 20));
        assert!(!l.set_cap(2 << 20));
    }

    #[test]
    fn tables_are_bounded() {
        let mut l = Limiter::new(1 << 20);
        assert!(l.table_growing(0, TABLE_ELEMENTS, None).unwrap());
        assert!(l.table_growing(0, TABLE_ELEMENTS + 1, None).is_err());
    }
}
