//! Test plugin: writes one kv entry of 64 KiB named `id` (`what: "kv-one"`), or
//! floods one kind of effect until the host stops it (`what`: `kv`, `kv-reads`
//! (one key read again and again), `events`, `logs`, `follow-ups`, `cancels`), or forks (`fork`:
//! 50 follow-ups that fork again, due at once, of the task's owner), or, with `what: "one-of-each"`, asks for one of each and
//! then for a kv write with an impossible TTL (which must fail that write alone, at once), or,
//! with `what: "cancel"`, cancels the task `id` (the host cancels only tasks of this plugin, or of one its
//! `may_schedule` covers), or,
//! with `what: "priorities"`, schedules three follow-ups of the task's owner an hour ahead: one
//! without a priority, one of priority 9, and one of priority 10, whose refusal's text is the
//! `id` of a fourth (without a priority), or,
//! with `what: "schedule"`, schedules a task of the plugin `id` (the host refuses one of another
//! plugin unless this one's `may_schedule` covers it), or
//! returns an outcome out of bounds (`retry-never`, `run-again-never`) or a 32 MiB error
//! (`long-error`, `long-fail`), or prints one line naming
//! the task to stdout and one to stderr (`print`), or prints to stdout until the host stops it
//! (`stdout`), or logs and prints a line or two naming its attempt and fails attempts 1 to 3
//! (`log-attempts`).

use eggtimer_sdk::{FollowUp, Level, Outcome, Task, emit, handler, kv, log};
use serde::Deserialize;

#[derive(Deserialize)]
pub struct Flood {
    pub what: String,
    #[serde(default)]
    pub id: String,
    /// With `kv`, `events` or `follow-ups`: stop at the first refusal and end done, so that
    /// what the host took (as much as it takes) is committed.
    #[serde(default)]
    pub keep: bool,
}

pub fn handle(task: Task<Flood>) -> eggtimer_sdk::Result {
    let big = "x".repeat(64 * 1024);
    match task.payload.what.as_str() {
        "kv" => {
            for i in 0.. {
                match kv::set(&format!("k{i}"), &big, None) {
                    Err(_) if task.payload.keep => break,
                    r => r?,
                }
            }
        }
        "kv-one" => kv::set(&task.payload.id, &big, None)?,
        "kv-reads" => {
            for _ in 0.. {
                kv::get::<String>("same")?;
            }
        }
        "events" => {
            for _ in 0.. {
                match emit("flood", &big) {
                    Err(_) if task.payload.keep => break,
                    r => r?,
                }
            }
        }
        "logs" => {
            for _ in 0.. {
                log(Level::Debug, &big);
            }
        }
        "schedule" => {
            let id = eggtimer_sdk::schedule(FollowUp::new(
                &task.payload.id,
                &serde_json::json!({"order_id": "o-from-test-flood", "user_id": "u-flood"}),
            )?)?;
            log(Level::Info, &format!("scheduled {id}"));
        }
        "follow-ups" => {
            for i in 0.. {
                let next = serde_json::json!({"what": "none", "id": i.to_string()});
                match eggtimer_sdk::schedule(FollowUp::new("test-flood", &next)?) {
                    Err(_) if task.payload.keep => break,
                    r => {
                        r?;
                    }
                }
            }
        }
        "fork" => {
            for _ in 0..50 {
                let again = serde_json::json!({"what": "fork"});
                let mut next = FollowUp::new("test-flood", &again)?;
                if let Some(owner) = &task.owner {
                    next = next.owner(owner);
                }
                eggtimer_sdk::schedule(next)?;
            }
        }
        "cancels" => {
            for i in 0.. {
                eggtimer_sdk::cancel(&format!("t{i}"));
            }
        }
        "one-of-each" => {
            kv::set("written", &true, None)?;
            emit("flood", &"one")?;
            let bad = kv::set(
                "bad-ttl",
                &true,
                Some(std::time::Duration::from_secs(400 * 365 * 86400)),
            );
            return match bad {
                Err(e) => Err(format!("the bad TTL was refused: {e}").into()),
                Ok(()) => Ok(Outcome::Done),
            };
        }
        "cancel" => eggtimer_sdk::cancel(&task.payload.id),
        "priorities" => {
            let later = |id: &str| -> eggtimer_sdk::Result<FollowUp> {
                let next = serde_json::json!({"what": "none", "id": id});
                let f = FollowUp::new("test-flood", &next)?.at(eggtimer_sdk::now() + 3_600_000);
                Ok(match &task.owner {
                    Some(owner) => f.owner(owner),
                    None => f,
                })
            };
            eggtimer_sdk::schedule(later("inherits")?)?;
            eggtimer_sdk::schedule(later("nine")?.priority(9))?;
            match eggtimer_sdk::schedule(later("ten")?.priority(10)) {
                Ok(_) => return Ok(Outcome::Fail("priority 10 was taken".into())),
                Err(e) => eggtimer_sdk::schedule(later(&e.to_string())?)?,
            };
        }
        "print" => {
            println!("printed by {}", task.id);
            eprintln!("warned by {}", task.id);
        }
        "log-attempts" => {
            let n = task.attempt;
            log(Level::Info, &format!("attempt {n} begins"));
            println!("printed in attempt {n}");
            if n < 4 {
                log(Level::Warn, &format!("attempt {n} fails"));
                return Err(format!("attempt {n} failed on purpose").into());
            }
        }
        "stdout" => {
            use std::io::Write;
            let mut out = std::io::stdout();
            for _ in 0.. {
                if let Err(e) = out.write_all(big.as_bytes()).and_then(|()| out.flush()) {
                    return Err(format!("writing to stdout failed: {e}").into());
                }
            }
        }
        "retry-never" => return Ok(Outcome::RetryAfter(std::time::Duration::MAX)),
        "long-error" => return Err("e".repeat(32 << 20).into()),
        "long-fail" => return Ok(Outcome::Fail("f".repeat(32 << 20))),
        "run-again-never" => return Ok(Outcome::RunAgainAt(i64::MAX)),
        other => return Ok(Outcome::Fail(format!("unknown flood {other:?}"))),
    }
    Ok(Outcome::Done)
}

handler!(handle);
