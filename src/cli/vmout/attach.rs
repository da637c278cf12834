//! `gpupass attach` / `detach`: their clap arguments and run functions, and the libvirt API
//! calls behind them (cargo feature `libvirt`; without it both commands fail with
//! [`VmOutError::NoLibvirt`]).
//!
//! libvirt facts encoded here:
//! - virDomainAttachDeviceFlags / virDomainDetachDeviceFlags take one device element and
//!   `VIR_DOMAIN_AFFECT_LIVE` (the running guest: hotplug) and/or `VIR_DOMAIN_AFFECT_CONFIG`
//!   (the persistent definition, next boot). LIVE on a shut-off domain and CONFIG on a
//!   transient one are errors.
//! - libvirt matches a hostdev to detach by its source address (PCI) or UUID (mdev).
//! - A live detach returns once QEMU has been asked to unplug; the device leaves the live XML
//!   when the guest OS releases it, which can take seconds.
//! - Some drivers (the `test` driver of libvirt 9.0 among them) have no
//!   virDomainAttachDeviceFlags and answer VIR_ERR_NO_SUPPORT. For a persistent-definition
//!   change gpupass then edits the definition itself, as `virsh edit` would: read the inactive
//!   XML, add or remove the `<hostdev>`s, virDomainDefineXML, and verify.
//!
//! After every change gpupass reads the domain XML back and checks that the hostdevs are (or
//! are no longer) there.

use super::{print_notes, select, LibvirtDeviceArgs, VmOutError};
use crate::cli::ctx::Ctx;
use crate::cli::error::{Error, Exit};
use crate::model::{Inventory, PciAddress};
use crate::output::libvirt;
#[cfg(not(feature = "libvirt"))]
use crate::output::libvirt::HostdevXml;
use crate::output::selection::{self, Consumer, DeviceArg, SelectOptions};
use clap::Args;
use std::io::Write;

#[derive(Debug, Args)]
pub struct AttachArgs {
    /// libvirt connection URI (qemu:///system, test:///default, ...)
    #[arg(long, env = "LIBVIRT_DEFAULT_URI", value_name = "URI")]
    pub connect: String,
    /// Domain name
    #[arg(long, value_name = "NAME")]
    pub domain: String,
    /// PCI addresses (0000:01:00.0, 01:00.0) or mdev UUIDs
    #[arg(required = true, value_name = "ADDRESS|UUID")]
    pub devices: Vec<DeviceArg>,
    /// Change the running domain (default: the running domain if it runs, plus the persistent
    /// definition if it has one)
    #[arg(long)]
    pub live: bool,
    /// Change the persistent definition (takes effect at next boot)
    #[arg(long)]
    pub config: bool,
    /// Guest PCI address (one device or one multifunction slot), as for `xml hostdev`
    #[arg(long, value_name = "ADDRESS")]
    pub guest_address: Option<PciAddress>,
    #[command(flatten)]
    pub dev: LibvirtDeviceArgs,
}

#[derive(Debug, Args)]
pub struct DetachArgs {
    /// libvirt connection URI (qemu:///system, test:///default, ...)
    #[arg(long, env = "LIBVIRT_DEFAULT_URI", value_name = "URI")]
    pub connect: String,
    /// Domain name
    #[arg(long, value_name = "NAME")]
    pub domain: String,
    /// PCI addresses (0000:01:00.0, 01:00.0) or mdev UUIDs
    #[arg(required = true, value_name = "ADDRESS|UUID")]
    pub devices: Vec<DeviceArg>,
    /// Only the devices named, not the other endpoints of their IOMMU groups
    #[arg(long)]
    pub only: bool,
    /// Change the running domain
    #[arg(long)]
    pub live: bool,
    /// Change the persistent definition
    #[arg(long)]
    pub config: bool,
}

/// `gpupass attach`.
fn attach_cmd(inv: &Inventory, a: &AttachArgs, out: &mut dyn Write) -> Result<Exit, VmOutError> {
    let sel = select(inv, &a.devices, a.dev.only, a.dev.consumer())?;
    let opts = a.dev.hostdev_options();
    print_notes(&libvirt::check_display(&sel, &opts)?);
    let devs = libvirt::hostdevs(&sel, &opts, a.guest_address)?;
    let scope = Scope::from_flags(a.live, a.config);
    let msg = attach(&a.connect, &a.domain, &devs, scope)?;
    writeln!(out, "{msg}")?;
    Ok(Exit::SUCCESS)
}

/// `gpupass detach`.
fn detach_cmd(inv: &Inventory, a: &DetachArgs, out: &mut dyn Write) -> Result<Exit, VmOutError> {
    // Detaching needs no driver check (the functions are the guest's now), and the notes
    // about group viability do not apply.
    let sel = selection::select(
        inv,
        &a.devices,
        SelectOptions {
            only: a.only,
            consumer: Consumer::LibvirtManaged,
        },
    )?;
    let devs = libvirt::hostdevs(&sel, &libvirt::HostdevOptions::default(), None)?;
    let scope = Scope::from_flags(a.live, a.config);
    let msg = detach(&a.connect, &a.domain, &devs, scope)?;
    writeln!(out, "{msg}")?;
    Ok(Exit::SUCCESS)
}

/// `gpupass attach`.
pub fn run_attach(ctx: &Ctx, a: AttachArgs, out: &mut dyn Write) -> Result<Exit, Error> {
    Ok(attach_cmd(&ctx.inventory()?, &a, out)?)
}

/// `gpupass detach`.
pub fn run_detach(ctx: &Ctx, a: DetachArgs, out: &mut dyn Write) -> Result<Exit, Error> {
    Ok(detach_cmd(&ctx.inventory()?, &a, out)?)
}

/// Which definition of the domain to change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scope {
    /// `--live`; with neither flag: the running domain if it runs.
    pub live: bool,
    /// `--config`; with neither flag: the persistent definition if there is one.
    pub config: bool,
}

impl Scope {
    pub fn from_flags(live: bool, config: bool) -> Self {
        Scope { live, config }
    }

    /// The scope to use for a domain in this state, with libvirt's rules applied to the
    /// default (neither flag): running → live (+ config when persistent), shut off → config.
    #[cfg_attr(not(feature = "libvirt"), allow(dead_code))]
    pub(crate) fn resolve(self, active: bool, persistent: bool) -> Scope {
        if self.live || self.config {
            return self;
        }
        Scope {
            live: active,
            config: persistent || !active,
        }
    }

    #[cfg_attr(not(feature = "libvirt"), allow(dead_code))]
    pub(crate) fn describe(self) -> &'static str {
        match (self.live, self.config) {
            (true, true) => "running domain and persistent definition",
            (true, false) => "running domain only",
            (false, _) => "persistent definition, for the next boot",
        }
    }
}

#[cfg(not(feature = "libvirt"))]
pub fn attach(_uri: &str, _domain: &str, _devs: &[HostdevXml], _scope: Scope) -> Result<String, VmOutError> {
    Err(VmOutError::NoLibvirt)
}

#[cfg(not(feature = "libvirt"))]
pub fn detach(_uri: &str, _domain: &str, _devs: &[HostdevXml], _scope: Scope) -> Result<String, VmOutError> {
    Err(VmOutError::NoLibvirt)
}

#[cfg(feature = "libvirt")]
pub use imp::{attach, detach};

#[cfg(feature = "libvirt")]
mod imp {
    use super::super::domxml::{self, HostdevSource};
    use super::{Scope, VmOutError};
    use crate::output::libvirt::HostdevXml;
    use virt::connect::Connect;
    use virt::domain::Domain;
    use virt::error::{Error as VirtError, ErrorNumber};
    use virt::sys;

    fn api(doing: impl Into<String>, e: VirtError) -> VmOutError {
        api_hint(doing, e, "")
    }

    fn api_hint(doing: impl Into<String>, e: VirtError, hint: &str) -> VmOutError {
        VmOutError::LibvirtApi {
            doing: doing.into(),
            message: e.message().to_string(),
            hint: hint.to_string(),
        }
    }

    fn no_support(e: &VirtError) -> bool {
        matches!(
            Result::<ErrorNumber, _>::from(e.code()),
            Ok(ErrorNumber::NoSupport)
        )
    }

    fn flags(scope: Scope) -> u32 {
        let mut f = 0;
        if scope.live {
            f |= sys::VIR_DOMAIN_AFFECT_LIVE;
        }
        if scope.config {
            f |= sys::VIR_DOMAIN_AFFECT_CONFIG;
        }
        f
    }

    struct Session {
        // Field order: the domain handle is released before the connection.
        dom: Domain,
        _conn: Connect,
        name: String,
        scope: Scope,
    }

    fn open(uri: &str, name: &str, scope: Scope) -> Result<Session, VmOutError> {
        // libvirt's default error callback prints every error to stderr a second time.
        virt::error::clear_error_callback();
        let conn = Connect::open(Some(uri)).map_err(|e| api(format!("cannot connect to {uri}"), e))?;
        let dom = conn
            .lookup_domain_by_name(name)
            .map_err(|e| api(format!("no domain {name:?} on {uri}"), e))?;
        let active = dom
            .is_active()
            .map_err(|e| api("cannot read the domain state", e))?;
        let persistent = dom
            .is_persistent()
            .map_err(|e| api("cannot read whether the domain is persistent", e))?;
        Ok(Session {
            dom,
            _conn: conn,
            name: name.to_string(),
            scope: scope.resolve(active, persistent),
        })
    }

    impl Session {
        /// Hostdev sources of the definitions in scope (live and/or inactive XML).
        fn sources(&self) -> Result<Vec<(bool, Vec<HostdevSource>)>, VmOutError> {
            let mut out = Vec::new();
            if self.scope.live {
                let xml = self
                    .dom
                    .xml_desc(0)
                    .map_err(|e| api("cannot read the running domain's XML", e))?;
                out.push((true, domxml::hostdev_sources(&xml)?));
            }
            if self.scope.config {
                let xml = self
                    .dom
                    .xml_desc(sys::VIR_DOMAIN_XML_INACTIVE)
                    .map_err(|e| api("cannot read the persistent domain XML", e))?;
                out.push((false, domxml::hostdev_sources(&xml)?));
            }
            Ok(out)
        }

        /// Edit the persistent definition directly (drivers without the device APIs).
        fn redefine(&self, edit: impl FnOnce(&str) -> Result<String, VmOutError>) -> Result<(), VmOutError> {
            let xml = self
                .dom
                .xml_desc(sys::VIR_DOMAIN_XML_INACTIVE | sys::VIR_DOMAIN_XML_SECURE)
                .map_err(|e| api("cannot read the persistent domain XML", e))?;
            let new = edit(&xml)?;
            let conn = self.dom.connect().map_err(|e| api("lost the connection", e))?;
            conn.define_domain_xml(&new)
                .map_err(|e| api(format!("cannot redefine domain {:?}", self.name), e))?;
            Ok(())
        }
    }

    fn sources_of(devs: &[HostdevXml]) -> Result<Vec<HostdevSource>, VmOutError> {
        let mut v = Vec::new();
        for d in devs {
            if let Some(s) = domxml::fragment_source(&d.xml)? {
                v.push(s);
            }
        }
        Ok(v)
    }

    fn labels(devs: &[HostdevXml]) -> String {
        devs.iter()
            .map(|d| d.label.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }

    pub fn attach(uri: &str, name: &str, devs: &[HostdevXml], scope: Scope) -> Result<String, VmOutError> {
        let s = open(uri, name, scope)?;
        let wanted = sources_of(devs)?;
        for (live, have) in s.sources()? {
            if let Some(dup) = wanted.iter().find(|w| have.contains(w)) {
                return Err(VmOutError::Verify(format!(
                    "{dup} is already in the {} of domain {name:?}; detach it first (`gpupass detach --connect {uri} --domain {name} {dup}`)",
                    if live { "running domain" } else { "persistent definition" }
                )));
            }
        }
        let mut done: Vec<&HostdevXml> = Vec::new();
        let mut edited = false;
        for d in devs {
            match s.dom.attach_device_flags(&d.xml, flags(s.scope)) {
                Ok(()) => done.push(d),
                Err(e) if no_support(&e) && !s.scope.live && done.is_empty() => {
                    // No device API in this driver: edit the persistent definition instead.
                    let frags: Vec<String> = devs.iter().map(|d| d.xml.clone()).collect();
                    s.redefine(|xml| Ok(domxml::insert_hostdevs(xml, &frags)?))?;
                    edited = true;
                    break;
                }
                Err(e) => {
                    // Undo what went in, so the domain is as it was.
                    let mut undo_failed = Vec::new();
                    for u in done.iter().rev() {
                        if s.dom.detach_device_flags(&u.xml, flags(s.scope)).is_err() {
                            undo_failed.push(u.label.clone());
                        }
                    }
                    let mut doing = format!(
                        "attaching {} to domain {name:?} ({}) failed",
                        d.label,
                        s.scope.describe()
                    );
                    if !done.is_empty() {
                        doing.push_str(&format!(
                            "; detached again: {}",
                            labels(&done.iter().map(|d| (*d).clone()).collect::<Vec<_>>())
                        ));
                    }
                    if !undo_failed.is_empty() {
                        doing.push_str(&format!("; could NOT detach again: {}", undo_failed.join(", ")));
                    }
                    if no_support(&e) && s.scope.live {
                        doing.push_str("; this driver cannot hotplug: retry with --config to change the persistent definition");
                    }
                    return Err(api(doing, e));
                }
            }
        }
        for (live, have) in s.sources()? {
            let missing: Vec<String> = wanted
                .iter()
                .filter(|w| !have.contains(w))
                .map(|w| w.to_string())
                .collect();
            if !missing.is_empty() {
                return Err(VmOutError::Verify(format!(
                    "libvirt accepted the change but the {} of domain {name:?} does not list {}",
                    if live {
                        "running domain"
                    } else {
                        "persistent definition"
                    },
                    missing.join(", ")
                )));
            }
        }
        Ok(format!(
            "attached {} to domain {name} ({}{})",
            labels(devs),
            s.scope.describe(),
            if edited {
                "; by redefining it: this driver has no device-attach API"
            } else {
                ""
            }
        ))
    }

    pub fn detach(uri: &str, name: &str, devs: &[HostdevXml], scope: Scope) -> Result<String, VmOutError> {
        let s = open(uri, name, scope)?;
        let wanted = sources_of(devs)?;
        for (live, have) in s.sources()? {
            let absent: Vec<String> = wanted
                .iter()
                .filter(|w| !have.contains(w))
                .map(|w| w.to_string())
                .collect();
            if !absent.is_empty() {
                return Err(VmOutError::Verify(format!(
                    "{} not attached to the {} of domain {name:?}; nothing was changed (--only detaches just the devices you name)",
                    absent.join(", ") + if absent.len() == 1 { " is" } else { " are" },
                    if live { "running domain" } else { "persistent definition" }
                )));
            }
        }
        let mut edited = false;
        for (i, d) in devs.iter().enumerate() {
            match s.dom.detach_device_flags(&d.xml, flags(s.scope)) {
                Ok(()) => {}
                Err(e) if no_support(&e) && !s.scope.live && i == 0 => {
                    s.redefine(|xml| {
                        let (new, n) = domxml::remove_hostdevs(xml, &wanted)?;
                        if n != wanted.len() {
                            return Err(VmOutError::Verify(format!(
                                "found {n} of {} hostdevs to remove in the definition of {name:?}",
                                wanted.len()
                            )));
                        }
                        Ok(new)
                    })?;
                    edited = true;
                    break;
                }
                Err(e) => {
                    let done = labels(&devs[..i]);
                    let mut doing = format!(
                        "detaching {} from domain {name:?} ({}) failed",
                        d.label,
                        s.scope.describe()
                    );
                    if !done.is_empty() {
                        doing.push_str(&format!("; already detached: {done}"));
                    }
                    return Err(api(doing, e));
                }
            }
        }
        // A live unplug completes when the guest lets go: give it a few seconds.
        let mut pending = Vec::new();
        for attempt in 0..20 {
            pending.clear();
            for (live, have) in s.sources()? {
                for w in wanted.iter().filter(|w| have.contains(w)) {
                    pending.push((live, w.to_string()));
                }
            }
            if pending.is_empty() || pending.iter().any(|(live, _)| !live) || attempt == 19 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(250));
        }
        if let Some((_, w)) = pending.iter().find(|(live, _)| !live) {
            return Err(VmOutError::Verify(format!(
                "libvirt accepted the detach but the persistent definition of {name:?} still lists {w}"
            )));
        }
        let waiting =
            if pending.is_empty() {
                String::new()
            } else {
                format!(
                "; the guest has not released {} yet: it leaves when the guest OS acknowledges the unplug",
                pending.iter().map(|(_, w)| w.as_str()).collect::<Vec<_>>().join(", ")
            )
            };
        Ok(format!(
            "detached {} from domain {name} ({}{}){waiting}",
            labels(devs),
            s.scope.describe(),
            if edited {
                "; by redefining it: this driver has no device-detach API"
            } else {
                ""
            }
        ))
    }
}
