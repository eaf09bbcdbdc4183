//! Redis orders members of equal score byte by byte, whatever its locale; the scripts that find
//! a place by rank compare the same way. (Lua's `<` collates by the C library's locale, which a
//! redis-server started under a UTF-8 locale inherits: there 'a' < 'B', while Redis puts 'B'
//! first.)

use std::process::Command;

use eggtimer::store::{NewTask, ScheduleMode};
use eggtimer_tests::{RedisServer, noop_task, now_ms, store_on, temp_dir};

/// A locale directory holding en_US.UTF-8, made with `localedef` into a temp dir (for LOCPATH).
fn utf8_locale() -> std::path::PathBuf {
    let dir = temp_dir("locale");
    let out = Command::new("localedef")
        .args(["-i", "en_US", "-f", "UTF-8"])
        .arg(dir.join("en_US.UTF-8"))
        .output()
        .unwrap_or_else(|e| panic!("running localedef ({e}): `sudo apt-get install -y locales`"));
    assert!(
        out.status.success(),
        "localedef -i en_US -f UTF-8 failed (the locale sources come with Debian's `locales`: \
         `sudo apt-get install -y locales`): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    dir
}

/// A paused plugin's 1,000 tasks due at one instant, half with upper-case ids and half with
/// lower-case ones, parked by claims and resumed in chunks of 500 (each chunk finds its place by
/// rank among the equal scores): every one comes back and runs.
#[tokio::test]
async fn resume_under_a_utf8_locale_puts_back_every_parked_task() {
    let locales = utf8_locale();
    let redis = RedisServer::start_in_env(
        &[],
        &[
            ("LOCPATH", locales.to_str().unwrap()),
            ("LC_ALL", "en_US.UTF-8"),
        ],
    );
    // the server does collate by the locale: Lua's '<' puts 'a' before 'B' there
    let lua_says: i64 = redis::cmd("EVAL")
        .arg("if 'a' < 'B' then return 1 else return 0 end")
        .arg(0)
        .query(&mut redis.conn())
        .unwrap();
    assert_eq!(
        lua_says, 1,
        "the redis-server did not take the UTF-8 locale"
    );
    let s = store_on(&redis, 1).await;
    s.set_paused("noop", true).await.unwrap();
    let due = now_ms() - 1000;
    let tasks: Vec<NewTask> = (0..500)
        .flat_map(|i| [format!("A{i:04}"), format!("a{i:04}")])
        .map(|id| noop_task(&id, due))
        .collect();
    s.schedule(&tasks, ScheduleMode::Upsert).await.unwrap();
    assert!(s.claim(0, 2000, 30_000).await.unwrap().tasks.is_empty());
    assert_eq!(s.set_paused("noop", false).await.unwrap(), 1000);
    let mut ran = 0;
    loop {
        let b = s.claim(0, 2000, 30_000).await.unwrap();
        if b.tasks.is_empty() {
            break;
        }
        ran += b.tasks.len();
    }
    assert_eq!(ran, 1000);
}
