//! `floor`: the physical limits every other suite is read against.
//!
//! | case | what | why it is a limit |
//! | --- | --- | --- |
//! | `memcpy_warm_<size>` | `copy_from_slice` into memory already touched | no transfer of a payload can beat one copy |
//! | `memcpy_fresh_<size>` | the same into a fresh anonymous mapping (page faults included) | what a transfer pays when it lands in new memory |
//! | `sendrecv_plain_<size>` | one thread: `send(2)` then `recv(2)` of the payload on a `SOCK_SEQPACKET` socketpair, into a reused buffer | the least a socket transport pays per message |
//! | `sendrecv_framed_<size>` | the same with a 40-byte header gathered in front by `sendmsg`, and `recvmsg` scattering the header aside and the payload into a new `Vec` (not zero-filled) | the least a transport pays that frames messages and hands the receiver its own buffer, as `courier::ipc` and ipc-channel both do |
//! | `rtt_socket_<placement>_64b` | 64 B over a `SOCK_SEQPACKET` socketpair and back, two processes | any socket-based channel's round trip |
//! | `rtt_eventfd_<placement>` | write an eventfd, the peer reads it and writes another back | a blocking wake-up each way, no payload |
//! | `rtt_futex_<placement>` | the same with a shared futex word in a memfd | the cheapest blocking wake-up |
//! | `rtt_shm_spin_<placement>` | a sequence number through shared memory, both processes polling | any shared-memory channel's round trip |
//!
//! Round trips are timed one by one (p50 with its spread, p99, and the
//! parent thread's CPU time per round trip, which tells blocking from
//! spinning), in three placements: `pinned` (both on one CPU), `unpinned`
//! (the scheduler's choice) and `split` (one CPU each). Pinned, a spinning
//! waiter yields at once (spinning there only burns the time slice its peer
//! needs); otherwise it polls 128 times between yields (a `pause` costs about
//! 140 cycles on this CPU, so about 8 µs).
//!
//! `sendrecv_framed` calls `recvmsg` through `libc` (rustix's takes only
//! initialised buffers, and zero-filling the payload is exactly the cost a
//! floor must not include): the one `unsafe` use in this suite.
#![allow(unsafe_code)]

use std::hint::black_box;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};

use rustix::event::{eventfd, EventfdFlags};
use rustix::io::Errno;
use rustix::net::{
    recv, send, sendmsg, socketpair, AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType,
};
use rustix::thread::futex;

use crate::harness::child::{inherited_fd, Affinity, Peer, Placement};
use crate::harness::measure::{time_each, Each, Sampled, Sampler};
use crate::harness::mem::{memfd, CopyPair, Mapping, ALIASED, APART};
use crate::harness::report::FLOOR;
use crate::harness::{Case, Ctx, Result};

/// memcpy sizes: 64 KiB (L2), 1 MiB (about the LLC slice), 8 MiB (memory).
const COPY_SIZES: [u64; 3] = [64 << 10, 1 << 20, 8 << 20];
/// The size also measured on the slow placement (`mem::ALIASED`).
const ALIASED_SIZE: u64 = 64 << 10;
/// Sizes of the one-thread send + receive cases: small, and the range where
/// a message is one packet yet large enough for copies to matter.
const SENDRECV_SIZES: [usize; 6] = [64, 8 << 10, 16 << 10, 32 << 10, 64 << 10, 128 << 10];
/// The framing header of `sendrecv_framed` (the size of `courier::ipc`'s).
const FRAME_HEADER: usize = 40;
/// The payload of the socket round trip.
const RTT_BYTES: usize = 64;

/// Offsets of the two words in the shared page, on separate 128-byte lines
/// so the two writers never share a cache line (nor an adjacent-line
/// prefetch pair).
const PING: usize = 0;
const PONG: usize = 128;
const SHM_LEN: usize = 4096;
/// The ping value that tells the child to exit.
const STOP: u32 = u32::MAX;

/// The floor's placements: the two every suite reports, plus `split`
/// (each process on its own CPU), which shows the cross-CPU wake-up on its
/// own and the shared-memory limit when both sides really spin.
const PLACEMENTS: [Placement; 3] = [Placement::Pinned, Placement::Unpinned, Placement::Split];

/// Runs the suite.
pub fn run(ctx: &mut Ctx<'_>) -> Result<()> {
    memcpy(ctx)?;
    let sendrecv_samples = ctx.samples(30, 300);
    for size in SENDRECV_SIZES {
        // About 4 MiB per sample, at least 100 messages.
        let sampler =
            Sampler::new(sendrecv_samples).ops(((4 << 20) / size as u64).clamp(100, 10_000));
        let case = Case::sized("sendrecv_plain", size as u64);
        ctx.status(case.name());
        ctx.record(
            &case,
            FLOOR,
            "sendrecv_ns",
            "ns",
            &sendrecv(&sampler, size)?.wall_ns,
        );
        let case = Case::sized("sendrecv_framed", size as u64);
        ctx.status(case.name());
        let s = sendrecv_framed(&sampler, size)?;
        ctx.record(&case, FLOOR, "sendrecv_ns", "ns", &s.wall_ns);
    }
    let n = ctx.samples(10_000, 100_000);
    let spin_n = ctx.samples(50_000, 1_000_000);
    let warmup = (n / 10).max(100);
    for placement in placements() {
        let case = Case::sized(
            format!("rtt_socket_{}", placement.label()),
            RTT_BYTES as u64,
        );
        ctx.status(case.name());
        let each = socket_rtt(placement, RTT_BYTES, warmup, n)?;
        ctx.record_latencies(&case, FLOOR, "rtt", &each);
    }
    for placement in placements() {
        let case = Case::new(format!("rtt_eventfd_{}", placement.label()));
        ctx.status(case.name());
        let each = eventfd_rtt(placement, warmup, n)?;
        ctx.record_latencies(&case, FLOOR, "rtt", &each);
    }
    for placement in placements() {
        let case = Case::new(format!("rtt_futex_{}", placement.label()));
        ctx.status(case.name());
        let each = shm_rtt(placement, Wait::Futex, warmup, n)?;
        ctx.record_latencies(&case, FLOOR, "rtt", &each);
    }
    for placement in placements() {
        let case = Case::new(format!("rtt_shm_spin_{}", placement.label()));
        ctx.status(case.name());
        let each = shm_rtt(placement, Wait::spin(placement), spin_n / 10, spin_n)?;
        ctx.record_latencies(&case, FLOOR, "rtt", &each);
    }
    ctx.note(format!(
        "round trips: {n} timed after {warmup} untimed (shared-memory spin: {spin_n}); \
         pinned = both processes on one CPU, split = one each, unpinned = the scheduler's choice"
    ));
    Ok(())
}

/// [`PLACEMENTS`], without `split` on a single-CPU machine.
fn placements() -> impl Iterator<Item = Placement> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    PLACEMENTS
        .into_iter()
        .filter(move |&p| p != Placement::Split || cpus >= 2)
}

/// memcpy bandwidth into warm and into freshly mapped memory.
fn memcpy(ctx: &mut Ctx<'_>) -> Result<()> {
    let warm_samples = ctx.samples(200, 8000);
    let fresh_samples = ctx.samples(100, 8000);
    for size in COPY_SIZES {
        let len = size as usize;
        // About 1 MiB per sample, so small copies are not dwarfed by the clocks.
        let ops = ((1 << 20) / size).max(1);
        // The warm copy where the allocator cannot put it on the slow
        // placement (`mem::APART`), and, at the size where that placement is
        // slow, on it (`_aliased`): what two `vec!`s made in turn get.
        let mut placements = vec![("memcpy_warm", APART)];
        if size == ALIASED_SIZE {
            placements.push(("memcpy_warm_aliased", ALIASED));
        }
        for (family, offset) in placements {
            let mut pair = CopyPair::new(len, offset, 0xa5);
            let (src, dst) = pair.split();
            let case = Case::sized(family, size);
            ctx.status(case.name());
            let s = Sampler::new(warm_samples).ops(ops).run(|ops| {
                for _ in 0..ops {
                    dst.copy_from_slice(black_box(src));
                    black_box(&mut *dst);
                }
                Ok::<(), io::Error>(())
            })?;
            record_copy(ctx, &case, size, &s);
        }
        let src = vec![0xa5u8; len];

        let case = Case::sized("memcpy_fresh", size);
        ctx.status(case.name());
        let s = Sampler::new(fresh_samples).run_batched(
            || Mapping::anonymous(len),
            |mapping| {
                let mut mapping = mapping?;
                mapping.as_mut_slice().copy_from_slice(black_box(&src));
                // Returned, so the munmap happens after the clocks stop.
                Ok::<_, io::Error>(mapping)
            },
        )?;
        record_copy(ctx, &case, size, &s);
    }
    let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .unwrap_or_else(|_| "unknown".into());
    ctx.note(format!(
        "memcpy: copy_from_slice (the platform memcpy); warm = source and destination {APART} B \
         apart modulo 4 KiB, aliased = {ALIASED} B (two heap buffers made in turn), which glibc's \
         rep movsb copies slowly on some CPUs; fresh = new anonymous mapping per sample, \
         page faults included, munmap excluded; transparent huge pages: {}",
        thp.trim()
    ));
    Ok(())
}

fn record_copy(ctx: &mut Ctx<'_>, case: &Case, size: u64, s: &Sampled) {
    ctx.record(case, FLOOR, "copy_ns", "ns", &s.wall_ns);
    ctx.record(case, FLOOR, "bytes_per_s", "B/s", &s.bytes_per_s(size));
}

// ===== one-thread send + receive =====

/// The raw-syscall floor of a message in one thread: `send` then `recv` of
/// `size` bytes on a `SOCK_SEQPACKET` socketpair, straight rustix calls. One
/// operation is one message sent and received.
pub fn sendrecv(sampler: &Sampler, size: usize) -> Result<Sampled> {
    let (a, b) = seqpacket_pair()?;
    let msg = vec![0x5au8; size];
    let mut buf = vec![0u8; size.max(1)];
    let sampled = sampler.run(|ops| {
        for _ in 0..ops {
            send(&a, &msg, SendFlags::empty())?;
            let (n, _) = recv(&b, &mut buf[..], RecvFlags::empty())?;
            if n != size {
                return Err(io::Error::other(format!("received {n} of {size} bytes")));
            }
        }
        Ok(())
    })?;
    Ok(sampled)
}

/// [`sendrecv`] as a framing transport must do it: `sendmsg` gathers a
/// `FRAME_HEADER`-byte header and the payload into one packet; `recvmsg`
/// scatters the header into a local array and the payload into a new
/// `Vec`'s spare capacity, which becomes the received message.
pub fn sendrecv_framed(sampler: &Sampler, size: usize) -> Result<Sampled> {
    let (a, b) = seqpacket_pair()?;
    let msg = vec![0x5au8; size];
    let header = [0xc0u8; FRAME_HEADER];
    let sampled = sampler.run(|ops| {
        for _ in 0..ops {
            let parts = [io::IoSlice::new(&header), io::IoSlice::new(&msg)];
            sendmsg(&a, &parts, &mut Default::default(), SendFlags::empty())?;
            let mut head = [0u8; FRAME_HEADER];
            let mut payload = Vec::<u8>::with_capacity(size);
            let mut iov = [
                libc::iovec {
                    iov_base: head.as_mut_ptr().cast(),
                    iov_len: FRAME_HEADER,
                },
                libc::iovec {
                    iov_base: payload.as_mut_ptr().cast(),
                    iov_len: size,
                },
            ];
            // SAFETY: an all-zero `msghdr` is valid (null pointers, zero lengths).
            let mut hdr: libc::msghdr = unsafe { std::mem::zeroed() };
            hdr.msg_iov = iov.as_mut_ptr();
            hdr.msg_iovlen = iov.len();
            // SAFETY: both iovecs point at writable memory of their length
            // (`head`, and `payload`'s spare capacity of `size` bytes), which
            // nothing else references during the call.
            let n = unsafe { libc::recvmsg(b.as_raw_fd(), &mut hdr, 0) };
            if n != (FRAME_HEADER + size) as isize {
                return Err(io::Error::other(format!("received {n} of {size} bytes")));
            }
            // SAFETY: `recvmsg` wrote `size` bytes into the spare capacity.
            unsafe { payload.set_len(size) };
            black_box((head, payload));
        }
        Ok(())
    })?;
    Ok(sampled)
}

fn seqpacket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    Ok(socketpair(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )?)
}

// ===== socket round trip =====

/// Round trips of `size` bytes to a child echoing on a `SOCK_SEQPACKET`
/// socketpair, in `placement`.
pub fn socket_rtt(placement: Placement, size: usize, warmup: usize, n: usize) -> Result<Each> {
    let placed = placement.enter()?;
    let (ours, peer) = socket_echo(&placed, size)?;
    let each = time_each(warmup, n, socket_round_trip(&ours, size))?;
    drop(ours); // EOF: the child exits
    peer.wait()?;
    Ok(each)
}

/// A child echoing messages of up to `size` bytes on a `SOCK_SEQPACKET`
/// socketpair, placed as `placed` says; our end, and the child (which exits
/// when our end is closed).
pub fn socket_echo(placed: &Affinity, size: usize) -> Result<(OwnedFd, Peer)> {
    let (ours, theirs) = seqpacket_pair()?;
    let peer = placed.spawn("floor-echo-socket", &[size.to_string()], &[theirs.as_fd()])?;
    Ok((ours, peer))
}

/// One round trip of `size` bytes through `socket_echo`'s child.
pub fn socket_round_trip(ours: &OwnedFd, size: usize) -> impl FnMut() -> io::Result<()> + '_ {
    let msg = vec![0x5au8; size];
    let mut buf = vec![0u8; size.max(1)];
    move || {
        send(ours, &msg, SendFlags::empty())?;
        let (got, _) = recv(ours, &mut buf[..], RecvFlags::empty())?;
        if got != size {
            return Err(io::Error::other(format!("echoed {got} of {size} bytes")));
        }
        Ok(())
    }
}

/// Child: echo every message on descriptor 0 until EOF. Args: max size.
pub fn echo_socket(args: &[String]) -> Result<()> {
    let size: usize = arg(args, 0)?;
    let fd = inherited_fd(0)?;
    let mut buf = vec![0u8; size.max(1)];
    loop {
        let (n, _) = recv(&fd, &mut buf[..], RecvFlags::empty())?;
        if n == 0 {
            return Ok(()); // EOF: the parent is done
        }
        send(&fd, &buf[..n], SendFlags::empty())?;
    }
}

// ===== eventfd round trip =====

/// Round trips of a wake-up through two eventfds (ping, pong).
fn eventfd_rtt(placement: Placement, warmup: usize, n: usize) -> Result<Each> {
    let placed = placement.enter()?;
    let ping = eventfd(0, EventfdFlags::CLOEXEC)?;
    let pong = eventfd(0, EventfdFlags::CLOEXEC)?;
    let peer = placed.spawn("floor-echo-eventfd", &[], &[ping.as_fd(), pong.as_fd()])?;
    let mut word = [0u8; 8];
    let each = time_each(warmup, n, || {
        rustix::io::write(&ping, &1u64.to_ne_bytes())?;
        rustix::io::read(&pong, &mut word)?;
        Ok::<(), io::Error>(())
    })?;
    rustix::io::write(&ping, &u64::from(STOP).to_ne_bytes())?;
    peer.wait()?;
    Ok(each)
}

/// Child: read eventfd 0, write eventfd 1, until the count read is `STOP`.
pub fn echo_eventfd(_args: &[String]) -> Result<()> {
    let (ping, pong) = (inherited_fd(0)?, inherited_fd(1)?);
    let mut word = [0u8; 8];
    loop {
        rustix::io::read(&ping, &mut word)?;
        if u64::from_ne_bytes(word) >= u64::from(STOP) {
            return Ok(());
        }
        rustix::io::write(&pong, &1u64.to_ne_bytes())?;
    }
}

// ===== shared-memory round trips (futex or spinning) =====

/// How a side waits for the other's word to change.
#[derive(Clone, Copy, Debug)]
enum Wait {
    /// `FUTEX_WAIT` on the shared word (not process-private); the writer
    /// always calls `FUTEX_WAKE`.
    Futex,
    /// Poll, yielding the CPU after this many polls.
    Spin { polls_per_yield: u32 },
}

impl Wait {
    fn spin(placement: Placement) -> Wait {
        let polls_per_yield = match placement {
            Placement::Pinned => 0,
            Placement::Unpinned | Placement::Split => 128,
        };
        Wait::Spin { polls_per_yield }
    }

    fn role(self) -> (&'static str, Vec<String>) {
        match self {
            Wait::Futex => ("floor-echo-futex", vec![]),
            Wait::Spin { polls_per_yield } => {
                ("floor-echo-spin", vec![polls_per_yield.to_string()])
            }
        }
    }

    /// Waits until `word` is no longer `old`; returns the new value.
    /// `alive` is asked now and then (after a futex timeout, every 4096
    /// yields) so a dead peer cannot hang the waiter.
    fn until_changed(
        self,
        word: &AtomicU32,
        old: u32,
        mut alive: impl FnMut() -> bool,
    ) -> io::Result<u32> {
        let dead = || io::Error::other("peer process died");
        let mut polls = 0u32;
        let mut yields = 0u32;
        loop {
            let now = word.load(Ordering::Acquire); // SYNC POINT: the peer's Release store
            if now != old {
                return Ok(now);
            }
            match self {
                Wait::Futex => {
                    let second = rustix::time::Timespec {
                        tv_sec: 1,
                        tv_nsec: 0,
                    };
                    match futex::wait(word, futex::Flags::empty(), old, Some(&second)) {
                        Ok(()) | Err(Errno::AGAIN) | Err(Errno::INTR) => {}
                        Err(Errno::TIMEDOUT) if alive() => {}
                        Err(Errno::TIMEDOUT) => return Err(dead()),
                        Err(e) => return Err(e.into()),
                    }
                }
                Wait::Spin { polls_per_yield } => {
                    if polls < polls_per_yield {
                        polls += 1;
                        std::hint::spin_loop();
                    } else {
                        polls = 0;
                        yields += 1;
                        if yields.is_multiple_of(4096) && !alive() {
                            return Err(dead());
                        }
                        rustix::thread::sched_yield();
                    }
                }
            }
        }
    }

    /// Publishes `value` in `word` and, for a futex, wakes the waiter.
    fn publish(self, word: &AtomicU32, value: u32) -> io::Result<()> {
        word.store(value, Ordering::Release); // SYNC POINT: the peer's Acquire load
        if let Wait::Futex = self {
            futex::wake(word, futex::Flags::empty(), 1)?;
        }
        Ok(())
    }
}

/// Round trips of a sequence number through a shared memfd page: the parent
/// bumps PING, the child copies it to PONG.
fn shm_rtt(placement: Placement, wait: Wait, warmup: usize, n: usize) -> Result<Each> {
    let placed = placement.enter()?;
    let fd = memfd("courier-bench-floor", SHM_LEN as u64)?;
    let map = Mapping::shared(&fd, SHM_LEN)?;
    let (ping, pong) = (map.atomic_u32(PING), map.atomic_u32(PONG));
    let (role, args) = wait.role();
    let mut peer: Peer = placed.spawn(role, &args, &[fd.as_fd()])?;
    let mut seq = 0u32;
    let each = time_each(warmup, n, || {
        seq += 1;
        wait.publish(ping, seq)?;
        let mut back = pong.load(Ordering::Acquire);
        while back != seq {
            back = wait.until_changed(pong, back, || peer.is_running())?;
        }
        Ok::<(), io::Error>(())
    })?;
    wait.publish(ping, STOP)?;
    peer.wait()?;
    Ok(each)
}

fn echo_shm(wait: Wait) -> Result<()> {
    let map = Mapping::shared(inherited_fd(0)?, SHM_LEN)?;
    let (ping, pong) = (map.atomic_u32(PING), map.atomic_u32(PONG));
    let mut last = 0;
    loop {
        // The parent dying kills us (PDEATHSIG), so no liveness check here.
        last = wait.until_changed(ping, last, || true)?;
        if last == STOP {
            return Ok(());
        }
        wait.publish(pong, last)?;
    }
}

/// Child: echo PING into PONG with futex waits and wakes.
pub fn echo_futex(_args: &[String]) -> Result<()> {
    echo_shm(Wait::Futex)
}

/// Child: echo PING into PONG, polling. Args: polls per yield.
pub fn echo_spin(args: &[String]) -> Result<()> {
    echo_shm(Wait::Spin {
        polls_per_yield: arg(args, 0)?,
    })
}

/// Parses the `i`-th role argument.
fn arg<T: std::str::FromStr>(args: &[String], i: usize) -> Result<T> {
    args.get(i)
        .and_then(|a| a.parse().ok())
        .ok_or_else(|| format!("role argument {i} missing or malformed: {args:?}").into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_publish_pairs_within_one_process() {
        let map = Mapping::anonymous(SHM_LEN).unwrap();
        let word = map.atomic_u32(PONG);
        for wait in [Wait::Futex, Wait::Spin { polls_per_yield: 4 }] {
            wait.publish(word, 5).unwrap();
            assert_eq!(wait.until_changed(word, 4, || true).unwrap(), 5);
        }
    }

    #[test]
    fn a_dead_peer_ends_a_spin_wait() {
        let map = Mapping::anonymous(SHM_LEN).unwrap();
        let word = map.atomic_u32(PING);
        let err = Wait::Spin { polls_per_yield: 0 }
            .until_changed(word, 0, || false)
            .unwrap_err();
        assert_eq!(err.to_string(), "peer process died");
    }

    #[test]
    fn role_args_parse() {
        let args = vec!["64".to_string()];
        assert_eq!(arg::<usize>(&args, 0).unwrap(), 64);
        assert!(arg::<usize>(&args, 1).is_err());
        assert!(arg::<u32>(&["x".to_string()], 0).is_err());
    }

    #[test]
    fn sendrecv_moves_every_message() {
        let s = sendrecv(&Sampler::new(3).warmup(1).ops(10), 22).unwrap();
        assert_eq!((s.ops, s.wall_ns.len()), (10, 3));
    }

    #[test]
    fn sendrecv_framed_moves_every_message_whole() {
        // Any short read is an error, so finishing means every packet
        // arrived whole, header and payload.
        for size in [1, 8 << 10, 128 << 10] {
            let s = sendrecv_framed(&Sampler::new(2).warmup(1).ops(5), size).unwrap();
            assert_eq!((s.ops, s.wall_ns.len()), (5, 2));
        }
    }
}
