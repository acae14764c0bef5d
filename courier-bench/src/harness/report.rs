//! What a run produced, and the three ways it is written out: a text table
//! (stdout), markdown (`--md`) and JSON records (`--json`).
//!
//! # The JSON record
//!
//! `--json FILE` writes one array of records, one per measured figure:
//!
//! ```json
//! {"suite": "send", "case": "send_22b", "subject": "floor",
//!  "metric": "sends_per_s", "value": 512345.6, "unit": "sends/s", "bytes": 22}
//! ```
//!
//! `value` is the median over samples unless the metric names another
//! statistic (`rtt_p99_ns`). `bytes` appears on message-size cases, `tasks` on
//! task-count cases. Subjects are `courier`, `courier-<variant>`, a peer crate's
//! name or `<crate>-<variant>`, and `floor` (the physical limit).
//!
//! # Metric names carry their sense
//!
//! | suffix | better | e.g. |
//! | --- | --- | --- |
//! | `_ns` | lower | `rtt_p50_ns` |
//! | `_cycles` | lower | `send_cycles` |
//! | `_per_s` | higher | `sends_per_s`, `bytes_per_s` |
//!
//! # The ratio column
//!
//! Every ratio reads "how many times better is courier": within one case and
//! metric, a peer's (or variant's) ratio is peer ÷ courier for lower-is-better
//! metrics and courier ÷ peer for rates, so above 1 courier is ahead. The
//! `floor` row turns it around to say how far courier is from the limit:
//! courier ÷ floor for times, floor ÷ courier for rates, printed as
//! `at 1.15x` (1.00 = at the limit). The `courier` row is the reference
//! (`ref`). Without a `courier` row in the case, the column stays empty.

use std::fmt::Write as _;
use std::io;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::stats::Summary;

/// The subject every ratio is taken against.
pub const REFERENCE: &str = "courier";
/// The subject a `floor` row is read against when the case has it.
pub const RAWEST: &str = "courier-bytes";
/// The subject that stands for the physical limit.
pub const FLOOR: &str = "floor";

/// Which way a metric improves, read from its name's suffix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sense {
    /// `_ns`, `_cycles`: a time or a cost.
    LowerIsBetter,
    /// `_per_s`: a rate.
    HigherIsBetter,
    /// Any other name: reported without a verdict.
    Unknown,
}

impl Sense {
    /// The sense of `metric`.
    pub fn of(metric: &str) -> Sense {
        if metric.ends_with("_ns") || metric.ends_with("_cycles") {
            Sense::LowerIsBetter
        } else if metric.ends_with("_per_s") {
            Sense::HigherIsBetter
        } else {
            Sense::Unknown
        }
    }

    /// How many times better `a` is than `b` (above 1: `a` is better).
    pub fn advantage(self, a: f64, b: f64) -> Option<f64> {
        let r = match self {
            Sense::LowerIsBetter => b / a,
            Sense::HigherIsBetter => a / b,
            Sense::Unknown => return None,
        };
        r.is_finite().then_some(r)
    }
}

/// One figure of one subject in one case.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// Case name, e.g. `send_22b`, `rtt_socket_pinned_64b`.
    pub case: String,
    /// The case without its size label (`rtt_socket_pinned`): the line a plot
    /// draws across sizes.
    pub family: String,
    /// `courier`, `courier-<variant>`, a peer crate, or `floor`.
    pub subject: String,
    /// Metric name; its suffix gives its [`Sense`].
    pub metric: String,
    /// Unit of `value` (`ns`, `cycles`, `sends/s`, `B/s`).
    pub unit: String,
    /// The quoted figure: the median, or the statistic the metric names.
    pub value: f64,
    /// The samples' statistics, when the figure came from samples.
    pub summary: Option<Summary>,
    /// Message size of the case, bytes.
    pub bytes: Option<u64>,
    /// Task count of the case.
    pub tasks: Option<u64>,
}

/// All rows of one suite, in the order they were measured.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Report {
    /// Suite name.
    pub suite: String,
    /// Measured rows.
    pub rows: Vec<Row>,
    /// Free-form lines printed under the table (parameters, notes).
    pub notes: Vec<String>,
}

/// The JSON record: one measured figure.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// Suite name.
    pub suite: String,
    /// Case name.
    pub case: String,
    /// Subject.
    pub subject: String,
    /// Metric name.
    pub metric: String,
    /// The median (or the statistic the metric names).
    pub value: f64,
    /// Unit of `value`.
    pub unit: String,
    /// Message size of the case, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    /// Task count of the case.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tasks: Option<u64>,
}

impl Report {
    /// This report's rows as JSON records.
    pub fn records(&self) -> impl Iterator<Item = Record> + '_ {
        self.rows.iter().map(|r| Record {
            suite: self.suite.clone(),
            case: r.case.clone(),
            subject: r.subject.clone(),
            metric: r.metric.clone(),
            value: r.value,
            unit: r.unit.clone(),
            bytes: r.bytes,
            tasks: r.tasks,
        })
    }

    /// The ratio cell of `row` (see the module docs).
    ///
    /// Variants pair up: a peer `<crate>-<variant>` is compared with
    /// `courier-<variant>` when the case has one (`ipc-channel-bytes` with
    /// `courier-bytes`), else with `courier`; every courier row is a
    /// reference. The floor is compared with `courier-bytes` where the case
    /// has it, else with `courier`.
    pub fn ratio(&self, row: &Row) -> Ratio {
        if row.subject == REFERENCE || row.subject.starts_with("courier-") {
            return Ratio::Reference;
        }
        let sense = Sense::of(&row.metric);
        let same = |r: &&Row| r.case == row.case && r.metric == row.metric;
        if row.subject == FLOOR {
            // The floor is read against courier's rawest path: its bytes
            // channel where the case has one, else `courier`.
            let reference = self
                .rows
                .iter()
                .filter(same)
                .find(|r| r.subject == RAWEST)
                .or_else(|| {
                    self.rows
                        .iter()
                        .filter(same)
                        .find(|r| r.subject == REFERENCE)
                });
            return reference
                .and_then(|r| sense.advantage(row.value, r.value))
                .map_or(Ratio::None, Ratio::FromFloor);
        }
        // `ipc-channel-bytes` tries `courier-channel-bytes`, then `courier-bytes`.
        let variants = row
            .subject
            .match_indices('-')
            .map(|(i, _)| format!("courier{}", &row.subject[i..]));
        let reference = variants
            .filter_map(|v| self.rows.iter().filter(same).find(|r| r.subject == v))
            .next()
            .or_else(|| {
                self.rows
                    .iter()
                    .filter(same)
                    .find(|r| r.subject == REFERENCE)
            });
        let Some(reference) = reference else {
            return Ratio::None;
        };
        sense
            .advantage(reference.value, row.value)
            .map(Ratio::Ahead)
            .unwrap_or(Ratio::None)
    }
}

/// A cell of the ratio column.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Ratio {
    /// No courier figure to compare with.
    None,
    /// This row is courier's own.
    Reference,
    /// How many times courier is ahead of this peer or variant.
    Ahead(f64),
    /// How many times courier is above this floor (1 = at the limit).
    FromFloor(f64),
}

impl std::fmt::Display for Ratio {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Ratio::None => f.write_str("-"),
            Ratio::Reference => f.write_str("ref"),
            Ratio::Ahead(r) => write!(f, "{r:.2}x"),
            Ratio::FromFloor(r) => write!(f, "at {r:.2}x"),
        }
    }
}

/// Formats `value` in `unit` for people: `2.13 µs`, `1.23 M sends/s`,
/// `12.4 GB/s`, `4753 cycles`.
pub fn human(value: f64, unit: &str) -> String {
    if !value.is_finite() {
        return format!("{value} {unit}");
    }
    match unit {
        "ns" => {
            let (v, u) = match value.abs() {
                x if x >= 1e9 => (value / 1e9, "s"),
                x if x >= 1e6 => (value / 1e6, "ms"),
                x if x >= 1e3 => (value / 1e3, "µs"),
                _ => (value, "ns"),
            };
            format!("{} {u}", three_digits(v))
        }
        "cycles" => format!("{value:.0} cycles"),
        _ => {
            let (v, prefix) = match value.abs() {
                x if x >= 1e9 => (value / 1e9, "G"),
                x if x >= 1e6 => (value / 1e6, "M"),
                x if x >= 1e3 => (value / 1e3, "k"),
                _ => (value, ""),
            };
            if unit.starts_with('B') {
                format!("{} {prefix}{unit}", three_digits(v))
            } else if prefix.is_empty() {
                format!("{} {unit}", three_digits(v))
            } else {
                format!("{} {prefix} {unit}", three_digits(v))
            }
        }
    }
}

/// Three significant digits, without an exponent: 1.23, 12.3, 123, 1234.
fn three_digits(v: f64) -> String {
    match v.abs() {
        x if x >= 100.0 => format!("{v:.0}"),
        x if x >= 10.0 => format!("{v:.1}"),
        _ => format!("{v:.2}"),
    }
}

/// Which columns a table shows.
#[derive(Clone, Copy, Debug, Default)]
pub struct Style {
    /// Add the columns of the Linux `iov_iter` dispatch patch's test program: n,
    /// TOTAL, LOWEST, HIGHEST, MEAN, STDDEV.
    pub stats: bool,
}

const LEGEND: &str = "median of samples; spread = interquartile range / median; \
ratio: peer row = times courier is ahead (peer/courier time, courier/peer rate), \
floor row = courier's distance from the limit (courier/floor time), 1.00 = at it";

/// The table's cells: a header and one line per row.
fn cells(report: &Report, style: Style) -> (Vec<&'static str>, Vec<Vec<String>>) {
    let mut header = vec!["case", "subject", "metric", "median", "spread", "ratio"];
    if style.stats {
        header.extend(["n", "total", "lowest", "highest", "mean", "stddev"]);
    }
    let lines = report
        .rows
        .iter()
        .map(|row| {
            let mut line = vec![
                row.case.clone(),
                row.subject.clone(),
                row.metric.clone(),
                human(row.value, &row.unit),
                // One sample has no spread to show (its quartiles are the sample itself).
                row.summary
                    .as_ref()
                    .filter(|s| s.n > 1)
                    .map_or("-".into(), |s| format!("{:.1}%", s.spread() * 100.0)),
                report.ratio(row).to_string(),
            ];
            if style.stats {
                match &row.summary {
                    Some(s) => line.extend([
                        s.n.to_string(),
                        human(s.total, &row.unit),
                        human(s.min, &row.unit),
                        human(s.max, &row.unit),
                        human(s.mean, &row.unit),
                        human(s.stddev, &row.unit),
                    ]),
                    None => line.extend(std::iter::repeat_n("-".to_string(), 6)),
                }
            }
            line
        })
        .collect();
    (header, lines)
}

/// Lines of cells as aligned text: columns two spaces apart, the first
/// `text_columns` aligned left (names), the rest right (figures).
pub fn aligned(lines: &[Vec<String>], text_columns: usize) -> String {
    let mut widths: Vec<usize> = Vec::new();
    for line in lines {
        widths.resize(widths.len().max(line.len()), 0);
        for (w, cell) in widths.iter_mut().zip(line) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for line in lines {
        let mut s = String::new();
        for (i, (cell, w)) in line.iter().zip(&widths).enumerate() {
            let pad = " ".repeat(w - cell.chars().count());
            if i < text_columns {
                let _ = write!(s, "{cell}{pad}  ");
            } else {
                let _ = write!(s, "{pad}{cell}  ");
            }
        }
        out += s.trim_end();
        out.push('\n');
    }
    out
}

/// The suite as an aligned text table, with its notes and the legend.
pub fn table(report: &Report, style: Style) -> String {
    let (header, mut lines) = cells(report, style);
    lines.insert(0, header.iter().map(|h| h.to_string()).collect());
    let mut out = format!("== {} ==\n", report.suite);
    out += &aligned(&lines, 3);
    for note in &report.notes {
        let _ = writeln!(out, "  {note}");
    }
    let _ = writeln!(out, "  ({LEGEND})");
    out
}

/// The suite as a markdown section: a heading, the table, notes and legend.
pub fn markdown(report: &Report, style: Style) -> String {
    let (header, lines) = cells(report, style);
    let mut out = format!("### {}\n\n", report.suite);
    let row = |cells: &mut dyn Iterator<Item = String>| {
        let mut s = String::from("|");
        for c in cells {
            let _ = write!(s, " {} |", c.replace('|', "\\|"));
        }
        s.push('\n');
        s
    };
    out += &row(&mut header.iter().map(|h| h.to_string()));
    out += &row(&mut header
        .iter()
        .enumerate()
        .map(|(i, _)| if i < 3 { "---" } else { "---:" }.to_string()));
    for line in lines {
        out += &row(&mut line.into_iter());
    }
    out.push('\n');
    for note in &report.notes {
        let _ = writeln!(out, "{note}  ");
    }
    let _ = writeln!(out, "_{LEGEND}._");
    out
}

/// Writes every report's records as one JSON array.
pub fn write_json(path: &Path, reports: &[Report]) -> io::Result<()> {
    let records: Vec<Record> = reports.iter().flat_map(Report::records).collect();
    let text = serde_json::to_string_pretty(&records).map_err(io::Error::other)?;
    std::fs::write(path, text + "\n")
}

/// Reads a file written by [`write_json`].
pub fn read_json(path: &Path) -> io::Result<Vec<Record>> {
    let text = std::fs::read_to_string(path)?;
    serde_json::from_str(&text).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Writes every report as markdown sections, one after another.
pub fn write_markdown(path: &Path, reports: &[Report], style: Style) -> io::Result<()> {
    let text: Vec<String> = reports.iter().map(|r| markdown(r, style)).collect();
    std::fs::write(path, text.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(case: &str, subject: &str, metric: &str, unit: &str, value: f64) -> Row {
        Row {
            case: case.into(),
            family: case.into(),
            subject: subject.into(),
            metric: metric.into(),
            unit: unit.into(),
            value,
            summary: Summary::of(&[value * 0.9, value, value * 1.1]),
            bytes: Some(22),
            tasks: None,
        }
    }

    fn report() -> Report {
        Report {
            suite: "send".into(),
            rows: vec![
                row("send_22b", "courier", "send_ns", "ns", 2000.0),
                row("send_22b", "ipc-channel", "send_ns", "ns", 3000.0),
                row("send_22b", "floor", "send_ns", "ns", 1600.0),
                row("send_22b", "courier", "sends_per_s", "sends/s", 500_000.0),
                row(
                    "send_22b",
                    "ipc-channel",
                    "sends_per_s",
                    "sends/s",
                    250_000.0,
                ),
                row("send_22b", "floor", "sends_per_s", "sends/s", 625_000.0),
                row("other", "flume", "send_ns", "ns", 10.0),
            ],
            notes: vec!["count 1000".into()],
        }
    }

    #[test]
    fn senses_follow_suffixes() {
        assert_eq!(Sense::of("rtt_p99_ns"), Sense::LowerIsBetter);
        assert_eq!(Sense::of("send_cycles"), Sense::LowerIsBetter);
        assert_eq!(Sense::of("bytes_per_s"), Sense::HigherIsBetter);
        assert_eq!(Sense::of("count"), Sense::Unknown);
        assert_eq!(Sense::LowerIsBetter.advantage(2.0, 3.0), Some(1.5));
        assert_eq!(Sense::HigherIsBetter.advantage(3.0, 2.0), Some(1.5));
        assert_eq!(Sense::Unknown.advantage(3.0, 2.0), None);
    }

    #[test]
    fn variants_pair_with_their_courier_twin_and_floor_with_the_best() {
        let report = Report {
            suite: "ipc".into(),
            rows: vec![
                row("c", "courier", "x_ns", "ns", 4000.0),
                row("c", "courier-bytes", "x_ns", "ns", 1000.0),
                row("c", "ipc-channel", "x_ns", "ns", 6000.0),
                row("c", "ipc-channel-bytes", "x_ns", "ns", 1500.0),
                row("c", "crossbeam-channel", "x_ns", "ns", 2000.0),
                row("c", "floor", "x_ns", "ns", 800.0),
            ],
            notes: Vec::new(),
        };
        let ratios: Vec<Ratio> = report.rows.iter().map(|r| report.ratio(r)).collect();
        assert_eq!(
            ratios,
            [
                Ratio::Reference,
                Ratio::Reference,
                Ratio::Ahead(1.5),      // typed against typed: 6000 / 4000
                Ratio::Ahead(1.5),      // bytes against bytes: 1500 / 1000
                Ratio::Ahead(0.5),      // no courier-channel: against courier
                Ratio::FromFloor(1.25), // courier-bytes: 1000 / 800
            ]
        );
    }

    #[test]
    fn ratios_read_as_courier_ahead_and_distance_from_floor() {
        let r = report();
        let ratios: Vec<Ratio> = r.rows.iter().map(|row| r.ratio(row)).collect();
        assert_eq!(
            ratios,
            vec![
                Ratio::Reference,
                Ratio::Ahead(1.5),      // 3000 / 2000 ns
                Ratio::FromFloor(1.25), // 2000 / 1600 ns
                Ratio::Reference,
                Ratio::Ahead(2.0),      // 500k / 250k per s
                Ratio::FromFloor(1.25), // 625k / 500k per s
                Ratio::None,            // no courier in this case
            ]
        );
        assert_eq!(Ratio::Ahead(1.5).to_string(), "1.50x");
        assert_eq!(Ratio::FromFloor(1.25).to_string(), "at 1.25x");
    }

    #[test]
    fn human_units() {
        assert_eq!(human(812.0, "ns"), "812 ns");
        assert_eq!(human(2130.0, "ns"), "2.13 µs");
        assert_eq!(human(4.8e6, "ns"), "4.80 ms");
        assert_eq!(human(1.5e9, "ns"), "1.50 s");
        assert_eq!(human(4753.4, "cycles"), "4753 cycles");
        assert_eq!(human(1_234_000.0, "sends/s"), "1.23 M sends/s");
        assert_eq!(human(12.4e9, "B/s"), "12.4 GB/s");
        assert_eq!(human(12.0, "msgs/s"), "12.0 msgs/s");
    }

    #[test]
    fn json_has_exactly_the_record_fields() {
        let r = report();
        let records: Vec<Record> = r.records().collect();
        let value = serde_json::to_value(&records[0]).unwrap();
        assert_eq!(
            value,
            serde_json::json!({
                "suite": "send", "case": "send_22b", "subject": "courier",
                "metric": "send_ns", "value": 2000.0, "unit": "ns", "bytes": 22
            })
        );
        // Absent attributes are absent, not null; tasks round-trips.
        let mut with_tasks = records[0].clone();
        with_tasks.bytes = None;
        with_tasks.tasks = Some(16);
        let text = serde_json::to_string(&with_tasks).unwrap();
        assert!(!text.contains("bytes"), "{text}");
        assert!(text.contains("\"tasks\":16"), "{text}");
        let back: Record = serde_json::from_str(&text).unwrap();
        assert_eq!(back, with_tasks);
    }

    #[test]
    fn json_file_round_trips() {
        let dir = std::env::temp_dir().join(format!("courier-bench-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("run.json");
        write_json(&path, &[report()]).unwrap();
        let back = read_json(&path).unwrap();
        assert_eq!(back, report().records().collect::<Vec<_>>());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn markdown_table_shape() {
        let md = markdown(&report(), Style::default());
        let lines: Vec<&str> = md.lines().collect();
        assert_eq!(lines[0], "### send");
        assert_eq!(
            lines[2],
            "| case | subject | metric | median | spread | ratio |"
        );
        assert_eq!(lines[3], "| --- | --- | --- | ---: | ---: | ---: |");
        assert_eq!(
            lines[5],
            "| send_22b | ipc-channel | send_ns | 3.00 µs | 10.0% | 1.50x |"
        );
        // Seven rows, each with six cells.
        let rows: Vec<&&str> = lines[4..]
            .iter()
            .take_while(|l| l.starts_with('|'))
            .collect();
        assert_eq!(rows.len(), 7);
        assert!(rows.iter().all(|l| l.matches(" |").count() == 6));
        assert!(md.contains("count 1000  \n"));
    }

    #[test]
    fn one_sample_shows_no_spread() {
        let mut r = report();
        r.rows[1].summary = Summary::of(&[3000.0]);
        let md = markdown(&r, Style::default());
        assert!(
            md.contains("| send_22b | ipc-channel | send_ns | 3.00 µs | - | 1.50x |"),
            "{md}"
        );
    }

    #[test]
    fn markdown_stats_columns() {
        let md = markdown(&report(), Style { stats: true });
        let line = md
            .lines()
            .find(|l| l.contains("| floor | send_ns"))
            .unwrap();
        // 1440, 1600, 1760 ns: n, total, lowest, highest, mean, then the stddev.
        assert!(
            line.ends_with("| 3 | 4.80 µs | 1.44 µs | 1.76 µs | 1.60 µs | 160 ns |"),
            "{line}"
        );
    }

    #[test]
    fn text_table_aligns_columns() {
        let t = table(&report(), Style::default());
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "== send ==");
        let header = lines[1];
        // Every figure line ends (right-aligned) where the header ends.
        for line in &lines[2..9] {
            assert_eq!(line.chars().count(), header.chars().count(), "{line}");
        }
        assert!(lines[3].ends_with("1.50x"));
        assert!(lines[4].ends_with("at 1.25x"));
    }
}
