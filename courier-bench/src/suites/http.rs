//! Hello servers under load, as Ruby's fiber pool was measured (Ruby feature
//! #15997, <https://bugs.ruby-lang.org/issues/15997>: one fiber per
//! connection, HTTP/1.1 keep-alive, `ab -k` against its `/small` page).
//!
//! Subjects, each a server answering every request with the same 1,200-byte
//! body on keep-alive connections, with the same number of worker threads:
//!
//! - `courier`: the `http_hello` example's own `serve` (one fiber a
//!   connection) on a `courier::fiber::Runtime`;
//! - `may-minihttp`: a hello service on the `may_minihttp` crate (may's
//!   coroutines, one a connection);
//! - `tokio-hyper`: hyper 1.x's HTTP/1.1 connection on a multi-threaded
//!   tokio runtime (one task a connection).
//!
//! Each server runs in a child process of its own (role `http-serve`), so
//! that server and load generator never share a runtime, an allocator or a
//! process; all three are started at once and take turns under load, each
//! round starting one subject further along. A server that does not start
//! is reported under the table and skipped.
//!
//! # The load generator
//!
//! It opens the connections (256 by default) to the server under test
//! before the clock starts, then the connections take tickets from one
//! shared counter until the round's fixed number of requests is handed out;
//! each sends a `GET /small`, reads the whole response and checks it (status
//! `200`, a `Content-Length` of 1,200 and 1,200 bytes of body: a response
//! that is wrong in any way fails the subject), and times it from the first
//! byte written to the last byte read. `requests_per_s` is the round's
//! requests over its wall time (the median over rounds, with its spread);
//! `p50_ns` and `p99_ns` are over every request of every round.
//!
//! The client is tokio, one current-thread runtime on each of its threads,
//! each owning an equal share of the connections: as `wrk` and `ab` do, one
//! event loop drives many connections, so the client costs about a `write`
//! and a `read` a request and no thread hand-off. With a blocking thread per
//! connection instead, 256 client threads would compete with the server's
//! workers for the same CPUs, and every request would pay a thread wake-up
//! on each side; the figures would measure the kernel's scheduler more than
//! the servers. The client has as many threads as the servers have workers:
//! on loopback a request costs the client about as much CPU as the server
//! (mostly the kernel's TCP path), so a single client thread, as `ab` has,
//! saturates its CPU near 100,000 requests a second on this class of machine
//! and caps every server at the same figure.
//!
//! Reproduce by hand, with `ab` (Debian's apache2-utils):
//!
//! ```text
//! courier-bench __child http-serve courier 127.0.0.1:8080 2 &
//! ab -k -c 256 -n 100000 http://127.0.0.1:8080/small
//! ```
//!
//! (`may-minihttp` and `tokio-hyper` in place of `courier`; the last
//! argument is the number of worker threads.)

use std::convert::Infallible;
use std::io::{self, BufRead, BufReader, Write as _};
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream as Notify;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use clap::{value_parser, Arg};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::harness::child::{self, Peer};
use crate::harness::measure::rotation;
use crate::harness::stats::Summary;
use crate::harness::{Case, Ctx, Result};

#[path = "../../../courier/examples/http_hello.rs"]
#[allow(dead_code)] // its `main`: the suite runs `serve` on a runtime of its own
mod http_hello;

/// The servers, in the order of the table.
const SUBJECTS: [&str; 3] = ["courier", "may-minihttp", "tokio-hyper"];

/// The request every connection sends: the `/small` page of Ruby's benchmark.
const REQUEST: &[u8] = b"GET /small HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";

/// The length of every response body.
const BODY_LEN: usize = 1200;

/// The body of every response of `may-minihttp` and `tokio-hyper` (the same
/// bytes as the example's).
static BODY: &str = {
    const BYTES: [u8; BODY_LEN] = [b'x'; BODY_LEN];
    match std::str::from_utf8(&BYTES) {
        Ok(s) => s,
        Err(_) => panic!("ASCII"),
    }
};

/// How long a server may take to start listening.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// The suite's options.
pub fn args() -> Vec<Arg> {
    vec![
        Arg::new("requests")
            .long("requests")
            .short('n')
            .value_name("N")
            .value_parser(value_parser!(u64).range(1..))
            .help("Requests a round (default 50,000; 100,000 with --full, as `ab -n 100000`)"),
        Arg::new("connections")
            .long("connections")
            .short('c')
            .value_name("N")
            .value_parser(value_parser!(u64).range(1..=10_000))
            .help("Keep-alive connections (default 256, as `ab -c 256`)"),
        Arg::new("workers")
            .long("workers")
            .value_name("N")
            .value_parser(value_parser!(u64).range(1..=256))
            .help("Worker threads of every server (default: the CPUs available)"),
        Arg::new("client-threads")
            .long("client-threads")
            .value_name("N")
            .value_parser(value_parser!(u64).range(1..=64))
            .help("Threads of the load generator (default: as many as the servers' workers)"),
    ]
}

/// Measures every case (see the module docs).
pub fn run(ctx: &mut Ctx) -> Result<()> {
    let connections: u64 = ctx.opt("connections").unwrap_or(256);
    let case = Case::new(format!("small_c{connections}")).tasks(connections);
    if !ctx.wants(&case) {
        return Ok(());
    }
    let requests: u64 = ctx
        .opt("requests")
        .unwrap_or(ctx.pick(50_000, 100_000))
        .max(connections);
    let rounds = ctx.samples(3, 5);
    let workers: u64 = ctx
        .opt("workers")
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get() as u64));
    let client_threads: u64 = ctx.opt("client-threads").unwrap_or(workers);
    let load = Load {
        connections: connections as usize,
        requests,
        threads: client_threads.min(connections) as usize,
    };

    // Every server starts before any is loaded; one that cannot start is
    // reported and left out.
    let mut servers: Vec<Server> = Vec::new();
    for subject in SUBJECTS {
        ctx.status(format!("starting {subject}"));
        match Server::start(subject, workers) {
            Ok(server) => servers.push(server),
            Err(e) => ctx.note(format!("{subject}: could not start: {e}; skipped")),
        }
    }

    let mut per_s: Vec<Vec<f64>> = vec![Vec::new(); servers.len()];
    let mut latencies: Vec<Vec<f64>> = vec![Vec::new(); servers.len()];
    let mut failed: Vec<bool> = vec![false; servers.len()];
    // One untimed round first (warm-up: every server's connections, stacks
    // and caches), then the timed rounds.
    for round in 0..=rounds {
        for i in rotation(round, servers.len()) {
            if failed[i] {
                continue;
            }
            let server = &mut servers[i];
            let label = if round == 0 {
                "warm-up".to_string()
            } else {
                format!("round {round}/{rounds}")
            };
            ctx.status(format!("{} · {} · {label}", case.name(), server.subject));
            let warm = Load {
                requests: (requests / 10).max(connections),
                ..load
            };
            let outcome = if round == 0 {
                warm.run(server.addr)
            } else {
                load.run(server.addr)
            };
            match outcome {
                Ok(figures) if round > 0 => {
                    per_s[i].push(figures.requests as f64 * 1e9 / figures.wall_ns as f64);
                    latencies[i].extend(figures.latencies_ns.iter().map(|&ns| ns as f64));
                }
                Ok(_) => {}
                Err(e) => {
                    let state = if server.peer.is_running() {
                        "running"
                    } else {
                        "exited"
                    };
                    ctx.note(format!(
                        "{}: load failed ({e}; server {state}); skipped",
                        server.subject
                    ));
                    failed[i] = true;
                }
            }
        }
    }

    for (i, server) in servers.iter().enumerate() {
        if failed[i] || per_s[i].is_empty() {
            continue;
        }
        let subject = server.subject;
        ctx.record(&case, subject, "requests_per_s", "req/s", &per_s[i]);
        ctx.record(&case, subject, "p50_ns", "ns", &latencies[i]);
        let p99 = Summary::of(&latencies[i]).map_or(f64::NAN, |s| s.p99);
        ctx.record_value(&case, subject, "p99_ns", "ns", p99);
    }
    ab_once(ctx, &servers, &failed, connections);
    ctx.note(format!(
        "every server runs in a child process with {workers} worker threads; the load \
         generator (tokio, {} client thread(s)) in this one: {connections} keep-alive \
         connections, {requests} requests a round, {rounds} rounds after a warm-up, \
         1,200-byte bodies",
        load.threads
    ));
    Ok(())
}

/// The requests of the seed's own `ab` run.
const AB_REQUESTS: u64 = 100_000;

/// Loads every server once with the seed's own tool, `ab -k -c <connections>
/// -n 100000` (Debian's apache2-utils), if it is installed: case
/// `small_c<connections>_ab`, one figure a server (`ab` has one thread, so
/// it measures its own ceiling as much as the servers: see the module docs).
fn ab_once(ctx: &mut Ctx, servers: &[Server], failed: &[bool], connections: u64) {
    let case = Case::new(format!("small_c{connections}_ab")).tasks(connections);
    if !ctx.wants(&case) {
        return;
    }
    let installed = std::process::Command::new("ab")
        .arg("-V")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !installed {
        ctx.note(format!(
            "{}: `ab` (apache2-utils) is not installed: skipped",
            case.name()
        ));
        return;
    }
    for (server, _) in servers.iter().zip(failed).filter(|(_, &failed)| !failed) {
        ctx.status(format!("{} · {}", case.name(), server.subject));
        let url = format!("http://{}/small", server.addr);
        let output = std::process::Command::new("ab")
            .args(["-q", "-k", "-c", &connections.to_string()])
            .args(["-n", &AB_REQUESTS.to_string(), &url])
            .output();
        let text = match output {
            Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).into_owned(),
            Ok(out) => {
                ctx.note(format!(
                    "{} · {}: ab failed: {}",
                    case.name(),
                    server.subject,
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
                continue;
            }
            Err(e) => {
                ctx.note(format!("{} · {}: ab: {e}", case.name(), server.subject));
                continue;
            }
        };
        let field = |name: &str| -> Option<f64> {
            let line = text.lines().find(|l| l.starts_with(name))?;
            line[name.len()..].split_whitespace().next()?.parse().ok()
        };
        match (field("Requests per second:"), field("Failed requests:")) {
            (Some(per_s), Some(0.0)) => {
                ctx.record_value(&case, server.subject, "requests_per_s", "req/s", per_s);
            }
            (_, failures) => ctx.note(format!(
                "{} · {}: ab reported {} failed requests, or no rate: not recorded",
                case.name(),
                server.subject,
                failures.map_or("?".to_string(), |f| f.to_string())
            )),
        }
    }
    ctx.note(format!(
        "{}: `ab -k -c {connections} -n {AB_REQUESTS}` once against each server, after the \
         rounds above (one client thread: its own ceiling shows)",
        case.name()
    ));
}

/// A hello server in a child process.
struct Server {
    subject: &'static str,
    addr: SocketAddr,
    peer: Peer,
}

impl Server {
    /// Starts `subject` on a free port of 127.0.0.1 and waits until it
    /// listens (it says so on a socket passed as its descriptor 3).
    fn start(subject: &'static str, workers: u64) -> Result<Server> {
        let mut last = None;
        // The port is chosen here and bound there: another process may take
        // it in between, so a server that cannot bind gets a second port.
        for _ in 0..3 {
            let addr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
            let (ours, theirs) = Notify::pair()?;
            let args = [
                subject.to_string(),
                addr.to_string(),
                workers.to_string(),
                READY.to_string(),
            ];
            let peer = child::spawn(SERVE, &args, &[theirs.as_fd()])?;
            drop(theirs);
            ours.set_read_timeout(Some(START_TIMEOUT))?;
            let mut line = String::new();
            BufReader::new(&ours).read_line(&mut line)?;
            if line.trim() == "ready" {
                return Ok(Server {
                    subject,
                    addr,
                    peer,
                });
            }
            let why = match peer.wait() {
                Ok(()) => "exited before listening".to_string(),
                Err(e) => e.to_string(),
            };
            last = Some(why);
        }
        Err(last.unwrap_or_default().into())
    }
}

/// The child role that runs one hello server.
pub const SERVE: &str = "http-serve";

/// The argument that makes a server report on descriptor 3 when it listens.
const READY: &str = "--ready";

/// Child role `http-serve <subject> <addr> <workers> [--ready]`: serves
/// until killed. It prints the address it listens on, and with `--ready`
/// also writes `ready` to the socket its parent passed.
pub fn serve(args: &[String]) -> Result<()> {
    let [subject, addr, workers, rest @ ..] = args else {
        return Err("usage: http-serve <subject> <addr> <workers> [--ready]".into());
    };
    let workers: usize = workers.parse()?;
    let addr: SocketAddr = addr.parse()?;
    let notify = if rest.iter().any(|a| a == READY) {
        Some(Notify::from(child::inherited_fd(0)?))
    } else {
        None
    };
    let name = subject.clone();
    let listening = move || -> io::Result<()> {
        println!("{name} listening on {addr}");
        if let Some(mut n) = notify {
            n.write_all(b"ready\n")?;
        }
        Ok(())
    };
    match subject.as_str() {
        "courier" => serve_courier(addr, workers, listening),
        "may-minihttp" => serve_may(addr, workers, listening),
        "tokio-hyper" => serve_hyper(addr, workers, listening),
        other => Err(format!("no http subject `{other}` (one of {SUBJECTS:?})").into()),
    }
}

/// The `http_hello` example's server: its `serve`, one fiber a connection.
fn serve_courier(
    addr: SocketAddr,
    workers: usize,
    listening: impl FnOnce() -> io::Result<()> + Send + 'static,
) -> Result<()> {
    use courier::fiber::{self, net::TcpListener};
    let rt = fiber::Runtime::builder().workers(workers).build()?;
    rt.block_on(move || -> io::Result<()> {
        let listener = TcpListener::bind(addr)?;
        listening()?;
        loop {
            let (conn, _) = listener.accept()?;
            fiber::spawn(move || http_hello::serve(conn));
        }
    })?;
    Ok(())
}

/// The hello service of `may-minihttp`.
#[derive(Clone)]
struct Hello;

impl may_minihttp::HttpService for Hello {
    fn call(
        &mut self,
        req: may_minihttp::Request,
        rsp: &mut may_minihttp::Response,
    ) -> io::Result<()> {
        // may_minihttp keeps every connection open but does not say so to an
        // HTTP/1.0 client (`ab -k`), which then waits for the close: say it.
        let keep_alive = req.headers().iter().any(|h| {
            h.name.eq_ignore_ascii_case("connection")
                && std::str::from_utf8(h.value).is_ok_and(asks_keep_alive)
        });
        if req.version() == 0 && keep_alive {
            rsp.header("Connection: keep-alive");
        }
        rsp.header("Content-Type: text/plain").body(BODY);
        Ok(())
    }
}

/// Whether a `Connection` header's value asks to keep the connection.
fn asks_keep_alive(value: &str) -> bool {
    value
        .split(',')
        .any(|token| token.trim().eq_ignore_ascii_case("keep-alive"))
}

/// may_minihttp's server on `workers` may workers.
fn serve_may(
    addr: SocketAddr,
    workers: usize,
    listening: impl FnOnce() -> io::Result<()>,
) -> Result<()> {
    may::config().set_workers(workers);
    let server = may_minihttp::HttpServer(Hello).start(addr)?;
    listening()?;
    server
        .join()
        .map_err(|_| "the may_minihttp server panicked")?;
    Ok(())
}

/// hyper 1.x's HTTP/1.1 server on a tokio runtime of `workers` threads.
fn serve_hyper(
    addr: SocketAddr,
    workers: usize,
    listening: impl FnOnce() -> io::Result<()> + Send + 'static,
) -> Result<()> {
    use hyper::header::{HeaderValue, CONTENT_TYPE};
    use hyper::{Request, Response};

    async fn hello(_req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
        let mut rsp = Response::new(Full::new(Bytes::from_static(BODY.as_bytes())));
        rsp.headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        Ok(rsp)
    }

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_io()
        .build()?;
    async fn accept_loop(
        addr: SocketAddr,
        listening: impl FnOnce() -> io::Result<()>,
    ) -> io::Result<()> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        listening()?;
        loop {
            let (stream, _) = listener.accept().await?;
            let _ = stream.set_nodelay(true);
            tokio::spawn(async move {
                let io = hyper_util::rt::TokioIo::new(stream);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, hyper::service::service_fn(hello))
                    .await;
            });
        }
    }

    // The accept loop is a task on the workers, not on this thread.
    rt.block_on(rt.spawn(accept_loop(addr, listening)))??;
    Ok(())
}

/// One round of load.
#[derive(Clone, Copy, Debug)]
struct Load {
    connections: usize,
    requests: u64,
    threads: usize,
}

/// What a round measured.
struct Figures {
    requests: u64,
    wall_ns: u64,
    latencies_ns: Vec<u64>,
}

impl Load {
    /// Connects, then sends `requests` requests over the connections and
    /// times each; fails on any error or wrong response.
    fn run(self, addr: SocketAddr) -> io::Result<Figures> {
        let tickets = Arc::new(AtomicU64::new(0));
        // The client threads and this one: the clock starts once every
        // connection is open.
        let start = Arc::new(Barrier::new(self.threads + 1));
        let threads: Vec<_> = (0..self.threads)
            .map(|t| {
                // An equal share of the connections (the first threads take
                // one more when they do not divide).
                let share = self.connections / self.threads
                    + usize::from(t < self.connections % self.threads);
                let (tickets, start, total) = (tickets.clone(), start.clone(), self.requests);
                std::thread::Builder::new()
                    .name(format!("http-load-{t}"))
                    .spawn(move || client_thread(addr, share, total, tickets, &start))
            })
            .collect::<io::Result<_>>()?;
        start.wait();
        let t0 = Instant::now();
        let mut latencies_ns = Vec::with_capacity(self.requests as usize);
        let mut first_error = None;
        for thread in threads {
            match thread.join() {
                Ok(Ok(mut each)) => latencies_ns.append(&mut each),
                Ok(Err(e)) => first_error = first_error.or(Some(e)),
                Err(_) => first_error = Some(io::Error::other("a client thread panicked")),
            }
        }
        let wall_ns = t0.elapsed().as_nanos() as u64;
        if let Some(e) = first_error {
            return Err(e);
        }
        if latencies_ns.len() as u64 != self.requests {
            return Err(io::Error::other(format!(
                "{} of {} requests answered",
                latencies_ns.len(),
                self.requests
            )));
        }
        Ok(Figures {
            requests: self.requests,
            wall_ns,
            latencies_ns,
        })
    }
}

/// One client thread: opens `connections` connections, waits at `start`,
/// then drives them on a current-thread tokio runtime until the tickets run
/// out; returns the latency of every request it made.
fn client_thread(
    addr: SocketAddr,
    connections: usize,
    total: u64,
    tickets: Arc<AtomicU64>,
    start: &Barrier,
) -> io::Result<Vec<u64>> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()?;
    let opened = rt.block_on(async {
        let mut opened = Vec::with_capacity(connections);
        for _ in 0..connections {
            let stream = tokio::net::TcpStream::connect(addr).await?;
            stream.set_nodelay(true)?;
            opened.push(stream);
        }
        Ok::<_, io::Error>(opened)
    });
    // Whatever happened, meet the others at the start line.
    start.wait();
    let opened = opened?;
    rt.block_on(async {
        let tasks = tokio::task::LocalSet::new();
        let handles: Vec<_> = opened
            .into_iter()
            .map(|stream| tasks.spawn_local(connection(stream, total, tickets.clone())))
            .collect();
        tasks
            .run_until(async {
                let mut all = Vec::new();
                for h in handles {
                    let mut each = h.await.map_err(io::Error::other)??;
                    all.append(&mut each);
                }
                Ok(all)
            })
            .await
    })
}

/// One connection: request, response, check, until no ticket is left.
async fn connection(
    mut stream: tokio::net::TcpStream,
    total: u64,
    tickets: Arc<AtomicU64>,
) -> io::Result<Vec<u64>> {
    let mut buf = vec![0u8; 16 << 10];
    let mut latencies = Vec::new();
    while tickets.fetch_add(1, Ordering::Relaxed) < total {
        let t0 = Instant::now();
        stream.write_all(REQUEST).await?;
        let mut filled = 0;
        let (head, body) = loop {
            if filled == buf.len() {
                return Err(io::Error::other("a response head over 16 KiB"));
            }
            let n = stream.read(&mut buf[filled..]).await?;
            if n == 0 {
                return Err(io::Error::other("the server closed a connection"));
            }
            filled += n;
            if let Some(head) = head_end(&buf[..filled]) {
                break (head, check_head(&buf[..head])?);
            }
        };
        let whole = head + body;
        while filled < whole {
            let n = stream.read(&mut buf[filled..whole]).await?;
            if n == 0 {
                return Err(io::Error::other("the server closed a connection mid-body"));
            }
            filled += n;
        }
        if filled > whole {
            return Err(io::Error::other("bytes after the response"));
        }
        latencies.push(t0.elapsed().as_nanos() as u64);
    }
    Ok(latencies)
}

/// The length of the response head at the start of `bytes`, if complete.
fn head_end(bytes: &[u8]) -> Option<usize> {
    bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| i + 4)
}

/// Checks a response head (status 200, a body of 1,200 bytes) and returns
/// the body's length.
fn check_head(head: &[u8]) -> io::Result<usize> {
    let text = std::str::from_utf8(head).map_err(|_| io::Error::other("a head not UTF-8"))?;
    let mut lines = text.split("\r\n");
    let status = lines.next().unwrap_or_default();
    if !status.starts_with("HTTP/1.1 200 ") {
        return Err(io::Error::other(format!("status line `{status}`")));
    }
    let length = lines
        .filter_map(|l| l.split_once(':'))
        .find(|(name, _)| name.trim().eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse::<usize>().ok())
        .ok_or_else(|| io::Error::other("no Content-Length"))?;
    if length != BODY_LEN {
        return Err(io::Error::other(format!(
            "Content-Length {length}, not {BODY_LEN}"
        )));
    }
    Ok(length)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_are_checked() {
        let good = b"HTTP/1.1 200 OK\r\ncontent-length: 1200\r\n\r\n";
        assert_eq!(head_end(good), Some(good.len()));
        assert_eq!(check_head(good).unwrap(), 1200);
        assert!(check_head(b"HTTP/1.1 404 Not Found\r\nContent-Length: 1200\r\n\r\n").is_err());
        assert!(check_head(b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n").is_err());
        assert!(check_head(b"HTTP/1.1 200 OK\r\n\r\n").is_err());
        assert_eq!(head_end(b"HTTP/1.1 200 OK\r\n"), None);
    }

    #[test]
    fn body_is_the_examples() {
        assert_eq!(BODY.len(), BODY_LEN);
        assert!(BODY.bytes().all(|b| b == b'x'));
    }
}
