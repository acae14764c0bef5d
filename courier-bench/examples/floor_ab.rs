//! A 64-byte (or any size up to one packet) send+receive on a courier bytes
//! channel against the raw `send`+`recv` floor, alternating in one process,
//! for a change to the small-message path:
//!
//! ```sh
//! cargo build --release -p courier-bench --example floor_ab
//! taskset -c 1 target/release/examples/floor_ab ab 64     # median ratio courier/floor
//! valgrind --tool=callgrind target/release/examples/floor_ab courier 64  # instructions
//! ```
//!
//! `ab`: 40 rounds of 20,000 messages each way, the median ratio and its
//! quartiles. `courier` / `floor`: 100,000 messages of one only (divide a
//! callgrind count by 100,000). `courier_fd`: 100,000 typed messages of
//! `size` bytes and one descriptor (a channel end), for the descriptor path.

use std::hint::black_box;
use std::time::Instant;

use rustix::net::{self, AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType};

fn main() {
    let mut args = std::env::args().skip(1);
    let what = args.next().unwrap_or_default();
    let size: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(64);
    let data = vec![7u8; size];
    let (tx, rx) = courier::ipc::bytes_channel().expect("channel");
    let (fd_tx, fd_rx) =
        courier::ipc::channel::<(serde_bytes::ByteBuf, FdMessage)>().expect("channel");
    let (end, _end_rx) = courier::ipc::channel::<u8>().expect("channel");
    let (a, b) = net::socketpair(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )
    .expect("socketpair");
    let mut out = vec![0u8; size.max(1)];
    let mut courier = || {
        tx.send(&data).expect("send");
        black_box(rx.recv().expect("recv"));
    };
    let mut floor = || {
        net::send(&a, &data, SendFlags::NOSIGNAL).expect("send");
        black_box(net::recv(&b, &mut out[..], RecvFlags::empty()).expect("recv"));
    };
    let courier_fd = || {
        let bytes = serde_bytes::ByteBuf::from(data.clone());
        fd_tx.send((bytes, end.clone())).expect("send");
        black_box(fd_rx.recv().expect("recv"));
    };
    match what.as_str() {
        "courier" => (0..100_000).for_each(|_| courier()),
        "courier_fd" => (0..100_000).for_each(|_| courier_fd()),
        "floor" => (0..100_000).for_each(|_| floor()),
        "ab" => {
            let per_msg = |f: &mut dyn FnMut()| {
                let started = Instant::now();
                (0..20_000).for_each(|_| f());
                started.elapsed().as_nanos() as f64 / 20_000.0
            };
            let mut ratios: Vec<f64> = (0..40)
                .map(|_| per_msg(&mut courier) / per_msg(&mut floor))
                .collect();
            ratios.sort_by(f64::total_cmp);
            println!(
                "{size} B: courier/floor median {:.3} (quartiles {:.3} {:.3})",
                ratios[20], ratios[10], ratios[30]
            );
        }
        _ => eprintln!("usage: floor_ab ab|courier|courier_fd|floor [size]"),
    }
}

/// The descriptor of a `courier_fd` message.
type FdMessage = courier::ipc::IpcSender<u8>;
