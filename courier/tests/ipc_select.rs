//! `IpcReceiverSet`: receiving from whichever of many channels has a message,
//! with ipc-channel's names and signatures.
//!
//! Every test holds an `FdCheck` (see `tests/common`): a receiver that leaves
//! the set must close its socket, and the set its `epoll` instance.

use std::collections::HashMap;
use std::io::IoSlice;
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use courier::ipc::{
    self, IpcMessage, IpcReceiver, IpcReceiverSet, IpcSelectionResult, IpcSender, TrySelectError,
    WireError, DRAIN_LIMIT,
};
use rustix::net::{self, SendFlags};

mod common;
use common::fd_check;
use common::wire::{header, seqpacket_pair, wire_error};

/// What a set reported, in order: `Ok((id, message))`, `Err(id)` for a
/// closed channel.
type Event = Result<(u64, IpcMessage), u64>;

fn events(results: Vec<IpcSelectionResult>) -> Vec<Event> {
    results
        .into_iter()
        .map(|r| match r {
            IpcSelectionResult::MessageReceived(id, m) => Ok((id, m)),
            IpcSelectionResult::ChannelClosed(id) => Err(id),
        })
        .collect()
}

/// The ids of `results`, which must all be closed channels.
fn closed(results: Vec<IpcSelectionResult>) -> Vec<u64> {
    events(results)
        .into_iter()
        .map(|e| e.expect_err("a message where a closed channel was expected"))
        .collect()
}

/// Selects until every id in `ids` has closed; returns each id's messages,
/// decoded as `u64`, in the order they arrived. Checks that each id closes
/// once, after its last message.
fn drain(set: &mut IpcReceiverSet, ids: &[u64]) -> HashMap<u64, Vec<u64>> {
    let mut got: HashMap<u64, Vec<u64>> = HashMap::new();
    let mut open: Vec<u64> = ids.to_vec();
    while !open.is_empty() {
        for event in events(set.select().unwrap()) {
            match event {
                Ok((id, message)) => {
                    assert!(open.contains(&id), "message from {id} after it closed");
                    got.entry(id)
                        .or_default()
                        .push(message.to::<u64>().unwrap());
                }
                Err(id) => {
                    assert!(open.contains(&id), "{id} closed twice (or is unknown)");
                    open.retain(|&o| o != id);
                }
            }
        }
    }
    got
}

#[test]
fn messages_from_several_channels_carry_their_ids_in_order() {
    let _check = fd_check();
    let mut set = IpcReceiverSet::new().unwrap();
    let mut senders = Vec::new();
    let mut ids = Vec::new();
    for _ in 0..3 {
        let (tx, rx) = ipc::channel::<u64>().unwrap();
        ids.push(set.add(rx).unwrap());
        senders.push(tx);
    }
    assert_eq!(ids, [0, 1, 2], "ids count from 0, as ipc-channel's do");
    // Interleaved, from three threads.
    let threads: Vec<_> = senders
        .into_iter()
        .enumerate()
        .map(|(k, tx)| {
            std::thread::spawn(move || {
                for i in 0..300 {
                    tx.send(k as u64 * 1000 + i).unwrap();
                }
            })
        })
        .collect();
    // (More than a socket buffer holds: the senders wait for the select.)
    let got = drain(&mut set, &ids);
    for t in threads {
        t.join().unwrap();
    }
    for (k, id) in ids.iter().enumerate() {
        let expected: Vec<u64> = (0..300).map(|i| k as u64 * 1000 + i).collect();
        assert_eq!(got[id], expected, "channel {id}");
    }
    // Every channel has left the set: nothing more to report.
    assert!(matches!(set.try_select(), Err(TrySelectError::Empty)));
}

#[test]
fn try_select_reports_empty_and_the_timed_one_waits_first() {
    let _check = fd_check();
    let (tx, rx) = ipc::channel::<u64>().unwrap();
    let mut set = IpcReceiverSet::new().unwrap();
    let id = set.add(rx).unwrap();
    assert!(matches!(set.try_select(), Err(TrySelectError::Empty)));
    let start = Instant::now();
    let wait = Duration::from_millis(30);
    assert!(matches!(
        set.try_select_timeout(wait),
        Err(TrySelectError::Empty)
    ));
    assert!(start.elapsed() >= wait, "returned before its timeout");
    tx.send(5).unwrap();
    let (got, message) = set.try_select().unwrap().pop().unwrap().unwrap();
    assert_eq!((got, message.to::<u64>().unwrap()), (id, 5));
    tx.send(6).unwrap();
    let results = set.try_select_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(results.len(), 1);
}

#[test]
fn select_waits_for_a_message_from_another_thread() {
    let _check = fd_check();
    let (tx, rx) = ipc::channel::<String>().unwrap();
    let (_idle_tx, idle_rx) = ipc::channel::<String>().unwrap();
    let mut set = IpcReceiverSet::new().unwrap();
    set.add(idle_rx).unwrap();
    let id = set.add(rx).unwrap();
    let sender = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        tx.send("late".to_owned()).unwrap();
        tx
    });
    let (got, message) = set.select().unwrap().pop().unwrap().unwrap();
    assert_eq!(got, id);
    assert_eq!(message.to::<String>().unwrap(), "late");
    drop(sender.join().unwrap());
    // The sender is gone: the channel closes, the idle one stays.
    assert_eq!(closed(set.select().unwrap()), [id]);
    assert!(matches!(set.try_select(), Err(TrySelectError::Empty)));
}

#[test]
fn a_flooding_channel_is_read_in_bounded_turns_and_starves_no_one() {
    let _check = fd_check();
    let (flood_tx, flood_rx) = ipc::channel::<u64>().unwrap();
    let (quiet_tx, quiet_rx) = ipc::channel::<u64>().unwrap();
    let mut set = IpcReceiverSet::new().unwrap();
    let flood = set.add(flood_rx).unwrap();
    let quiet = set.add(quiet_rx).unwrap();
    // (Within one socket buffer: nothing reads while they are sent.)
    let total = DRAIN_LIMIT as u64 + 10;
    for i in 0..total {
        flood_tx.send(i).unwrap();
    }
    quiet_tx.send(42).unwrap();
    // The first select finds both ready: it drains each, at most
    // DRAIN_LIMIT from the flooding one; the next ones take the rest.
    let first = events(set.select().unwrap());
    let mut flood_got = Vec::new();
    let mut quiet_got = Vec::new();
    for (id, m) in first.into_iter().map(Result::unwrap) {
        let v = m.to::<u64>().unwrap();
        if id == flood {
            flood_got.push(v);
        } else {
            quiet_got.push(v);
        }
    }
    assert_eq!(quiet_got, [42], "the quiet channel is served at once");
    assert_eq!(flood_got.len(), DRAIN_LIMIT);
    while (flood_got.len() as u64) < total {
        let results = events(set.select().unwrap());
        assert!(
            results.len() <= DRAIN_LIMIT,
            "{} in one select",
            results.len()
        );
        for (id, m) in results.into_iter().map(Result::unwrap) {
            assert_eq!(id, flood);
            flood_got.push(m.to::<u64>().unwrap());
        }
    }
    drop((flood_tx, quiet_tx));
    assert_eq!(drain(&mut set, &[flood, quiet]).len(), 0, "nothing left");
    assert_eq!(flood_got, (0..total).collect::<Vec<_>>());
}

#[test]
fn channels_travel_through_a_set() {
    let _check = fd_check();
    let (tx, rx) = ipc::channel::<IpcSender<u32>>().unwrap();
    let mut set = IpcReceiverSet::new().unwrap();
    set.add(rx).unwrap();
    let (reply_tx, reply_rx) = ipc::channel::<u32>().unwrap();
    tx.send(reply_tx).unwrap();
    let (_, message) = set.select().unwrap().pop().unwrap().unwrap();
    message.to::<IpcSender<u32>>().unwrap().send(9).unwrap();
    assert_eq!(reply_rx.recv().unwrap(), 9);
}

#[test]
fn messages_carrying_channels_from_many_senders_all_arrive() {
    // Several senders of one channel each send a message's data packet and
    // then its descriptor packet, so the receiver sees them interleaved and
    // holds messages whose descriptors are still to come.
    let _check = fd_check();
    let (tx, rx) = ipc::channel::<(u32, u32, IpcSender<u32>)>().unwrap();
    let (echo_tx, echo_rx) = ipc::channel::<u32>().unwrap();
    let mut set = IpcReceiverSet::new().unwrap();
    let id = set.add(rx).unwrap();
    let threads: Vec<_> = (0..4)
        .map(|k| {
            let tx = tx.clone();
            let echo_tx = echo_tx.clone();
            std::thread::spawn(move || {
                for i in 0..200 {
                    tx.send((k, i, echo_tx.clone())).unwrap();
                }
            })
        })
        .collect();
    drop((tx, echo_tx));
    let mut next = [0u32; 4];
    let mut open = true;
    while open {
        for event in events(set.select().unwrap()) {
            match event {
                Ok((got, message)) => {
                    assert_eq!(got, id);
                    let (k, i, echo) = message.to::<(u32, u32, IpcSender<u32>)>().unwrap();
                    assert_eq!(i, next[k as usize], "sender {k}'s order");
                    next[k as usize] += 1;
                    echo.send(k * 1000 + i).unwrap();
                }
                Err(got) => {
                    assert_eq!(got, id);
                    open = false;
                }
            }
        }
        while echo_rx.try_recv().is_ok() {}
    }
    assert_eq!(next, [200; 4]);
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn opaque_receivers_and_their_limits_join_a_set() {
    let _check = fd_check();
    let (tx, rx) = ipc::channel::<Vec<u8>>().unwrap();
    rx.set_max_message_size(64);
    let (otx, orx) = ipc::channel::<u8>().unwrap();
    let mut set = IpcReceiverSet::new().unwrap();
    let limited = set.add(rx).unwrap();
    let opaque = set.add_opaque(orx.to_opaque()).unwrap();
    otx.send(3).unwrap();
    let (got, message) = set.select().unwrap().pop().unwrap().unwrap();
    assert_eq!((got, message.to::<u8>().unwrap()), (opaque, 3));
    // Over the receiver's own limit: refused, typed; the next one comes.
    tx.send(vec![0; 1000]).unwrap();
    tx.send(vec![1; 8]).unwrap();
    let err = set.select().unwrap_err();
    assert!(
        matches!(wire_error(&err), Some(WireError::TooLarge { .. })),
        "{err}"
    );
    let (got, message) = set.select().unwrap().pop().unwrap().unwrap();
    assert_eq!(
        (got, message.to::<Vec<u8>>().unwrap()),
        (limited, vec![1; 8])
    );
}

/// A typed receiver and the raw socket that feeds it (a hostile peer).
fn raw_pair() -> (OwnedFd, IpcReceiver<u64>) {
    let (a, b) = seqpacket_pair();
    (a, IpcReceiver::try_from(b).unwrap())
}

#[test]
fn garbage_is_a_typed_error_and_loses_nothing() {
    let _check = fd_check();
    let (good_tx, good_rx) = ipc::channel::<u64>().unwrap();
    let (raw, hostile_rx) = raw_pair();
    let mut set = IpcReceiverSet::new().unwrap();
    let good = set.add(good_rx).unwrap();
    let hostile = set.add(hostile_rx).unwrap();
    good_tx.send(1).unwrap();
    good_tx.send(2).unwrap();
    net::send(&raw, &[0xff; 64], SendFlags::NOSIGNAL).unwrap();
    // A well-formed message after it, from the same hostile socket: an
    // inline message of one postcard byte (7).
    let mut ok = header(0, 0, 1, 0, 0);
    ok.push(7);
    net::sendmsg(
        &raw,
        &[IoSlice::new(&ok)],
        &mut Default::default(),
        SendFlags::NOSIGNAL,
    )
    .unwrap();
    // Each select hands out what it read and keeps an error for the next
    // one: every message arrives, in its channel's order, and the garbage is
    // reported once, as what it is.
    let mut got = Vec::new();
    let mut errors = Vec::new();
    while got.len() < 3 {
        match set.try_select_timeout(Duration::from_secs(10)) {
            Ok(results) => got.extend(events(results).into_iter().map(|e| {
                let (id, m) = e.unwrap();
                (id, m.to::<u64>().unwrap())
            })),
            Err(TrySelectError::IoError(e)) => errors.push(wire_error(&e)),
            Err(TrySelectError::Empty) => panic!("lost: got {got:?}"),
        }
    }
    let good_got: Vec<_> = got.iter().filter(|(id, _)| *id == good).collect();
    assert_eq!(good_got, [&(good, 1), &(good, 2)]);
    assert!(got.contains(&(hostile, 7)), "{got:?}");
    assert!(
        matches!(errors[..], [Some(WireError::BadHeader(_))]),
        "{errors:?}"
    );
    drop(raw);
    assert_eq!(closed(set.select().unwrap()), [hostile]);
}

#[test]
fn a_peer_sending_garbage_starves_no_one() {
    let _check = fd_check();
    let (raw, hostile_rx) = raw_pair();
    let (good_tx, good_rx) = ipc::channel::<u64>().unwrap();
    let mut set = IpcReceiverSet::new().unwrap();
    // The hostile channel comes first in every select.
    set.add(hostile_rx).unwrap();
    let good = set.add(good_rx).unwrap();
    for i in 0..20 {
        net::send(&raw, &[0xff; 64], SendFlags::NOSIGNAL).unwrap();
        good_tx.send(i).unwrap();
    }
    let mut got = Vec::new();
    let mut errors = 0;
    // A few selects, far fewer than the 20 garbage packets: a set that
    // stopped at each error would still be reporting garbage.
    for _ in 0..6 {
        if got.len() == 20 && errors > 0 {
            break;
        }
        match set.try_select() {
            Ok(results) => got.extend(events(results).into_iter().map(|e| {
                let (id, m) = e.unwrap();
                assert_eq!(id, good);
                m.to::<u64>().unwrap()
            })),
            Err(TrySelectError::IoError(e)) => {
                assert!(
                    matches!(wire_error(&e), Some(WireError::BadHeader(_))),
                    "{e}"
                );
                errors += 1;
            }
            Err(TrySelectError::Empty) => break,
        }
    }
    assert_eq!(
        got,
        (0..20).collect::<Vec<_>>(),
        "the good channel was served"
    );
    assert!(errors >= 1, "the garbage was reported");
}

#[test]
fn a_message_whose_descriptors_never_come_is_given_up_without_a_hang() {
    // The socket goes quiet after a data packet that announces a descriptor:
    // the set must still read the receiver when the wait for it runs out
    // (10 s), and report the loss as what it is.
    let _check = fd_check();
    let (raw, rx) = raw_pair();
    let mut set = IpcReceiverSet::new().unwrap();
    let id = set.add(rx).unwrap();
    net::send(&raw, &header(0, 1, 0, 0, 77), SendFlags::NOSIGNAL).unwrap();
    let start = Instant::now();
    match set.try_select_timeout(Duration::from_secs(60)) {
        Err(TrySelectError::IoError(e)) => {
            assert!(
                matches!(wire_error(&e), Some(WireError::DescriptorsMissing)),
                "{e}"
            );
        }
        Err(TrySelectError::Empty) => panic!("nothing after 60 s"),
        Ok(results) => panic!(
            "{} results from a message that never completed",
            results.len()
        ),
    }
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "{:?}",
        start.elapsed()
    );
    let mut ok = header(0, 0, 1, 0, 0);
    ok.push(8);
    net::send(&raw, &ok, SendFlags::NOSIGNAL).unwrap();
    let (got, message) = set.select().unwrap().pop().unwrap().unwrap();
    assert_eq!((got, message.to::<u64>().unwrap()), (id, 8));
}

#[test]
fn a_set_can_move_to_another_thread() {
    fn is_send<T: Send>() {}
    fn is_sync<T: Sync>() {}
    is_send::<IpcReceiverSet>();
    is_sync::<IpcReceiverSet>();
    is_send::<IpcSelectionResult>();
    let _check = fd_check();
    let (tx, rx) = ipc::channel::<u64>().unwrap();
    let mut set = IpcReceiverSet::new().unwrap();
    let id = set.add(rx).unwrap();
    tx.send(11).unwrap();
    let (got, message) = std::thread::spawn(move || set.select().unwrap().pop().unwrap().unwrap())
        .join()
        .unwrap();
    assert_eq!((got, message.to::<u64>().unwrap()), (id, 11));
}
