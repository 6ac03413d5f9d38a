use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;

use super::*;

#[test]
fn descriptors_travel_with_their_text() {
    let (a, b) = UnixStream::pair().expect("a socket pair");
    let (r, mut w) = std::io::pipe().expect("a pipe");
    let sent = send_with_fds(a.as_fd(), b"pipe\n", &[r.as_fd(), a.as_fd()]).expect("sendmsg");
    assert_eq!(sent, 5);
    drop(r);
    let mut buf = [0u8; 64];
    let (n, fds) = recv_with_fds(b.as_fd(), &mut buf, 0).expect("recvmsg");
    assert_eq!(&buf[..n], b"pipe\n");
    assert_eq!(fds.len(), 2);
    // The received read end is the pipe's: what is written comes out of it.
    w.write_all(b"x").expect("write the pipe");
    let mut got = [0u8; 1];
    let read = std::fs::File::from(fds.into_iter().next().expect("the pipe's end"));
    std::io::Read::read_exact(&mut &read, &mut got).expect("read the passed end");
    assert_eq!(&got, b"x");
}

#[test]
fn no_descriptors_or_too_many_are_refused() {
    let (a, _b) = UnixStream::pair().expect("a socket pair");
    assert_eq!(send_with_fds(a.as_fd(), b"x", &[]).unwrap_err().kind(), io::ErrorKind::InvalidInput);
    let many: Vec<BorrowedFd<'_>> = (0..=MOST_FDS).map(|_| a.as_fd()).collect();
    assert_eq!(send_with_fds(a.as_fd(), b"x", &many).unwrap_err().kind(), io::ErrorKind::InvalidInput);
}
