//! The command line end to end: the real binary, its child processes, and the
//! files it writes. Structure only: no test here looks at a timing.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_courier-bench"))
        .args(args)
        .output()
        .expect("courier-bench runs")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A scratch directory removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("courier-bench-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    fn path(&self, file: &str) -> String {
        self.0.join(file).to_string_lossy().into_owned()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn records(path: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(Path::new(path)).unwrap();
    serde_json::from_str::<Value>(&text)
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

fn field<'v>(record: &'v Value, key: &str) -> &'v str {
    record[key]
        .as_str()
        .unwrap_or_else(|| panic!("{key} in {record}"))
}

#[test]
fn send_writes_json_markdown_and_svg() {
    let dir = Scratch::new("send");
    let (json, md, svg) = (
        dir.path("send.json"),
        dir.path("send.md"),
        dir.path("send.svg"),
    );
    let out = bench(&[
        "send", "-c", "3000", "--size", "22", "--json", &json, "--md", &md, "--plot", &svg,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = stdout(&out);
    assert!(text.contains("== send =="), "{text}");
    assert!(text.contains("3000 sends of 22 B"), "{text}");

    let records = records(&json);
    let metrics: BTreeSet<&str> = records.iter().map(|r| field(r, "metric")).collect();
    assert_eq!(
        metrics,
        BTreeSet::from(["send_cycles", "send_ns", "sends_per_s"])
    );
    for r in &records {
        assert_eq!(field(r, "suite"), "send");
        assert_eq!(field(r, "case"), "send_22b");
        assert_eq!(r["bytes"], 22);
        assert!(r["value"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r.get("tasks").is_none());
    }
    assert!(records.iter().any(|r| field(r, "subject") == "floor"));

    let md = std::fs::read_to_string(&md).unwrap();
    assert!(md.starts_with("### send\n\n| case | subject | metric | median | spread | ratio |"));
    assert!(std::fs::read_to_string(&svg).unwrap().starts_with("<svg"));
}

#[test]
fn floor_measures_every_case_in_every_placement() {
    let dir = Scratch::new("floor");
    let json = dir.path("floor.json");
    let out = bench(&["floor", "--samples", "20", "--json", &json, "--stats"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout(&out).contains("stddev"));

    let records = records(&json);
    let cases: BTreeSet<&str> = records.iter().map(|r| field(r, "case")).collect();
    for size in ["64k", "1m", "8m"] {
        for kind in ["warm", "fresh"] {
            assert!(
                cases.contains(format!("memcpy_{kind}_{size}").as_str()),
                "{cases:?}"
            );
        }
    }
    let mut placements = vec!["pinned", "unpinned"];
    if std::thread::available_parallelism().unwrap().get() >= 2 {
        placements.push("split");
    }
    for placement in placements {
        for case in [
            format!("rtt_socket_{placement}_64b"),
            format!("rtt_eventfd_{placement}"),
            format!("rtt_futex_{placement}"),
            format!("rtt_shm_spin_{placement}"),
        ] {
            let metrics: BTreeSet<&str> = records
                .iter()
                .filter(|r| field(r, "case") == case)
                .map(|r| field(r, "metric"))
                .collect();
            assert_eq!(
                metrics,
                BTreeSet::from(["rtt_cpu_ns", "rtt_p50_ns", "rtt_p99_ns"]),
                "{case}"
            );
        }
    }
    assert!(records.iter().all(|r| field(r, "subject") == "floor"));
}

#[test]
fn compare_flags_regressions_only_when_asked() {
    let dir = Scratch::new("compare");
    let (old, new) = (dir.path("old.json"), dir.path("new.json"));
    let write = |path: &str, ns: f64, rate: f64| {
        let records = serde_json::json!([
            {"suite": "send", "case": "send_22b", "subject": "floor", "metric": "send_ns",
             "value": ns, "unit": "ns", "bytes": 22},
            {"suite": "send", "case": "send_22b", "subject": "floor", "metric": "sends_per_s",
             "value": rate, "unit": "sends/s", "bytes": 22},
        ]);
        std::fs::write(path, records.to_string()).unwrap();
    };
    write(&old, 1000.0, 1e6);
    write(&new, 1500.0, 1e6);

    let same = bench(&["compare", &old, &old, "--fail-on-regression"]);
    assert!(same.status.success());
    assert!(stdout(&same).contains("2 figures: 0 better, 0 worse, 2 within the threshold"));

    let worse = bench(&["compare", &old, &new]);
    assert!(worse.status.success(), "only a report without the flag");
    assert!(stdout(&worse).contains("+50.0%"));
    assert!(stdout(&worse).contains("WORSE"));
    let gate = bench(&["compare", &old, &new, "--fail-on-regression"]);
    assert_eq!(gate.status.code(), Some(1));
    let loose = bench(&[
        "compare",
        &old,
        &new,
        "--threshold",
        "60",
        "--fail-on-regression",
    ]);
    assert!(loose.status.success());
}

#[test]
fn bad_invocations_fail_cleanly() {
    let role = bench(&["__child", "no-such-role"]);
    assert!(!role.status.success());
    assert!(String::from_utf8_lossy(&role.stderr).contains("no child role `no-such-role`"));
    let missing = bench(&["compare", "/nonexistent/a.json", "/nonexistent/b.json"]);
    assert!(!missing.status.success());
    assert!(!bench(&["send", "--samples", "0"]).status.success());
    assert!(!bench(&["no-such-suite"]).status.success());
}
