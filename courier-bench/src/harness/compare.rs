//! `courier-bench compare OLD.json NEW.json`: the change of every figure
//! between two runs, judged by the metric's sense.
//!
//! Records match on (suite, case, subject, metric). A change within the
//! threshold (default 5%) is reported as noise; beyond it, as better or worse.
//! Records present in only one run are listed, so a renamed case is not
//! silently dropped.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::report::{aligned, human, Record, Sense};

/// The verdict on one figure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Improved by more than the threshold.
    Better,
    /// Regressed by more than the threshold.
    Worse,
    /// Within the threshold.
    Same,
    /// The metric's name does not say which way is better.
    Unknown,
}

/// One figure in both runs.
#[derive(Clone, Debug, PartialEq)]
pub struct Change {
    /// The new run's record (names, unit, new value).
    pub record: Record,
    /// The old run's value.
    pub old: f64,
    /// `new / old - 1`.
    pub change: f64,
    /// What the change means.
    pub verdict: Verdict,
}

/// The comparison of two runs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Comparison {
    /// Figures present in both runs, in the new run's order.
    pub changes: Vec<Change>,
    /// Records only the old run has.
    pub only_old: Vec<Record>,
    /// Records only the new run has.
    pub only_new: Vec<Record>,
}

type Key = (String, String, String, String);

fn key(r: &Record) -> Key {
    (
        r.suite.clone(),
        r.case.clone(),
        r.subject.clone(),
        r.metric.clone(),
    )
}

/// Compares `new` against `old`; `threshold` is a fraction (0.05 = 5%).
pub fn compare(old: &[Record], new: &[Record], threshold: f64) -> Comparison {
    let mut olds: BTreeMap<Key, &Record> = old.iter().map(|r| (key(r), r)).collect();
    let mut out = Comparison::default();
    for record in new {
        let Some(before) = olds.remove(&key(record)) else {
            out.only_new.push(record.clone());
            continue;
        };
        let change = record.value / before.value - 1.0;
        let verdict = match Sense::of(&record.metric) {
            Sense::Unknown => Verdict::Unknown,
            _ if !change.is_finite() => Verdict::Unknown,
            _ if change.abs() <= threshold => Verdict::Same,
            Sense::LowerIsBetter if change < 0.0 => Verdict::Better,
            Sense::HigherIsBetter if change > 0.0 => Verdict::Better,
            _ => Verdict::Worse,
        };
        out.changes.push(Change {
            record: record.clone(),
            old: before.value,
            change,
            verdict,
        });
    }
    // What is left was not in the new run; keep the old run's order.
    out.only_old = old
        .iter()
        .filter(|r| olds.contains_key(&key(r)))
        .cloned()
        .collect();
    out
}

impl Comparison {
    /// How many figures got worse.
    pub fn regressions(&self) -> usize {
        self.changes
            .iter()
            .filter(|c| c.verdict == Verdict::Worse)
            .count()
    }

    /// The comparison as a text table plus a summary line.
    pub fn render(&self) -> String {
        let mut lines = vec![[
            "suite", "case", "subject", "metric", "old", "new", "change", "verdict",
        ]
        .map(String::from)
        .to_vec()];
        for c in &self.changes {
            let r = &c.record;
            lines.push(vec![
                r.suite.clone(),
                r.case.clone(),
                r.subject.clone(),
                r.metric.clone(),
                human(c.old, &r.unit),
                human(r.value, &r.unit),
                format!("{:+.1}%", c.change * 100.0),
                match c.verdict {
                    Verdict::Better => "better",
                    Verdict::Worse => "WORSE",
                    Verdict::Same => "~",
                    Verdict::Unknown => "?",
                }
                .into(),
            ]);
        }
        let mut out = aligned(&lines, 4);
        for r in &self.only_old {
            let _ = writeln!(
                out,
                "only in old: {} {} {} {}",
                r.suite, r.case, r.subject, r.metric
            );
        }
        for r in &self.only_new {
            let _ = writeln!(
                out,
                "only in new: {} {} {} {}",
                r.suite, r.case, r.subject, r.metric
            );
        }
        let count = |v| self.changes.iter().filter(|c| c.verdict == v).count();
        let _ = writeln!(
            out,
            "{} figures: {} better, {} worse, {} within the threshold, {} without a sense",
            self.changes.len(),
            count(Verdict::Better),
            count(Verdict::Worse),
            count(Verdict::Same),
            count(Verdict::Unknown)
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(case: &str, subject: &str, metric: &str, value: f64) -> Record {
        Record {
            suite: "s".into(),
            case: case.into(),
            subject: subject.into(),
            metric: metric.into(),
            value,
            unit: if metric.ends_with("_ns") { "ns" } else { "x/s" }.into(),
            bytes: None,
            tasks: None,
        }
    }

    #[test]
    fn verdicts_follow_sense_and_threshold() {
        let old = vec![
            rec("a", "courier", "send_ns", 100.0),
            rec("a", "courier", "sends_per_s", 100.0),
            rec("b", "courier", "send_ns", 100.0),
            rec("b", "courier", "sends_per_s", 100.0),
            rec("c", "courier", "send_ns", 100.0),
            rec("c", "courier", "count", 100.0),
            rec("gone", "courier", "send_ns", 1.0),
        ];
        let new = vec![
            rec("a", "courier", "send_ns", 80.0),      // -20% time: better
            rec("a", "courier", "sends_per_s", 80.0),  // -20% rate: worse
            rec("b", "courier", "send_ns", 120.0),     // +20% time: worse
            rec("b", "courier", "sends_per_s", 120.0), // +20% rate: better
            rec("c", "courier", "send_ns", 104.0),     // +4%: noise
            rec("c", "courier", "count", 200.0),       // no sense
            rec("fresh", "courier", "send_ns", 1.0),
        ];
        let cmp = compare(&old, &new, 0.05);
        let verdicts: Vec<Verdict> = cmp.changes.iter().map(|c| c.verdict).collect();
        use Verdict::*;
        assert_eq!(verdicts, vec![Better, Worse, Worse, Better, Same, Unknown]);
        assert!((cmp.changes[0].change - -0.2).abs() < 1e-12);
        assert_eq!(cmp.changes[0].old, 100.0);
        assert_eq!(cmp.regressions(), 2);
        assert_eq!(cmp.only_old, vec![rec("gone", "courier", "send_ns", 1.0)]);
        assert_eq!(cmp.only_new, vec![rec("fresh", "courier", "send_ns", 1.0)]);
    }

    #[test]
    fn subjects_and_suites_do_not_mix() {
        let old = vec![rec("a", "courier", "send_ns", 100.0)];
        let mut other_suite = rec("a", "courier", "send_ns", 50.0);
        other_suite.suite = "t".into();
        let new = vec![rec("a", "flume", "send_ns", 50.0), other_suite];
        let cmp = compare(&old, &new, 0.05);
        assert!(cmp.changes.is_empty());
        assert_eq!(cmp.only_new.len(), 2);
        assert_eq!(cmp.only_old.len(), 1);
    }

    #[test]
    fn render_lists_every_figure_and_a_summary() {
        let old = vec![rec("a", "courier", "send_ns", 2000.0)];
        let new = vec![rec("a", "courier", "send_ns", 2500.0)];
        let text = compare(&old, &new, 0.05).render();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("suite"));
        assert!(lines[1].contains("2.00 µs"), "{text}");
        assert!(lines[1].contains("2.50 µs"), "{text}");
        assert!(lines[1].contains("+25.0%"), "{text}");
        assert!(lines[1].ends_with("WORSE"), "{text}");
        assert_eq!(
            lines[2],
            "1 figures: 0 better, 1 worse, 0 within the threshold, 0 without a sense"
        );
    }
}
