//! `courier-bench`: every seed's benchmark against the peers, in one run.
//!
//! ```text
//! courier-bench                       quick run of every suite (< 3 min)
//! courier-bench <suite> [--full] [--json F] [--md F] [--plot F.svg] [options]
//! courier-bench compare OLD.json NEW.json
//! ```
//!
//! The measurement method is written down in `courier_bench::harness`; how to
//! add a suite in `courier_bench::suites`.
#![deny(unsafe_code)]

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{value_parser, Arg, ArgAction, ArgMatches, Command};
use indicatif::{ProgressBar, ProgressStyle};

use courier_bench::harness::report::{self, Report, Style};
use courier_bench::harness::{child, compare, plot, Ctx, Options, Result};
use courier_bench::suites::{self, Suite};

/// The options every run takes (all suites, or one).
fn run_args() -> [Arg; 6] {
    [
        Arg::new("full")
            .long("full")
            .action(ArgAction::SetTrue)
            .help("Use the seeds' own parameters (a million messages, 8000 samples...) instead of the quick ones"),
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

fn run_suites(list: &[&Suite], matches: &ArgMatches, single: bool) -> Result<ExitCode> {
    let options = Options {
        full: matches.get_flag("full"),
        samples: matches.get_one::<u64>("samples").map(|&n| n as usize),
        case: matches.get_one::<String>("case").cloned(),
    };
    let style = Style {
        stats: matches.get_flag("stats"),
    };
    let started = Instant::now();
    println!(
        "courier-bench: {} run of {} suite(s) on {}",
        if options.full { "full" } else { "quick" },
        list.len(),
        machine()
    );
    let progress = ProgressBar::new(list.len() as u64);
    progress.set_style(
        ProgressStyle::with_template(
            "{spinner} {prefix:>8} [{elapsed_precise}] {bar:24} {pos}/{len} suites  {wide_msg}",
        )
        .expect("valid template"),
    );
    progress.enable_steady_tick(Duration::from_millis(200));
    let mut reports: Vec<Report> = Vec::new();
    let mut failed = false;
    for suite in list {
        progress.set_prefix(suite.name);
        let own = single.then_some(matches);
        let mut ctx = Ctx::new(suite.name, options.clone(), own, progress.clone());
        let t0 = Instant::now();
        let outcome = (suite.run)(&mut ctx);
        ctx.note(format!("suite time {:.1} s", t0.elapsed().as_secs_f64()));
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
        reports.push(report);
        progress.inc(1);
    }
    progress.finish_and_clear();
    println!("total time {:.1} s", started.elapsed().as_secs_f64());
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

/// "Intel(R) Xeon(R) Processor, 2 CPUs" from /proc/cpuinfo.
fn machine() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = info
        .lines()
        .find_map(|l| l.strip_prefix("model name").and_then(|r| r.split_once(':')))
        .map_or("unknown CPU", |(_, m)| m.trim())
        .to_string();
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{model}, {cpus} CPUs")
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
