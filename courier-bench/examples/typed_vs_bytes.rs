//! A typed message whose payload is a `serde_bytes` field against a bytes
//! channel carrying the same payload, alternating in one process: what the
//! typed path costs over the bytes path for a byte payload
//! (`docs/serde-byte-strings.md`):
//!
//! ```sh
//! cargo build --release -p courier-bench --example typed_vs_bytes
//! target/release/examples/typed_vs_bytes 65536
//! ```
//!
//! 40 rounds of 500 messages each way; prints both medians and the median
//! ratio typed/bytes with its quartiles. As in the `ipc` suite, the typed
//! side sends back the value it received last.

use std::hint::black_box;
use std::time::Instant;

use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Blob(#[serde(with = "serde_bytes")] Vec<u8>);

fn main() {
    let size: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(65536);
    let data = vec![7u8; size];
    let (btx, brx) = courier::ipc::bytes_channel().expect("channel");
    let (ttx, trx) = courier::ipc::channel::<Blob>().expect("channel");
    let mut value = Some(Blob(data.clone()));
    let mut bytes = || {
        btx.send(&data).expect("send");
        black_box(brx.recv().expect("recv"));
    };
    let mut typed = || {
        ttx.send(value.take().expect("received back"))
            .expect("send");
        value = Some(black_box(trx.recv().expect("recv")));
    };
    let per_msg = |f: &mut dyn FnMut()| {
        let started = Instant::now();
        (0..500).for_each(|_| f());
        started.elapsed().as_nanos() as f64 / 500.0
    };
    let (mut b, mut t, mut r) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..40 {
        let (x, y) = (per_msg(&mut bytes), per_msg(&mut typed));
        b.push(x);
        t.push(y);
        r.push(y / x);
    }
    for v in [&mut b, &mut t, &mut r] {
        v.sort_by(f64::total_cmp);
    }
    println!(
        "{size} B: bytes {:.0} ns, typed {:.0} ns, typed/bytes median {:.3} (quartiles {:.3} {:.3})",
        b[20], t[20], r[20], r[10], r[30]
    );
}
