//! A small display device emulated inside gpupass (`gpupass boot --emulated`), shaped like
//! QEMU's Bochs-compatible `std VGA` / `bochs-display` so the same firmware path runs without
//! VFIO:
//!
//! - IDs 1234:1111, class 030000 (VGA), revision 2, subsystem 1af4:1100; one
//!   vendor-specific capability (id 0x09) so the capability walk has something to find, and an
//!   MSI capability (gpupass's own: one vector, raised by gpupass on the firmware's request, so
//!   the irqchip, routing and irqfd path is exercised without VFIO).
//! - BAR0: 16 MiB prefetchable "framebuffer", plain memory mapped as a KVM slot (the
//!   equivalent of an mmappable VFIO BAR: guest reads cause no VM exit). Its first dword is
//!   [`FRAMEBUFFER_MARKER`].
//! - BAR2: 4 KiB MMIO registers, always trapped: an EDID header at 0x000 and the Bochs VBE
//!   "dispi" registers at 0x500 (16-bit each; index 0 is the ID, [`DISPI_ID`]).
//! - BAR4 (gpupass's own, not QEMU's): 2 MiB 64-bit prefetchable memory mapped as a KVM slot,
//!   so a 64-bit BAR placed above 4 GiB is exercised without VFIO; its first and last dwords
//!   are [`HIGH_FIRST`] and [`HIGH_LAST`].

use super::bars::{BarRegions, HostArea, PresentedDevice};
use super::pci::{BarSpec, BarType, StaticConfig};
use super::VmmError;
use std::sync::Arc;
use vm_memory::{Bytes, MmapRegion, VolatileMemory};

pub(crate) const VENDOR: u16 = 0x1234;
pub(crate) const DEVICE: u16 = 0x1111;
pub(crate) const DISPI_ID: u16 = 0xB0C5;
pub(crate) const FRAMEBUFFER_SIZE: u64 = 16 << 20;
pub(crate) const FRAMEBUFFER_MARKER: u32 = 0x4650_4247; // "GBPF" read as bytes "GBPF"
pub(crate) const MMIO_SIZE: u64 = 0x1000;
pub(crate) const HIGH_SIZE: u64 = 2 << 20;
pub(crate) const HIGH_FIRST: u32 = 0x3436_5047; // "GP64" as bytes
pub(crate) const HIGH_LAST: u32 = 0x444e_4524; // "$END" as bytes
const DISPI_BASE: usize = 0x500;
/// Dispi register count: ID, XRES, YRES, BPP, ENABLE, BANK, VIRT_WIDTH, VIRT_HEIGHT,
/// X_OFFSET, Y_OFFSET, VIDEO_MEMORY_64K.
const DISPI_REGS: usize = 11;

/// Config space of the emulated device.
pub(crate) fn config() -> StaticConfig {
    let mut c = StaticConfig::new(VENDOR, DEVICE, 0x03_00_00, 2);
    c.put(0x2c, &0x1af4u16.to_le_bytes());
    c.put(0x2e, &0x1100u16.to_le_bytes());
    c.bytes[0x06] = 0x10; // status: capability list
    c.bytes[0x34] = 0x40;
    c.put(0x40, &[0x09, 0x50, 0x08, b'g', b'p', b'u', b'p', b's']);
    // MSI, 32-bit address, one vector, no masking: gpupass raises it itself
    // (irq::EmulatedIrqs), so the interrupt path runs without VFIO.
    c.put(0x50, &[0x05, 0x00, 0x00, 0x00]);
    c
}

pub(crate) fn bar_specs() -> Vec<BarSpec> {
    vec![
        BarSpec {
            index: 0,
            ty: BarType::Mem32,
            prefetchable: true,
            size: FRAMEBUFFER_SIZE,
        },
        BarSpec {
            index: 2,
            ty: BarType::Mem32,
            prefetchable: false,
            size: MMIO_SIZE,
        },
        BarSpec {
            index: 4,
            ty: BarType::Mem64,
            prefetchable: true,
            size: HIGH_SIZE,
        },
    ]
}

/// Trapped accesses: BAR2 registers, and BAR0/BAR4 when they are not (yet) slots.
pub(crate) struct Registers {
    framebuffer: Arc<MmapRegion>,
    high: Arc<MmapRegion>,
    mmio: [u8; MMIO_SIZE as usize],
}

/// Copy `data.len()` bytes at `offset` of `m` out (all-ones when out of range).
fn read_mem(m: &MmapRegion, offset: u64, data: &mut [u8]) {
    let ok = offset
        .checked_add(data.len() as u64)
        .is_some_and(|end| end <= m.len() as u64)
        && m.get_slice(offset as usize, data.len())
            .map(|s| s.copy_to(data))
            .is_ok();
    if !ok {
        data.fill(0xff);
    }
}

impl Registers {
    pub(crate) fn new(framebuffer: Arc<MmapRegion>, high: Arc<MmapRegion>) -> Registers {
        let mut mmio = [0u8; MMIO_SIZE as usize];
        mmio[..8].copy_from_slice(&[0x00, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x00]);
        mmio[DISPI_BASE..DISPI_BASE + 2].copy_from_slice(&DISPI_ID.to_le_bytes());
        let vram_64k = (FRAMEBUFFER_SIZE >> 16) as u16;
        mmio[DISPI_BASE + 20..DISPI_BASE + 22].copy_from_slice(&vram_64k.to_le_bytes());
        Registers {
            framebuffer,
            high,
            mmio,
        }
    }

    fn writable(offset: usize) -> bool {
        // Dispi registers 1..=9; the ID (0) and the memory size (10) are read-only.
        (DISPI_BASE + 2..DISPI_BASE + 2 * (DISPI_REGS - 1)).contains(&offset)
    }
}

impl BarRegions for Registers {
    fn read(&mut self, bar: u8, offset: u64, data: &mut [u8]) {
        match bar {
            0 => read_mem(&self.framebuffer, offset, data),
            4 => read_mem(&self.high, offset, data),
            2 => {
                for (i, b) in data.iter_mut().enumerate() {
                    *b = self.mmio.get(offset as usize + i).copied().unwrap_or(0xff);
                }
            }
            _ => data.fill(0xff),
        }
    }

    fn write(&mut self, bar: u8, offset: u64, data: &[u8]) {
        match bar {
            0 | 4 => {
                // get_slice checks the range against the mapping.
                let m = if bar == 0 { &self.framebuffer } else { &self.high };
                if let Ok(s) = m.get_slice(offset as usize, data.len()) {
                    s.copy_from(data);
                }
            }
            2 => {
                for (i, b) in data.iter().enumerate() {
                    let o = offset as usize + i;
                    if Self::writable(o) {
                        self.mmio[o] = *b;
                    }
                }
            }
            _ => {}
        }
    }
}

/// The emulated device, ready to present.
pub(crate) fn device() -> Result<PresentedDevice, VmmError> {
    let fb = MmapRegion::new(FRAMEBUFFER_SIZE as usize).map_err(|e| VmmError::GuestMemory {
        what: "cannot allocate the emulated framebuffer".into(),
        source: e.into(),
    })?;
    fb.get_slice(0, 4)
        .and_then(|s| s.write_obj(FRAMEBUFFER_MARKER, 0))
        .map_err(|e| VmmError::GuestMemory {
            what: "cannot initialise the emulated framebuffer".into(),
            source: e.into(),
        })?;
    let high = MmapRegion::new(HIGH_SIZE as usize).map_err(|e| VmmError::GuestMemory {
        what: "cannot allocate the emulated 64-bit BAR".into(),
        source: e.into(),
    })?;
    high.get_slice(0, 4)
        .and_then(|s| s.write_obj(HIGH_FIRST, 0))
        .and_then(|_| high.get_slice(HIGH_SIZE as usize - 4, 4))
        .and_then(|s| s.write_obj(HIGH_LAST, 0))
        .map_err(|e| VmmError::GuestMemory {
            what: "cannot initialise the emulated 64-bit BAR".into(),
            source: e.into(),
        })?;
    let (fb, high) = (Arc::new(fb), Arc::new(high));
    let areas = vec![
        HostArea {
            bar: 0,
            offset: 0,
            size: FRAMEBUFFER_SIZE,
            host_addr: fb.as_ptr() as u64,
        },
        HostArea {
            bar: 4,
            offset: 0,
            size: HIGH_SIZE,
            host_addr: high.as_ptr() as u64,
        },
    ];
    Ok(PresentedDevice {
        name: format!("emulated {VENDOR:04x}:{DEVICE:04x}"),
        config: Box::new(config()),
        bars: bar_specs(),
        areas,
        regions: Box::new(Registers::new(fb.clone(), high.clone())),
        trapped_why: vec![(2, "emulated registers (always trapped)".to_string())],
        keep: Box::new((fb, high)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dispi_id_is_read_only_and_other_registers_stick() {
        let d = device().unwrap();
        let mut r = d.regions;
        r.write(0, 0x10, &[1, 2, 3, 4]);
        let mut fb = [0u8; 4];
        r.read(0, 0x10, &mut fb);
        assert_eq!(fb, [1, 2, 3, 4]);
        r.read(0, FRAMEBUFFER_SIZE - 2, &mut fb);
        assert_eq!(fb, [0xff; 4], "a read past the framebuffer is all-ones");
        let mut b = [0u8; 2];
        r.read(2, 0x500, &mut b);
        assert_eq!(u16::from_le_bytes(b), DISPI_ID);
        r.write(2, 0x500, &[0, 0]);
        r.read(2, 0x500, &mut b);
        assert_eq!(u16::from_le_bytes(b), DISPI_ID);
        r.write(2, 0x502, &1024u16.to_le_bytes());
        r.read(2, 0x502, &mut b);
        assert_eq!(u16::from_le_bytes(b), 1024);
        let mut d4 = [0u8; 4];
        r.read(2, 0, &mut d4);
        assert_eq!(u32::from_le_bytes(d4), 0xffff_ff00, "EDID header");
        r.read(0, 0, &mut d4);
        assert_eq!(u32::from_le_bytes(d4), FRAMEBUFFER_MARKER);
        r.read(4, 0, &mut d4);
        assert_eq!(u32::from_le_bytes(d4), HIGH_FIRST);
        r.read(4, HIGH_SIZE - 4, &mut d4);
        assert_eq!(u32::from_le_bytes(d4), HIGH_LAST);
        r.read(2, 0xffe, &mut d4);
        assert_eq!(d4[2..], [0xff, 0xff], "past the BAR reads all-ones");
    }
}
