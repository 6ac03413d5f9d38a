//! Descriptors passed over Unix sockets (`SCM_RIGHTS`): how edra stores its listening
//! sockets in systemd's fd store (`telemetry::sdnotify`) and how one edra hands them to a
//! newer one on the same node (`handover`).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// The most descriptors one message carries, sent or received.
pub const MOST_FDS: usize = 16;

/// Sends `payload` with `fds` attached over the connected socket `socket` (one `sendmsg`,
/// `MSG_NOSIGNAL`); returns how many bytes of `payload` went (a stream socket may take
/// fewer: the descriptors travel with the first byte).
pub fn send_with_fds(socket: BorrowedFd<'_>, payload: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<usize> {
    if fds.is_empty() || fds.len() > MOST_FDS || payload.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("a message carries text and 1 to {MOST_FDS} descriptors, not {}", fds.len()),
        ));
    }
    // At most MOST_FDS ints: the length fits a u32.
    let fd_len = u32::try_from(std::mem::size_of_val(fds)).unwrap_or(u32::MAX);
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(fd_len) } as usize;
    // u64 words: aligned for the cmsghdr that is written into it.
    let mut control = vec![0u64; space.div_ceil(8)];
    let mut iov = libc::iovec { iov_base: payload.as_ptr() as *mut libc::c_void, iov_len: payload.len() };
    // SAFETY: an all-zero msghdr is valid (no name, no buffers); the fields are set below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &raw mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: `msg` points at `control`, which has room for one cmsghdr carrying
    // `fds.len()` ints (CMSG_SPACE), so CMSG_FIRSTHDR is non-null and CMSG_DATA has room
    // for them; sendmsg reads `payload` and `control`, both alive for the call, and the
    // descriptors are borrowed for the call.
    let sent = unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&raw const msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(fd_len) as _;
        let data = libc::CMSG_DATA(cmsg).cast::<libc::c_int>();
        for (i, fd) in fds.iter().enumerate() {
            std::ptr::write_unaligned(data.add(i), fd.as_raw_fd());
        }
        libc::sendmsg(socket.as_raw_fd(), &raw const msg, libc::MSG_NOSIGNAL)
    };
    usize::try_from(sent).map_err(|_| io::Error::last_os_error())
}

/// Receives into `buf` from `socket` (one `recvmsg` with `flags`, descriptors close-on-exec);
/// returns the bytes read and the descriptors that came with them, now this process's.
/// More than [`MOST_FDS`] descriptors in one message is an error (those that came are
/// closed), as is a message whose descriptors did not all fit.
pub fn recv_with_fds(socket: BorrowedFd<'_>, buf: &mut [u8], flags: libc::c_int) -> io::Result<(usize, Vec<OwnedFd>)> {
    // Room for MOST_FDS descriptors, in u64 words so the cmsghdr is aligned.
    let mut control = [0u64; MOST_FDS / 2 + 4];
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // SAFETY: an all-zero msghdr is valid; its buffers are set below and outlive the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &raw mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    // SAFETY: recvmsg writes into `buf` and `control` within the lengths given.
    let n = unsafe { libc::recvmsg(socket.as_raw_fd(), &raw mut msg, flags | libc::MSG_CMSG_CLOEXEC) };
    let n = usize::try_from(n).map_err(|_| io::Error::last_os_error())?;
    let mut fds = Vec::new();
    // SAFETY: the CMSG_* macros walk the control data recvmsg filled in, within
    // msg_controllen; SCM_RIGHTS data is an array of ints, each a descriptor now ours.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&raw const msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg).cast::<libc::c_int>();
                let len = ((*cmsg).cmsg_len as usize).saturating_sub(libc::CMSG_LEN(0) as usize);
                for i in 0..len / std::mem::size_of::<libc::c_int>() {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&raw const msg, cmsg);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 || fds.len() > MOST_FDS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a message carried more than the {MOST_FDS} descriptors edra takes"),
        ));
    }
    Ok((n, fds))
}

#[cfg(test)]
mod tests;
