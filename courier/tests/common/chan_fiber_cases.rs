// The cases of `chan_fibers.rs` and `chan_fibers_runtime.rs`: included by both, each with its
// own `fibers` scheduler module in scope.

// ===== tests =====

/// A ring as fibers of one thread (`courier-bench ring`'s shape): task `i` receives on channel
/// `i` and sends on channel `i + 1`, [`RING_ROUNDS`] times. With `one_token` task 0 sends first
/// and the others receive first (one message circulates, as a rendezvous ring must); otherwise
/// every task sends first, so one message per task circulates. Every message arrives, in order.
fn ring_of_fibers<S: 'static, R: 'static>(
    channels: Vec<(S, R)>,
    one_token: bool,
    send: fn(&S, u64),
    recv: fn(&R) -> u64,
) {
    let (mut txs, rxs): (Vec<S>, Vec<R>) = channels.into_iter().unzip();
    txs.rotate_left(1);
    let bodies = txs
        .into_iter()
        .zip(rxs)
        .enumerate()
        .map(|(i, (tx, rx))| {
            Box::new(move || {
                for round in 0..RING_ROUNDS {
                    if !one_token || i == 0 {
                        send(&tx, round);
                        assert_eq!(recv(&rx), round, "task {i}");
                    } else {
                        assert_eq!(recv(&rx), round, "task {i}");
                        send(&tx, round);
                    }
                }
            }) as Box<dyn FnOnce()>
        })
        .collect();
    run_fibers(bodies);
}

/// Tasks in a ring.
const RING_TASKS: usize = 16;
/// Rounds of a ring.
const RING_ROUNDS: u64 = 500;

/// The ring on every flavor (the rendezvous one with one token).
#[test]
fn a_ring_of_fibers_on_one_thread() {
    for (name, make) in flavors() {
        with_watchdog(name, LIMIT, move || {
            ring_of_fibers(
                (0..RING_TASKS).map(|_| make()).collect(),
                name == "bounded(0)",
                |tx, v| tx.send(v).unwrap(),
                |rx| rx.recv().unwrap(),
            );
        });
    }
}

/// `producers` fibers each send `per_producer` numbered messages on one channel of `make`'s and
/// then drop their sender; `consumers` fibers receive until the channel closes, consumer `c` by
/// `recv`, by a `Select` (beside a channel of its own that stays silent) or by `try_recv` and a
/// yield, as `c % 3` says. Fibers run in FIFO order, or in a seeded random one (`shuffle`).
/// Checks that every message arrives exactly once and that each consumer sees each producer's
/// messages in the order they were sent.
fn producers_and_consumers(
    name: &str,
    make: Make,
    (producers, consumers, per_producer): (u64, usize, u64),
    shuffle: Option<u64>,
) {
    let (tx, rx) = make();
    let seen: Vec<_> = (0..consumers)
        .map(|_| Rc::new(std::cell::RefCell::new(Vec::new())))
        .collect();
    let mut bodies: Vec<Box<dyn FnOnce()>> = Vec::new();
    for p in 0..producers {
        let tx = tx.clone();
        bodies.push(Box::new(move || {
            for k in 0..per_producer {
                tx.send(p * per_producer + k).unwrap();
            }
        }));
    }
    drop(tx);
    for (c, mine) in seen.iter().enumerate() {
        let (rx, mine) = (rx.clone(), mine.clone());
        bodies.push(Box::new(move || {
            let (_quiet_tx, quiet_rx) = chan::bounded::<u64>(1);
            loop {
                let got = match c % 3 {
                    0 => rx.recv().ok(),
                    1 => {
                        let mut sel = Select::new();
                        let mine_at = sel.recv(&rx);
                        sel.recv(&quiet_rx);
                        let oper = sel.select();
                        assert_eq!(oper.index(), mine_at, "the quiet channel stays quiet");
                        oper.recv(&rx).ok()
                    }
                    _ => match rx.try_recv() {
                        Ok(v) => Some(v),
                        Err(chan::TryRecvError::Disconnected) => None,
                        Err(chan::TryRecvError::Empty) => {
                            yield_fiber();
                            continue;
                        }
                    },
                };
                match got {
                    Some(v) => mine.borrow_mut().push(v),
                    None => break,
                }
            }
        }));
    }
    drop(rx);
    run_fibers_in_order(bodies, shuffle);
    let mut all = Vec::new();
    for (c, mine) in seen.iter().enumerate() {
        let mine = mine.borrow();
        for p in 0..producers {
            let from_p: Vec<u64> = mine
                .iter()
                .copied()
                .filter(|v| v / per_producer == p)
                .collect();
            assert!(
                from_p.windows(2).all(|w| w[0] < w[1]),
                "{name}: consumer {c} saw producer {p}'s messages out of order"
            );
        }
        all.extend_from_slice(&mine);
    }
    all.sort_unstable();
    let expected: Vec<u64> = (0..producers * per_producer).collect();
    assert!(all == expected, "{name}: a message lost or duplicated");
}

/// Four producers and three consumers (one of each kind) as fibers, on every flavor.
#[test]
fn producers_and_consumers_as_fibers() {
    for (name, make) in flavors() {
        with_watchdog(name, LIMIT, move || {
            producers_and_consumers(name, make, (4, 3, 2_000), None);
        });
    }
}

/// A fiber selecting over sends on a rendezvous channel waits registered; a receiver fiber that
/// takes the selected send must then let the selecting fiber run to write its message (it
/// cannot spin for it: the two share one thread). On the buffered flavors a selected send
/// claims a slot and fills it without a switch in between: there this is a plain select test.
#[test]
fn a_receiver_fiber_waits_for_a_selecting_sender_fiber() {
    for (name, make) in flavors() {
        with_watchdog(name, LIMIT, move || {
            const MESSAGES: u64 = 300;
            let (tx_a, rx_a) = make();
            let (tx_b, rx_b) = make();
            let got = Rc::new(Cell::new(0u64));
            let sender: Box<dyn FnOnce()> = Box::new(move || {
                for k in 0..MESSAGES {
                    let mut sel = Select::new();
                    let a = sel.send(&tx_a);
                    let b = sel.send(&tx_b);
                    let oper = sel.select();
                    match oper.index() {
                        i if i == a => oper.send(&tx_a, k).unwrap(),
                        i if i == b => oper.send(&tx_b, k).unwrap(),
                        _ => unreachable!(),
                    }
                }
            });
            let got_a = got.clone();
            let receiver_a: Box<dyn FnOnce()> = Box::new(move || {
                for v in rx_a.iter() {
                    assert!(v < MESSAGES);
                    got_a.set(got_a.get() + 1);
                }
            });
            let got_b = got.clone();
            let receiver_b: Box<dyn FnOnce()> = Box::new(move || {
                for v in rx_b.iter() {
                    assert!(v < MESSAGES);
                    got_b.set(got_b.get() + 1);
                }
            });
            // The receivers start first, so the sender finds them waiting at times and registers
            // at others.
            run_fibers(vec![receiver_a, receiver_b, sender]);
            assert_eq!(got.get(), MESSAGES, "{name}");
        });
    }
}

/// `recv_timeout` in a fiber returns at its deadline while the other fibers of its thread keep
/// running (and waiting with deadlines of their own).
#[test]
fn timeouts_in_fibers() {
    for (name, make) in flavors() {
        with_watchdog(name, LIMIT, move || {
            let (tx, rx) = make();
            let ticks = Rc::new(Cell::new(0u64));
            let waited = Rc::new(Cell::new(Duration::ZERO));
            let done = Rc::new(Cell::new(false));
            let (w, t, d) = (waited.clone(), ticks.clone(), done.clone());
            let rx2 = rx.clone();
            let waiter: Box<dyn FnOnce()> = Box::new(move || {
                let start = Instant::now();
                assert_eq!(
                    rx2.recv_timeout(Duration::from_millis(20)),
                    Err(RecvTimeoutError::Timeout)
                );
                w.set(start.elapsed());
                // The other fiber ran while this one waited.
                assert!(t.get() > 0);
                d.set(true);
                drop(tx); // kept until now: the wait must time out, not see a disconnect
            });
            let t = ticks.clone();
            let busy: Box<dyn FnOnce()> = Box::new(move || {
                // Runs while the waiter waits, in steps that time out themselves, until the
                // waiter is done (its `drop(tx)` may then end a step early) or for 50 steps.
                for _ in 0..50 {
                    t.set(t.get() + 1);
                    let got = rx.recv_timeout(Duration::from_micros(100));
                    if done.get() {
                        assert!(got.is_err(), "no message is ever sent");
                        break;
                    }
                    assert_eq!(got, Err(RecvTimeoutError::Timeout));
                }
            });
            run_fibers(vec![waiter, busy]);
            assert!(waited.get() >= Duration::from_millis(20), "{name}");
        });
    }
}

/// A fiber selecting receives over three channels, by `select` and by `ready` in turn, while
/// three sender fibers of the same thread fill them: every message arrives once, each channel's
/// in order. Then a `oneshot` between two fibers.
#[test]
fn select_ready_and_oneshot_in_fibers() {
    for (name, make) in flavors() {
        with_watchdog(name, LIMIT, move || {
            const SENDERS: usize = 3;
            const PER_SENDER: u64 = 1_000;
            let (txs, rxs): (Vec<_>, Vec<_>) = (0..SENDERS).map(|_| make()).unzip();
            let mut bodies: Vec<Box<dyn FnOnce()>> = txs
                .into_iter()
                .map(|tx| {
                    Box::new(move || {
                        for k in 0..PER_SENDER {
                            tx.send(k).unwrap();
                        }
                    }) as Box<dyn FnOnce()>
                })
                .collect();
            let (done_tx, done_rx) = chan::oneshot::<u64>();
            bodies.push(Box::new(move || {
                let mut next = [0u64; SENDERS];
                // The channels still open, by index into `rxs` (a finished one leaves the select:
                // a disconnected channel is always ready, and a fiber that never waits starves
                // the others).
                let mut open: Vec<usize> = (0..SENDERS).collect();
                let mut turn = 0u64;
                while !open.is_empty() {
                    let mut sel = Select::new();
                    for &i in &open {
                        sel.recv(&rxs[i]);
                    }
                    turn += 1;
                    let (at, got) = if turn.is_multiple_of(2) {
                        let oper = sel.select();
                        let at = oper.index();
                        (at, oper.recv(&rxs[open[at]]).ok())
                    } else {
                        let at = sel.ready();
                        match rxs[open[at]].try_recv() {
                            Ok(v) => (at, Some(v)),
                            Err(chan::TryRecvError::Empty) => continue,
                            Err(chan::TryRecvError::Disconnected) => (at, None),
                        }
                    };
                    let i = open[at];
                    match got {
                        Some(v) => {
                            assert_eq!(v, next[i], "channel {i}");
                            next[i] += 1;
                        }
                        None => {
                            assert_eq!(next[i], PER_SENDER, "channel {i} ended early");
                            open.remove(at);
                        }
                    }
                }
                done_tx.send(next.iter().sum()).unwrap();
            }));
            let total = Rc::new(Cell::new(0));
            let t = total.clone();
            bodies.push(Box::new(move || t.set(done_rx.recv().unwrap())));
            run_fibers(bodies);
            assert_eq!(total.get(), SENDERS as u64 * PER_SENDER, "{name}");
        });
    }
}

/// `chan::local`, the single-thread flavor, between fibers of its thread: a ring of 16 on
/// `bounded(1)` and unbounded channels, then producers and consumers on `bounded(2)` that end by
/// disconnecting. Its blocking parks the fiber through the same seam.
#[test]
fn local_channels_between_fibers() {
    with_watchdog("local", LIMIT, || {
        type MakeLocal = fn() -> (chan::local::Sender<u64>, chan::local::Receiver<u64>);
        let makers: [MakeLocal; 2] = [|| chan::local::bounded(1), chan::local::channel];
        for make in makers {
            ring_of_fibers(
                (0..RING_TASKS).map(|_| make()).collect(),
                false,
                |tx, v| tx.send(v).unwrap(),
                |rx| rx.recv().unwrap(),
            );
        }

        const PER_PRODUCER: u64 = 1_000;
        let (tx, rx) = chan::local::bounded::<u64>(2);
        let got = Rc::new(std::cell::RefCell::new(Vec::new()));
        let mut bodies: Vec<Box<dyn FnOnce()>> = Vec::new();
        for p in 0..3 {
            let tx = tx.clone();
            bodies.push(Box::new(move || {
                for k in 0..PER_PRODUCER {
                    tx.send(p * PER_PRODUCER + k).unwrap();
                }
            }));
        }
        drop(tx);
        for _ in 0..2 {
            let (rx, got) = (rx.clone(), got.clone());
            bodies.push(Box::new(move || {
                while let Ok(v) = rx.recv() {
                    got.borrow_mut().push(v);
                }
            }));
        }
        drop(rx);
        run_fibers(bodies);
        let mut got = got.borrow().clone();
        got.sort_unstable();
        assert!(got == (0..3 * PER_PRODUCER).collect::<Vec<_>>());
    });
}

/// `chan::local`'s timed operations between fibers: a receive and a send that another fiber
/// completes before their deadlines; ones that time out while the other fibers run; and a
/// receiver that times out at the head of the wait list, so that the next message must wake the
/// receiver queued behind it.
#[test]
fn local_timeouts_between_fibers() {
    with_watchdog("local", LIMIT, || {
        let long = Duration::from_secs(30);
        let (tx, rx) = chan::local::bounded::<u64>(1);
        let (tx2, rx2) = (tx.clone(), rx.clone());
        let got = Rc::new(std::cell::RefCell::new(Vec::new()));
        let g = got.clone();
        // Parks first (FIFO: it runs first), then the sender's first message wakes it (which
        // does not hand it that message: the drainer may take it first).
        let receiver: Box<dyn FnOnce()> = Box::new(move || {
            let v = rx2.recv_deadline(Instant::now() + long).unwrap();
            g.borrow_mut().push(v);
        });
        // Fills the channel, then waits for room that the drainer makes.
        let sender: Box<dyn FnOnce()> = Box::new(move || {
            tx2.send(5).unwrap();
            tx2.send(6).unwrap();
            tx2.send_deadline(7, Instant::now() + long).unwrap();
        });
        let g = got.clone();
        let drainer: Box<dyn FnOnce()> = Box::new(move || {
            for _ in 0..2 {
                let v = rx.recv_timeout(long).unwrap();
                g.borrow_mut().push(v);
            }
            // A channel of its own, so that no message of the others can end the waits.
            let (tx, rx) = chan::local::bounded::<u64>(1);
            let start = Instant::now();
            assert_eq!(
                rx.recv_timeout(Duration::from_millis(5)),
                Err(RecvTimeoutError::Timeout)
            );
            assert!(start.elapsed() >= Duration::from_millis(5));
            // A full channel with no receiver running: the send times out with its message.
            tx.send(8).unwrap();
            assert_eq!(
                tx.send_timeout(9, Duration::from_millis(5)),
                Err(chan::SendTimeoutError::Timeout(9))
            );
            assert_eq!(rx.try_recv(), Ok(8));
        });
        run_fibers(vec![receiver, sender, drainer]);
        let mut got = got.borrow().clone();
        got.sort_unstable();
        assert_eq!(got, [5, 6, 7]);

        // `first` queues first and times out; `second` queues behind it; the sender waits for
        // `first` to be gone, then sends once: `second` must be woken for it.
        let (tx, rx) = chan::local::channel::<u64>();
        let first_done = Rc::new(Cell::new(false));
        let (rx1, done) = (rx.clone(), first_done.clone());
        let first: Box<dyn FnOnce()> = Box::new(move || {
            assert_eq!(
                rx1.recv_timeout(Duration::from_millis(5)),
                Err(RecvTimeoutError::Timeout)
            );
            done.set(true);
        });
        let second: Box<dyn FnOnce()> = Box::new(move || {
            assert_eq!(rx.recv_timeout(long), Ok(42));
        });
        let sender: Box<dyn FnOnce()> = Box::new(move || {
            while !first_done.get() {
                yield_fiber();
            }
            tx.send(42).unwrap();
        });
        run_fibers(vec![first, second, sender]);
    });
}

/// `chan::local`'s parked sends on a full channel: a receive moves the oldest parked send's
/// message into the channel at once, so the next receive finds it before that sender runs
/// again, and the send is done when it does; a parked send woken because every receiver went
/// gets its message back.
#[test]
fn local_parked_sends_are_completed_by_the_receive_that_makes_room() {
    with_watchdog("local", LIMIT, || {
        let (tx, rx) = chan::local::bounded::<u64>(1);
        tx.try_send(1).unwrap();
        let sent = Rc::new(Cell::new(false));
        let s = sent.clone();
        // Runs first and parks: the channel is full.
        let sender: Box<dyn FnOnce()> = Box::new(move || {
            tx.send(2).unwrap();
            s.set(true);
        });
        let receiver: Box<dyn FnOnce()> = Box::new(move || {
            assert_eq!(rx.recv(), Ok(1));
            assert_eq!(rx.try_recv(), Ok(2), "the parked send's message is in the channel");
            assert!(!sent.get(), "before its sender ran again");
        });
        run_fibers(vec![sender, receiver]);

        let (tx, rx) = chan::local::bounded::<u64>(1);
        tx.try_send(1).unwrap();
        let sender: Box<dyn FnOnce()> = Box::new(move || {
            assert_eq!(tx.send(2), Err(chan::SendError(2)));
        });
        let dropper: Box<dyn FnOnce()> = Box::new(move || drop(rx));
        run_fibers(vec![sender, dropper]);
    });
}

/// `Select` over `chan::local` receivers between fibers: a fiber selecting over two local
/// channels (and then a thread-safe one) while sender fibers fill them gets every message once,
/// each channel's in order, and sees each channel disconnect; `Select::ready` wakes for a
/// local message.
#[test]
fn local_receivers_in_a_select_between_fibers() {
    with_watchdog("local select", LIMIT, || {
        const PER_SENDER: u64 = 500;
        let (tx_a, rx_a) = chan::local::channel::<u64>();
        let (tx_b, rx_b) = chan::local::bounded::<u64>(1);
        let got = Rc::new(std::cell::RefCell::new(Vec::new()));
        let g = got.clone();
        let selecting: Box<dyn FnOnce()> = Box::new(move || select_until_closed(&rx_a, &rx_b, &g));
        let sender_a: Box<dyn FnOnce()> = Box::new(move || {
            for k in 0..PER_SENDER {
                tx_a.send(k).unwrap();
                if k % 7 == 0 {
                    yield_fiber();
                }
            }
        });
        let sender_b: Box<dyn FnOnce()> = Box::new(move || {
            for k in 0..PER_SENDER {
                tx_b.send(1000 + k).unwrap();
            }
        });
        run_fibers(vec![selecting, sender_a, sender_b]);
        let of = |k: usize| -> Vec<u64> {
            got.borrow()
                .iter()
                .filter(|m| m.0 == k)
                .map(|m| m.1)
                .collect()
        };
        assert!(of(0) == (0..PER_SENDER).collect::<Vec<_>>());
        assert!(of(1) == (1000..1000 + PER_SENDER).collect::<Vec<_>>());

        // A local and a thread-safe receiver in one select; then `ready` on a local one.
        let (local_tx, local_rx) = chan::local::channel::<u64>();
        let (tx, rx) = chan::unbounded::<u64>();
        let (ready_tx, ready_rx) = chan::local::channel::<u64>();
        let selecting: Box<dyn FnOnce()> = Box::new(move || {
            let mut sel = Select::new();
            let local = sel.recv(&local_rx);
            let shared = sel.recv(&rx);
            let oper = sel.select();
            assert_eq!(oper.index(), shared);
            assert_eq!(oper.recv(&rx), Ok(1));
            let oper = sel.select();
            assert_eq!(oper.index(), local);
            assert_eq!(oper.recv(&local_rx), Err(RecvError));

            let mut sel = Select::new();
            let only = sel.recv(&ready_rx);
            assert_eq!(sel.ready(), only);
            assert_eq!(ready_rx.try_recv(), Ok(2));
        });
        let sender: Box<dyn FnOnce()> = Box::new(move || {
            tx.send(1).unwrap();
            yield_fiber();
            drop(local_tx);
            yield_fiber();
            ready_tx.send(2).unwrap();
        });
        run_fibers(vec![selecting, sender]);

        // A parked `recv` and a parked select on one channel: two messages, one each.
        let (tx, rx) = chan::local::channel::<u64>();
        let rx2 = rx.clone();
        let got = Rc::new(std::cell::RefCell::new(Vec::new()));
        let (g1, g2) = (got.clone(), got.clone());
        let receiving: Box<dyn FnOnce()> = Box::new(move || {
            let v = rx.recv().unwrap();
            g1.borrow_mut().push(v);
        });
        let selecting: Box<dyn FnOnce()> = Box::new(move || {
            let mut sel = Select::new();
            sel.recv(&rx2);
            let v = sel.select().recv(&rx2).unwrap();
            g2.borrow_mut().push(v);
        });
        let sender: Box<dyn FnOnce()> = Box::new(move || {
            tx.send(1).unwrap();
            tx.send(2).unwrap();
        });
        run_fibers(vec![receiving, selecting, sender]);
        let mut got = got.borrow().clone();
        got.sort_unstable();
        assert_eq!(got, [1, 2]);
    });
}

/// `Select` over `chan::local` senders between fibers: a fiber selecting sends over two full
/// bounded local channels while receiver fibers drain them gets every message through once and
/// in order; a parked select gets its message back when the receivers leave; `Select::ready`
/// wakes when room is made; and a parked `send` beside a parked select on one full channel
/// both complete when two slots free up.
#[test]
fn local_senders_in_a_select_between_fibers() {
    with_watchdog("local select sends", LIMIT, || {
        const PER_CHANNEL: u64 = 500;
        let (tx_a, rx_a) = chan::local::bounded::<u64>(1);
        let (tx_b, rx_b) = chan::local::bounded::<u64>(2);
        let got = Rc::new(std::cell::RefCell::new([Vec::new(), Vec::new()]));
        let selecting: Box<dyn FnOnce()> =
            Box::new(move || select_sends(&tx_a, &tx_b, 0, PER_CHANNEL));
        let receivers = [rx_a, rx_b].into_iter().enumerate().map(|(k, rx)| {
            let got = got.clone();
            Box::new(move || {
                for (j, v) in rx.iter().enumerate() {
                    got.borrow_mut()[k].push(v);
                    if j % 5 == 0 {
                        yield_fiber();
                    }
                }
            }) as Box<dyn FnOnce()>
        });
        run_fibers(std::iter::once(selecting).chain(receivers).collect());
        for k in 0..2 {
            assert!(got.borrow()[k] == (0..PER_CHANNEL).collect::<Vec<_>>());
        }

        // A parked select over a full local channel and a thread-safe one: the receivers leave.
        let (local_tx, local_rx) = chan::local::bounded::<u64>(1);
        let (tx, rx) = chan::bounded::<u64>(1);
        local_tx.send(0).unwrap();
        tx.send(0).unwrap();
        let (ready_tx, ready_rx) = chan::local::bounded::<u64>(1);
        ready_tx.send(0).unwrap();
        let ready_rx2 = ready_rx.clone();
        let selecting: Box<dyn FnOnce()> = Box::new(move || {
            let mut sel = Select::new();
            let local = sel.send(&local_tx);
            let shared = sel.send(&tx);
            let oper = sel.select();
            assert_eq!(oper.index(), shared);
            assert_eq!(oper.send(&tx, 1), Ok(()));
            let oper = sel.select();
            assert_eq!(oper.index(), local);
            assert_eq!(oper.send(&local_tx, 2), Err(chan::SendError(2)));

            let mut sel = Select::new();
            let only = sel.send(&ready_tx);
            assert_eq!(sel.ready(), only);
            assert_eq!(ready_tx.try_send(3), Ok(()));
            assert_eq!(ready_rx2.try_recv(), Ok(3));
        });
        let receiver: Box<dyn FnOnce()> = Box::new(move || {
            assert_eq!(rx.recv(), Ok(0));
            yield_fiber();
            drop(local_rx);
            yield_fiber();
            assert_eq!(rx.try_recv(), Ok(1), "the selected send completed");
            assert_eq!(ready_rx.recv(), Ok(0));
        });
        run_fibers(vec![selecting, receiver]);

        // A parked `send` and a parked select on one full channel: two slots, one each.
        let (tx, rx) = chan::local::bounded::<u64>(1);
        tx.send(0).unwrap();
        let tx2 = tx.clone();
        let sending: Box<dyn FnOnce()> = Box::new(move || tx.send(1).unwrap());
        let selecting: Box<dyn FnOnce()> = Box::new(move || {
            let mut sel = Select::new();
            sel.send(&tx2);
            sel.select().send(&tx2, 2).unwrap();
        });
        let receiver: Box<dyn FnOnce()> = Box::new(move || {
            let mut got: Vec<u64> = rx.iter().collect();
            got.sort_unstable();
            assert_eq!(got, [0, 1, 2]);
        });
        run_fibers(vec![sending, selecting, receiver]);
    });
}

/// Nothing is reserved for a select on a `chan::local` end: when a fiber suspends between its
/// select and the completion, and another fiber takes the room (the message) meanwhile, the
/// completion waits for the next, as a blocking `send` (`recv`) would.
#[test]
fn a_local_selected_operation_waits_when_another_fiber_took_what_was_ready() {
    with_watchdog("local select fallback", LIMIT, || {
        // A selected send whose room another sender takes.
        let (tx, rx) = chan::local::bounded::<u64>(1);
        let filler_tx = tx.clone();
        let order = Rc::new(std::cell::RefCell::new(Vec::new()));
        let o = order.clone();
        let selecting: Box<dyn FnOnce()> = Box::new(move || {
            let mut sel = Select::new();
            sel.send(&tx);
            let oper = sel.select();
            yield_fiber();
            assert!(tx.is_full(), "the filler took the room");
            oper.send(&tx, 1).unwrap();
        });
        let filler: Box<dyn FnOnce()> = Box::new(move || filler_tx.send(2).unwrap());
        let receiver: Box<dyn FnOnce()> = Box::new(move || {
            yield_fiber();
            o.borrow_mut().extend(rx.iter());
        });
        run_fibers(vec![selecting, filler, receiver]);
        assert_eq!(*order.borrow(), [2, 1]);

        // A selected receive whose message another receiver takes.
        let (tx, rx) = chan::local::channel::<u64>();
        let other_rx = rx.clone();
        tx.send(1).unwrap();
        let selecting: Box<dyn FnOnce()> = Box::new(move || {
            let mut sel = Select::new();
            sel.recv(&rx);
            let oper = sel.select();
            yield_fiber();
            assert!(rx.is_empty(), "the other receiver took the message");
            assert_eq!(oper.recv(&rx), Ok(2));
        });
        let other: Box<dyn FnOnce()> = Box::new(move || assert_eq!(other_rx.recv(), Ok(1)));
        let sender: Box<dyn FnOnce()> = Box::new(move || {
            yield_fiber();
            tx.send(2).unwrap();
        });
        run_fibers(vec![selecting, other, sender]);
    });
}

/// An empty select with a deadline parks the fiber, not its thread: the other fibers run
/// while it waits.
#[test]
fn an_empty_timed_select_in_a_fiber_lets_the_others_run() {
    with_watchdog("empty select", LIMIT, || {
        let ran = Rc::new(Cell::new(false));
        let seen = Rc::new(Cell::new(false));
        let (r, s) = (ran.clone(), seen.clone());
        let waiting: Box<dyn FnOnce()> = Box::new(move || {
            let start = Instant::now();
            assert!(Select::new()
                .select_timeout(Duration::from_millis(20))
                .is_err());
            assert!(start.elapsed() >= Duration::from_millis(20));
            s.set(r.get());
        });
        let other: Box<dyn FnOnce()> = Box::new(move || ran.set(true));
        run_fibers(vec![waiting, other]);
        assert!(seen.get(), "the other fiber ran while the select waited");
    });
}

/// Waiting on a timer parks the fiber, not its thread: `after`'s and `tick`'s receives, a
/// select over a timer and a channel, and `never`'s timed receive each let the other fibers
/// run (one counts its turns meanwhile), and each ends when its time comes.
#[test]
fn timers_in_a_fiber_let_the_others_run() {
    with_watchdog("timers", LIMIT, || {
        let turns = Rc::new(Cell::new(0u64));
        let done = Rc::new(Cell::new(false));
        let (t, d) = (turns.clone(), done.clone());
        let waiting: Box<dyn FnOnce()> = Box::new(move || {
            let period = Duration::from_millis(5);
            let mut seen = t.get();
            let mut others_ran = || {
                let now = t.get();
                let ran = now > seen;
                seen = now;
                ran
            };
            // Each wait is tried up to three times: a thread held off its CPU for longer than
            // the period between making a timer and waiting on it finds the timer due and
            // rightly does not park (once in about a thousand runs, with two suites at once
            // on two CPUs).
            let mut parks = |what: &str, wait: &mut dyn FnMut()| {
                let parked = (0..3).any(|_| {
                    wait();
                    others_ran()
                });
                assert!(parked, "{what}");
            };

            parks("after", &mut || {
                let start = Instant::now();
                let due = chan::after(period).recv().unwrap();
                assert!(due >= start + period);
            });

            parks("tick", &mut || {
                let ticker = chan::tick(period);
                let first = ticker.recv().unwrap();
                assert!(ticker.recv().unwrap() >= first + period);
            });

            let (_silent_tx, silent) = chan::unbounded::<u64>();
            parks("select", &mut || {
                let timer = chan::after(period);
                let got = courier::select! {
                    recv(silent) -> _msg => None,
                    recv(timer) -> at => Some(at.unwrap()),
                };
                assert!(got.is_some());
            });

            parks("never", &mut || {
                let start = Instant::now();
                assert_eq!(
                    chan::never::<u64>().recv_timeout(period),
                    Err(RecvTimeoutError::Timeout)
                );
                assert!(start.elapsed() >= period);
            });
            d.set(true);
        });
        let counting: Box<dyn FnOnce()> = Box::new(move || {
            while !done.get() {
                turns.set(turns.get() + 1);
                yield_fiber();
            }
        });
        run_fibers(vec![waiting, counting]);
    });
}

/// A fiber that holds what its `Select` claimed across a suspension (it selects, then blocks on
/// another channel before completing the operation) does not stall the fibers that wait for
/// that claim: a receiver waiting for the selected send's slot to be filled, a sender waiting
/// for the selected receive's slot to be emptied. They step aside, so the fiber that releases
/// the selecting one gets to run.
#[test]
fn a_fiber_suspended_between_select_and_completion_stalls_no_one() {
    for (name, make) in flavors() {
        with_watchdog(name, LIMIT, move || {
            // A selected send, completed only after `go`.
            let (tx, rx) = make();
            let (go_tx, go_rx) = chan::unbounded::<()>();
            let got = Rc::new(Cell::new(None));
            let g = got.clone();
            let selecting: Box<dyn FnOnce()> = Box::new(move || {
                let mut sel = Select::new();
                sel.send(&tx);
                let oper = sel.select();
                go_rx.recv().unwrap();
                oper.send(&tx, 7).unwrap();
            });
            let receiver: Box<dyn FnOnce()> = Box::new(move || g.set(rx.recv().ok()));
            let releaser: Box<dyn FnOnce()> = Box::new(move || go_tx.send(()).unwrap());
            run_fibers(vec![selecting, receiver, releaser]);
            assert_eq!(got.get(), Some(7), "{name}: selected send");

            // A selected receive on a full channel, completed only after `go`.
            let Some(cap) = make().0.capacity().filter(|&c| c > 0) else {
                return; // unbounded is never full; rendezvous is covered above
            };
            let (tx, rx) = make();
            for k in 0..cap as u64 {
                tx.send(k).unwrap();
            }
            let (go_tx, go_rx) = chan::unbounded::<()>();
            let selecting: Box<dyn FnOnce()> = Box::new(move || {
                let mut sel = Select::new();
                sel.recv(&rx);
                let oper = sel.select();
                go_rx.recv().unwrap();
                assert_eq!(oper.recv(&rx), Ok(0));
                for k in 1..=cap as u64 {
                    assert_eq!(rx.recv(), Ok(k));
                }
            });
            let sender: Box<dyn FnOnce()> = Box::new(move || tx.send(cap as u64).unwrap());
            let releaser: Box<dyn FnOnce()> = Box::new(move || go_tx.send(()).unwrap());
            run_fibers(vec![selecting, sender, releaser]);
        });
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 64, ..Default::default() })]

    /// Producers and consumers as fibers of one thread ([`producers_and_consumers`]), run in a
    /// random (seeded) order, on a random flavor.
    #[test]
    fn fibers_in_random_orders(
        flavor in 0..4usize,
        seed in proptest::prelude::any::<u64>(),
        producers in 1..4u64,
        consumers in 1..4usize,
        per_producer in 1..150u64,
    ) {
        let (name, make) = flavors()[flavor];
        with_watchdog(name, LIMIT, move || {
            producers_and_consumers(name, make, (producers, consumers, per_producer), Some(seed));
        });
    }

    /// Two `chan::local` channels (one bounded) fed by a sender fiber each, drained by a fiber
    /// selecting over both and a fiber receiving from the first, in a random (seeded) order:
    /// every message arrives once, and each consumer sees each channel's messages in order.
    #[test]
    fn local_selects_in_random_orders(
        seed in proptest::prelude::any::<u64>(),
        cap in 1..4usize,
        per_sender in 1..200u64,
    ) {
        with_watchdog("local select", LIMIT, move || {
            local_select_and_recv(seed, cap, per_sender);
        });
    }

    /// Two bounded `chan::local` channels fed by a fiber selecting sends over both and by a
    /// fiber sending on the first, drained by a receiving fiber each, in a random (seeded)
    /// order: every message arrives once, and each sender's messages in order.
    #[test]
    fn local_select_sends_in_random_orders(
        seed in proptest::prelude::any::<u64>(),
        caps in (1..4usize, 1..4usize),
        per_sender in 1..200u64,
    ) {
        with_watchdog("local select sends", LIMIT, move || {
            local_select_and_send(seed, caps, per_sender);
        });
    }
}

/// Sends `base + 0..n` on each of `a` and `b` through selects, in order on each.
fn select_sends(a: &chan::local::Sender<u64>, b: &chan::local::Sender<u64>, base: u64, n: u64) {
    let mut next = [0, 0];
    while next.iter().any(|&k| k < n) {
        let mut sel = Select::new();
        let ia = (next[0] < n).then(|| sel.send(a));
        let ib = (next[1] < n).then(|| sel.send(b));
        let oper = sel.select();
        let k = if Some(oper.index()) == ia {
            oper.send(a, base + next[0]).unwrap();
            0
        } else {
            assert_eq!(Some(oper.index()), ib);
            oper.send(b, base + next[1]).unwrap();
            1
        };
        next[k] += 1;
    }
}

/// Selects over `a` and `b` until both have disconnected, noting each message as (0 for `a`,
/// 1 for `b`; the value).
fn select_until_closed(
    a: &chan::local::Receiver<u64>,
    b: &chan::local::Receiver<u64>,
    got: &std::cell::RefCell<Vec<(usize, u64)>>,
) {
    let mut open = [true, true];
    while open.iter().any(|&o| o) {
        let mut sel = Select::new();
        let ia = open[0].then(|| sel.recv(a));
        let ib = open[1].then(|| sel.recv(b));
        let oper = sel.select();
        let (k, res) = if Some(oper.index()) == ia {
            (0, oper.recv(a))
        } else {
            assert_eq!(Some(oper.index()), ib);
            (1, oper.recv(b))
        };
        match res {
            Ok(v) => got.borrow_mut().push((k, v)),
            Err(RecvError) => open[k] = false,
        }
    }
}

/// The body of `local_selects_in_random_orders`.
fn local_select_and_recv(seed: u64, cap: usize, per_sender: u64) {
    let (tx_a, rx_a) = chan::local::channel::<u64>();
    let (tx_b, rx_b) = chan::local::bounded::<u64>(cap);
    let rx_a2 = rx_a.clone();
    // What each consumer got: (channel, value).
    let selected = Rc::new(std::cell::RefCell::new(Vec::new()));
    let received = Rc::new(std::cell::RefCell::new(Vec::new()));
    let (s, r) = (selected.clone(), received.clone());
    let selecting: Box<dyn FnOnce()> = Box::new(move || select_until_closed(&rx_a, &rx_b, &s));
    let receiving: Box<dyn FnOnce()> = Box::new(move || {
        for v in &rx_a2 {
            r.borrow_mut().push((0, v));
        }
    });
    let sender_a: Box<dyn FnOnce()> = Box::new(move || {
        for k in 0..per_sender {
            tx_a.send(k).unwrap();
            if k % 3 == 0 {
                yield_fiber();
            }
        }
    });
    let sender_b: Box<dyn FnOnce()> = Box::new(move || {
        for k in 0..per_sender {
            tx_b.send(k).unwrap();
        }
    });
    run_fibers_in_order(vec![selecting, receiving, sender_a, sender_b], Some(seed));
    for got in [&selected, &received] {
        for k in 0..2 {
            let mine: Vec<u64> = got
                .borrow()
                .iter()
                .filter(|m| m.0 == k)
                .map(|m| m.1)
                .collect();
            assert!(
                mine.windows(2).all(|w| w[0] < w[1]),
                "channel {k} out of order"
            );
        }
    }
    let mut all: Vec<(usize, u64)> = selected.borrow().clone();
    all.extend(received.borrow().iter().copied());
    all.sort_unstable();
    let expected: Vec<(usize, u64)> = (0..2)
        .flat_map(|k| (0..per_sender).map(move |v| (k, v)))
        .collect();
    assert!(all == expected, "a message lost or received twice");
}

/// The body of `local_select_sends_in_random_orders`.
fn local_select_and_send(seed: u64, caps: (usize, usize), per_sender: u64) {
    /// The plain sender's messages: `PLAIN + k`.
    const PLAIN: u64 = 1 << 32;
    let (tx_a, rx_a) = chan::local::bounded::<u64>(caps.0);
    let (tx_b, rx_b) = chan::local::bounded::<u64>(caps.1);
    let tx_a2 = tx_a.clone();
    let got = Rc::new(std::cell::RefCell::new([Vec::new(), Vec::new()]));
    let selecting: Box<dyn FnOnce()> = Box::new(move || select_sends(&tx_a, &tx_b, 0, per_sender));
    let sending: Box<dyn FnOnce()> = Box::new(move || {
        for k in 0..per_sender {
            tx_a2.send(PLAIN + k).unwrap();
            if k % 3 == 0 {
                yield_fiber();
            }
        }
    });
    let receivers = [rx_a, rx_b].into_iter().enumerate().map(|(k, rx)| {
        let got = got.clone();
        Box::new(move || {
            for v in &rx {
                got.borrow_mut()[k].push(v);
            }
        }) as Box<dyn FnOnce()>
    });
    let fibers = [selecting, sending].into_iter().chain(receivers).collect();
    run_fibers_in_order(fibers, Some(seed));
    let got = got.borrow();
    let from = |k: usize, plain: bool| -> Vec<u64> {
        got[k]
            .iter()
            .filter(|&&v| (v >= PLAIN) == plain)
            .map(|&v| v & (PLAIN - 1))
            .collect()
    };
    let all: Vec<u64> = (0..per_sender).collect();
    assert!(from(0, false) == all, "the select's sends on a");
    assert!(from(0, true) == all, "the plain sends on a");
    assert!(from(1, false) == all, "the select's sends on b");
    assert!(from(1, true).is_empty());
}
