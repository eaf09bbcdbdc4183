//! Failpoints: with `EGGTIMER_FAILPOINT=<name>` the process aborts (as a kill -9 would: no
//! cleanup, nothing more written) when it reaches the point of that name, so a test can stop a
//! real runner at an exact place between two steps of one change and check what the next runner
//! makes of what it left. Unset, a point costs a load of a static.

use std::sync::OnceLock;

/// Aborts the process if `EGGTIMER_FAILPOINT` names this point.
pub fn hit(name: &str) {
    static ARMED: OnceLock<Option<String>> = OnceLock::new();
    let armed = ARMED.get_or_init(|| std::env::var("EGGTIMER_FAILPOINT").ok());
    if armed.as_deref() == Some(name) {
        eprintln!("eggtimer: failpoint {name:?} reached: aborting");
        std::process::abort();
    }
}
