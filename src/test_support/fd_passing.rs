//! Receiving a datagram with the descriptors it carries (`SCM_RIGHTS`), as systemd's
//! notification socket receives `FDSTORE=1` messages: for the notifier's unit tests and the
//! integration tests' stand-in of systemd.

use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// One datagram from the socket `fd` (`recvmsg` with `flags`), and the descriptors it carried,
/// now owned by this process.
pub fn recv_with_fds(fd: RawFd, flags: libc::c_int) -> std::io::Result<(Vec<u8>, Vec<OwnedFd>)> {
    let mut buf = vec![0u8; 4096];
    // Room for 16 descriptors, in u64 words so the cmsghdr is aligned.
    let mut control = [0u64; 16];
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // SAFETY: an all-zero msghdr is valid; its buffers are set below and outlive the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &raw mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    // SAFETY: recvmsg writes into `buf` and `control` within the lengths given.
    let n = unsafe { libc::recvmsg(fd, &raw mut msg, flags | libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut fds = Vec::new();
    // SAFETY: the CMSG_* macros walk the control data recvmsg filled in, within
    // msg_controllen; SCM_RIGHTS data is an array of ints, each a descriptor now ours.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&raw const msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg).cast::<libc::c_int>();
                let len = (*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                for i in 0..len / std::mem::size_of::<libc::c_int>() {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&raw const msg, cmsg);
        }
    }
    buf.truncate(usize::try_from(n).unwrap_or(0));
    Ok((buf, fds))
}
