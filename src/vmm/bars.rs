//! BAR windows in guest physical space: which parts become KVM memory slots (no VM exit on
//! access) and which are trapped (MMIO/PIO exits forwarded to the device).
//!
//! A device hands over its BARs as [`HostArea`]s (page-aligned pieces of a BAR already mapped
//! into gpupass: a VFIO region mmap, or an emulated device's RAM) plus a [`BarRegions`] that
//! reads and writes any BAR offset (VFIO region pread/pwrite). Whenever the guest moves a BAR
//! or toggles decode, [`BarMapper::update`] moves the slots: a slot is removed from its old
//! GPA and created at the new one. Everything else in a decoded window (non-mmappable
//! regions, the MSI-X table and PBA pages, sub-page BARs) is found by [`BarMapper::find`] on
//! an exit.

use super::pci::{BarSpec, ConfigBackend, MsixInfo, Window};
use super::VmmError;

/// A piece of BAR `bar` at `offset`, `size` bytes, mapped at `host_addr` in this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HostArea {
    pub bar: u8,
    pub offset: u64,
    pub size: u64,
    pub host_addr: u64,
}

/// Trapped BAR access.
pub(crate) trait BarRegions: Send {
    fn read(&mut self, bar: u8, offset: u64, data: &mut [u8]);
    fn write(&mut self, bar: u8, offset: u64, data: &[u8]);
}

/// Everything the VMM needs to present one device: raw config space, BARs, mapped areas, and
/// trapped access. The owner of the host mappings lives in `keep` (dropped after the VM).
pub(crate) struct PresentedDevice {
    /// Shown in messages and the report (`0000:00:03.0`, `mdev <uuid>`, `emulated 1234:1111`).
    pub name: String,
    pub config: Box<dyn ConfigBackend>,
    pub bars: Vec<BarSpec>,
    pub areas: Vec<HostArea>,
    pub regions: Box<dyn BarRegions>,
    /// Why a BAR (index) is trapped rather than mapped, for the report.
    pub trapped_why: Vec<(u8, String)>,
    pub keep: Box<dyn std::any::Any + Send>,
}

/// Adds and removes KVM memory slots (`KVM_SET_USER_MEMORY_REGION`; size 0 removes).
pub(crate) trait SlotOps {
    fn set_slot(&mut self, slot: u32, gpa: u64, size: u64, host_addr: u64) -> Result<(), kvm_ioctls::Error>;
}

/// Where an area sits now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub(crate) struct SlotState {
    pub bar: u8,
    pub offset: u64,
    pub size: u64,
    pub slot: u32,
    /// Guest address of the slot, `None` while the BAR is not decoded.
    pub gpa: Option<u64>,
}

/// What an exit address falls on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hit {
    Bar { bar: u8, offset: u64 },
    Msix { bar: u8, offset: u64 },
}

pub(crate) struct BarMapper {
    slots: Vec<(HostArea, SlotState)>,
    windows: Vec<Window>,
    ram_end: u64,
    msix: Option<MsixInfo>,
    /// Slot moves done (map + unmap pairs count once).
    pub moves: u64,
    /// Windows refused because they overlapped RAM or another window.
    pub refused: Vec<Window>,
}

const PAGE: u64 = 4096;

impl BarMapper {
    /// Slots are numbered from `first_slot` (slot 0 is RAM).
    pub(crate) fn new(
        areas: &[HostArea],
        first_slot: u32,
        ram_end: u64,
        msix: Option<MsixInfo>,
    ) -> BarMapper {
        let slots = areas
            .iter()
            .filter(|a| a.size > 0 && a.size % PAGE == 0 && a.offset % PAGE == 0)
            .enumerate()
            .map(|(i, a)| {
                (
                    *a,
                    SlotState {
                        bar: a.bar,
                        offset: a.offset,
                        size: a.size,
                        slot: first_slot + i as u32,
                        gpa: None,
                    },
                )
            })
            .collect();
        BarMapper {
            slots,
            windows: Vec::new(),
            ram_end,
            msix,
            moves: 0,
            refused: Vec::new(),
        }
    }

    /// Take the function's decoded windows; move slots to match.
    pub(crate) fn update(&mut self, windows: Vec<Window>, ops: &mut dyn SlotOps) -> Result<(), VmmError> {
        let mut accepted: Vec<Window> = Vec::new();
        self.refused.clear();
        for w in windows {
            let overlaps_ram = !w.io && w.base < self.ram_end;
            let overlaps_other = accepted
                .iter()
                .any(|o| o.io == w.io && w.base < o.base + o.size && o.base < w.base + w.size);
            if overlaps_ram || overlaps_other {
                self.refused.push(w);
            } else {
                accepted.push(w);
            }
        }
        self.windows = accepted;
        // Unmap first, then map: a BAR may move onto another's old place.
        let desired: Vec<Option<u64>> = self
            .slots
            .iter()
            .map(|(a, _)| {
                self.windows
                    .iter()
                    .find(|w| !w.io && w.bar == a.bar)
                    .map(|w| w.base + a.offset)
                    .filter(|gpa| gpa % PAGE == 0)
            })
            .collect();
        for ((area, st), want) in self.slots.iter_mut().zip(&desired) {
            if st.gpa.is_some() && st.gpa != *want {
                ops.set_slot(st.slot, st.gpa.unwrap_or(0), 0, area.host_addr)
                    .map_err(|e| VmmError::Slot {
                        bar: area.bar,
                        gpa: st.gpa.unwrap_or(0),
                        source: e,
                    })?;
                st.gpa = None;
            }
        }
        for ((area, st), want) in self.slots.iter_mut().zip(&desired) {
            if let (None, Some(gpa)) = (st.gpa, *want) {
                ops.set_slot(st.slot, gpa, area.size, area.host_addr)
                    .map_err(|e| VmmError::Slot {
                        bar: area.bar,
                        gpa,
                        source: e,
                    })?;
                st.gpa = Some(gpa);
                self.moves += 1;
            }
        }
        Ok(())
    }

    /// Remove every slot (teardown).
    pub(crate) fn unmap_all(&mut self, ops: &mut dyn SlotOps) {
        for (area, st) in &mut self.slots {
            if let Some(gpa) = st.gpa.take() {
                let _ = ops.set_slot(st.slot, gpa, 0, area.host_addr);
            }
        }
    }

    pub(crate) fn slots(&self) -> Vec<SlotState> {
        self.slots.iter().map(|(_, s)| *s).collect()
    }

    #[cfg(test)]
    pub(crate) fn windows(&self) -> &[Window] {
        &self.windows
    }

    /// The BAR offset a trapped MMIO (`io` false) or port (`io` true) access hits.
    pub(crate) fn find(&self, addr: u64, io: bool) -> Option<Hit> {
        let w = self.windows.iter().find(|w| w.io == io && w.contains(addr))?;
        let offset = addr - w.base;
        if let Some(m) = self.msix {
            let in_table =
                m.table_bar == w.bar && (m.table_offset..m.table_offset + m.table_size).contains(&offset);
            let in_pba = m.pba_bar == w.bar && (m.pba_offset..m.pba_offset + m.pba_size).contains(&offset);
            if in_table || in_pba {
                return Some(Hit::Msix { bar: w.bar, offset });
            }
        }
        Some(Hit::Bar { bar: w.bar, offset })
    }
}

/// Split `[0, size)` of a BAR into page-aligned mappable pieces, leaving out the pages that
/// hold the MSI-X table or PBA (those stay trapped, as cloud-hypervisor's `fixup_msix_region`
/// does).
#[cfg(test)]
pub(crate) fn carve(size: u64, holes: &[(u64, u64)]) -> Vec<(u64, u64)> {
    carve_pieces(vec![(0u64, size)], holes)
}

/// [`carve`] for a BAR already split into `(offset, len)` pieces (a sparse-mmap list).
pub(crate) fn carve_pieces(mut pieces: Vec<(u64, u64)>, holes: &[(u64, u64)]) -> Vec<(u64, u64)> {
    for &(off, len) in holes {
        if len == 0 {
            continue;
        }
        let start = off & !(PAGE - 1);
        let end = (off + len).div_ceil(PAGE) * PAGE;
        let mut next = Vec::new();
        for (s, l) in pieces {
            let e = s + l;
            if end <= s || start >= e {
                next.push((s, l));
                continue;
            }
            if start > s {
                next.push((s, start - s));
            }
            if end < e {
                next.push((end, e - end));
            }
        }
        pieces = next;
    }
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Rec(Vec<(u32, u64, u64)>);
    impl SlotOps for Rec {
        fn set_slot(&mut self, slot: u32, gpa: u64, size: u64, _host: u64) -> Result<(), kvm_ioctls::Error> {
            self.0.push((slot, gpa, size));
            Ok(())
        }
    }

    fn w(bar: u8, base: u64, size: u64) -> Window {
        Window {
            bar,
            io: false,
            base,
            size,
        }
    }

    #[test]
    fn moving_a_bar_moves_its_slot() {
        let areas = [HostArea {
            bar: 0,
            offset: 0,
            size: 0x10_0000,
            host_addr: 0x7000_0000,
        }];
        let mut m = BarMapper::new(&areas, 1, 64 << 20, None);
        let mut ops = Rec::default();
        m.update(vec![w(0, 0xc000_0000, 0x10_0000)], &mut ops).unwrap();
        assert_eq!(ops.0, vec![(1, 0xc000_0000, 0x10_0000)]);
        m.update(vec![w(0, 0xc000_0000, 0x10_0000)], &mut ops).unwrap();
        assert_eq!(ops.0.len(), 1, "no change, no ioctl");
        m.update(vec![w(0, 0xd000_0000, 0x10_0000)], &mut ops).unwrap();
        assert_eq!(ops.0[1..], [(1, 0xc000_0000, 0), (1, 0xd000_0000, 0x10_0000)]);
        m.update(vec![], &mut ops).unwrap();
        assert_eq!(ops.0[3], (1, 0xd000_0000, 0));
        assert_eq!(m.slots()[0].gpa, None);
        assert_eq!(m.moves, 2);
    }

    #[test]
    fn windows_over_ram_or_each_other_are_refused() {
        let mut m = BarMapper::new(&[], 1, 64 << 20, None);
        let mut ops = Rec::default();
        m.update(
            vec![
                w(0, 0x100_0000, 0x1000),
                w(2, 0xc000_0000, 0x1000),
                w(4, 0xc000_0000, 0x1000),
            ],
            &mut ops,
        )
        .unwrap();
        assert_eq!(m.windows(), &[w(2, 0xc000_0000, 0x1000)]);
        assert_eq!(m.refused.len(), 2);
        assert_eq!(
            m.find(0xc000_0500, false),
            Some(Hit::Bar {
                bar: 2,
                offset: 0x500
            })
        );
        assert_eq!(m.find(0xc000_1000, false), None);
        assert_eq!(m.find(0xc000_0500, true), None, "port space is separate");
    }

    #[test]
    fn msix_pages_are_carved_out_and_trapped() {
        assert_eq!(carve(0x4000, &[(0x2000, 64), (0x3000, 8)]), vec![(0, 0x2000)]);
        assert_eq!(
            carve(0x10000, &[(0x8010, 0x20)]),
            vec![(0, 0x8000), (0x9000, 0x7000)]
        );
        assert_eq!(carve(0x1000, &[]), vec![(0, 0x1000)]);
        assert_eq!(
            carve_pieces(vec![(0x1000, 0x3000)], &[(0x800, 0x1000)]),
            vec![(0x2000, 0x2000)]
        );
        let msix = MsixInfo {
            table_bar: 2,
            table_offset: 0x2000,
            table_size: 64,
            pba_bar: 2,
            pba_offset: 0x3000,
            pba_size: 8,
        };
        let m = {
            let mut m = BarMapper::new(&[], 1, 0, Some(msix));
            m.update(vec![w(2, 0xc000_0000, 0x4000)], &mut Rec::default())
                .unwrap();
            m
        };
        assert_eq!(
            m.find(0xc000_2010, false),
            Some(Hit::Msix {
                bar: 2,
                offset: 0x2010
            })
        );
        assert_eq!(
            m.find(0xc000_3000, false),
            Some(Hit::Msix {
                bar: 2,
                offset: 0x3000
            })
        );
        assert_eq!(
            m.find(0xc000_1000, false),
            Some(Hit::Bar {
                bar: 2,
                offset: 0x1000
            })
        );
    }

    #[test]
    fn sub_page_areas_are_never_slots() {
        let areas = [HostArea {
            bar: 1,
            offset: 0,
            size: 0x100,
            host_addr: 0x1000,
        }];
        let mut m = BarMapper::new(&areas, 1, 0, None);
        let mut ops = Rec::default();
        m.update(vec![w(1, 0xc000_0000, 0x100)], &mut ops).unwrap();
        assert!(ops.0.is_empty());
        assert_eq!(m.find(0xc000_0004, false), Some(Hit::Bar { bar: 1, offset: 4 }));
    }
}
