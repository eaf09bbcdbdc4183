//! eggtimer: a durable, millisecond-precise delayed-task runner on Redis, running tasks through
//! WebAssembly plugins. See ARCHITECTURE.md for the map of the modules.

pub mod access;
pub mod api;
pub mod cli;
pub mod clock;
pub mod config;
mod counted;
pub mod dry_local;
pub mod executor;
pub mod failpoint;
pub mod limits;
pub mod local_redis;
pub mod membership;
pub mod metrics;
pub mod names;
mod pace;
pub mod plugin_settings;
pub mod plugins;
pub mod policy;
pub mod poller;
pub mod recurring;
pub mod runner;
pub mod serve;
pub mod shards;
pub mod store;
pub mod table;
pub mod tasks;
pub mod trace;

pub use executor::{Effects, Handler, Outcome, Run, TaskHost};
pub use runner::{Runner, RunnerOptions};
pub use store::{Claimed, NewTask, RedisTarget, Store, StoreOptions};
