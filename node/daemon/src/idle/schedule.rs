//! `schedule:SPEC`: weekly windows in local time.

use super::*;

/// One weekly span: on each day in `days` (Monday = 0), from `start` to `end` minutes after
/// midnight; a span with `end <= start` ends on the next day.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Span {
    pub(super) days: [bool; 7],
    pub(super) start: u32,
    pub(super) end: u32,
}

pub(super) const MINUTES_PER_DAY: u32 = 24 * 60;
pub(super) const DAY_NAMES: [&str; 7] = [
    "monday",
    "tuesday",
    "wednesday",
    "thursday",
    "friday",
    "saturday",
    "sunday",
];

/// Parses a schedule (the part after `schedule:`); see the module docs.
pub(super) fn parse_schedule(spec: &str) -> anyhow::Result<Vec<Span>> {
    let mut spans = Vec::new();
    let mut days: Option<[bool; 7]> = None;
    for token in spec.split([';', ',', ' ', '\t']).filter(|t| !t.is_empty()) {
        if token.contains(':') {
            let (start, end) =
                parse_time_span(token).with_context(|| format!("in schedule '{spec}'"))?;
            spans.push(Span {
                days: days.take().unwrap_or([true; 7]),
                start,
                end,
            });
        } else {
            let parsed = parse_days(token).with_context(|| format!("in schedule '{spec}'"))?;
            let set = days.get_or_insert([false; 7]);
            for (day, on) in set.iter_mut().zip(parsed) {
                *day |= on;
            }
        }
    }
    ensure!(
        days.is_none(),
        "schedule '{spec}' ends with days but no time span after them, e.g. 'sat 00:00-24:00'"
    );
    ensure!(
        !spans.is_empty(),
        "schedule '{spec}' has no time span; write e.g. 'schedule:mon-fri 22:00-07:00'"
    );
    Ok(spans)
}

/// `mon`, `monday`, `mon-fri`, `fri-mon` → the set of days (Monday = 0).
pub(super) fn parse_days(token: &str) -> anyhow::Result<[bool; 7]> {
    let day = |name: &str| -> anyhow::Result<usize> {
        let lower = name.to_ascii_lowercase();
        let matches =
            |full: &&str| lower == *full || (lower.len() == 3 && full.starts_with(&lower));
        DAY_NAMES.iter().position(matches).with_context(|| {
            format!(
                "'{name}' is not a day or a time span: \
                 expected mon, tue, wed, thu, fri, sat or sun, or HH:MM-HH:MM"
            )
        })
    };
    let (first, last) = match token.split_once('-') {
        Some((a, b)) => (day(a)?, day(b)?),
        None => (day(token)?, day(token)?),
    };
    let mut set = [false; 7];
    let mut d = first;
    loop {
        set[d] = true;
        if d == last {
            return Ok(set);
        }
        d = (d + 1) % 7;
    }
}

/// `22:00-07:00` → minutes after midnight; `24:00` may only end a span.
pub(super) fn parse_time_span(token: &str) -> anyhow::Result<(u32, u32)> {
    let (a, b) = token
        .split_once('-')
        .with_context(|| format!("'{token}' is not a time span like 22:00-07:00"))?;
    let (start, end) = (parse_clock(a)?, parse_clock(b)?);
    ensure!(
        start < MINUTES_PER_DAY,
        "'{token}': a span cannot start at 24:00; use 00:00"
    );
    ensure!(
        start != end,
        "'{token}' starts and ends at the same time; use 00:00-24:00 for a whole day"
    );
    Ok((start, end))
}

/// `HH:MM` (00:00 to 24:00) → minutes after midnight.
pub(super) fn parse_clock(s: &str) -> anyhow::Result<u32> {
    let parsed = s.split_once(':').and_then(|(h, m)| {
        let valid = (1..=2).contains(&h.len()) && m.len() == 2;
        Some((h.parse::<u32>().ok()?, m.parse::<u32>().ok()?)).filter(|_| valid)
    });
    match parsed {
        Some((h, m)) if h < 24 && m < 60 => Ok(h * 60 + m),
        Some((24, 0)) => Ok(MINUTES_PER_DAY),
        _ => bail!("'{s}' is not a time of day between 00:00 and 24:00"),
    }
}

/// Where `now` (local wall-clock time) stands in a weekly schedule.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum ScheduleState {
    /// Inside a window that ends at `until`, or never (`None`: the schedule covers the whole week).
    Open { until: Option<NaiveDateTime> },
    /// Outside every window; the next one opens at `next`.
    Closed { next: Option<NaiveDateTime> },
}

/// Pure schedule logic: concrete windows from yesterday to next week, merged where they touch.
pub(super) fn schedule_state(spans: &[Span], now: NaiveDateTime) -> ScheduleState {
    let mut windows: Vec<(NaiveDateTime, NaiveDateTime)> = Vec::new();
    for offset in -1..=8 {
        let Some(date) = now.date().checked_add_signed(TimeDelta::days(offset)) else {
            continue;
        };
        let midnight = date.and_time(NaiveTime::MIN);
        let weekday = date.weekday().num_days_from_monday() as usize;
        for span in spans.iter().filter(|s| s.days[weekday]) {
            let end = if span.end <= span.start {
                span.end + MINUTES_PER_DAY
            } else {
                span.end
            };
            windows.push((
                midnight + TimeDelta::minutes(i64::from(span.start)),
                midnight + TimeDelta::minutes(i64::from(end)),
            ));
        }
    }
    windows.sort();
    let mut merged: Vec<(NaiveDateTime, NaiveDateTime)> = Vec::new();
    for (start, end) in windows {
        match merged.last_mut() {
            Some(last) if start <= last.1 => last.1 = last.1.max(end),
            _ => merged.push((start, end)),
        }
    }
    if let Some(&(_, end)) = merged
        .iter()
        .find(|(start, end)| *start <= now && now < *end)
    {
        // A window that lasts a week or more never closes: the schedule repeats weekly.
        let endless = end - now >= TimeDelta::days(7);
        return ScheduleState::Open {
            until: (!endless).then_some(end),
        };
    }
    ScheduleState::Closed {
        next: merged
            .iter()
            .map(|(start, _)| *start)
            .find(|start| *start > now),
    }
}

/// Local wall-clock time → `SystemTime`; in a DST gap, an hour later.
pub(super) fn local_to_system(t: NaiveDateTime) -> Option<SystemTime> {
    Local
        .from_local_datetime(&t)
        .earliest()
        .or_else(|| {
            Local
                .from_local_datetime(&(t + TimeDelta::hours(1)))
                .earliest()
        })
        .map(SystemTime::from)
}

/// `schedule:SPEC`: weekly windows in local time.
pub(super) struct Schedule {
    pub(super) spans: Vec<Span>,
}

impl IdleSource for Schedule {
    fn name(&self) -> &str {
        "schedule"
    }
    fn check(&mut self) -> Verdict {
        match schedule_state(&self.spans, Local::now().naive_local()) {
            ScheduleState::Open { until } => Verdict::Idle {
                until: until.and_then(local_to_system),
            },
            ScheduleState::Closed { next: Some(next) } => Verdict::Busy(format!(
                "outside the schedule; the next window opens {}",
                next.format("%a %H:%M")
            )),
            ScheduleState::Closed { next: None } => {
                Verdict::Busy("outside the schedule".to_owned())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(date: &str) -> NaiveDateTime {
        NaiveDateTime::parse_from_str(date, "%Y-%m-%d %H:%M").unwrap()
    }

    // 2024-01-01 is a Monday.
    const MON: &str = "2024-01-01";
    const FRI: &str = "2024-01-05";
    const SAT: &str = "2024-01-06";
    const SUN: &str = "2024-01-07";

    fn day_at(day: &str, time: &str) -> NaiveDateTime {
        at(&format!("{day} {time}"))
    }

    fn state(spec: &str, now: NaiveDateTime) -> ScheduleState {
        schedule_state(&parse_schedule(spec).unwrap(), now)
    }

    #[test]
    fn parses_day_ranges_lists_and_every_day() {
        let spans =
            parse_schedule("mon-fri 22:00-07:00; sat,sun 00:00-24:00, 12:30-13:00").unwrap();
        let weekdays = [true, true, true, true, true, false, false];
        let weekend = [false, false, false, false, false, true, true];
        assert_eq!(
            spans,
            vec![
                Span {
                    days: weekdays,
                    start: 22 * 60,
                    end: 7 * 60
                },
                Span {
                    days: weekend,
                    start: 0,
                    end: 24 * 60
                },
                Span {
                    days: [true; 7],
                    start: 12 * 60 + 30,
                    end: 13 * 60
                },
            ]
        );
        let wrapping = parse_schedule("Fri-Mon 9:00-17:00").unwrap();
        assert_eq!(
            wrapping[0].days,
            [true, false, false, false, true, true, true]
        );
        let saturday = [false, false, false, false, false, true, false];
        assert_eq!(
            parse_schedule("saturday 01:00-02:00").unwrap()[0].days,
            saturday
        );
    }

    #[test]
    fn rejects_bad_schedules_with_clear_errors() {
        for (spec, expected) in [
            ("", "no time span"),
            ("mon-fri", "no time span after them"),
            ("mon-fry 22:00-07:00", "'fry' is not a day"),
            ("mon 25:00-07:00", "'25:00' is not a time of day"),
            ("mon 22:60-07:00", "'22:60' is not a time of day"),
            ("mon 24:00-07:00", "cannot start at 24:00"),
            ("mon 10:00-10:00", "same time"),
            ("mon 22:00", "not a time span"),
            ("mon 2200-0700", "'2200' is not a day or a time span"),
        ] {
            let err = format!("{:#}", parse_schedule(spec).unwrap_err());
            assert!(
                err.contains(expected),
                "schedule '{spec}': error '{err}' lacks '{expected}'"
            );
        }
    }

    #[test]
    fn idle_inside_a_span_until_its_end_and_busy_outside_with_the_next_window() {
        let spec = "mon-fri 09:00-17:00";
        assert_eq!(
            state(spec, day_at(MON, "10:00")),
            ScheduleState::Open {
                until: Some(day_at(MON, "17:00"))
            }
        );
        assert_eq!(
            state(spec, day_at(MON, "09:00")),
            ScheduleState::Open {
                until: Some(day_at(MON, "17:00"))
            }
        );
        assert_eq!(
            state(spec, day_at(MON, "17:00")),
            ScheduleState::Closed {
                next: Some(day_at("2024-01-02", "09:00"))
            }
        );
        // Friday evening: the next window is Monday's.
        assert_eq!(
            state(spec, day_at(FRI, "18:00")),
            ScheduleState::Closed {
                next: Some(day_at("2024-01-08", "09:00"))
            }
        );
        assert!(matches!(
            state(spec, day_at(SAT, "10:00")),
            ScheduleState::Closed { .. }
        ));
    }

    #[test]
    fn overnight_span_belongs_to_the_day_it_starts_on() {
        let spec = "mon-fri 22:00-07:00";
        // Friday night runs into Saturday morning.
        assert_eq!(
            state(spec, day_at(SAT, "03:00")),
            ScheduleState::Open {
                until: Some(day_at(SAT, "07:00"))
            }
        );
        assert_eq!(
            state(spec, day_at(FRI, "23:00")),
            ScheduleState::Open {
                until: Some(day_at(SAT, "07:00"))
            }
        );
        // Monday 03:00 belongs to Sunday night, which is not in the schedule.
        assert_eq!(
            state(spec, day_at(MON, "03:00")),
            ScheduleState::Closed {
                next: Some(day_at(MON, "22:00"))
            }
        );
        // Sunday night into Monday morning, across the week boundary.
        assert_eq!(
            state("sun 22:00-07:00", day_at("2024-01-08", "06:59")),
            ScheduleState::Open {
                until: Some(day_at("2024-01-08", "07:00"))
            }
        );
    }

    #[test]
    fn touching_spans_merge_into_one_window() {
        // Friday night runs into the weekend, which ends at midnight (Monday's span starts at 22).
        let spec = "mon-fri 22:00-07:00; sat,sun 00:00-24:00";
        assert_eq!(
            state(spec, day_at(FRI, "23:00")),
            ScheduleState::Open {
                until: Some(day_at("2024-01-08", "00:00"))
            }
        );
        // With Sunday night too, the window runs from Friday 22:00 to Monday 07:00.
        let spec = "mon-fri 22:00-07:00; sat,sun 00:00-24:00; sun 22:00-07:00";
        let monday_morning = day_at("2024-01-08", "07:00");
        assert_eq!(
            state(spec, day_at(FRI, "23:00")),
            ScheduleState::Open {
                until: Some(monday_morning)
            }
        );
        assert_eq!(
            state(spec, day_at(SUN, "12:00")),
            ScheduleState::Open {
                until: Some(monday_morning)
            }
        );
        assert_eq!(
            state("00:00-24:00", day_at(SUN, "12:00")),
            ScheduleState::Open { until: None }
        );
    }

    #[test]
    fn schedule_source_gives_a_verdict_in_local_time() {
        let mut whole_week = parse_spec("schedule:00:00-24:00").unwrap();
        assert_eq!(whole_week.name(), "schedule");
        assert_eq!(whole_week.check(), Verdict::Idle { until: None });
        let until = local_to_system(day_at(MON, "12:00")).unwrap();
        assert!(until > UNIX_EPOCH + Duration::from_secs(1_704_000_000));
    }
}
