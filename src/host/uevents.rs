//! Kernel uevents: `gpupass events` and the change stream other parts can wait on.
//!
//! Kernel facts: the kernel broadcasts device events on a `NETLINK_KOBJECT_UEVENT` socket,
//! multicast group 1. Each datagram is `ACTION@DEVPATH\0KEY=VALUE\0KEY=VALUE\0...` with at least
//! `ACTION`, `DEVPATH`, `SUBSYSTEM` and `SEQNUM`. PCI functions report `add`, `remove`, `bind`
//! (with `DRIVER=`), `unbind` and `change`; mdev instances appear under `SUBSYSTEM=mdev`, and a
//! parent announces `MDEV_STATE=registered` with a `change`. udev re-broadcasts processed events
//! on group 2 with a `libudev` header; gpupass listens to the kernel's own group and ignores those.

use serde::Serialize;
use std::collections::BTreeMap;
use std::io;
use std::time::{Duration, Instant};

/// One kernel uevent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Uevent {
    pub action: String,
    pub devpath: String,
    pub subsystem: Option<String>,
    pub driver: Option<String>,
    /// `PCI_SLOT_NAME` for PCI functions, the UUID (last `DEVPATH` component) for mdevs.
    pub device: Option<String>,
    pub seqnum: Option<u64>,
    /// Every `KEY=VALUE` of the message.
    pub vars: BTreeMap<String, String>,
}

/// Why a datagram is not a kernel uevent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UeventParseError {
    #[error("udev's re-broadcast (libudev header), not a kernel uevent")]
    Udev,
    #[error("no ACTION@DEVPATH header")]
    NoHeader,
}

/// Parse one datagram. Bounded by the datagram itself; invalid UTF-8 is replaced, never fatal.
pub fn parse_uevent(buf: &[u8]) -> Result<Uevent, UeventParseError> {
    if buf.starts_with(b"libudev\0") {
        return Err(UeventParseError::Udev);
    }
    let mut parts = buf.split(|b| *b == 0).filter(|p| !p.is_empty());
    let head = parts.next().ok_or(UeventParseError::NoHeader)?;
    let head = String::from_utf8_lossy(head);
    let (action, devpath) = head.split_once('@').ok_or(UeventParseError::NoHeader)?;
    if action.is_empty() || !devpath.starts_with('/') {
        return Err(UeventParseError::NoHeader);
    }
    let mut vars = BTreeMap::new();
    for p in parts {
        let kv = String::from_utf8_lossy(p);
        if let Some((k, v)) = kv.split_once('=') {
            vars.insert(k.to_string(), v.to_string());
        }
    }
    let subsystem = vars.get("SUBSYSTEM").cloned();
    let device = match subsystem.as_deref() {
        Some("pci") => vars.get("PCI_SLOT_NAME").cloned(),
        Some("mdev") => devpath.rsplit('/').next().map(str::to_string),
        _ => None,
    };
    Ok(Uevent {
        action: vars.get("ACTION").cloned().unwrap_or_else(|| action.to_string()),
        devpath: devpath.to_string(),
        subsystem,
        driver: vars.get("DRIVER").cloned(),
        device,
        seqnum: vars.get("SEQNUM").and_then(|s| s.parse().ok()),
        vars,
    })
}

impl Uevent {
    /// Events gpupass cares about: PCI functions and mediated devices (and their parents'
    /// registration changes).
    pub fn is_relevant(&self) -> bool {
        matches!(
            self.subsystem.as_deref(),
            Some("pci") | Some("mdev") | Some("vfio")
        ) || self.vars.contains_key("MDEV_STATE")
    }

    /// One human line: `bind     pci   0000:00:05.0  driver=vfio-pci`.
    pub fn line(&self) -> String {
        let mut s = format!(
            "{:<8} {:<5} {}",
            self.action,
            self.subsystem.as_deref().unwrap_or("-"),
            self.device.as_deref().unwrap_or(&self.devpath)
        );
        if let Some(d) = &self.driver {
            s.push_str(&format!("  driver={d}"));
        }
        if let Some(m) = self.vars.get("MDEV_STATE") {
            s.push_str(&format!("  mdev_state={m}"));
        }
        s
    }
}

/// A subscription to the kernel's uevent broadcast.
pub(crate) struct UeventSocket {
    fd: rustix::fd::OwnedFd,
}

impl UeventSocket {
    /// Open and bind to the kernel group. Needs no privilege on most kernels; fails inside
    /// network namespaces that do not receive uevents (then there is nothing to watch).
    pub(crate) fn open() -> io::Result<Self> {
        use rustix::net::{netlink, AddressFamily, SocketFlags, SocketType};
        let fd = rustix::net::socket_with(
            AddressFamily::NETLINK,
            SocketType::DGRAM,
            SocketFlags::CLOEXEC,
            Some(netlink::KOBJECT_UEVENT),
        )?;
        rustix::net::bind(&fd, &netlink::SocketAddrNetlink::new(0, 1))?;
        // Bursts (binding a group makes a handful per device) must not overflow the queue.
        let _ = rustix::net::sockopt::set_socket_recv_buffer_size(&fd, 1 << 20);
        Ok(UeventSocket { fd })
    }

    /// The next relevant event, or `None` when `timeout` passes first.
    pub(crate) fn next(&self, timeout: Option<Duration>) -> io::Result<Option<Uevent>> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let wait = match deadline {
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Ok(None);
                    }
                    Some(left)
                }
                None => None,
            };
            if !self.readable(wait)? {
                return Ok(None);
            }
            let n = match rustix::net::recv(&self.fd, &mut buf[..], rustix::net::RecvFlags::DONTWAIT) {
                Ok((n, _)) => n,
                Err(rustix::io::Errno::AGAIN) | Err(rustix::io::Errno::INTR) => continue,
                // The queue overflowed: events were lost; callers rescan the inventory anyway.
                Err(rustix::io::Errno::NOBUFS) => continue,
                Err(e) => return Err(e.into()),
            };
            if let Ok(ev) = parse_uevent(&buf[..n.min(buf.len())]) {
                if ev.is_relevant() {
                    return Ok(Some(ev));
                }
            }
        }
    }

    fn readable(&self, wait: Option<Duration>) -> io::Result<bool> {
        use rustix::event::{poll, PollFd, PollFlags, Timespec};
        let mut fds = [PollFd::new(&self.fd, PollFlags::IN)];
        let ts = wait.map(|d| Timespec {
            tv_sec: d.as_secs() as _,
            tv_nsec: d.subsec_nanos() as _,
        });
        loop {
            match poll(&mut fds, ts.as_ref()) {
                Ok(n) => return Ok(n > 0),
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_pci_bind() {
        let m = b"bind@/devices/pci0000:00/0000:00:05.0\0ACTION=bind\0DEVPATH=/devices/pci0000:00/0000:00:05.0\0SUBSYSTEM=pci\0DRIVER=vfio-pci\0PCI_CLASS=30000\0PCI_ID=1234:1111\0PCI_SLOT_NAME=0000:00:05.0\0SEQNUM=2211\0";
        let e = parse_uevent(m).unwrap();
        assert_eq!(e.action, "bind");
        assert_eq!(e.device.as_deref(), Some("0000:00:05.0"));
        assert_eq!(e.driver.as_deref(), Some("vfio-pci"));
        assert_eq!(e.seqnum, Some(2211));
        assert!(e.is_relevant());
        assert_eq!(e.line(), "bind     pci   0000:00:05.0  driver=vfio-pci");
    }

    #[test]
    fn parses_an_mdev_add() {
        let m = b"add@/devices/virtual/mbochs/mbochs/83b8f4f2-509f-382f-3c1e-e6bfe0fa1001\0ACTION=add\0DEVPATH=/devices/virtual/mbochs/mbochs/83b8f4f2-509f-382f-3c1e-e6bfe0fa1001\0SUBSYSTEM=mdev\0MDEV_TYPE=mbochs-small\0SEQNUM=7\0";
        let e = parse_uevent(m).unwrap();
        assert_eq!(e.device.as_deref(), Some("83b8f4f2-509f-382f-3c1e-e6bfe0fa1001"));
        assert!(e.is_relevant());
    }

    #[test]
    fn rejects_udev_and_garbage() {
        assert_eq!(parse_uevent(b"libudev\0\xfe\xed"), Err(UeventParseError::Udev));
        assert_eq!(parse_uevent(b""), Err(UeventParseError::NoHeader));
        assert_eq!(parse_uevent(b"\0\0\0"), Err(UeventParseError::NoHeader));
        assert_eq!(parse_uevent(b"add@relative\0"), Err(UeventParseError::NoHeader));
        let e = parse_uevent(b"change@/devices/x\0SUBSYSTEM=net\0\xff\xfe=\xff\0").unwrap();
        assert!(!e.is_relevant());
    }
}
