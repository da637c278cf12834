//! `gpupass attach` / `detach` through the real libvirt API (cargo feature `libvirt`), against
//! libvirt's test driver: `test:///default` (a running, persistent domain `test`) and a
//! test-driver node file holding a domain that already has the GPU.
//!
//! The test driver keeps its state per connection, so each test checks what gpupass itself
//! verified by reading the domain XML back inside the same connection.
//!
//! Run with: cargo test --features libvirt --test it vm_attach::

use crate::util::*;

fn attach(uri: &str, domain: &str, extra: &[&str]) -> std::process::Output {
    let mut a = vec!["attach", "--connect", uri, "--domain", domain];
    a.extend_from_slice(extra);
    on_host("workstation", &a)
}

fn detach(uri: &str, domain: &str, extra: &[&str]) -> std::process::Output {
    let mut a = vec!["detach", "--connect", uri, "--domain", domain];
    a.extend_from_slice(extra);
    on_host("workstation", &a)
}

#[test]
fn attach_to_the_persistent_definition_of_test_default() {
    let o = attach("test:///default", "test", &["01:00.0", "--managed", "--config"]);
    let out = ok(&o);
    assert!(
        out.starts_with("attached 0000:01:00.0, 0000:01:00.1 to domain test (persistent definition"),
        "{out}"
    );
    // mdev hostdevs attach the same way.
    let o = on_host(
        "mdev-t4",
        &[
            "attach",
            "--connect",
            "test:///default",
            "--domain",
            "test",
            "--config",
            "2f3e4d5c-6b7a-4988-8776-655443322110",
        ],
    );
    assert!(ok(&o).contains("attached 2f3e4d5c-6b7a-4988-8776-655443322110"));
}

#[test]
fn live_attach_passes_libvirts_error_through() {
    // `test` runs, so the default scope is live + config; the test driver cannot hotplug.
    let o = attach("test:///default", "test", &["01:00.0", "--managed"]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(
        err.contains("this function is not supported by the connection driver: virDomainAttachDeviceFlags"),
        "{err}"
    );
    // docs/errors.md E-OUT-14: `gpupass: libvirt: <doing>: <libvirt message><hint>`.
    assert!(
        err.contains("gpupass: libvirt: attaching 0000:01:00.0 to domain \"test\""),
        "{err}"
    );
    assert!(err.contains("retry with --config"), "{err}");
    assert_eq!(
        err.matches("not supported").count(),
        1,
        "libvirt's error printed once: {err}"
    );
}

#[test]
fn connection_and_domain_errors_are_libvirts() {
    let o = attach("test:///default", "no-such-vm", &["01:00.0", "--managed"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("no domain \"no-such-vm\" on test:///default: Domain not found"),
        "{}",
        stderr(&o)
    );
    let o = attach("bogus:///nowhere", "test", &["01:00.0", "--managed"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("cannot connect to bogus:///nowhere"),
        "{}",
        stderr(&o)
    );
    // The driver check comes before libvirt is contacted.
    let o = attach("test:///default", "test", &["01:00.0"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("gpupass bind 0000:01:00.0"));
}

/// A test-driver node whose domain `vm1` already holds the RTX 4090 and its audio function.
fn node_with_gpu() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let mut devs = String::new();
    for f in ["0x0", "0x1"] {
        devs.push_str(&format!(
            "<hostdev mode='subsystem' type='pci' managed='yes'><source><address domain='0x0000' bus='0x01' slot='0x00' function='{f}'/></source></hostdev>\n"
        ));
    }
    let node = format!(
        "<node>\n<domain type='test'>\n<name>vm1</name>\n<memory>1048576</memory>\n\
         <os><type arch='x86_64' machine='q35'>hvm</type></os>\n<devices>\n{devs}</devices>\n</domain>\n</node>\n"
    );
    let p = dir.path().join("node.xml");
    std::fs::write(&p, node).unwrap();
    let uri = format!("test://{}", p.display());
    (dir, uri)
}

#[test]
fn detach_from_a_domain_that_has_the_gpu() {
    let (_d, uri) = node_with_gpu();
    let out = ok(&detach(&uri, "vm1", &["01:00.0", "--config"]));
    assert!(
        out.starts_with("detached 0000:01:00.0, 0000:01:00.1 from domain vm1"),
        "{out}"
    );
    let out = ok(&detach(&uri, "vm1", &["01:00.1", "--only", "--config"]));
    assert!(out.starts_with("detached 0000:01:00.1 from domain vm1"), "{out}");
    // Attaching what is already there is refused before libvirt is asked.
    let o = on_host(
        "workstation",
        &[
            "attach",
            "--connect",
            &uri,
            "--domain",
            "vm1",
            "01:00.0",
            "--managed",
            "--config",
        ],
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("0000:01:00.0 is already in the persistent definition"),
        "{}",
        stderr(&o)
    );
    // Detaching what is not there changes nothing and says so.
    let o = detach("test:///default", "test", &["01:00.0", "--config"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("not attached to the persistent definition of domain \"test\""),
        "{}",
        stderr(&o)
    );
    // Live detach on a driver without hot-unplug: libvirt's error.
    let o = detach(&uri, "vm1", &["01:00.0", "--live"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("virDomainDetachDeviceFlags"),
        "{}",
        stderr(&o)
    );
}
