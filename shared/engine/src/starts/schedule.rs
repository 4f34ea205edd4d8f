//! Schedules, as EventBridge Scheduler writes them: `rate(5 minutes)` or
//! `cron(minutes hours day-of-month month day-of-week year)`, a cron in a time zone (IANA name,
//! UTC by default). Each time a schedule names is one order, keyed by that time, so a time
//! looked at twice (two sweeps, a sweep run again) starts one order.
//!
//! A rate counts from the Unix epoch (`rate(1 hour)` is every hour on the hour, UTC), so any
//! sweep finds the same times. A cron follows EventBridge's fields: `*`, lists, ranges and
//! increments everywhere; `?` in one of the two day fields (the other one decides); `L` (last
//! day of the month, or `6L`: the month's last Friday), `W` (`15W`: the weekday nearest the
//! 15th) and `#` (`2#1`: the month's first Monday); days of the week 1 (Sunday) to 7 or
//! `SUN`-`SAT`, months 1 to 12 or `JAN`-`DEC`. A local time that a clock change skips never
//! comes; one it repeats comes once, at its first occurrence.

use std::time::Duration;

use chrono::{DateTime, Datelike, Duration as Span, NaiveDate, Timelike, Utc};
use chrono_tz::Tz;

use crate::time::Timestamp;

/// The most times one look at a schedule returns: a window that holds more is cut to its
/// latest ones (a minute's rate over a day that was missed starts a day's worth, no more).
pub const MAX_TIMES: usize = 1440;

/// A checked schedule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Schedule {
    /// Every this many minutes, from the epoch.
    Rate { minutes: u32 },
    /// At the minutes the fields name, on the clock of `zone`.
    Cron { fields: Box<Fields>, zone: Tz },
}

/// The six fields of a cron expression.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fields {
    minutes: Vec<u32>,
    hours: Vec<u32>,
    days: Days,
    months: Vec<u32>,
    years: Option<Vec<i32>>,
}

/// Which days of a month a cron names: by the day of the month, or by the day of the week.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Days {
    OfMonth { days: Vec<u32>, last: bool, nearest_weekday: Option<u32> },
    OfWeek { days: Vec<u32>, last: Option<u32>, nth: Option<(u32, u32)> },
}

impl Schedule {
    /// Parses `expression` in `zone` (an IANA name; `None` for UTC).
    pub fn parse(expression: &str, zone: Option<&str>) -> Result<Schedule, String> {
        let zone: Tz = match zone {
            None => chrono_tz::UTC,
            Some(name) => name.parse().map_err(|_| format!("{name:?} is not a time zone"))?,
        };
        let inner = |prefix: &str| {
            expression.strip_prefix(prefix).and_then(|rest| rest.strip_suffix(')')).map(str::trim)
        };
        if let Some(rate) = inner("rate(") {
            if zone != chrono_tz::UTC {
                return Err("a rate takes no time zone".into());
            }
            return rate_of(rate).map(|minutes| Schedule::Rate { minutes });
        }
        if let Some(cron) = inner("cron(") {
            return Ok(Schedule::Cron { fields: Box::new(fields_of(cron)?), zone });
        }
        Err(format!("{expression:?} is neither rate(...) nor cron(...)"))
    }

    /// The times the schedule names after `after` and at or before `until`, earliest first,
    /// the latest [`MAX_TIMES`] of them.
    pub fn times(&self, after: Timestamp, until: Timestamp) -> Vec<Timestamp> {
        let minute = 60_000;
        // Whole minutes: every time a schedule names is one.
        let first = after.as_millis().div_euclid(minute) + 1;
        let last = until.as_millis().div_euclid(minute);
        let mut times = Vec::new();
        let mut at = last;
        while at >= first && times.len() < MAX_TIMES {
            if self.names(at) {
                times.push(Timestamp::from_millis(at * minute));
            }
            at -= 1;
        }
        times.reverse();
        times
    }

    /// The longest time between two of its times: a rate's period; a cron's longest gap over
    /// the eight days after `from` (a week and its gap around the weekend), eight days if it
    /// names fewer than two times in them.
    pub fn longest_gap(&self, from: Timestamp) -> Duration {
        if let Schedule::Rate { minutes } = self {
            return Duration::from_secs(u64::from(*minutes) * 60);
        }
        let span = Duration::from_secs(8 * 24 * 3600);
        let times = self.times(from, from.plus(span));
        let gaps = times.windows(2).map(|w| w[1].as_millis() - w[0].as_millis());
        gaps.max().map_or(span, |ms| Duration::from_millis(ms.unsigned_abs()))
    }

    /// Whether the schedule names the minute `minute` (minutes since the epoch).
    fn names(&self, minute: i64) -> bool {
        match self {
            Schedule::Rate { minutes } => minute.rem_euclid(i64::from(*minutes)) == 0,
            Schedule::Cron { fields, zone } => {
                let Some(utc) = DateTime::<Utc>::from_timestamp(minute * 60, 0) else {
                    return false;
                };
                let local = utc.with_timezone(zone).naive_local();
                // A local time repeated by a clock going back comes once: at the first.
                let earlier = [30, 60].iter().any(|back| {
                    let before = (utc - Span::minutes(*back)).with_timezone(zone).naive_local();
                    before == local
                });
                !earlier && fields.names(local.date(), local.hour(), local.minute())
            }
        }
    }
}

impl Fields {
    fn names(&self, date: NaiveDate, hour: u32, minute: u32) -> bool {
        let year_ok = self.years.as_ref().is_none_or(|years| years.contains(&date.year()));
        year_ok
            && self.minutes.contains(&minute)
            && self.hours.contains(&hour)
            && self.months.contains(&date.month())
            && self.days.names(date)
    }
}

impl Days {
    fn names(&self, date: NaiveDate) -> bool {
        let last_day = last_day_of(date);
        match self {
            Days::OfMonth { days, last, nearest_weekday } => {
                if *last {
                    return date.day() == last_day;
                }
                if let Some(day) = nearest_weekday {
                    return date.day() == nearest_weekday_to(date, *day, last_day);
                }
                days.contains(&date.day())
            }
            Days::OfWeek { days, last, nth } => {
                // 1 is Sunday, as EventBridge counts.
                let weekday = date.weekday().num_days_from_sunday() + 1;
                if let Some(day) = last {
                    return weekday == *day && date.day() + 7 > last_day;
                }
                if let Some((day, n)) = nth {
                    return weekday == *day && (date.day() - 1) / 7 + 1 == *n;
                }
                days.contains(&weekday)
            }
        }
    }
}

fn last_day_of(date: NaiveDate) -> u32 {
    let (y, m) = (date.year(), date.month());
    let next = if m == 12 {
        NaiveDate::from_ymd_opt(y + 1, 1, 1)
    } else {
        NaiveDate::from_ymd_opt(y, m + 1, 1)
    };
    next.and_then(|d| d.pred_opt()).map_or(28, |d| d.day())
}

/// The weekday (Monday to Friday) nearest the month's `day`, within the month.
fn nearest_weekday_to(date: NaiveDate, day: u32, last_day: u32) -> u32 {
    let day = day.min(last_day);
    let Some(target) = date.with_day(day) else { return 0 };
    match target.weekday().num_days_from_monday() {
        5 if day == 1 => 3,
        5 => day - 1,
        6 if day == last_day => day - 2,
        6 => day + 1,
        _ => day,
    }
}

fn rate_of(rate: &str) -> Result<u32, String> {
    let bad =
        || format!("rate({rate}) is not a rate: `rate(5 minutes)`, `rate(1 hour)`, `rate(2 days)`");
    let (n, unit) = rate.split_once(' ').ok_or_else(bad)?;
    let n: u32 = n.parse().map_err(|_| bad())?;
    let per = match (unit, n) {
        ("minute", 1) | ("minutes", 2..) => 1,
        ("hour", 1) | ("hours", 2..) => 60,
        ("day", 1) | ("days", 2..) => 1440,
        _ => return Err(bad()),
    };
    n.checked_mul(per).filter(|m| *m <= 366 * 1440).ok_or_else(bad)
}

fn fields_of(cron: &str) -> Result<Fields, String> {
    let parts: Vec<&str> = cron.split_whitespace().collect();
    let [minutes, hours, dom, month, dow, year] = parts.as_slice() else {
        return Err(format!(
            "cron({cron}) needs six fields: minutes hours day-of-month month day-of-week year"
        ));
    };
    let days = match (*dom, *dow) {
        ("?", "?") | (_, "?") | ("?", _) => days_of(dom, dow)?,
        _ => return Err("one of day-of-month and day-of-week must be ?".into()),
    };
    Ok(Fields {
        minutes: list(minutes, 0, 59, &[]).map_err(|e| format!("minutes: {e}"))?,
        hours: list(hours, 0, 23, &[]).map_err(|e| format!("hours: {e}"))?,
        days,
        months: list(month, 1, 12, &MONTHS).map_err(|e| format!("month: {e}"))?,
        years: match *year {
            "*" => None,
            y => Some(
                list(y, 1970, 2199, &[])
                    .map_err(|e| format!("year: {e}"))?
                    .into_iter()
                    .map(|y| y as i32)
                    .collect(),
            ),
        },
    })
}

const MONTHS: [&str; 12] =
    ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"];
const WEEKDAYS: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];

fn days_of(dom: &str, dow: &str) -> Result<Days, String> {
    if dom == "?" && dow == "?" {
        return Err("day-of-month and day-of-week cannot both be ?".into());
    }
    if dow != "?" {
        let day =
            |s: &str| list(s, 1, 7, &WEEKDAYS).ok().and_then(|d| (d.len() == 1).then(|| d[0]));
        if let Some(d) = dow.strip_suffix('L') {
            let d = day(d).ok_or_else(|| format!("day-of-week: {dow:?}"))?;
            return Ok(Days::OfWeek { days: Vec::new(), last: Some(d), nth: None });
        }
        if let Some((d, n)) = dow.split_once('#') {
            let d = day(d).ok_or_else(|| format!("day-of-week: {dow:?}"))?;
            let n: u32 = n
                .parse()
                .ok()
                .filter(|n| (1..=5).contains(n))
                .ok_or_else(|| format!("day-of-week: {dow:?}"))?;
            return Ok(Days::OfWeek { days: Vec::new(), last: None, nth: Some((d, n)) });
        }
        let days = list(dow, 1, 7, &WEEKDAYS).map_err(|e| format!("day-of-week: {e}"))?;
        return Ok(Days::OfWeek { days, last: None, nth: None });
    }
    if dom == "L" {
        return Ok(Days::OfMonth { days: Vec::new(), last: true, nearest_weekday: None });
    }
    if let Some(d) = dom.strip_suffix('W') {
        let d: u32 = d
            .parse()
            .ok()
            .filter(|d| (1..=31).contains(d))
            .ok_or_else(|| format!("day-of-month: {dom:?}"))?;
        return Ok(Days::OfMonth { days: Vec::new(), last: false, nearest_weekday: Some(d) });
    }
    let days = list(dom, 1, 31, &[]).map_err(|e| format!("day-of-month: {e}"))?;
    Ok(Days::OfMonth { days, last: false, nearest_weekday: None })
}

/// The values `field` names within `low..=high` (`names` spell them from `low` on).
fn list(field: &str, low: u32, high: u32, names: &[&str]) -> Result<Vec<u32>, String> {
    let value = |s: &str| -> Result<u32, String> {
        let upper = s.to_ascii_uppercase();
        if let Some(i) = names.iter().position(|n| *n == upper) {
            return Ok(low + i as u32);
        }
        s.parse::<u32>()
            .ok()
            .filter(|v| (low..=high).contains(v))
            .ok_or_else(|| format!("{s:?} is not from {low} to {high}"))
    };
    let mut values = Vec::new();
    for part in field.split(',') {
        let (range, step) = match part.split_once('/') {
            Some((r, s)) => (
                r,
                s.parse::<u32>()
                    .ok()
                    .filter(|s| *s > 0)
                    .ok_or_else(|| format!("{part:?}: a bad increment"))?,
            ),
            None => (part, 1),
        };
        let (from, to) = match range {
            "*" => (low, high),
            r => match r.split_once('-') {
                Some((a, b)) => (value(a)?, value(b)?),
                // `5/15`: from 5 on, every 15.
                None if step > 1 => (value(r)?, high),
                None => (value(r)?, value(r)?),
            },
        };
        if from > to {
            return Err(format!("{part:?} runs backwards"));
        }
        values.extend((from..=to).step_by(step as usize));
    }
    values.sort_unstable();
    values.dedup();
    Ok(values)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        let t = DateTime::parse_from_rfc3339(s).unwrap();
        Timestamp::from_millis(t.timestamp_millis())
    }

    fn times(expression: &str, zone: Option<&str>, after: &str, until: &str) -> Vec<String> {
        let schedule = Schedule::parse(expression, zone).unwrap();
        schedule
            .times(at(after), at(until))
            .iter()
            .map(|t| {
                DateTime::<Utc>::from_timestamp_millis(t.as_millis())
                    .unwrap()
                    .format("%Y-%m-%dT%H:%MZ")
                    .to_string()
            })
            .collect()
    }

    #[test]
    fn a_rate_names_the_same_times_from_any_window() {
        let every_15 =
            times("rate(15 minutes)", None, "2026-03-01T09:50:00Z", "2026-03-01T10:31:00Z");
        assert_eq!(every_15, ["2026-03-01T10:00Z", "2026-03-01T10:15Z", "2026-03-01T10:30Z"]);
        // The window's ends: after, not at, its start; up to and at its end.
        let edge = times("rate(15 minutes)", None, "2026-03-01T10:00:00Z", "2026-03-01T10:15:00Z");
        assert_eq!(edge, ["2026-03-01T10:15Z"]);
        let daily = times("rate(1 day)", None, "2026-03-01T00:00:00Z", "2026-03-03T00:00:00Z");
        assert_eq!(daily, ["2026-03-02T00:00Z", "2026-03-03T00:00Z"]);
    }

    #[test]
    fn a_cron_runs_on_its_time_zones_clock_across_a_clock_change() {
        // 02:30 in Paris, every day: on the night the clocks go forward it does not exist.
        let nightly = times(
            "cron(30 2 * * ? *)",
            Some("Europe/Paris"),
            "2026-03-27T00:00:00Z",
            "2026-03-31T00:00:00Z",
        );
        assert_eq!(
            nightly,
            ["2026-03-27T01:30Z", "2026-03-28T01:30Z", "2026-03-30T00:30Z"],
            "the 29th has no 02:30"
        );
        // 02:30 on the night the clocks go back comes once, at the first.
        let back = times(
            "cron(30 2 * * ? *)",
            Some("Europe/Paris"),
            "2026-10-24T12:00:00Z",
            "2026-10-25T12:00:00Z",
        );
        assert_eq!(back, ["2026-10-25T00:30Z"]);
    }

    #[test]
    fn the_day_fields_name_weekdays_last_days_and_nth_weekdays() {
        let window = |e: &str| times(e, None, "2026-05-31T23:59:00Z", "2026-06-30T23:59:00Z");
        // Mondays to Fridays at 09:00 in June 2026: 22 days.
        assert_eq!(window("cron(0 9 ? * MON-FRI *)").len(), 22);
        assert_eq!(window("cron(0 9 L * ? *)"), ["2026-06-30T09:00Z"]);
        assert_eq!(window("cron(0 9 ? * 6L *)"), ["2026-06-26T09:00Z"], "last Friday");
        assert_eq!(window("cron(0 9 ? * 2#1 *)"), ["2026-06-01T09:00Z"], "first Monday");
        // The 6th of June 2026 is a Saturday: the nearest weekday is Friday the 5th.
        assert_eq!(window("cron(0 9 6W * ? *)"), ["2026-06-05T09:00Z"]);
        assert_eq!(window("cron(0/20 9 1 * ? 2026)").len(), 3);
        assert!(window("cron(0 9 1 * ? 2027)").is_empty());
    }

    #[test]
    fn a_schedule_this_stack_cannot_follow_is_refused() {
        for (expression, zone, error) in [
            ("every day", None, "neither rate"),
            ("rate(1 minutes)", None, "not a rate"),
            ("rate(5 weeks)", None, "not a rate"),
            ("rate(5 minutes)", Some("Europe/Paris"), "no time zone"),
            ("cron(0 9 * * * *)", None, "must be ?"),
            ("cron(0 9 ? * ? *)", None, "both be ?"),
            ("cron(0 9 * *)", None, "six fields"),
            ("cron(60 9 * * ? *)", None, "minutes"),
            ("cron(0 9 ? * MON-FRX *)", None, "day-of-week"),
            ("cron(0 9 * * ? *)", Some("Mars/Olympus"), "not a time zone"),
        ] {
            let e = Schedule::parse(expression, zone).unwrap_err();
            assert!(e.contains(error), "{expression}: {e}");
        }
    }
}
