//! The floor for `gpupass boot` timings: the least a KVM VMM can do — create a VM with one
//! small RAM slot and one vCPU, run a single `hlt`, exit. `examples/kvm_floor.rs` wraps it in
//! a binary so exec-to-exit can be compared with `gpupass boot --emulated`
//! (docs/performance.md, "boot").

use super::{kvm_err, memory, open_kvm, VmmError};
use crate::host::HostRoot;
use kvm_bindings::kvm_userspace_memory_region;
use kvm_ioctls::VcpuExit;
use vm_memory::{Bytes, GuestAddress};

/// Create a VM, run `hlt` at 0x1000 in real mode, return the number of exits it took.
pub fn bare_hlt(host: &HostRoot) -> Result<u32, VmmError> {
    let mem = memory::create(64 << 10)?;
    mem.write_slice(&[0xf4], GuestAddress(memory::FIRMWARE_LOAD))
        .map_err(|e| VmmError::Memory(e.to_string()))?;
    let ram = memory::regions(&mem)?;
    let kvm = open_kvm(host)?;
    let vm = kvm.create_vm().map_err(kvm_err("create VM"))?;
    let region = kvm_userspace_memory_region {
        slot: 0,
        guest_phys_addr: 0,
        memory_size: ram[0].len,
        userspace_addr: ram[0].host as u64,
        flags: 0,
    };
    // SAFETY: the region is `mem`'s mapping, which outlives `vm` (declared before it).
    unsafe { vm.set_user_memory_region(region) }.map_err(kvm_err("set guest RAM slot"))?;
    let mut vcpu = vm.create_vcpu(0).map_err(kvm_err("create vCPU"))?;
    let mut sregs = vcpu.get_sregs().map_err(kvm_err("get special registers"))?;
    sregs.cs.base = 0;
    sregs.cs.selector = 0;
    vcpu.set_sregs(&sregs).map_err(kvm_err("set special registers"))?;
    let mut regs = vcpu.get_regs().map_err(kvm_err("get registers"))?;
    regs.rip = memory::FIRMWARE_LOAD;
    regs.rflags = 2;
    vcpu.set_regs(&regs).map_err(kvm_err("set registers"))?;
    for exits in 1..=16 {
        match vcpu.run() {
            Ok(VcpuExit::Hlt) => return Ok(exits),
            Ok(_) => continue,
            Err(e) if e.errno() == libc::EINTR => continue,
            Err(source) => return Err(VmmError::Kvm { what: "run", source }),
        }
    }
    Err(VmmError::UnexpectedExit {
        exit: "no HLT after 16 exits".into(),
        regs: String::new(),
    })
}
