//! eggtimer's ground floor: what every part of the runner shares and none of it may change the
//! meaning of. The names (a plugin's, a topic's, a task's id, an owner's) with the one rule each
//! is made by, the bounds every input keeps, who may do what, what a plugin's settings are and
//! what they come to on a runner, a failpoint for the crash tests and the clock that follows
//! Redis's.
//!
//! It is a crate of its own so that nothing here can import a room above it: the store builds on
//! it, and the runner on both.

pub mod access;
pub mod clock;
pub mod failpoint;
pub mod limits;
pub mod names;
pub mod plugin_settings;
pub mod policy;
