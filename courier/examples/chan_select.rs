//! Threads over `courier::chan`: two producers, one consumer waiting on both
//! channels at once with `select!`, until both are closed.
//!
//! ```sh
//! cargo run -p courier --example chan_select
//! ```

use std::thread;
use std::time::Duration;

use courier::chan;

fn main() {
    let (squares_tx, mut squares) = chan::bounded::<u64>(4);
    let (cubes_tx, mut cubes) = chan::unbounded::<u64>();
    let producers = [
        thread::spawn(move || (1..=10).for_each(|n| squares_tx.send(n * n).unwrap())),
        thread::spawn(move || (1..=10).for_each(|n| cubes_tx.send(n * n * n).unwrap())),
    ];

    let (mut sum_squares, mut sum_cubes) = (0, 0);
    let mut open = 2;
    while open > 0 {
        courier::select! {
            recv(squares) -> message => match message {
                Ok(square) => sum_squares += square,
                // Every sender is gone and the channel is empty: a closed
                // channel stays ready, so swap in one that never is.
                Err(_) => {
                    squares = chan::never();
                    open -= 1;
                }
            },
            recv(cubes) -> message => match message {
                Ok(cube) => sum_cubes += cube,
                Err(_) => {
                    cubes = chan::never();
                    open -= 1;
                }
            },
            default(Duration::from_secs(5)) => panic!("no message in 5 s"),
        }
    }
    for producer in producers {
        producer.join().unwrap();
    }
    assert_eq!((sum_squares, sum_cubes), (385, 3025));
    println!("sum of squares {sum_squares}, sum of cubes {sum_cubes}");
}
