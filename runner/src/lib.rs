//! eggtimer: a durable, millisecond-precise delayed-task runner on Redis, running tasks through
//! WebAssembly plugins. See ARCHITECTURE.md for the map of the modules.

pub mod api;
// the ground floor and the store are crates of their own, so neither can import a room above it;
// the runner's modules name them as `eggtimer_base` and `eggtimer_store`, these serve the crates
// outside (the tests, the benchmark) under the paths they had
pub use eggtimer_base::{access, clock, failpoint, limits, names, plugin_settings, policy};
pub use eggtimer_store as store;
pub mod cli;
pub mod config;
mod counted;
pub mod dry_local;
pub mod executor;
pub mod local_redis;
pub mod membership;
pub mod metrics;
mod pace;
pub mod plugins;
pub mod poller;
pub mod recurring;
pub mod runner;
pub mod serve;
pub mod shards;
pub mod table;
pub mod tasks;
pub mod trace;

pub use executor::{Effects, Handler, Outcome, Run, TaskHost};
pub use runner::{Runner, RunnerOptions};
pub use store::{Claimed, NewTask, RedisTarget, Store, StoreOptions};
