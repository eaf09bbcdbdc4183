//! The Lua scripts, each built once from `lua/prelude.lua` + its own file.

use redis::Script;

pub struct Scripts {
    pub schedule: Script,
    pub claim: Script,
    pub renew: Script,
    pub finish: Script,
    pub move_task: Script,
    pub cancel: Script,
    pub revive: Script,
    pub shift_owner: Script,
    pub pause: Script,
    pub bulk: Script,
    pub fire: Script,
    pub migrate: Script,
    pub range: Script,
    pub due_range: Script,
    pub due_count: Script,
    pub sched: Script,
    pub slots: Script,
    pub effects: Script,
    pub plugin_put: Script,
    pub plugin_rollback: Script,
    pub plugin_delete: Script,
    pub lease: Script,
    pub heartbeat: Script,
}

const PRELUDE: &str = include_str!("lua/prelude.lua");

fn with_prelude(body: &str) -> Script {
    Script::new(&format!("{PRELUDE}\n{body}"))
}

impl Scripts {
    pub fn load() -> Self {
        let s = Self::build();
        super::connection::SCRIPT_NAMES.get_or_init(|| s.names());
        s
    }

    /// The scripts' names by SHA1, for the Redis round-trip metric.
    fn names(&self) -> std::collections::HashMap<String, &'static str> {
        [
            (&self.schedule, "schedule"),
            (&self.claim, "claim"),
            (&self.renew, "renew"),
            (&self.finish, "finish"),
            (&self.move_task, "move"),
            (&self.cancel, "cancel"),
            (&self.revive, "revive"),
            (&self.shift_owner, "shift_owner"),
            (&self.pause, "pause"),
            (&self.bulk, "bulk"),
            (&self.fire, "fire"),
            (&self.migrate, "migrate"),
            (&self.range, "range"),
            (&self.due_range, "due_range"),
            (&self.due_count, "due_count"),
            (&self.sched, "sched"),
            (&self.slots, "slots"),
            (&self.effects, "effects"),
            (&self.plugin_put, "plugin_put"),
            (&self.plugin_rollback, "plugin_rollback"),
            (&self.plugin_delete, "plugin_delete"),
            (&self.lease, "lease"),
            (&self.heartbeat, "heartbeat"),
        ]
        .into_iter()
        .map(|(s, n)| (s.get_hash().to_owned(), n))
        .collect()
    }

    fn build() -> Self {
        Scripts {
            schedule: with_prelude(include_str!("lua/schedule.lua")),
            claim: with_prelude(include_str!("lua/claim.lua")),
            renew: with_prelude(include_str!("lua/renew.lua")),
            finish: with_prelude(include_str!("lua/finish.lua")),
            move_task: with_prelude(include_str!("lua/move.lua")),
            cancel: with_prelude(include_str!("lua/cancel.lua")),
            revive: with_prelude(include_str!("lua/revive.lua")),
            shift_owner: with_prelude(include_str!("lua/shift_owner.lua")),
            pause: with_prelude(include_str!("lua/pause.lua")),
            bulk: with_prelude(include_str!("lua/bulk.lua")),
            fire: with_prelude(include_str!("lua/fire.lua")),
            migrate: with_prelude(include_str!("lua/migrate.lua")),
            range: with_prelude(include_str!("lua/range.lua")),
            due_range: with_prelude(include_str!("lua/due_range.lua")),
            due_count: with_prelude(include_str!("lua/due_count.lua")),
            sched: Script::new(include_str!("lua/sched.lua")),
            slots: Script::new(include_str!("lua/slots.lua")),
            effects: Script::new(include_str!("lua/effects.lua")),
            plugin_put: Script::new(include_str!("lua/plugin_put.lua")),
            plugin_rollback: Script::new(include_str!("lua/plugin_rollback.lua")),
            plugin_delete: Script::new(include_str!("lua/plugin_delete.lua")),
            lease: Script::new(include_str!("lua/lease.lua")),
            heartbeat: Script::new(include_str!("lua/heartbeat.lua")),
        }
    }
}
