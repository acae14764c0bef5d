//! The `http_hello` example's server (its source, included) answers real
//! HTTP/1.1 requests on 127.0.0.1: several on one keep-alive connection,
//! pipelined ones, and many connections at once.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use courier::fiber::{self, net::TcpListener};

#[path = "../examples/http_hello.rs"]
#[allow(dead_code)]
mod http_hello;

mod watchdog;
use watchdog::with_watchdog;

/// Reads one response: its status line and body.
fn response(reader: &mut BufReader<TcpStream>) -> (String, Vec<u8>) {
    let mut status = String::new();
    reader.read_line(&mut status).unwrap();
    let mut length = 0;
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        if line == "\r\n" {
            break;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            length = v.trim().parse().unwrap();
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).unwrap();
    (status, body)
}

#[test]
fn the_example_server_answers_keep_alive_requests() {
    with_watchdog("http", Duration::from_secs(60), || {
        let rt = fiber::Runtime::builder().workers(2).build().unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let _server = rt.spawn(move || loop {
            let (conn, _) = listener.accept().unwrap();
            fiber::spawn(move || http_hello::serve(conn));
        });
        // Many connections at once, each making three requests (the last two
        // pipelined) on one connection.
        let clients: Vec<_> = (0..50)
            .map(|_| {
                std::thread::spawn(move || {
                    let stream = TcpStream::connect(addr).unwrap();
                    let mut reader = BufReader::new(stream.try_clone().unwrap());
                    let mut writer = stream;
                    let get = b"GET /small HTTP/1.1\r\nHost: localhost\r\n\r\n";
                    writer.write_all(get).unwrap();
                    let (status, body) = response(&mut reader);
                    assert_eq!(status, "HTTP/1.1 200 OK\r\n");
                    assert_eq!(body.len(), 1200);
                    writer.write_all(&[&get[..], &get[..]].concat()).unwrap();
                    for _ in 0..2 {
                        let (status, body) = response(&mut reader);
                        assert_eq!(status, "HTTP/1.1 200 OK\r\n");
                        assert_eq!(body, vec![b'x'; 1200]);
                    }
                })
            })
            .collect();
        for c in clients {
            c.join().unwrap();
        }
        // The runtime is left with its server fiber parked in `accept`.
        std::mem::forget(rt);
    });
}

/// An HTTP/1.0 client that asks to keep the connection (as `ab -k` does) is
/// told so, and one that does not is answered and closed; an HTTP/1.1
/// `Connection: close` closes too.
#[test]
fn connections_close_when_a_request_asks() {
    with_watchdog("http close", Duration::from_secs(60), || {
        let rt = fiber::Runtime::builder().workers(1).build().unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let _server = rt.spawn(move || loop {
            let (conn, _) = listener.accept().unwrap();
            fiber::spawn(move || http_hello::serve(conn));
        });
        let exchange = |request: &[u8]| {
            let mut stream = TcpStream::connect(addr).unwrap();
            stream.write_all(request).unwrap();
            stream.shutdown(std::net::Shutdown::Write).unwrap();
            let mut all = Vec::new();
            stream.read_to_end(&mut all).unwrap();
            String::from_utf8_lossy(&all).into_owned()
        };
        let kept = exchange(b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n");
        assert!(kept.contains("Connection: keep-alive"), "{kept}");
        let closed = exchange(b"GET / HTTP/1.0\r\n\r\nGET / HTTP/1.0\r\n\r\n");
        assert_eq!(
            closed.matches("200 OK").count(),
            1,
            "answered once, then closed"
        );
        let closed = exchange(b"GET / HTTP/1.1\r\nConnection: close\r\n\r\nGET / HTTP/1.1\r\n\r\n");
        assert_eq!(closed.matches("200 OK").count(), 1);
        std::mem::forget(rt);
    });
}
