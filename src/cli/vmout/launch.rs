//! `gpupass launch`: fd passing for unprivileged VMMs (docs/iommufd.md, "fd passing").
//!
//! A VMM that opens `/dev/iommu` and `/dev/vfio/devices/vfioN` itself needs access to both
//! nodes, and with per-user memlock accounting its pinned guest RAM is charged to whichever
//! user runs it. KubeVirt had to build a privileged helper for this; gpupass is one:
//! as root it opens `/dev/iommu`, switches it to per-process memlock accounting
//! (`IOMMU_OPTION_RLIMIT_MODE` = 1, which needs `CAP_SYS_RESOURCE`), opens the cdev of every
//! function of the selection (the named devices and their IOMMU-group companions, as
//! `qemu-args` picks them), and then `exec`s the VMM with those descriptors inherited and the
//! `qemu-args` arguments pointing at them (`-object iommufd,id=iommufd0,fd=N`,
//! `-device vfio-pci,fd=M,iommufd=iommufd0,...`), optionally as another user and with a
//! raised `RLIMIT_MEMLOCK`. The VMM then needs no access to any VFIO node.
//!
//! Kernel facts used:
//! - `IOMMU_OPTION` is `_IO(';', 0x87)` on the iommufd; `IOMMU_OPTION_RLIMIT_MODE` is a
//!   global option (object id 0): 0 charges pinned pages to the user, 1 to the process.
//! - A cdev opened before `exec` stays usable by the new program: the binding to an iommufd
//!   (`VFIO_DEVICE_BIND_IOMMUFD`) is done by the VMM on the inherited descriptor.

use super::{select, LaunchError, VmOutError};
use crate::cli::ctx::Ctx;
use crate::cli::error::{Error, Exit};
use crate::host::HostRoot;
use crate::inventory::backend::{self, Policy};
use crate::model::Inventory;
use crate::output::plan::Note;
use crate::output::qemu::{self, PassedFds, QemuOptions};
use crate::output::selection::{Consumer, DeviceArg};
use clap::Args;
use std::ffi::OsString;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

#[derive(Debug, Args)]
pub struct LaunchArgs {
    /// A PCI function bound to vfio-pci (0000:01:00.0, 01:00.0); repeat for more. Its
    /// IOMMU-group companions come too unless --only
    #[arg(long = "device", required = true, value_name = "ADDRESS")]
    pub devices: Vec<DeviceArg>,
    /// Only the devices named, not the other endpoints of their IOMMU groups
    #[arg(long)]
    pub only: bool,
    /// Run the VMM as this user: a numeric UID[:GID] (supplementary groups are dropped)
    #[arg(long, value_name = "UID[:GID]", value_parser = parse_user)]
    pub user: Option<(u32, u32)>,
    /// Set the VMM's RLIMIT_MEMLOCK (soft and hard) before exec: SIZE (K/M/G/T suffixes) or
    /// `unlimited`. With per-process accounting the VMM's pinned guest RAM counts against it
    #[arg(long, value_name = "SIZE", value_parser = parse_memlock)]
    pub memlock: Option<u64>,
    /// Keep per-user memlock accounting (do not set IOMMU_OPTION_RLIMIT_MODE)
    #[arg(long)]
    pub keep_user_accounting: bool,
    /// First pcie.0 slot for the root ports (as qemu-args)
    #[arg(long, value_parser = super::parse_slot, default_value = "0x10", value_name = "SLOT")]
    pub first_slot: u8,
    /// The -cpu value appended, with host-phys-bits=on (and host-phys-bits-limit=N) added, as
    /// for qemu-args: host (the default; none when the VMM's command has its own -cpu), your
    /// model and flags, or none
    #[arg(long, value_name = "MODEL[,FLAGS]|none", value_parser = super::parse_cpu)]
    pub cpu: Option<String>,
    /// Print the command line to stderr before exec
    #[arg(long)]
    pub print: bool,
    /// The VMM and its own arguments; gpupass appends the device arguments
    #[arg(last = true, required = true, value_name = "VMM ARGS")]
    pub command: Vec<OsString>,
}

fn parse_user(s: &str) -> Result<(u32, u32), String> {
    let bad = || format!("invalid user {s:?}: expected a numeric UID or UID:GID like 65534:65534");
    let (u, g) = s.split_once(':').unwrap_or((s, s));
    Ok((u.parse().map_err(|_| bad())?, g.parse().map_err(|_| bad())?))
}

fn parse_memlock(s: &str) -> Result<u64, String> {
    if s == "unlimited" {
        return Ok(u64::MAX);
    }
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(digits);
    let shift = match unit {
        "" => 0,
        "K" | "k" => 10,
        "M" | "m" => 20,
        "G" | "g" => 30,
        "T" | "t" => 40,
        _ => {
            return Err(format!(
                "invalid size {s:?}: expected a number with K, M, G or T, or `unlimited`"
            ))
        }
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1 << shift))
        .ok_or_else(|| format!("invalid size {s:?}: expected a number with K, M, G or T, or `unlimited`"))
}

fn open_rw(host: &HostRoot, node: &Path) -> Result<File, LaunchError> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(node)
        .map_err(|source| LaunchError::Open {
            node: host.display(node),
            source,
        })
}

/// Clear `FD_CLOEXEC` so the descriptor survives `exec`.
fn inherit(fd: &OwnedFd) -> Result<(), LaunchError> {
    rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::empty()).map_err(|e| LaunchError::Inherit {
        fd: fd.as_raw_fd(),
        source: e.into(),
    })
}

/// Plan and open; on success this does not return (the process becomes the VMM).
/// `gpupass launch`: on success it does not return (the VMM replaces this process).
pub(crate) fn run(ctx: &Ctx, a: LaunchArgs, _out: &mut dyn Write) -> Result<Exit, Error> {
    ctx.live("launch")?;
    Ok(launch(&ctx.host, &ctx.inventory()?, &a)?)
}

fn launch(host: &HostRoot, inv: &Inventory, a: &LaunchArgs) -> Result<Exit, VmOutError> {
    // What was asked (PCI functions only), the kernel (E-BACKEND-01 names what is missing),
    // the live host, then every function of the selection must be servable through its cdev.
    let sel = select(inv, &a.devices, a.only, Consumer::Qemu)?;
    if let Some(m) = sel.mdevs().next() {
        return Err(VmOutError::Usage(format!(
            "gpupass launch passes PCI functions (their cdevs), not mdev {}: put the mdev on the QEMU command line with `gpupass qemu-args` (sysfsdev=)",
            m.instance.uuid
        )));
    }
    backend::resolve_vm(Policy::Iommufd, inv, &[], None)?;
    if host.root() != Path::new("/") {
        return Err(LaunchError::NotLive {
            root: host.root().to_path_buf(),
        }
        .into());
    }
    let addrs: Vec<_> = sel.functions().map(|f| f.device.address).collect();
    backend::resolve_vm(Policy::Iommufd, inv, &addrs, None)?;
    // The plan (window, address bits) before anything is opened: the window goes above the
    // guest RAM the VMM's own `-m` gives (QEMU's default without), placed as OVMF does.
    let plan = crate::output::plan::plan(
        inv,
        &sel,
        &crate::output::plan::VmRequest {
            renderer: crate::output::plan::Renderer::Qemu,
            memory_kib: qemu_ram(&a.command).map(|b| b >> 10),
            vcpus: None,
            firmware: crate::output::layout::GuestFirmware::Ovmf,
            hole64: crate::output::layout::Hole64::Auto,
            phys_bits: None,
            numa: crate::output::plan::NumaMode::Off,
            hugepages: crate::output::layout::HugePages::Off,
            viommu: false,
            memtune: false,
            // The guest's address bits: `-cpu host,host-phys-bits=on[,...]` unless the VMM's
            // own command has a `-cpu` (QEMU takes only the last one); then a note says what
            // to add.
            cpu: Some(match &a.cpu {
                Some(m) => m.clone(),
                None if a.command.iter().any(|c| c == "-cpu") => "none".to_string(),
                None => "host".to_string(),
            }),
        },
    )?;

    let iommu_node = host.dev_iommu();
    let iommu = open_rw(host, &iommu_node)?;
    if !a.keep_user_accounting {
        iommufd_set_rlimit_mode(&iommu, 1).map_err(|source| LaunchError::RlimitMode {
            node: host.display(&iommu_node),
            source,
        })?;
    }
    let iommu: OwnedFd = iommu.into();
    inherit(&iommu)?;
    let mut held: Vec<OwnedFd> = Vec::new();
    let mut fds = PassedFds {
        iommufd: iommu.as_raw_fd(),
        devices: Vec::new(),
    };
    for f in sel.functions() {
        let Some(cdev) = &f.device.vfio_cdev else {
            // resolve_vm checked every function has one; keep the error should it not.
            return Err(backend::BackendError::IommufdUnavailable {
                what: f.device.address.to_string(),
                reason: backend::why_not_iommufd(inv, &f.device),
            }
            .into());
        };
        let node: PathBuf = host.dev_vfio().join("devices").join(cdev);
        let fd: OwnedFd = open_rw(host, &node)?.into();
        inherit(&fd)?;
        fds.devices.push((f.device.address, fd.as_raw_fd()));
        held.push(fd);
    }
    let opts = QemuOptions {
        first_slot: a.first_slot,
        iommufd: true,
        fds: Some(fds),
        cpu: plan.cpu.as_ref().map(|c| c.model.clone()).filter(|m| m != "none"),
        // The VMM's own `-m` sets the RAM the plan placed the window above.
        guest_memory: false,
        ..QemuOptions::default()
    };
    // Of the plan's notes, launch says only what `-cpu` gives the guest.
    for n in plan.notes.iter().filter(|n| matches!(n, Note::Cpu { .. })) {
        crate::messages::note(n);
    }
    let extra = qemu::args(&sel, &opts, &plan)?;
    if let Some(limit) = a.memlock {
        let v = if limit == u64::MAX { None } else { Some(limit) };
        rustix::process::setrlimit(
            rustix::process::Resource::Memlock,
            rustix::process::Rlimit {
                current: v,
                maximum: v,
            },
        )
        .map_err(|e| LaunchError::Memlock {
            value: v.map_or("unlimited".into(), |n| n.to_string()),
            source: e.into(),
        })?;
    }
    let (program, own) = a.command.split_first().expect("clap requires the VMM");
    let mut cmd = std::process::Command::new(program);
    cmd.args(own).args(&extra);
    if let Some((uid, gid)) = a.user {
        // std drops the supplementary groups (setgroups(0)) when root sets a uid.
        cmd.gid(gid).uid(uid);
    }
    if a.print {
        let shown: Vec<String> = std::iter::once(program.to_string_lossy().into_owned())
            .chain(own.iter().map(|s| s.to_string_lossy().into_owned()))
            .chain(extra.iter().cloned())
            .collect();
        crate::messages::line(format_args!(
            "gpupass launch: {}",
            qemu::text(&shown).trim_end().replace('\n', " ")
        ));
    }
    // exec returns only on failure; the descriptors close with `held` and `iommu`.
    let e = cmd.exec();
    Err(LaunchError::Exec {
        program: PathBuf::from(&program),
        source: e,
    }
    .into())
}

/// The guest RAM in bytes that a QEMU command line's `-m` gives (`-m 8G`, `-m 8192`,
/// `-m size=8G,slots=2,maxmem=16G`; a bare number is MiB, suffixes K/M/G/T); `None` without one
/// (QEMU's default 128 MiB) or when it cannot be read. The last `-m` counts, as for QEMU.
pub(crate) fn qemu_ram(command: &[OsString]) -> Option<u64> {
    let mut ram = None;
    let mut it = command.iter();
    while let Some(arg) = it.next() {
        if arg != "-m" && arg != "--m" {
            continue;
        }
        let v = it.next().and_then(|v| v.to_str())?;
        let size = v
            .split(',')
            .find_map(|kv| match kv.split_once('=') {
                Some(("size", s)) => Some(s),
                Some(_) => None,
                None => Some(kv),
            })
            .unwrap_or("");
        let digits = size.find(|c: char| !c.is_ascii_digit()).unwrap_or(size.len());
        let (num, unit) = size.split_at(digits);
        let shift = match unit {
            "" | "M" | "m" => 20,
            "K" | "k" => 10,
            "G" | "g" => 30,
            "T" | "t" => 40,
            _ => return None,
        };
        ram = num.parse::<u64>().ok().and_then(|n| n.checked_mul(1 << shift));
    }
    ram
}

vmm_sys_util::ioctl_io_nr!(IOMMU_OPTION, 0x3b, 0x87);

/// `IOMMU_OPTION_RLIMIT_MODE` = `mode` on an open `/dev/iommu` (`gpupass launch`): 0 charges
/// pinned pages to the user's `RLIMIT_MEMLOCK`, 1 to the process's. A global option (object
/// id 0) that needs `CAP_SYS_RESOURCE`.
pub(crate) fn iommufd_set_rlimit_mode(iommu: &File, mode: u64) -> std::io::Result<()> {
    use iommufd_bindings::iommufd::{
        iommu_option, iommufd_option_IOMMU_OPTION_RLIMIT_MODE, iommufd_option_ops_IOMMU_OPTION_OP_SET,
    };
    let mut opt = iommu_option {
        size: std::mem::size_of::<iommu_option>() as u32,
        option_id: iommufd_option_IOMMU_OPTION_RLIMIT_MODE,
        op: iommufd_option_ops_IOMMU_OPTION_OP_SET as u16,
        __reserved: 0,
        object_id: 0,
        val64: mode,
    };
    // SAFETY: `iommu` is an open /dev/iommu; IOMMU_OPTION reads and writes exactly one
    // `struct iommu_option`, whose `size` field tells the kernel its length, and `opt` lives
    // across the call.
    let ret = unsafe { vmm_sys_util::ioctl::ioctl_with_mut_ref(iommu, IOMMU_OPTION(), &mut opt) };
    if ret < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_ram_from_the_vmm_command() {
        let argv = |a: &[&str]| a.iter().map(OsString::from).collect::<Vec<_>>();
        assert_eq!(
            qemu_ram(&argv(&["qemu-system-x86_64", "-m", "8G"])),
            Some(8 << 30)
        );
        assert_eq!(qemu_ram(&argv(&["qemu", "-m", "4096"])), Some(4 << 30));
        assert_eq!(
            qemu_ram(&argv(&["qemu", "-m", "size=2T,slots=2,maxmem=4T"])),
            Some(2 << 40)
        );
        assert_eq!(qemu_ram(&argv(&["qemu", "-m", "1G", "-m", "3G"])), Some(3 << 30));
        assert_eq!(qemu_ram(&argv(&["qemu", "-smp", "4"])), None);
        assert_eq!(qemu_ram(&argv(&["qemu", "-m", "lots"])), None);
        assert_eq!(qemu_ram(&argv(&["qemu", "-m"])), None);
    }
}
