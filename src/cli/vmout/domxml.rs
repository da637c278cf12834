//! Reading and editing a libvirt domain XML document: which hostdevs it holds, adding and
//! removing `<hostdev>` elements. Pure string-to-string, used by `attach`/`detach` to verify
//! what libvirt did, and to edit the persistent definition when a driver lacks
//! virDomainAttachDeviceFlags (as the test driver does).
//!
//! Streaming with quick-xml: everything not touched is written back event by event, so the
//! document keeps what libvirt put in it.

use crate::model::PciAddress;
use quick_xml::events::{BytesStart, Event};
use quick_xml::{Reader, Writer};
use std::fmt;

/// The host side of a hostdev: what libvirt matches a device by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HostdevSource {
    Pci(PciAddress),
    /// Lower-case mdev UUID.
    Mdev(String),
}

impl fmt::Display for HostdevSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostdevSource::Pci(a) => write!(f, "{a}"),
            HostdevSource::Mdev(u) => f.write_str(u),
        }
    }
}

/// Malformed domain or device XML.
#[derive(Debug, thiserror::Error)]
pub enum DomXmlError {
    #[error("cannot parse {what} XML: {reason}")]
    Parse { what: &'static str, reason: String },
    #[error("the domain XML has no <devices> element to add the hostdevs to")]
    NoDevices,
}

fn parse_err(what: &'static str, e: impl fmt::Display) -> DomXmlError {
    DomXmlError::Parse {
        what,
        reason: e.to_string(),
    }
}

fn attr(e: &BytesStart, name: &str) -> Option<String> {
    e.attributes()
        .flatten()
        .find(|a| a.key.as_ref() == name.as_bytes())
        .and_then(|a| a.normalized_value(quick_xml::XmlVersion::Implicit1_0).ok())
        .map(|v| v.into_owned())
}

fn hex(s: &str) -> Option<u32> {
    let t = s.trim();
    let t = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")).unwrap_or(t);
    u32::from_str_radix(t, 16).ok()
}

/// A `<source><address .../>` inside a hostdev: PCI (domain/bus/slot/function) or mdev uuid.
fn source_of_address(e: &BytesStart) -> Option<HostdevSource> {
    if let Some(u) = attr(e, "uuid") {
        return Some(HostdevSource::Mdev(u.to_ascii_lowercase()));
    }
    let dom = attr(e, "domain").and_then(|v| hex(&v)).unwrap_or(0);
    let bus = attr(e, "bus").and_then(|v| hex(&v))?;
    let slot = attr(e, "slot").and_then(|v| hex(&v))?;
    let func = attr(e, "function").and_then(|v| hex(&v))?;
    if bus > 0xff || slot > 0x1f || func > 7 {
        return None;
    }
    Some(HostdevSource::Pci(PciAddress::new(
        dom, bus as u8, slot as u8, func as u8,
    )))
}

/// Collected events of one `<hostdev>` element and its source.
struct Pending {
    events: Vec<Event<'static>>,
    depth: usize,
    in_source: bool,
    source: Option<HostdevSource>,
}

/// Walk a document, calling `on_hostdev` for each complete `<hostdev>` (keep it if it
/// returns true) and `before_devices_end` just before `</devices>`.
fn rewrite(
    xml: &str,
    what: &'static str,
    mut on_hostdev: impl FnMut(Option<&HostdevSource>) -> bool,
    mut before_devices_end: impl FnMut(&mut Writer<Vec<u8>>) -> Result<(), DomXmlError>,
) -> Result<String, DomXmlError> {
    let mut r = Reader::from_str(xml);
    let mut w = Writer::new(Vec::new());
    let mut pending: Option<Pending> = None;
    let mut saw_devices = false;
    loop {
        let ev = r.read_event().map_err(|e| parse_err(what, e))?;
        if matches!(ev, Event::Eof) {
            break;
        }
        if let Some(p) = pending.as_mut() {
            match &ev {
                Event::Start(e) => {
                    p.depth += 1;
                    if e.name().as_ref() == b"source" && p.depth == 2 {
                        p.in_source = true;
                    }
                }
                Event::Empty(e) if p.in_source && e.name().as_ref() == b"address" => {
                    p.source = source_of_address(e);
                }
                Event::End(e) => {
                    if e.name().as_ref() == b"source" {
                        p.in_source = false;
                    }
                    p.depth -= 1;
                }
                _ => {}
            }
            p.events.push(ev.into_owned());
            if p.depth == 0 {
                let p = pending.take().unwrap_or_else(|| unreachable!());
                if on_hostdev(p.source.as_ref()) {
                    for e in p.events {
                        w.write_event(e).map_err(|e| parse_err(what, e))?;
                    }
                }
            }
            continue;
        }
        match &ev {
            Event::Start(e) if e.name().as_ref() == b"hostdev" => {
                pending = Some(Pending {
                    events: vec![ev.into_owned()],
                    depth: 1,
                    in_source: false,
                    source: None,
                });
                continue;
            }
            Event::Empty(e) if e.name().as_ref() == b"hostdev" => {
                if on_hostdev(None) {
                    w.write_event(ev).map_err(|e| parse_err(what, e))?;
                }
                continue;
            }
            Event::End(e) if e.name().as_ref() == b"devices" => {
                saw_devices = true;
                before_devices_end(&mut w)?;
            }
            Event::Empty(e) if e.name().as_ref() == b"devices" => {
                // `<devices/>`: open it so that hostdevs can go in.
                saw_devices = true;
                let start = e.to_owned();
                let end = start.to_end().into_owned();
                w.write_event(Event::Start(start))
                    .map_err(|e| parse_err(what, e))?;
                before_devices_end(&mut w)?;
                w.write_event(Event::End(end)).map_err(|e| parse_err(what, e))?;
                continue;
            }
            _ => {}
        }
        w.write_event(ev).map_err(|e| parse_err(what, e))?;
    }
    if pending.is_some() {
        return Err(parse_err(what, "unterminated <hostdev>"));
    }
    if !saw_devices {
        return Err(DomXmlError::NoDevices);
    }
    Ok(String::from_utf8_lossy(&w.into_inner()).into_owned())
}

/// The sources of every `<hostdev>` in a domain XML.
pub(crate) fn hostdev_sources(domain_xml: &str) -> Result<Vec<HostdevSource>, DomXmlError> {
    let mut found = Vec::new();
    let res = rewrite(
        domain_xml,
        "domain",
        |s| {
            if let Some(s) = s {
                found.push(s.clone());
            }
            true
        },
        |_| Ok(()),
    );
    match res {
        Ok(_) | Err(DomXmlError::NoDevices) => Ok(found),
        Err(e) => Err(e),
    }
}

/// The source of one `<hostdev>` fragment.
pub(crate) fn fragment_source(hostdev_xml: &str) -> Result<Option<HostdevSource>, DomXmlError> {
    let wrapped = format!("<devices>{hostdev_xml}</devices>");
    Ok(hostdev_sources(&wrapped)?.into_iter().next())
}

/// Add `<hostdev>` fragments at the end of `<devices>`.
pub(crate) fn insert_hostdevs(domain_xml: &str, fragments: &[String]) -> Result<String, DomXmlError> {
    rewrite(
        domain_xml,
        "domain",
        |_| true,
        |w| {
            for f in fragments {
                let mut r = Reader::from_str(f);
                loop {
                    let ev = r.read_event().map_err(|e| parse_err("hostdev", e))?;
                    match ev {
                        Event::Eof => break,
                        Event::Decl(_) => {}
                        ev => w.write_event(ev).map_err(|e| parse_err("hostdev", e))?,
                    }
                }
            }
            Ok(())
        },
    )
}

/// Remove the `<hostdev>` elements whose source is in `targets`; returns the new document
/// and how many were removed.
pub(crate) fn remove_hostdevs(
    domain_xml: &str,
    targets: &[HostdevSource],
) -> Result<(String, usize), DomXmlError> {
    let mut removed = 0;
    let xml = rewrite(
        domain_xml,
        "domain",
        |s| match s {
            Some(s) if targets.contains(s) => {
                removed += 1;
                false
            }
            _ => true,
        },
        |_| Ok(()),
    )?;
    Ok((xml, removed))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOM: &str = r#"<domain type='test'>
  <name>a&lt;b</name>
  <devices>
    <disk type='file'><source file='/x'/></disk>
    <hostdev mode='subsystem' type='pci' managed='no'>
      <source>
        <address domain='0x0000' bus='0x01' slot='0x00' function='0x1'/>
      </source>
      <address type='pci' domain='0x0000' bus='0x05' slot='0x00' function='0x0'/>
    </hostdev>
    <hostdev mode='subsystem' type='mdev' model='vfio-pci'>
      <source><address uuid='2F3E4D5C-6B7A-4988-8776-655443322110'/></source>
    </hostdev>
  </devices>
</domain>"#;

    fn pci(s: &str) -> HostdevSource {
        HostdevSource::Pci(s.parse().unwrap())
    }

    #[test]
    fn finds_sources_not_guest_addresses() {
        let s = hostdev_sources(DOM).unwrap();
        assert_eq!(
            s,
            vec![
                pci("0000:01:00.1"),
                HostdevSource::Mdev("2f3e4d5c-6b7a-4988-8776-655443322110".into())
            ]
        );
    }

    #[test]
    fn insert_then_remove_round_trips() {
        let frag = "<hostdev mode='subsystem' type='pci' managed='yes'>\n  <source>\n    <address domain='0x0000' bus='0x02' slot='0x00' function='0x0'/>\n  </source>\n</hostdev>\n".to_string();
        let with = insert_hostdevs(DOM, &[frag]).unwrap();
        assert!(with.contains("<name>a&lt;b</name>"), "{with}");
        assert_eq!(hostdev_sources(&with).unwrap().len(), 3);
        let (without, n) = remove_hostdevs(&with, &[pci("0000:02:00.0"), pci("0000:01:00.1")]).unwrap();
        assert_eq!(n, 2);
        assert_eq!(
            hostdev_sources(&without).unwrap(),
            vec![HostdevSource::Mdev("2f3e4d5c-6b7a-4988-8776-655443322110".into())]
        );
        assert!(without.contains("<disk type='file'>"));
    }

    #[test]
    fn empty_devices_and_garbage() {
        let frag = "<hostdev mode='subsystem' type='mdev' model='vfio-pci'><source><address uuid='u'/></source></hostdev>".to_string();
        let x = insert_hostdevs("<domain><devices/></domain>", &[frag]).unwrap();
        assert_eq!(
            hostdev_sources(&x).unwrap(),
            vec![HostdevSource::Mdev("u".into())]
        );
        assert!(matches!(
            insert_hostdevs("<domain/>", &[]),
            Err(DomXmlError::NoDevices)
        ));
        assert!(hostdev_sources("<domain><devices><hostdev></devices>").is_err());
    }
}
