//! Whose turn it is to compile. One compile at a time (cranelift spreads a compile over every
//! core already), and when several teams wait (a team: the key that uploaded the plugin), the
//! compile that waited longest among those of teams not served last goes first: one team's
//! uploads, however many plugins, hold up another team's compile for one compile at most, where
//! a plain lock let whichever thread woke first win.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};

#[derive(Default)]
pub(super) struct Turns {
    state: Mutex<State>,
    freed: Condvar,
}

#[derive(Default)]
struct State {
    busy: bool,
    /// Waiting compiles (ticket, team), in the order they came.
    waiting: VecDeque<(u64, String)>,
    /// The team served last.
    last: Option<String>,
    tickets: u64,
}

impl State {
    /// The ticket whose turn is next: the first waiting of another team than the last one
    /// served, else the first.
    fn next(&self) -> Option<u64> {
        self.waiting
            .iter()
            .find(|(_, n)| Some(n) != self.last.as_ref())
            .or(self.waiting.front())
            .map(|(t, _)| *t)
    }
}

/// A compile's turn, held until it is dropped.
pub(super) struct Turn<'a>(&'a Turns);

impl Turns {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for a turn of `team` to compile (blocking).
    pub fn take(&self, team: &str) -> Turn<'_> {
        let mut st = self.lock();
        let me = st.tickets;
        st.tickets += 1;
        st.waiting.push_back((me, team.to_owned()));
        while st.busy || st.next() != Some(me) {
            st = self.freed.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        st.waiting.retain(|(t, _)| *t != me);
        st.busy = true;
        st.last = Some(team.to_owned());
        Turn(self)
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.0.lock().busy = false;
        self.0.freed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    /// While team `a` compiles, `a` asks twice more (two plugins, or one plugin again) and then
    /// `b` once: `b` goes next, not after both.
    #[test]
    fn a_team_compiling_again_and_again_lets_another_go_next() {
        let turns = Arc::new(Turns::default());
        let order = Arc::new(Mutex::new(Vec::new()));
        let first = turns.take("a");
        let mut threads = Vec::new();
        for name in ["a", "a", "b"] {
            let (mine, order) = (Arc::clone(&turns), Arc::clone(&order));
            threads.push(std::thread::spawn(move || {
                let _t = mine.take(name);
                order.lock().unwrap().push(name);
            }));
            // each is waiting before the next asks
            while turns.lock().waiting.len() < threads.len() {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        drop(first);
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*order.lock().unwrap(), ["b", "a", "a"]);
    }
}
