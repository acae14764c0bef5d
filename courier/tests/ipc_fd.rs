//! Descriptors inside typed messages: `ipc::IpcFd` and `ipc::as_fd`, in one
//! process and across a real one, past the per-message limit, and into a
//! receiver that is out of descriptors.
//!
//! The child roles run in this test binary re-executed (`/proc/self/exe`),
//! as `ipc_xprocess.rs` does: only `child_entry` runs there, reading its
//! role from `COURIER_FD_ROLE`.

use std::fs::File;
use std::io::{Read, Seek, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::process::{Command, Stdio};
use std::time::Duration;

use courier::ipc::{self, IpcFd, IpcOneShotServer, IpcReceiver, IpcSender, MAX_FDS};
use serde::{Deserialize, Serialize};

mod common;
use common::fd_check;

const ROLE: &str = "COURIER_FD_ROLE";
const SERVER: &str = "COURIER_FD_SERVER";
const PATIENCE: Duration = Duration::from_secs(60);

/// A file of `bytes` whose name is already gone.
fn file_with(bytes: &[u8]) -> File {
    let path = std::env::temp_dir().join(format!(
        "courier-ipc-fd-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    std::fs::remove_file(&path).unwrap();
    file.write_all(bytes).unwrap();
    file.rewind().unwrap();
    file
}

/// One of each: what the parent hands its child.
#[derive(Serialize, Deserialize)]
struct Kit {
    file: IpcFd,
    #[serde(with = "courier::ipc::as_fd")]
    stream: UnixStream,
    #[serde(with = "courier::ipc::as_fd")]
    listener: TcpListener,
    /// What the child found in the file.
    reply: IpcSender<String>,
}

#[test]
fn descriptors_of_every_kind_arrive_and_work_in_one_process() {
    let _check = fd_check();
    let (tx, rx) = ipc::channel::<Kit>().unwrap();
    let (ours, theirs) = UnixStream::pair().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (reply, replies) = ipc::channel::<String>().unwrap();
    tx.send(Kit {
        file: file_with(b"a file's bytes").into(),
        stream: theirs,
        listener,
        reply,
    })
    .unwrap();
    let kit = rx.recv().unwrap();
    let mut text = String::new();
    File::from(kit.file).read_to_string(&mut text).unwrap();
    kit.reply.send(text).unwrap();
    assert_eq!(replies.recv().unwrap(), "a file's bytes");
    (&kit.stream).write_all(b"ping").unwrap();
    let mut ping = [0u8; 4];
    (&ours).read_exact(&mut ping).unwrap();
    assert_eq!(&ping, b"ping");
    let client = TcpStream::connect(addr).unwrap();
    let (accepted, _) = kit.listener.accept().unwrap();
    assert_eq!(accepted.peer_addr().unwrap(), client.local_addr().unwrap());
}

/// The child's side: receives one `Kit` and uses each descriptor.
fn serve_kit(server: String) {
    let (tx, rx) = ipc::channel::<Kit>().unwrap();
    IpcSender::<IpcSender<Kit>>::connect(server)
        .unwrap()
        .send(tx)
        .unwrap();
    let kit = rx.recv().unwrap();
    let mut text = String::new();
    File::from(kit.file).read_to_string(&mut text).unwrap();
    kit.reply.send(text).unwrap();
    (&kit.stream).write_all(b"from the child").unwrap();
    let (mut accepted, _) = kit.listener.accept().unwrap();
    accepted.write_all(b"accepted by the child").unwrap();
}

/// Starts this binary as a child playing `role`, connected through a
/// one-shot server whose first message is of type `T`.
fn spawn_child<T>(role: &str) -> (std::process::Child, T)
where
    T: for<'de> Deserialize<'de> + Serialize,
{
    let (server, name) = IpcOneShotServer::<T>::new().unwrap();
    let child = Command::new("/proc/self/exe")
        .args([
            "child_entry",
            "--exact",
            "--nocapture",
            "--test-threads=1",
            "-q",
        ])
        .env(ROLE, role)
        .env(SERVER, name)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let (_rx, first) = server.accept_timeout(PATIENCE).expect("the child connects");
    (child, first)
}

#[test]
fn a_child_process_gets_a_file_a_socket_and_a_listener_and_uses_each() {
    let _check = fd_check();
    let (mut child, to_child) = spawn_child::<IpcSender<Kit>>("kit");
    let (ours, theirs) = UnixStream::pair().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (reply, replies) = ipc::channel::<String>().unwrap();
    to_child
        .send(Kit {
            file: file_with(b"read in the child").into(),
            stream: theirs,
            listener,
            reply,
        })
        .unwrap();
    assert_eq!(
        replies.try_recv_timeout(PATIENCE).unwrap(),
        "read in the child"
    );
    let mut from_child = [0u8; 14];
    (&ours).read_exact(&mut from_child).unwrap();
    assert_eq!(&from_child, b"from the child");
    let mut client = TcpStream::connect(addr).unwrap();
    let mut greeting = String::new();
    client.read_to_string(&mut greeting).unwrap();
    assert_eq!(greeting, "accepted by the child");
    assert!(child.wait().unwrap().success());
}

#[test]
fn a_message_with_as_many_descriptors_as_fit_arrives_and_one_more_is_refused() {
    let _check = fd_check();
    let (tx, rx) = ipc::channel::<Vec<IpcFd>>().unwrap();
    let fds = |n: usize| -> Vec<IpcFd> {
        (0..n)
            .map(|_| IpcFd::from(OwnedFd::from(file_with(b"x"))))
            .collect()
    };
    tx.send(fds(MAX_FDS - 1)).unwrap();
    assert_eq!(rx.recv().unwrap().len(), MAX_FDS - 1);
    // One more than a message carries: an error before anything is sent,
    // and the channel goes on.
    assert!(tx.send(fds(MAX_FDS)).is_err());
    tx.send(fds(3)).unwrap();
    assert_eq!(rx.recv().unwrap().len(), 3);
}

/// The child's side of the `EMFILE` test: with room for only a few more
/// descriptors, it receives a message of many, then one of one.
fn serve_out_of_descriptors(server: String) {
    let (tx, rx) = ipc::channel::<Vec<IpcFd>>().unwrap();
    let (report, reports) = ipc::channel::<Vec<String>>().unwrap();
    IpcSender::<(IpcSender<Vec<IpcFd>>, IpcReceiver<Vec<String>>)>::connect(server)
        .unwrap()
        .send((tx, reports))
        .unwrap();
    let open = std::fs::read_dir("/proc/self/fd").unwrap().count() as u64;
    // Room for 8 more descriptors than are open now.
    let limit = rustix::process::Rlimit {
        current: Some(open + 8),
        maximum: rustix::process::getrlimit(rustix::process::Resource::Nofile).maximum,
    };
    let mut got = Vec::new();
    match rustix::process::setrlimit(rustix::process::Resource::Nofile, limit) {
        Ok(()) => {
            got.push(match rx.recv() {
                Ok(fds) => format!("ok {}", fds.len()),
                Err(e) => format!("err {e}"),
            });
            got.push(match rx.recv() {
                Ok(fds) => format!("ok {}", fds.len()),
                Err(e) => format!("err {e}"),
            });
        }
        Err(e) => got.push(format!("setrlimit: {e}")),
    }
    report.send(got).unwrap();
}

#[test]
fn a_receiver_out_of_descriptors_gets_an_error_for_that_message_and_goes_on() {
    let _check = fd_check();
    let (mut child, (to_child, reports)) =
        spawn_child::<(IpcSender<Vec<IpcFd>>, IpcReceiver<Vec<String>>)>("emfile");
    let many: Vec<IpcFd> = (0..40).map(|_| file_with(b"y").into()).collect();
    if let Err(e) = to_child.send(many) {
        panic!("{e:?}; child: {:?}", child.wait());
    }
    to_child.send(vec![file_with(b"z").into()]).unwrap();
    let got = reports.try_recv_timeout(PATIENCE);
    let got = got.unwrap_or_else(|e| panic!("{e:?}; child: {:?}", child.wait()));
    assert_eq!(got.len(), 2, "{got:?}");
    assert!(got[0].starts_with("err"), "the message of 40: {got:?}");
    assert_eq!(got[1], "ok 1", "the message after it: {got:?}");
    assert!(child.wait().unwrap().success());
}

/// Runs the child role, when this process is a child; a no-op test otherwise.
#[test]
fn child_entry() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let server = std::env::var(SERVER).expect("server name");
    match role.as_str() {
        "kit" => serve_kit(server),
        "emfile" => serve_out_of_descriptors(server),
        other => panic!("no role {other}"),
    }
}
