//! `courier-bench document`: BENCHMARKS.md, written whole from one run of
//! every suite.
//!
//! The file is generated and rewritten, never appended to: a header that says
//! how to regenerate it and what produced it (command, commit, date, machine),
//! a summary of courier against each peer as ratios, then one section per
//! suite. A suite's section is one wide table, a row per case and metric and a
//! column per subject, each cell the median, its spread and its ratio (see
//! [`report`](super::report) for what the ratio means). A rate that is only
//! the inverse of a time of the same case ([`INVERSES`]: `msgs_per_s` beside
//! `msg_ns`) is left out; `--json` keeps every figure.
//!
//! `scripts/benchmarks.sh` runs it.

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;
use std::time::SystemTime;

use super::report::{human, Ratio, Report, Row, Sense, FLOOR};

/// One suite's part of the run.
pub struct SuiteRun {
    /// Its figures and notes.
    pub report: Report,
    /// The suite's one-line description (`courier-bench --help`).
    pub about: &'static str,
    /// When it started.
    pub started: SystemTime,
    /// How long it took, seconds.
    pub seconds: f64,
    /// Why it failed, if it did (its figures so far are kept).
    pub error: Option<String>,
}

/// What produced a run, for the document's header.
pub struct Provenance {
    /// The command line, as run.
    pub command: String,
    /// `--full` or the quick parameters.
    pub full: bool,
    /// The commit measured, with a remark if the sources differed from it.
    pub commit: String,
    /// CPU model and count (and whether it is a virtual machine).
    pub machine: String,
    /// Kernel and compiler.
    pub system: String,
    /// The load average before and after the run.
    pub load: (String, String),
    /// When the run started.
    pub started: SystemTime,
    /// How long it took, seconds.
    pub seconds: f64,
}

impl Provenance {
    /// Reads the commit from git, the machine from `/proc`, the compiler from
    /// `rustc --version`; the caller fills in the rest after the run.
    pub fn gather(command: String, full: bool) -> Provenance {
        Provenance {
            command,
            full,
            commit: commit(),
            machine: machine(),
            system: system(),
            load: (load_average(), String::new()),
            started: SystemTime::now(),
            seconds: 0.0,
        }
    }
}

/// One row of the summary: a case of a suite, courier's subject in it, the
/// peers it is read against, and whether the case has a floor.
struct Pick {
    label: &'static str,
    suite: &'static str,
    case: &'static str,
    metric: &'static str,
    courier: &'static str,
    /// The peers' subjects, in the order shown.
    peers: &'static [&'static str],
    /// The floor whose distance is shown too.
    floor: Floor,
}

/// The floor column of a [`Pick`].
enum Floor {
    /// None.
    None,
    /// The `floor` subject of the same case.
    Same,
    /// The `floor` subject of another case, `(suite, case)`, same metric:
    /// a limit measured by its own suite in the same run.
    Case(&'static str, &'static str),
}

/// The summary: a handful of cases that show each reach against its peers.
const PICKS: &[Pick] = &[
    Pick {
        label: "ipc: 64 B typed message, send + receive",
        suite: "ipc",
        case: "sendrecv_64b",
        metric: "sendrecv_ns",
        courier: "courier",
        peers: &["ipc-channel"],
        floor: Floor::None,
    },
    Pick {
        label: "ipc: 64 B bytes message, send + receive",
        suite: "ipc",
        case: "sendrecv_64b",
        metric: "sendrecv_ns",
        courier: "courier-bytes",
        peers: &["ipc-channel-bytes"],
        floor: Floor::Same,
    },
    Pick {
        label: "ipc: 64 KiB bytes message, send + receive",
        suite: "ipc",
        case: "sendrecv_64k",
        metric: "sendrecv_ns",
        courier: "courier-bytes",
        peers: &["ipc-channel-bytes"],
        floor: Floor::Same,
    },
    Pick {
        label: "ipc: 64 B round trip between two processes on one CPU (p50)",
        suite: "ipc",
        case: "rtt_pinned_64b",
        metric: "rtt_p50_ns",
        courier: "courier",
        peers: &["ipc-channel", "courier-socket"],
        floor: Floor::Same,
    },
    Pick {
        label: "ipc: 64 B round trip, one CPU each (p50)",
        suite: "ipc",
        case: "rtt_split_64b",
        metric: "rtt_p50_ns",
        courier: "courier",
        peers: &["ipc-channel", "courier-socket"],
        floor: Floor::Same,
    },
    Pick {
        label: "ipc: 64 B round trip, one CPU each, receivers busy-polling (p50; floor: shared memory polled by both)",
        suite: "ipc",
        case: "rtt_split_64b",
        metric: "rtt_p50_ns",
        courier: "courier-busypoll",
        peers: &["ipc-channel"],
        floor: Floor::Case("floor", "rtt_shm_spin_split"),
    },
    Pick {
        label: "ipc: 64 B messages streamed from one process to another, one CPU each (msgs/s)",
        suite: "ipc",
        case: "oneway_64b_split",
        metric: "msgs_per_s",
        courier: "courier",
        peers: &["ipc-channel", "courier-socket"],
        floor: Floor::Same,
    },
    Pick {
        label: "ipc: 8 MiB round trip, one CPU each (p50)",
        suite: "ipc",
        case: "rtt_split_8m",
        metric: "rtt_p50_ns",
        courier: "courier",
        peers: &["ipc-channel"],
        floor: Floor::None,
    },
    Pick {
        label: "threads: ring of 16 over `bounded(0)`",
        suite: "ring",
        case: "ring_bounded0_16",
        metric: "msg_ns",
        courier: "courier",
        peers: &["crossbeam-channel", "flume", "std-mpsc"],
        floor: Floor::Same,
    },
    Pick {
        label: "threads: 4 senders, 4 receivers over `bounded(1)`",
        suite: "chan",
        case: "mpmc_bounded1",
        metric: "msg_ns",
        courier: "courier",
        peers: &["crossbeam-channel", "flume"],
        floor: Floor::None,
    },
    Pick {
        label: "threads: one sender, one receiver over `unbounded()`",
        suite: "chan",
        case: "spsc_unbounded",
        metric: "msg_ns",
        courier: "courier",
        peers: &["crossbeam-channel", "flume", "std-mpsc"],
        floor: Floor::None,
    },
    Pick {
        label: "fibers: a yield and back (switch)",
        suite: "fiber",
        case: "switch",
        metric: "yield_rtt_ns",
        courier: "courier",
        peers: &["may"],
        floor: Floor::Same,
    },
    Pick {
        label: "fibers: spawn and run to completion (allocate)",
        suite: "fiber",
        case: "allocate",
        metric: "spawns_per_s",
        courier: "courier",
        peers: &["may", "corosensei"],
        floor: Floor::None,
    },
    Pick {
        label: "fibers: ring of 10,000, every fiber sending, one worker",
        suite: "ring",
        case: "ring_fiber_10000_w1",
        metric: "msg_ns",
        courier: "courier",
        peers: &["may"],
        floor: Floor::None,
    },
    Pick {
        label: "fibers: ring of 100 passing one token (a park and a wake-up a hop), one worker",
        suite: "ring",
        case: "ring_fiber1_100_w1",
        metric: "msg_ns",
        courier: "courier",
        peers: &["may"],
        floor: Floor::None,
    },
    Pick {
        label: "fibers: hello HTTP server, 256 keep-alive connections (requests/s)",
        suite: "http",
        case: "small_c256",
        metric: "requests_per_s",
        courier: "courier",
        peers: &["may-minihttp", "tokio-hyper"],
        floor: Floor::None,
    },
];

const RATIO_LEGEND: &str = "Each cell is the median over samples, its spread \
(interquartile range over median) and, for a peer, how many times courier is ahead \
of it (the peer's time over courier's, courier's rate over the peer's; above 1.00x \
courier is ahead). A peer's variant is compared with courier's same variant \
(`ipc-channel-bytes` with `courier-bytes`), else with `courier`. A `floor` cell \
reads the other way: how far courier (its bytes channel where the case has one) is \
from the physical limit, `at 1.10x` meaning 10% above it. Rows of `courier-*` \
variants carry no ratio of their own.";

/// The whole document.
///
/// `plot` is the link to the `ipc` size sweep, relative to the document;
/// `notes` the design notes to list, `(link, title)`.
pub fn render(
    runs: &[SuiteRun],
    prov: &Provenance,
    plot: Option<&str>,
    notes: &[(String, String)],
) -> String {
    let mut out = String::new();
    header(&mut out, runs, prov);
    summary(&mut out, runs, plot);
    let _ = writeln!(out, "## Reading the tables\n");
    let _ = writeln!(out, "{RATIO_LEGEND}\n");
    let _ = writeln!(
        out,
        "Metric names carry their sense: `_ns` and `_cycles` are better lower, `_per_s` \
         higher. Cross-process cases name their placement: `pinned` (both processes on one \
         CPU), `unpinned` (the scheduler's choice), `split` (one CPU each). On a 2-vCPU \
         virtual machine shared with other work, cross-thread and cross-process figures \
         move by up to 2x between runs minutes apart: compare subjects within one run, \
         and read a row's spread before its ratio.\n"
    );
    for run in runs {
        section(&mut out, run, prov, plot);
    }
    if !notes.is_empty() {
        let _ = writeln!(out, "## Design notes\n");
        let _ = writeln!(
            out,
            "What was tried, what it measured and why the code is as it is; each note \
             gives the commands that reproduce its figures.\n"
        );
        for (link, title) in notes {
            let _ = writeln!(out, "- [{title}]({link})");
        }
    }
    out
}

fn header(out: &mut String, runs: &[SuiteRun], prov: &Provenance) {
    let mode = if prov.full {
        "full: the original benchmarks' own parameters (a million messages, 8000 samples...)"
    } else {
        "quick: a few samples a case, enough to orient; `--full` uses the original \
         benchmarks' own parameters"
    };
    let failed: Vec<&str> = runs
        .iter()
        .filter(|r| r.error.is_some())
        .map(|r| r.report.suite.as_str())
        .collect();
    let _ = write!(
        out,
        "# Benchmarks\n\n\
         Current figures of every `courier-bench` suite, from one run. This file is \
         generated and rewritten whole, never edited or appended to. To regenerate it \
         and the plot in `docs/bench/`:\n\n\
         ```sh\n\
         bash scripts/benchmarks.sh          # quick run: about a minute of measurement, plus the release build\n\
         bash scripts/benchmarks.sh --full   # the original benchmarks' parameters: much longer\n\
         ```\n\n\
         What each suite and case measures, and what N and T mean, is in \
         [courier-bench/README.md](courier-bench/README.md). Why courier is built the way \
         these figures show is in the design notes under [docs/](docs/), listed at the \
         end.\n\n\
         | this run | |\n\
         | --- | --- |\n\
         | command | `{}` |\n\
         | mode | {mode} |\n\
         | commit | {} |\n\
         | date | {} UTC, {:.0} s in all |\n\
         | machine | {} |\n\
         | system | {} |\n\
         | load average | {} before, {} after (1, 5, 15 min) |\n",
        prov.command,
        prov.commit,
        utc(prov.started),
        prov.seconds,
        prov.machine,
        prov.system,
        prov.load.0,
        prov.load.1,
    );
    if !failed.is_empty() {
        let _ = writeln!(out, "| failed | {} (see its section) |", failed.join(", "));
    }
    out.push('\n');
}

fn summary(out: &mut String, runs: &[SuiteRun], plot: Option<&str>) {
    let find = |suite: &str, case: &str, metric: &str, subject: &str| -> Option<&Row> {
        runs.iter()
            .find(|r| r.report.suite == suite)?
            .report
            .rows
            .iter()
            .find(|r| r.case == case && r.metric == metric && r.subject == subject)
    };
    let mut lines = Vec::new();
    for pick in PICKS {
        let Some(ours) = find(pick.suite, pick.case, pick.metric, pick.courier) else {
            continue;
        };
        let sense = Sense::of(pick.metric);
        let peers: Vec<String> = pick
            .peers
            .iter()
            .filter_map(|p| {
                let theirs = find(pick.suite, pick.case, pick.metric, p)?;
                let r = sense.advantage(ours.value, theirs.value)?;
                Some(format!("{p} {r:.2}x"))
            })
            .collect();
        let floor = match pick.floor {
            Floor::None => None,
            Floor::Same => find(pick.suite, pick.case, pick.metric, FLOOR),
            Floor::Case(suite, case) => find(suite, case, pick.metric, FLOOR),
        };
        let floor = floor
            .and_then(|f| sense.advantage(f.value, ours.value))
            .map_or("-".to_string(), |r| format!("at {r:.2}x"));
        lines.push(format!(
            "| {} (`{}` `{}`) | {} | {} | {floor} |",
            pick.label,
            pick.suite,
            pick.case,
            human(ours.value, &ours.unit),
            if peers.is_empty() {
                "-".to_string()
            } else {
                peers.join(", ")
            },
        ));
    }
    if lines.is_empty() {
        return;
    }
    let _ = writeln!(out, "## Summary\n");
    let _ = writeln!(
        out,
        "courier's median in this run, and how many times courier is ahead of each peer \
         measured beside it (the peer's time over courier's, or courier's rate over the \
         peer's; below 1.00x the peer is ahead; `courier-socket` is courier with its \
         shared-memory ring off). The `floor` column reads the other way: \
         courier's time over the physical limit's (a bare `SOCK_SEQPACKET` send and \
         receive, a bare socket round trip or stream, a sequence number through shared \
         memory polled by both processes, a ring of bare futex hand-offs, a bare \
         coroutine switch), 1.00x being at it. The suite sections below give every case \
         with its spread.\n"
    );
    let _ = writeln!(out, "| case | courier | courier ahead of | floor |");
    let _ = writeln!(out, "| --- | ---: | --- | ---: |");
    for line in lines {
        let _ = writeln!(out, "{line}");
    }
    out.push('\n');
    if let Some(plot) = plot {
        let _ = writeln!(
            out,
            "![ipc: one message sent and received by one thread, by size]({plot})\n\n\
             The `ipc` suite's `sendrecv` cases by size, from this run ([the table](#ipc)).\n"
        );
    }
}

fn section(out: &mut String, run: &SuiteRun, prov: &Provenance, plot: Option<&str>) {
    let suite = &run.report.suite;
    let full = if prov.full { " --full" } else { "" };
    let _ = writeln!(out, "## {suite}\n");
    let _ = writeln!(
        out,
        "`cargo run --release -p courier-bench -- {suite}{full}` · commit {} · {} UTC · \
         {} · {:.1} s\n",
        prov.commit,
        utc(run.started),
        prov.machine,
        run.seconds,
    );
    let _ = writeln!(out, "{}.\n", run.about.trim_end_matches('.'));
    if let Some(e) = &run.error {
        let _ = writeln!(out, "**The suite failed:** {e}\n");
    }
    out.push_str(&wide_table(&run.report));
    if suite == "ipc" {
        if let Some(plot) = plot {
            let _ = writeln!(out, "Plot of the `sendrecv` rows: [{plot}]({plot}).\n");
        }
    }
    if !run.report.notes.is_empty() {
        for note in &run.report.notes {
            let _ = writeln!(out, "- {note}");
        }
        out.push('\n');
    }
}

/// Rates that only restate a time of the same case and subject (its inverse,
/// or the case's bytes over it): `(rate, time)`.
pub const INVERSES: &[(&str, &str)] = &[
    ("msgs_per_s", "msg_ns"),
    ("sends_per_s", "send_ns"),
    ("bytes_per_s", "copy_ns"),
];

/// Is `row` a rate whose time the same case and subject also report?
fn redundant(report: &Report, row: &Row) -> bool {
    INVERSES.iter().any(|(rate, time)| {
        row.metric == *rate
            && report
                .rows
                .iter()
                .any(|r| r.case == row.case && r.subject == row.subject && r.metric == *time)
    })
}

/// The suite as one table: a row per case and metric, a column per subject.
pub fn wide_table(report: &Report) -> String {
    let mut subjects: Vec<&str> = Vec::new();
    let mut keys: Vec<(&str, &str)> = Vec::new();
    for row in &report.rows {
        if redundant(report, row) {
            continue;
        }
        if !subjects.contains(&row.subject.as_str()) {
            subjects.push(&row.subject);
        }
        let key = (row.case.as_str(), row.metric.as_str());
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    if keys.is_empty() {
        return String::from("(no figures)\n\n");
    }
    let mut out = String::from("| case | metric |");
    for s in &subjects {
        let _ = write!(out, " {s} |");
    }
    out.push_str("\n| --- | --- |");
    for _ in &subjects {
        out.push_str(" ---: |");
    }
    out.push('\n');
    for (case, metric) in keys {
        let _ = write!(out, "| `{case}` | {metric} |");
        for s in &subjects {
            let row = report
                .rows
                .iter()
                .find(|r| r.case == case && r.metric == metric && r.subject == *s);
            let cell = row.map_or_else(|| "-".to_string(), |r| cell(report, r));
            let _ = write!(out, " {cell} |");
        }
        out.push('\n');
    }
    out.push('\n');
    out
}

/// `3.72 µs ±1.9%, 1.46x`.
fn cell(report: &Report, row: &Row) -> String {
    let mut s = human(row.value, &row.unit);
    if let Some(summary) = row.summary.as_ref().filter(|s| s.n > 1) {
        let _ = write!(s, " ±{}%", percent(summary.spread() * 100.0));
    }
    match report.ratio(row) {
        Ratio::Ahead(r) => {
            let _ = write!(s, ", {r:.2}x");
        }
        Ratio::FromFloor(r) => {
            let _ = write!(s, ", at {r:.2}x");
        }
        Ratio::None | Ratio::Reference => {}
    }
    s
}

/// A spread in percent with two significant digits (`1.9`, `18`, `250`).
fn percent(p: f64) -> String {
    if p < 10.0 {
        format!("{p:.1}")
    } else {
        format!("{p:.0}")
    }
}

/// The design notes under `dir`: `(path, title)` of every `*.md` file, by
/// name, the title being its first `# ` line.
pub fn design_notes(dir: &Path) -> Vec<(String, String)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut notes: Vec<(String, String)> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .filter_map(|p| {
            let text = std::fs::read_to_string(&p).ok()?;
            let title = text.lines().find_map(|l| l.strip_prefix("# "))?.to_string();
            Some((p.to_string_lossy().into_owned(), title))
        })
        .collect();
    notes.sort();
    notes
}

/// `2026-11-28 05:46` (UTC) for `t`.
pub fn utc(t: SystemTime) -> String {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as i64;
    let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's `civil_from_days`
    // (https://howardhinnant.github.io/date_algorithms.html#civil_from_days).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}",
        rest / 3600,
        rest % 3600 / 60
    )
}

/// "AMD EPYC, 2 CPUs (virtual machine)" from `/proc/cpuinfo`.
pub fn machine() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = info
        .lines()
        .find_map(|l| l.strip_prefix("model name").and_then(|r| r.split_once(':')))
        .map_or("unknown CPU", |(_, m)| m.trim())
        .to_string();
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let virtual_machine = info
        .lines()
        .any(|l| l.starts_with("flags") && l.split_whitespace().any(|f| f == "hypervisor"));
    let vm = if virtual_machine {
        " (virtual machine)"
    } else {
        ""
    };
    format!("{model}, {cpus} CPUs{vm}")
}

/// "Linux 6.18.0; rustc 1.95.0 (...)".
fn system() -> String {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").map_or_else(
        |_| "unknown kernel".into(),
        |k| format!("Linux {}", k.trim()),
    );
    let rustc = output("rustc", &["--version"]).unwrap_or_else(|| "rustc unknown".into());
    format!("{kernel}; {rustc}")
}

/// `/proc/loadavg`'s first three fields.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| "unknown".into())
}

/// "`59a9c8b`", with a remark when the measured sources (the two crates and
/// the workspace's manifest and lock file) differ from that commit.
fn commit() -> String {
    let Some(hash) = output("git", &["rev-parse", "--short=7", "HEAD"]) else {
        return "unknown (not a git checkout)".into();
    };
    let changed = output(
        "git",
        &[
            "status",
            "--porcelain",
            "--untracked-files=no",
            "--",
            "courier",
            "courier-bench",
            "Cargo.toml",
            "Cargo.lock",
        ],
    )
    .is_some_and(|s| !s.is_empty());
    if changed {
        format!("`{hash}` with uncommitted changes to the measured sources")
    } else {
        format!("`{hash}`")
    }
}

/// The trimmed standard output of a command that succeeded.
fn output(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program).args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::stats::Summary;
    use std::time::Duration;

    fn row(case: &str, subject: &str, metric: &str, unit: &str, value: f64) -> Row {
        Row {
            case: case.into(),
            family: case.into(),
            subject: subject.into(),
            metric: metric.into(),
            unit: unit.into(),
            value,
            summary: Summary::of(&[value * 0.9, value, value * 1.1]),
            bytes: None,
            tasks: None,
        }
    }

    fn ring() -> Report {
        Report {
            suite: "ring".into(),
            rows: vec![
                row("ring_bounded0_16", "courier", "msg_ns", "ns", 4000.0),
                row(
                    "ring_bounded0_16",
                    "courier",
                    "msgs_per_s",
                    "msgs/s",
                    250_000.0,
                ),
                row("ring_bounded0_16", "flume", "msg_ns", "ns", 6000.0),
                row(
                    "ring_bounded0_16",
                    "flume",
                    "msgs_per_s",
                    "msgs/s",
                    166_000.0,
                ),
                row("ring_bounded0_16", "floor", "msg_ns", "ns", 5000.0),
            ],
            notes: vec!["10000 messages".into()],
        }
    }

    fn run(report: Report) -> SuiteRun {
        SuiteRun {
            report,
            about: "A ring of threads",
            started: SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000),
            seconds: 1.5,
            error: None,
        }
    }

    fn provenance() -> Provenance {
        Provenance {
            command: "courier-bench document".into(),
            full: false,
            commit: "`abc1234`".into(),
            machine: "Test CPU, 2 CPUs".into(),
            system: "Linux 6.0; rustc 1.0".into(),
            load: ("0.1 0.2 0.3".into(), "0.4 0.5 0.6".into()),
            started: SystemTime::UNIX_EPOCH,
            seconds: 40.0,
        }
    }

    #[test]
    fn dates_are_civil_utc() {
        assert_eq!(utc(SystemTime::UNIX_EPOCH), "1970-01-01 00:00");
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(utc(t), "2023-11-14 22:13");
        let leap = SystemTime::UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(utc(leap), "2000-02-29 00:00");
    }

    #[test]
    fn a_wide_table_has_a_column_per_subject_and_no_inverse_rates() {
        let table = wide_table(&ring());
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines[0], "| case | metric | courier | flume | floor |");
        assert_eq!(lines.len(), 3 + 1, "{table}"); // header, rule, one row, blank
        assert!(lines[2].starts_with("| `ring_bounded0_16` | msg_ns | 4.00 µs ±"));
        assert!(lines[2].contains(", 1.50x |"), "{table}");
        assert!(lines[2].contains(", at 0.80x |"), "{table}");
        assert!(!table.contains("msgs_per_s"));
    }

    #[test]
    fn a_rate_that_is_not_an_inverse_stays() {
        let report = Report {
            suite: "x".into(),
            rows: vec![
                row("c", "courier", "bytes_per_s", "B/s", 1e9),
                row("d", "courier", "requests_per_s", "req/s", 30_000.0),
                row("d", "courier", "p50_ns", "ns", 1e6),
            ],
            notes: vec![],
        };
        let table = wide_table(&report);
        assert!(table.contains("bytes_per_s"), "{table}");
        assert!(table.contains("requests_per_s"), "{table}");
    }

    #[test]
    fn the_document_says_how_to_regenerate_and_what_produced_it() {
        let text = render(
            &[run(ring())],
            &provenance(),
            Some("docs/bench/ipc_sendrecv.svg"),
            &[("docs/waiting.md".into(), "Waiting".into())],
        );
        assert!(text.starts_with("# Benchmarks\n"));
        assert!(text.contains("bash scripts/benchmarks.sh"));
        assert!(text.contains("| commit | `abc1234` |"));
        assert!(text.contains("| date | 1970-01-01 00:00 UTC, 40 s in all |"));
        assert!(text.contains("## ring\n"));
        assert!(text.contains(
            "`cargo run --release -p courier-bench -- ring` · commit `abc1234` · \
             2023-11-14 22:13 UTC · Test CPU, 2 CPUs · 1.5 s"
        ));
        assert!(text.contains("- 10000 messages\n"));
        assert!(text.contains("- [Waiting](docs/waiting.md)\n"));
        // The summary's ring row: courier 4 µs, flume 1.5x behind, floor at 0.80x.
        let summary = text
            .lines()
            .find(|l| l.contains("`ring_bounded0_16`") && l.starts_with("| threads:"))
            .expect("summary row");
        assert_eq!(
            summary,
            "| threads: ring of 16 over `bounded(0)` (`ring` `ring_bounded0_16`) \
             | 4.00 µs | flume 1.50x | at 0.80x |"
        );
    }

    #[test]
    fn a_summary_floor_may_come_from_another_suite() {
        let p50 =
            |subject: &str, value: f64| row("rtt_split_64b", subject, "rtt_p50_ns", "ns", value);
        let ipc = Report {
            suite: "ipc".into(),
            rows: vec![
                p50("courier", 1000.0),
                p50("courier-socket", 3000.0),
                p50("courier-busypoll", 400.0),
                p50("ipc-channel", 12_000.0),
                p50("floor", 800.0),
            ],
            notes: Vec::new(),
        };
        let floor = Report {
            suite: "floor".into(),
            rows: vec![row(
                "rtt_shm_spin_split",
                "floor",
                "rtt_p50_ns",
                "ns",
                200.0,
            )],
            notes: Vec::new(),
        };
        let text = render(&[run(floor), run(ipc)], &provenance(), None, &[]);
        let rows: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("(`ipc` `rtt_split_64b`)"))
            .collect();
        assert_eq!(rows.len(), 2, "{text}");
        assert!(
            rows[0].ends_with("| 1.00 µs | ipc-channel 12.00x, courier-socket 3.00x | at 1.25x |"),
            "{}",
            rows[0]
        );
        assert!(
            rows[1].ends_with("| 400 ns | ipc-channel 30.00x | at 2.00x |"),
            "{}",
            rows[1]
        );
    }

    #[test]
    fn a_failed_suite_is_named() {
        let mut failed = run(ring());
        failed.error = Some("boom".into());
        let text = render(&[failed], &provenance(), None, &[]);
        assert!(text.contains("| failed | ring (see its section) |"));
        assert!(text.contains("**The suite failed:** boom"));
    }

    #[test]
    fn design_notes_are_listed_by_title() {
        let dir = std::env::temp_dir().join(format!("courier-doc-notes-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("b.md"), "# Second\n\ntext\n").unwrap();
        std::fs::write(dir.join("a.md"), "intro\n# First\n").unwrap();
        std::fs::write(dir.join("c.svg"), "<svg/>").unwrap();
        let notes = design_notes(&dir);
        let titles: Vec<&str> = notes.iter().map(|(_, t)| t.as_str()).collect();
        assert_eq!(titles, ["First", "Second"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
