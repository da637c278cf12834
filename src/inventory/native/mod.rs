//! What a container needs from the host's native NVIDIA driver, found on the host (never
//! assumed): device nodes, user-space libraries, binaries and IPC sockets. This is what
//! `nvidia-container-cli list` prints; `gpupass container list` prints the same, and the CDI
//! renderer ([`crate::output::cdi`]) turns it into bind mounts.
//!
//! Libraries come from the dynamic linker's cache (`/etc/ld.so.cache`, parsed by [`ldcache`]):
//! the entries of this build's ABI whose soname belongs to the driver's library set. Without a
//! readable cache, the standard library directories are searched. Binaries come from the
//! standard `bin` directories. Only files that exist under the host root are listed.

pub mod ldcache;

use crate::host::HostRoot;
use crate::model::{Inventory, PciAddress};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Why `container list` could not answer.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ContainerError {
    #[error("no PCI function {addr} on this host; `gpupass list` shows the GPUs")]
    NoSuchDevice { addr: PciAddress },
    #[error(
        "{addr} is bound to {driver}, not to the native nvidia driver: a container gets it through \
VFIO instead (`gpupass cdi generate`, `gpupass oci-hook`)"
    )]
    NotNative { addr: PciAddress, driver: String },
    #[error(
        "{addr} is on the nvidia driver but /proc/driver/nvidia/gpus/{addr}/information has no \
Device Minor; is the driver fully loaded?"
    )]
    NoMinor { addr: PciAddress },
}

/// The user-space libraries of the NVIDIA driver (utility, compute, video, graphics), by the
/// part of the file name before `.so`.
pub(crate) const NVIDIA_LIBRARIES: &[&str] = &[
    "libnvidia-ml",
    "libnvidia-cfg",
    "libcuda",
    "libcudadebugger",
    "libnvidia-opencl",
    "libnvidia-gpucomp",
    "libnvidia-ptxjitcompiler",
    "libnvidia-fatbinaryloader",
    "libnvidia-allocator",
    "libnvidia-compiler",
    "libnvidia-pkcs11",
    "libnvidia-pkcs11-openssl3",
    "libnvidia-nvvm",
    "libnvidia-encode",
    "libnvidia-opticalflow",
    "libnvcuvid",
    "libvdpau_nvidia",
    "libnvidia-eglcore",
    "libnvidia-glcore",
    "libnvidia-tls",
    "libnvidia-glsi",
    "libnvidia-fbc",
    "libnvidia-ifr",
    "libnvidia-rtcore",
    "libnvoptix",
    "libGLX_nvidia",
    "libEGL_nvidia",
    "libGLESv2_nvidia",
    "libGLESv1_CM_nvidia",
    "libnvidia-glvkspirv",
    "libnvidia-cbl",
    "libnvidia-ngx",
];

/// The driver's binaries a container may need.
pub(crate) const NVIDIA_BINARIES: &[&str] = &[
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nv-fabricmanager",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
];

/// Control nodes shared by every GPU on the native driver.
pub(crate) const NVIDIA_CONTROL_NODES: &[&str] =
    &["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"];

/// IPC sockets of the driver's daemons, root-relative.
const NVIDIA_IPCS: &[&str] = &[
    "var/run/nvidia-persistenced/socket",
    "var/run/nvidia-fabricmanager/socket",
];

/// Binary directories searched, root-relative, in order.
const BIN_DIRS: &[&str] = &["usr/bin", "usr/sbin", "bin", "sbin", "usr/local/bin"];

fn lib_dirs() -> &'static [&'static str] {
    if cfg!(target_arch = "aarch64") {
        &[
            "usr/lib/aarch64-linux-gnu",
            "lib/aarch64-linux-gnu",
            "usr/lib64",
            "lib64",
            "usr/lib",
            "lib",
        ]
    } else {
        &[
            "usr/lib/x86_64-linux-gnu",
            "lib/x86_64-linux-gnu",
            "usr/lib64",
            "lib64",
            "usr/lib",
            "lib",
        ]
    }
}

/// One library: the path the dynamic linker uses (the soname link) and the file it resolves to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Library {
    /// Host path, `/usr/lib/x86_64-linux-gnu/libcuda.so.1`.
    pub path: String,
    /// Where `path` leads when it is a symlink (`/usr/lib/x86_64-linux-gnu/libcuda.so.550.90.07`).
    pub target: Option<String>,
}

/// The driver files found on a host. Paths are host paths (as the runtime sees them), with no
/// `--root` prefix.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct DriverFiles {
    /// `/dev/nvidiactl`, `/dev/nvidia-uvm`, ... and every `/dev/nvidiaN`, as found.
    pub device_nodes: Vec<String>,
    pub libraries: Vec<Library>,
    pub binaries: Vec<String>,
    pub ipcs: Vec<String>,
    /// Where the libraries were found: `/etc/ld.so.cache` or `library directories`.
    pub library_source: String,
    /// Things that could not be read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

impl DriverFiles {
    /// The per-GPU node `/dev/nvidia<minor>`, if it was found.
    pub(crate) fn gpu_node(&self, minor: u32) -> Option<&str> {
        let want = format!("/dev/nvidia{minor}");
        self.device_nodes.iter().find(|n| **n == want).map(|s| s.as_str())
    }

    /// The control nodes found (`/dev/nvidiactl`, ...), in [`NVIDIA_CONTROL_NODES`] order.
    pub(crate) fn control_nodes(&self) -> Vec<&str> {
        NVIDIA_CONTROL_NODES
            .iter()
            .filter_map(|c| {
                let want = format!("/dev/{c}");
                self.device_nodes.iter().find(|n| **n == want).map(|s| s.as_str())
            })
            .collect()
    }
}

/// `libcuda.so.1` → `Some("libcuda")` when it is a versioned name of a driver library.
fn driver_lib_base(name: &str) -> Option<&'static str> {
    let (base, rest) = name.split_once(".so.")?;
    if rest.is_empty() {
        return None;
    }
    NVIDIA_LIBRARIES.iter().copied().find(|l| *l == base)
}

/// Resolve a symlink at host path `host_path` (under `root`) to a host path, one level deep
/// as `readlink` does, plus any further links; `None` when it is not a link.
fn link_target(host: &HostRoot, host_path: &str) -> Option<String> {
    let p = host.path(host_path);
    let meta = std::fs::symlink_metadata(&p).ok()?;
    if !meta.file_type().is_symlink() {
        return None;
    }
    let mut cur = PathBuf::from(host_path);
    for _ in 0..16 {
        let t = std::fs::read_link(host.path(&cur.to_string_lossy())).ok()?;
        let next = if t.is_absolute() {
            t
        } else {
            cur.parent().unwrap_or(Path::new("/")).join(t)
        };
        cur = normalize(&next);
        match std::fs::symlink_metadata(host.path(&cur.to_string_lossy())) {
            Ok(m) if m.file_type().is_symlink() => continue,
            Ok(_) => return Some(cur.to_string_lossy().into_owned()),
            Err(_) => return None,
        }
    }
    None
}

/// Lexically remove `.` and `..` from an absolute path.
fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in p.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::Normal(s) => out.push(s),
            _ => {}
        }
    }
    out
}

/// Find the driver files on the host.
pub fn discover(host: &HostRoot) -> DriverFiles {
    let mut f = DriverFiles::default();
    // Device nodes.
    let dev = host.dev();
    for c in NVIDIA_CONTROL_NODES {
        if dev.join(c).exists() {
            f.device_nodes.push(format!("/dev/{c}"));
        }
    }
    let mut minors: Vec<u32> = crate::host::dir_names(&dev)
        .unwrap_or_default()
        .iter()
        .filter_map(|n| n.strip_prefix("nvidia").and_then(|m| m.parse().ok()))
        .collect();
    minors.sort_unstable();
    f.device_nodes
        .extend(minors.iter().map(|m| format!("/dev/nvidia{m}")));

    // Libraries: the linker's cache, else the standard directories.
    let cache = host.ld_so_cache();
    let from_cache = match crate::host::read_bounded_bytes(&cache, 64 << 20) {
        Ok(buf) => match ldcache::parse(&buf) {
            Ok(entries) => Some(entries),
            Err(e) => {
                f.warnings.push(format!("{}: {e}", host.display(&cache)));
                None
            }
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            f.warnings.push(format!("{}: {e}", host.display(&cache)));
            None
        }
    };
    match from_cache {
        Some(entries) => {
            f.library_source = "/etc/ld.so.cache".into();
            let native = ldcache::native_flags();
            for e in entries {
                if e.flags != native || driver_lib_base(&e.key).is_none() {
                    continue;
                }
                if f.libraries.iter().any(|l| l.path == e.value) {
                    continue;
                }
                if !host.path(&e.value).exists() {
                    f.warnings.push(format!(
                        "/etc/ld.so.cache lists {} but it does not exist (run ldconfig)",
                        e.value
                    ));
                    continue;
                }
                let target = link_target(host, &e.value);
                f.libraries.push(Library {
                    path: e.value,
                    target,
                });
            }
        }
        None => {
            f.library_source = "library directories".into();
            let mut seen: Vec<&str> = Vec::new();
            for d in lib_dirs() {
                let names = crate::host::dir_names(&host.path(d)).unwrap_or_default();
                // Per library: the soname link (`libcuda.so.1`, a link to an existing file)
                // when there is one, else the versioned file itself.
                let mut here: Vec<(&'static str, Library, bool)> = Vec::new();
                for n in &names {
                    let Some(base) = driver_lib_base(n) else { continue };
                    if seen.contains(&base) {
                        continue;
                    }
                    let hp = format!("/{d}/{n}");
                    if !host.path(&hp).exists() {
                        continue;
                    }
                    let target = link_target(host, &hp);
                    let is_link = target.is_some();
                    match here.iter_mut().find(|(b, _, _)| *b == base) {
                        Some(slot) if is_link && (!slot.2 || hp.len() < slot.1.path.len()) => {
                            *slot = (base, Library { path: hp, target }, true)
                        }
                        Some(_) => {}
                        None => here.push((base, Library { path: hp, target }, is_link)),
                    }
                }
                for (b, l, _) in here {
                    seen.push(b);
                    f.libraries.push(l);
                }
            }
        }
    }
    f.libraries.sort_by(|a, b| a.path.cmp(&b.path));

    for b in NVIDIA_BINARIES {
        if let Some(d) = BIN_DIRS.iter().find(|d| host.path(d).join(b).is_file()) {
            f.binaries.push(format!("/{d}/{b}"));
        }
    }
    for i in NVIDIA_IPCS {
        if host.path(i).exists() {
            f.ipcs.push(format!("/{i}"));
        }
    }
    f
}

/// The device nodes one native GPU needs: `/dev/nvidia<minor>` and the control nodes.
pub(crate) fn gpu_nodes<'a>(
    inv: &Inventory,
    files: &'a DriverFiles,
    addr: &PciAddress,
) -> Result<Vec<&'a str>, ContainerError> {
    let d = inv
        .device(addr)
        .ok_or(ContainerError::NoSuchDevice { addr: *addr })?;
    if d.driver.as_deref() != Some("nvidia") {
        return Err(ContainerError::NotNative {
            addr: *addr,
            driver: d.driver.clone().unwrap_or_else(|| "no driver".into()),
        });
    }
    let minor = d
        .nvidia
        .as_ref()
        .and_then(|n| n.minor)
        .ok_or(ContainerError::NoMinor { addr: *addr })?;
    let mut v = files.control_nodes();
    if let Some(n) = files.gpu_node(minor) {
        v.push(n);
    }
    Ok(v)
}

/// `gpupass container list` as text: one host path per line, device nodes, binaries,
/// libraries, IPC sockets (the order of `nvidia-container-cli list`). With `device`, only that
/// GPU's node is listed among the per-GPU nodes.
pub(crate) fn list_text(
    inv: &Inventory,
    files: &DriverFiles,
    device: Option<&PciAddress>,
) -> Result<String, ContainerError> {
    let mut out = String::new();
    match device {
        Some(a) => {
            for n in gpu_nodes(inv, files, a)? {
                out.push_str(n);
                out.push('\n');
            }
        }
        None => {
            for n in &files.device_nodes {
                out.push_str(n);
                out.push('\n');
            }
        }
    }
    for b in &files.binaries {
        out.push_str(b);
        out.push('\n');
    }
    for l in &files.libraries {
        out.push_str(l.target.as_deref().unwrap_or(&l.path));
        out.push('\n');
    }
    for i in &files.ipcs {
        out.push_str(i);
        out.push('\n');
    }
    Ok(out)
}

/// `gpupass container list --json`: the same, structured; with `device`, only its nodes.
pub(crate) fn list_json(
    inv: &Inventory,
    files: &DriverFiles,
    device: Option<&PciAddress>,
) -> Result<DriverFiles, ContainerError> {
    let mut f = files.clone();
    if let Some(a) = device {
        f.device_nodes = gpu_nodes(inv, files, a)?
            .into_iter()
            .map(str::to_string)
            .collect();
    }
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn library_names() {
        assert_eq!(driver_lib_base("libcuda.so.1"), Some("libcuda"));
        assert_eq!(driver_lib_base("libcuda.so.550.90.07"), Some("libcuda"));
        assert_eq!(driver_lib_base("libcuda.so"), None);
        assert_eq!(driver_lib_base("libcudart.so.12"), None);
        assert_eq!(
            driver_lib_base("libnvidia-pkcs11-openssl3.so.550.90.07"),
            Some("libnvidia-pkcs11-openssl3")
        );
    }

    #[test]
    fn normalize_paths() {
        assert_eq!(
            normalize(Path::new("/usr/lib/x/../y/./z")),
            PathBuf::from("/usr/lib/y/z")
        );
        assert_eq!(normalize(Path::new("/../..")), PathBuf::from("/"));
    }
}
