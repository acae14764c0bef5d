//! `courier::fiber`: the runtime, and `chan` between fibers, threads and
//! fibers of one worker.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use courier::{chan, fiber};

mod watchdog;
use watchdog::with_watchdog;

fn runtime(workers: usize) -> fiber::Runtime {
    fiber::Runtime::builder().workers(workers).build().unwrap()
}

#[test]
fn block_on_returns_the_value_and_join_the_fibers() {
    with_watchdog("join", Duration::from_secs(30), || {
        let rt = runtime(2);
        let sum = rt.block_on(|| {
            let handles: Vec<_> = (0..100u64).map(|i| fiber::spawn(move || i * 2)).collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum::<u64>()
        });
        assert_eq!(sum, 9900);
        // Joined from a thread, too.
        assert_eq!(rt.spawn(|| 7).join().unwrap(), 7);
    });
}

#[test]
fn a_panic_inside_a_fiber_is_returned_by_join() {
    with_watchdog("panic", Duration::from_secs(30), || {
        let rt = runtime(1);
        let handle = rt.spawn(|| -> u32 { panic!("boom") });
        let payload = handle.join().unwrap_err();
        assert_eq!(payload.downcast_ref::<&str>(), Some(&"boom"));
        // The worker goes on.
        assert_eq!(rt.block_on(|| 5), 5);
    });
}

#[test]
fn channels_park_fibers_not_workers() {
    with_watchdog("ping-pong", Duration::from_secs(60), || {
        // One worker: a fiber blocked on a channel must let the other run.
        let rt = runtime(1);
        let n = rt.block_on(|| {
            let (ping_tx, ping_rx) = chan::bounded::<u32>(0);
            let (pong_tx, pong_rx) = chan::bounded::<u32>(0);
            let echo = fiber::spawn(move || {
                let mut n = 0;
                for v in ping_rx.iter() {
                    pong_tx.send(v + 1).unwrap();
                    n += 1;
                }
                n
            });
            for i in 0..10_000 {
                ping_tx.send(i).unwrap();
                assert_eq!(pong_rx.recv().unwrap(), i + 1);
            }
            drop(ping_tx);
            echo.join().unwrap()
        });
        assert_eq!(n, 10_000);
    });
}

#[test]
fn every_flavor_between_fibers_on_several_workers_and_threads() {
    with_watchdog("flavors", Duration::from_secs(120), || {
        let rt = runtime(2);
        for cap in [None, Some(0), Some(1), Some(16)] {
            let (tx, rx) = match cap {
                None => chan::unbounded::<u64>(),
                Some(n) => chan::bounded::<u64>(n),
            };
            let producers: Vec<_> = (0..8u64)
                .map(|p| {
                    let tx = tx.clone();
                    rt.spawn(move || {
                        for i in 0..2_000 {
                            tx.send(p * 1_000_000 + i).unwrap();
                        }
                    })
                })
                .collect();
            // A plain thread among the senders.
            let thread_tx = tx.clone();
            let thread = std::thread::spawn(move || {
                for i in 0..2_000 {
                    thread_tx.send(99_000_000 + i).unwrap();
                }
            });
            drop(tx);
            let consumers: Vec<_> = (0..3)
                .map(|_| {
                    let rx = rx.clone();
                    rt.spawn(move || rx.iter().collect::<Vec<u64>>())
                })
                .collect();
            drop(rx);
            for p in producers {
                p.join().unwrap();
            }
            thread.join().unwrap();
            let mut all: Vec<u64> = consumers
                .into_iter()
                .flat_map(|c| c.join().unwrap())
                .collect();
            all.sort_unstable();
            let mut expected: Vec<u64> = (0..8u64)
                .flat_map(|p| (0..2_000).map(move |i| p * 1_000_000 + i))
                .chain((0..2_000).map(|i| 99_000_000 + i))
                .collect();
            expected.sort_unstable();
            assert_eq!(all, expected, "capacity {cap:?}");
        }
    });
}

#[test]
fn select_and_timeouts_park_the_fiber() {
    with_watchdog("select", Duration::from_secs(60), || {
        let rt = runtime(1);
        rt.block_on(|| {
            let (tx, rx) = chan::bounded::<u32>(1);
            let (_never_tx, never) = chan::bounded::<u32>(1);
            // Another fiber on the only worker must run while this one waits.
            let sender = fiber::spawn(move || {
                fiber::sleep(Duration::from_millis(20));
                tx.send(3).unwrap();
            });
            let got = courier::select! {
                recv(rx) -> m => m.unwrap(),
                recv(never) -> _ => unreachable!(),
                default(Duration::from_secs(10)) => panic!("the sender never ran"),
            };
            assert_eq!(got, 3);
            sender.join().unwrap();
            let start = Instant::now();
            assert!(never.recv_timeout(Duration::from_millis(30)).is_err());
            assert!(start.elapsed() >= Duration::from_millis(30));
        });
    });
}

/// `select!` with deadlines, `send_timeout` and `recv_timeout` between fibers
/// spread over two workers and a plain thread: every message arrives once,
/// the timeouts fire on the fibers' own workers, and nothing hangs.
#[test]
fn selects_and_timeouts_between_fibers_on_two_workers() {
    with_watchdog("selects on two workers", Duration::from_secs(120), || {
        let rt = runtime(2);
        let (a_tx, a_rx) = chan::bounded::<u64>(1);
        let (b_tx, b_rx) = chan::bounded::<u64>(0);
        const PER: u64 = 1_000;
        let producers: Vec<_> = (0..6u64)
            .map(|p| {
                let (a_tx, b_tx) = (a_tx.clone(), b_tx.clone());
                rt.spawn(move || {
                    for i in 0..PER {
                        let mut msg = p * 1_000_000 + i;
                        // Retries on timeout: the message goes exactly once.
                        loop {
                            let sent = match i % 2 {
                                0 => a_tx.send_timeout(msg, Duration::from_micros(200)),
                                _ => b_tx.send_timeout(msg, Duration::from_micros(200)),
                            };
                            match sent {
                                Ok(()) => break,
                                Err(chan::SendTimeoutError::Timeout(m)) => msg = m,
                                Err(e) => panic!("send: {e:?}"),
                            }
                        }
                    }
                })
            })
            .collect();
        // A plain thread among the senders, on the rendezvous channel.
        let thread_tx = b_tx.clone();
        let thread = std::thread::spawn(move || {
            for i in 0..PER {
                thread_tx.send(99_000_000 + i).unwrap();
            }
        });
        drop((a_tx, b_tx));
        let consumers: Vec<_> = (0..3)
            .map(|_| {
                let (a_rx, b_rx) = (a_rx.clone(), b_rx.clone());
                rt.spawn(move || {
                    let mut got = Vec::new();
                    let (mut a_open, mut b_open) = (true, true);
                    while a_open || b_open {
                        courier::select! {
                            recv(a_rx) -> m => match m {
                                Ok(v) => got.push(v),
                                Err(_) => a_open = false,
                            },
                            recv(b_rx) -> m => match m {
                                Ok(v) => got.push(v),
                                Err(_) => b_open = false,
                            },
                            // A deadline passed: look again.
                            default(Duration::from_micros(300)) => {},
                        }
                        if !a_open {
                            // One channel gone: the other alone, with a deadline.
                            match b_rx.recv_timeout(Duration::from_micros(300)) {
                                Ok(v) => got.push(v),
                                Err(chan::RecvTimeoutError::Timeout) => {}
                                Err(chan::RecvTimeoutError::Disconnected) => b_open = false,
                            }
                        }
                    }
                    got
                })
            })
            .collect();
        drop((a_rx, b_rx));
        for p in producers {
            p.join().unwrap();
        }
        thread.join().unwrap();
        let mut all: Vec<u64> = consumers
            .into_iter()
            .flat_map(|c| c.join().unwrap())
            .collect();
        all.sort_unstable();
        let mut expected: Vec<u64> = (0..6u64)
            .flat_map(|p| (0..PER).map(move |i| p * 1_000_000 + i))
            .chain((0..PER).map(|i| 99_000_000 + i))
            .collect();
        expected.sort_unstable();
        assert_eq!(all.len(), expected.len(), "every message once");
        assert_eq!(all, expected);
    });
}

#[test]
fn sleeping_fibers_cost_no_thread() {
    with_watchdog("sleep", Duration::from_secs(60), || {
        let rt = runtime(1);
        let start = Instant::now();
        rt.block_on(|| {
            let sleepers: Vec<_> = (0..1_000)
                .map(|_| fiber::spawn(|| fiber::sleep(Duration::from_millis(100))))
                .collect();
            for s in sleepers {
                s.join().unwrap();
            }
        });
        // A thousand sleeps of 100 ms on one worker overlap.
        assert!(start.elapsed() < Duration::from_secs(20));
    });
}

#[test]
fn yield_now_lets_the_other_fibers_of_a_worker_run() {
    with_watchdog("yield", Duration::from_secs(30), || {
        let rt = runtime(1);
        let order = rt.block_on(|| {
            let log = Arc::new(std::sync::Mutex::new(Vec::new()));
            let fibers: Vec<_> = (0..3)
                .map(|id| {
                    let log = Arc::clone(&log);
                    fiber::spawn(move || {
                        for step in 0..3 {
                            log.lock().unwrap().push((id, step));
                            fiber::yield_now();
                        }
                    })
                })
                .collect();
            for f in fibers {
                f.join().unwrap();
            }
            Arc::try_unwrap(log).unwrap().into_inner().unwrap()
        });
        // Round robin: each yield lets the other two take a step.
        let expected: Vec<_> = (0..3)
            .flat_map(|step| (0..3).map(move |id| (id, step)))
            .collect();
        assert_eq!(order, expected);
    });
}

#[test]
fn a_fiber_that_never_yields_does_not_starve_the_others() {
    with_watchdog("hog", Duration::from_secs(60), || {
        let rt = runtime(2);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let done = Arc::new(AtomicUsize::new(0));
        let hog = {
            let stop = Arc::clone(&stop);
            rt.spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        };
        let workers: Vec<_> = (0..100)
            .map(|_| {
                let done = Arc::clone(&done);
                rt.spawn(move || {
                    done.fetch_add(1, Ordering::Relaxed);
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        assert_eq!(done.load(Ordering::Relaxed), 100);
        stop.store(true, Ordering::Relaxed);
        hog.join().unwrap();
    });
}

#[test]
fn a_fiber_spawned_by_one_that_never_yields_is_taken_by_another_worker() {
    with_watchdog("hog's child", Duration::from_secs(60), || {
        let rt = runtime(2);
        let ran = rt
            .spawn(|| {
                // The child waits in this worker's slot for the newest
                // fiber, which this worker never looks at again until the
                // flag is up: only the other worker can run it.
                let flag = Arc::new(std::sync::atomic::AtomicBool::new(false));
                let child = {
                    let flag = Arc::clone(&flag);
                    fiber::spawn(move || flag.store(true, Ordering::Release))
                };
                while !flag.load(Ordering::Acquire) {
                    std::hint::spin_loop();
                }
                child.join().is_ok()
            })
            .join()
            .unwrap();
        assert!(ran);
    });
}

#[test]
fn a_fiber_joined_before_it_starts_may_park_yield_and_join_in_turn() {
    with_watchdog("join at once", Duration::from_secs(60), || {
        for workers in [1, 2] {
            let rt = runtime(workers);
            let (tx, rx) = chan::bounded::<u32>(0);
            // Joined at once, the child parks on a receive; the joiner
            // parks in turn, and a thread's send finishes both.
            let sender = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                tx.send(41).unwrap();
            });
            let got = rt.block_on(move || fiber::spawn(move || rx.recv().unwrap() + 1).join());
            assert_eq!(got.unwrap(), 42);
            sender.join().unwrap();
            // A child that yields goes on in the worker's turns.
            let steps = rt.block_on(|| {
                fiber::spawn(|| (0..5).map(|_| fiber::yield_now()).count())
                    .join()
                    .unwrap()
            });
            assert_eq!(steps, 5);
            // Each fiber spawns and joins the next: nested turns, one
            // stack each.
            fn chain(depth: u32) -> u32 {
                match depth {
                    0 => 0,
                    d => 1 + fiber::spawn(move || chain(d - 1)).join().unwrap(),
                }
            }
            assert_eq!(rt.block_on(|| chain(300)), 300);
            // A panic in the child comes back through the join.
            let outcome = rt.block_on(|| fiber::spawn(|| -> u32 { panic!("inner") }).join());
            assert_eq!(outcome.unwrap_err().downcast_ref::<&str>(), Some(&"inner"));
        }
    });
}

#[test]
fn local_channels_between_pinned_fibers_of_one_worker() {
    with_watchdog("local", Duration::from_secs(60), || {
        let rt = runtime(2);
        let total = rt.block_on(|| {
            let (tx, rx) = chan::local::bounded::<u64>(1);
            let consumers: Vec<_> = (0..4)
                .map(|_| {
                    let rx = rx.clone();
                    fiber::spawn_local(move || rx.iter().sum::<u64>())
                })
                .collect();
            drop(rx);
            for i in 1..=10_000 {
                tx.send(i).unwrap();
            }
            drop(tx);
            consumers
                .into_iter()
                .map(|c| c.join().unwrap())
                .sum::<u64>()
        });
        assert_eq!(total, 10_000 * 10_001 / 2);
    });
}

/// Thousands of fibers parked on one channel of each flavor, all woken by
/// its disconnection: each gets `Disconnected` and takes its wait-list entry
/// back (by key, not by a scan of every other waiter's).
#[test]
fn thousands_of_fibers_woken_by_one_disconnection() {
    type Make = fn() -> (chan::Sender<u32>, chan::Receiver<u32>);
    let flavors: [(&str, Make); 4] = [
        ("bounded(0)", || chan::bounded(0)),
        ("bounded(1)", || chan::bounded(1)),
        ("bounded(8)", || chan::bounded(8)),
        ("unbounded", chan::unbounded),
    ];
    for (name, make) in flavors {
        with_watchdog(name, Duration::from_secs(60), move || {
            let rt = runtime(2);
            let disconnected = rt.block_on(move || {
                let (tx, rx) = make();
                let parked = Arc::new(AtomicUsize::new(0));
                let fibers: Vec<_> = (0..5_000)
                    .map(|_| {
                        let (rx, parked) = (rx.clone(), parked.clone());
                        fiber::spawn(move || {
                            parked.fetch_add(1, Ordering::Relaxed);
                            rx.recv().is_err()
                        })
                    })
                    .collect();
                while parked.load(Ordering::Relaxed) < 5_000 {
                    fiber::yield_now();
                }
                drop(tx);
                fibers
                    .into_iter()
                    .map(|f| f.join().unwrap())
                    .filter(|&d| d)
                    .count()
            });
            assert_eq!(disconnected, 5_000, "{name}");
        });
    }
}

#[test]
fn ten_thousand_fibers_in_a_ring() {
    with_watchdog("ring", Duration::from_secs(120), || {
        let rt = runtime(2);
        let hops = rt.block_on(|| {
            let n = 10_000;
            let (first_tx, mut prev_rx) = chan::bounded::<u32>(1);
            let mut fibers = Vec::new();
            for _ in 0..n {
                let (tx, rx) = chan::bounded::<u32>(1);
                let from = std::mem::replace(&mut prev_rx, rx);
                fibers.push(fiber::spawn(move || {
                    for v in from.iter() {
                        if tx.send(v + 1).is_err() {
                            break;
                        }
                    }
                }));
            }
            first_tx.send(0).unwrap();
            let hops = prev_rx.recv().unwrap();
            drop(first_tx);
            for f in fibers {
                f.join().unwrap();
            }
            hops
        });
        assert_eq!(hops, 10_000);
    });
}

#[test]
fn named_fibers_and_stack_sizes() {
    with_watchdog("names", Duration::from_secs(30), || {
        let rt = runtime(1);
        let name = fiber::Builder::new()
            .name("worker-7")
            .stack_size(256 << 10)
            .spawn_on(&rt, || {
                // Deep enough to need more than the default 64 KiB.
                let buf = [1u8; 128 << 10];
                (
                    fiber::name(),
                    std::hint::black_box(&buf)
                        .iter()
                        .map(|&b| b as usize)
                        .sum::<usize>(),
                )
            })
            .unwrap()
            .join()
            .unwrap();
        assert_eq!(name, (Some("worker-7".to_owned()), 128 << 10));
        assert_eq!(fiber::name(), None);
    });
}

/// A finished fiber's control block and `chan` context serve the next fibers
/// spawned on its worker, emptied at once: a result no one joins is dropped
/// as its handle goes, and each fiber has its own name, result and channels.
#[test]
fn fibers_spawned_one_after_another_start_afresh() {
    with_watchdog("afresh", Duration::from_secs(30), || {
        struct Flag(Arc<AtomicUsize>);
        impl Drop for Flag {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::Relaxed);
            }
        }
        let rt = runtime(1);
        rt.block_on(|| {
            let dropped = Arc::new(AtomicUsize::new(0));
            for round in 0..200 {
                let builder = fiber::Builder::new();
                let builder = match round % 3 {
                    0 => builder,
                    _ => builder.name(format!("fiber-{round}")),
                };
                let flag = Flag(Arc::clone(&dropped));
                let (tx, rx) = chan::bounded::<usize>(0);
                let handle = builder
                    .spawn(move || {
                        // A rendezvous parks both sides through their contexts.
                        tx.send(round).unwrap();
                        (fiber::name(), flag)
                    })
                    .unwrap();
                assert_eq!(rx.recv(), Ok(round));
                while !handle.is_finished() {
                    fiber::yield_now();
                }
                if round % 2 == 0 {
                    let (name, _flag) = handle.join().unwrap();
                    let expected = (round % 3 != 0).then(|| format!("fiber-{round}"));
                    assert_eq!(name, expected, "round {round}");
                } else {
                    // Not joined: its result goes with the handle.
                    drop(handle);
                }
                assert_eq!(dropped.load(Ordering::Relaxed), round + 1, "round {round}");
            }
        });
    });
}

/// A fiber that recurses without bound hits its guard page, and the process
/// says which fiber and how large its stack was (in a child process).
#[test]
fn a_stack_overflow_names_the_fiber() {
    if std::env::var("COURIER_FIBER_OVERFLOW").is_ok() {
        #[allow(unconditional_recursion)]
        fn deep(n: u64) -> u64 {
            let pad = [n; 64];
            std::hint::black_box(&pad);
            deep(n + 1) + pad[3]
        }
        let rt = runtime(1);
        let _ = fiber::Builder::new()
            .name("recursive")
            .stack_size(64 << 10)
            .spawn_on(&rt, || deep(0))
            .unwrap()
            .join();
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["a_stack_overflow_names_the_fiber", "--exact", "--nocapture"])
        .env("COURIER_FIBER_OVERFLOW", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("fiber recursive overflowed its 64 KiB stack"),
        "{stderr}"
    );
}

// ===== I/O =====

#[test]
fn an_echo_server_with_a_thousand_connections_on_two_workers() {
    use courier::fiber::net::{TcpListener, TcpStream};
    use std::io::{Read, Write};
    with_watchdog("echo", Duration::from_secs(120), || {
        let rt = runtime(2);
        let total = rt.block_on(|| {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let server = fiber::spawn(move || {
                for _ in 0..1_000 {
                    let (mut conn, _) = listener.accept().unwrap();
                    fiber::spawn(move || {
                        let mut buf = [0u8; 64];
                        loop {
                            match conn.read(&mut buf) {
                                Ok(0) | Err(_) => return,
                                Ok(n) => conn.write_all(&buf[..n]).unwrap(),
                            }
                        }
                    });
                }
            });
            // A thousand clients, all connected at once, then each talks.
            let clients: Vec<_> = (0..1_000u32)
                .map(|i| {
                    fiber::spawn(move || {
                        let mut conn = TcpStream::connect(addr).unwrap();
                        let mut sum = 0u64;
                        for round in 0..5u32 {
                            let msg = (i * 10 + round).to_le_bytes();
                            conn.write_all(&msg).unwrap();
                            let mut back = [0u8; 4];
                            conn.read_exact(&mut back).unwrap();
                            sum += u64::from(u32::from_le_bytes(back));
                        }
                        sum
                    })
                })
                .collect();
            let total: u64 = clients.into_iter().map(|c| c.join().unwrap()).sum();
            server.join().unwrap();
            total
        });
        let expected: u64 = (0..1_000u64)
            .map(|i| (0..5).map(|r| i * 10 + r).sum::<u64>())
            .sum();
        assert_eq!(total, expected);
    });
}

#[test]
fn a_fiber_blocked_on_a_socket_whose_peer_dies_gets_the_error() {
    use courier::fiber::net::UnixStream;
    use std::io::Read;
    with_watchdog("dead peer", Duration::from_secs(30), || {
        let rt = runtime(1);
        let (mut ours, theirs) = UnixStream::pair().unwrap();
        let reader = rt.spawn(move || {
            let mut buf = [0u8; 8];
            ours.read(&mut buf)
        });
        std::thread::sleep(Duration::from_millis(50));
        drop(theirs);
        assert_eq!(reader.join().unwrap().unwrap(), 0, "end of stream");
    });
}

/// A TCP read that drained the socket (it returned fewer bytes than it
/// asked for) makes the next one wait for an event before it reads: that
/// read still gets the bytes that come later, and the end of the stream when
/// the last bytes and the end arrive together, and reads after the end keep
/// returning it.
#[test]
fn a_read_after_a_drained_one_gets_what_comes_later_and_the_end() {
    use courier::fiber::net::TcpListener;
    use std::io::{Read, Write};
    use std::sync::mpsc;
    with_watchdog("drained reads", Duration::from_secs(30), || {
        let rt = runtime(1);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut theirs = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (held_tx, held_rx) = mpsc::channel::<()>();
        let (sent_tx, sent_rx) = mpsc::channel::<()>();
        let reader = rt.spawn(move || {
            let (mut ours, _) = listener.accept().unwrap();
            let mut buf = [0u8; 64];
            let mut got = Vec::new();
            while got.len() < 8 {
                let n = ours.read(&mut buf).unwrap();
                got.extend_from_slice(&buf[..n]);
            }
            // The worker is held (a blocking wait, on purpose) while the
            // last bytes and the end arrive, so one event reports both.
            held_tx.send(()).unwrap();
            sent_rx.recv().unwrap();
            loop {
                let n = ours.read(&mut buf).unwrap();
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
            assert_eq!(ours.read(&mut buf).unwrap(), 0, "the end, again");
            got
        });
        // Bytes while the reader waits after a drained read.
        for part in [&b"abc"[..], b"defgh"] {
            std::thread::sleep(Duration::from_millis(20));
            theirs.write_all(part).unwrap();
        }
        held_rx.recv().unwrap();
        theirs.write_all(b"ij").unwrap();
        drop(theirs);
        // (The end reaches the socket at once on loopback.)
        std::thread::sleep(Duration::from_millis(20));
        sent_tx.send(()).unwrap();
        assert_eq!(reader.join().unwrap(), b"abcdefghij");
    });
}

/// A read into an empty buffer, after a drained read and with bytes come
/// since, leaves them to the next read.
#[test]
fn an_empty_read_leaves_what_came_to_the_next_one() {
    use courier::fiber::net::TcpListener;
    use std::io::{Read, Write};
    with_watchdog("empty read", Duration::from_secs(30), || {
        let rt = runtime(1);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut theirs = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let reader = rt.spawn(move || {
            let (mut ours, _) = listener.accept().unwrap();
            let mut buf = [0u8; 64];
            assert_eq!(ours.read(&mut buf).unwrap(), 1, "a short read");
            // The worker takes the next bytes' event while this one sleeps.
            fiber::sleep(Duration::from_millis(50));
            assert_eq!(ours.read(&mut []).unwrap(), 0);
            let n = ours.read(&mut buf).unwrap();
            buf[..n].to_vec()
        });
        std::thread::sleep(Duration::from_millis(20));
        theirs.write_all(b"a").unwrap();
        std::thread::sleep(Duration::from_millis(10));
        theirs.write_all(b"bc").unwrap();
        assert_eq!(reader.join().unwrap(), b"bc");
        drop(theirs);
    });
}

/// A connection (accepted in the calling fiber) whose peer sends a byte,
/// then, once told to go, `hello`, an urgent `!` and `world` at once, and
/// says when it has: the connection, the go, the word back, and the peer.
fn urgent_burst() -> (
    courier::fiber::net::TcpStream,
    std::sync::mpsc::Sender<()>,
    std::sync::mpsc::Receiver<()>,
    std::thread::JoinHandle<std::net::TcpStream>,
) {
    use std::io::Write;
    let listener = courier::fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (conn, _) = listener.accept().unwrap();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let (sent_tx, sent_rx) = std::sync::mpsc::channel::<()>();
    let sender = std::thread::spawn(move || {
        // Late enough that the first read waits (and registers).
        std::thread::sleep(Duration::from_millis(20));
        client.write_all(b"x").unwrap();
        go_rx.recv().unwrap();
        client.write_all(b"hello").unwrap();
        rustix::net::send(&client, b"!", rustix::net::SendFlags::OOB).unwrap();
        client.write_all(b"world").unwrap();
        sent_tx.send(()).unwrap();
        client
    });
    (conn, go_tx, sent_rx, sender)
}

/// A program may take urgent data itself, from the socket `get_ref` lends:
/// then the event no longer reports it, and a read that stops short at its
/// mark is not taken to have drained the socket.
#[test]
fn urgent_data_taken_through_get_ref_leaves_no_read_waiting() {
    use std::io::Read;
    with_watchdog("urgent data taken", Duration::from_secs(30), || {
        let rt = runtime(1);
        rt.block_on(|| {
            let (mut conn, go_tx, sent_rx, sender) = urgent_burst();
            let mut buf = [0u8; 64];
            assert_eq!(conn.read(&mut buf).unwrap(), 1, "a short read");
            go_tx.send(()).unwrap();
            // The worker is held (a blocking wait, on purpose) until all of
            // it is queued, so one event reports it all.
            sent_rx.recv().unwrap();
            let mut urgent = [0u8; 1];
            let (taken, _) =
                rustix::net::recv(conn.get_ref(), &mut urgent, rustix::net::RecvFlags::OOB)
                    .unwrap();
            assert_eq!(&urgent[..taken], b"!");
            let mut got = Vec::new();
            while got.len() < 10 {
                let n = conn.read(&mut buf).unwrap();
                assert_ne!(n, 0, "the peer is still connected");
                got.extend_from_slice(&buf[..n]);
            }
            assert_eq!(got, b"helloworld");
            drop(sender.join().unwrap());
        });
    });
}

/// Reads one byte (a short read: the socket drained), lets the peer go on,
/// and reads until ten more bytes came, holding the worker (a blocking
/// wait, on purpose) until the peer has queued them all, so that one event
/// reports them.
fn read_short_then_ten(
    stream: &mut impl std::io::Read,
    go: &std::sync::mpsc::Sender<()>,
    sent: &std::sync::mpsc::Receiver<()>,
) -> Vec<u8> {
    let mut buf = [0u8; 64];
    assert_eq!(stream.read(&mut buf).unwrap(), 1, "a short read");
    go.send(()).unwrap();
    sent.recv().unwrap();
    let mut got = Vec::new();
    while got.len() < 10 {
        let n = stream.read(&mut buf).unwrap();
        assert_ne!(n, 0, "the peer is still connected");
        got.extend_from_slice(&buf[..n]);
    }
    got
}

/// A Unix stream read stops after bytes that carried descriptors, with
/// bytes still queued behind them (and the descriptors, which a plain read
/// has no room for, closed): the read after it asks the kernel at once.
#[test]
fn a_unix_read_stopped_short_by_passed_descriptors_does_not_wait() {
    use courier::fiber::net::UnixStream;
    use std::io::{IoSlice, Write};
    use std::os::fd::AsFd;
    use std::sync::mpsc;
    with_watchdog("passed descriptors", Duration::from_secs(30), || {
        let rt = runtime(1);
        let (mut ours, theirs) = UnixStream::pair().unwrap();
        let mut theirs = theirs.get_ref().try_clone().unwrap();
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let (sent_tx, sent_rx) = mpsc::channel::<()>();
        let sender = std::thread::spawn(move || {
            // Late enough that the first read waits (and registers).
            std::thread::sleep(Duration::from_millis(20));
            theirs.write_all(b"x").unwrap();
            go_rx.recv().unwrap();
            let devnull = std::fs::File::open("/dev/null").unwrap();
            let fds = [devnull.as_fd()];
            let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
            let mut control = rustix::net::SendAncillaryBuffer::new(&mut space);
            assert!(control.push(rustix::net::SendAncillaryMessage::ScmRights(&fds)));
            let hello = [IoSlice::new(b"hello")];
            rustix::net::sendmsg(
                &theirs,
                &hello,
                &mut control,
                rustix::net::SendFlags::empty(),
            )
            .unwrap();
            theirs.write_all(b"world").unwrap();
            sent_tx.send(()).unwrap();
            theirs
        });
        let got = rt.block_on(move || read_short_then_ten(&mut ours, &go_tx, &sent_rx));
        assert_eq!(got, b"helloworld");
        drop(sender.join().unwrap());
    });
}

/// TCP urgent data stops a read short of it, with bytes still queued behind
/// it: the read after such a short one asks the kernel at once rather than
/// wait for an event that already came.
#[test]
fn a_read_stopped_short_by_urgent_data_does_not_wait() {
    with_watchdog("urgent data", Duration::from_secs(30), || {
        let rt = runtime(1);
        rt.block_on(|| {
            let (mut conn, go_tx, sent_rx, sender) = urgent_burst();
            // The urgent byte is not in the stream (no SO_OOBINLINE).
            let got = read_short_then_ten(&mut conn, &go_tx, &sent_rx);
            assert_eq!(got, b"helloworld");
            drop(sender.join().unwrap());
        });
    });
}

/// A socket stays registered with the reactor of the worker that first
/// waited on it; it keeps working as it moves to fibers that may run on the
/// other worker, to a plain thread and back, when two fibers wait to read it
/// at once, and when it is dropped on a thread while registered.
#[test]
fn a_socket_waits_wherever_it_moves() {
    use courier::fiber::net::UnixStream;
    use std::io::{Read, Write};
    fn read_byte(stream: &UnixStream) -> u8 {
        let mut byte = [0u8; 1];
        let mut reader = stream;
        reader.read_exact(&mut byte).unwrap();
        byte[0]
    }
    with_watchdog("moving socket", Duration::from_secs(30), || {
        let rt = runtime(2);
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        let ours = Arc::new(ours);
        for round in 0..40u8 {
            let ours = Arc::clone(&ours);
            let reader: Box<dyn FnOnce() -> u8> = if round % 5 == 4 {
                let thread = std::thread::spawn(move || read_byte(&ours));
                Box::new(move || thread.join().unwrap())
            } else {
                let fiber = rt.spawn(move || read_byte(&ours));
                Box::new(move || fiber.join().unwrap())
            };
            std::thread::sleep(Duration::from_millis(2));
            theirs.write_all(&[round]).unwrap();
            assert_eq!(reader(), round);
        }
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let ours = Arc::clone(&ours);
                rt.spawn(move || read_byte(&ours))
            })
            .collect();
        std::thread::sleep(Duration::from_millis(20));
        theirs.write_all(&[1]).unwrap();
        std::thread::sleep(Duration::from_millis(5));
        theirs.write_all(&[2]).unwrap();
        let mut got: Vec<u8> = readers.into_iter().map(|r| r.join().unwrap()).collect();
        got.sort_unstable();
        assert_eq!(got, [1, 2], "each waiting fiber gets one byte");
        let ours = Arc::try_unwrap(ours).unwrap();
        std::thread::spawn(move || drop(ours)).join().unwrap();
        // The runtime goes on after the registered socket went.
        assert_eq!(rt.block_on(|| 7), 7);
    });
}

/// On a worker whose fiber yields in a loop, the fibers queued from other
/// threads still run: one spawned from a thread, and one a thread wakes.
#[test]
fn fibers_queued_from_threads_run_beside_a_yielding_one() {
    use std::sync::atomic::AtomicBool;
    with_watchdog("queued from threads", Duration::from_secs(30), || {
        let rt = runtime(1);
        let done = Arc::new(AtomicBool::new(false));
        let spinner = {
            let done = Arc::clone(&done);
            rt.spawn(move || {
                while !done.load(Ordering::Acquire) {
                    fiber::yield_now();
                }
            })
        };
        std::thread::sleep(Duration::from_millis(10));
        let (tx, rx) = chan::bounded::<u32>(1);
        let receiver = {
            let done = Arc::clone(&done);
            rt.spawn(move || {
                let value = rx.recv().unwrap();
                done.store(true, Ordering::Release);
                value
            })
        };
        std::thread::sleep(Duration::from_millis(10));
        tx.send(5).unwrap();
        assert_eq!(receiver.join().unwrap(), 5);
        spinner.join().unwrap();
    });
}

/// A worker whose other fiber never stops yielding still looks at its
/// reactor: the fiber waiting for a registered socket wakes when data comes.
#[test]
fn a_busy_worker_still_wakes_its_socket_waiters() {
    use courier::fiber::net::UnixStream;
    use std::io::{Read, Write};
    use std::sync::atomic::AtomicBool;
    with_watchdog("busy worker", Duration::from_secs(30), || {
        let rt = runtime(1);
        let (mut ours, mut theirs) = UnixStream::pair().unwrap();
        let done = Arc::new(AtomicBool::new(false));
        let spinner = {
            let done = Arc::clone(&done);
            rt.spawn(move || {
                let mut turns = 0u64;
                while !done.load(Ordering::Acquire) {
                    fiber::yield_now();
                    turns += 1;
                }
                turns
            })
        };
        let reader = {
            let done = Arc::clone(&done);
            rt.spawn(move || {
                let mut byte = [0u8; 1];
                // The first read registers the socket and parks.
                ours.read_exact(&mut byte).unwrap();
                done.store(true, Ordering::Release);
                byte[0]
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        theirs.write_all(&[9]).unwrap();
        assert_eq!(reader.join().unwrap(), 9);
        assert!(spinner.join().unwrap() > 0);
    });
}

#[test]
fn an_ipc_receive_in_a_fiber_leaves_the_worker_to_the_others() {
    use courier::ipc;
    with_watchdog("ipc in a fiber", Duration::from_secs(60), || {
        let rt = runtime(1);
        let (tx, rx) = ipc::channel::<u32>().unwrap();
        let (btx, brx) = ipc::bytes_channel().unwrap();
        let got = rt.block_on(move || {
            // Waits on ipc; the same worker keeps running the counter below.
            let receiver = fiber::spawn(move || (rx.recv().unwrap(), brx.recv().unwrap()));
            let counter = fiber::spawn(|| {
                let mut n = 0;
                for _ in 0..100 {
                    fiber::sleep(Duration::from_millis(1));
                    n += 1;
                }
                n
            });
            assert_eq!(counter.join().unwrap(), 100);
            assert!(!receiver.is_finished());
            // Sent from a thread: the fiber parked on the worker's reactor wakes.
            std::thread::spawn(move || {
                tx.send(42).unwrap();
                btx.send(&[7; 300_000]).unwrap();
            })
            .join()
            .unwrap();
            receiver.join().unwrap()
        });
        assert_eq!(got.0, 42);
        assert_eq!(got.1, vec![7; 300_000]);
    });
}

#[test]
fn a_receiver_set_and_a_one_shot_accept_wait_as_fibers() {
    use courier::ipc::{self, IpcOneShotServer, IpcReceiverSet, IpcSender};
    with_watchdog("set in a fiber", Duration::from_secs(60), || {
        let rt = runtime(1);
        let (server, name) = IpcOneShotServer::<u32>::new().unwrap();
        let (tx, rx) = ipc::channel::<u32>().unwrap();
        let got = rt.block_on(move || {
            let waiter = fiber::spawn(move || {
                let (_rx, first) = server.accept().unwrap();
                let mut set = IpcReceiverSet::new().unwrap();
                set.add(rx).unwrap();
                let results = set.select().unwrap();
                let (_, message) = results.into_iter().next().unwrap().unwrap();
                (first, message.to::<u32>().unwrap())
            });
            // The worker is free while the waiter waits: this fiber runs.
            fiber::sleep(Duration::from_millis(20));
            assert!(!waiter.is_finished());
            std::thread::spawn(move || {
                IpcSender::<u32>::connect(name).unwrap().send(1).unwrap();
                std::thread::sleep(Duration::from_millis(20));
                tx.send(2).unwrap();
            });
            waiter.join().unwrap()
        });
        assert_eq!(got, (1, 2));
    });
}

#[test]
fn spawn_blocking_keeps_the_worker_free() {
    with_watchdog("blocking", Duration::from_secs(60), || {
        let rt = runtime(1);
        let (slept, ticks) = rt.block_on(|| {
            let blocker = fiber::spawn_blocking(|| {
                std::thread::sleep(Duration::from_millis(100));
                "slept"
            });
            // The only worker keeps running fibers meanwhile.
            let ticker = fiber::spawn(|| {
                let mut ticks = 0;
                while ticks < 10 {
                    fiber::sleep(Duration::from_millis(1));
                    ticks += 1;
                }
                ticks
            });
            (blocker.join().unwrap(), ticker.join().unwrap())
        });
        assert_eq!((slept, ticks), ("slept", 10));
        let panicked = fiber::spawn_blocking(|| panic!("in the pool")).join();
        assert!(panicked.is_err());
    });
}

/// How many CPUs the calling thread may run on.
fn cpus_here() -> u32 {
    rustix::thread::sched_getaffinity(None).unwrap().count()
}

#[test]
fn bound_workers_run_on_a_cpu_each_and_the_threads_courier_starts_on_all() {
    with_watchdog("bound workers", Duration::from_secs(60), || {
        let all = cpus_here();
        let rt = fiber::Runtime::builder()
            .workers(2)
            .bind_workers(true)
            .build()
            .unwrap();
        // Fibers on both workers (a fiber that never yields gets the other
        // worker to take its siblings) each see one CPU.
        let seen = rt.block_on(move || {
            let fibers: Vec<_> = (0..16)
                .map(|_| {
                    fiber::spawn(|| {
                        let start = Instant::now();
                        while start.elapsed() < Duration::from_millis(2) {}
                        (std::thread::current().id(), cpus_here())
                    })
                })
                .collect();
            fibers
                .into_iter()
                .map(|f| f.join().unwrap())
                .collect::<Vec<_>>()
        });
        assert!(seen.iter().all(|&(_, cpus)| cpus == 1), "{seen:?}");
        // The blocking pool's thread, started from a bound worker, and a
        // runtime built inside a fiber run on every CPU of the process.
        let (blocking, nested) = rt.block_on(|| {
            let blocking = fiber::spawn_blocking(cpus_here).join().unwrap();
            let inner = fiber::Runtime::builder()
                .workers(3)
                .bind_workers(false)
                .build()
                .unwrap();
            let nested = inner.spawn(cpus_here).join().unwrap();
            (blocking, nested)
        });
        assert_eq!((blocking, nested), (all, all));
        // Unbound: every CPU.
        let rt = fiber::Runtime::builder()
            .workers(2)
            .bind_workers(false)
            .build()
            .unwrap();
        assert_eq!(rt.block_on(cpus_here), all);
    });
}
