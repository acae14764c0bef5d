//! Messages whose payload is still arriving when they are received: the
//! rest of a fragmented message on its carrier, or a streamed region not yet
//! filled. A receive that may not block (`try_recv`, a receiver set's read)
//! waits a moment for the rest, then returns empty-handed, and the next
//! receive goes on where it stopped; so a peer that starts a message and
//! never finishes it cannot hold a set (the other channels' messages come
//! through), and the message itself arrives whole when its rest does.
//!
//! Peers here are raw sockets writing courier's wire format by hand, so
//! each test decides exactly when the rest arrives.

use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use courier::ipc::{
    self, IpcError, IpcReceiver, IpcReceiverSet, IpcSelectionResult, OpaqueIpcReceiver,
    TryRecvError, TrySelectError,
};
use rustix::fs::{self, MemfdFlags, SealFlags};
use rustix::io::pwrite;
use rustix::net::{self, SendFlags};

mod common;
use common::fd_check;
use common::wire::{fd_packet, header, raw_send, seqpacket_pair};

/// Where a region's payload starts, and where its header says how far a
/// streamed payload is filled (the `shm` module's layout).
const PAYLOAD: u64 = 64;
const FILLED: u64 = 16;

/// How long the tests allow for what must not wait for the fragment timeout
/// (30 s): a bound against a hang, not a timing.
const PROMPTLY: Duration = Duration::from_secs(10);

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// `data` as a typed message carrying one `Vec<u8>` (postcard: the length
/// as a LEB128 varint, then the bytes).
fn encoded(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() + 10);
    let mut len = data.len() as u64;
    loop {
        let byte = (len & 0x7f) as u8;
        len >>= 7;
        if len == 0 {
            out.push(byte);
            break;
        }
        out.push(byte | 0x80);
    }
    out.extend_from_slice(data);
    out
}

/// A typed receiver of byte vectors, and the raw socket its peer writes.
fn raw_typed() -> (OwnedFd, IpcReceiver<Vec<u8>>) {
    let (raw, end) = seqpacket_pair();
    (raw, IpcReceiver::try_from(end).unwrap())
}

/// Announces on `raw` a fragmented message of `body`'s length tagged `tag`,
/// with its first `inline` bytes; returns the carrier's other end, on which
/// the rest is to be sent.
fn begin_fragmented(raw: &OwnedFd, body: &[u8], inline: usize, tag: u64) -> OwnedFd {
    let (carrier, feed) = seqpacket_pair();
    let mut first = header(1, 1, body.len() as u64, 3, tag);
    first.extend_from_slice(&body[..inline]);
    raw_send(raw, &first, &[]);
    raw_send(raw, &fd_packet(1, tag), &[carrier.as_fd()]);
    feed
}

/// Sends `rest` on a fragmented message's carrier, from another thread (the
/// carrier's buffer may not hold it all).
fn finish_fragmented(feed: OwnedFd, rest: Vec<u8>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        for chunk in rest.chunks(32 << 10) {
            net::send(&feed, chunk, SendFlags::NOSIGNAL).unwrap();
        }
    })
}

/// A sealed region for a streamed payload of `len` bytes.
fn region(len: usize) -> OwnedFd {
    let fd = fs::memfd_create("stream", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).unwrap();
    fs::ftruncate(&fd, PAYLOAD + len as u64).unwrap();
    fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW).unwrap();
    fd
}

/// Announces on `raw` a streamed region message of `len` bytes in `region`.
fn begin_streamed(raw: &OwnedFd, region: &OwnedFd, len: usize, tag: u64) {
    let mut streamed = header(2, 1, len as u64, 3, tag);
    streamed[7] = 1;
    raw_send(raw, &streamed, &[]);
    raw_send(raw, &fd_packet(1, tag), &[region.as_fd()]);
}

/// Writes `data[from..to]` into a streamed region and says it is filled to `to`.
fn fill(region: &OwnedFd, data: &[u8], from: usize, to: usize) {
    pwrite(region, &data[from..to], PAYLOAD + from as u64).unwrap();
    pwrite(region, &(to as u64).to_le_bytes(), FILLED).unwrap();
}

/// Selects until the member `id` gives a message, checking that no other
/// result comes meanwhile.
fn select_from(set: &mut IpcReceiverSet, id: u64) -> ipc::IpcMessage {
    let started = Instant::now();
    loop {
        assert!(started.elapsed() < PROMPTLY, "select waited too long");
        if let Some(result) = set.select().unwrap().into_iter().next() {
            match result {
                IpcSelectionResult::MessageReceived(from, message) if from == id => return message,
                other => panic!("unexpected {other:?}"),
            }
        }
    }
}

/// A fragmented message whose rest is late holds neither `try_select` nor
/// the set's other channels, and arrives whole once its rest comes.
#[test]
fn a_set_goes_on_past_a_fragmented_message_whose_rest_is_late() {
    let _check = fd_check();
    let (raw, stalled) = seqpacket_pair();
    let (tx, rx) = ipc::channel::<u32>().unwrap();
    let mut set = IpcReceiverSet::new().unwrap();
    let late = set
        .add_opaque(OpaqueIpcReceiver::try_from(stalled).unwrap())
        .unwrap();
    let quick = set.add(rx).unwrap();

    let data = pattern(150_000, 5);
    let body = encoded(&data);
    let feed = begin_fragmented(&raw, &body, 100, 90);
    let started = Instant::now();
    assert!(matches!(set.try_select(), Err(TrySelectError::Empty)));
    tx.send(7).unwrap();
    assert_eq!(select_from(&mut set, quick).to::<u32>().unwrap(), 7);
    assert!(started.elapsed() < PROMPTLY, "held by the late message");

    // Part of the rest, then the rest of it.
    net::send(&feed, &body[100..20_000], SendFlags::NOSIGNAL).unwrap();
    assert!(matches!(set.try_select(), Err(TrySelectError::Empty)));
    let feeder = finish_fragmented(feed, body[20_000..].to_vec());
    assert_eq!(
        select_from(&mut set, late).to::<Vec<u8>>().unwrap(),
        data,
        "whole, in order"
    );
    feeder.join().unwrap();
    drop(raw);
}

/// The same for a streamed region that is not filled yet: the set serves
/// its other channel meanwhile, then delivers the message whole.
#[test]
fn a_set_goes_on_past_a_streamed_message_not_yet_written() {
    let _check = fd_check();
    let (raw, stalled) = seqpacket_pair();
    let (tx, rx) = ipc::channel::<u32>().unwrap();
    let mut set = IpcReceiverSet::new().unwrap();
    let late = set
        .add_opaque(OpaqueIpcReceiver::try_from(stalled).unwrap())
        .unwrap();
    let quick = set.add(rx).unwrap();

    let data = pattern(2 << 20, 6);
    let body = encoded(&data);
    let region = region(body.len());
    begin_streamed(&raw, &region, body.len(), 91);
    fill(&region, &body, 0, 4096);
    let started = Instant::now();
    assert!(matches!(set.try_select(), Err(TrySelectError::Empty)));
    for i in 0..3 {
        tx.send(i).unwrap();
        assert_eq!(select_from(&mut set, quick).to::<u32>().unwrap(), i);
    }
    assert!(started.elapsed() < PROMPTLY, "held by the late message");
    fill(&region, &body, 4096, body.len() / 2);
    assert!(matches!(set.try_select(), Err(TrySelectError::Empty)));
    fill(&region, &body, body.len() / 2, body.len());
    assert_eq!(
        select_from(&mut set, late).to::<Vec<u8>>().unwrap(),
        data,
        "whole, in order"
    );
    drop(raw);
}

/// `try_recv` and `try_recv_timeout` on a typed receiver return `Empty`
/// while a streamed message is half written, and the next receive goes on:
/// with the byte string received into its own buffer (the layout learnt
/// from the message before), or, once the receiver is in a set, which
/// predicts nothing, with the string put back in place.
#[test]
fn a_typed_receive_that_may_not_block_goes_on_where_it_stopped() {
    let _check = fd_check();
    let (raw, rx) = raw_typed();
    let len = 2 << 20;
    let region = region(len + 10);

    // The first message teaches the receiver where the string sits.
    let first = pattern(len, 1);
    let body = encoded(&first);
    begin_streamed(&raw, &region, body.len(), 92);
    fill(&region, &body, 0, body.len());
    assert_eq!(rx.recv().unwrap(), first);

    // The receiver now holds the region: the second message names it by
    // the first one's tag, without a descriptor (a kept message).
    let second = pattern(len, 2);
    let body = encoded(&second);
    pwrite(&region, &0u64.to_le_bytes(), FILLED).unwrap();
    let mut kept = header(3, 0, body.len() as u64, 0, 92);
    kept[7] = 1;
    raw_send(&raw, &kept, &[]);
    fill(&region, &body, 0, 1000);
    assert!(matches!(rx.try_recv(), Err(TryRecvError::Empty)));
    fill(&region, &body, 1000, len / 2);
    assert!(matches!(
        rx.try_recv_timeout(Duration::from_millis(20)),
        Err(TryRecvError::Empty)
    ));
    fill(&region, &body, len / 2, body.len());
    assert_eq!(rx.try_recv().unwrap(), second);

    // Half written again, then the receiver goes into a set.
    let third = pattern(len, 3);
    let body = encoded(&third);
    pwrite(&region, &0u64.to_le_bytes(), FILLED).unwrap();
    begin_streamed(&raw, &region, body.len(), 94);
    fill(&region, &body, 0, len / 2);
    assert!(matches!(rx.try_recv(), Err(TryRecvError::Empty)));
    let mut set = IpcReceiverSet::new().unwrap();
    let id = set.add(rx).unwrap();
    assert!(matches!(set.try_select(), Err(TrySelectError::Empty)));
    fill(&region, &body, len / 2, body.len());
    assert_eq!(select_from(&mut set, id).to::<Vec<u8>>().unwrap(), third);
    drop(raw);
}

/// A receiver that is sent away while a streamed message is half copied
/// takes the message along, without waiting for the rest: the copy so far
/// reads a mapping of this process, so the message goes as it came (with
/// its region's descriptor), and the new owner copies it whole once its
/// sender has written the rest.
#[test]
fn a_receiver_moved_mid_copy_takes_the_message_whole() {
    let _check = fd_check();
    let (raw, rx) = raw_typed();
    let data = pattern(3 << 20, 4);
    let body = encoded(&data);
    let region = region(body.len());
    begin_streamed(&raw, &region, body.len(), 95);
    fill(&region, &body, 0, body.len() / 3);
    assert!(matches!(rx.try_recv(), Err(TryRecvError::Empty)));

    let (carrier_tx, carrier_rx) = ipc::channel::<IpcReceiver<Vec<u8>>>().unwrap();
    // The rest is written only after the send: a send that waited for it
    // would wait the whole fragment timeout, then lose the message.
    let started = Instant::now();
    carrier_tx.send(rx).unwrap();
    assert!(
        started.elapsed() < PROMPTLY,
        "the send waited for the message"
    );
    fill(&region, &body, body.len() / 3, body.len());
    let moved = carrier_rx.recv().unwrap();
    assert_eq!(moved.recv().unwrap(), data);
    drop(raw);
    assert!(matches!(moved.recv(), Err(IpcError::Disconnected)));
}

/// Sets the fragment timeout until dropped.
struct FragmentTimeout(ipc::Config);

impl FragmentTimeout {
    fn set(timeout: Duration) -> FragmentTimeout {
        let saved = ipc::Config::global();
        ipc::Config::set_global(ipc::Config {
            fragment_timeout: timeout,
            ..saved
        });
        FragmentTimeout(saved)
    }
}

impl Drop for FragmentTimeout {
    fn drop(&mut self) {
        ipc::Config::set_global(self.0);
    }
}

/// A fragmented message whose rest never comes fails at the fragment
/// timeout, as before, when later receives go on with it; its carrier is
/// closed and the channel stays usable.
#[test]
fn a_message_put_aside_still_fails_at_the_fragment_timeout() {
    let _check = fd_check();
    let (raw, rx) = raw_typed();
    let timeout = FragmentTimeout::set(Duration::from_millis(300));
    let body = encoded(&pattern(100_000, 7));
    let feed = begin_fragmented(&raw, &body, 10, 96);
    let started = Instant::now();
    let failed = loop {
        match rx.try_recv() {
            Err(TryRecvError::Empty) => assert!(started.elapsed() < PROMPTLY, "no timeout"),
            other => break other,
        }
    };
    drop(timeout);
    assert!(
        matches!(failed, Err(TryRecvError::IpcError(IpcError::Io(_)))),
        "{failed:?}"
    );
    drop(feed);
    // The channel goes on with the next message.
    let next = pattern(100, 8);
    let mut small = header(0, 0, (next.len() + 1) as u64, 0, 97);
    small.extend_from_slice(&encoded(&next));
    raw_send(&raw, &small, &[]);
    assert_eq!(rx.recv().unwrap(), next);
}

/// The fragment timeout counts the time receives wait for the rest, not the
/// time the application takes to come back: a message put aside, then
/// written whole, is received whole long after the timeout's length has
/// passed, for a region as for fragments.
#[test]
fn a_message_that_came_whole_meanwhile_is_not_timed_out() {
    let _check = fd_check();
    let _timeout = FragmentTimeout::set(Duration::from_millis(200));
    let (raw, rx) = raw_typed();

    let streamed = pattern(2 << 20, 9);
    let body = encoded(&streamed);
    let region = region(body.len());
    begin_streamed(&raw, &region, body.len(), 98);
    fill(&region, &body, 0, 5000);
    assert!(matches!(rx.try_recv(), Err(TryRecvError::Empty)));
    fill(&region, &body, 5000, body.len());
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(rx.try_recv().unwrap(), streamed);

    let fragmented = pattern(100_000, 10);
    let body = encoded(&fragmented);
    let feed = begin_fragmented(&raw, &body, 10, 99);
    assert!(matches!(rx.try_recv(), Err(TryRecvError::Empty)));
    finish_fragmented(feed, body[10..].to_vec()).join().unwrap();
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(rx.try_recv().unwrap(), fragmented);
}

/// A peer that keeps writing a streamed payload a few bytes at a time does
/// not hold a receive that may not block either: `try_recv` returns within
/// its slice each time, though bytes keep coming. (The writer would take
/// about a minute to finish; the code before returned only when a gap in
/// its writes outlasted the receiver's spin, which scheduling decides, so
/// this fails there only when the writer keeps pace.)
#[test]
fn a_stream_that_creeps_does_not_hold_a_try_recv() {
    let _check = fd_check();
    let (raw, rx) = raw_typed();
    let body = encoded(&pattern(16 << 20, 11));
    let region = region(body.len());
    begin_streamed(&raw, &region, body.len(), 100);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let creeper = std::thread::spawn({
        let (region, stop, body) = (region.try_clone().unwrap(), stop.clone(), body.clone());
        move || {
            let mut filled = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && filled + 8 < body.len() {
                fill(&region, &body, filled, filled + 8);
                filled += 8;
                // Busy, not asleep: a sleep here can overshoot the
                // receiver's 200 µs spin, which would let it pause anyway.
                let wrote = Instant::now();
                while wrote.elapsed() < Duration::from_micros(20) {
                    std::hint::spin_loop();
                }
            }
        }
    });
    for _ in 0..3 {
        let started = Instant::now();
        assert!(matches!(rx.try_recv(), Err(TryRecvError::Empty)));
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "held by a creeping stream"
        );
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    creeper.join().unwrap();
    drop(raw);
}

/// A stalled message at the head of a receiver that is polled rarely fails
/// once twice the fragment timeout has passed since its fetch began, though
/// the polls spent little of the timeout waiting; the messages behind it
/// (here another sender's) then come through.
#[test]
fn a_stalled_message_fails_by_the_clock_when_polled_rarely() {
    let _check = fd_check();
    let _timeout = FragmentTimeout::set(Duration::from_millis(500));
    let (raw, rx) = raw_typed();
    for (tag, streamed) in [(101, false), (102, true)] {
        let body = encoded(&pattern(300_000, 12));
        let (feed, region) = match streamed {
            false => (Some(begin_fragmented(&raw, &body, 10, tag)), None),
            true => {
                let region = region(body.len());
                // In flight, as its sender marks it (`BUSY`).
                pwrite(&region, &1u32.to_le_bytes(), 0).unwrap();
                begin_streamed(&raw, &region, body.len(), tag);
                fill(&region, &body, 0, 1000);
                (None, Some(region))
            }
        };
        assert!(matches!(rx.try_recv(), Err(TryRecvError::Empty)));
        std::thread::sleep(Duration::from_millis(1200));
        let failed = rx.try_recv();
        assert!(
            matches!(failed, Err(TryRecvError::IpcError(IpcError::Io(_)))),
            "{failed:?}"
        );
        if let Some(region) = &region {
            // Given back to its sender, as after any failed copy.
            let mut state = [0u8; 4];
            rustix::io::pread(region, &mut state, 0).unwrap();
            assert_eq!(u32::from_le_bytes(state) & 1, 0, "the region stayed busy");
        }
        let next = pattern(100, 13);
        let mut small = header(0, 0, (next.len() + 1) as u64, 0, 0);
        small.extend_from_slice(&encoded(&next));
        raw_send(&raw, &small, &[]);
        assert_eq!(rx.recv().unwrap(), next);
        drop((feed, region));
    }
}

/// A message whose sender keeps going is not cut off, however long its
/// receiver leaves it between polls: each poll that gets some of it starts
/// the clock again (a first version failed it at the first empty read past
/// twice the timeout, found by a review).
#[test]
fn a_message_arriving_steadily_is_not_cut_off_between_rare_polls() {
    let _check = fd_check();
    let _timeout = FragmentTimeout::set(Duration::from_millis(200));
    let (raw, rx) = raw_typed();
    let data = pattern(3 << 20, 14);
    let body = encoded(&data);
    let feed = begin_fragmented(&raw, &body, 10, 103);
    assert!(matches!(rx.try_recv(), Err(TryRecvError::Empty)));
    // The sender blocks whenever the carrier is full, as a real one does.
    let feeder = finish_fragmented(feed, body[10..].to_vec());
    let started = Instant::now();
    let got = loop {
        std::thread::sleep(Duration::from_millis(250));
        match rx.try_recv() {
            Err(TryRecvError::Empty) => assert!(started.elapsed() < PROMPTLY, "never completed"),
            other => break other,
        }
    };
    assert_eq!(got.unwrap(), data);
    feeder.join().unwrap();
}
