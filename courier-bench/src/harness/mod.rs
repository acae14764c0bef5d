//! The harness every suite measures through.
//!
//! # Measurement method
//!
//! - **Warm-up.** Every case runs untimed first (a tenth of its samples by
//!   default), to fault in memory, train branch predictors and caches, and let
//!   the CPU frequency settle.
//! - **Many samples.** A case is measured as many samples, never as one long
//!   run: a [`measure::Sampler`] times `ops` operations per sample (so clock
//!   reads cost nothing relative to the work), and [`measure::time_each`]
//!   times every single operation when the tail matters (round trips: p50 and
//!   p99).
//! - **Three clocks per sample** ([`measure`]): wall time, the thread's CPU
//!   time (`CLOCK_THREAD_CPUTIME_ID`, the clock of the Linux `iov_iter`
//!   dispatch patch's test program) and `rdtsc` cycles (the unit of the rump
//!   kernel send-path measurements). Wall and CPU time differ when the thread
//!   blocks or is preempted; suites report the CPU figure where that is the
//!   point.
//! - **Statistics** ([`stats::Summary`]): n, total, min, median, mean, max,
//!   standard deviation (that test program's TOTAL LOWEST HIGHEST MEAN
//!   STDDEV, shown with `--stats`), quartiles and p99. The **median** is the quoted figure;
//!   the **spread** printed beside it is the interquartile range over the
//!   median.
//! - **Cross-process cases** re-execute this binary as a child role
//!   ([`child`]), in two placements named in the case: `pinned` (both
//!   processes on one CPU: stable, the figure targets use) and `unpinned`
//!   (where the scheduler puts them: what users see, and on a 2-vCPU VM it
//!   swings by tens of percent between runs; read its spread).
//! - **Same run.** Every subject of a case (courier, its variants, the peers,
//!   the floor) is measured in the same process, one after the other, so they
//!   share the machine's state of the moment.

pub mod child;
pub mod compare;
pub mod document;
pub mod measure;
pub mod mem;
pub mod plot;
pub mod report;
pub mod stats;

use std::fmt::Display;

use indicatif::ProgressBar;

use report::{Report, Row};
use stats::Summary;

/// The error suites and the CLI pass around.
pub type Error = Box<dyn std::error::Error + Send + Sync>;
/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A case: what is measured, with the attributes the JSON records carry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Case {
    name: String,
    family: String,
    bytes: Option<u64>,
    tasks: Option<u64>,
}

impl Case {
    /// A case named `name`.
    pub fn new(name: impl Into<String>) -> Case {
        let name = name.into();
        Case {
            family: name.clone(),
            name,
            bytes: None,
            tasks: None,
        }
    }

    /// A message-size case: named `<family>_<size>` (`rtt_socket_pinned_64b`,
    /// `memcpy_warm_8m`) and carrying `"bytes": bytes`. A plot draws one line
    /// per family across its sizes.
    pub fn sized(family: impl Into<String>, bytes: u64) -> Case {
        let family = family.into();
        Case {
            name: format!("{family}_{}", size_label(bytes)),
            family,
            bytes: Some(bytes),
            tasks: None,
        }
    }

    /// Attaches `"bytes": n` to a case named otherwise than
    /// [`Case::sized`] names it (`oneway_64b_pinned`, with the placement
    /// after the size).
    pub fn bytes(self, n: u64) -> Case {
        Case {
            bytes: Some(n),
            ..self
        }
    }

    /// Attaches `"tasks": n` (a task-count case; name it yourself, e.g.
    /// `ring_16`).
    pub fn tasks(self, n: u64) -> Case {
        Case {
            tasks: Some(n),
            ..self
        }
    }

    /// The case's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// `22b`, `4k`, `64k`, `1m`, `8m`: a size as it appears in case names
/// (binary units, exact multiples only).
pub fn size_label(bytes: u64) -> String {
    const K: u64 = 1 << 10;
    const M: u64 = 1 << 20;
    const G: u64 = 1 << 30;
    match bytes {
        b if b >= G && b % G == 0 => format!("{}g", b / G),
        b if b >= M && b % M == 0 => format!("{}m", b / M),
        b if b >= K && b % K == 0 => format!("{}k", b / K),
        b => format!("{b}b"),
    }
}

/// How a run was asked for.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// `--full`: the original benchmarks' own parameters instead of the quick
    /// ones.
    pub full: bool,
    /// `--samples N`: overrides every [`Ctx::samples`] choice.
    pub samples: Option<usize>,
    /// `--case TEXT`: only the cases whose name contains `TEXT` (in the
    /// suites that ask [`Ctx::wants`]: `ipc`, `ring`, `chan`).
    pub case: Option<String>,
}

/// What a suite gets: its parameters and a place to put its figures.
pub struct Ctx<'a> {
    report: Report,
    options: Options,
    matches: Option<&'a clap::ArgMatches>,
    progress: ProgressBar,
}

impl<'a> Ctx<'a> {
    /// A context for `suite`; `matches` holds its own command-line options
    /// (none in a run of all suites).
    pub fn new(
        suite: &str,
        options: Options,
        matches: Option<&'a clap::ArgMatches>,
        progress: ProgressBar,
    ) -> Ctx<'a> {
        Ctx {
            report: Report {
                suite: suite.to_string(),
                ..Report::default()
            },
            options,
            matches,
            progress,
        }
    }

    /// Whether this is a `--full` run.
    pub fn full(&self) -> bool {
        self.options.full
    }

    /// `quick` normally, `full` under `--full`.
    pub fn pick<T>(&self, quick: T, full: T) -> T {
        if self.options.full {
            full
        } else {
            quick
        }
    }

    /// A sample count: [`pick`](Self::pick), unless `--samples` overrides it.
    pub fn samples(&self, quick: usize, full: usize) -> usize {
        self.options.samples.unwrap_or(self.pick(quick, full))
    }

    /// Should `case` run? Always, unless `--case` names others.
    pub fn wants(&self, case: &Case) -> bool {
        self.options
            .case
            .as_deref()
            .is_none_or(|part| case.name().contains(part))
    }

    /// The value of this suite's option `id`, if it was given (always `None`
    /// when all suites run with their defaults).
    ///
    /// # Panics
    /// If `T` is not the type the option's `value_parser` produces (a bug in
    /// the suite, caught on its first run rather than silently defaulted).
    pub fn opt<T: Clone + Send + Sync + 'static>(&self, id: &str) -> Option<T> {
        match self.matches?.try_get_one::<T>(id) {
            Ok(value) => value.cloned(),
            Err(clap::parser::MatchesError::UnknownArgument { .. }) => None,
            Err(e) => panic!("option `{id}` of suite `{}`: {e}", self.report.suite),
        }
    }

    /// Shows what is being measured now on the progress line.
    pub fn status(&self, what: impl Display) {
        self.progress.set_message(what.to_string());
    }

    /// Records the median of `samples` (with their statistics) as `metric` of
    /// `subject` in `case`.
    pub fn record(
        &mut self,
        case: &Case,
        subject: &str,
        metric: &str,
        unit: &str,
        samples: &[f64],
    ) {
        let summary = Summary::of(samples);
        let value = summary.as_ref().map_or(f64::NAN, |s| s.median);
        self.push(case, subject, metric, unit, value, summary);
    }

    /// Records one derived figure (a p99, a total) that has no spread of its
    /// own.
    pub fn record_value(
        &mut self,
        case: &Case,
        subject: &str,
        metric: &str,
        unit: &str,
        value: f64,
    ) {
        self.push(case, subject, metric, unit, value, None);
    }

    /// Records a latency distribution timed one operation at a time:
    /// `<prefix>_p50_ns` (the median, with its spread), `<prefix>_p99_ns`, and
    /// `<prefix>_cpu_ns`, the measuring thread's CPU time per operation
    /// (close to the p50 when it spins, far below it when it blocks).
    pub fn record_latencies(
        &mut self,
        case: &Case,
        subject: &str,
        prefix: &str,
        each: &measure::Each,
    ) {
        self.record(case, subject, &format!("{prefix}_p50_ns"), "ns", &each.ns);
        let p99 = Summary::of(&each.ns).map_or(f64::NAN, |s| s.p99);
        self.record_value(case, subject, &format!("{prefix}_p99_ns"), "ns", p99);
        self.record_value(
            case,
            subject,
            &format!("{prefix}_cpu_ns"),
            "ns",
            each.cpu_ns_per_op,
        );
    }

    fn push(
        &mut self,
        case: &Case,
        subject: &str,
        metric: &str,
        unit: &str,
        value: f64,
        summary: Option<Summary>,
    ) {
        self.report.rows.push(Row {
            case: case.name.clone(),
            family: case.family.clone(),
            subject: subject.to_string(),
            metric: metric.to_string(),
            unit: unit.to_string(),
            value,
            summary,
            bytes: case.bytes,
            tasks: case.tasks,
        });
    }

    /// Adds a line under the suite's table (parameters, caveats).
    pub fn note(&mut self, line: impl Into<String>) {
        self.report.notes.push(line.into());
    }

    /// The figures recorded so far.
    pub fn into_report(self) -> Report {
        self.report
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_labels() {
        assert_eq!(size_label(1), "1b");
        assert_eq!(size_label(22), "22b");
        assert_eq!(size_label(1536), "1536b");
        assert_eq!(size_label(4096), "4k");
        assert_eq!(size_label(64 << 10), "64k");
        assert_eq!(size_label(8 << 20), "8m");
        assert_eq!(size_label(1 << 30), "1g");
    }

    #[test]
    fn cases_carry_family_and_attributes() {
        let c = Case::sized("rtt_socket_pinned", 64);
        assert_eq!(c.name(), "rtt_socket_pinned_64b");
        assert_eq!(c.family, "rtt_socket_pinned");
        assert_eq!(c.bytes, Some(64));
        let r = Case::new("ring_4").tasks(4);
        assert_eq!((r.name(), r.tasks, r.bytes), ("ring_4", Some(4), None));
    }

    #[test]
    fn ctx_records_medians_and_values() {
        let mut ctx = Ctx::new("t", Options::default(), None, ProgressBar::hidden());
        let case = Case::sized("send", 22);
        ctx.record(&case, "floor", "send_ns", "ns", &[3.0, 1.0, 2.0]);
        ctx.record_value(&case, "floor", "send_p99_ns", "ns", 9.0);
        ctx.note("n");
        let report = ctx.into_report();
        assert_eq!(report.suite, "t");
        assert_eq!(report.rows[0].value, 2.0);
        assert_eq!(report.rows[0].bytes, Some(22));
        assert_eq!(report.rows[0].summary.as_ref().unwrap().n, 3);
        assert_eq!(
            (report.rows[1].value, report.rows[1].summary.clone()),
            (9.0, None)
        );
        assert_eq!(report.notes, vec!["n"]);
    }

    /// A suite's matches with `--count 42` (a `u64` option).
    fn count_42() -> clap::ArgMatches {
        let cmd = clap::Command::new("t").arg(
            clap::Arg::new("count")
                .long("count")
                .value_parser(clap::value_parser!(u64)),
        );
        cmd.try_get_matches_from(["t", "--count", "42"]).unwrap()
    }

    #[test]
    fn options_come_from_the_suites_matches() {
        let matches = count_42();
        let ctx = Ctx::new(
            "t",
            Options::default(),
            Some(&matches),
            ProgressBar::hidden(),
        );
        assert_eq!(ctx.opt::<u64>("count"), Some(42));
        assert_eq!(ctx.opt::<u64>("size"), None);
    }

    #[test]
    #[should_panic(expected = "option `count` of suite `t`")]
    fn an_option_read_as_the_wrong_type_is_a_bug() {
        let matches = count_42();
        let ctx = Ctx::new(
            "t",
            Options::default(),
            Some(&matches),
            ProgressBar::hidden(),
        );
        let _ = ctx.opt::<usize>("count");
    }

    #[test]
    fn latencies_become_three_figures() {
        let mut ctx = Ctx::new("t", Options::default(), None, ProgressBar::hidden());
        let ns: Vec<f64> = (1..=101).map(f64::from).collect();
        let each = measure::Each {
            ns,
            cpu_ns_per_op: 4.5,
        };
        ctx.record_latencies(&Case::new("rtt_x_pinned"), "floor", "rtt", &each);
        let rows = ctx.into_report().rows;
        let figures: Vec<(&str, f64)> = rows.iter().map(|r| (r.metric.as_str(), r.value)).collect();
        assert_eq!(
            figures,
            vec![
                ("rtt_p50_ns", 51.0),
                ("rtt_p99_ns", 100.0),
                ("rtt_cpu_ns", 4.5)
            ]
        );
        assert!(rows[0].summary.is_some() && rows[1].summary.is_none());
    }

    #[test]
    fn quick_full_and_override() {
        let quick = Ctx::new("t", Options::default(), None, ProgressBar::hidden());
        assert_eq!((quick.pick(1, 2), quick.samples(10, 20)), (1, 10));
        assert_eq!(quick.opt::<u64>("count"), None);
        let full = Options {
            full: true,
            ..Options::default()
        };
        let full = Ctx::new("t", full, None, ProgressBar::hidden());
        assert_eq!((full.pick(1, 2), full.samples(10, 20)), (2, 20));
        let forced = Options {
            samples: Some(7),
            case: Some("_4k".into()),
            ..Options::default()
        };
        let forced = Ctx::new("t", forced, None, ProgressBar::hidden());
        assert_eq!(forced.samples(10, 20), 7);
        assert!(forced.wants(&Case::sized("sendrecv", 4096)));
        assert!(!forced.wants(&Case::sized("sendrecv", 64)));
        assert!(quick.wants(&Case::sized("sendrecv", 64)));
    }
}
