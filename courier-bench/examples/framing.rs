//! Ways to move one framed message through a `SOCK_SEQPACKET` socketpair in
//! one thread, next to courier's and ipc-channel's bytes channels: the
//! measurements behind the choice of `courier::ipc`'s send and receive paths
//! between 4 KiB and one packet (`docs/kept-regions.md`). The `kept` way
//! copies the payload into a shared mapping both ends keep and sends only the
//! header through the socket; the receiver copies it out into a new `Vec`
//! (what `courier::ipc`'s kept regions do).
//!
//! `cargo run --release -p courier-bench --example framing -- 8192 16384 65536`
//! prints the median ns per message (send + receive) of each way, over 21
//! runs of a fixed count.
#![allow(unsafe_code)]

use std::hint::black_box;
use std::io::IoSlice;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Instant;

use rustix::net::{self, AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType};

/// The header every framed way sends in front of the payload.
const HEADER: usize = 40;

fn median_ns(count: usize, mut f: impl FnMut()) -> f64 {
    for _ in 0..count / 10 {
        f();
    }
    let mut runs: Vec<f64> = (0..21)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..count {
                f();
            }
            start.elapsed().as_nanos() as f64 / count as f64
        })
        .collect();
    runs.sort_by(f64::total_cmp);
    runs[runs.len() / 2]
}

/// `recvmsg` scattering one packet over `iov` (no control buffer); returns its length.
fn recvmsg_into(fd: &OwnedFd, iov: &mut [libc::iovec]) -> usize {
    // SAFETY: an all-zero `msghdr` is valid (null pointers, zero lengths).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = iov.len();
    // SAFETY: the caller's iovecs point at writable memory of their lengths
    // that nothing else references during the call.
    let n = unsafe { libc::recvmsg(fd.as_raw_fd(), &mut msg, 0) };
    usize::try_from(n).expect("recvmsg failed")
}

/// Receives one packet into a new `Vec` of `size` bytes behind a header
/// array, scattered by the kernel (no zero-fill).
fn recv_scattered(fd: &OwnedFd, size: usize) -> ([u8; HEADER], Vec<u8>) {
    let mut head = [0u8; HEADER];
    let mut payload = Vec::<u8>::with_capacity(size);
    let mut iov = [
        libc::iovec {
            iov_base: head.as_mut_ptr().cast(),
            iov_len: HEADER,
        },
        libc::iovec {
            iov_base: payload.as_mut_ptr().cast(),
            iov_len: size,
        },
    ];
    let n = recvmsg_into(fd, &mut iov);
    assert_eq!(n, HEADER + size, "short packet");
    // SAFETY: `recvmsg` wrote the `size` payload bytes into the spare capacity.
    unsafe { payload.set_len(size) };
    (head, payload)
}

/// A shared anonymous mapping standing in for a region both ends keep mapped.
struct SharedArea {
    ptr: *mut u8,
    len: usize,
}

impl SharedArea {
    fn new(len: usize) -> Self {
        // SAFETY: a fresh anonymous mapping (null hint) aliases no Rust object.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(ptr, libc::MAP_FAILED, "mmap");
        SharedArea {
            ptr: ptr.cast(),
            len,
        }
    }

    fn write(&self, data: &[u8]) {
        assert!(data.len() <= self.len);
        // SAFETY: `data.len() <= len` bytes of our own mapping, which no
        // reference points into; `data` cannot overlap it.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr, data.len()) };
    }

    fn read(&self, n: usize) -> Vec<u8> {
        assert!(n <= self.len);
        let mut out = Vec::with_capacity(n);
        // SAFETY: `n <= len` bytes of the mapping into `out`'s spare
        // capacity of at least `n` bytes, which cannot overlap it.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr, out.as_mut_ptr(), n) };
        // SAFETY: the copy initialised the first `n` bytes.
        unsafe { out.set_len(n) };
        out
    }
}

impl Drop for SharedArea {
    fn drop(&mut self) {
        // SAFETY: exactly the range `mmap` returned, no longer referenced.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

fn main() {
    let sizes: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("sizes in bytes"))
        .collect();
    let sizes = if sizes.is_empty() {
        vec![4096, 8192, 16384, 32768, 65536, 131072]
    } else {
        sizes
    };
    let (a, b) = net::socketpair(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )
    .expect("socketpair");
    let header = [0xc0u8; HEADER];
    let mut scratch = vec![0u8; 1 << 18];
    let mut staging: Vec<u8> = Vec::with_capacity(1 << 18);
    let (ctx, crx) = courier::ipc::bytes_channel().expect("courier channel");
    let (itx, irx) = ipc_channel::ipc::bytes_channel().expect("ipc-channel channel");
    let shared = SharedArea::new(1 << 18);
    println!(
        "size     plain  copy+send/scatter  gather/scatter  gather/recv+copy  kept  courier  ipc-channel"
    );
    for size in sizes {
        let data = vec![7u8; size];
        let count = (100_000_000 / (size + 2000)).max(100);
        let plain = median_ns(count, || {
            net::send(&a, &data, SendFlags::empty()).expect("send");
            black_box(net::recv(&b, &mut scratch[..], RecvFlags::empty()).expect("recv"));
        });
        let copy_send = median_ns(count, || {
            staging.clear();
            staging.extend_from_slice(&header);
            staging.extend_from_slice(&data);
            net::send(&a, &staging, SendFlags::empty()).expect("send");
            black_box(recv_scattered(&b, size));
        });
        let gather = median_ns(count, || {
            let parts = [IoSlice::new(&header), IoSlice::new(&data)];
            net::sendmsg(&a, &parts, &mut Default::default(), SendFlags::empty()).expect("sendmsg");
            black_box(recv_scattered(&b, size));
        });
        let copy_out = median_ns(count, || {
            let parts = [IoSlice::new(&header), IoSlice::new(&data)];
            net::sendmsg(&a, &parts, &mut Default::default(), SendFlags::empty()).expect("sendmsg");
            let (n, _) = net::recv(&b, &mut scratch[..], RecvFlags::empty()).expect("recv");
            black_box(scratch[HEADER..n].to_vec());
        });
        let kept = median_ns(count, || {
            shared.write(&data);
            net::send(&a, &header, SendFlags::empty()).expect("send");
            let (n, _) = net::recv(&b, &mut scratch[..], RecvFlags::empty()).expect("recv");
            assert_eq!(n, HEADER, "a bare header");
            black_box(shared.read(size));
        });
        let courier = median_ns(count, || {
            ctx.send(&data).expect("courier send");
            black_box(crx.recv().expect("courier recv"));
        });
        let ipc_channel = median_ns(count, || {
            itx.send(&data).expect("ipc-channel send");
            black_box(irx.recv().expect("ipc-channel recv"));
        });
        println!(
            "{size:<8} {plain:>5.0}  {copy_send:>17.0}  {gather:>14.0}  {copy_out:>16.0}  {kept:>4.0}  {courier:>7.0}  {ipc_channel:>11.0}"
        );
    }
}
