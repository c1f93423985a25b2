//! Freeze windows (DESIGN §23): times in which activations and upgrades
//! are refused unless a caller with `override` gives a reason. Fixed
//! windows are two instants; recurring ones start at each time a cron
//! pattern names, read in a time zone, and last a duration.

use std::time::{Duration, SystemTime};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// One `[[admin.freeze]]` entry, checked.
#[derive(Debug, Clone)]
pub struct FreezeWindow {
    pub reason: String,
    pub when: FreezeWhen,
}

#[derive(Debug, Clone)]
pub enum FreezeWhen {
    /// From `from` (inclusive) to `to` (exclusive).
    Fixed {
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    },
    /// From each time `cron` names in `timezone`, for `duration`.
    Recurring {
        cron: Box<croner::Cron>,
        pattern: String,
        duration: Duration,
        timezone: chrono_tz::Tz,
    },
}

/// The freeze a change ran into: which window, from when until when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Frozen {
    pub reason: String,
    /// RFC 3339, UTC.
    pub from: String,
    pub until: String,
    /// The recurring window's pattern and zone, if it is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cron: Option<String>,
}

impl std::fmt::Display for Frozen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "changes are frozen from {} until {}: {}",
            self.from, self.until, self.reason
        )
    }
}

fn text(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

impl FreezeWindow {
    /// The span of this window that holds `now`, if one does.
    pub fn covering(&self, now: DateTime<Utc>) -> Option<(DateTime<Utc>, DateTime<Utc>)> {
        match &self.when {
            FreezeWhen::Fixed { from, to } => (*from <= now && now < *to).then_some((*from, *to)),
            FreezeWhen::Recurring {
                cron,
                duration,
                timezone,
                ..
            } => {
                // The last start at or before now: a window that began
                // earlier and still runs began at or after it, or ended.
                let local = now.with_timezone(timezone);
                let start = cron
                    .find_previous_occurrence(&local, true)
                    .ok()?
                    .with_timezone(&Utc);
                let end = start + chrono::TimeDelta::from_std(*duration).ok()?;
                (now < end).then_some((start, end))
            }
        }
    }

    fn frozen(&self, (from, until): (DateTime<Utc>, DateTime<Utc>)) -> Frozen {
        Frozen {
            reason: self.reason.clone(),
            from: text(from),
            until: text(until),
            cron: match &self.when {
                FreezeWhen::Fixed { .. } => None,
                FreezeWhen::Recurring {
                    pattern, timezone, ..
                } => Some(format!("{pattern} ({timezone})")),
            },
        }
    }
}

/// The window that freezes changes at `now`: of several, the one that
/// lasts longest (a change waits for that one).
pub fn frozen_at(windows: &[FreezeWindow], now: SystemTime) -> Option<Frozen> {
    let now = DateTime::<Utc>::from(now);
    windows
        .iter()
        .filter_map(|w| w.covering(now).map(|span| (w, span)))
        .max_by_key(|(_, (_, until))| *until)
        .map(|(w, span)| w.frozen(span))
}

/// An RFC 3339 instant, for `from` and `to`.
pub fn parse_instant(text: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(text)
        .ok()
        .map(|at| at.with_timezone(&Utc))
}

/// A five-field cron pattern (minute, hour, day of month, month, day of
/// week), or its error.
pub fn parse_cron(pattern: &str) -> Result<croner::Cron, String> {
    croner::parser::CronParser::new()
        .parse(pattern)
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> SystemTime {
        parse_instant(text).map(SystemTime::from).unwrap()
    }

    fn fixed(from: &str, to: &str) -> FreezeWindow {
        FreezeWindow {
            reason: "holidays".into(),
            when: FreezeWhen::Fixed {
                from: parse_instant(from).unwrap(),
                to: parse_instant(to).unwrap(),
            },
        }
    }

    fn weekly(pattern: &str, hours: u64, zone: &str) -> FreezeWindow {
        FreezeWindow {
            reason: "weekend".into(),
            when: FreezeWhen::Recurring {
                cron: Box::new(parse_cron(pattern).unwrap()),
                pattern: pattern.into(),
                duration: Duration::from_secs(hours * 3600),
                timezone: zone.parse().unwrap(),
            },
        }
    }

    #[test]
    fn a_fixed_window_holds_from_its_start_to_just_before_its_end() {
        let windows = [fixed("2026-12-20T00:00:00Z", "2027-01-04T00:00:00Z")];
        assert_eq!(frozen_at(&windows, at("2026-12-19T23:59:59Z")), None);
        let frozen = frozen_at(&windows, at("2026-12-20T00:00:00Z")).unwrap();
        assert_eq!(frozen.from, "2026-12-20T00:00:00Z");
        assert_eq!(frozen.until, "2027-01-04T00:00:00Z");
        assert_eq!(frozen.reason, "holidays");
        assert!(frozen_at(&windows, at("2027-01-03T23:59:59Z")).is_some());
        assert_eq!(frozen_at(&windows, at("2027-01-04T00:00:00Z")), None);
    }

    #[test]
    fn a_recurring_window_is_read_in_its_zone() {
        // Fridays 18:00 in Berlin (UTC+1 in December) for 62 hours: to
        // Monday 08:00 Berlin time.
        let windows = [weekly("0 18 * * FRI", 62, "Europe/Berlin")];
        // 2026-12-04 is a Friday.
        assert_eq!(frozen_at(&windows, at("2026-12-04T16:59:00Z")), None);
        let frozen = frozen_at(&windows, at("2026-12-04T17:00:00Z")).unwrap();
        assert_eq!(frozen.from, "2026-12-04T17:00:00Z");
        assert_eq!(frozen.until, "2026-12-07T07:00:00Z");
        assert_eq!(frozen.cron.as_deref(), Some("0 18 * * FRI (Europe/Berlin)"));
        assert!(frozen_at(&windows, at("2026-12-06T12:00:00Z")).is_some());
        assert_eq!(frozen_at(&windows, at("2026-12-07T07:00:00Z")), None);
        // Summer time: 18:00 Berlin is 16:00 UTC.
        let july = frozen_at(&windows, at("2026-07-03T16:30:00Z")).unwrap();
        assert_eq!(july.from, "2026-07-03T16:00:00Z");
    }

    #[test]
    fn of_overlapping_windows_the_longest_lasting_is_named() {
        let windows = [
            weekly("0 18 * * FRI", 62, "UTC"),
            fixed("2026-12-01T00:00:00Z", "2026-12-10T00:00:00Z"),
        ];
        let frozen = frozen_at(&windows, at("2026-12-05T00:00:00Z")).unwrap();
        assert_eq!(frozen.until, "2026-12-10T00:00:00Z");
        let frozen = frozen_at(&windows, at("2026-12-12T00:00:00Z")).unwrap();
        assert_eq!(frozen.reason, "weekend");
    }

    #[test]
    fn patterns_are_checked() {
        assert!(parse_cron("0 18 * * FRI").is_ok());
        assert!(parse_cron("0 25 * * *").is_err());
        assert!(parse_cron("every friday").is_err());
        assert!(parse_instant("2026-12-20").is_none());
        assert!(parse_instant("2026-12-20T00:00:00+01:00").is_some());
    }
}
