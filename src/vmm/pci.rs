//! The guest's PCI bus 0: a host bridge and the presented device, reached through
//! configuration mechanism #1, with the device's BARs virtualized.
//!
//! PCI facts this module encodes:
//! - Mechanism #1: a dword write to port 0xCF8 latches `enable(31) | bus(23:16) | device(15:11)
//!   | function(10:8) | register(7:2)`; ports 0xCFC-0xCFF then read/write that dword's bytes.
//! - A BAR's low bits are its type: bit 0 = I/O; for memory, bits 2:1 = 0b10 for 64-bit (the
//!   next register holds the upper half) and bit 3 = prefetchable. Address bits below the
//!   (power-of-two) size are hard-wired to zero, so writing all-ones and reading back gives
//!   `!(size - 1) | type` — the sizing protocol firmware uses.
//! - Command register bit 0 enables I/O decode, bit 1 memory decode.
//! - Status bit 4 says a capability list starts at the byte pointer in 0x34; each entry is
//!   `id, next`; MSI is id 0x05, MSI-X id 0x11.
//!
//! The BAR registers (and the ROM BAR, presented as absent) are emulated here for every
//! function: the guest may size them and move them anywhere. Everything else is read from the
//! [`ConfigBackend`] (the VFIO config region for a real device), so vendor/device IDs, the
//! class and the capability list pass through; writes go to the backend too, except those to
//! the MSI and MSI-X capabilities: their registers are virtualized here (a shadow the guest
//! reads back, with the writable bits of the specification) and [`super::irq`] turns what the
//! guest programmed into KVM routes and VFIO interrupt eventfds, as a VMM must (the kernel's
//! vfio-pci enables MSI only through `VFIO_DEVICE_SET_IRQS`, never through config writes).
//! The multifunction bit of the header type is cleared: the guest sees one function per slot.

/// Raw configuration space of one function: the VFIO config region, an emulated device, or the
/// host bridge's fixed registers.
pub(crate) trait ConfigBackend: Send {
    /// Read `data.len()` (1, 2 or 4) bytes at `offset`, which does not cross a dword.
    fn config_read(&self, offset: u16, data: &mut [u8]);
    /// Write `data.len()` (1, 2 or 4) bytes at `offset`, which does not cross a dword.
    fn config_write(&mut self, offset: u16, data: &[u8]);
}

/// What kind of window a BAR decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum BarType {
    Io,
    Mem32,
    Mem64,
}

/// A BAR as the device implements it: its type and its size (a power of two).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BarSpec {
    pub index: u8,
    pub ty: BarType,
    pub prefetchable: bool,
    pub size: u64,
}

impl BarSpec {
    /// The read-only type bits of the low register.
    pub(crate) fn type_bits(&self) -> u32 {
        match self.ty {
            BarType::Io => 0x1,
            BarType::Mem32 => u32::from(self.prefetchable) << 3,
            BarType::Mem64 => 0x4 | (u32::from(self.prefetchable) << 3),
        }
    }

    /// Decode a BAR's type from its register value (as the device reports it).
    pub(crate) fn from_register(index: u8, reg: u32, size: u64) -> BarSpec {
        let ty = if reg & 1 == 1 {
            BarType::Io
        } else if (reg >> 1) & 3 == 2 {
            BarType::Mem64
        } else {
            BarType::Mem32
        };
        BarSpec {
            index,
            ty,
            prefetchable: ty != BarType::Io && reg & 0x8 != 0,
            size,
        }
    }

    fn low_mask(&self) -> u32 {
        match self.ty {
            BarType::Io => !(self.size.max(4) - 1) as u32 & !0x3,
            _ => !(self.size.max(16) - 1) as u32 & !0xf,
        }
    }

    fn high_mask(&self) -> u32 {
        (!(self.size.wrapping_sub(1)) >> 32) as u32
    }
}

/// A decoded BAR window: where the guest put it, with decode enabled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Window {
    pub bar: u8,
    pub io: bool,
    pub base: u64,
    pub size: u64,
}

impl Window {
    pub(crate) fn contains(&self, addr: u64) -> bool {
        addr >= self.base && addr - self.base < self.size
    }
}

/// Where the MSI-X table and PBA live (capability id 0x11).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MsixInfo {
    pub table_bar: u8,
    pub table_offset: u64,
    pub table_size: u64,
    pub pba_bar: u8,
    pub pba_offset: u64,
    pub pba_size: u64,
}

/// Capability ids.
pub(crate) const CAP_MSI: u8 = 0x05;
pub(crate) const CAP_MSIX: u8 = 0x11;

fn read_raw(backend: &dyn ConfigBackend, offset: u16, len: usize) -> u32 {
    let mut b = [0u8; 4];
    backend.config_read(offset, &mut b[..len]);
    u32::from_le_bytes(b)
}

/// Where an MSI capability is and what it can do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MsiCap {
    pub offset: u16,
    /// 64-bit message address (control bit 7).
    pub is64: bool,
    /// Per-vector masking (control bit 8).
    pub maskable: bool,
}

impl MsiCap {
    fn data_offset(&self) -> u16 {
        self.offset + if self.is64 { 12 } else { 8 }
    }
    fn mask_offset(&self) -> u16 {
        self.data_offset() + 4
    }
    /// Bytes of the capability.
    pub(crate) fn size(&self) -> u16 {
        10 + if self.is64 { 4 } else { 0 } + if self.maskable { 10 } else { 0 }
    }
}

/// What the guest programmed into the MSI capability.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct MsiConfig {
    pub enabled: bool,
    pub address: u64,
    pub data: u32,
    /// Vector 0 masked (per-vector masking only).
    pub masked: bool,
}

/// The MSI-X capability's control bits as the guest set them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct MsixControl {
    pub enabled: bool,
    pub function_masked: bool,
}

/// What the capability list holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Capabilities {
    /// (id, offset) in list order.
    pub list: Vec<(u8, u16)>,
    /// Config ranges `[start, end)` of the MSI and MSI-X capabilities.
    pub blocked: Vec<(u16, u16)>,
    pub msi: Option<MsiCap>,
    /// Offset of the MSI-X capability.
    pub msix_offset: Option<u16>,
    pub msix: Option<MsixInfo>,
}

/// Follow a function's capability list (bounded: a broken list must not loop forever).
pub(crate) fn walk_capabilities(backend: &dyn ConfigBackend) -> Capabilities {
    let mut out = Capabilities::default();
    let rd = |off: u16, len: usize| read_raw(backend, off, len);
    if rd(0x06, 2) & 0x10 == 0 {
        return out;
    }
    let mut ptr = (rd(0x34, 1) & 0xfc) as u16;
    while ptr >= 0x40 && out.list.len() < 48 {
        let id = rd(ptr, 1) as u8;
        let next = (rd(ptr + 1, 1) & 0xfc) as u16;
        out.list.push((id, ptr));
        match id {
            CAP_MSI if out.msi.is_none() => {
                // Control bit 7: 64-bit address; bit 8: per-vector masking.
                let ctl = rd(ptr + 2, 2);
                let cap = MsiCap {
                    offset: ptr,
                    is64: ctl & 0x80 != 0,
                    maskable: ctl & 0x100 != 0,
                };
                out.blocked.push((ptr, (ptr + cap.size()).min(0x100)));
                out.msi = Some(cap);
            }
            CAP_MSIX if out.msix.is_none() => {
                let ctl = rd(ptr + 2, 2);
                let table = rd(ptr + 4, 4);
                let pba = rd(ptr + 8, 4);
                let entries = u64::from(ctl & 0x7ff) + 1;
                out.msix = Some(MsixInfo {
                    table_bar: (table & 7) as u8,
                    table_offset: u64::from(table & !7),
                    table_size: entries * 16,
                    pba_bar: (pba & 7) as u8,
                    pba_offset: u64::from(pba & !7),
                    pba_size: entries.div_ceil(64) * 8,
                });
                out.blocked.push((ptr, (ptr + 12).min(0x100)));
                out.msix_offset = Some(ptr);
            }
            _ => {}
        }
        ptr = next;
    }
    out
}

/// One function as the guest sees it.
pub(crate) struct VirtFunction {
    backend: Box<dyn ConfigBackend>,
    bars: [Option<BarSpec>; 6],
    /// Emulated BAR registers (address bits only; type bits are added on read).
    regs: [u32; 6],
    /// Config ranges `[start, end)` virtualized here (MSI / MSI-X capabilities): reads come
    /// from `shadow`, writes change its `writable` bits and never reach the backend.
    virtualized: Vec<(u16, u16)>,
    shadow: Box<[u8; 256]>,
    writable: Box<[u8; 256]>,
    /// A guest write changed the shadow since [`take_irq_dirty`](Self::take_irq_dirty).
    irq_dirty: bool,
    /// The capability list as walked (what the tests check the walk by).
    #[cfg_attr(not(test), allow(dead_code))]
    caps: Vec<(u8, u16)>,
    msi: Option<MsiCap>,
    msix_offset: Option<u16>,
    msix: Option<MsixInfo>,
}

impl VirtFunction {
    /// `bars` lists the BARs the device implements (the upper half of a 64-bit BAR is implied).
    pub(crate) fn new(backend: Box<dyn ConfigBackend>, bars: &[BarSpec]) -> VirtFunction {
        let mut slots = [None; 6];
        for b in bars {
            if (b.index as usize) < 6 && b.size.is_power_of_two() {
                if b.ty == BarType::Mem64 && b.index >= 5 {
                    continue;
                }
                slots[b.index as usize] = Some(*b);
            }
        }
        let caps = walk_capabilities(backend.as_ref());
        let mut shadow = Box::new([0u8; 256]);
        let mut writable = Box::new([0u8; 256]);
        for &(start, end) in &caps.blocked {
            for o in start..end {
                shadow[o as usize] = read_raw(backend.as_ref(), o, 1) as u8;
            }
        }
        let mut set = |at: u16, mask: &[u8]| {
            for (i, m) in mask.iter().enumerate() {
                if let Some(w) = writable.get_mut(at as usize + i) {
                    *w = *m;
                }
            }
        };
        if let Some(m) = caps.msi {
            // Enable only: Multiple Message Enable stays 0 (one vector).
            set(m.offset + 2, &[0x01, 0x00]);
            set(m.offset + 4, &[0xfc, 0xff, 0xff, 0xff]);
            if m.is64 {
                set(m.offset + 8, &[0xff; 4]);
            }
            set(m.data_offset(), &[0xff, 0xff]);
            if m.maskable {
                set(m.mask_offset(), &[0x01, 0, 0, 0]);
            }
        }
        if let Some(off) = caps.msix_offset {
            // Enable (bit 15) and Function Mask (bit 14).
            set(off + 3, &[0xc0]);
        }
        // Out of reset: MSI and MSI-X disabled, whatever the backend last held.
        if let Some(m) = caps.msi {
            shadow[m.offset as usize + 2] &= !0x71;
        }
        if let Some(off) = caps.msix_offset {
            shadow[off as usize + 3] &= !0xc0;
        }
        VirtFunction {
            backend,
            bars: slots,
            regs: [0; 6],
            virtualized: caps.blocked,
            shadow,
            writable,
            irq_dirty: false,
            caps: caps.list,
            msi: caps.msi,
            msix_offset: caps.msix_offset,
            msix: caps.msix,
        }
    }

    fn is_virtualized(&self, offset: u16) -> bool {
        self.virtualized.iter().any(|&(s, e)| (s..e).contains(&offset))
    }

    fn shadow_u32(&self, offset: u16) -> u32 {
        let o = offset as usize;
        let mut b = [0u8; 4];
        for (i, v) in b.iter_mut().enumerate() {
            *v = self.shadow.get(o + i).copied().unwrap_or(0);
        }
        u32::from_le_bytes(b)
    }

    /// The MSI capability, where the device has one.
    pub(crate) fn msi_cap(&self) -> Option<MsiCap> {
        self.msi
    }

    /// What the guest programmed into the MSI capability.
    pub(crate) fn msi_config(&self) -> Option<MsiConfig> {
        let m = self.msi?;
        let ctl = self.shadow_u32(m.offset + 2) & 0xffff;
        let lo = u64::from(self.shadow_u32(m.offset + 4));
        let hi = if m.is64 {
            u64::from(self.shadow_u32(m.offset + 8))
        } else {
            0
        };
        Some(MsiConfig {
            enabled: ctl & 1 != 0,
            address: (hi << 32) | lo,
            data: self.shadow_u32(m.data_offset()) & 0xffff,
            masked: m.maskable && self.shadow_u32(m.mask_offset()) & 1 != 0,
        })
    }

    /// The MSI-X control bits as the guest set them.
    pub(crate) fn msix_control(&self) -> Option<MsixControl> {
        let off = self.msix_offset?;
        let ctl = self.shadow_u32(off + 2) & 0xffff;
        Some(MsixControl {
            enabled: ctl & 0x8000 != 0,
            function_masked: ctl & 0x4000 != 0,
        })
    }

    /// Whether a guest write changed the MSI / MSI-X registers since the last call.
    pub(crate) fn take_irq_dirty(&mut self) -> bool {
        std::mem::take(&mut self.irq_dirty)
    }

    /// The interrupt pin register (0: none, 1-4: INTA-INTD), as the device reports it.
    pub(crate) fn interrupt_pin(&self) -> u8 {
        self.raw_read(0x3d, 1) as u8
    }

    fn raw_read(&self, offset: u16, len: usize) -> u32 {
        read_raw(self.backend.as_ref(), offset, len)
    }

    /// Capabilities found on the device: (id, offset), in list order.
    #[cfg(test)]
    pub(crate) fn capabilities(&self) -> &[(u8, u16)] {
        &self.caps
    }

    pub(crate) fn msix(&self) -> Option<MsixInfo> {
        self.msix
    }

    /// The spec of the 64-bit BAR whose upper half register `index` is.
    fn upper_half_of(&self, index: usize) -> Option<BarSpec> {
        if index == 0 {
            return None;
        }
        self.bars[index - 1].filter(|b| b.ty == BarType::Mem64)
    }

    fn bar_register(&self, index: usize) -> u32 {
        if let Some(spec) = self.bars[index] {
            (self.regs[index] & spec.low_mask()) | spec.type_bits()
        } else if let Some(spec) = self.upper_half_of(index) {
            self.regs[index] & spec.high_mask()
        } else {
            0
        }
    }

    fn set_bar_register(&mut self, index: usize, value: u32) {
        if let Some(spec) = self.bars[index] {
            self.regs[index] = value & spec.low_mask();
        } else if let Some(spec) = self.upper_half_of(index) {
            self.regs[index] = value & spec.high_mask();
        }
    }

    /// The dword at `offset & !3` as the guest sees it.
    fn dword(&self, aligned: u16) -> u32 {
        match aligned {
            0x10..=0x27 => self.bar_register(((aligned - 0x10) / 4) as usize),
            // Expansion ROM: not presented.
            0x30 => 0,
            // Header type (byte 2 of 0x0c): one function per slot, so no multifunction bit.
            0x0c => self.raw_read(0x0c, 4) & !0x0080_0000,
            _ => {
                let mut v = self.raw_read(aligned, 4).to_le_bytes();
                for (i, b) in v.iter_mut().enumerate() {
                    let o = aligned + i as u16;
                    if self.is_virtualized(o) {
                        *b = self.shadow[o as usize];
                    }
                }
                u32::from_le_bytes(v)
            }
        }
    }

    /// Guest read of `len` (1, 2, 4) bytes at `offset`; all-ones if it crosses a dword.
    pub(crate) fn read(&self, offset: u16, len: usize) -> u32 {
        let shift = (offset & 3) as usize;
        if !matches!(len, 1 | 2 | 4) || shift + len > 4 || offset > 0xff {
            return all_ones(len);
        }
        let v = self.dword(offset & !3) >> (8 * shift);
        v & all_ones(len)
    }

    /// Guest write. Returns true when it may change what the function decodes (a BAR or the
    /// command register), so the caller re-reads [`windows`](Self::windows).
    pub(crate) fn write(&mut self, offset: u16, len: usize, value: u32) -> bool {
        let shift = (offset & 3) as usize;
        if !matches!(len, 1 | 2 | 4) || shift + len > 4 || offset > 0xff {
            return false;
        }
        let aligned = offset & !3;
        match aligned {
            0x10..=0x27 => {
                let index = ((aligned - 0x10) / 4) as usize;
                let mask = all_ones(len) << (8 * shift);
                let old = self.regs[index];
                let new = (old & !mask) | ((value << (8 * shift)) & mask);
                self.set_bar_register(index, new);
                true
            }
            0x30 => false,
            _ => {
                let bytes = value.to_le_bytes();
                if !(offset..offset + len as u16).any(|o| self.is_virtualized(o)) {
                    self.backend.config_write(offset, &bytes[..len]);
                    return aligned == 0x04;
                }
                // Byte by byte: the capability's bytes go to the shadow, any others (a write
                // straddling its edge) to the device.
                for (i, b) in bytes[..len].iter().enumerate() {
                    let o = offset + i as u16;
                    if self.is_virtualized(o) {
                        let (cur, m) = (self.shadow[o as usize], self.writable[o as usize]);
                        self.shadow[o as usize] = (cur & !m) | (b & m);
                        self.irq_dirty = true;
                    } else {
                        self.backend.config_write(o, &[*b]);
                    }
                }
                false
            }
        }
    }

    /// The command register as the device holds it.
    pub(crate) fn command(&self) -> u16 {
        self.raw_read(0x04, 2) as u16
    }

    /// The guest address of BAR `index` (0 when unassigned or absent).
    pub(crate) fn bar_address(&self, index: u8) -> u64 {
        let i = index as usize;
        let Some(spec) = self.bars.get(i).copied().flatten() else {
            return 0;
        };
        let lo = u64::from(self.regs[i] & spec.low_mask());
        let hi = if spec.ty == BarType::Mem64 {
            u64::from(self.regs[i + 1] & spec.high_mask())
        } else {
            0
        };
        (hi << 32) | lo
    }

    /// Windows the function decodes now: BARs with a non-zero address whose decode bit is on.
    pub(crate) fn windows(&self) -> Vec<Window> {
        let cmd = self.command();
        let mut out = Vec::new();
        for spec in self.bars.iter().flatten() {
            let io = spec.ty == BarType::Io;
            let enabled = if io { cmd & 1 != 0 } else { cmd & 2 != 0 };
            let base = self.bar_address(spec.index);
            let limit = if io { 0x1_0000 } else { u64::MAX };
            let fits = matches!(base.checked_add(spec.size), Some(end) if end <= limit);
            if !enabled || base == 0 || !fits {
                continue;
            }
            out.push(Window {
                bar: spec.index,
                io,
                base,
                size: spec.size,
            });
        }
        out
    }
}

fn all_ones(len: usize) -> u32 {
    match len {
        1 => 0xff,
        2 => 0xffff,
        _ => 0xffff_ffff,
    }
}

/// A config space held in memory with a per-byte mask of writable bits: the host bridge and
/// emulated devices. Read-only bits (IDs, class, status) ignore writes, as in hardware.
pub(crate) struct StaticConfig {
    pub bytes: [u8; 256],
    pub writable: [u8; 256],
}

impl StaticConfig {
    /// A type-0 header with the given IDs and class (`0x030000`), command bits 0-2 and the
    /// interrupt line writable.
    pub(crate) fn new(vendor: u16, device: u16, class: u32, revision: u8) -> StaticConfig {
        let mut c = StaticConfig {
            bytes: [0; 256],
            writable: [0; 256],
        };
        c.put(0x00, &vendor.to_le_bytes());
        c.put(0x02, &device.to_le_bytes());
        c.bytes[0x08] = revision;
        c.put(0x09, &class.to_le_bytes()[..3]);
        c.writable[0x04] = 0x07; // I/O, memory, bus master
        c.writable[0x3c] = 0xff; // interrupt line: a scratch register for firmware
        c
    }

    pub(crate) fn put(&mut self, offset: usize, data: &[u8]) {
        self.bytes[offset..offset + data.len()].copy_from_slice(data);
    }
}

impl ConfigBackend for StaticConfig {
    fn config_read(&self, offset: u16, data: &mut [u8]) {
        let o = offset as usize;
        for (i, b) in data.iter_mut().enumerate() {
            *b = self.bytes.get(o + i).copied().unwrap_or(0xff);
        }
    }

    fn config_write(&mut self, offset: u16, data: &[u8]) {
        let o = offset as usize;
        for (i, b) in data.iter().enumerate() {
            if let (Some(cur), Some(&m)) = (self.bytes.get(o + i), self.writable.get(o + i)) {
                self.bytes[o + i] = (cur & !m) | (b & m);
            }
        }
    }
}

/// Command register bit 2, Bus Master Enable: the function may initiate memory and I/O
/// requests (DMA, and MSI/MSI-X writes). A function that never initiates requests may hard-wire
/// it to 0 (PCI Local Bus 3.0 section 6.2.2; PCIe Base, "Command Register", Bus Master Enable),
/// so a bit that stays 0 after a write of 1 is the config space's own word that the function
/// cannot do DMA.
pub(crate) const COMMAND_BUS_MASTER: u16 = 1 << 2;

/// What the Command register says about DMA ([`probe_bus_master`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub(crate) struct BusMaster {
    /// The Command register before the probe.
    pub command: u16,
    /// Bus Master Enable read back 1 (it was set, or a write of 1 stuck): the function can
    /// initiate DMA.
    pub capable: bool,
    /// The Command register read the same after the probe as before it.
    pub restored: bool,
}

/// Probe Bus Master Enable: if it reads 0, write 1, read it back, write the register back as
/// it was. Only bit 2 changes; the decode bits are written as they were read. Done by the VMM
/// before the guest runs, on a function that was just reset (so it has nothing to transfer),
/// whose IOMMU domain holds guest RAM only.
pub(crate) fn probe_bus_master(f: &mut VirtFunction) -> BusMaster {
    let command = f.read(0x04, 2) as u16;
    if command & COMMAND_BUS_MASTER != 0 {
        return BusMaster {
            command,
            capable: true,
            restored: true,
        };
    }
    f.write(0x04, 2, u32::from(command | COMMAND_BUS_MASTER));
    let probed = f.read(0x04, 2) as u16;
    f.write(0x04, 2, u32::from(command));
    BusMaster {
        command,
        capable: probed & COMMAND_BUS_MASTER != 0,
        restored: f.read(0x04, 2) as u16 == command,
    }
}

/// The host bridge at 00:00.0: Red Hat's "QEMU PCIe Host bridge" IDs (1b36:0008), class 0600.
pub(crate) fn host_bridge() -> VirtFunction {
    VirtFunction::new(Box::new(StaticConfig::new(0x1b36, 0x0008, 0x06_00_00, 0)), &[])
}

/// Ports of configuration mechanism #1.
pub(crate) const PORT_CONFIG_ADDRESS: u16 = super::protocol::PORT_PCI_ADDR;
pub(crate) const PORT_CONFIG_DATA: u16 = super::protocol::PORT_PCI_DATA;

/// Bus 0: functions by device number (function 0 only).
pub(crate) struct PciBus {
    address: u32,
    slots: Vec<(u8, VirtFunction)>,
}

impl Default for PciBus {
    fn default() -> Self {
        PciBus::new()
    }
}

impl PciBus {
    pub(crate) fn new() -> PciBus {
        PciBus {
            address: 0,
            slots: Vec::new(),
        }
    }

    /// Put a function at `00:<device>.0`.
    pub(crate) fn add(&mut self, device: u8, f: VirtFunction) {
        self.slots.retain(|(d, _)| *d != device);
        self.slots.push((device, f));
    }

    pub(crate) fn function(&self, device: u8) -> Option<&VirtFunction> {
        self.slots.iter().find(|(d, _)| *d == device).map(|(_, f)| f)
    }

    pub(crate) fn function_mut(&mut self, device: u8) -> Option<&mut VirtFunction> {
        self.slots.iter_mut().find(|(d, _)| *d == device).map(|(_, f)| f)
    }

    /// Whether `port` belongs to the configuration mechanism.
    pub(crate) fn claims(port: u16) -> bool {
        (PORT_CONFIG_ADDRESS..PORT_CONFIG_DATA + 4).contains(&port)
    }

    /// The function and register the latched address selects.
    fn target(&self, port: u16, len: usize) -> Option<(usize, u16)> {
        let a = self.address;
        let byte = (port - PORT_CONFIG_DATA) as usize;
        if a & 0x8000_0000 == 0 || byte + len > 4 {
            return None;
        }
        let bus = (a >> 16) & 0xff;
        let dev = ((a >> 11) & 0x1f) as u8;
        let func = (a >> 8) & 7;
        if bus != 0 || func != 0 {
            return None;
        }
        let idx = self.slots.iter().position(|(d, _)| *d == dev)?;
        Some((idx, (a & 0xfc) as u16 + byte as u16))
    }

    /// An ECAM (MMIO) config read at `offset` into the bus-0 window; absent functions read
    /// all-ones.
    pub(crate) fn ecam_read(&self, offset: u64, data: &mut [u8]) {
        let len = data.len();
        let (dev, func, reg) = (
            (offset >> 15) as u8 & 0x1f,
            (offset >> 12) & 7,
            (offset & 0xfff) as u16,
        );
        let v = match self.slots.iter().position(|(d, _)| *d == dev) {
            Some(i) if func == 0 && matches!(len, 1 | 2 | 4) => self.slots[i].1.read(reg, len),
            _ => all_ones(len.min(4)),
        };
        let n = len.min(4);
        data[..n].copy_from_slice(&v.to_le_bytes()[..n]);
        data[n..].fill(0xff);
    }

    /// An ECAM (MMIO) config write. Returns the device number whose decode may have changed.
    pub(crate) fn ecam_write(&mut self, offset: u64, data: &[u8]) -> Option<u8> {
        let len = data.len();
        if !matches!(len, 1 | 2 | 4) {
            return None;
        }
        let (dev, func, reg) = (
            (offset >> 15) as u8 & 0x1f,
            (offset >> 12) & 7,
            (offset & 0xfff) as u16,
        );
        if func != 0 {
            return None;
        }
        let mut b = [0u8; 4];
        b[..len].copy_from_slice(data);
        let i = self.slots.iter().position(|(d, _)| *d == dev)?;
        let (d, f) = &mut self.slots[i];
        f.write(reg, len, u32::from_le_bytes(b)).then_some(*d)
    }

    /// Guest `in` from a config port; absent functions read all-ones.
    pub(crate) fn io_read(&self, port: u16, data: &mut [u8]) {
        let len = data.len();
        let v = if port == PORT_CONFIG_ADDRESS && len == 4 {
            self.address
        } else if port >= PORT_CONFIG_DATA {
            match self.target(port, len) {
                Some((i, off)) => self.slots[i].1.read(off, len),
                None => all_ones(len),
            }
        } else {
            all_ones(len)
        };
        data.copy_from_slice(&v.to_le_bytes()[..len]);
    }

    /// Guest `out` to a config port. Returns the device number whose decode may have changed.
    pub(crate) fn io_write(&mut self, port: u16, data: &[u8]) -> Option<u8> {
        let len = data.len();
        let mut b = [0u8; 4];
        b[..len.min(4)].copy_from_slice(&data[..len.min(4)]);
        let v = u32::from_le_bytes(b);
        if port == PORT_CONFIG_ADDRESS && len == 4 {
            self.address = v & 0x80ff_fffc;
            return None;
        }
        if port < PORT_CONFIG_DATA {
            return None; // byte/word writes to 0xcf8-0xcfb are not config cycles
        }
        let (i, off) = self.target(port, len)?;
        let (dev, f) = &mut self.slots[i];
        if f.write(off, len, v) {
            Some(*dev)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests;
