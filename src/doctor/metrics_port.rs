//! Check: who holds `metrics.address`. Any user of the node may bind a free port first;
//! edra then serves the kubelet without its metrics and health endpoint and binds it once
//! free. The listening sockets come from `<proc>/net/tcp` and `tcp6` (this network
//! namespace), their owners from the `socket:[inode]` links under `<proc>/<pid>/fd`, where
//! /proc lets the doctor read them.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;

use super::{CheckResult, Status};

const NAME: &str = "metrics-port";
/// `st` of a listening socket in /proc/net/tcp.
const LISTEN: &str = "0A";

/// A listening TCP socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listener {
    pub address: SocketAddr,
    pub uid: u32,
    pub inode: u64,
}

/// The process holding a socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub pid: u32,
    /// Its command name (`<proc>/<pid>/comm`).
    pub command: String,
}

/// The listening sockets in a `/proc/net/tcp` or `tcp6` text.
pub fn listeners(text: &str) -> Vec<Listener> {
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.get(3) != Some(&LISTEN) {
                return None;
            }
            let (ip, port) = f.get(1)?.split_once(':')?;
            let port = u16::from_str_radix(port, 16).ok()?;
            let address = SocketAddr::new(hex_ip(ip)?, port);
            Some(Listener { address, uid: f.get(7)?.parse().ok()?, inode: f.get(9)?.parse().ok()? })
        })
        .collect()
}

/// An address as /proc/net/tcp{,6} prints it: 32-bit words in the machine's byte order.
fn hex_ip(hex: &str) -> Option<IpAddr> {
    let words: Option<Vec<[u8; 4]>> = (0..hex.len() / 8)
        .map(|i| u32::from_str_radix(hex.get(i * 8..i * 8 + 8)?, 16).ok().map(u32::to_ne_bytes))
        .collect();
    let bytes: Vec<u8> = words?.concat();
    match bytes.len() {
        4 => Some(IpAddr::V4(Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3]))),
        16 => Some(IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(bytes).ok()?))),
        _ => None,
    }
}

/// Whether a socket listening on `bound` keeps `wanted` from being bound: the same port on
/// the same address, or either of them the unspecified address.
pub fn conflicts(bound: SocketAddr, wanted: SocketAddr) -> bool {
    let canonical = |ip: IpAddr| match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    };
    let (b, w) = (canonical(bound.ip()), canonical(wanted.ip()));
    bound.port() == wanted.port() && (b == w || b.is_unspecified() || w.is_unspecified())
}

/// The process with a descriptor of socket `inode`, if /proc shows one.
pub fn holder(proc_root: &Path, inode: u64) -> Option<Holder> {
    let link = format!("socket:[{inode}]");
    let pids = std::fs::read_dir(proc_root).ok()?.flatten().filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok());
    for pid in pids {
        let dir = proc_root.join(pid.to_string());
        let Ok(fds) = std::fs::read_dir(dir.join("fd")) else { continue };
        if fds.flatten().any(|fd| std::fs::read_link(fd.path()).is_ok_and(|t| t.as_os_str() == link.as_str())) {
            let command = std::fs::read_to_string(dir.join("comm")).unwrap_or_default().trim().to_string();
            return Some(Holder { pid, command });
        }
    }
    None
}

/// The check for `address` (`None`: the endpoint is disabled).
pub fn check(address: Option<SocketAddr>, proc_root: &Path) -> CheckResult {
    let Some(address) = address else {
        return CheckResult::skip(NAME, "the metrics and health endpoint is disabled (metrics.address = \"\")");
    };
    let net = proc_root.join("net");
    let text = ["tcp", "tcp6"].map(|f| std::fs::read_to_string(net.join(f)).unwrap_or_default()).concat();
    let Some(bound) = listeners(&text).into_iter().find(|l| conflicts(l.address, address)) else {
        return CheckResult::pass(NAME, format!("{address} is free, or served by edra"));
    };
    let not_served = "edra cannot serve /metrics, /healthz and /readyz there until it is free (it keeps trying)";
    match holder(proc_root, bound.inode) {
        Some(h) if h.command == "edra" => {
            CheckResult::pass(NAME, format!("{address} is served by edra (pid {})", h.pid))
        }
        Some(h) => CheckResult::new(
            NAME,
            Status::Warn,
            format!("{} is held by pid {} ({}, uid {}): {not_served}", bound.address, h.pid, h.command, bound.uid),
            format!("stop that process (kill {}), or set metrics.address to a free port", h.pid),
        ),
        None => CheckResult::new(
            NAME,
            Status::Warn,
            format!(
                "{} is held by a process of uid {} that /proc does not name here: {not_served}",
                bound.address, bound.uid
            ),
            "find it with ss -ltnp as root and stop it, or set metrics.address to a free port",
        ),
    }
}

#[cfg(test)]
mod tests;
