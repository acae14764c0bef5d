//! An HTTP/1.1 server on fibers, one fiber per connection, keep-alive, that
//! answers every request with 1,200 bytes (the `/small` page of the Ruby
//! fiber pool's server benchmark).
//!
//! ```sh
//! cargo run --release -p courier --example http_hello -- 127.0.0.1:8080
//! ab -k -c 256 -n 100000 http://127.0.0.1:8080/small
//! ```
//!
//! It prints the address it listens on, then serves until killed. Request
//! heads are parsed with `httparse`; bodies are not expected (a request with
//! one is answered, and its body read as the next request's head fails it).

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

/// Answers the requests of one connection until it closes, or until a
/// request asks to close it (HTTP/1.1 `Connection: close`, or HTTP/1.0
/// without `Connection: keep-alive`).
pub fn serve(mut conn: TcpStream) {
    let _ = conn.set_nodelay(true);
    let response = |keep_alive_header: bool| {
        let connection = match keep_alive_header {
            true => "Connection: keep-alive\r\n",
            false => "",
        };
        let mut r = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n{connection}\r\n",
            BODY.len()
        )
        .into_bytes();
        r.extend_from_slice(&BODY);
        r
    };
    // HTTP/1.1 keeps a connection by default; an HTTP/1.0 client that asks
    // to keep it (`ab -k`) must be told that it is kept, or it waits for a
    // close.
    let (plain, kept_1_0) = (response(false), response(true));
    let mut buf = vec![0u8; 8192];
    let mut filled = 0;
    loop {
        // Every complete request in the buffer gets a response (pipelining
        // included); then read more.
        let mut answered = 0;
        loop {
            let mut headers = [httparse::EMPTY_HEADER; 32];
            let mut request = httparse::Request::new(&mut headers);
            let len = match request.parse(&buf[answered..filled]) {
                Ok(httparse::Status::Complete(len)) => len,
                Ok(httparse::Status::Partial) => break,
                Err(_) => {
                    let _ =
                        conn.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
                    return;
                }
            };
            let http_1_0 = request.version == Some(0);
            let has = |token: &str| {
                request.headers.iter().any(|h| {
                    h.name.eq_ignore_ascii_case("connection")
                        && h.value
                            .split(|&b| b == b',')
                            .any(|t| t.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
                })
            };
            let keep = match http_1_0 {
                true => has("keep-alive"),
                false => !has("close"),
            };
            let response = if keep && http_1_0 { &kept_1_0 } else { &plain };
            if conn.write_all(response).is_err() || !keep {
                return;
            }
            answered += len;
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
