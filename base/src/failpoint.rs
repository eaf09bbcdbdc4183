//! Failpoints: a runner started with `EGGTIMER_FAILPOINT=<name>` (a hidden `serve` flag) aborts
//! (as a kill -9 would: no cleanup, nothing more written) when it reaches the point of that name,
//! so a test can stop a real runner at an exact place between two steps of one change and check
//! what the next runner makes of what it left. Unarmed, a point costs a load of a static.

use std::sync::OnceLock;

static ARMED: OnceLock<String> = OnceLock::new();

/// Arms the point `name` (once per process; `serve` calls it from its flag).
pub fn arm(name: String) {
    let _ = ARMED.set(name);
}

/// Aborts the process if the armed point is this one.
pub fn hit(name: &str) {
    if ARMED.get().is_some_and(|armed| armed == name) {
        eprintln!("eggtimer: failpoint {name:?} reached: aborting");
        std::process::abort();
    }
}
