//! The two privileged steps of the hook, through `nix` (no `unsafe` here): joining a mount
//! namespace and creating device nodes under a root directory without following symlinks.
//!
//! `setns(CLONE_NEWNS)` needs a single-threaded caller (the kernel refuses a process whose
//! filesystem context is shared with other threads); the hook's inventory scan runs its
//! threads in a scope that has ended before this is called.

use super::{HookError, Node};
use nix::errno::Errno;
use nix::fcntl::{open, openat, OFlag};
use nix::sys::stat::{fstatat, mkdirat, mknodat, Mode, SFlag};
use nix::unistd::{fchownat, unlinkat, Gid, Uid, UnlinkatFlags};
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

/// Join the mount namespace behind `ns` (an open `/proc/<pid>/ns/mnt`).
pub fn enter_mount_ns(ns: &std::fs::File) -> nix::Result<()> {
    nix::sched::setns(ns.as_fd(), nix::sched::CloneFlags::CLONE_NEWNS)
}

const DIR_PATH: OFlag = OFlag::O_PATH
    .union(OFlag::O_DIRECTORY)
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC);

/// Open (creating as needed, mode 0755) the directory `rel` under `root`, one component at a
/// time with O_NOFOLLOW: a symlink anywhere on the way is refused, so nothing escapes `root`.
fn open_dir_in(root: &OwnedFd, rel: &str, shown: &str) -> Result<OwnedFd, HookError> {
    let unsafe_path = |reason: String| HookError::Unsafe {
        path: shown.into(),
        reason,
    };
    let mut cur: Option<OwnedFd> = None;
    for comp in rel.split('/').filter(|c| !c.is_empty()) {
        if comp == "." || comp == ".." {
            return Err(unsafe_path(format!("path component {comp:?}")));
        }
        let dir = cur.as_ref().unwrap_or(root);
        let fd = match openat(dir, comp, DIR_PATH, Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) => {
                match mkdirat(dir, comp, Mode::from_bits_truncate(0o755)) {
                    Ok(()) | Err(Errno::EEXIST) => {}
                    Err(e) => return Err(unsafe_path(format!("mkdir {comp}: {e}"))),
                }
                openat(dir, comp, DIR_PATH, Mode::empty()).map_err(|e| unsafe_path(format!("{comp}: {e}")))?
            }
            Err(Errno::ELOOP) | Err(Errno::ENOTDIR) => {
                return Err(unsafe_path(format!("{comp:?} is a symlink or not a directory")))
            }
            Err(e) => return Err(unsafe_path(format!("{comp}: {e}"))),
        };
        cur = Some(fd);
    }
    cur.ok_or_else(|| unsafe_path("empty path".into()))
}

/// Create every node under `rootfs`; on any failure remove the ones made. Returns the paths.
pub fn create_nodes(rootfs: &Path, nodes: &[Node]) -> Result<Vec<String>, HookError> {
    let root = open(rootfs, DIR_PATH, Mode::empty()).map_err(|e| HookError::Create {
        path: rootfs.display().to_string(),
        reason: format!("cannot open the rootfs in the container's mount namespace: {e}"),
    })?;
    let mut made: Vec<(OwnedFd, String, String)> = Vec::new();
    let res = (|| {
        for n in nodes {
            let rel = n.path.trim_start_matches('/');
            let (dir, name) = rel.rsplit_once('/').unwrap_or(("", rel));
            let parent = open_dir_in(&root, dir, &n.path)?;
            let dev = nix::sys::stat::makedev(n.major, n.minor);
            let mode = Mode::from_bits_truncate(n.mode);
            match mknodat(&parent, name, SFlag::S_IFCHR, mode, dev) {
                Ok(()) => {
                    fchownat(
                        &parent,
                        name,
                        Some(Uid::from_raw(n.uid)),
                        Some(Gid::from_raw(n.gid)),
                        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
                    )
                    .map_err(|e| HookError::Create {
                        path: n.path.clone(),
                        reason: format!("chown: {e}"),
                    })?;
                    made.push((parent, name.to_string(), n.path.clone()));
                }
                Err(Errno::EEXIST) => {
                    // Already there (the runtime or an earlier hook): fine if it is the same node.
                    let st =
                        fstatat(&parent, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW).map_err(|e| {
                            HookError::Create {
                                path: n.path.clone(),
                                reason: e.to_string(),
                            }
                        })?;
                    let is_chr = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFCHR;
                    if !is_chr || st.st_rdev != dev {
                        return Err(HookError::Unsafe {
                            path: n.path.clone(),
                            reason: "something else already exists there".into(),
                        });
                    }
                }
                Err(e) => {
                    return Err(HookError::Create {
                        path: n.path.clone(),
                        reason: e.to_string(),
                    })
                }
            }
        }
        Ok(())
    })();
    match res {
        Ok(()) => Ok(made.into_iter().map(|(_, _, p)| p).collect()),
        Err(e) => {
            for (parent, name, _) in made.iter().rev() {
                let _ = unlinkat(parent, name.as_str(), UnlinkatFlags::NoRemoveDir);
            }
            Err(e)
        }
    }
}
