//! The shipped fixture hosts (written to `tests/fixtures/hosts/<name>` by
//! `cargo run --example gen_fixtures`) and the synthetic benchmark host.
//!
//! IDs, classes, BAR sizes and topologies follow real machines: a desktop with the GPU behind a
//! root port without ACS (root port, GPU and HDMI audio in one group), an 8-GPU HGX server with
//! PCIe switches on two NUMA nodes, an SR-IOV H200 with vendor-VFIO vGPU profiles, a Tesla T4
//! mdev parent, an A100 box whose `/dev/nvidiaN` minors are not in PCI order, and a legacy
//! bridge whose group mixes unrelated devices.

use crate::testkit::hostgen::{DevSpec, HostBuilder, IO, MEM, MEM64, MEM64_PREF, MEM_PREF, ROM};
use std::io;
use std::path::Path;

pub const NAMES: &[&str] = &[
    "workstation",
    "hgx-8gpu",
    "sriov-vgpu",
    "mdev-t4",
    "nvidia-minors",
    "legacy-bridge",
    "vfio-numa",
    "mdev-lab",
];

pub fn build(name: &str, root: &Path) -> io::Result<()> {
    match name {
        "workstation" => workstation(root),
        "hgx-8gpu" => hgx(root),
        "sriov-vgpu" => sriov(root),
        "mdev-t4" => mdev_t4(root),
        "nvidia-minors" => nvidia_minors(root),
        "legacy-bridge" => legacy_bridge(root),
        "vfio-numa" => vfio_numa(root),
        "mdev-lab" => mdev_lab(root),
        _ => Err(io::Error::other(format!("unknown fixture {name}"))),
    }
}

const INTEL: u16 = 0x8086;
const NVIDIA: u16 = 0x10de;

fn host_bridge(h: &mut HostBuilder, group: u32) -> io::Result<()> {
    h.add(
        &DevSpec::new("00:00.0", INTEL, 0xa700, 0x060000)
            .group(group)
            .reset(None)
            .driver("skl_uncore"),
    )
}

/// Desktop: iGPU boot VGA, RTX 4090 + HDMI audio behind a root port without ACS, NVMe, NIC.
fn workstation(root: &Path) -> io::Result<()> {
    let mut h = HostBuilder::new(root)?;
    h.kernel(
        "6.8.0-45-generic",
        "BOOT_IMAGE=/vmlinuz-6.8.0-45-generic root=UUID=1b2c ro quiet splash intel_iommu=on iommu=pt",
        &[
            "vfio",
            "vfio_pci",
            "vfio_iommu_type1",
            "vfio_pci_core",
            "kvm",
            "kvm_intel",
            "nvidia",
            "snd_hda_intel",
        ],
    )?;
    h.file("sys/firmware/acpi/tables/DMAR", "")?;
    h.file(
        "proc/interrupts",
        "           CPU0\n 120:          0  IR-PCI-MSI-0000:01:00.0    0-edge      nvidia\n",
    )?;
    h.file("dev/kvm", "")?;
    h.file("dev/vfio/vfio", "")?;
    host_bridge(&mut h, 0)?;
    h.add(
        &DevSpec::new("00:01.0", INTEL, 0xa70d, 0x060400)
            .group(1)
            .driver("pcieport")
            .reset(None)
            .numa(-1, "0-15"),
    )?;
    h.add(
        &DevSpec::new("00:02.0", INTEL, 0xa780, 0x030000)
            .group(2)
            .driver("i915")
            .boot_vga(true)
            .sub(0x1043, 0x8882)
            .rev(0x04)
            .res(0, 0x6000000000, 16 << 20, MEM64)
            .res(2, 0x4000000000, 256 << 20, MEM64_PREF)
            .res(4, 0x4000, 64, IO)
            .reset(Some("flr bus"))
            .numa(-1, "0-15"),
    )?;
    h.add(
        &DevSpec::new("01:00.0", NVIDIA, 0x2684, 0x030000)
            .under("00:01.0")
            .group(1)
            .driver("nvidia")
            .boot_vga(false)
            .sub(0x1043, 0x889c)
            .res(0, 0x84000000, 16 << 20, MEM)
            .res(1, 0x4400000000, 32 << 30, MEM64_PREF)
            .res(3, 0x4200000000, 32 << 20, MEM64_PREF)
            .res(5, 0x3000, 128, IO)
            .res(6, 0x85000000, 512 << 10, ROM)
            .reset(Some("bus"))
            .numa(-1, "0-15"),
    )?;
    h.add(
        &DevSpec::new("01:00.1", NVIDIA, 0x22ba, 0x040300)
            .under("00:01.0")
            .group(1)
            .driver("snd_hda_intel")
            .sub(0x1043, 0x889c)
            .res(0, 0x85080000, 16 << 10, MEM)
            .reset(Some("bus"))
            .numa(-1, "0-15"),
    )?;
    h.nvidia_info(
        &"01:00.0".parse().unwrap(),
        0,
        "NVIDIA GeForce RTX 4090",
        "GPU-5f0c1e9a-7d3b-4c8e-9a21-0b6d2f4e8c11",
    )?;
    h.add(
        &DevSpec::new("00:06.0", INTEL, 0xa74d, 0x060400)
            .group(3)
            .driver("pcieport")
            .reset(None),
    )?;
    h.add(
        &DevSpec::new("02:00.0", 0x144d, 0xa80a, 0x010802)
            .under("00:06.0")
            .group(4)
            .driver("nvme")
            .res(0, 0x84400000, 16 << 10, MEM64)
            .reset(Some("flr bus")),
    )?;
    h.add(
        &DevSpec::new("00:1c.0", INTEL, 0x7a38, 0x060400)
            .group(5)
            .driver("pcieport")
            .reset(None),
    )?;
    h.add(
        &DevSpec::new("03:00.0", INTEL, 0x125c, 0x020000)
            .under("00:1c.0")
            .group(6)
            .driver("igc")
            .res(0, 0x84200000, 1 << 20, MEM)
            .res(3, 0x84300000, 16 << 10, MEM)
            .reset(Some("flr bus")),
    )?;
    // What the host uses: the root filesystem on the NVMe disk, the NIC up, the iGPU driving
    // the console (fbcon on its framebuffer) and the desktop (Xorg has card1 open); the RTX
    // 4090 has DRM nodes but nothing holds them.
    let nvme: crate::model::PciAddress = "02:00.0".parse().unwrap();
    h.block_dev(&nvme, "nvme/nvme0", "nvme0n1", None, "259:0")?;
    h.block_dev(&nvme, "nvme/nvme0", "nvme0n1", Some("nvme0n1p1"), "259:1")?;
    h.block_dev(&nvme, "nvme/nvme0", "nvme0n1", Some("nvme0n1p2"), "259:2")?;
    h.mount("259:2", "/dev/nvme0n1p2", "/", "ext4")?;
    h.mount("259:1", "/dev/nvme0n1p1", "/boot/efi", "vfat")?;
    h.net_iface(&"03:00.0".parse().unwrap(), "enp3s0", true)?;
    let igpu: crate::model::PciAddress = "00:02.0".parse().unwrap();
    let rtx: crate::model::PciAddress = "01:00.0".parse().unwrap();
    h.drm_node(&rtx, "card0")?;
    h.drm_node(&rtx, "renderD128")?;
    h.drm_node(&igpu, "card1")?;
    h.drm_node(&igpu, "renderD129")?;
    h.framebuffer(&igpu, "fb0")?;
    h.vtconsole(0, "(S) dummy device", false)?;
    h.vtconsole(1, "(M) frame buffer device", true)?;
    h.open_fd(1337, "Xorg", 14, "/dev/dri/card1")?;
    h.add(
        &DevSpec::new("00:1f.3", INTEL, 0x7a50, 0x040300)
            .group(7)
            .driver("snd_hda_intel")
            .res(0, 0x6001000000, 16 << 10, MEM64),
    )?;
    h.add(
        &DevSpec::new("00:1f.4", INTEL, 0x7a23, 0x0c0500)
            .group(7)
            .driver("i801_smbus")
            .reset(None),
    )?;
    Ok(())
}

/// HGX H100 8-GPU: each GPU behind its own switch downstream port, 4 per NUMA node, all on the
/// native driver, two ConnectX-7 NICs.
fn hgx(root: &Path) -> io::Result<()> {
    let mut h = HostBuilder::new(root)?;
    h.kernel(
        "6.1.0-27-amd64",
        "BOOT_IMAGE=/boot/vmlinuz-6.1.0-27-amd64 root=/dev/md0 ro amd_iommu=on iommu=pt",
        &["vfio", "nvidia", "nvidia_uvm", "mlx5_core", "kvm", "kvm_amd"],
    )?;
    h.file("sys/firmware/acpi/tables/IVRS", "")?;
    h.file("dev/kvm", "")?;
    h.cpu_address_bits(52, 57)?;
    // 1 GiB pages reserved at boot on both nodes (node 1's mostly taken by another guest).
    h.numa_node(0, "0-47,96-143", &[(2048, 0, 0), (1048576, 512, 512)])?;
    h.numa_node(1, "48-95,144-191", &[(2048, 0, 0), (1048576, 512, 64)])?;
    for u in 0..4 {
        // AMD-Vi, HATS 0: 4-level host page tables, 48-bit IOVAs.
        h.iommu_unit(&format!("ivhd{u}"), "58f77ef22294200:5")?;
    }
    let mut group = 10;
    for (i, (node, cpus)) in [(0, "0-47,96-143"), (1, "48-95,144-191")].iter().enumerate() {
        let rootbus = if i == 0 { 0x00u8 } else { 0x80u8 };
        let rp = format!("{rootbus:02x}:01.1");
        h.add(
            &DevSpec::new(&rp, 0x1022, 0x14ab, 0x060400)
                .group(group)
                .driver("pcieport")
                .reset(None)
                .numa(*node, cpus),
        )?;
        group += 1;
        let up_bus = rootbus + 1;
        let up = format!("{up_bus:02x}:00.0");
        h.add(
            &DevSpec::new(&up, 0x1000, 0xc010, 0x060400)
                .under(&rp)
                .group(group)
                .driver("pcieport")
                .reset(None)
                .numa(*node, cpus),
        )?;
        group += 1;
        for g in 0..4u8 {
            let dp = format!("{:02x}:{:02x}.0", up_bus + 1, g);
            h.add(
                &DevSpec::new(&dp, 0x1000, 0xc010, 0x060400)
                    .under(&up)
                    .group(group)
                    .driver("pcieport")
                    .reset(None)
                    .numa(*node, cpus),
            )?;
            group += 1;
            let gpu_bus = up_bus + 2 + g;
            let gpu = format!("{gpu_bus:02x}:00.0");
            let idx = i as u64 * 4 + g as u64;
            h.add(
                &DevSpec::new(&gpu, NVIDIA, 0x2330, 0x030200)
                    .under(&dp)
                    .group(group)
                    .driver("nvidia")
                    .sub(NVIDIA, 0x16c1)
                    .res(0, 0xe000_0000 + idx * 0x0100_0000, 16 << 20, MEM64)
                    .res(2, 0x0200_0000_0000 + idx * (128u64 << 30), 128 << 30, MEM64_PREF)
                    .res(4, 0x0300_0000_0000 + idx * (32u64 << 20), 32 << 20, MEM64_PREF)
                    .reset(Some("flr bus"))
                    .numa(*node, cpus),
            )?;
            h.nvidia_info(
                &gpu.parse().unwrap(),
                idx as u32,
                "NVIDIA H100 80GB HBM3",
                &format!("GPU-7a3f10{idx:02}-1c2d-4e5f-8a9b-0c1d2e3f4a5b"),
            )?;
            group += 1;
        }
        let nic = format!("{:02x}:00.0", up_bus + 6);
        let nrp = format!("{rootbus:02x}:03.1");
        h.add(
            &DevSpec::new(&nrp, 0x1022, 0x14ab, 0x060400)
                .group(group)
                .driver("pcieport")
                .reset(None)
                .numa(*node, cpus),
        )?;
        group += 1;
        h.add(
            &DevSpec::new(&nic, 0x15b3, 0x1021, 0x020700)
                .under(&nrp)
                .group(group)
                .driver("mlx5_core")
                .res(
                    0,
                    0x0180_0000_0000 + i as u64 * (64u64 << 20),
                    64 << 20,
                    MEM64_PREF,
                )
                .sriov(16)
                .numa(*node, cpus),
        )?;
        group += 1;
    }
    h.file("dev/nvidiactl", "")?;
    h.file("dev/nvidia-uvm", "")?;
    h.file("dev/nvidia-uvm-tools", "")?;
    // No ld.so.cache here: the library directories are searched instead.
    h.nvidia_driver_files("535.183.01", "usr/lib64", false)?;
    Ok(())
}

/// H200 with SR-IOV enabled: the PF on `nvidia`, four VFs on `nvidia` offering vendor-VFIO
/// vGPU profiles (kernel 6.8+, no mdev bus), one VF with a profile chosen.
fn sriov(root: &Path) -> io::Result<()> {
    let mut h = HostBuilder::new(root)?;
    h.kernel(
        "6.8.0-60-generic",
        "BOOT_IMAGE=/vmlinuz root=/dev/sda2 ro intel_iommu=on",
        &[
            "vfio",
            "vfio_pci",
            "vfio_iommu_type1",
            "nvidia",
            "nvidia_vgpu_vfio",
            "kvm",
            "kvm_intel",
        ],
    )?;
    h.file("sys/firmware/acpi/tables/DMAR", "")?;
    h.file("dev/kvm", "")?;
    h.file("dev/vfio/vfio", "")?;
    h.file("dev/iommu", "")?;
    // Sapphire Rapids: 46-bit physical addresses; VT-d with a 48-bit MGAW; one node.
    h.cpu_address_bits(46, 57)?;
    h.numa_node(0, "0-31", &[(2048, 16384, 16384), (1048576, 0, 0)])?;
    for u in 0..2 {
        h.iommu_unit(&format!("dmar{u}"), "d2008c202f0466")?;
    }
    host_bridge(&mut h, 0)?;
    h.add(
        &DevSpec::new("40:01.0", INTEL, 0x352a, 0x060400)
            .group(20)
            .driver("pcieport")
            .reset(None)
            .numa(0, "0-31"),
    )?;
    h.add(
        &DevSpec::new("41:00.0", NVIDIA, 0x2335, 0x030200)
            .under("40:01.0")
            .group(21)
            .driver("nvidia")
            .sub(NVIDIA, 0x18be)
            .res(0, 0xa000_0000, 16 << 20, MEM64)
            .res(2, 0x200_0000_0000, 256 << 30, MEM64_PREF)
            .res(4, 0x240_0000_0000, 32 << 20, MEM64_PREF)
            .res(7, 0xa100_0000, 16 << 20, MEM64)
            .res(9, 0x260_0000_0000, 8 << 30, MEM64_PREF)
            .sriov(16)
            .numa(0, "0-31"),
    )?;
    h.nvidia_info(
        &"41:00.0".parse().unwrap(),
        0,
        "NVIDIA H200",
        "GPU-2f8e7d6c-5b4a-4392-8170-6f5e4d3c2b1a",
    )?;
    let profiles = [
        (1043, "NVIDIA H200-1-18C"),
        (1044, "NVIDIA H200-2-35C"),
        (1045, "NVIDIA H200-4-71C"),
    ];
    for (i, vf) in ["41:00.4", "41:00.5", "41:00.6", "41:00.7"].iter().enumerate() {
        h.add(
            &DevSpec::new(vf, NVIDIA, 0x2335, 0x030200)
                .vf_of("41:00.0")
                .group(22 + i as u32)
                .driver("nvidia")
                .sub(NVIDIA, 0x18be)
                .res(0, 0xa100_0000 + i as u64 * (4 << 20), 4 << 20, MEM64)
                .res(2, 0x260_0000_0000 + i as u64 * (2u64 << 30), 2 << 30, MEM64_PREF)
                .reset(Some("flr"))
                .numa(0, "0-31"),
        )?;
        let current = if i == 0 { 1044 } else { 0 };
        let offer: &[(u32, &str)] = if i == 0 { &[] } else { &profiles };
        h.nvidia_vgpu(&vf.parse().unwrap(), offer, current)?;
    }
    Ok(())
}

/// Tesla T4 with GRID mdev types (pre-Ada vGPU), one active instance.
fn mdev_t4(root: &Path) -> io::Result<()> {
    let mut h = HostBuilder::new(root)?;
    h.kernel(
        "5.15.0-119-generic",
        "BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro intel_iommu=on iommu=pt",
        &[
            "vfio",
            "vfio_pci",
            "vfio_iommu_type1",
            "mdev",
            "nvidia",
            "nvidia_vgpu_vfio",
            "kvm",
            "kvm_intel",
        ],
    )?;
    h.file("sys/firmware/acpi/tables/DMAR", "")?;
    h.file("dev/kvm", "")?;
    h.file("dev/vfio/vfio", "")?;
    host_bridge(&mut h, 0)?;
    h.add(
        &DevSpec::new("3a:00.0", INTEL, 0x2030, 0x060400)
            .group(30)
            .driver("pcieport")
            .reset(None)
            .numa(0, "0-19"),
    )?;
    let t4: crate::model::PciAddress = "3b:00.0".parse().unwrap();
    h.add(
        &DevSpec::new("3b:00.0", NVIDIA, 0x1eb8, 0x030200)
            .under("3a:00.0")
            .group(31)
            .driver("nvidia")
            .sub(NVIDIA, 0x12a2)
            .res(0, 0xc400_0000, 16 << 20, MEM)
            .res(1, 0x38_0000_0000, 256 << 20, MEM64_PREF)
            .res(3, 0x38_1000_0000, 32 << 20, MEM64_PREF)
            .numa(0, "0-19"),
    )?;
    h.nvidia_info(&t4, 0, "Tesla T4", "GPU-9d8c7b6a-5f4e-4d3c-2b1a-0f9e8d7c6b5a")?;
    for (id, name, avail) in [
        ("nvidia-222", "GRID T4-1B", 15u32),
        ("nvidia-223", "GRID T4-2B", 0),
        ("nvidia-230", "GRID T4-4Q", 0),
        ("nvidia-234", "GRID T4-16Q", 0),
    ] {
        h.mdev_type(
            &t4,
            id,
            name,
            &format!(
                "num_heads=4, frl_config=45, framebuffer={}M, max_resolution=5120x2880, max_instance=16",
                1024
            ),
            avail,
            "vfio-pci",
        )?;
    }
    h.mdev_instance(&t4, "nvidia-222", "2f3e4d5c-6b7a-4988-8776-655443322110", 100)?;
    Ok(())
}

/// Four A100s whose driver minors are 2, 0, 3, 1 in PCI order (seen on real A100 boxes).
fn nvidia_minors(root: &Path) -> io::Result<()> {
    let mut h = HostBuilder::new(root)?;
    h.kernel(
        "5.15.0-119-generic",
        "BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro",
        &["nvidia", "nvidia_uvm", "nvidia_modeset"],
    )?;
    h.file("dev/nvidiactl", "")?;
    h.file("dev/nvidia-uvm", "")?;
    h.file("dev/nvidia-uvm-tools", "")?;
    h.file("dev/nvidia-modeset", "")?;
    h.nvidia_driver_files("550.90.07", "usr/lib/x86_64-linux-gnu", true)?;
    for (i, (bus, minor)) in [(0x07u8, 2u32), (0x0f, 0), (0x47, 3), (0x4e, 1)]
        .iter()
        .enumerate()
    {
        let addr = format!("{bus:02x}:00.0");
        let node = if *bus < 0x40 { 0 } else { 1 };
        h.add(
            &DevSpec::new(&addr, NVIDIA, 0x20b0, 0x030200)
                .sub(NVIDIA, 0x134f)
                .driver("nvidia")
                .res(0, 0xe000_0000 + i as u64 * 0x0200_0000, 16 << 20, MEM)
                .res(
                    1,
                    0x200_0000_0000 + i as u64 * (64u64 << 30),
                    64 << 30,
                    MEM64_PREF,
                )
                .res(
                    3,
                    0x300_0000_0000 + i as u64 * (32u64 << 20),
                    32 << 20,
                    MEM64_PREF,
                )
                .numa(node, if node == 0 { "0-31" } else { "32-63" }),
        )?;
        h.nvidia_info(
            &addr.parse().unwrap(),
            *minor,
            "NVIDIA A100-SXM4-40GB",
            &format!("GPU-a100{i:04}-0000-4000-8000-00000000000{i}"),
        )?;
    }
    Ok(())
}

/// A conventional PCI bridge without ACS: bridge, an old Radeon and a NIC share one group.
fn legacy_bridge(root: &Path) -> io::Result<()> {
    let mut h = HostBuilder::new(root)?;
    h.kernel(
        "6.1.0-27-amd64",
        "BOOT_IMAGE=/boot/vmlinuz root=/dev/sda1 ro quiet",
        &["kvm", "kvm_intel", "radeon", "e1000e"],
    )?;
    h.file("sys/firmware/acpi/tables/DMAR", "")?;
    host_bridge(&mut h, 0)?;
    h.add(
        &DevSpec::new("00:1e.0", INTEL, 0x244e, 0x060401)
            .group(5)
            .reset(None),
    )?;
    h.add(
        &DevSpec::new("05:00.0", 0x1002, 0x68f9, 0x030000)
            .under("00:1e.0")
            .group(5)
            .driver("radeon")
            .boot_vga(true)
            .res(0, 0xd000_0000, 256 << 20, MEM_PREF)
            .res(2, 0xfe9e_0000, 128 << 10, MEM64)
            .res(4, 0xe000, 256, IO)
            .reset(None),
    )?;
    h.add(
        &DevSpec::new("05:01.0", INTEL, 0x107c, 0x020000)
            .under("00:1e.0")
            .group(5)
            .driver("e1000")
            .res(0, 0xfe9c_0000, 128 << 10, MEM)
            .reset(None),
    )?;
    // The Radeon is the boot VGA with the framebuffer console; the NIC carries the network.
    h.framebuffer(&"05:00.0".parse().unwrap(), "fb0")?;
    h.vtconsole(0, "(S) dummy device", false)?;
    h.vtconsole(1, "(M) frame buffer device", true)?;
    h.net_iface(&"05:01.0".parse().unwrap(), "enp5s1", true)?;
    Ok(())
}

/// The QEMU lab guest's mdev side: the kernel's sample drivers mbochs, mdpy and mtty are
/// *virtual* parents (`sys/devices/virtual/<drv>/<drv>`, listed in `sys/class/mdev_bus`), with
/// the types and counts of `modprobe mbochs count=128` (MB), mdpy and mtty on Debian's 6.1
/// kernel; one mbochs instance is active and held open by a QEMU process; two mdevctl
/// definitions exist (one auto, one manual).
fn mdev_lab(root: &Path) -> io::Result<()> {
    let mut h = HostBuilder::new(root)?;
    h.kernel(
        "6.1.0-57-amd64",
        "console=ttyS0 panic=-1 quiet intel_iommu=on iommu=pt",
        &[
            "vfio",
            "vfio_pci",
            "vfio_iommu_type1",
            "mdev",
            "mbochs",
            "mdpy",
            "mtty",
            "bochs",
        ],
    )?;
    h.file("sys/firmware/acpi/tables/DMAR", "")?;
    h.file("dev/vfio/vfio", "")?;
    h.add(
        &DevSpec::new("00:00.0", INTEL, 0x29c0, 0x060000)
            .group(0)
            .reset(None),
    )?;
    h.add(
        &DevSpec::new("00:02.0", 0x1234, 0x1111, 0x030000)
            .group(1)
            .driver("bochs-drm")
            .boot_vga(true)
            .res(0, 0xfd00_0000, 16 << 20, MEM_PREF)
            .res(2, 0xfebf_0000, 4 << 10, MEM)
            .reset(None),
    )?;
    h.virtual_mdev_parent(
        "mbochs",
        "mbochs",
        &[
            (
                "mbochs-small",
                "mbochs-small",
                Some("virtual display, 4 MB video memory"),
                31,
                "vfio-pci",
            ),
            (
                "mbochs-medium",
                "mbochs-medium",
                Some("virtual display, 16 MB video memory"),
                7,
                "vfio-pci",
            ),
            (
                "mbochs-large",
                "mbochs-large",
                Some("virtual display, 64 MB video memory"),
                1,
                "vfio-pci",
            ),
        ],
    )?;
    h.virtual_mdev_parent(
        "mdpy",
        "mdpy",
        &[
            (
                "mdpy-vga",
                "mdpy-vga",
                Some("virtual display, 640x480 framebuffer"),
                4,
                "vfio-pci",
            ),
            (
                "mdpy-xga",
                "mdpy-xga",
                Some("virtual display, 1024x768 framebuffer"),
                4,
                "vfio-pci",
            ),
            (
                "mdpy-hd",
                "mdpy-hd",
                Some("virtual display, 1920x1080 framebuffer"),
                4,
                "vfio-pci",
            ),
        ],
    )?;
    h.virtual_mdev_parent(
        "mtty",
        "mtty",
        &[
            ("mtty-1", "Single port serial", None, 24, "vfio-pci"),
            ("mtty-2", "Dual port serial", None, 12, "vfio-pci"),
        ],
    )?;
    let busy = "83b8f4f2-509f-382f-3c1e-e6bfe0fa1001";
    h.virtual_mdev_instance("mbochs", "mbochs", "mbochs-small", busy, 12)?;
    h.process_fd(4242, "qemu-system-x86", 23, "/dev/vfio/12")?;
    h.process_fd(4242, "qemu-system-x86", 22, "/dev/vfio/vfio")?;
    h.file(
        format!("etc/mdevctl.d/mbochs/{busy}"),
        "{\n  \"mdev_type\": \"mbochs-small\",\n  \"start\": \"auto\",\n  \"attrs\": []\n}",
    )?;
    h.file(
        "etc/mdevctl.d/mdpy/5e1a3b9c-0d2f-4e6a-8b7c-9d0e1f2a3b4c",
        "{\n  \"mdev_type\": \"mdpy-xga\",\n  \"start\": \"manual\",\n  \"attrs\": []\n}",
    )?;
    Ok(())
}

/// A VFIO host on two NUMA nodes (kernel 6.8 with the VFIO cdev and iommufd): four L40S on
/// vfio-pci, two per node, each alone in its group; an RTX A6000 with its HDMI audio in one
/// group on vfio-pci; one more L40S left on the native driver.
fn vfio_numa(root: &Path) -> io::Result<()> {
    let mut h = HostBuilder::new(root)?;
    h.kernel(
        "6.8.0-60-generic",
        "BOOT_IMAGE=/vmlinuz root=/dev/sda2 ro intel_iommu=on iommu=pt",
        &[
            "vfio",
            "vfio_pci",
            "vfio_pci_core",
            "vfio_iommu_type1",
            "iommufd",
            "nvidia",
            "kvm",
            "kvm_intel",
        ],
    )?;
    h.file("sys/firmware/acpi/tables/DMAR", "")?;
    h.file("dev/kvm", "")?;
    h.file("dev/iommu", "")?;
    // Two sockets, 46-bit physical addresses, VT-d with a 48-bit MGAW, 1 GiB pages on node 0.
    h.cpu_address_bits(46, 48)?;
    h.numa_node(0, "0-31,64-95", &[(2048, 0, 0), (1048576, 128, 128)])?;
    h.numa_node(1, "32-63,96-127", &[(2048, 4096, 4096), (1048576, 0, 0)])?;
    for u in 0..4 {
        h.iommu_unit(&format!("dmar{u}"), "d2008c202f0466")?;
    }
    host_bridge(&mut h, 0)?;
    let l40s = |addr: &str, g: u32, node: i32| {
        DevSpec::new(addr, NVIDIA, 0x26b9, 0x030200)
            .group(g)
            .sub(NVIDIA, 0x1851)
            .res(0, 0xd000_0000 + g as u64 * 0x0100_0000, 16 << 20, MEM)
            .res(
                1,
                0x200_0000_0000 + g as u64 * (64u64 << 30),
                64 << 30,
                MEM64_PREF,
            )
            .res(
                3,
                0x300_0000_0000 + g as u64 * (32u64 << 20),
                32 << 20,
                MEM64_PREF,
            )
            .reset(Some("flr bus"))
            .numa(node, if node == 0 { "0-31,64-95" } else { "32-63,96-127" })
    };
    let mut cdev = 0u32;
    for (rp, gpu, rg, g, node) in [
        ("16:01.0", "17:00.0", 1u32, 40u32, 0),
        ("30:01.0", "31:00.0", 2, 41, 0),
        ("c9:01.0", "ca:00.0", 5, 60, 1),
        ("e2:01.0", "e3:00.0", 6, 61, 1),
    ] {
        h.add(
            &DevSpec::new(rp, INTEL, 0x352a, 0x060400)
                .group(rg)
                .driver("pcieport")
                .reset(None)
                .numa(node, if node == 0 { "0-31,64-95" } else { "32-63,96-127" }),
        )?;
        h.add(&l40s(gpu, g, node).under(rp).driver("vfio-pci"))?;
        h.vfio_cdev(&gpu.parse().unwrap(), cdev)?;
        h.file(format!("dev/vfio/{g}"), "")?;
        cdev += 1;
    }
    h.add(
        &DevSpec::new("4a:01.0", INTEL, 0x352a, 0x060400)
            .group(3)
            .driver("pcieport")
            .reset(None)
            .numa(0, "0-31,64-95"),
    )?;
    h.add(
        &DevSpec::new("4b:00.0", NVIDIA, 0x2230, 0x030000)
            .under("4a:01.0")
            .group(42)
            .driver("vfio-pci")
            .sub(NVIDIA, 0x1459)
            .res(0, 0xc400_0000, 16 << 20, MEM)
            .res(1, 0x380_0000_0000, 64 << 30, MEM64_PREF)
            .res(3, 0x381_0000_0000, 32 << 20, MEM64_PREF)
            .res(5, 0x5000, 128, IO)
            .reset(Some("bus"))
            .numa(0, "0-31,64-95"),
    )?;
    h.add(
        &DevSpec::new("4b:00.1", NVIDIA, 0x1aef, 0x040300)
            .under("4a:01.0")
            .group(42)
            .driver("vfio-pci")
            .sub(NVIDIA, 0x1459)
            .res(0, 0xc508_0000, 16 << 10, MEM)
            .reset(Some("bus"))
            .numa(0, "0-31,64-95"),
    )?;
    for a in ["4b:00.0", "4b:00.1"] {
        h.vfio_cdev(&a.parse().unwrap(), cdev)?;
        cdev += 1;
    }
    h.file("dev/vfio/42", "")?;
    h.add(
        &DevSpec::new("b0:01.0", INTEL, 0x352a, 0x060400)
            .group(4)
            .driver("pcieport")
            .reset(None)
            .numa(1, "32-63,96-127"),
    )?;
    h.add(&l40s("b1:00.0", 50, 1).under("b0:01.0").driver("nvidia"))?;
    h.nvidia_info(
        &"b1:00.0".parse().unwrap(),
        0,
        "NVIDIA L40S",
        "GPU-4c1a2b3d-0e5f-4a6b-8c7d-9e0f1a2b3c4d",
    )?;
    h.file("dev/nvidiactl", "")?;
    h.file("dev/nvidia-uvm", "")?;
    h.file("dev/vfio/vfio", "")?;
    Ok(())
}

/// Points `addr`'s driver link in a generated host at `driver` (an absolute link; gpupass
/// reads only its last component), making the driver's directory if needed: a bind as the
/// benches see it, without a kernel.
pub fn point_driver(root: &Path, addr: &str, driver: &str) -> io::Result<()> {
    let dev = std::fs::canonicalize(root.join("sys/bus/pci/devices").join(addr))?;
    let d = root.join("sys/bus/pci/drivers").join(driver);
    std::fs::create_dir_all(&d)?;
    match std::fs::remove_file(dev.join("driver")) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    std::os::unix::fs::symlink(&d, dev.join("driver"))
}

/// A large synthetic host for benchmarks: `gpus` GPUs each with an HDMI audio function behind
/// their own root port, plus NICs with many functions, until `total` functions exist.
pub fn synthetic(root: &Path, total: usize, gpus: usize) -> io::Result<()> {
    let mut h = HostBuilder::new(root)?;
    h.kernel(
        "6.1.0-27-amd64",
        "ro intel_iommu=on",
        &["vfio", "vfio_pci", "nvidia"],
    )?;
    // Each card sits behind its own root port on bus 0 of a domain; a domain holds up to 248
    // ports (devices 1-31, functions 0-7), each port's secondary bus is the next free bus.
    let mut k = 0u32;
    let mut alloc = || {
        let (d, i) = (k / 248, k % 248);
        k += 1;
        (
            format!("{d:04x}:00:{:02x}.{}", 1 + i / 8, i % 8),
            d,
            (i + 1) as u8,
        )
    };
    let mut count = 0usize;
    let mut group = 0u32;
    for i in 0..gpus {
        let (rp, d, b) = alloc();
        h.add(
            &DevSpec::new(&rp, INTEL, 0x352a, 0x060400)
                .group(group)
                .driver("pcieport")
                .reset(None),
        )?;
        group += 1;
        let gpu = format!("{d:04x}:{b:02x}:00.0");
        h.add(
            &DevSpec::new(&gpu, NVIDIA, 0x2684, 0x030000)
                .under(&rp)
                .group(group)
                .driver("nvidia")
                .res(0, 0xe000_0000, 16 << 20, MEM)
                .res(1, 0x4400000000, 32 << 30, MEM64_PREF)
                .numa((i % 2) as i32, "0-15"),
        )?;
        h.add(
            &DevSpec::new(&format!("{d:04x}:{b:02x}:00.1"), NVIDIA, 0x22ba, 0x040300)
                .under(&rp)
                .group(group)
                .driver("snd_hda_intel")
                .res(0, 0xe100_0000, 16 << 10, MEM),
        )?;
        group += 1;
        count += 3;
    }
    while count < total {
        let (rp, d, b) = alloc();
        h.add(
            &DevSpec::new(&rp, INTEL, 0x352a, 0x060400)
                .group(group)
                .driver("pcieport")
                .reset(None),
        )?;
        group += 1;
        count += 1;
        for f in 0..8u8 {
            if count >= total {
                break;
            }
            h.add(
                &DevSpec::new(&format!("{d:04x}:{b:02x}:00.{f}"), 0x15b3, 0x1021, 0x020000)
                    .under(&rp)
                    .group(group)
                    .driver("mlx5_core")
                    .res(0, 0x1_0000_0000 + f as u64 * 0x100_0000, 32 << 20, MEM64_PREF),
            )?;
            count += 1;
        }
        group += 1;
    }
    Ok(())
}
