//! Recurring schedules: what one is and when it fires. Pure (no Redis, no clock): `driver` turns
//! them into tasks, the store keeps them (`store/src/recurring.rs`).
//!
//! A `cron` schedule is the 5-field form in an IANA time zone, evaluated by the `croner` crate,
//! which handles daylight saving time the way cron users expect: a wall-clock time that does not
//! exist that day (02:30 when clocks jump from 02:00 to 03:00) fires once at the next valid
//! minute, and a fixed time in the repeated hour fires once, at its first instance. An `every_ms`
//! schedule fires at `start_at + k · every_ms` (start_at defaults to the Unix epoch, so every
//! runner and every repeated PUT agree on the instants).

pub mod driver;

use std::str::FromStr;

use chrono::{DateTime, TimeZone};
use chrono_tz::Tz;
use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};
use serde::{Deserialize, Serialize};

use eggtimer_base::limits::{MAX_DURATION_MS, MAX_TIME_MS};

/// Shortest `every_ms`.
pub const MIN_EVERY_MS: i64 = 1000;

/// Whether `cron` has the shape of a 5-field expression: five fields separated by spaces, each of
/// digits, letters (month and day names) and `* , / - ? #` (the API document's pattern says the
/// same). Whether the fields make sense is the parser's answer.
pub fn is_cron_shaped(cron: &str) -> bool {
    let field = |f: &str| {
        !f.is_empty()
            && f.chars()
                .all(|c| c.is_ascii_alphanumeric() || "*,/?#-".contains(c))
    };
    let fields: Vec<&str> = cron.split(' ').filter(|f| !f.is_empty()).collect();
    fields.len() == 5 && fields.iter().all(|f| field(f))
}

/// One cron field's values: the regular expression of a number in its range, its least and
/// greatest value, and the names it may hold (alone, not in a range).
struct CronField {
    number: &'static str,
    min: u16,
    max: u16,
    names: &'static [&'static str],
    /// Whether `?` (any) may stand for the whole field.
    any: bool,
}

const MONTHS: &[&str] = &[
    "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
];
const DAYS: &[&str] = &["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];

/// minute hour day-of-month month day-of-week
const CRON_FIELDS: [CronField; 5] = [
    CronField {
        number: "[0-5]?[0-9]",
        min: 0,
        max: 59,
        names: &[],
        any: false,
    },
    CronField {
        number: "[01]?[0-9]|2[0-3]",
        min: 0,
        max: 23,
        names: &[],
        any: false,
    },
    CronField {
        number: "0?[1-9]|[12][0-9]|3[01]",
        min: 1,
        max: 31,
        names: &[],
        any: true,
    },
    CronField {
        number: "0?[1-9]|1[0-2]",
        min: 1,
        max: 12,
        names: MONTHS,
        any: false,
    },
    CronField {
        number: "[0-7]",
        min: 0,
        max: 7,
        names: DAYS,
        any: true,
    },
];

/// The regular expression of the cron expressions the API document promises to take: five
/// fields, each `*`, `?` (day fields), or a list of: a number in the field's range, a range
/// `a-b` (with `/step`; `a` past `b` wraps around: hours `22-2` are 22, 23, 0, 1, 2), `*/step`,
/// a month or day name (upper or lower case). The server takes more (`L`, `W`, `#`,
/// names in any case); a string that matches this is never refused.
pub fn cron_pattern() -> String {
    let step = "/[1-9][0-9]{0,2}";
    let fields: Vec<String> = CRON_FIELDS
        .iter()
        .map(|f| {
            let n = f.number;
            // `*` alone is the whole field; in a list only with a step
            let mut item = format!(r"\*{step}|({n})(-({n})({step})?)?");
            for name in f.names {
                item.push_str(&format!("|{name}|{}", name.to_lowercase()));
            }
            let any = if f.any { r"\?|" } else { "" };
            format!(r"(\*|{any}({item})(,({item}))*)")
        })
        .collect();
    format!("^ *{} *$", fields.join(" +"))
}

/// `cron` with each numeric range whose start is past its end written as the two ranges it
/// wraps around to (`22-2/2` → `22-23/2,0-2/2`), which is what the parser takes.
fn wrap_ranges(cron: &str) -> String {
    let fields: Vec<&str> = cron.split_whitespace().collect();
    if fields.len() != CRON_FIELDS.len() {
        return cron.to_owned();
    }
    let wrap = |item: &str, f: &CronField| -> Option<String> {
        let (range, step) = item
            .split_once('/')
            .map_or((item, None), |(r, s)| (r, Some(s)));
        let (a, b) = range.split_once('-')?;
        let (a, b): (u16, u16) = (a.parse().ok()?, b.parse().ok()?);
        let step = step.map_or(String::new(), |s| format!("/{s}"));
        (a > b).then(|| format!("{a}-{}{step},{}-{b}{step}", f.max, f.min))
    };
    fields
        .iter()
        .zip(&CRON_FIELDS)
        .map(|(field, f)| {
            field
                .split(',')
                .map(|item| wrap(item, f).unwrap_or_else(|| item.to_owned()))
                .collect::<Vec<_>>()
                .join(",")
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Firings missed by up to this long (a runner died and another took its shards over) are all
/// still created, late; of older ones (no runner ran) only the most recent is.
pub const CATCH_UP_MS: i64 = 60_000;

/// Whether a firing waits for the previous one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Overlap {
    /// No firing while the previous firing's task is scheduled and due, or running.
    #[default]
    Skip,
    /// Fire whatever the previous firing is doing.
    Allow,
}

/// A schedule's definition, as stored (JSON; equal definitions encode equally).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduleDef {
    pub plugin: String,
    /// Raw JSON text.
    pub payload: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cron: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every_ms: Option<i64>,
    pub tz: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_at: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_at: Option<i64>,
    pub max_attempts: u32,
    #[serde(default)]
    pub overlap: Overlap,
    /// Its firings' priority (0 is not stored: a definition 0.2.0 wrote reads as 0).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub priority: u8,
}

fn is_zero(n: &u8) -> bool {
    *n == 0
}

/// When a schedule fires, checked.
pub enum Rule {
    Cron(Box<Cron>, Tz),
    Every { every: i64, anchor: i64 },
}

fn cron_parser() -> CronParser {
    CronParser::builder()
        .seconds(Seconds::Disallowed)
        .year(Year::Disallowed)
        .build()
}

impl ScheduleDef {
    /// Checks the timing fields; the error names the field.
    pub fn rule(&self) -> Result<Rule, String> {
        let tz = Tz::from_str(&self.tz).map_err(|_| {
            format!(
                "tz {:?} is not an IANA time zone name (e.g. \"Europe/Berlin\")",
                self.tz
            )
        })?;
        if let (Some(s), Some(e)) = (self.start_at, self.end_at)
            && e < s
        {
            return Err("end_at is before start_at".into());
        }
        match (&self.cron, self.every_ms) {
            (Some(c), None) => {
                let cron = cron_parser().parse(&wrap_ranges(c)).map_err(|e| {
                    format!("cron {c:?} is not a 5-field cron expression (minute hour day-of-month month day-of-week): {e}")
                })?;
                Ok(Rule::Cron(Box::new(cron), tz))
            }
            (None, Some(every)) => {
                if !(MIN_EVERY_MS..=MAX_DURATION_MS).contains(&every) {
                    return Err(format!(
                        "every_ms must be from {MIN_EVERY_MS} to {MAX_DURATION_MS} (10 years), got {every}"
                    ));
                }
                Ok(Rule::Every {
                    every,
                    anchor: self.start_at.unwrap_or(0),
                })
            }
            _ => Err("give exactly one of cron and every_ms".into()),
        }
    }

    /// The first firing after `t` (ms), within start_at..=end_at; None when there is none.
    pub fn next_after(&self, t: i64) -> Option<i64> {
        let rule = self.rule().ok()?;
        let from = match self.start_at {
            Some(s) if s > t => s - 1,
            _ => t,
        };
        let next = match rule {
            Rule::Every { every, anchor } => {
                if from < anchor {
                    anchor
                } else {
                    anchor.checked_add(((from - anchor) / every + 1).checked_mul(every)?)?
                }
            }
            Rule::Cron(cron, tz) => {
                // cron fires on whole minutes: search from the whole second at or before `from`,
                // exclusive, which finds the first firing after `from` itself
                let at = at_ms(&tz, from.div_euclid(1000) * 1000)?;
                cron.find_next_occurrence(&at, false)
                    .ok()?
                    .timestamp_millis()
            }
        };
        (next <= self.end_at.unwrap_or(MAX_TIME_MS).min(MAX_TIME_MS)).then_some(next)
    }

    /// The latest firing at or before `t`, not before start_at (None: none yet).
    pub fn latest_at_or_before(&self, t: i64) -> Option<i64> {
        let t = t.min(self.end_at.unwrap_or(MAX_TIME_MS));
        let latest = match self.rule().ok()? {
            Rule::Every { every, anchor } => {
                if t < anchor {
                    return None;
                }
                anchor + (t - anchor) / every * every
            }
            Rule::Cron(cron, tz) => {
                let at = at_ms(&tz, t.div_euclid(1000) * 1000)?;
                cron.find_previous_occurrence(&at, true)
                    .ok()?
                    .timestamp_millis()
            }
        };
        (latest >= self.start_at.unwrap_or(i64::MIN)).then_some(latest)
    }

    /// The first firing at or after `t`.
    pub fn first_from(&self, t: i64) -> Option<i64> {
        self.next_after(t.checked_sub(1)?)
    }

    /// The next `n` firings after `t`.
    pub fn upcoming(&self, t: i64, n: usize) -> Vec<i64> {
        let mut out = Vec::with_capacity(n);
        let mut at = t;
        while out.len() < n {
            match self.next_after(at) {
                Some(next) => {
                    out.push(next);
                    at = next;
                }
                None => break,
            }
        }
        out
    }
}

fn at_ms(tz: &Tz, ms: i64) -> Option<DateTime<Tz>> {
    tz.timestamp_millis_opt(ms).single()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every_day(expr: &str) -> ScheduleDef {
        cron(expr, "UTC")
    }

    proptest::proptest! {
        /// What the API document's pattern admits, the parser takes (a fuzzer that reads the
        /// document sends such strings and must not be refused).
        #[test]
        fn every_cron_the_document_admits_parses(
            expr in proptest::string::string_regex(
                cron_pattern().trim_start_matches('^').trim_end_matches('$'),
            )
            .unwrap()
        ) {
            proptest::prop_assert!(is_cron_shaped(&expr), "{expr:?}");
            let rule = every_day(&expr).rule();
            proptest::prop_assert!(rule.is_ok(), "{expr:?}: {:?}", rule.err());
        }
    }

    #[test]
    fn the_document_does_not_admit_crons_out_of_range() {
        let pattern = regex::Regex::new(&cron_pattern()).unwrap();
        for bad in [
            "0 0 0 0 0",
            "60 * * * *",
            "0 24 * * *",
            "0 0 32 * *",
            "0 0 * 13 *",
            "* * * * 8",
            "0 0 1/2 * *",
            "*/0 * * * *",
            "? * * * *",
        ] {
            assert!(!pattern.is_match(bad), "{bad:?}");
            assert!(every_day(bad).rule().is_err(), "{bad:?}");
        }
        for good in [
            "*/5 * * * *",
            "0 9 * * MON-FRI",
            "0 0 1 jan,JUL ?",
            "59 23 31 12 7",
        ] {
            assert!(every_day(good).rule().is_ok(), "{good:?}");
        }
        // the server takes more than the document promises
        assert!(!pattern.is_match("0 9 * * MON-FRI"));
    }

    #[test]
    fn a_range_past_its_end_wraps_around() {
        assert_eq!(
            wrap_ranges("0 22-2/2 * * 5-1"),
            "0 22-23/2,0-2/2 * * 5-7,0-1"
        );
        assert_eq!(wrap_ranges("1-5,7 * * * *"), "1-5,7 * * * *");
        let def = every_day("0 22-1 * * *");
        let from = 1_767_225_600_000; // 2026-01-01T00:00:00Z
        let hours: Vec<i64> = std::iter::successors(def.next_after(from), |&t| def.next_after(t))
            .take(4)
            .map(|t| (t - from) / 3_600_000)
            .collect();
        assert_eq!(hours, [1, 22, 23, 24]);
    }

    #[test]
    fn a_cron_expression_has_five_fields() {
        assert!(is_cron_shaped("30 9 * * *"));
        assert!(is_cron_shaped(" */5 0-6 1,15 JAN-MAR MON#2 "));
        for bad in [
            "",
            "    ",
            "* * * *",
            "* * * * * *",
            "*\t* * * *",
            "* * * * é",
        ] {
            assert!(!is_cron_shaped(bad), "{bad:?}");
        }
    }

    fn cron(expr: &str, tz: &str) -> ScheduleDef {
        ScheduleDef {
            plugin: "p".into(),
            payload: "null".into(),
            cron: Some(expr.into()),
            every_ms: None,
            tz: tz.into(),
            owner: None,
            start_at: None,
            end_at: None,
            max_attempts: 5,
            overlap: Overlap::Skip,
            priority: 0,
        }
    }

    fn ny(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> i64 {
        chrono_tz::America::New_York
            .with_ymd_and_hms(y, mo, d, h, mi, 0)
            .earliest()
            .unwrap()
            .timestamp_millis()
    }

    const HOUR: i64 = 3_600_000;

    #[test]
    fn a_time_skipped_by_dst_fires_once_at_the_next_valid_minute() {
        // 2026-03-08: New York clocks jump from 02:00 to 03:00; 02:30 does not exist
        let d = cron("30 2 * * *", "America/New_York");
        let fires = d.upcoming(ny(2026, 3, 7, 12, 0), 3);
        assert_eq!(
            fires[0],
            ny(2026, 3, 8, 3, 0),
            "the skipped 02:30 fires at 03:00"
        );
        assert_eq!(fires[1], ny(2026, 3, 9, 2, 30));
        assert_eq!(fires[1] - fires[0], 23 * HOUR + 30 * 60_000);
    }

    #[test]
    fn a_time_in_the_repeated_hour_fires_once() {
        // 2026-11-01: New York clocks go back from 02:00 to 01:00; 01:30 happens twice
        let d = cron("30 1 * * *", "America/New_York");
        let fires = d.upcoming(ny(2026, 10, 31, 12, 0), 2);
        assert_eq!(fires[0], ny(2026, 11, 1, 1, 30), "the first 01:30");
        assert_eq!(
            fires[1] - fires[0],
            25 * HOUR,
            "the next firing is the next day's, not the repeated 01:30"
        );
    }

    #[test]
    fn every_ms_is_anchored_and_bounded() {
        let mut d = cron("", "UTC");
        d.cron = None;
        d.every_ms = Some(1000);
        d.start_at = Some(10_500);
        d.end_at = Some(13_500);
        assert_eq!(d.next_after(0), Some(10_500));
        assert_eq!(d.next_after(10_500), Some(11_500));
        assert_eq!(d.next_after(11_499), Some(11_500));
        assert_eq!(d.next_after(13_500), None, "past end_at");
        assert_eq!(d.latest_at_or_before(12_999), Some(12_500));
        assert_eq!(d.latest_at_or_before(10_000), None, "before start_at");
        assert_eq!(d.upcoming(0, 10), vec![10_500, 11_500, 12_500, 13_500]);
    }

    #[test]
    fn cron_next_is_strictly_after_and_latest_is_at_or_before() {
        let d = cron("*/15 * * * *", "UTC");
        assert_eq!(d.next_after(0), Some(15 * 60_000));
        assert_eq!(d.next_after(15 * 60_000), Some(30 * 60_000));
        assert_eq!(d.next_after(15 * 60_000 - 1), Some(15 * 60_000));
        assert_eq!(d.latest_at_or_before(31 * 60_000), Some(30 * 60_000));
        assert_eq!(d.latest_at_or_before(30 * 60_000), Some(30 * 60_000));
        assert_eq!(d.first_from(30 * 60_000), Some(30 * 60_000));
    }

    #[test]
    fn bad_definitions_name_the_field() {
        assert!(
            cron("61 * * * *", "UTC")
                .rule()
                .err()
                .unwrap()
                .contains("cron")
        );
        assert!(
            cron("* * * * * *", "UTC")
                .rule()
                .err()
                .unwrap()
                .contains("5-field")
        );
        assert!(
            cron("* * * * *", "Mars/Olympus")
                .rule()
                .err()
                .unwrap()
                .contains("tz")
        );
        let mut both = cron("* * * * *", "UTC");
        both.every_ms = Some(1000);
        assert!(both.rule().err().unwrap().contains("exactly one"));
        let mut fast = cron("", "UTC");
        fast.cron = None;
        fast.every_ms = Some(10);
        assert!(fast.rule().err().unwrap().contains("every_ms"));
    }
}
