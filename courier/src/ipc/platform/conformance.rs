//! One suite, every implementation: the contract of [`super`] checked
//! against Linux and against the in-process twin, as ipc-channel's
//! `src/platform/test.rs` runs against each of its platforms.
//!
//! Each check is a generic function; `suite!` instantiates every one of
//! them as a `#[test]` per implementation.
#![allow(unsafe_code)]

use std::io::IoSlice;
use std::mem::MaybeUninit;
use std::sync::atomic::AtomicU32;
use std::time::{Duration, Instant};

use rustix::io::Errno;

use super::{Memory, Packet, RegionMap, Transport, FDS_PER_PACKET};
use crate::buf::{RawIoVec, UbufMut};

/// Receives one packet into a fresh buffer of `room` bytes.
fn recv<T: Transport>(
    fd: T::BorrowedFd<'_>,
    room: usize,
    control: bool,
    dontwait: bool,
) -> Result<(Vec<u8>, Packet<T::Fd>), Errno> {
    let mut buf = vec![MaybeUninit::uninit(); room];
    let mut ubuf = UbufMut::new(&mut buf);
    let packet = {
        let mut iov = [RawIoVec::EMPTY; 1];
        let n = ubuf.io_vecs(&mut iov);
        T::recv(fd, &mut iov[..n], control, dontwait)?
    };
    // SAFETY: the receive wrote `packet.len` bytes (at most the room it was
    // lent) at the start of `ubuf`.
    unsafe { ubuf.advance(packet.len.min(room)) };
    Ok((ubuf.filled_bytes().to_vec(), packet))
}

/// Sends `bytes` as one packet, with `fds`.
fn send<T: Transport>(fd: T::BorrowedFd<'_>, bytes: &[u8], fds: &[T::BorrowedFd<'_>]) {
    assert_eq!(T::send(fd, &[IoSlice::new(bytes)], fds), Ok(bytes.len()));
}

/// Packets keep their boundaries and order, gathered from many slices.
fn packets_keep_their_boundaries<T: Transport>() {
    let (a, b) = T::pair().unwrap();
    let parts = [
        IoSlice::new(b"head"),
        IoSlice::new(b""),
        IoSlice::new(b"-tail"),
    ];
    assert_eq!(T::send(T::borrow(&a), &parts, &[]), Ok(9));
    send::<T>(T::borrow(&a), &[7; 1000], &[]);
    send::<T>(T::borrow(&a), b"x", &[]);
    let (first, packet) = recv::<T>(T::borrow(&b), 4096, false, true).unwrap();
    assert_eq!(
        (first.as_slice(), packet.truncated),
        (&b"head-tail"[..], false)
    );
    let (second, _) = recv::<T>(T::borrow(&b), 4096, false, true).unwrap();
    assert_eq!(second, vec![7; 1000]);
    let mut small = [MaybeUninit::uninit(); 16];
    assert_eq!(T::recv_whole(T::borrow(&b), &mut small, true), Ok(1));
}

/// The small path puts the header and the parts in one packet.
fn small_sends_are_one_packet<T: Transport>() {
    let (a, b) = T::pair().unwrap();
    let parts = [IoSlice::new(b"pay"), IoSlice::new(b"load")];
    assert_eq!(T::try_send_small(T::borrow(&a), b"HDR:", &parts, 7), Ok(11));
    let (got, _) = recv::<T>(T::borrow(&b), 64, false, true).unwrap();
    assert_eq!(got, b"HDR:payload");
}

/// A packet longer than the buffer is cut, and says so; `recv_whole`
/// reports its whole length; the next packet is intact.
fn a_long_packet_is_truncated<T: Transport>() {
    let (a, b) = T::pair().unwrap();
    send::<T>(T::borrow(&a), &[1; 100], &[]);
    send::<T>(T::borrow(&a), &[2; 100], &[]);
    send::<T>(T::borrow(&a), &[3; 10], &[]);
    let (got, packet) = recv::<T>(T::borrow(&b), 10, false, true).unwrap();
    assert_eq!((got, packet.truncated), (vec![1; 10], true));
    let mut small = [MaybeUninit::uninit(); 10];
    assert_eq!(T::recv_whole(T::borrow(&b), &mut small, true), Ok(100));
    let (got, packet) = recv::<T>(T::borrow(&b), 10, false, true).unwrap();
    assert_eq!((got, packet.truncated), (vec![3; 10], false));
}

/// An empty queue would block: `EAGAIN`, for every kind of read.
fn an_empty_queue_would_block<T: Transport>() {
    let (_a, b) = T::pair().unwrap();
    assert!(matches!(
        recv::<T>(T::borrow(&b), 16, true, true),
        Err(Errno::AGAIN)
    ));
    let mut buf = [MaybeUninit::uninit(); 16];
    assert_eq!(
        T::recv_whole(T::borrow(&b), &mut buf, true),
        Err(Errno::AGAIN)
    );
    assert_eq!(T::peek(T::borrow(&b), &mut buf), Err(Errno::AGAIN));
    assert_eq!(T::queued(T::borrow(&b)), Ok(0));
    assert!(!T::hung_up(T::borrow(&b)));
}

/// A peek leaves the packet queued; `queued` counts every queued byte.
fn a_peek_leaves_the_packet<T: Transport>() {
    let (a, b) = T::pair().unwrap();
    send::<T>(T::borrow(&a), b"peekaboo", &[]);
    send::<T>(T::borrow(&a), b"!", &[]);
    assert_eq!(T::queued(T::borrow(&b)), Ok(9));
    let mut buf = [MaybeUninit::uninit(); 4];
    assert_eq!(T::peek(T::borrow(&b), &mut buf), Ok(&b"peek"[..]));
    let (got, _) = recv::<T>(T::borrow(&b), 64, false, true).unwrap();
    assert_eq!(got, b"peekaboo");
}

/// Descriptors travel with their packet, in order, and work at the other
/// end; read without `control`, they are closed.
fn descriptors_travel_in_order<T: Transport>() {
    let (a, b) = T::pair().unwrap();
    let (x1, y1) = T::pair().unwrap();
    let (x2, y2) = T::pair().unwrap();
    send::<T>(T::borrow(&a), b"fds", &[T::borrow(&x1), T::borrow(&x2)]);
    let (got, packet) = recv::<T>(T::borrow(&b), 64, true, true).unwrap();
    assert_eq!((got.as_slice(), packet.fds.len()), (&b"fds"[..], 2));
    assert!(!packet.control_truncated);
    for (i, fd) in packet.fds.iter().enumerate() {
        send::<T>(T::borrow(fd), &[i as u8], &[]);
    }
    assert_eq!(recv::<T>(T::borrow(&y1), 8, false, true).unwrap().0, [0]);
    assert_eq!(recv::<T>(T::borrow(&y2), 8, false, true).unwrap().0, [1]);

    // Sent, then closed here; read without a control buffer: closed there.
    send::<T>(T::borrow(&a), b"lost", &[T::borrow(&x1)]);
    drop((x1, packet));
    let (got, packet) = recv::<T>(T::borrow(&b), 64, false, true).unwrap();
    assert_eq!((got.as_slice(), packet.fds.len()), (&b"lost"[..], 0));
    assert!(T::hung_up(T::borrow(&y1)));
    assert!(!T::hung_up(T::borrow(&y2)));
}

/// A packet carries [`FDS_PER_PACKET`] descriptors, all received in one
/// read; one more is refused (`ETOOMANYREFS`) and nothing is sent.
fn a_packet_carries_fds_per_packet_descriptors<T: Transport>() {
    let (a, b) = T::pair().unwrap();
    let (x, _y) = T::pair().unwrap();
    let fds = vec![T::borrow(&x); FDS_PER_PACKET + 1];
    assert_eq!(
        T::send(T::borrow(&a), &[IoSlice::new(b"many")], &fds).map(drop),
        Err(Errno::TOOMANYREFS)
    );
    send::<T>(T::borrow(&a), b"full", &fds[..FDS_PER_PACKET]);
    let (got, packet) = recv::<T>(T::borrow(&b), 64, true, true).unwrap();
    assert_eq!(
        (got.as_slice(), packet.fds.len()),
        (&b"full"[..], FDS_PER_PACKET)
    );
    assert!(!packet.control_truncated);
    let x = T::identity(T::borrow(&x));
    assert!(packet.fds.iter().all(|fd| T::identity(T::borrow(fd)) == x));
    assert!(matches!(
        recv::<T>(T::borrow(&b), 64, true, true),
        Err(Errno::AGAIN)
    ));
}

/// A closed peer: queued packets are still read, then a read of zero bytes
/// is the end; `hung_up` says so; a send to it fails, without a signal.
fn a_closed_peer_hangs_up<T: Transport>() {
    let (a, b) = T::pair().unwrap();
    send::<T>(T::borrow(&a), b"last words", &[]);
    drop(a);
    assert!(T::hung_up(T::borrow(&b)));
    assert!(T::read_hung_up(T::borrow(&b)));
    let deadline = Instant::now() + Duration::from_secs(5);
    assert!(T::wait_readable(T::borrow(&b), deadline).unwrap());
    let (got, _) = recv::<T>(T::borrow(&b), 64, false, false).unwrap();
    assert_eq!(got, b"last words");
    let (got, packet) = recv::<T>(T::borrow(&b), 64, false, false).unwrap();
    assert_eq!((got.len(), packet.len), (0, 0));
    let mut buf = [MaybeUninit::uninit(); 16];
    assert_eq!(T::recv_whole(T::borrow(&b), &mut buf, false), Ok(0));
    let sent = T::send(T::borrow(&b), &[IoSlice::new(b"anyone?")], &[]);
    assert!(
        matches!(sent, Err(Errno::PIPE | Errno::CONNRESET)),
        "{sent:?}"
    );
}

/// `wait_readable` times out on a quiet end, and returns at once on one
/// with a packet.
fn waits_time_out<T: Transport>() {
    let (a, b) = T::pair().unwrap();
    let soon = Instant::now() + Duration::from_millis(20);
    assert!(!T::wait_readable(T::borrow(&b), soon).unwrap());
    assert!(Instant::now() >= soon);
    send::<T>(T::borrow(&a), b"now", &[]);
    let later = Instant::now() + Duration::from_secs(5);
    assert!(T::wait_readable(T::borrow(&b), later).unwrap());
}

/// A blocking receive waits for a packet sent from another thread.
fn a_blocking_receive_waits<T: Transport>()
where
    T::Fd: 'static,
{
    let (a, b) = T::pair().unwrap();
    let sender = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(10));
        send::<T>(T::borrow(&a), b"late", &[]);
        a
    });
    let (got, _) = recv::<T>(T::borrow(&b), 64, false, false).unwrap();
    assert_eq!(got, b"late");
    drop(sender.join().unwrap());
}

/// The largest packet goes whole; a larger one is refused, and nothing is
/// sent.
fn packets_are_bounded<T: Transport>() {
    let (a, b) = T::pair().unwrap();
    let max = T::max_packet();
    let big = vec![9u8; max + 1];
    let refused = T::send(T::borrow(&a), &[IoSlice::new(&big)], &[]);
    assert!(
        matches!(refused, Err(Errno::MSGSIZE | Errno::NOBUFS)),
        "{refused:?}"
    );
    assert_eq!(T::queued(T::borrow(&b)), Ok(0));
    send::<T>(T::borrow(&a), &big[..max], &[]);
    let (got, packet) = recv::<T>(T::borrow(&b), max, false, true).unwrap();
    assert_eq!((got.len(), packet.truncated), (max, false));
}

/// An endpoint is a channel end; a region is not. Duplicates of one
/// endpoint have one identity.
fn channel_ends_are_recognised<T: Transport + Memory>() {
    let (a, b) = T::pair().unwrap();
    assert_eq!(T::check_channel_end(T::borrow(&a)), Ok(()));
    let region = T::create_region("conformance", 4096).unwrap();
    assert!(T::check_channel_end(T::borrow(&region)).is_err());
    assert_ne!(T::identity(T::borrow(&a)), T::identity(T::borrow(&b)));
    assert!(T::identity(T::borrow(&a)).is_some());
}

/// A region: its size, sealing, mappings that share their bytes, and holes.
fn regions_share_their_bytes<T: Memory>() {
    let fd = T::create_region("conformance", 8192).unwrap();
    let (size, key) = T::stat(T::borrow(&fd)).unwrap();
    assert_eq!(size, 8192);
    assert_eq!(T::sealed(T::borrow(&fd)), Ok(false));
    T::allocate(T::borrow(&fd), 8192).unwrap();
    T::seal(T::borrow(&fd)).unwrap();
    assert_eq!(T::sealed(T::borrow(&fd)), Ok(true));
    assert_eq!(T::on_hugetlbfs(T::borrow(&fd)), Ok(false));
    assert!(T::same_file(T::borrow(&fd), T::borrow(&fd)));

    let one = T::map(T::borrow(&fd), 8192).unwrap();
    let two = T::map(T::borrow(&fd), 4096).unwrap();
    assert_eq!((one.len(), two.len()), (8192, 4096));
    assert_eq!(one.as_ptr().addr() % 4096, 0);
    assert_eq!(one.non_null().as_ptr(), one.as_ptr());
    // SAFETY: both mappings are at least 4096 bytes long and alive; no Rust
    // reference points into them.
    unsafe {
        assert_eq!(*two.as_ptr().add(100), 0, "a new region reads as zeros");
        *one.as_ptr().add(100) = 42;
        assert_eq!(*two.as_ptr().add(100), 42, "mappings share their bytes");
    }
    one.punch();
    // SAFETY: as above.
    let punched = unsafe { *two.as_ptr().add(100) };
    assert_eq!(punched, 0, "a punched hole reads as zeros");

    let other = T::create_region("conformance", 4096).unwrap();
    assert!(!T::same_file(T::borrow(&fd), T::borrow(&other)));
    assert_ne!(T::stat(T::borrow(&other)).unwrap().1, key);
}

/// Bytes written into a region show in its mappings.
fn a_written_region_maps_its_bytes<T: Memory>() {
    let fd = T::create_region("conformance", 0).unwrap();
    T::write_all(T::borrow(&fd), b"written ").unwrap();
    T::write_all(T::borrow(&fd), b"in").unwrap();
    T::seal(T::borrow(&fd)).unwrap();
    assert_eq!(T::stat(T::borrow(&fd)).unwrap().0, 10);
    let map = T::map(T::borrow(&fd), 10).unwrap();
    // SAFETY: the mapping is 10 bytes long and alive, and nothing writes it.
    let bytes = unsafe { std::slice::from_raw_parts(map.as_ptr(), 10) };
    assert_eq!(bytes, b"written in");
}

/// A futex wait on a word that moved returns at once, and a wait on a
/// still word returns by its timeout (or earlier, spuriously).
fn futex_waits_return<T: Memory>() {
    let word = AtomicU32::new(1);
    let start = Instant::now();
    T::futex_wait(&word, 0, Duration::from_secs(10));
    T::futex_wait(&word, 1, Duration::from_millis(10));
    T::futex_wake(&word, 1);
    assert!(start.elapsed() < Duration::from_secs(5));
}

/// Instantiates every check of the suite as a test, per implementation:
/// `linux::<check>` and `twin::<check>`.
macro_rules! suite {
    ($($check:ident),* $(,)?) => {
        #[cfg(target_os = "linux")]
        mod linux {
            $(#[test] fn $check() { super::$check::<crate::ipc::platform::linux::Linux>() })*
        }
        mod twin {
            $(#[test] fn $check() { super::$check::<crate::ipc::platform::twin::Twin>() })*
        }
    };
}

suite!(
    packets_keep_their_boundaries,
    small_sends_are_one_packet,
    a_long_packet_is_truncated,
    an_empty_queue_would_block,
    a_peek_leaves_the_packet,
    descriptors_travel_in_order,
    a_packet_carries_fds_per_packet_descriptors,
    a_closed_peer_hangs_up,
    waits_time_out,
    a_blocking_receive_waits,
    packets_are_bounded,
    channel_ends_are_recognised,
    regions_share_their_bytes,
    a_written_region_maps_its_bytes,
    futex_waits_return,
);
