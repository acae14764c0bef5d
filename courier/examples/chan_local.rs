//! `courier::chan::local`: a channel for tasks that share one thread, with no
//! atomics and no locks (its ends cannot leave the thread).
//!
//! ```sh
//! cargo run -p courier --example chan_local
//! ```
//!
//! Outside a fiber nothing else on the thread could make a blocking call
//! ready, so this example uses the non-blocking calls, which work anywhere.

use courier::chan::local;

fn main() {
    let (tx, rx) = local::bounded::<String>(2);
    tx.send("one".to_owned()).unwrap();
    tx.try_send("two".to_owned()).unwrap();
    // Full: the message comes back.
    let refused = tx.try_send("three".to_owned()).unwrap_err();
    println!("full, kept: {}", refused.into_inner());
    assert_eq!(rx.try_recv().as_deref(), Ok("one"));
    assert_eq!(rx.recv().as_deref(), Ok("two"));
    drop(tx);
    // Every sender is gone and the queue is empty.
    assert!(rx.try_recv().is_err());
    println!("local channel: done");
}
