//! A parent process and a worker child over `courier::ipc`: the parent starts
//! a one-shot server and hands its name to the child; the child connects and
//! sends the sender of its request channel; the parent then sends requests,
//! each carrying the channel to answer on.
//!
//! ```sh
//! cargo run -p courier --example ipc_parent_child
//! ```
//!
//! The program runs as the parent, then starts itself again as the child
//! (`child <server name>` on its command line).

use std::process::Command;

use courier::ipc::{self, IpcOneShotServer, IpcSender};
use serde::{Deserialize, Serialize};

/// What the parent asks the child.
#[derive(Debug, Serialize, Deserialize)]
enum Request {
    /// Add these numbers and answer on `reply`.
    Sum {
        numbers: Vec<u64>,
        reply: IpcSender<u64>,
    },
    /// Stop.
    Done,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    match (args.next().as_deref(), args.next()) {
        (Some("child"), Some(server)) => child(server),
        _ => parent(),
    }
}

fn parent() -> Result<(), Box<dyn std::error::Error>> {
    // The rendezvous: its name goes to the child on its command line.
    let (server, name) = IpcOneShotServer::<IpcSender<Request>>::new()?;
    let mut child = Command::new(std::env::current_exe()?)
        .args(["child", &name])
        .spawn()?;

    // The child's first message is where to send it requests.
    let (_bootstrap, to_child) = server.accept()?;
    for n in [10, 100, 1000] {
        let (reply, answer) = ipc::channel()?;
        to_child.send(Request::Sum {
            numbers: (1..=n).collect(),
            reply,
        })?;
        let sum = answer.recv()?;
        assert_eq!(sum, n * (n + 1) / 2);
        println!("parent: the sum of 1..={n} is {sum}");
    }
    to_child.send(Request::Done)?;
    let status = child.wait()?;
    println!("parent: the child exited with {status}");
    Ok(())
}

fn child(server: String) -> Result<(), Box<dyn std::error::Error>> {
    let (requests, incoming) = ipc::channel::<Request>()?;
    IpcSender::<IpcSender<Request>>::connect(server)?.send(requests)?;
    // A parent that dies makes `recv` return `Disconnected`: the loop ends.
    while let Ok(request) = incoming.recv() {
        match request {
            Request::Sum { numbers, reply } => reply.send(numbers.iter().sum())?,
            Request::Done => break,
        }
    }
    Ok(())
}
