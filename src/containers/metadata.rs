//! Reading a container's KEP-5304 device metadata (Kubernetes DRA, `metadata.resource.k8s.io`),
//! for a VM launcher in a Pod: which PCI function (`resource.kubernetes.io/pciBusID`) or
//! mediated device (`mdevUUID`, KubeVirt's key) its claim was given, and, for gpupass's own
//! driver, the VFIO backend the claim was prepared for (`gpupass.dev/backend`).
//!
//! The kubelet's DRA framework mounts one file per claim request into the container, at
//! `/var/run/kubernetes.io/dra-device-attributes/resourceclaims/<claim>/<request>/<driver>-metadata.json`
//! (`resourceclaimtemplates/<podClaimName>/...` for a claim made from a template). A file is a
//! stream of `DeviceMetadata` documents, one per API version the driver writes (gpupass writes
//! `v1beta1`, then `v1alpha1`: docs/dra.md); a reader takes the first it knows, as Kubernetes'
//! own `devicemetadata.DecodeMetadataFromStream` does. `gpupass boot --dra-metadata` takes a
//! file or a directory (by default the mount point above), so an image without a shell finds its
//! device itself (docs/vmm.md, "A VM in a Pod").

use crate::model::{Backend, PciAddress};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// Where the kubelet's DRA framework mounts the metadata files in a container.
pub(crate) const CONTAINER_DIR: &str = "/var/run/kubernetes.io/dra-device-attributes";

/// The API versions of `DeviceMetadata` this reader understands (the shape is the same).
pub(crate) const API_VERSIONS: [&str; 2] = [
    "metadata.resource.k8s.io/v1beta1",
    "metadata.resource.k8s.io/v1alpha1",
];

/// How deep a directory is searched (`resourceclaimtemplates/<claim>/<request>/<file>` is 3).
const MAX_DEPTH: usize = 6;

#[derive(Debug, thiserror::Error)]
pub(crate) enum MetadataError {
    #[error("cannot read the DRA device metadata at {}; a Pod's claim gives one file per request under {CONTAINER_DIR} (KEP-5304: the driver must write metadata and the kubelet's DRADeviceMetadata gate must be on)", .path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {why}; expected a DeviceMetadata document of {} (KEP-5304)", .path.display(), API_VERSIONS.join(" or "))]
    NotMetadata { path: PathBuf, why: String },
    #[error("{}: attribute {key} of device {device} is {value}, not {what}", .path.display())]
    BadAttribute {
        path: PathBuf,
        device: String,
        key: &'static str,
        value: String,
        what: &'static str,
    },
    #[error("no device with a PCI address (resource.kubernetes.io/pciBusID) or an mdevUUID in the DRA metadata under {}{}; give the Pod a claim for a VFIO device (docs/dra.md)", .path.display(), if .seen.is_empty() { " (no *-metadata.json file there)".to_string() } else { format!(" (found only: {})", .seen.join("; ")) })]
    NoDevice { path: PathBuf, seen: Vec<String> },
    #[error("{} devices in the DRA metadata under {}: {}; name one request's file with --dra-metadata FILE", .found.len(), .path.display(), .found.join("; "))]
    Several { path: PathBuf, found: Vec<String> },
}

/// What a VM can be booted on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Bootable {
    Pci(PciAddress),
    Mdev(String),
}

/// One device of a claim request, as its metadata file names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Device {
    /// The file it was read from.
    pub file: PathBuf,
    /// `namespace/name` of the claim.
    pub claim: String,
    pub request: String,
    pub driver: String,
    /// The DRA device name (`pci-0000-00-03-0`).
    pub name: String,
    /// What to boot; `None` for a device that is neither a PCI function nor an mdev.
    pub target: Option<Bootable>,
    /// gpupass's `gpupass.dev/backend`: what the claim was prepared for (its nodes are there).
    pub backend: Option<Backend>,
}

impl Device {
    /// `claim/request: device (pciBusID ...)`, for messages.
    pub(crate) fn describe(&self) -> String {
        let what = match &self.target {
            Some(Bootable::Pci(a)) => format!("pciBusID {a}"),
            Some(Bootable::Mdev(u)) => format!("mdevUUID {u}"),
            None => "no pciBusID or mdevUUID".to_string(),
        };
        format!(
            "{} request {}: {}/{} ({what})",
            self.claim, self.request, self.driver, self.name
        )
    }
}

/// A string attribute (`{"string": "..."}`) of a device, by its qualified name or, for
/// `resource.kubernetes.io/` names, also unqualified (KubeVirt reads `mdevUUID` unqualified).
fn attr_string<'a>(attrs: &'a Value, key: &str) -> Option<&'a Value> {
    attrs.get(key).map(|a| a.get("string").unwrap_or(a))
}

/// Every device of the first document in `text` whose API version this reader knows.
pub(crate) fn parse(path: &Path, text: &str) -> Result<Vec<Device>, MetadataError> {
    let not = |why: String| MetadataError::NotMetadata {
        path: path.to_path_buf(),
        why,
    };
    let mut versions = Vec::new();
    let mut doc = None;
    for v in serde_json::Deserializer::from_str(text).into_iter::<Value>() {
        let v = v.map_err(|e| not(format!("not JSON ({e})")))?;
        let version = v["apiVersion"].as_str().unwrap_or("(none)").to_string();
        if v["kind"] == "DeviceMetadata" && API_VERSIONS.contains(&version.as_str()) {
            doc = Some(v);
            break;
        }
        versions.push(format!("{} {version}", v["kind"].as_str().unwrap_or("(no kind)")));
    }
    let Some(doc) = doc else {
        return Err(not(if versions.is_empty() {
            "empty".to_string()
        } else {
            format!("holds only {}", versions.join(", "))
        }));
    };
    let claim = format!(
        "{}/{}",
        doc["metadata"]["namespace"].as_str().unwrap_or("?"),
        doc["metadata"]["name"].as_str().unwrap_or("?")
    );
    let requests = doc["requests"]
        .as_array()
        .ok_or_else(|| not("no requests list".to_string()))?;
    let mut out = Vec::new();
    for r in requests {
        let request = r["name"].as_str().unwrap_or("?").to_string();
        for d in r["devices"].as_array().map(Vec::as_slice).unwrap_or_default() {
            let name = d["name"].as_str().unwrap_or("?").to_string();
            let attrs = &d["attributes"];
            let bad = |key: &'static str, value: &Value, what: &'static str| MetadataError::BadAttribute {
                path: path.to_path_buf(),
                device: name.clone(),
                key,
                value: value.to_string(),
                what,
            };
            let pci = match attr_string(attrs, "resource.kubernetes.io/pciBusID") {
                Some(v) => Some(
                    v.as_str()
                        .and_then(|s| s.parse::<PciAddress>().ok())
                        .ok_or_else(|| bad("resource.kubernetes.io/pciBusID", v, "a PCI address"))?,
                ),
                None => None,
            };
            let mdev = match attr_string(attrs, "mdevUUID") {
                Some(v) => Some(
                    v.as_str()
                        .and_then(crate::model::canonical_uuid)
                        .ok_or_else(|| bad("mdevUUID", v, "a UUID"))?,
                ),
                None => None,
            };
            let backend = match attr_string(attrs, "gpupass.dev/backend") {
                Some(v) => Some(match v.as_str() {
                    Some("legacy") => Backend::Legacy,
                    Some("iommufd") => Backend::Iommufd,
                    _ => return Err(bad("gpupass.dev/backend", v, "legacy or iommufd")),
                }),
                None => None,
            };
            out.push(Device {
                file: path.to_path_buf(),
                claim: claim.clone(),
                request: request.clone(),
                driver: d["driver"].as_str().unwrap_or("?").to_string(),
                name,
                target: pci.map(Bootable::Pci).or(mdev.map(Bootable::Mdev)),
                backend,
            });
        }
    }
    Ok(out)
}

/// The `*-metadata.json` files under `dir`, sorted (a symlink to a directory is not followed).
fn files_under(dir: &Path, depth: usize, out: &mut Vec<PathBuf>) -> Result<(), MetadataError> {
    let read = |source| MetadataError::Read {
        path: dir.to_path_buf(),
        source,
    };
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(read)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    for p in entries {
        let meta = std::fs::symlink_metadata(&p).map_err(|source| MetadataError::Read {
            path: p.clone(),
            source,
        })?;
        if meta.is_dir() {
            if depth < MAX_DEPTH {
                files_under(&p, depth + 1, out)?;
            }
        } else if p
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.ends_with("-metadata.json"))
        {
            out.push(p);
        }
    }
    Ok(())
}

/// The one bootable device at `path`: a metadata file, or a directory searched for them (the
/// kubelet's mount point, by default). None, or more than one, is an error that lists what is
/// there.
pub(crate) fn find(path: &Path) -> Result<Device, MetadataError> {
    let meta = std::fs::metadata(path).map_err(|source| MetadataError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let files = if meta.is_dir() {
        let mut f = Vec::new();
        files_under(path, 0, &mut f)?;
        f
    } else {
        vec![path.to_path_buf()]
    };
    let mut devices = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).map_err(|source| MetadataError::Read {
            path: f.clone(),
            source,
        })?;
        devices.extend(parse(f, &text)?);
    }
    let (mut bootable, others): (Vec<Device>, Vec<Device>) =
        devices.into_iter().partition(|d| d.target.is_some());
    match bootable.len() {
        1 => Ok(bootable.remove(0)),
        0 => Err(MetadataError::NoDevice {
            path: path.to_path_buf(),
            seen: others.iter().map(Device::describe).collect(),
        }),
        _ => Err(MetadataError::Several {
            path: path.to_path_buf(),
            found: bootable
                .iter()
                .map(|d| format!("{} in {}", d.describe(), d.file.display()))
                .collect(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What gpupass's Prepare writes for a legacy group claim (a file of the 6.12 cluster lab).
    fn legacy_file() -> String {
        let doc = |v: &str| {
            format!(
                r#"{{"apiVersion":"metadata.resource.k8s.io/{v}","kind":"DeviceMetadata","metadata":{{"generation":1,"name":"vm-vfio-628ds","namespace":"default","uid":"a2a8"}},"podClaimName":"vfio","requests":[{{"devices":[{{"attributes":{{"gpupass.dev/backend":{{"string":"legacy"}},"gpupass.dev/iommuGroup":{{"int":2}},"resource.kubernetes.io/pciBusID":{{"string":"0000:00:03.0"}},"resource.kubernetes.io/pcieRoot":{{"string":"pci0000:00"}}}},"driver":"vfio.gpupass.dev","name":"pci-0000-00-03-0","pool":"lab"}}],"name":"vfio"}}]}}"#
            )
        };
        format!("{}\n{}\n", doc("v1beta1"), doc("v1alpha1"))
    }

    #[test]
    fn a_prepared_group_claim_gives_its_pci_address_and_backend() {
        let d = parse(Path::new("m.json"), &legacy_file()).unwrap();
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].target, Some(Bootable::Pci("0000:00:03.0".parse().unwrap())));
        assert_eq!(d[0].backend, Some(Backend::Legacy));
        assert_eq!(d[0].claim, "default/vm-vfio-628ds");
        assert_eq!(d[0].request, "vfio");
        assert_eq!(d[0].name, "pci-0000-00-03-0");
        let iommufd = legacy_file().replace(r#""legacy""#, r#""iommufd""#);
        assert_eq!(
            parse(Path::new("m"), &iommufd).unwrap()[0].backend,
            Some(Backend::Iommufd)
        );
    }

    #[test]
    fn an_mdev_claim_and_another_drivers_device_are_read() {
        let text = r#"{"apiVersion":"metadata.resource.k8s.io/v1alpha1","kind":"DeviceMetadata","metadata":{"name":"c","namespace":"ns"},"requests":[{"name":"r","devices":[
            {"driver":"vfio.gpupass.dev","name":"mdev-mtty-mtty-2-0","attributes":{"mdevUUID":{"string":"6B8F3C2E-5A1D-4E7B-9C0A-1F2E3D4C5B6A"}}},
            {"driver":"gpu.example.com","name":"gpu-0","attributes":{"resource.kubernetes.io/pciBusID":{"string":"0000:3b:00.0"}}},
            {"driver":"net.example.com","name":"nic","attributes":{"ifName":{"string":"eth1"}}}]}]}"#;
        let d = parse(Path::new("m"), text).unwrap();
        assert_eq!(
            d[0].target,
            Some(Bootable::Mdev("6b8f3c2e-5a1d-4e7b-9c0a-1f2e3d4c5b6a".into()))
        );
        assert_eq!(d[1].target, Some(Bootable::Pci("0000:3b:00.0".parse().unwrap())));
        assert_eq!(d[1].backend, None);
        assert_eq!(d[2].target, None);
    }

    #[test]
    fn bad_files_are_refused_saying_what_is_wrong() {
        let p = Path::new("m.json");
        let e = parse(p, "{not json").unwrap_err().to_string();
        assert!(e.contains("m.json: not JSON"), "{e}");
        let e = parse(
            p,
            r#"{"apiVersion":"metadata.resource.k8s.io/v9","kind":"DeviceMetadata"}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("holds only DeviceMetadata metadata.resource.k8s.io/v9"),
            "{e}"
        );
        assert!(e.contains("metadata.resource.k8s.io/v1beta1 or"), "{e}");
        assert!(parse(p, "").unwrap_err().to_string().contains("empty"));
        let e = parse(p, &legacy_file().replace("0000:00:03.0", "00:03"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("attribute resource.kubernetes.io/pciBusID of device pci-0000-00-03-0 is \"00:03\", not a PCI address"),
            "{e}"
        );
        let e = parse(p, &legacy_file().replace(r#""legacy""#, r#""vfio""#))
            .unwrap_err()
            .to_string();
        assert!(e.contains("not legacy or iommufd"), "{e}");
    }

    #[test]
    fn a_directory_must_hold_exactly_one_bootable_device() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        // Nothing there.
        let e = find(root).unwrap_err().to_string();
        assert!(e.contains("no *-metadata.json file there"), "{e}");
        // The kubelet's layout for a claim from a template; other files are ignored.
        let dir = root.join("resourceclaimtemplates/vfio/vfio");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("vfio.gpupass.dev-metadata.json"), legacy_file()).unwrap();
        std::fs::write(dir.join("notes.txt"), "x").unwrap();
        let d = find(root).unwrap();
        assert_eq!(d.target, Some(Bootable::Pci("0000:00:03.0".parse().unwrap())));
        assert_eq!(d.file, dir.join("vfio.gpupass.dev-metadata.json"));
        // The file itself.
        assert_eq!(find(&d.file).unwrap(), d);
        // A second claim: name one.
        let two = root.join("resourceclaims/other/gpu");
        std::fs::create_dir_all(&two).unwrap();
        std::fs::write(
            two.join("vfio.gpupass.dev-metadata.json"),
            legacy_file().replace("00:03.0", "00:05.0"),
        )
        .unwrap();
        let e = find(root).unwrap_err().to_string();
        assert!(e.starts_with("2 devices in the DRA metadata under"), "{e}");
        assert!(
            e.contains("pciBusID 0000:00:05.0") && e.contains("--dra-metadata FILE"),
            "{e}"
        );
        // Only devices that are not bootable.
        let t2 = tempfile::tempdir().unwrap();
        let nic = r#"{"apiVersion":"metadata.resource.k8s.io/v1beta1","kind":"DeviceMetadata","metadata":{"name":"c","namespace":"ns"},"requests":[{"name":"r","devices":[{"driver":"net.example.com","name":"nic","attributes":{}}]}]}"#;
        std::fs::write(t2.path().join("net.example.com-metadata.json"), nic).unwrap();
        let e = find(t2.path()).unwrap_err().to_string();
        assert!(
            e.contains("found only: ns/c request r: net.example.com/nic (no pciBusID or mdevUUID)"),
            "{e}"
        );
        // A path that is not there.
        let e = find(&root.join("nope")).unwrap_err().to_string();
        assert!(e.contains("cannot read the DRA device metadata"), "{e}");
    }
}
