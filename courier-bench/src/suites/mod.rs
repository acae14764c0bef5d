//! The suites, and the child roles their cross-process cases run.
//!
//! # Adding a suite
//!
//! 1. Write `suites/<name>.rs` with `pub fn run(ctx: &mut Ctx) -> Result<()>`
//!    (and `pub fn args() -> Vec<clap::Arg>` if it takes options of its own).
//! 2. Add `pub mod <name>;` below and one line to [`SUITES`]:
//!    `Suite { name: "<name>", about: "...", args: <name>::args, run: <name>::run },`
//!    (`args: no_args` when it has none). `courier-bench` then runs it in the
//!    all-suites quick run, and `courier-bench <name> [--full] [--json F]
//!    [--md F] [--plot F.svg] [its options]` runs it alone.
//! 3. For each child process it spawns, add one line to [`ROLES`]:
//!    `Role { name: "<name>-<role>", run: <name>::<role> },`.
//!
//! # How a suite measures a case
//!
//! ```no_run
//! use std::os::fd::AsFd;
//! use std::os::unix::net::UnixDatagram;
//!
//! use courier_bench::harness::child::Placement;
//! use courier_bench::harness::measure::{time_each, Sampler};
//! use courier_bench::harness::{Case, Ctx, Result};
//!
//! pub fn run(ctx: &mut Ctx) -> Result<()> {
//!     // Quick and --full parameters (`--samples N` overrides ctx.samples;
//!     // ctx.opt reads the suite's own options, declared in its `args`).
//!     let samples = ctx.samples(200, 8000);
//!     let size: u64 = ctx.opt("size").unwrap_or(64);
//!     let msg = vec![0u8; size as usize];
//!     let mut buf = vec![0u8; size as usize];
//!
//!     // 1. A closure sampler: warm-up, then `samples` samples of `ops`
//!     //    operations each; figures come back per operation.
//!     let case = Case::sized("sendrecv", size); // "sendrecv_64b", "bytes": 64
//!     ctx.status("sendrecv_64b · floor"); // the progress line
//!     let (a, b) = UnixDatagram::pair()?;
//!     let s = Sampler::new(samples).ops(1000).run(|ops| {
//!         for _ in 0..ops {
//!             a.send(&msg)?;
//!             b.recv(&mut buf)?;
//!         }
//!         Ok::<(), std::io::Error>(())
//!     })?;
//!     ctx.record(&case, "floor", "sendrecv_ns", "ns", &s.wall_ns);
//!     ctx.record(&case, "floor", "msgs_per_s", "msgs/s", &s.per_s());
//!
//!     // 2. Externally measured samples: any Vec<f64> with one figure per
//!     //    sample, e.g. every round trip to a child process timed on its own,
//!     //    in both placements (named in the case).
//!     for placement in Placement::BOTH {
//!         let placed = placement.enter()?; // this thread, until dropped
//!         let (ours, theirs) = UnixDatagram::pair()?;
//!         let peer = placed.spawn("mysuite-echo", &[], &[theirs.as_fd()])?; // placed too
//!         drop(theirs);
//!         let each = time_each(500, samples, || {
//!             ours.send(&msg)?;
//!             ours.recv(&mut buf).map(drop)
//!         })?;
//!         let case = Case::sized(format!("rtt_{}", placement.label()), size);
//!         // rtt_p50_ns (median and spread), rtt_p99_ns, rtt_cpu_ns; or
//!         // ctx.record / ctx.record_value with a vector or figure of your own.
//!         ctx.record_latencies(&case, "floor", "rtt", &each);
//!         drop(ours); // the child sees EOF and exits
//!         peer.wait()?;
//!     }
//!     Ok(())
//! }
//! ```
//!
//! Naming: a **case** is what is measured (`Case::sized(family, bytes)` for a
//! message-size case, `Case::new(name).tasks(n)` for a task-count case; put the
//! placement, `pinned`/`unpinned`, in the name of a cross-process case). A
//! **subject** is who is measured: `courier`, `courier-<variant>`, a peer's
//! crate name or `<crate>-<variant>` (`ipc-channel-bytes`), or `floor`. A
//! **metric**'s suffix says which way is better: `_ns` and `_cycles` lower,
//! `_per_s` higher. Record every subject of a case under the same case and
//! metric names so the ratio column can line them up: a peer's ratio is how
//! many times courier is ahead of it, the floor's is how far courier is from
//! the limit (see `harness::report`).

pub mod chan;
pub mod fiber;
pub mod floor;
pub mod http;
pub mod ipc;
mod ipc_fds;
mod ipc_oneway;
mod ipc_router;
mod ipc_stream;
pub mod iter;
pub mod ring;
mod ring_fiber;
pub mod send;
pub mod serde;

use crate::harness::{Ctx, Result};

/// A benchmark suite: `courier-bench <name>`.
pub struct Suite {
    /// The subcommand, and the `suite` of its JSON records.
    pub name: &'static str,
    /// One line for `--help`.
    pub about: &'static str,
    /// The suite's own command-line options.
    pub args: fn() -> Vec<clap::Arg>,
    /// Measures every case and records the figures in the context.
    pub run: fn(&mut Ctx<'_>) -> Result<()>,
}

/// The peer side of a cross-process case: `courier-bench __child <name> ARGS`.
pub struct Role {
    /// The role's name, unique over all suites (`<suite>-<role>`).
    pub name: &'static str,
    /// Runs in the child process with the arguments after the name; the
    /// parent's descriptors are claimed with `harness::child::inherited_fd`.
    pub run: fn(&[String]) -> Result<()>,
}

/// For a suite without options of its own.
pub fn no_args() -> Vec<clap::Arg> {
    Vec::new()
}

/// Every suite, in the order the all-suites run goes through them: the
/// physical limits first, then the benchmarks each part of courier answers to.
pub static SUITES: &[Suite] = &[
    Suite {
        name: "floor",
        about: "The physical limits: memcpy bandwidth, socket / eventfd / futex / shared-memory round trips",
        args: no_args,
        run: floor::run,
    },
    Suite {
        name: "iter",
        about: "Kind dispatch of copy_to_iter (enum vs dyn vs fn-pointer table), as in the Linux iov_iter renumbering patch, and copy_to_iter against memcpy",
        args: no_args,
        run: iter::run,
    },
    Suite {
        name: "send",
        about: "22-byte sends through each reach (a million with -c 1000000, as in the rump kernel send-path measurements), sends/s and cycles/send, next to the raw-syscall floor",
        args: send::args,
        run: send::run,
    },
    Suite {
        name: "ipc",
        about: "Send+receive by size (1 B .. 8 MiB, the table of ipc-channel PR #68), receiver sets, shared memory, cross-process round trips and one-way streams, courier (ring and socket paths) against ipc-channel",
        args: no_args,
        run: ipc::run,
    },
    Suite {
        name: "serde",
        about: "The wire format, chosen by measurement: postcard (courier) against bitcode",
        args: no_args,
        run: serde::run,
    },
    Suite {
        name: "fiber",
        about: "Fibers as Ruby's fiber pool (feature #15997) measured them: allocate, reuse, switch, and fibers alive at once; courier against may and corosensei",
        args: no_args,
        run: fiber::run,
    },
    Suite {
        name: "http",
        about: "Hello servers under 256 keep-alive connections, as Ruby's fiber pool (feature #15997) measured them: the http_hello example against may_minihttp and tokio + hyper",
        args: http::args,
        run: http::run,
    },
    Suite {
        name: "ring",
        about: "The ring of Rust's 2012 message-passing post: N threads (2, 4, 16) passing messages (1M with --full) over bounded(1), unbounded, bounded(0), with a futex hand-off floor for bounded(0); plus chan::local in one thread",
        args: no_args,
        run: ring::run,
    },
    Suite {
        name: "chan",
        about: "crossbeam-channel's scenarios (seq, spsc, mpsc, mpmc, select) on bounded(0), bounded(1), bounded(N), unbounded",
        args: no_args,
        run: chan::run,
    },
];

/// Every child role.
pub static ROLES: &[Role] = &[
    Role {
        name: "ipc-echo-courier",
        run: ipc::echo_courier,
    },
    Role {
        name: "ipc-echo-ipc-channel",
        run: ipc::echo_ipc_channel,
    },
    Role {
        name: ipc_oneway::ROLE_COURIER,
        run: ipc_oneway::stream_courier,
    },
    Role {
        name: ipc_oneway::ROLE_IPC_CHANNEL,
        run: ipc_oneway::stream_ipc_channel,
    },
    Role {
        name: ipc_oneway::ROLE_FLOOR,
        run: ipc_oneway::stream_floor,
    },
    Role {
        name: "floor-echo-socket",
        run: floor::echo_socket,
    },
    Role {
        name: "floor-echo-eventfd",
        run: floor::echo_eventfd,
    },
    Role {
        name: "floor-echo-futex",
        run: floor::echo_futex,
    },
    Role {
        name: "floor-echo-spin",
        run: floor::echo_spin,
    },
    Role {
        name: http::SERVE,
        run: http::serve,
    },
    Role {
        name: ring_fiber::MAY_W2,
        run: ring_fiber::may_w2_child,
    },
];

/// The suite called `name`.
pub fn suite(name: &str) -> Option<&'static Suite> {
    SUITES.iter().find(|s| s.name == name)
}

/// The role called `name`.
pub fn role(name: &str) -> Option<&'static Role> {
    ROLES.iter().find(|r| r.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn names_are_unique_and_free() {
        let suites: HashSet<_> = SUITES.iter().map(|s| s.name).collect();
        assert_eq!(suites.len(), SUITES.len());
        let roles: HashSet<_> = ROLES.iter().map(|r| r.name).collect();
        assert_eq!(roles.len(), ROLES.len());
        for taken in [
            "compare",
            "document",
            crate::harness::child::SUBCOMMAND,
            "help",
        ] {
            assert!(!suites.contains(taken), "suite named {taken}");
        }
        assert_eq!(suite("send").map(|s| s.name), Some("send"));
        assert!(role("floor-echo-socket").is_some());
        assert!(suite("nope").is_none() && role("nope").is_none());
    }

    #[test]
    fn suite_options_are_valid_clap_args() {
        let mut cmd = clap::Command::new("t");
        for s in SUITES {
            cmd = cmd.subcommand(clap::Command::new(s.name).args((s.args)()));
        }
        cmd.debug_assert();
    }
}
