//! `noop-plain`: does nothing, built against the contract's `plugin` world (no `check`), as a
//! plugin built for eggtimer 0.1.0 is. The benchmark's W0 schedules for it beside `noop` (which
//! checks its payloads) to price a payload check; tests use it as a plugin that takes any payload.

#[allow(clippy::too_many_arguments)]
mod bindings {
    wit_bindgen::generate!({
        path: "../../wit",
        world: "plugin",
    });
}

use bindings::eggtimer::plugin::types::{Outcome, Task};

struct Plain;

impl bindings::Guest for Plain {
    fn handle(_task: Task) -> Result<Outcome, String> {
        Ok(Outcome::Done)
    }
}

bindings::export!(Plain with_types_in bindings);
