//! `courier-bench`: courier's benchmarks against its peers, in one run.
//!
//! ```text
//! courier-bench                       quick run of every suite (about a minute)
//! courier-bench <suite> [--full] [--json F] [--md F] [--plot F.svg] [options]
//! courier-bench document [--full] [--out BENCHMARKS.md] [--plot F.svg]
//! courier-bench compare OLD.json NEW.json
//! ```
//!
//! The measurement method is written down in `courier_bench::harness`; how to
//! add a suite in `courier_bench::suites`; what each suite measures in
//! `courier-bench/README.md`.
#![deny(unsafe_code)]

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime};

use clap::{value_parser, Arg, ArgAction, ArgMatches, Command};
use indicatif::{ProgressBar, ProgressStyle};

use courier_bench::harness::document::{self, Provenance, SuiteRun};
use courier_bench::harness::report::{self, Report, Style};
use courier_bench::harness::{child, compare, plot, Ctx, Options, Result};
use courier_bench::suites::{self, Suite};

/// The options every run takes (all suites, or one).
fn run_args() -> [Arg; 6] {
    [
        Arg::new("full")
            .long("full")
            .action(ArgAction::SetTrue)
            .help("Use the original benchmarks' own parameters (a million messages, 8000 samples...) instead of the quick ones"),
        Arg::new("samples")
            .long("samples")
            .value_name("N")
            .value_parser(value_parser!(u64).range(1..))
            .help("Override every case's sample count"),
        Arg::new("case")
            .long("case")
            .value_name("TEXT")
            .help("Run only the cases whose name contains TEXT (suites ipc, ring, chan), e.g. `_4k` or `mpmc_bounded1`"),
        Arg::new("json")
            .long("json")
            .value_name("FILE")
            .value_parser(value_parser!(PathBuf))
            .help("Write the figures as JSON records"),
        Arg::new("md")
            .long("md")
            .value_name("FILE")
            .value_parser(value_parser!(PathBuf))
            .help("Write the tables as markdown"),
        Arg::new("stats")
            .long("stats")
            .action(ArgAction::SetTrue)
            .help("Add n, TOTAL, LOWEST, HIGHEST, MEAN, STDDEV columns"),
    ]
}

fn cli() -> Command {
    let mut cmd = Command::new("courier-bench")
        .about("courier's benchmarks against the peers. Without a subcommand: a quick run of every suite.")
        .args(run_args())
        .after_help("Metrics ending in _ns or _cycles: lower is better; in _per_s: higher is better.");
    for suite in suites::SUITES {
        cmd = cmd.subcommand(
            Command::new(suite.name)
                .about(suite.about)
                .args(run_args())
                .arg(
                    Arg::new("plot")
                        .long("plot")
                        .value_name("FILE.svg")
                        .value_parser(value_parser!(PathBuf))
                        .help("Draw the suite as an SVG chart"),
                )
                .args((suite.args)()),
        );
    }
    cmd.subcommand(
        Command::new(DOCUMENT)
            .about("Run every suite and write BENCHMARKS.md (what scripts/benchmarks.sh runs)")
            .args(run_args().into_iter().filter(|a| !matches!(a.get_id().as_str(), "md" | "case")))
            .arg(
                Arg::new("out")
                    .long("out")
                    .value_name("FILE")
                    .default_value("BENCHMARKS.md")
                    .value_parser(value_parser!(PathBuf))
                    .help("Where to write the document (rewritten whole)"),
            )
            .arg(
                Arg::new("plot")
                    .long("plot")
                    .value_name("FILE.svg")
                    .default_value("docs/bench/ipc_sendrecv.svg")
                    .value_parser(value_parser!(PathBuf))
                    .help("Where to draw the ipc suite's send+receive sizes (linked from the document)"),
            )
            .arg(
                Arg::new("notes")
                    .long("notes")
                    .value_name("DIR")
                    .default_value("docs")
                    .value_parser(value_parser!(PathBuf))
                    .help("The design notes to list at the end (every *.md file in DIR)"),
            ),
    )
    .subcommand(
        Command::new("compare")
            .about("Print the change of every figure between two --json runs")
            .arg(
                Arg::new("old")
                    .required(true)
                    .value_parser(value_parser!(PathBuf)),
            )
            .arg(
                Arg::new("new")
                    .required(true)
                    .value_parser(value_parser!(PathBuf)),
            )
            .arg(
                Arg::new("threshold")
                    .long("threshold")
                    .value_name("PERCENT")
                    .default_value("5")
                    .value_parser(value_parser!(f64))
                    .help("Changes within this are noise"),
            )
            .arg(
                Arg::new("fail")
                    .long("fail-on-regression")
                    .action(ArgAction::SetTrue)
                    .help("Exit with status 1 if any figure got worse beyond the threshold"),
            ),
    )
    .subcommand(
        Command::new(child::SUBCOMMAND)
            .hide(true)
            .about("Run the peer side of a cross-process case")
            .arg(Arg::new("role").required(true))
            .arg(
                Arg::new("args")
                    .num_args(0..)
                    .trailing_var_arg(true)
                    .allow_hyphen_values(true),
            ),
    )
}

fn main() -> ExitCode {
    let matches = cli().get_matches();
    let result = match matches.subcommand() {
        Some(("compare", sub)) => run_compare(sub),
        Some((DOCUMENT, sub)) => run_document(sub),
        Some((child::SUBCOMMAND, sub)) => run_child(sub),
        Some((name, sub)) => match suites::suite(name) {
            Some(suite) => run_suites(&[suite], sub, true),
            None => Err(format!("no suite `{name}`").into()),
        },
        None => {
            let all: Vec<&Suite> = suites::SUITES.iter().collect();
            run_suites(&all, &matches, false)
        }
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("courier-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The subcommand that writes BENCHMARKS.md.
const DOCUMENT: &str = "document";

/// The run's options from its command line.
fn options(matches: &ArgMatches) -> Options {
    Options {
        full: matches.get_flag("full"),
        samples: matches.get_one::<u64>("samples").map(|&n| n as usize),
        case: matches
            .try_get_one::<String>("case")
            .ok()
            .flatten()
            .cloned(),
    }
}

fn run_suites(list: &[&Suite], matches: &ArgMatches, single: bool) -> Result<ExitCode> {
    let options = options(matches);
    let style = Style {
        stats: matches.get_flag("stats"),
    };
    let started = Instant::now();
    let (runs, failed) = measure(list, &options, single.then_some(matches), style);
    println!("total time {:.1} s", started.elapsed().as_secs_f64());
    let reports: Vec<Report> = runs.into_iter().map(|r| r.report).collect();
    if let Some(path) = matches.get_one::<PathBuf>("json") {
        report::write_json(path, &reports)?;
    }
    if let Some(path) = matches.get_one::<PathBuf>("md") {
        report::write_markdown(path, &reports, style)?;
    }
    if single {
        if let (Some(path), Some(report)) = (matches.get_one::<PathBuf>("plot"), reports.first()) {
            plot::draw(report, path)?;
        }
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// Runs every suite of `list` in turn, printing each one's table as it ends;
/// `own` holds a single suite's own options. Also says whether any failed.
fn measure(
    list: &[&Suite],
    options: &Options,
    own: Option<&ArgMatches>,
    style: Style,
) -> (Vec<SuiteRun>, bool) {
    println!(
        "courier-bench: {} run of {} suite(s) on {}",
        if options.full { "full" } else { "quick" },
        list.len(),
        document::machine()
    );
    let progress = ProgressBar::new(list.len() as u64);
    progress.set_style(
        ProgressStyle::with_template(
            "{spinner} {prefix:>8} [{elapsed_precise}] {bar:24} {pos}/{len} suites  {wide_msg}",
        )
        .expect("valid template"),
    );
    progress.enable_steady_tick(Duration::from_millis(200));
    let mut runs = Vec::new();
    let mut failed = false;
    for suite in list {
        progress.set_prefix(suite.name);
        let mut ctx = Ctx::new(suite.name, options.clone(), own, progress.clone());
        let (wall, t0) = (SystemTime::now(), Instant::now());
        let outcome = (suite.run)(&mut ctx);
        let seconds = t0.elapsed().as_secs_f64();
        ctx.note(format!("suite time {seconds:.1} s"));
        let report = ctx.into_report();
        progress.suspend(|| {
            if !report.rows.is_empty() {
                println!("\n{}", report::table(&report, style));
            }
            if let Err(e) = &outcome {
                eprintln!("courier-bench: suite `{}` failed: {e}", suite.name);
            }
            let _ = std::io::stdout().flush();
        });
        failed |= outcome.is_err();
        runs.push(SuiteRun {
            report,
            about: suite.about,
            started: wall,
            seconds,
            error: outcome.err().map(|e| e.to_string()),
        });
        progress.inc(1);
    }
    progress.finish_and_clear();
    (runs, failed)
}

/// `courier-bench document`: every suite, then BENCHMARKS.md and the plot.
fn run_document(matches: &ArgMatches) -> Result<ExitCode> {
    let options = options(matches);
    let command = std::iter::once("courier-bench".to_string())
        .chain(std::env::args().skip(1))
        .collect::<Vec<_>>()
        .join(" ");
    let mut provenance = Provenance::gather(command, options.full);
    let started = Instant::now();
    let all: Vec<&Suite> = suites::SUITES.iter().collect();
    let style = Style {
        stats: matches.get_flag("stats"),
    };
    let (runs, failed) = measure(&all, &options, None, style);
    provenance.seconds = started.elapsed().as_secs_f64();
    provenance.load.1 = document::load_average();
    println!("total time {:.1} s", provenance.seconds);

    if let Some(path) = matches.get_one::<PathBuf>("json") {
        let reports: Vec<Report> = runs.iter().map(|r| r.report.clone()).collect();
        report::write_json(path, &reports)?;
    }
    let out = matches.get_one::<PathBuf>("out").expect("has a default");
    let base = out.parent().unwrap_or(std::path::Path::new(""));
    // Links in the document are relative to its own folder.
    let link = |p: &std::path::Path| {
        p.strip_prefix(base)
            .unwrap_or(p)
            .to_string_lossy()
            .into_owned()
    };
    let plot_path = matches.get_one::<PathBuf>("plot").expect("has a default");
    let plotted = match runs.iter().find(|r| r.report.suite == "ipc") {
        Some(ipc) if !ipc.report.rows.is_empty() => {
            if let Some(dir) = plot_path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir)?;
            }
            plot::draw(&ipc.report, plot_path)?;
            Some(link(plot_path))
        }
        _ => None,
    };
    let notes_dir = matches.get_one::<PathBuf>("notes").expect("has a default");
    let notes: Vec<(String, String)> = document::design_notes(notes_dir)
        .into_iter()
        .map(|(path, title)| (link(std::path::Path::new(&path)), title))
        .collect();
    let text = document::render(&runs, &provenance, plotted.as_deref(), &notes);
    std::fs::write(out, text).map_err(|e| format!("{}: {e}", out.display()))?;
    println!("wrote {}", out.display());
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn run_compare(matches: &ArgMatches) -> Result<ExitCode> {
    let path = |id| matches.get_one::<PathBuf>(id).expect("required");
    let old =
        report::read_json(path("old")).map_err(|e| format!("{}: {e}", path("old").display()))?;
    let new =
        report::read_json(path("new")).map_err(|e| format!("{}: {e}", path("new").display()))?;
    let threshold = matches.get_one::<f64>("threshold").copied().unwrap_or(5.0) / 100.0;
    let comparison = compare::compare(&old, &new, threshold);
    print!("{}", comparison.render());
    Ok(
        if matches.get_flag("fail") && comparison.regressions() > 0 {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        },
    )
}

fn run_child(matches: &ArgMatches) -> Result<ExitCode> {
    child::die_with_parent()?;
    let name = matches.get_one::<String>("role").expect("required");
    let args: Vec<String> = matches
        .get_many::<String>("args")
        .map(|a| a.cloned().collect())
        .unwrap_or_default();
    let role = suites::role(name).ok_or_else(|| format!("no child role `{name}`"))?;
    (role.run)(&args)?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_is_consistent() {
        cli().debug_assert();
    }

    #[test]
    fn send_options_parse() {
        let m = cli()
            .try_get_matches_from([
                "courier-bench",
                "send",
                "-c",
                "1000000",
                "--size",
                "22",
                "--full",
            ])
            .unwrap();
        let (name, sub) = m.subcommand().unwrap();
        assert_eq!(name, "send");
        assert_eq!(sub.get_one::<u64>("count"), Some(&1_000_000));
        assert_eq!(sub.get_one::<u64>("size"), Some(&22));
        assert!(sub.get_flag("full"));
    }

    #[test]
    fn child_args_pass_through() {
        let m = cli()
            .try_get_matches_from(["courier-bench", "__child", "floor-echo-spin", "-1", "x"])
            .unwrap();
        let (_, sub) = m.subcommand().unwrap();
        let args: Vec<&String> = sub.get_many::<String>("args").unwrap().collect();
        assert_eq!(args, ["-1", "x"]);
    }
}
