//! `courier::chan::local` between fibers of one worker: channels with no
//! atomics and no locks (their ends cannot leave the thread), whose blocking
//! calls park the fiber.
//!
//! ```sh
//! cargo run -p courier --example chan_local
//! ```

use courier::{chan, fiber};

fn main() {
    let rt = fiber::Runtime::builder().workers(1).build().unwrap();
    let total = rt.block_on(|| {
        // A pipeline of three stages, each a fiber pinned to this worker.
        let (numbers_tx, numbers) = chan::local::bounded::<u64>(8);
        let (squares_tx, squares) = chan::local::bounded::<u64>(8);
        let producer = fiber::spawn_local(move || {
            for n in 1..=1000 {
                numbers_tx.send(n).unwrap(); // parks while the channel is full
            }
        });
        let squarer = fiber::spawn_local(move || {
            for n in numbers.iter() {
                squares_tx.send(n * n).unwrap();
            }
        });
        // Ends when every sender is gone and the channel is empty.
        let total: u64 = squares.iter().sum();
        producer.join().unwrap();
        squarer.join().unwrap();
        total
    });
    assert_eq!(total, 333_833_500);
    println!("sum of the first 1000 squares: {total}");
}
