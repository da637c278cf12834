//! VM outputs (`xml hostdev`, `xml domain`, `qemu-args`, `kubevirt`) run as the real binary
//! against the fixture hosts, compared with golden files, and checked by the real consumers:
//! every XML document by libvirt's own RNG schemas (`virt-xml-validate`, libvirt-clients) and
//! by `virsh -c test:///default define`, every QEMU property against the installed QEMU's
//! `-device X,help`, and the whole argument list by starting QEMU with it.
//!
//! The consumer checks fail, never skip, when a tool is missing: .ci/run installs
//! libvirt-clients and libxml2-utils, and the lab's QEMU 10.0 (lab/tools/qemu.sh).

use crate::util::*;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Re-point the `driver` link of each function in a scratch host (as a bind would leave it).
fn rebind(root: &Path, addrs: &[&str], driver: &str) {
    let ddir = root.join("sys/bus/pci/drivers").join(driver);
    std::fs::create_dir_all(&ddir).unwrap();
    for a in addrs {
        let dev = std::fs::canonicalize(root.join("sys/bus/pci/devices").join(a)).unwrap();
        let depth = dev
            .strip_prefix(std::fs::canonicalize(root).unwrap())
            .unwrap()
            .components()
            .count();
        let link = dev.join("driver");
        let _ = std::fs::remove_file(&link);
        let target = format!("{}sys/bus/pci/drivers/{driver}", "../".repeat(depth));
        std::os::unix::fs::symlink(target, &link).unwrap();
    }
}

/// A scratch copy of `name` with `addrs` bound to vfio-pci.
fn vfio_host(name: &str, addrs: &[&str]) -> tempfile::TempDir {
    let t = scratch_host(name);
    rebind(t.path(), addrs, "vfio-pci");
    t
}

fn run_root(root: &Path, args: &[&str]) -> Output {
    let mut all = vec!["--root", root.to_str().unwrap()];
    all.extend_from_slice(args);
    gpupass(&all)
}

/// Assert a failure with `code` that mentions every one of `needles`; no panic.
fn fails(o: &Output, code: i32, needles: &[&str]) -> String {
    let err = stderr(o);
    assert_eq!(
        o.status.code(),
        Some(code),
        "stdout:\n{}\nstderr:\n{err}",
        stdout(o)
    );
    for n in needles {
        assert!(err.contains(n), "stderr lacks {n:?}:\n{err}");
    }
    assert!(
        stdout(o).is_empty(),
        "nothing may be rendered on failure: {}",
        stdout(o)
    );
    err
}

const WS_GPU: &[&str] = &["0000:01:00.0", "0000:01:00.1"];
const T4_MDEV: &str = "2f3e4d5c-6b7a-4988-8776-655443322110";

fn tool(name: &str) -> Command {
    if name == "qemu-system-x86_64" {
        return lab_qemu();
    }
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {name}")])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(
        found,
        "{name} is not installed; it is the real consumer this test checks against \
         (apt-get install libvirt-clients libxml2-utils; .ci/run does it)"
    );
    Command::new(name)
}

/// The lab's QEMU (Debian's 10.0 from bookworm-backports, unpacked into the lab cache by
/// `lab/tools/qemu.sh`; nothing is installed): the QEMU the nested lab VMs run, so the
/// properties checked here are the ones that boot there.
fn lab_qemu() -> Command {
    let repo = manifest_dir();
    let cache = std::env::var("GPUPASS_LAB_CACHE").unwrap_or_else(|_| {
        format!(
            "{}/.cache/gpupass-lab",
            std::env::var("HOME").unwrap_or_else(|_| "/root".into())
        )
    });
    let o = Command::new("bash")
        .arg(repo.join("lab/tools/qemu.sh"))
        .args(["prepare", &cache])
        .output()
        .expect("run lab/tools/qemu.sh");
    assert!(
        o.status.success(),
        "lab/tools/qemu.sh could not provide QEMU 10.0 (it fetches Debian's qemu-system-x86 \
         from bookworm-backports into {cache}):\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    Command::new(String::from_utf8_lossy(&o.stdout).trim())
}

/// Validate a domain XML with libvirt's RNG schemas and define it on the test driver.
fn libvirt_accepts(xml: &str, what: &str) {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("domain.xml");
    std::fs::write(&f, xml).unwrap();
    let v = tool("virt-xml-validate").arg(&f).arg("domain").output().unwrap();
    assert!(
        v.status.success(),
        "virt-xml-validate rejects {what}:\n{}{}\n{xml}",
        String::from_utf8_lossy(&v.stdout),
        String::from_utf8_lossy(&v.stderr)
    );
    let d = tool("virsh")
        .args(["-c", "test:///default", "define"])
        .arg(&f)
        .output()
        .unwrap();
    assert!(
        d.status.success(),
        "virsh define rejects {what}:\n{}\n{xml}",
        String::from_utf8_lossy(&d.stderr)
    );
}

/// `<hostdev>` fragments wrapped in the smallest q35 domain, with root ports for guest buses.
fn wrap_hostdevs(frags: &str) -> String {
    let ports: String = (1..=5)
        .map(|i| format!("<controller type='pci' index='{i}' model='pcie-root-port'/>\n"))
        .collect();
    format!(
        "<domain type='kvm'>\n<name>wrap</name>\n<memory unit='MiB'>512</memory>\n\
         <os><type arch='x86_64' machine='q35'>hvm</type></os>\n<devices>\n\
         <controller type='pci' index='0' model='pcie-root'/>\n{ports}{frags}</devices>\n</domain>\n"
    )
}

#[test]
fn hostdev_xml_for_a_vfio_bound_gpu_group() {
    let h = vfio_host("workstation", WS_GPU);
    let o = run_root(h.path(), &["xml", "hostdev", "01:00.0"]);
    let xml = ok(&o);
    golden("workstation/xml-hostdev-01:00.0.xml", &xml);
    // Naming the GPU brings its HDMI audio (same IOMMU group), and says so.
    assert_eq!(xml.matches("<hostdev ").count(), 2);
    assert!(xml.contains("managed=\"no\""));
    let err = stderr(&o);
    assert!(
        err.contains("added 0000:01:00.1") && err.contains("--only"),
        "{err}"
    );
    assert!(err.contains("--guest-address"), "{err}");
    libvirt_accepts(&wrap_hostdevs(&xml), "hostdev 01:00.0");

    // One multifunction guest slot: function 0 flagged, the sibling in the same slot.
    let xml = ok(&run_root(
        h.path(),
        &[
            "xml",
            "hostdev",
            "01:00.1",
            "--guest-address",
            "0000:05:00.0",
            "--rom-bar",
            "off",
        ],
    ));
    golden("workstation/xml-hostdev-guest-address.xml", &xml);
    assert!(xml.contains(
        "<address type=\"pci\" domain=\"0x0000\" bus=\"0x05\" slot=\"0x00\" function=\"0x0\" multifunction=\"on\"/>"
    ));
    assert!(
        xml.contains("<address type=\"pci\" domain=\"0x0000\" bus=\"0x05\" slot=\"0x00\" function=\"0x1\"/>")
    );
    // --rom-bar goes to the function named (01:00.1), not to its companion.
    assert_eq!(xml.matches("<rom bar=\"off\"/>").count(), 1);
    let audio = xml.split("</hostdev>").nth(1).unwrap();
    assert!(
        audio.contains("function=\"0x1\"/>\n  </source>\n  <rom bar=\"off\"/>"),
        "{xml}"
    );
    libvirt_accepts(&wrap_hostdevs(&xml), "hostdev with guest address");

    // --only: just the named function, with a warning about the group.
    let o = run_root(h.path(), &["xml", "hostdev", "01:00.0", "--only", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&ok(&o)).unwrap();
    let list = v["hostdevs"].as_array().unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0]["device"], "0000:01:00.0");
    assert!(list[0]["xml"]
        .as_str()
        .unwrap()
        .starts_with("<hostdev mode=\"subsystem\" type=\"pci\""));
}

#[test]
fn hostdev_xml_managed_on_the_unbound_fixture_with_rom_file() {
    let o = on_host(
        "workstation",
        &[
            "xml",
            "hostdev",
            "0000:01:00.0",
            "--managed",
            "--rom-file",
            "/var/lib/roms/a&b \"4090\".rom",
        ],
    );
    let xml = ok(&o);
    golden("workstation/xml-hostdev-managed.xml", &xml);
    assert_eq!(xml.matches("managed=\"yes\"").count(), 2);
    assert!(
        xml.contains("file=\"/var/lib/roms/a&amp;b &quot;4090&quot;.rom\""),
        "{xml}"
    );
    libvirt_accepts(&wrap_hostdevs(&xml), "managed hostdev with rom file");
}

#[test]
fn mdev_hostdev_with_display() {
    let xml = ok(&on_host("mdev-t4", &["xml", "hostdev", T4_MDEV, "--display"]));
    golden("mdev-t4/xml-hostdev-mdev.xml", &xml);
    assert!(
        xml.contains("type=\"mdev\" model=\"vfio-pci\" display=\"on\""),
        "{xml}"
    );
    assert!(xml.contains(&format!("<address uuid=\"{T4_MDEV}\"/>")));
    assert!(
        !xml.contains("managed"),
        "mdev hostdevs take no managed attribute: {xml}"
    );
    libvirt_accepts(&wrap_hostdevs(&xml), "mdev hostdev");
    // Upper-case UUIDs resolve too.
    let upper = ok(&on_host(
        "mdev-t4",
        &["xml", "hostdev", &T4_MDEV.to_uppercase(), "--display"],
    ));
    assert_eq!(upper, xml);
}

#[test]
fn domain_xml_is_complete_and_libvirt_defines_it() {
    let h = vfio_host("workstation", WS_GPU);
    let xml = ok(&run_root(
        h.path(),
        &[
            "xml",
            "domain",
            "--name",
            "gpu-vm",
            "--memory",
            "16G",
            "--vcpus",
            "8",
            "--device",
            "01:00.0",
            "--disk",
            "/var/lib/libvirt/images/gpu-vm.qcow2",
        ],
    ));
    golden("workstation/xml-domain.xml", &xml);
    for want in [
        "<domain type=\"kvm\" xmlns:qemu=\"http://libvirt.org/schemas/domain/qemu/1.0\">",
        "<qemu:arg value=\"-fw_cfg\"/>",
        "machine=\"q35\">hvm</type>",
        "<os firmware=\"efi\">",
        "<acpi/>",
        "<apic/>",
        "<cpu mode=\"host-passthrough\"",
        "<memory unit=\"KiB\">16777216</memory>",
        "<vcpu placement=\"static\">8</vcpu>",
        "<controller type=\"pci\" index=\"1\" model=\"pcie-root-port\"/>",
        "<memballoon model=\"none\"/>",
        "<driver name=\"qemu\" type=\"qcow2\"/>",
        "bus=\"0x01\" slot=\"0x00\" function=\"0x0\" multifunction=\"on\"/>",
        "bus=\"0x01\" slot=\"0x00\" function=\"0x1\"/>",
    ] {
        assert!(xml.contains(want), "domain lacks {want}:\n{xml}");
    }
    assert!(!xml.contains("<iommu"), "no vIOMMU unless asked");
    libvirt_accepts(&xml, "domain with GPU");

    // GPU + vGPU + vIOMMU + locked memory + display, all in one.
    let h = vfio_host("hgx-8gpu", &["0000:03:00.0", "0000:04:00.0"]);
    let xml = ok(&run_root(
        h.path(),
        &[
            "xml",
            "domain",
            "--name",
            "train",
            "--memory",
            "512GiB",
            "--vcpus",
            "64",
            "--device",
            "03:00.0",
            "04:00.0",
            "--viommu",
            "--locked",
            "--firmware",
            "bios",
            // The HGX fixture's IOMMU (48 bits) is narrower than its CPU (52): whether the
            // limit is written depends on the target libvirt (9.3+), so the golden names one.
            "--libvirt-version",
            "9.0",
        ],
    ));
    golden("hgx-8gpu/xml-domain-2gpu.xml", &xml);
    assert!(xml.contains("<ioapic driver=\"qemu\"/>") && xml.contains("<iommu model=\"intel\">"));
    assert!(xml.contains("<memoryBacking>") && xml.contains("<locked/>"));
    assert!(!xml.contains("firmware="));
    assert!(xml.contains("index=\"2\" model=\"pcie-root-port\""));
    assert!(xml.contains("bus=\"0x02\" slot=\"0x00\" function=\"0x0\"/>"));
    libvirt_accepts(&xml, "two-GPU domain with vIOMMU");

    let xml = ok(&on_host(
        "mdev-t4",
        &[
            "xml",
            "domain",
            "--name",
            "vgpu",
            "--memory",
            "4096",
            "--vcpus",
            "2",
            "--device",
            T4_MDEV,
            "--display",
        ],
    ));
    golden("mdev-t4/xml-domain-vgpu.xml", &xml);
    assert!(xml.contains("display=\"on\"") && xml.contains("<graphics type=\"vnc\""));
    libvirt_accepts(&xml, "vGPU domain");
}

#[test]
fn names_and_paths_are_escaped_into_valid_xml() {
    let name = "a<b&c \"quoted\" 'single' ü → 日本";
    let disk = "/srv/vm images/a&b<'c\">.img";
    let xml = ok(&on_host(
        "workstation",
        &[
            "xml",
            "domain",
            "--name",
            name,
            "--memory",
            "2G",
            "--vcpus",
            "1",
            "--device",
            "01:00.0",
            "--managed",
            "--disk",
            disk,
        ],
    ));
    golden("workstation/xml-domain-escaped.xml", &xml);
    assert!(
        xml.contains("<name>a&lt;b&amp;c &quot;quoted&quot; &apos;single&apos; ü → 日本</name>"),
        "{xml}"
    );
    libvirt_accepts(&xml, "domain with an awkward name");
    // libvirt reads back exactly the name that was asked for.
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("d.xml");
    std::fs::write(&f, &xml).unwrap();
    let d = tool("virsh")
        .args(["-c", "test:///default", "define"])
        .arg(&f)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&d.stdout);
    assert!(said.contains(&format!("Domain '{name}' defined")), "{said}");
    // Names libvirt would refuse are usage errors.
    for bad in ["a/b", "a\nb", ""] {
        let o = on_host(
            "workstation",
            &[
                "xml",
                "domain",
                "--name",
                bad,
                "--memory",
                "1G",
                "--vcpus",
                "1",
                "--device",
                "01:00.0",
                "--managed",
            ],
        );
        assert_eq!(o.status.code(), Some(2), "{bad:?}: {}", stderr(&o));
    }
}

#[test]
fn qemu_args_golden() {
    let h = vfio_host("workstation", WS_GPU);
    let o = run_root(h.path(), &["qemu-args", "01:00.0", "--rom-bar", "off"]);
    let text = ok(&o);
    golden("workstation/qemu-args.txt", &text);
    assert_eq!(
        text,
        "-cpu host,host-phys-bits=on\n\
         -global q35-pcihost.pci-hole64-size=128G\n\
         -fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=131072\n\
         -device pcie-root-port,id=rp1,chassis=1,bus=pcie.0,addr=0x10.0\n\
         -device vfio-pci,host=0000:01:00.0,id=hostdev1,bus=rp1,addr=0x0.0,multifunction=on,rombar=0\n\
         -device vfio-pci,host=0000:01:00.1,id=hostdev2,bus=rp1,addr=0x0.1\n"
    );
    assert!(stderr(&o).contains("-machine q35"));
    let mdev = ok(&on_host("mdev-t4", &["qemu-args", T4_MDEV, "--display"]));
    golden("mdev-t4/qemu-args.txt", &mdev);
    assert!(mdev.contains(&format!("vfio-pci,sysfsdev=/sys/bus/mdev/devices/{T4_MDEV},")));
    assert!(mdev.contains(",display=on"));
    let json = ok(&run_root(h.path(), &["qemu-args", "01:00.0", "--json"]));
    golden("workstation/qemu-args.json", &json);
}

/// Properties of a QEMU device type, from `qemu-system-x86_64 -device TYPE,help`.
fn qemu_properties(dev: &str) -> BTreeSet<String> {
    let o = tool("qemu-system-x86_64")
        .args(["-nodefaults", "-device", &format!("{dev},help")])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
    let props: BTreeSet<String> = text
        .lines()
        .filter_map(|l| l.trim_start().split_once('=').map(|(k, _)| k.to_string()))
        .filter(|k| !k.contains(' '))
        .collect();
    // Every device has a bus address but the CPUs, which have a socket.
    assert!(
        props.contains("addr") || props.contains("socket-id"),
        "no properties parsed for {dev}:\n{text}"
    );
    props
}

/// Every `-device` argument gpupass renders for the fixture hosts.
fn all_rendered_devices() -> (Vec<Vec<String>>, Vec<tempfile::TempDir>) {
    let ws = vfio_host("workstation", WS_GPU);
    let hgx = vfio_host(
        "hgx-8gpu",
        &[
            "0000:03:00.0",
            "0000:04:00.0",
            "0000:05:00.0",
            "0000:06:00.0",
            "0000:83:00.0",
            "0000:84:00.0",
        ],
    );
    let lb = vfio_host("legacy-bridge", &["0000:05:00.0", "0000:05:01.0"]);
    let h200 = vfio_host("sriov-vgpu", &["0000:41:00.0"]);
    let runs: Vec<(PathBuf, Vec<&str>)> = vec![
        (
            ws.path().into(),
            vec![
                "qemu-args",
                "01:00.0",
                "--rom-bar",
                "off",
                "--rom-file",
                "/roms/a,b.rom",
            ],
        ),
        (
            ws.path().into(),
            vec!["qemu-args", "01:00.1", "--only", "--rom-bar", "on"],
        ),
        (
            hgx.path().into(),
            vec!["qemu-args", "03:00.0", "04:00.0", "05:00.0", "06:00.0"],
        ),
        (
            lb.path().into(),
            vec!["qemu-args", "05:00.0", "--first-slot", "0x1c"],
        ),
        // Two nodes: pxb-pcie expanders, guest nodes, node-bound 1 GiB-page memory backends.
        (
            hgx.path().into(),
            vec![
                "qemu-args",
                "03:00.0",
                "04:00.0",
                "83:00.0",
                "84:00.0",
                "--memory",
                "2G",
                "--vcpus",
                "4",
                "--hugepages",
                "1G",
            ],
        ),
        // One node: memory bound to it (2 MiB pages), the H200's 256 GiB BAR1 window.
        (
            h200.path().into(),
            vec![
                "qemu-args",
                "41:00.0",
                "--backend",
                "legacy",
                "--memory",
                "2G",
                "--hugepages",
                "2M",
            ],
        ),
        (host("mdev-t4"), vec!["qemu-args", T4_MDEV, "--display"]),
        // sriov-vgpu has the VFIO cdev and /dev/iommu, where `auto` picks iommufd: these
        // checks are of the legacy properties (qemu_args_on_iommufd checks the iommufd ones).
        (
            host("sriov-vgpu"),
            vec!["qemu-args", "41:00.4", "--backend", "legacy"],
        ),
    ];
    let mut out = Vec::new();
    for (root, args) in runs {
        let v: serde_json::Value =
            serde_json::from_str(&ok(&run_root(&root, &[&args[..], &["--json"]].concat()))).unwrap();
        let argv: Vec<String> = v["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_string())
            .collect();
        out.push(argv);
    }
    (out, vec![ws, hgx, lb, h200])
}

/// Split a QEMU option list on single commas (`,,` is a literal comma).
/// gpupass's `-cpu host,host-phys-bits=on[,host-phys-bits-limit=N]` for a TCG run: TCG has no
/// `host` model and takes no width from the host (host-phys-bits only works under KVM), so
/// `max` with the same properties and `phys-bits=48` standing in for a 48-bit host.
fn tcg_cpu(v: &str) -> String {
    let rest = v
        .strip_prefix("host")
        .expect("gpupass's -cpu starts with the host model");
    format!("max{rest},phys-bits=48")
}

fn split_opts(v: &str) -> Vec<String> {
    let mut parts = vec![String::new()];
    let mut chars = v.chars().peekable();
    while let Some(c) = chars.next() {
        if c == ',' {
            if chars.peek() == Some(&',') {
                chars.next();
                parts.last_mut().unwrap().push(',');
            } else {
                parts.push(String::new());
            }
        } else {
            parts.last_mut().unwrap().push(c);
        }
    }
    parts
}

#[test]
fn every_qemu_property_exists_in_the_installed_qemu() {
    let vfio = qemu_properties("vfio-pci");
    let port = qemu_properties("pcie-root-port");
    let pxb = qemu_properties("pxb-pcie");
    let cpu = qemu_properties("host-x86_64-cpu");
    assert!(
        cpu.contains("host-phys-bits") && cpu.contains("host-phys-bits-limit"),
        "{cpu:?}"
    );
    let object = |t: &str| -> BTreeSet<String> {
        let o = tool("qemu-system-x86_64")
            .args(["-object", &format!("{t},help")])
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter_map(|l| l.trim_start().split_once('=').map(|(k, _)| k.to_string()))
            .collect()
    };
    let (ram, memfd) = (object("memory-backend-ram"), object("memory-backend-memfd"));
    assert!(
        ram.contains("host-nodes") && memfd.contains("hugetlbsize"),
        "{ram:?} {memfd:?}"
    );
    let (runs, _keep) = all_rendered_devices();
    let mut checked = 0;
    for argv in &runs {
        for pair in argv.chunks(2) {
            // The window's -global and -fw_cfg, -m, -smp, -numa and -machine are checked by
            // starting QEMU with them (qemu_accepts_the_arguments_up_to_opening_the_host_device).
            if ["-global", "-fw_cfg", "-m", "-smp", "-numa", "-machine"].contains(&pair[0].as_str()) {
                continue;
            }
            let opts = split_opts(&pair[1]);
            let props = match (pair[0].as_str(), opts[0].as_str()) {
                ("-cpu", "host") => &cpu,
                ("-device", "vfio-pci") => &vfio,
                ("-device", "pcie-root-port") => &port,
                ("-device", "pxb-pcie") => &pxb,
                ("-object", "memory-backend-ram") => &ram,
                ("-object", "memory-backend-memfd") => &memfd,
                (a, other) => panic!("unexpected {a} {other}"),
            };
            for kv in &opts[1..] {
                let key = kv.split_once('=').map(|(k, _)| k).unwrap_or(kv);
                // `id` and `bus` are generic -device options, not device properties.
                assert!(
                    ["id", "bus"].contains(&key) || props.contains(key),
                    "{} has no property {key:?} in this QEMU (from {})",
                    opts[0],
                    pair[1]
                );
                checked += 1;
            }
        }
    }
    assert!(checked > 30, "checked only {checked} properties");
}

/// Start QEMU with the root ports and one VFIO device at a time: QEMU must get as far as
/// opening the host device (which does not exist here), proving it accepted every property,
/// bus name and address. Guarded so that QEMU cannot open a real device of this machine: it
/// can open a VFIO device only through a `/dev/vfio/<group>` node, and the test refuses to
/// run where one exists.
#[test]
fn qemu_accepts_the_arguments_up_to_opening_the_host_device() {
    if let Ok(entries) = std::fs::read_dir("/dev/vfio") {
        let groups: Vec<String> = entries
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n != "vfio" && n != "devices")
            .collect();
        assert!(
            groups.is_empty(),
            "this machine has VFIO groups {groups:?}: QEMU could open a real device, so this test refuses to run"
        );
    }
    let (runs, _keep) = all_rendered_devices();
    let mut started = 0;
    for argv in &runs {
        // Every argument but the VFIO devices: root ports, expanders, memory backends, guest
        // nodes, the 64-bit window's machine global and OVMF fw_cfg file. A property QEMU lacks
        // fails before any device is realized ("Property '...' not found"). This machine has one
        // host node and no hugepages reserved, so backends bind to node 0 and use normal pages
        // (the hugetlb properties are checked against `-object memory-backend-memfd,help`).
        let machine_args: Vec<String> = argv
            .chunks(2)
            .filter(|p| !p[1].starts_with("vfio-pci,"))
            .flat_map(|p| {
                if p[0] == "-cpu" {
                    return [p[0].clone(), tcg_cpu(&p[1])];
                }
                let v = split_opts(&p[1])
                    .into_iter()
                    .map(|kv| match kv.split_once('=') {
                        Some(("host-nodes", _)) => "host-nodes=0".to_string(),
                        Some(("hugetlb", _)) => "hugetlb=off".to_string(),
                        Some(("hugetlbsize" | "prealloc", _)) => String::new(),
                        _ => kv.replace(',', ",,"),
                    })
                    .filter(|kv| !kv.is_empty())
                    .collect::<Vec<_>>()
                    .join(",");
                [p[0].clone(), v]
            })
            .collect();
        let windowed = argv.iter().any(|a| a.starts_with("q35-pcihost.pci-hole64-size="));
        for dev in argv.chunks(2).filter(|p| p[1].starts_with("vfio-pci,")) {
            let mut cmd = tool("qemu-system-x86_64");
            cmd.args([
                "-machine",
                "q35,accel=tcg",
                "-nodefaults",
                "-display",
                "none",
                "-S",
            ])
            .args(["-monitor", "none", "-serial", "none"]);
            cmd.args(&machine_args);
            // gpupass sets -cpu with every window (mapped for TCG above).
            assert_eq!(
                windowed,
                argv.iter().any(|a| a == "-cpu"),
                "a window without the guest's address bits, or the reverse: {argv:?}"
            );
            cmd.args(["-device", &dev[1]]);
            let o = cmd.output().unwrap();
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(
                !o.status.success(),
                "QEMU started with a VFIO device that cannot exist here"
            );
            // QEMU 7.2 prefixes realize errors with "vfio <device>: " ("no such host device",
            // or "no iommu_group found" where the address exists); a bad property, bus or
            // address fails earlier with "Property '..'", "Bus '..' not found", "Parameter '..'"
            // or a PCI slot complaint.
            assert!(
                err.contains(": vfio ")
                    && !err.contains("Property '")
                    && !err.contains("Bus '")
                    && !err.contains("Parameter '")
                    && !err.contains("PCI: "),
                "QEMU rejected {} before opening the device:\n{err}",
                dev[1]
            );
            started += 1;
        }
    }
    assert!(started >= 14, "ran QEMU only {started} times");
}

#[test]
fn kubevirt_snippets_golden() {
    let h = vfio_host("workstation", WS_GPU);
    let y = ok(&run_root(h.path(), &["kubevirt", "01:00.0"]));
    golden("workstation/kubevirt.yaml", &y);
    assert!(
        y.contains(
            "pciVendorSelector: \"10DE:2684\"\n          resourceName: \"nvidia.com/AD102_GEFORCE_RTX_4090\""
        ),
        "{y}"
    );
    assert!(y.contains("\"10DE:22BA\""));
    let j: serde_json::Value = serde_json::from_str(&ok(&run_root(
        h.path(),
        &["kubevirt", "01:00.0", "--json", "--external-provider"],
    )))
    .unwrap();
    let pci = &j["spec"]["configuration"]["permittedHostDevices"]["pciHostDevices"];
    assert_eq!(pci[0]["pciVendorSelector"], "10DE:2684");
    assert_eq!(pci[0]["resourceName"], "nvidia.com/AD102_GEFORCE_RTX_4090");
    assert_eq!(pci[0]["externalResourceProvider"], true);
    assert_eq!(
        pci[1]["resourceName"],
        "nvidia.com/AD102_HIGH_DEFINITION_AUDIO_CONTROLLER"
    );

    // Eight identical H100s are one entry.
    let all: Vec<&str> = vec![
        "0000:03:00.0",
        "0000:04:00.0",
        "0000:05:00.0",
        "0000:06:00.0",
        "0000:83:00.0",
        "0000:84:00.0",
        "0000:85:00.0",
        "0000:86:00.0",
    ];
    let h = vfio_host("hgx-8gpu", &all);
    let mut args = vec!["kubevirt"];
    args.extend(&all);
    let y = ok(&run_root(h.path(), &args));
    golden("hgx-8gpu/kubevirt.yaml", &y);
    assert_eq!(y.matches("pciVendorSelector").count(), 1, "{y}");
    assert!(y.contains("\"10DE:2330\""));

    let y = ok(&on_host("mdev-t4", &["kubevirt", T4_MDEV]));
    golden("mdev-t4/kubevirt.yaml", &y);
    assert!(
        y.contains("mdevNameSelector: \"GRID T4-1B\"\n          resourceName: \"nvidia.com/GRID_T4_1B\""),
        "{y}"
    );
}

#[test]
fn devices_not_on_vfio_are_refused_with_the_fix() {
    // xml: the bind command and the --managed alternative.
    let o = on_host("workstation", &["xml", "hostdev", "01:00.0"]);
    let err = fails(
        &o,
        1,
        &[
            "0000:01:00.0 (nvidia)",
            "0000:01:00.1 (snd_hda_intel)",
            "gpupass bind 0000:01:00.0",
            "--managed",
        ],
    );
    assert_eq!(
        err.matches("gpupass bind").count(),
        1,
        "one bind per IOMMU group: {err}"
    );
    // qemu-args and kubevirt: the bind command only (--managed means nothing to them).
    for cmd in ["qemu-args", "kubevirt"] {
        let err = fails(
            &on_host("workstation", &[cmd, "01:00.0"]),
            1,
            &["gpupass bind 0000:01:00.0"],
        );
        assert!(!err.contains("--managed"), "{cmd}: {err}");
    }
    // Half-bound group: only the function still on its host driver is named.
    let h = vfio_host("workstation", &["0000:01:00.0"]);
    let err = fails(
        &run_root(h.path(), &["qemu-args", "01:00.0"]),
        1,
        &["0000:01:00.1 (snd_hda_intel) is not bound"],
    );
    assert!(!err.contains("0000:01:00.0 (vfio-pci)"), "{err}");
    // A vfio variant driver counts as VFIO.
    let h = scratch_host("workstation");
    rebind(h.path(), WS_GPU, "nvgrace_gpu_vfio_pci");
    ok(&run_root(h.path(), &["qemu-args", "01:00.0"]));
    // NVIDIA vendor-specific vGPU: a VF with a profile stays on nvidia and passes.
    let o = on_host("sriov-vgpu", &["xml", "hostdev", "41:00.4"]);
    assert!(ok(&o).contains("function=\"0x4\""));
    assert!(stderr(&o).contains("vGPU profile 1044"), "{}", stderr(&o));
    fails(
        &on_host("sriov-vgpu", &["xml", "hostdev", "41:00.5"]),
        1,
        &["0000:41:00.5 (nvidia)", "gpupass bind 0000:41:00.5"],
    );
}

#[test]
fn bad_input_is_a_usage_error_and_missing_devices_a_host_error() {
    for (args, code, needle) in [
        (vec!["xml", "hostdev", "01:00"], 2, "invalid device"),
        (vec!["xml", "hostdev", "zz:00.0"], 2, "invalid device"),
        (vec!["xml", "hostdev", "2f3e4d5c-6b7a-4988-8776"], 2, "mdev UUID"),
        (vec!["qemu-args", "../01:00.0"], 2, "invalid device"),
        (vec!["xml", "hostdev"], 2, "required"),
        (
            vec!["xml", "hostdev", "01:00.0", "--managed", "--unmanaged"],
            2,
            "cannot be used with",
        ),
        (
            vec!["xml", "hostdev", "01:00.0", "--rom-bar", "maybe"],
            2,
            "invalid value",
        ),
        (vec!["xml", "hostdev", "09:00.0"], 1, "no PCI device 0000:09:00.0"),
        (vec!["xml", "hostdev", "00:01.0"], 1, "is a PCI bridge"),
        (
            vec!["xml", "hostdev", "11111111-2222-3333-4444-555555555555"],
            1,
            "no mediated device",
        ),
        (
            vec![
                "xml",
                "hostdev",
                "01:00.0",
                "03:00.0",
                "--managed",
                "--guest-address",
                "0000:05:00.0",
            ],
            2,
            "--guest-address places one device",
        ),
        (
            vec![
                "xml",
                "hostdev",
                "01:00.0",
                "--managed",
                "--guest-address",
                "0000:05:00.1",
            ],
            2,
            "must start at function 0",
        ),
        (
            vec!["xml", "hostdev", "01:00.0", "--managed", "--display"],
            1,
            "display-capable",
        ),
        (
            vec![
                "xml", "domain", "--name", "x", "--memory", "lots", "--vcpus", "1", "--device", "01:00.0",
            ],
            2,
            "not a size",
        ),
        (
            vec![
                "xml", "domain", "--name", "x", "--memory", "1G", "--vcpus", "0", "--device", "01:00.0",
            ],
            2,
            "vcpus",
        ),
        (
            vec!["xml", "domain", "--name", "x", "--memory", "1G", "--vcpus", "1"],
            2,
            "--device",
        ),
        (
            vec!["qemu-args", "01:00.0", "--first-slot", "0x1f"],
            2,
            "not a usable pcie.0 slot",
        ),
    ] {
        let o = on_host("workstation", &args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(code), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: stderr lacks {needle:?}: {err}");
    }
    // No IOMMU groups at all: the nvidia-minors host has none.
    fails(
        &on_host("nvidia-minors", &["xml", "hostdev", "07:00.0", "--managed"]),
        1,
        &["no IOMMU group", "gpupass check"],
    );
}

#[test]
fn legacy_bridge_group_spans_two_slots() {
    let h = vfio_host("legacy-bridge", &["0000:05:00.0", "0000:05:01.0"]);
    let o = run_root(
        h.path(),
        &[
            "xml", "domain", "--name", "old", "--memory", "2G", "--vcpus", "2", "--device", "05:00.0",
        ],
    );
    let xml = ok(&o);
    golden("legacy-bridge/xml-domain.xml", &xml);
    // The NIC shares the group but sits in another slot: its own root port, function 0.
    assert!(xml.contains("index=\"2\" model=\"pcie-root-port\""));
    assert!(xml.contains("bus=\"0x02\" slot=\"0x00\" function=\"0x0\"/>"));
    assert!(!xml.contains("multifunction"));
    assert!(stderr(&o).contains("added 0000:05:01.0"));
    libvirt_accepts(&xml, "legacy bridge domain");
}

/// The tree captured from the lab's real kernel: a multifunction slot (VGA 00:05.0 + HD audio
/// 00:05.1 in IOMMU group 4), as a GPU and its audio function look.
#[test]
fn lab_captured_multifunction_slot() {
    let o = on_host(
        "qemu-lab",
        &[
            "xml",
            "domain",
            "--name",
            "lab",
            "--memory",
            "1G",
            "--vcpus",
            "1",
            "--device",
            "00:05.1",
            "--managed",
        ],
    );
    let xml = ok(&o);
    golden("qemu-lab/xml-domain.xml", &xml);
    assert!(
        xml.contains("bus=\"0x01\" slot=\"0x00\" function=\"0x0\" multifunction=\"on\"/>"),
        "{xml}"
    );
    assert!(xml.contains("bus=\"0x01\" slot=\"0x00\" function=\"0x1\"/>"));
    assert!(stderr(&o).contains("added 0000:00:05.0"));
    libvirt_accepts(&xml, "lab multifunction domain");
    let h = vfio_host("qemu-lab", &["0000:00:05.0", "0000:00:05.1"]);
    let args = ok(&run_root(h.path(), &["qemu-args", "00:05.0"]));
    golden("qemu-lab/qemu-args.txt", &args);
    assert!(args.contains("host=0000:00:05.0,id=hostdev1,bus=rp1,addr=0x0.0,multifunction=on"));
}

#[test]
fn saved_inventory_renders_the_same() {
    let h = vfio_host("workstation", WS_GPU);
    let json = ok(&run_root(h.path(), &["list", "--all", "--json"]));
    let dir = tempfile::tempdir().unwrap();
    let saved = dir.path().join("inv.json");
    std::fs::write(&saved, json).unwrap();
    let t4 = ok(&on_host("mdev-t4", &["list", "--all", "--json"]));
    let saved_t4 = dir.path().join("t4.json");
    std::fs::write(&saved_t4, t4).unwrap();
    // The HGX board: nodes, hugepage pools, IOMMU width and switches come back from the JSON.
    let hgx = ok(&on_host("hgx-8gpu", &["list", "--all", "--json"]));
    let saved_hgx = dir.path().join("hgx.json");
    std::fs::write(&saved_hgx, hgx).unwrap();
    for (root, file, args) in [
        (h.path().to_path_buf(), &saved, vec!["xml", "hostdev", "01:00.0"]),
        (
            h.path().to_path_buf(),
            &saved,
            vec![
                "xml", "domain", "--name", "v", "--memory", "1G", "--vcpus", "1", "--device", "01:00.0",
            ],
        ),
        (h.path().to_path_buf(), &saved, vec!["qemu-args", "01:00.0"]),
        (h.path().to_path_buf(), &saved, vec!["kubevirt", "01:00.0"]),
        (host("mdev-t4"), &saved_t4, vec!["qemu-args", T4_MDEV]),
        (host("mdev-t4"), &saved_t4, vec!["xml", "hostdev", T4_MDEV]),
        (
            host("hgx-8gpu"),
            &saved_hgx,
            vec![
                "xml",
                "domain",
                "--name",
                "h",
                "--memory",
                "96G",
                "--vcpus",
                "32",
                "--managed",
                "--hugepages",
                "1G",
                "--device",
                "03:00.0",
                "04:00.0",
                "83:00.0",
                "84:00.0",
            ],
        ),
    ] {
        let live = ok(&run_root(&root, &args));
        let mut from = vec!["--from-json", file.to_str().unwrap(), "--root", "/nonexistent"];
        from.extend(&args);
        assert_eq!(ok(&gpupass(&from)), live, "{args:?}");
    }
}

#[cfg(not(feature = "libvirt"))]
#[test]
fn attach_without_the_feature_explains_how_to_get_it() {
    let o = on_host(
        "workstation",
        &[
            "attach",
            "--connect",
            "test:///default",
            "--domain",
            "test",
            "01:00.0",
            "--managed",
        ],
    );
    fails(&o, 1, &["--features libvirt", "virsh attach-device"]);
}

/// `qemu-args --backend iommufd` (and `auto` on a cdev host): one `-object iommufd` and
/// `iommufd=` on each `vfio-pci,host=`, a property the lab's QEMU 10.0 has; QEMU accepts the
/// object and the device up to opening `/dev/iommu` (on a host without it) or the host device
/// (on a host with it: the fixture's addresses must not exist on this machine, which the test
/// checks first, so QEMU never opens a real device).
#[test]
fn qemu_args_on_iommufd() {
    let args = |backend: &str| -> Vec<String> {
        let v: serde_json::Value = serde_json::from_str(&ok(&run_root(
            &host("vfio-numa"),
            &[
                "qemu-args",
                "4b:00.0",
                "--backend",
                backend,
                "--qemu-version",
                "10.0",
                "--pci-hole64",
                "off",
                "--json",
            ],
        )))
        .unwrap();
        v["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_string())
            .collect()
    };
    let a = args("iommufd");
    assert_eq!(a[..2], ["-object", "iommufd,id=iommufd0"]);
    let vfio: Vec<&String> = a.iter().filter(|x| x.starts_with("vfio-pci,")).collect();
    assert_eq!(vfio.len(), 2, "{a:?}");
    assert!(vfio.iter().all(|d| d.ends_with(",iommufd=iommufd0")), "{a:?}");
    assert_eq!(args("auto"), a, "auto picks iommufd where the kernel has it");
    let legacy = args("legacy");
    assert!(!legacy.iter().any(|x| x.contains("iommufd")), "{legacy:?}");
    assert!(qemu_properties("vfio-pci").contains("iommufd"));

    // QEMU gets this machine's /dev/iommu where it has one, and then looks the fixture's
    // devices up in this machine's sysfs: none may exist here (a real device would be opened,
    // and opening a VFIO device resets it).
    for d in &vfio {
        let addr = d
            .split(',')
            .find_map(|p| p.strip_prefix("host="))
            .unwrap_or_else(|| panic!("no host= in {d}"));
        let sys = std::path::Path::new("/sys/bus/pci/devices").join(addr);
        assert!(
            !sys.exists(),
            "this machine has PCI device {addr}, which the vfio-numa fixture's QEMU arguments \
             name: QEMU would open it; run this test on a machine without {}",
            sys.display()
        );
    }
    let o = tool("qemu-system-x86_64")
        .args([
            "-machine",
            "q35,accel=tcg",
            "-nodefaults",
            "-display",
            "none",
            "-S",
        ])
        .args(["-monitor", "none", "-serial", "none"])
        .args(&a)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        (err.contains("/dev/iommu") || err.contains(": vfio "))
            && !err.contains("Property '")
            && !err.contains("Parameter '")
            && !err.contains("Bus '"),
        "QEMU rejected the iommufd arguments before opening a node:\n{err}"
    );
}

/// `qemu-args --backend auto|iommufd` checks the QEMU before emitting iommufd (8.2+), as `xml`
/// checks the libvirt: `--qemu-version X.Y`, else `--qemu BINARY --version` (the lab's real
/// QEMU 10.0 here, and a fake that prints 8.1), else `qemu-system-x86_64` from PATH. `auto`
/// falls back to the legacy group and container with a note when the QEMU is older or its
/// version unknown; `iommufd` with an older QEMU is refused (E-BACKEND-04).
#[test]
fn qemu_args_check_the_qemu_version_before_iommufd() {
    use std::os::unix::fs::PermissionsExt;
    let empty_path = tempfile::tempdir().unwrap();
    let fake = empty_path.path().join("qemu-8.1");
    std::fs::write(
        &fake,
        "#!/bin/sh\necho 'QEMU emulator version 8.1.5 (Debian 1:8.1.5+ds-1)'\n",
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    // The lab's QEMU is a wrapper script that needs `dirname`; nothing else is on this PATH.
    let dirname = Command::new("sh")
        .args(["-c", "command -v dirname"])
        .output()
        .unwrap();
    std::os::unix::fs::symlink(
        String::from_utf8_lossy(&dirname.stdout).trim(),
        empty_path.path().join("dirname"),
    )
    .unwrap();
    let fixture = host("vfio-numa");
    // PATH without a QEMU, so the default probe finds none, on any machine.
    let run = |extra: &[&str]| {
        let mut a = vec![
            "--root",
            fixture.to_str().unwrap(),
            "qemu-args",
            "4b:00.0",
            "--pci-hole64",
            "off",
        ];
        a.extend_from_slice(extra);
        Command::new(env!("CARGO_BIN_EXE_gpupass"))
            .args(&a)
            .env_remove("GPUPASS_ROOT")
            .env("PATH", empty_path.path())
            .output()
            .unwrap()
    };
    let iommufd = |o: &Output| ok(o).contains("iommufd=iommufd0");
    // The lab's QEMU 10.0, probed for real.
    let lab = lab_qemu().get_program().to_owned();
    let lab = lab.to_str().unwrap();
    for backend in ["auto", "iommufd"] {
        let o = run(&["--backend", backend, "--qemu", lab]);
        assert!(iommufd(&o), "{backend} with {lab}: {}", stderr(&o));
    }
    assert!(iommufd(&run(&["--qemu-version", "8.2"])));
    assert!(iommufd(&run(&["--qemu-version", "10.0.2"])));
    // Older: auto falls back with a note, iommufd is refused.
    for o in [
        run(&["--qemu-version", "8.1"]),
        run(&["--qemu", fake.to_str().unwrap()]),
    ] {
        assert!(!iommufd(&o), "{}", stderr(&o));
        assert!(
            stderr(&o).contains("--backend auto: the QEMU 8.1 (")
                && stderr(&o).contains(
                    "has no iommufd backend for vfio-pci (8.2+); using the legacy group and container"
                ),
            "{}",
            stderr(&o)
        );
    }
    fails(
        &run(&["--backend", "iommufd", "--qemu-version", "8.1"]),
        1,
        &[
            "--backend iommufd: the QEMU 8.1 (from --qemu-version) cannot open VFIO devices through iommufd",
            "need QEMU 8.2",
            "or use --backend legacy or auto",
        ],
    );
    fails(
        &run(&["--backend", "iommufd", "--qemu", fake.to_str().unwrap()]),
        1,
        &[&format!("the QEMU 8.1 ({} --version)", fake.display())],
    );
    // Unknown (no QEMU on PATH): auto falls back, iommufd is taken as asked, each with a note.
    let o = run(&[]);
    assert!(!iommufd(&o));
    assert!(
        stderr(&o).contains(
            "--backend auto: the QEMU's version is unknown (cannot run qemu-system-x86_64 --version"
        ) && stderr(&o).contains("name the VM's QEMU with --qemu BINARY or --qemu-version X.Y"),
        "{}",
        stderr(&o)
    );
    let o = run(&["--backend", "iommufd"]);
    assert!(iommufd(&o));
    assert!(
        stderr(&o).contains("--backend iommufd: the QEMU's version is unknown"),
        "{}",
        stderr(&o)
    );
    // legacy never asks.
    let o = run(&["--backend", "legacy", "--qemu", "/nonexistent/qemu"]);
    assert!(!iommufd(&o) && !stderr(&o).contains("version"), "{}", stderr(&o));
    fails(
        &run(&["--qemu-version", "eight"]),
        2,
        &["invalid QEMU version \"eight\""],
    );
    fails(
        &run(&["--qemu-version", "8.2", "--qemu", lab]),
        2,
        &["cannot be used with"],
    );
}

/// libvirt 12.9's RNG schemas (Debian trixie-backports, fetched into the lab cache by
/// tests/fetch-libvirt-schemas.sh; nothing installed): the first schemas with the iommufd
/// elements.
fn libvirt_12_9_schemas() -> PathBuf {
    let repo = manifest_dir();
    let o = Command::new("bash")
        .arg(repo.join("tests/fetch-libvirt-schemas.sh"))
        .output()
        .expect("run tests/fetch-libvirt-schemas.sh");
    assert!(
        o.status.success(),
        "tests/fetch-libvirt-schemas.sh could not provide libvirt 12.9's schemas:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&o.stdout).trim())
}

/// Validate a domain XML with `xmllint --relaxng` against a schema directory.
fn validates_with(schemas: &Path, xml: &str, what: &str) -> bool {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("domain.xml");
    std::fs::write(&f, xml).unwrap();
    let v = tool("xmllint")
        .args(["--noout", "--relaxng"])
        .arg(schemas.join("domain.rng"))
        .arg(&f)
        .output()
        .unwrap();
    if !v.status.success() {
        eprintln!("{what}: {}", String::from_utf8_lossy(&v.stderr));
    }
    v.status.success()
}

/// `xml --backend iommufd|auto|legacy --libvirt-version`: `<driver iommufd='yes'/>` per PCI
/// hostdev from 12.1, the domain-wide `<iommufd enabled='yes'/>` from 12.2; validated against
/// libvirt 12.9's schemas, and the legacy output still against the system's 9.0.
#[test]
fn xml_on_iommufd() {
    let root = host("vfio-numa");
    let s129 = libvirt_12_9_schemas();
    let domain = |extra: &[&str]| -> String {
        let mut a = vec![
            "xml", "domain", "--name", "vm1", "--memory", "1G", "--vcpus", "2", "--device", "4b:00.0",
        ];
        a.extend_from_slice(extra);
        ok(&run_root(&root, &a))
    };
    let full = domain(&["--backend", "iommufd", "--libvirt-version", "12.9"]);
    assert_eq!(
        full.matches("<driver name=\"vfio\" iommufd=\"yes\"/>").count(),
        2,
        "{full}"
    );
    assert_eq!(full.matches("<iommufd enabled=\"yes\"/>").count(), 1, "{full}");
    assert!(validates_with(&s129, &full, "12.9 iommufd domain"), "{full}");
    assert_eq!(
        domain(&["--libvirt-version", "12.9.0"]),
        full,
        "auto takes iommufd where kernel and libvirt have it"
    );

    let per_hostdev = domain(&["--backend", "iommufd", "--libvirt-version", "12.1"]);
    assert_eq!(per_hostdev.matches("iommufd=\"yes\"").count(), 2, "{per_hostdev}");
    assert!(
        !per_hostdev.contains("<iommufd "),
        "12.1 has no domain-wide element:\n{per_hostdev}"
    );
    assert!(validates_with(&s129, &per_hostdev, "12.1 iommufd domain"));

    let frags = ok(&run_root(
        &root,
        &[
            "xml",
            "hostdev",
            "4b:00.0",
            "--backend",
            "iommufd",
            "--libvirt-version",
            "12.1",
        ],
    ));
    assert_eq!(frags.matches("iommufd=\"yes\"").count(), 2, "{frags}");
    assert!(validates_with(&s129, &wrap_hostdevs(&frags), "12.1 hostdevs"));

    // Legacy output: the same with every target, valid for the system's libvirt 9.0 and 12.9.
    let legacy = domain(&["--backend", "legacy", "--libvirt-version", "12.9"]);
    assert!(!legacy.contains("iommufd"), "{legacy}");
    assert_eq!(
        domain(&["--libvirt-version", "9.0"]),
        legacy,
        "auto with a 9.0 target is legacy"
    );
    libvirt_accepts(&legacy, "legacy domain");
    assert!(validates_with(&s129, &legacy, "legacy domain on 12.9"));
    // The iommufd output is what 9.0's schema cannot express.
    assert!(!validates_with(
        Path::new("/usr/share/libvirt/schemas"),
        &full,
        "iommufd on 9.0"
    ));

    // A target below 12.1 cannot take iommufd: an error naming both versions, nothing written.
    let o = run_root(
        &root,
        &[
            "xml",
            "hostdev",
            "4b:00.0",
            "--backend",
            "iommufd",
            "--libvirt-version",
            "12.0",
        ],
    );
    fails(
        &o,
        1,
        &[
            "the target libvirt 12.0 (from --libvirt-version)",
            "needs libvirt 12.1",
            "12.2",
        ],
    );
    // A kernel without iommufd fails first (E-BACKEND-01), whatever the target.
    let o = run_root(
        &host("hgx-8gpu"),
        &[
            "xml",
            "domain",
            "--name",
            "x",
            "--memory",
            "1G",
            "--vcpus",
            "1",
            "--device",
            "03:00.0",
            "--backend",
            "iommufd",
            "--libvirt-version",
            "12.9",
        ],
    );
    fails(&o, 1, &["this host cannot use iommufd", "6.6"]);
}

/// `kubevirt --backend`: iommufd adds KubeVirt 1.9's `IOMMUFD` feature gate and needs an
/// external provider (gpupass's device plugin hands out the cdev); `auto` takes it only with
/// one; legacy and hosts without iommufd keep the snippet as it was.
#[test]
fn kubevirt_on_iommufd() {
    let root = host("vfio-numa");
    let patch = |extra: &[&str]| -> serde_json::Value {
        let mut a = vec!["kubevirt", "4b:00.0", "--json"];
        a.extend_from_slice(extra);
        serde_json::from_str(&ok(&run_root(&root, &a))).unwrap()
    };
    let j = patch(&["--external-provider", "--backend", "iommufd"]);
    let conf = &j["spec"]["configuration"];
    assert_eq!(
        conf["developerConfiguration"]["featureGates"],
        serde_json::json!(["IOMMUFD"])
    );
    assert_eq!(
        conf["permittedHostDevices"]["pciHostDevices"][0]["externalResourceProvider"],
        true
    );
    assert_eq!(
        patch(&["--external-provider"]),
        j,
        "auto with an external provider is iommufd"
    );
    for legacy in [
        &["--external-provider", "--backend", "legacy"][..],
        &[][..],
        &["--backend", "auto"][..],
    ] {
        let l = patch(legacy);
        assert!(
            l["spec"]["configuration"].get("developerConfiguration").is_none(),
            "{legacy:?}: {l}"
        );
    }
    let y = ok(&run_root(
        &root,
        &[
            "kubevirt",
            "4b:00.0",
            "--external-provider",
            "--backend",
            "iommufd",
        ],
    ));
    assert!(
        y.contains(
            "developerConfiguration:\n      featureGates:\n        - \"IOMMUFD\"\n    permittedHostDevices:"
        ),
        "{y}"
    );
    assert!(y.contains("gpupass device-plugin --backend iommufd"), "{y}");

    // iommufd on a kernel without it: E-BACKEND-01, whatever the provider.
    let o = run_root(
        &host("hgx-8gpu"),
        &[
            "kubevirt",
            "03:00.0",
            "--external-provider",
            "--backend",
            "iommufd",
        ],
    );
    fails(&o, 1, &["this host cannot use iommufd"]);
    let ws = vfio_host("workstation", WS_GPU);
    let y = ok(&run_root(
        ws.path(),
        &["kubevirt", "01:00.0", "--external-provider"],
    ));
    assert!(!y.contains("IOMMUFD"), "{y}");
}

/// The lab's QEMU started paused on `machine` with guest CPU `cpu`, a 2 TiB 64-bit window,
/// `extra` arguments and one vfio-pci device behind a root port; its stderr. QEMU's own address
/// space check ("phys-bits too low") comes first; past it QEMU stops at the vfio-pci device,
/// which this host does not have (nothing is opened or bound).
fn qemu_start_check(machine: &str, cpu: &str, extra: &[&str]) -> String {
    let o = tool("qemu-system-x86_64")
        .args(["-machine", machine, "-cpu", cpu])
        .args(extra)
        .args([
            "-nodefaults",
            "-display",
            "none",
            "-S",
            "-monitor",
            "none",
            "-serial",
            "none",
        ])
        .args(["-global", "q35-pcihost.pci-hole64-size=2T"])
        .args([
            "-device",
            "pcie-root-port,id=rp1,chassis=1,bus=pcie.0,addr=0x10.0",
        ])
        .args([
            "-device",
            "vfio-pci,host=0000:03:00.0,id=hostdev1,bus=rp1,addr=0x0.0",
        ])
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The 64-bit window is sized from the 64-bit BARs of the devices given: twice the next power
/// of two of their sum, at least QEMU's default 32G; `--pci-hole64` sets or drops it; a window
/// the host CPU's address width cannot reach is refused with the numbers. QEMU itself refuses
/// the 4-GPU window on a 40-bit guest CPU, which is why the window needs host-phys-bits.
#[test]
fn mmio64_window_is_sized_from_the_bars() {
    let hgx = vfio_host(
        "hgx-8gpu",
        &["0000:03:00.0", "0000:04:00.0", "0000:05:00.0", "0000:06:00.0"],
    );
    let args = |extra: &[&str]| {
        let o = run_root(
            hgx.path(),
            &[&["qemu-args", "03:00.0", "04:00.0", "05:00.0", "06:00.0"], extra].concat(),
        );
        (o.status.code(), stdout(&o), stderr(&o))
    };
    // Four H100s: 4 x (128 GiB BAR1 + 32 MiB BAR3) -> 1 TiB rounded up -> 2 TiB.
    let (code, out, err) = args(&[]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.starts_with(
            "-cpu host,host-phys-bits=on,host-phys-bits-limit=48\n-global q35-pcihost.pci-hole64-size=2T\n-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=2097152\n"
        ),
        "{out}"
    );
    assert!(
        err.contains("note: 64-bit PCI window 2T for 12 64-bit BAR(s)"),
        "{err}"
    );
    assert!(err.contains("host-phys-bits=on"), "{err}");
    let (_, out, _) = args(&["--pci-hole64", "off"]);
    assert!(
        !out.contains("pci-hole64") && !out.contains("X-PciMmio64Mb"),
        "{out}"
    );
    let (_, out, _) = args(&["--pci-hole64", "4T"]);
    assert!(
        out.contains("pci-hole64-size=4T") && out.contains("string=4194304"),
        "{out}"
    );
    let (code, _, err) = args(&["--pci-hole64", "48G"]);
    assert_eq!(code, Some(2), "{err}");

    // The host CPU's address width (proc/cpuinfo): 2 TiB needs 42 bits.
    std::fs::write(
        hgx.path().join("proc/cpuinfo"),
        "processor\t: 0\naddress sizes\t: 46 bits physical, 48 bits virtual\n",
    )
    .unwrap();
    assert_eq!(args(&[]).0, Some(0));
    std::fs::write(
        hgx.path().join("proc/cpuinfo"),
        "processor\t: 0\naddress sizes\t: 40 bits physical, 48 bits virtual\n",
    )
    .unwrap();
    let (code, out, err) = args(&[]);
    assert_eq!(code, Some(1), "{err}");
    assert!(out.is_empty(), "{out}");
    assert!(
        err.contains("a 64-bit PCI window of 2T (for 12 64-bit BAR(s), 512.19 GiB in all) over QEMU's default guest RAM (no --memory) ends at 4T"),
        "{err}"
    );
    assert!(
        err.contains("so it needs 42 physical address bits, but the guest gets this host CPU's 40"),
        "{err}"
    );
    let x = run_root(
        hgx.path(),
        &[
            "xml", "domain", "--name", "big", "--memory", "8G", "--vcpus", "4", "--device", "03:00.0",
            "04:00.0", "05:00.0", "06:00.0",
        ],
    );
    assert_eq!(x.status.code(), Some(1), "{}", stderr(&x));
    assert!(stdout(&x).is_empty());
    // The explicit window that fits is taken.
    assert_eq!(args(&["--pci-hole64", "512G"]).0, Some(0));

    // QEMU agrees: the 2T window does not fit a 40-bit guest CPU, and does with 48 bits.
    let run = |cpu: &str| qemu_start_check("q35,accel=tcg", cpu, &[]);
    let e40 = run("qemu64");
    assert!(e40.contains("phys-bits too low (40)"), "{e40}");
    let e48 = run("qemu64,phys-bits=48");
    assert!(e48.contains(": vfio ") && !e48.contains("phys-bits"), "{e48}");
}

/// The address-width check places the window as the firmware does: OVMF aligns the aperture to
/// its own size above the top of guest RAM, so the same four H100s (a 2 TiB window) fit a 42-bit
/// CPU over 64 GiB of RAM (the window ends at 4 TiB) and not over 2 TiB (it ends at 6 TiB): exit
/// 1 with RAM, window, end and widths, and the most RAM that fits. `qemu-args` and `xml domain`
/// agree; SeaBIOS packs the BARs themselves and is checked by its own rule.
#[test]
fn the_address_width_check_follows_the_guest_ram() {
    let hgx = vfio_host(
        "hgx-8gpu",
        &["0000:03:00.0", "0000:04:00.0", "0000:05:00.0", "0000:06:00.0"],
    );
    std::fs::write(
        hgx.path().join("proc/cpuinfo"),
        "processor\t: 0\naddress sizes\t: 42 bits physical, 48 bits virtual\n",
    )
    .unwrap();
    let gpus = ["03:00.0", "04:00.0", "05:00.0", "06:00.0"];
    let qemu = |mem: &str, extra: &[&str]| {
        let mut a = vec!["qemu-args", "--memory", mem];
        a.extend_from_slice(extra);
        a.extend_from_slice(&gpus);
        run_root(hgx.path(), &a)
    };
    let xml = |mem: &str, extra: &[&str]| {
        let mut a = vec!["xml", "domain", "--name", "big", "--memory", mem, "--vcpus", "8"];
        a.extend_from_slice(extra);
        a.push("--device");
        a.extend_from_slice(&gpus);
        run_root(hgx.path(), &a)
    };
    // 64 GiB: the window sits at 2T-4T, within 42 bits.
    for o in [qemu("64G", &[]), xml("64G", &[])] {
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        assert!(
            stderr(&o).contains("OVMF places it at 2T-4T, within 42 address bits (the guest CPU's, the host's); it stays within them with up to 2046G of guest RAM"),
            "{}",
            stderr(&o)
        );
    }
    // 2 TiB: above RAM (top 2050 GiB) aligned to 2 TiB the window is 4T-6T: 43 bits.
    for o in [qemu("2T", &[]), xml("2T", &[])] {
        let err = fails(
            &o,
            1,
            &[
                "a 64-bit PCI window of 2T (for 12 64-bit BAR(s), 512.19 GiB in all) over 2048 GiB of guest RAM ends at 6T",
                "OVMF places it above guest RAM, aligned to its own size, at 4T-6T, so it needs 43 physical address bits",
                "but the guest gets this host CPU's 42 (/proc/cpuinfo, address sizes; IOMMU: 48 bits)",
                "pass less guest RAM (--memory 2046G or less), or fewer devices, or a smaller window with --pci-hole64 SIZE (at most 1T over this RAM)",
                "nothing was written",
            ],
        );
        assert!(!err.contains("note: 64-bit PCI window"), "{err}");
    }
    // The largest RAM the refusal names passes, one GiB more does not.
    assert_eq!(qemu("2046G", &[]).status.code(), Some(0));
    assert_eq!(qemu("2047G", &[]).status.code(), Some(1));
    // QEMU draws the same line: its own start check ("phys-bits too low") passes 2046 GiB of
    // RAM under a 2T window on a 42-bit Intel guest CPU and refuses 2047 GiB, so gpupass
    // refuses, with the numbers and the fix, exactly what would not start. The RAM is a sparse file
    // (nothing is allocated: QEMU stops at the vfio-pci device, which this host does not have,
    // after the check).
    let ram = tempfile::tempdir().unwrap();
    let qemu_start = |mem: &str, vendor: &str| {
        let file = ram.path().join(format!("ram-{mem}"));
        let f = std::fs::File::create(&file).unwrap();
        let bytes = mem.trim_end_matches('G').parse::<u64>().unwrap() << 30;
        f.set_len(bytes).unwrap();
        let backend = format!(
            "memory-backend-file,id=ram,size={mem},mem-path={},share=on",
            file.display()
        );
        qemu_start_check(
            "q35,accel=tcg,memory-backend=ram",
            &format!("qemu64,phys-bits=42,vendor={vendor}"),
            &["-object", &backend, "-m", mem],
        )
    };
    let fits = qemu_start("2046G", "GenuineIntel");
    assert!(fits.contains(": vfio ") && !fits.contains("phys-bits"), "{fits}");
    let over = qemu_start("2047G", "GenuineIntel");
    assert!(over.contains("phys-bits too low (42)"), "{over}");
    // The window it names fits over 2 TiB.
    assert_eq!(qemu("2T", &["--pci-hole64", "1T"]).status.code(), Some(0));
    // SeaBIOS: QEMU's 2 TiB window from the top of RAM (2050 GiB) ends past 4 TiB as well.
    fails(
        &xml("2T", &["--firmware", "bios"]),
        1,
        &["SeaBIOS places it above guest RAM, the BARs packed from the largest one's alignment, at 2050G-4098G, so it needs 43 physical address bits"],
    );
    assert_eq!(qemu("64G", &["--firmware", "bios"]).status.code(), Some(0));
    // An AMD guest CPU (the host's, under -cpu host): QEMU moves the RAM above 4 GiB to 1 TiB
    // once the layout reaches the HyperTransport hole, which a 2 TiB window always does, so
    // 42 bits hold 1026 GiB and not 2046: gpupass, reading the host's vendor, draws that line.
    std::fs::write(
        hgx.path().join("proc/cpuinfo"),
        "processor\t: 0\nvendor_id\t: AuthenticAMD\naddress sizes\t: 42 bits physical, 48 bits virtual\n",
    )
    .unwrap();
    assert_eq!(qemu("1026G", &[]).status.code(), Some(0));
    fails(
        &qemu("1027G", &[]),
        1,
        &[
            "QEMU put the RAM above 4 GiB at 1T-2049G: an AMD guest CPU whose layout reaches the HyperTransport hole at 1012G",
            "--memory 1026G or less",
        ],
    );
    let fits = qemu_start("1026G", "AuthenticAMD");
    assert!(fits.contains(": vfio ") && !fits.contains("phys-bits"), "{fits}");
    let over = qemu_start("1027G", "AuthenticAMD");
    assert!(over.contains("phys-bits too low (42)"), "{over}");
    let moved = qemu_start("2046G", "AuthenticAMD");
    assert!(moved.contains("phys-bits too low (42)"), "{moved}");
}

/// The guest's physical address bits in every output: `qemu-args` sets `-cpu
/// host,host-phys-bits=on`, with `host-phys-bits-limit=N` when the IOMMU is narrower than the
/// CPU (the HGX fixture: 48 against 52) or with `--phys-bits N`; `xml domain` sets
/// `<maxphysaddr mode='passthrough'/>` with `limit='N'` in the same cases where the target
/// libvirt has it (9.3+: 12.9's RNG takes it, 9.0's does not), plain with a note where not.
#[test]
fn guest_address_bits_in_every_output() {
    let s129 = libvirt_12_9_schemas();
    let s90 = Path::new("/usr/share/libvirt/schemas");
    let hgx = vfio_host(
        "hgx-8gpu",
        &["0000:03:00.0", "0000:04:00.0", "0000:05:00.0", "0000:06:00.0"],
    );
    let qa = |extra: &[&str]| {
        let mut a = vec!["qemu-args", "03:00.0", "04:00.0"];
        a.extend_from_slice(extra);
        run_root(hgx.path(), &a)
    };
    let cpu_line = |out: &str| out.lines().find(|l| l.starts_with("-cpu ")).map(str::to_string);
    let o = qa(&[]);
    assert_eq!(
        cpu_line(&ok(&o)).as_deref(),
        Some("-cpu host,host-phys-bits=on,host-phys-bits-limit=48")
    );
    assert!(
        stderr(&o).contains("at most 48 (this host's IOMMU translates 48 bits, its CPU has 52)"),
        "{}",
        stderr(&o)
    );
    let o = qa(&["--phys-bits", "46"]);
    assert_eq!(
        cpu_line(&ok(&o)).as_deref(),
        Some("-cpu host,host-phys-bits=on,host-phys-bits-limit=46")
    );
    assert!(stderr(&o).contains("at most 46 (--phys-bits)"), "{}", stderr(&o));
    // Your own model and flags keep theirs, with the address bits added.
    assert_eq!(
        cpu_line(&ok(&qa(&["--cpu", "host,kvm=off"]))).as_deref(),
        Some("-cpu host,kvm=off,host-phys-bits=on,host-phys-bits-limit=48")
    );
    let o = qa(&["--cpu", "none"]);
    assert_eq!(cpu_line(&ok(&o)), None);
    assert!(
        stderr(&o).contains("--cpu none: add host-phys-bits=on,host-phys-bits-limit=48 to your -cpu"),
        "{}",
        stderr(&o)
    );
    // --phys-bits is the guest's width for the window check too: two H100s' 1 TiB window over
    // QEMU's default RAM ends at 2 TiB, 41 bits.
    assert_eq!(qa(&["--phys-bits", "41"]).status.code(), Some(0));
    fails(
        &qa(&["--phys-bits", "40"]),
        1,
        &["so it needs 41 physical address bits, but the guest gets 40 (--phys-bits; this host's CPU has 52)", "a larger --phys-bits"],
    );
    fails(&qa(&["--phys-bits", "31"]), 2, &["--phys-bits"]);
    fails(&qa(&["--cpu", "host kvm=off"]), 2, &["is not a -cpu value"]);

    let dom = |extra: &[&str]| {
        let mut a = vec![
            "xml", "domain", "--name", "bits", "--memory", "8G", "--vcpus", "4",
        ];
        a.extend_from_slice(extra);
        a.extend_from_slice(&["--device", "03:00.0", "04:00.0"]);
        run_root(hgx.path(), &a)
    };
    let o = dom(&["--libvirt-version", "12.9"]);
    let xml = ok(&o);
    assert!(
        xml.contains("<maxphysaddr mode=\"passthrough\" limit=\"48\"/>"),
        "{xml}"
    );
    assert!(validates_with(&s129, &xml, "maxphysaddr limit on 12.9"));
    // Why the limit waits for 9.3: libvirt 9.0's RNG has no such attribute.
    assert!(!validates_with(
        s90,
        &xml,
        "maxphysaddr limit on 9.0 (expected to fail)"
    ));
    let xml = ok(&dom(&["--libvirt-version", "12.9", "--phys-bits", "44"]));
    assert!(
        xml.contains("<maxphysaddr mode=\"passthrough\" limit=\"44\"/>"),
        "{xml}"
    );
    let o = dom(&["--libvirt-version", "9.0"]);
    let xml = ok(&o);
    assert!(xml.contains("<maxphysaddr mode=\"passthrough\"/>"), "{xml}");
    assert!(
        stderr(&o)
            .contains("the target libvirt 9.0 (from --libvirt-version) has no limit on <maxphysaddr> (9.3+)"),
        "{}",
        stderr(&o)
    );
    libvirt_accepts(&xml, "maxphysaddr without limit for 9.0");

    // A host whose IOMMU is wider than its CPU (vfio-numa: 48 against 46) needs no limit.
    let numa = vfio_host("vfio-numa", &["0000:17:00.0"]);
    let out = ok(&run_root(
        numa.path(),
        &["qemu-args", "--backend", "legacy", "17:00.0"],
    ));
    assert_eq!(cpu_line(&out).as_deref(), Some("-cpu host,host-phys-bits=on"));
    let xml = ok(&run_root(
        numa.path(),
        &[
            "xml",
            "domain",
            "--name",
            "n",
            "--memory",
            "4G",
            "--vcpus",
            "2",
            "--backend",
            "legacy",
            "--device",
            "17:00.0",
        ],
    ));
    assert!(xml.contains("<maxphysaddr mode=\"passthrough\"/>"), "{xml}");
}

/// `<memtune><hard_limit>` is what VFIO pins: RAM + 1 GiB, or RAM per VFIO device behind a
/// vIOMMU plus 1 GiB; `--memtune off` drops it. Each variant passes libvirt 9.0's RNG,
/// `virsh define` and libvirt 12.9's RNG.
#[test]
fn memtune_is_what_vfio_pins() {
    let hgx = vfio_host("hgx-8gpu", &["0000:03:00.0", "0000:04:00.0"]);
    let s129 = libvirt_12_9_schemas();
    let domain = |extra: &[&str]| {
        let base = [
            "xml", "domain", "--name", "big", "--memory", "8G", "--vcpus", "4", "--device", "03:00.0",
            "04:00.0",
        ];
        let o = run_root(hgx.path(), &[&base[..], extra].concat());
        (ok(&o), stderr(&o))
    };
    let (xml, err) = domain(&[]);
    assert!(
        xml.contains("<memtune>\n    <hard_limit unit=\"KiB\">9437184</hard_limit>\n  </memtune>"),
        "{xml}"
    );
    assert!(
        err.contains("this VM locks up to 9216 MiB (RAM + 1 GiB)"),
        "{err}"
    );
    libvirt_accepts(&xml, "8G, two GPUs");
    assert!(validates_with(&s129, &xml, "8G, two GPUs"));
    let (xml, err) = domain(&["--viommu"]);
    assert!(
        xml.contains("<hard_limit unit=\"KiB\">17825792</hard_limit>"),
        "{xml}"
    );
    assert!(
        err.contains("17408 MiB (RAM per VFIO device behind the vIOMMU + 1 GiB)"),
        "{err}"
    );
    libvirt_accepts(&xml, "8G, two GPUs, vIOMMU");
    let (xml, _) = domain(&["--memtune", "off", "--pci-hole64", "off"]);
    assert!(!xml.contains("memtune") && !xml.contains("pcihole64"), "{xml}");
    // No window, but the HGX fixture's IOMMU (48 bits) is narrower than its CPU (52): the
    // guest's address bits are still set (limited where the target libvirt can).
    assert!(xml.contains("<maxphysaddr mode=\"passthrough\""), "{xml}");
    libvirt_accepts(&xml, "no memtune, no window");
}

/// NUMA placement: devices on one host node pin the vCPUs to its CPUs and bind guest memory
/// to it; devices on several nodes are not pinned (a note), and an error under --numa strict.
#[test]
fn numa_placement_follows_the_devices() {
    let root = host("vfio-numa");
    let domain = |devs: &[&str], extra: &[&str]| {
        let mut a = vec![
            "xml",
            "domain",
            "--name",
            "n",
            "--memory",
            "4G",
            "--vcpus",
            "4",
            "--backend",
            "legacy",
            "--device",
        ];
        a.extend_from_slice(devs);
        a.extend_from_slice(extra);
        run_root(&root, &a)
    };
    // 17:00.0 and 31:00.0: both on node 0.
    let o = domain(&["17:00.0", "31:00.0"], &[]);
    let xml = ok(&o);
    assert!(
        xml.contains("<numatune>\n    <memory mode=\"strict\" nodeset=\"0\"/>\n  </numatune>"),
        "{xml}"
    );
    let cpus = std::fs::read_to_string(root.join("sys/bus/pci/devices/0000:17:00.0/local_cpulist")).unwrap();
    assert!(
        xml.contains(&format!(
            "<vcpu placement=\"static\" cpuset=\"{}\">4</vcpu>",
            cpus.trim()
        )),
        "{xml}"
    );
    assert!(
        stderr(&o).contains("the devices are on host NUMA node 0"),
        "{}",
        stderr(&o)
    );
    libvirt_accepts(&xml, "NUMA node 0");
    // 17:00.0 (node 0) and ca:00.0 (node 1): expanders under auto (numa_expanders_mirror_the_host_nodes),
    // refused under strict.
    let o = domain(&["17:00.0", "ca:00.0"], &["--numa", "strict"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stdout(&o).is_empty());
    assert!(
        stderr(&o).contains("--numa strict: the devices are on host NUMA nodes 0, 1"),
        "{}",
        stderr(&o)
    );
    let o = domain(&["17:00.0"], &["--numa", "off"]);
    assert!(!ok(&o).contains("numatune"));
}

/// GPUDirect P2P cliques: the HGX board's GPUs behind one PCIe switch share a clique (03-06 on
/// switch 01:00.0: 0; 83-86 on switch 81:00.0: 1); a GPU alone behind its switch gets none; the
/// property exists in the lab's QEMU.
#[test]
fn p2p_cliques_follow_the_pcie_switches() {
    let all = [
        "0000:03:00.0",
        "0000:04:00.0",
        "0000:05:00.0",
        "0000:06:00.0",
        "0000:83:00.0",
        "0000:84:00.0",
        "0000:85:00.0",
        "0000:86:00.0",
    ];
    let hgx = vfio_host("hgx-8gpu", &all);
    let clique = |args: &[&str]| -> Vec<(String, String)> {
        let o = run_root(
            hgx.path(),
            &[&["qemu-args"], args, &["--pci-hole64", "off"]].concat(),
        );
        ok(&o)
            .lines()
            .filter_map(|l| {
                let v = l.strip_prefix("-device vfio-pci,host=")?;
                let addr = v.split(',').next()?.to_string();
                let c = v
                    .split(',')
                    .find_map(|p| p.strip_prefix("x-nv-gpudirect-clique="))
                    .unwrap_or("-");
                Some((addr, c.to_string()))
            })
            .collect()
    };
    let got = clique(&all);
    let want: Vec<(String, String)> = all
        .iter()
        .map(|a| {
            (
                a.to_string(),
                if a.starts_with("0000:0") { "0" } else { "1" }.to_string(),
            )
        })
        .collect();
    assert_eq!(got, want);
    // One GPU per switch: nothing to share.
    assert_eq!(
        clique(&["03:00.0", "83:00.0"]),
        [
            ("0000:03:00.0".to_string(), "-".to_string()),
            ("0000:83:00.0".to_string(), "-".to_string())
        ]
    );
    assert!(qemu_properties("vfio-pci").contains("x-nv-gpudirect-clique"));
}

/// The `pcie-root-port` controller index a hostdev's guest address names (its `bus`), and the
/// `bus` that root port's own address names (its expander's index), for host function `src`
/// ("0xca") of a domain XML.
fn hostdev_port_and_expander(xml: &str, src_bus: &str) -> (String, Option<String>) {
    let attr = |l: &str, name: &str| {
        let k = format!("{name}=\"");
        let i = l.find(&k)? + k.len();
        Some(l[i..].split('"').next()?.to_string())
    };
    let lines: Vec<&str> = xml.lines().collect();
    let i = lines
        .iter()
        .position(|l| l.contains(&format!("<address domain=\"0x0000\" bus=\"{src_bus}\"")))
        .unwrap_or_else(|| panic!("no hostdev for bus {src_bus}:\n{xml}"));
    let guest = lines[i..]
        .iter()
        .find(|l| l.contains("<address type=\"pci\""))
        .unwrap();
    let port = u32::from_str_radix(attr(guest, "bus").unwrap().trim_start_matches("0x"), 16).unwrap();
    let ctl = lines
        .iter()
        .position(|l| l.contains(&format!("index=\"{port}\" model=\"pcie-root-port\"")))
        .unwrap();
    let expander = lines
        .get(ctl + 1)
        .filter(|l| l.contains("<address"))
        .and_then(|l| attr(l, "bus"));
    (port.to_string(), expander)
}

/// Devices on two host nodes: one guest NUMA cell and one pcie-expander-bus per host node,
/// each device behind a root port on its node's expander, the vCPUs pinned to their node's
/// CPUs and each cell's memory bound to its node; libvirt 9.0 and 12.9 accept it and `virsh
/// define` takes it. qemu-args renders the same topology, which QEMU 10.0 builds: the root
/// ports appear on the expanders' buses (0x80 for node 0, 0x90 for node 1).
#[test]
fn numa_expanders_mirror_the_host_nodes() {
    let root = host("vfio-numa");
    let s129 = libvirt_12_9_schemas();
    // A 6 GiB, 5-vCPU domain on the legacy backend with `extra` options and the devices last.
    let domain = |extra: &[&str], devs: &[&str]| {
        let base = [
            "xml",
            "domain",
            "--name",
            "n",
            "--memory",
            "6G",
            "--vcpus",
            "5",
            "--backend",
            "legacy",
        ];
        run_root(&root, &[&base[..], extra, &["--device"], devs].concat())
    };
    let o = domain(&[], &["17:00.0", "ca:00.0", "4b:00.0"]);
    let xml = ok(&o);
    assert_eq!(xml.matches("model=\"pcie-expander-bus\"").count(), 2, "{xml}");
    for (i, node) in [(1, 0), (2, 1)] {
        assert!(
            xml.contains(&format!(
                "<controller type=\"pci\" index=\"{i}\" model=\"pcie-expander-bus\">\n      <target>\n        <node>{node}</node>"
            )),
            "{xml}"
        );
    }
    // 5 vCPUs over two cells: 3 + 2; 6 GiB: 3 + 3.
    assert!(
        xml.contains("<cell id=\"0\" cpus=\"0-2\" memory=\"3145728\" unit=\"KiB\"/>"),
        "{xml}"
    );
    assert!(
        xml.contains("<cell id=\"1\" cpus=\"3-4\" memory=\"3145728\" unit=\"KiB\"/>"),
        "{xml}"
    );
    assert!(
        xml.contains("<memnode cellid=\"1\" mode=\"strict\" nodeset=\"1\"/>"),
        "{xml}"
    );
    assert!(
        xml.contains("<vcpupin vcpu=\"3\" cpuset=\"32-63,96-127\"/>"),
        "{xml}"
    );
    assert!(
        xml.contains("<vcpupin vcpu=\"0\" cpuset=\"0-31,64-95\"/>"),
        "{xml}"
    );
    // Node 0's L40S and the A6000 (both functions) behind expander 1, node 1's behind 2.
    assert_eq!(hostdev_port_and_expander(&xml, "0x17").1.as_deref(), Some("0x01"));
    assert_eq!(hostdev_port_and_expander(&xml, "0x4b").1.as_deref(), Some("0x01"));
    assert_eq!(hostdev_port_and_expander(&xml, "0xca").1.as_deref(), Some("0x02"));
    assert!(
        stderr(&o).contains("guest node 1 = host node 1 (vCPUs 3-4, 3072 MiB)"),
        "{}",
        stderr(&o)
    );
    libvirt_accepts(&xml, "expanders");
    assert!(validates_with(&s129, &xml, "expanders on 12.9"));
    // --numa off: one flat guest, no expanders.
    let flat = ok(&domain(&["--numa", "off"], &["17:00.0", "ca:00.0"]));
    assert!(!flat.contains("expander") && !flat.contains("<numa>"), "{flat}");

    // qemu-args: expanders without guest nodes unless --memory and --vcpus say how to split.
    let qa = |extra: &[&str]| {
        let o = run_root(
            &root,
            &[&["qemu-args", "--backend", "legacy", "17:00.0", "ca:00.0"], extra].concat(),
        );
        (ok(&o), stderr(&o))
    };
    let (plain, err) = qa(&[]);
    assert!(
        plain.contains("-device pxb-pcie,id=gpupass-pxb0,bus_nr=128,bus=pcie.0,addr=0x10.0\n"),
        "{plain}"
    );
    assert!(
        plain.contains("-device pcie-root-port,id=rp2,chassis=2,bus=gpupass-pxb1,addr=0x00.0\n"),
        "{plain}"
    );
    assert!(!plain.contains("-numa") && !plain.contains("-m "), "{plain}");
    assert!(err.contains("pass --memory and --vcpus"), "{err}");
    let (full, _) = qa(&["--memory", "2G", "--vcpus", "2"]);
    for want in [
        "-m 2048M\n",
        "-smp 2\n",
        "-object memory-backend-ram,id=gpupass-mem0,size=1024M,host-nodes=0,policy=bind\n",
        "-numa node,nodeid=1,cpus=1,memdev=gpupass-mem1\n",
        "-device pxb-pcie,id=gpupass-pxb1,bus_nr=144,bus=pcie.0,addr=0x11.0,numa_node=1\n",
    ] {
        assert!(full.contains(want), "no {want:?} in\n{full}");
    }
    // QEMU 10.0 builds it (this machine has one host node: bind both cells to node 0).
    let args: Vec<String> = full
        .lines()
        .filter(|l| !l.starts_with("-device vfio-pci"))
        .flat_map(|l| {
            let (a, v) = l.split_once(' ').unwrap();
            let v = if a == "-cpu" { tcg_cpu(v) } else { v.to_string() };
            [a.to_string(), v.replace("host-nodes=1", "host-nodes=0")]
        })
        .collect();
    let mut q = tool("qemu-system-x86_64")
        .args([
            "-machine",
            "q35,accel=tcg",
            "-cpu",
            "qemu64,phys-bits=48",
            "-nodefaults",
            "-display",
            "none",
            "-S",
        ])
        .args(["-qmp", "stdio", "-serial", "none"])
        .args(&args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut i = q.stdin.take().unwrap();
        i.write_all(
            b"{\"execute\":\"qmp_capabilities\"}\n{\"execute\":\"query-pci\"}\n{\"execute\":\"quit\"}\n",
        )
        .unwrap();
    }
    let out = q.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let reply: serde_json::Value = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["return"].is_array())
        .unwrap_or_else(|| {
            panic!(
                "no query-pci reply:\n{text}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    let bus_of = |id: &str| {
        reply["return"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| {
                b["devices"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|d| d["qdev_id"] == id)
            })
            .map(|b| b["bus"].as_u64().unwrap())
    };
    assert_eq!(bus_of("rp1"), Some(0x80), "{text}");
    assert_eq!(bus_of("rp2"), Some(0x90), "{text}");
    let pxb = qemu_properties("pxb-pcie");
    assert!(pxb.contains("bus_nr") && pxb.contains("numa_node"), "{pxb:?}");
}

/// `--hugepages`: libvirt's `<memoryBacking><hugepages>`, QEMU's hugetlb memfd backend bound to
/// the devices' node; refused when the node has too few free pages (the HGX fixture's node 1
/// has 64 of 512 free) or the memory is not whole pages.
#[test]
fn hugepages_back_guest_ram() {
    let hgx = vfio_host("hgx-8gpu", &["0000:03:00.0", "0000:83:00.0"]);
    let xml = ok(&run_root(
        hgx.path(),
        &[
            "xml",
            "domain",
            "--name",
            "h",
            "--memory",
            "64G",
            "--vcpus",
            "8",
            "--hugepages",
            "1G",
            "--device",
            "03:00.0",
            "--locked",
        ],
    ));
    assert!(
        xml.contains("<memoryBacking>\n    <hugepages>\n      <page size=\"1048576\" unit=\"KiB\"/>\n    </hugepages>\n    <locked/>\n  </memoryBacking>"),
        "{xml}"
    );
    libvirt_accepts(&xml, "1G hugepages");
    assert!(validates_with(
        &libvirt_12_9_schemas(),
        &xml,
        "1G hugepages on 12.9"
    ));
    // Spanning both nodes: 32 pages from each; node 1 has 64 free, 96G would need 48 there.
    let o = run_root(
        hgx.path(),
        &[
            "qemu-args",
            "03:00.0",
            "83:00.0",
            "--memory",
            "64G",
            "--vcpus",
            "4",
            "--hugepages",
            "1G",
        ],
    );
    let args = ok(&o);
    assert!(
        args.contains("-object memory-backend-memfd,id=gpupass-mem1,size=32768M,hugetlb=on,hugetlbsize=1G,prealloc=on,host-nodes=1,policy=bind\n"),
        "{args}"
    );
    fails(
        &run_root(
            hgx.path(),
            &[
                "qemu-args",
                "03:00.0",
                "83:00.0",
                "--memory",
                "160G",
                "--vcpus",
                "4",
                "--hugepages",
                "1G",
            ],
        ),
        1,
        &[
            "needs 80 free 1G pages on host node 1",
            "which has 64 free of 512 reserved",
        ],
    );
    // Without --memory qemu-args cannot size a backend: a usage error from the parser.
    fails(
        &run_root(hgx.path(), &["qemu-args", "03:00.0", "--hugepages", "2M"]),
        2,
        &["--memory"],
    );
    let memfd = tool("qemu-system-x86_64")
        .args(["-object", "memory-backend-memfd,help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&memfd.stdout);
    for p in ["hugetlb=", "hugetlbsize=", "prealloc=", "host-nodes=", "policy="] {
        assert!(
            help.contains(p),
            "memory-backend-memfd has no {p} in QEMU 10.0:\n{help}"
        );
    }
}

/// GPUDirect P2P cliques in libvirt: no element exists, so each clique GPU's hostdev gets a
/// user alias and `<qemu:override>` sets `x-nv-gpudirect-clique` on that QEMU device; both RNGs
/// and `virsh define` accept it.
#[test]
fn p2p_cliques_in_libvirt_through_qemu_override() {
    let hgx = host("hgx-8gpu");
    let mut args = vec![
        "xml",
        "domain",
        "--name",
        "hgx",
        "--memory",
        "64G",
        "--vcpus",
        "16",
        "--managed",
        "--device",
    ];
    let gpus = [
        "03:00.0", "04:00.0", "05:00.0", "06:00.0", "83:00.0", "84:00.0", "85:00.0", "86:00.0",
    ];
    args.extend_from_slice(&gpus);
    let xml = ok(&run_root(&hgx, &args));
    assert!(
        xml.contains("<domain type=\"kvm\" xmlns:qemu=\"http://libvirt.org/schemas/domain/qemu/1.0\">"),
        "{xml}"
    );
    for (i, g) in gpus.iter().enumerate() {
        let alias = format!("ua-gpupass-hostdev{}", i + 1);
        let bus = &g[..2];
        let at = xml
            .find(&format!(
                "bus=\"0x{bus}\" slot=\"0x00\" function=\"0x0\"/>\n      </source>"
            ))
            .unwrap();
        assert!(
            xml[at..]
                .split("</hostdev>")
                .next()
                .unwrap()
                .contains(&format!("<alias name=\"{alias}\"/>")),
            "{xml}"
        );
        let clique = if bus.starts_with('0') { 0 } else { 1 };
        assert!(
            xml.contains(&format!(
                "<qemu:device alias=\"{alias}\">\n      <qemu:frontend>\n        <qemu:property name=\"x-nv-gpudirect-clique\" type=\"unsigned\" value=\"{clique}\"/>"
            )),
            "{xml}"
        );
    }
    libvirt_accepts(&xml, "HGX cliques");
    assert!(validates_with(
        &libvirt_12_9_schemas(),
        &xml,
        "HGX cliques on 12.9"
    ));
    // No clique, no namespace.
    let one = ok(&run_root(
        &hgx,
        &[
            "xml",
            "domain",
            "--name",
            "h",
            "--memory",
            "8G",
            "--vcpus",
            "4",
            "--managed",
            "--device",
            "03:00.0",
        ],
    ));
    assert!(!one.contains("qemu:override") && !one.contains("<alias"), "{one}");
}

/// The big-GPU fixtures render full definitions (goldens): the HGX board's eight H100s over two
/// nodes with hugepages, and the SR-IOV H200's PF; both pass libvirt 9.0 and 12.9.
#[test]
fn big_gpu_definitions_golden() {
    let s129 = libvirt_12_9_schemas();
    let hgx = vfio_host(
        "hgx-8gpu",
        &[
            "0000:03:00.0",
            "0000:04:00.0",
            "0000:05:00.0",
            "0000:06:00.0",
            "0000:83:00.0",
            "0000:84:00.0",
            "0000:85:00.0",
            "0000:86:00.0",
        ],
    );
    let gpus = [
        "03:00.0", "04:00.0", "05:00.0", "06:00.0", "83:00.0", "84:00.0", "85:00.0", "86:00.0",
    ];
    let mut a = vec![
        "xml",
        "domain",
        "--name",
        "hgx-8gpu",
        "--memory",
        "96G",
        "--vcpus",
        "32",
        "--hugepages",
        "1G",
        "--libvirt-version",
        "9.0",
        "--device",
    ];
    a.extend_from_slice(&gpus);
    let xml = ok(&run_root(hgx.path(), &a));
    golden("hgx-8gpu/xml-domain-8gpu.xml", &xml);
    libvirt_accepts(&xml, "HGX 8 GPUs");
    assert!(validates_with(&s129, &xml, "HGX 8 GPUs on 12.9"));
    let mut q = vec![
        "qemu-args",
        "--memory",
        "96G",
        "--vcpus",
        "32",
        "--hugepages",
        "1G",
        "--backend",
        "legacy",
    ];
    q.extend_from_slice(&gpus);
    golden("hgx-8gpu/qemu-args-8gpu.txt", &ok(&run_root(hgx.path(), &q)));

    let h200 = vfio_host("sriov-vgpu", &["0000:41:00.0"]);
    let xml = ok(&run_root(
        h200.path(),
        &[
            "xml",
            "domain",
            "--name",
            "h200",
            "--memory",
            "32G",
            "--vcpus",
            "16",
            "--hugepages",
            "2M",
            "--device",
            "41:00.0",
        ],
    ));
    golden("sriov-vgpu/xml-domain-pf.xml", &xml);
    libvirt_accepts(&xml, "H200 PF");
    assert!(validates_with(&s129, &xml, "H200 PF on 12.9"));
    golden(
        "sriov-vgpu/qemu-args-pf.txt",
        &ok(&run_root(
            h200.path(),
            &[
                "qemu-args",
                "--backend",
                "legacy",
                "--memory",
                "32G",
                "--hugepages",
                "2M",
                "41:00.0",
            ],
        )),
    );
}

/// libvirt's own QEMU driver turns gpupass's domain XML into a QEMU command line: `virsh -c
/// qemu:///session domxml-to-native qemu-argv` (Debian 12's libvirt 9.0 daemon, started on
/// demand for user nobody with group kvm, emulator = the lab's QEMU 10.0 copied where nobody
/// can read it). What the session cannot take is adjusted for the conversion only, and said
/// here: `--memtune off` (a session has no cgroups: "Memory tuning is not available in session
/// mode"), `managed='no'` (nothing may touch this machine's devices), and the fixtures' host
/// nodes and CPUs mapped to this machine's node 0 and CPU 0 (libvirt checks the host has them).
/// The guest topology, devices and properties are gpupass's, and the command line must carry
/// them: one pxb-pcie per host node with numa_node=, the root ports on them, each vfio-pci on
/// its root port, the 64-bit window, the OVMF aperture, the P2P cliques, host-phys-bits.
#[test]
fn libvirt_qemu_driver_turns_the_domains_into_qemu_command_lines() {
    let lab = tool("qemu-system-x86_64").get_program().to_owned();
    let qemu_dir = Path::new(&lab).parent().unwrap().parent().unwrap().to_path_buf();
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    std::fs::set_permissions(h, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let cp = Command::new("cp")
        .arg("-a")
        .arg(&qemu_dir)
        .arg(h.join("qemu"))
        .status()
        .unwrap();
    assert!(cp.success());
    Command::new("chmod")
        .args(["-R", "a+rX"])
        .arg(h)
        .status()
        .unwrap();
    for f in [
        "/usr/sbin/libvirtd",
        "/usr/share/qemu/firmware/60-edk2-x86_64.json",
    ] {
        assert!(Path::new(f).exists(), "{f} is missing: tests/install-deps.sh installs libvirt-daemon, libvirt-daemon-driver-qemu and ovmf");
    }
    let to_native = |name: &str, xml: &str| -> String {
        let xml = xml
            .replace("managed=\"yes\"", "managed=\"no\"")
            .replace("nodeset=\"0,1\"", "nodeset=\"0\"")
            .replace("nodeset=\"1\"", "nodeset=\"0\"");
        let xml = regex_lite_cpuset(&xml);
        let f = h.join(format!("{name}.xml"));
        std::fs::write(&f, xml).unwrap();
        std::fs::set_permissions(&f, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
        let o = Command::new("runuser")
            .args(["-u", "nobody", "-g", "kvm", "--", "env"])
            .arg(format!("HOME={}", h.display()))
            .arg(format!("XDG_RUNTIME_DIR={}/run", h.display()))
            .arg(format!("PATH={}/qemu/bin:/usr/bin:/bin", h.display()))
            .args(["virsh", "-c", "qemu:///session", "domxml-to-native", "qemu-argv"])
            .arg(&f)
            .output()
            .unwrap();
        if !o.status.success() {
            // libvirt often says only "An error occurred, but the cause is unknown" when its
            // probe of the emulator failed: run that probe (qom-list-types) and show QEMU's words.
            let probe = Command::new("sh")
                .arg("-c")
                .arg(format!(
                    "printf '%s\\n' '{{\"execute\":\"qmp_capabilities\"}}' '{{\"execute\":\"qom-list-types\"}}' \
                     '{{\"execute\":\"quit\"}}' | timeout 60 {}/qemu/bin/qemu-system-x86_64 -M none \
                     -nodefaults -display none -qmp stdio 2>&1 | grep -v '^{{\"return' | tail -20",
                    h.display()
                ))
                .output()
                .unwrap();
            panic!(
                "libvirt's QEMU driver refused {name}:\n{}\nthe emulator's qom-list-types probe said:\n{}",
                String::from_utf8_lossy(&o.stderr),
                String::from_utf8_lossy(&probe.stdout)
            );
        }
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    // Two L40S on two nodes plus an A6000 with its audio function: expanders and cells.
    let numa = host("vfio-numa");
    let xml = ok(&run_root(
        &numa,
        &[
            "xml",
            "domain",
            "--name",
            "numa",
            "--memory",
            "4G",
            "--vcpus",
            "4",
            "--backend",
            "legacy",
            "--memtune",
            "off",
            "--device",
            "17:00.0",
            "ca:00.0",
            "4b:00.0",
        ],
    ));
    let argv = to_native("numa", &xml);
    let has = |argv: &str, want: &str| {
        assert!(
            argv.contains(want),
            "no {want:?} in libvirt's command line:\n{argv}"
        )
    };
    for want in [
        r#""driver":"pxb-pcie""#,
        r#""numa_node":0"#,
        r#""numa_node":1"#,
        "-numa node,nodeid=1,cpus=2-3,memdev=ram-node1",
        "-cpu host,migratable=on,host-phys-bits=on",
        "-global q35-pcihost.pci-hole64-size=536870912K",
        "-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=524288",
        r#""driver":"vfio-pci","host":"0000:ca:00.0""#,
        r#""host":"0000:4b:00.1""#,
    ] {
        has(&argv, want);
    }
    // Each vfio-pci sits on a root port whose bus is the expander of its node.
    let dev_bus = |argv: &str, key: &str| -> String {
        let l = argv
            .split(" -")
            .find(|l| l.contains(key))
            .unwrap_or_else(|| panic!("{key} not in {argv}"));
        l.split("\"bus\":\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap()
            .to_string()
    };
    let port_of_17 = dev_bus(&argv, "\"host\":\"0000:17:00.0\"");
    let port_of_ca = dev_bus(&argv, "\"host\":\"0000:ca:00.0\"");
    let pxb_of = |port: &str| dev_bus(&argv, &format!("\"id\":\"{port}\""));
    let numa_of = |pxb: &str| {
        let l = argv
            .split(" -")
            .find(|l| l.contains("pxb-pcie") && l.contains(&format!("\"id\":\"{pxb}\"")))
            .unwrap();
        l.split("\"numa_node\":").nth(1).unwrap().chars().next().unwrap()
    };
    assert_eq!(numa_of(&pxb_of(&port_of_17)), '0', "{argv}");
    assert_eq!(numa_of(&pxb_of(&port_of_ca)), '1', "{argv}");
    // The HGX board's GPUs: cliques through <qemu:override>.
    let hgx = host("hgx-8gpu");
    let xml = ok(&run_root(
        &hgx,
        &[
            "xml",
            "domain",
            "--name",
            "hgx",
            "--memory",
            "8G",
            "--vcpus",
            "4",
            "--managed",
            "--memtune",
            "off",
            "--libvirt-version",
            "9.0",
            "--device",
            "03:00.0",
            "04:00.0",
            "83:00.0",
            "84:00.0",
        ],
    ));
    let argv = to_native("hgx", &xml);
    for want in [
        r#""host":"0000:03:00.0","id":"ua-gpupass-hostdev1""#,
        r#""x-nv-gpudirect-clique":0"#,
        r#""host":"0000:84:00.0","id":"ua-gpupass-hostdev4""#,
        r#""x-nv-gpudirect-clique":1"#,
        "-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=2097152",
        "OVMF_CODE",
        // The HGX IOMMU (48 bits) is narrower than its CPU (52), but libvirt 9.0 has no limit:
        // the plain element, the host's bits.
        "-cpu host,migratable=on,host-phys-bits=on",
    ] {
        has(&argv, want);
    }
    assert!(!argv.contains("host-phys-bits-limit"), "{argv}");
    assert_eq!(argv.matches("x-nv-gpudirect-clique").count(), 4, "{argv}");
    // The same domain for libvirt 12.9 carries limit='48', which libvirt 9.0's QEMU driver
    // drops without a word: why the limit is written only for a target that has it (9.3+),
    // and the note says so otherwise.
    let xml129 = xml.replace(
        "<maxphysaddr mode=\"passthrough\"/>",
        "<maxphysaddr mode=\"passthrough\" limit=\"48\"/>",
    );
    assert_ne!(xml129, xml);
    let argv = to_native("hgx", &xml129);
    has(&argv, "-cpu host,migratable=on,host-phys-bits=on");
    assert!(!argv.contains("host-phys-bits-limit"), "{argv}");
}

/// `cpuset="..."` → `cpuset="0"` (this machine's CPUs differ from the fixture's).
fn regex_lite_cpuset(xml: &str) -> String {
    let mut out = String::new();
    let mut rest = xml;
    while let Some(i) = rest.find("cpuset=\"") {
        out.push_str(&rest[..i + 8]);
        let after = &rest[i + 8..];
        let j = after.find('"').unwrap();
        out.push('0');
        rest = &after[j..];
    }
    out.push_str(rest);
    out
}
