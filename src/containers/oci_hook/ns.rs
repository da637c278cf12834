//! The two privileged steps of the hook, through `rustix` (no `unsafe` here): joining a mount
//! namespace and creating device nodes under a root directory without following symlinks.
//!
//! `setns(CLONE_NEWNS)` needs a single-threaded caller (the kernel refuses a process whose
//! filesystem context is shared with other threads); the hook's inventory scan runs its
//! threads in a scope that has ended before this is called.

use super::{HookError, Node};
use rustix::fs::{
    chownat, mkdirat, mknodat, open, openat, statat, unlinkat, AtFlags, FileType, Gid, Mode, OFlags, Uid,
};
use rustix::io::Errno;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

/// Join the mount namespace behind `ns` (an open `/proc/<pid>/ns/mnt`).
pub(crate) fn enter_mount_ns(ns: &std::fs::File) -> rustix::io::Result<()> {
    rustix::thread::move_into_link_name_space(ns.as_fd(), Some(rustix::thread::LinkNameSpaceType::Mount))
}

const DIR_PATH: OFlags = OFlags::PATH
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// Open (creating as needed, mode 0755) the directory `rel` under `root`, one component at a
/// time with O_NOFOLLOW: a symlink anywhere on the way is refused, so nothing escapes `root`.
fn open_dir_in(root: &OwnedFd, rel: &str, shown: &str) -> Result<OwnedFd, HookError> {
    let unsafe_path = |reason: String| HookError::Unsafe {
        path: PathBuf::from(shown),
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
            Err(Errno::NOENT) => {
                match mkdirat(dir, comp, Mode::from_bits_truncate(0o755)) {
                    Ok(()) | Err(Errno::EXIST) => {}
                    Err(e) => return Err(unsafe_path(format!("mkdir {comp}: {e}"))),
                }
                openat(dir, comp, DIR_PATH, Mode::empty()).map_err(|e| unsafe_path(format!("{comp}: {e}")))?
            }
            Err(Errno::LOOP) | Err(Errno::NOTDIR) => {
                return Err(unsafe_path(format!("{comp:?} is a symlink or not a directory")))
            }
            Err(e) => return Err(unsafe_path(format!("{comp}: {e}"))),
        };
        cur = Some(fd);
    }
    cur.ok_or_else(|| unsafe_path("empty path".into()))
}

/// Create every node under `rootfs`; on any failure remove the ones made. Returns the paths.
pub(crate) fn create_nodes(rootfs: &Path, nodes: &[Node]) -> Result<Vec<String>, HookError> {
    let root = open(rootfs, DIR_PATH, Mode::empty()).map_err(|e| HookError::Create {
        path: rootfs.to_path_buf(),
        reason: format!("cannot open the rootfs in the container's mount namespace: {e}"),
    })?;
    let mut made: Vec<(OwnedFd, String, String)> = Vec::new();
    let res = (|| {
        for n in nodes {
            let rel = n.path.trim_start_matches('/');
            let (dir, name) = rel.rsplit_once('/').unwrap_or(("", rel));
            let parent = open_dir_in(&root, dir, &n.path)?;
            let (Ok(major), Ok(minor)) = (u32::try_from(n.major), u32::try_from(n.minor)) else {
                return Err(HookError::Create {
                    path: PathBuf::from(&n.path),
                    reason: format!("device number {}:{} is out of range", n.major, n.minor),
                });
            };
            let dev = rustix::fs::makedev(major, minor);
            let mode = Mode::from_bits_truncate(n.mode);
            match mknodat(&parent, name, FileType::CharacterDevice, mode, dev) {
                Ok(()) => {
                    chownat(
                        &parent,
                        name,
                        Some(Uid::from_raw(n.uid)),
                        Some(Gid::from_raw(n.gid)),
                        AtFlags::SYMLINK_NOFOLLOW,
                    )
                    .map_err(|e| HookError::Create {
                        path: PathBuf::from(&n.path),
                        reason: format!("chown: {e}"),
                    })?;
                    made.push((parent, name.to_string(), n.path.clone()));
                }
                Err(Errno::EXIST) => {
                    // Already there (the runtime or an earlier hook): fine if it is the same node.
                    let st =
                        statat(&parent, name, AtFlags::SYMLINK_NOFOLLOW).map_err(|e| HookError::Create {
                            path: PathBuf::from(&n.path),
                            reason: e.to_string(),
                        })?;
                    let is_chr = FileType::from_raw_mode(st.st_mode) == FileType::CharacterDevice;
                    if !is_chr || st.st_rdev != dev {
                        return Err(HookError::Unsafe {
                            path: PathBuf::from(&n.path),
                            reason: "something else already exists there".into(),
                        });
                    }
                }
                Err(e) => {
                    return Err(HookError::Create {
                        path: PathBuf::from(&n.path),
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
                let _ = unlinkat(parent, name.as_str(), AtFlags::empty());
            }
            Err(e)
        }
    }
}
