//! An HTTP/1.1 server on fibers, one fiber per connection, keep-alive, that
//! answers every request with 1,200 bytes (the `/small` page of the Ruby
//! fiber pool's server benchmark).
//!
//! ```sh
//! cargo run --release -p courier --example http_hello -- 127.0.0.1:8080
//! ab -k -c 256 -n 100000 http://127.0.0.1:8080/small
//! ```
//!
//! It prints the address it listens on, then serves until killed.

use std::io::{self, Read, Write};

use courier::fiber::{self, net::TcpListener, net::TcpStream};

/// The body of every response.
const BODY: [u8; 1200] = [b'x'; 1200];

fn main() -> io::Result<()> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:8080".to_owned());
    let rt = fiber::Runtime::new()?;
    rt.block_on(move || -> io::Result<()> {
        let listener = TcpListener::bind(&addr)?;
        println!("listening on {}", listener.local_addr()?);
        loop {
            let (conn, _) = listener.accept()?;
            fiber::spawn(move || serve(conn));
        }
    })
}

/// Answers the requests of one connection until it closes.
pub fn serve(mut conn: TcpStream) {
    let _ = conn.set_nodelay(true);
    let head = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n",
        BODY.len()
    );
    let mut response = head.into_bytes();
    response.extend_from_slice(&BODY);
    let mut buf = vec![0u8; 8192];
    let mut filled = 0;
    loop {
        // Every complete request in the buffer gets a response (pipelining
        // included); then read more.
        let mut answered = 0;
        while let Some(end) = find_end(&buf[answered..filled]) {
            if conn.write_all(&response).is_err() {
                return;
            }
            answered += end;
        }
        buf.copy_within(answered..filled, 0);
        filled -= answered;
        if filled == buf.len() {
            return; // a request head over 8 KiB: not ours to serve
        }
        match conn.read(&mut buf[filled..]) {
            Ok(0) | Err(_) => return,
            Ok(n) => filled += n,
        }
    }
}

/// The length of the first request head in `bytes`, if it is complete.
fn find_end(bytes: &[u8]) -> Option<usize> {
    bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| i + 4)
}
