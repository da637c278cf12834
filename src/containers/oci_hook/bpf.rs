//! cgroup v2 device access: extending the runtime's `BPF_PROG_TYPE_CGROUP_DEVICE` programs.
//!
//! On the unified hierarchy a runtime (runc, crun, youki, systemd for its units) decides device
//! access with an eBPF program attached to the container's cgroup. The kernel runs it for every
//! open and mknod of a device node with a `bpf_cgroup_dev_ctx`
//! (`{u32 access_type = access << 16 | type; u32 major; u32 minor}`) and allows the access iff
//! every program in the cgroup's effective list returns 1.
//!
//! For each program attached to the container's cgroup itself this module builds a successor:
//!
//! ```text
//!   r2 = ctx->access_type; r3 = r2 & 0xffff; r2 >>= 16; r4 = ctx->major; r5 = ctx->minor
//!   if r3 != CHAR goto original
//!   for each requested node:  if r4 == MAJ && r5 == MIN && (r2 & ~granted) == 0: return 1
//! original:
//!   the runtime's program, instruction for instruction (`xlated_prog_insns`)
//! ```
//!
//! The prologue writes only scratch registers (r0, r2..r5) and never r1 (the context pointer)
//! or r10, which is all a program may assume at its first instruction (the verifier rejects a
//! read of any other register before it is written). The original's jumps are relative, so they
//! are unchanged by the instructions in front of them. So the successor allows exactly what the
//! original allowed plus the requested nodes. Programs that call helpers or reference maps are
//! refused (their translated form holds kernel addresses, which cannot be loaded again); the
//! device filters of runc, crun, youki and systemd use neither.
//!
//! The successor replaces the original atomically: `BPF_PROG_ATTACH` with the flags the cgroup
//! was attached with, plus `BPF_F_REPLACE` and the original's fd under `BPF_F_ALLOW_MULTI`
//! (runc, crun and systemd attach that way), or with the same flags (which swaps the single
//! program) otherwise. Taking it back is the same swap the other way round.
//!
//! Every `unsafe` block is a `bpf(2)` call on a `#[repr(C)]` attribute struct of this module.

use std::ffi::CStr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

const BPF_PROG_LOAD: libc::c_int = 5;
const BPF_PROG_ATTACH: libc::c_int = 8;
const BPF_PROG_GET_FD_BY_ID: libc::c_int = 13;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_int = 15;
const BPF_PROG_QUERY: libc::c_int = 16;

const BPF_PROG_TYPE_CGROUP_DEVICE: u32 = 15;
const BPF_CGROUP_DEVICE: u32 = 6;

pub(crate) const BPF_F_ALLOW_OVERRIDE: u32 = 1;
pub const BPF_F_ALLOW_MULTI: u32 = 2;
const BPF_F_REPLACE: u32 = 4;
const BPF_F_QUERY_EFFECTIVE: u32 = 1;

/// `bpf_cgroup_dev_ctx.access_type` low half: the device type.
pub(crate) const DEV_CHAR: i32 = 2;
#[cfg(test)]
pub(crate) const DEV_BLOCK: i32 = 1;
/// The access bits (high half of `access_type`).
pub const ACC_MKNOD: u32 = 1;
pub const ACC_READ: u32 = 2;
pub const ACC_WRITE: u32 = 4;

/// One eBPF instruction as the kernel stores it (`struct bpf_insn`, 8 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct Insn {
    pub code: u8,
    /// dst register in the low nibble, src in the high one.
    pub regs: u8,
    pub off: i16,
    pub imm: i32,
}

impl Insn {
    const fn new(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
        Insn {
            code,
            regs: (src << 4) | (dst & 0xf),
            off,
            imm,
        }
    }
    /// `dst = *(u32 *)(src + off)`
    pub const fn ldx_w(dst: u8, src: u8, off: i16) -> Insn {
        Insn::new(0x61, dst, src, off, 0)
    }
    /// `dst = src` (64 bit)
    pub(crate) const fn mov(dst: u8, src: u8) -> Insn {
        Insn::new(0xbf, dst, src, 0, 0)
    }
    /// `dst = imm` (64 bit, imm sign-extended)
    pub const fn mov_imm(dst: u8, imm: i32) -> Insn {
        Insn::new(0xb7, dst, 0, 0, imm)
    }
    /// `dst &= imm` (64 bit, imm sign-extended)
    pub const fn and_imm(dst: u8, imm: i32) -> Insn {
        Insn::new(0x57, dst, 0, 0, imm)
    }
    /// `dst >>= imm` (64 bit, logical)
    pub(crate) const fn rsh_imm(dst: u8, imm: i32) -> Insn {
        Insn::new(0x77, dst, 0, 0, imm)
    }
    /// `if dst != imm goto +off`
    pub const fn jne_imm(dst: u8, imm: i32, off: i16) -> Insn {
        Insn::new(0x55, dst, 0, off, imm)
    }
    /// `return r0`
    pub const fn exit() -> Insn {
        Insn::new(0x95, 0, 0, 0, 0)
    }
    fn src(&self) -> u8 {
        self.regs >> 4
    }
}

/// A device the successor program allows before the runtime's program is asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    pub major: u32,
    pub minor: u32,
    /// `ACC_*` bits.
    pub access: u32,
}

/// Why a step failed; `step` is what the hook was doing, for the message.
#[derive(Debug)]
pub(crate) struct BpfError {
    pub step: String,
    pub source: std::io::Error,
}

impl std::fmt::Display for BpfError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.step, self.source)
    }
}

fn fail(step: impl Into<String>, source: std::io::Error) -> BpfError {
    BpfError {
        step: step.into(),
        source,
    }
}

fn refuse(step: impl Into<String>, why: &str) -> BpfError {
    fail(
        step,
        std::io::Error::new(std::io::ErrorKind::Unsupported, why.to_string()),
    )
}

/// `bpf(cmd, attr, size)`: the fd or value it returns, or errno.
///
/// The kernel gets a zeroed 256-byte buffer that starts with `attr` (and `attr` gets the first
/// bytes back): some commands write fields past the ones this module sets (`BPF_PROG_QUERY`
/// stores `query.revision` at offset 56 on 6.6+), and the kernel accepts a larger buffer as
/// long as the bytes it does not know are zero.
fn sys_bpf<T>(cmd: libc::c_int, attr: &mut T) -> std::io::Result<libc::c_long> {
    let mut buf = [0u64; 32];
    let n = std::mem::size_of::<T>();
    assert!(n <= std::mem::size_of_val(&buf));
    // SAFETY: `attr` is a `#[repr(C)]` struct of plain integers of this module, `n` bytes long,
    // and `buf` has room for them; the two do not overlap.
    unsafe { std::ptr::copy_nonoverlapping(attr as *const T as *const u8, buf.as_mut_ptr() as *mut u8, n) };
    // SAFETY: `buf` is a live, exclusively borrowed buffer of the size passed; its head is the
    // kernel's `union bpf_attr` member for `cmd` and the rest is zero. Pointers inside it point
    // to buffers that outlive the call with the lengths given next to them.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            buf.as_mut_ptr() as *mut libc::c_void,
            std::mem::size_of_val(&buf) as libc::c_uint,
        )
    };
    // SAFETY: as above, the other way round; every bit pattern is a valid value of `T`'s
    // integer fields.
    unsafe { std::ptr::copy_nonoverlapping(buf.as_ptr() as *const u8, attr as *mut T as *mut u8, n) };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// Wrap a file descriptor the kernel just returned.
fn owned_fd(fd: libc::c_long) -> OwnedFd {
    // SAFETY: `fd` is a new descriptor returned by bpf(2), owned by nobody else yet.
    unsafe { OwnedFd::from_raw_fd(fd as i32) }
}

#[repr(C)]
#[derive(Default)]
struct QueryAttr {
    target_fd: u32,
    attach_type: u32,
    query_flags: u32,
    attach_flags: u32,
    prog_ids: u64,
    prog_cnt: u32,
    _pad: u32,
}

/// The programs of a cgroup: ids and the attach flags of the cgroup for device programs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attached {
    pub ids: Vec<u32>,
    pub flags: u32,
}

/// `BPF_PROG_QUERY` for `BPF_CGROUP_DEVICE`: the programs attached to the cgroup itself, or
/// (`effective`) every program that decides for it, ancestors' included.
pub fn query(cgroup: BorrowedFd<'_>, effective: bool) -> std::io::Result<Attached> {
    let mut cap = 64usize;
    loop {
        let mut ids = vec![0u32; cap];
        let mut a = QueryAttr {
            target_fd: cgroup.as_raw_fd() as u32,
            attach_type: BPF_CGROUP_DEVICE,
            query_flags: if effective { BPF_F_QUERY_EFFECTIVE } else { 0 },
            prog_ids: ids.as_mut_ptr() as u64,
            prog_cnt: cap as u32,
            ..Default::default()
        };
        match sys_bpf(BPF_PROG_QUERY, &mut a) {
            Ok(_) => {
                ids.truncate(a.prog_cnt as usize);
                return Ok(Attached {
                    ids,
                    flags: a.attach_flags,
                });
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) && cap < 1 << 16 => cap *= 4,
            Err(e) => return Err(e),
        }
    }
}

#[repr(C)]
#[derive(Default)]
struct GetFdAttr {
    prog_id: u32,
    next_id: u32,
    open_flags: u32,
}

/// `BPF_PROG_GET_FD_BY_ID`.
pub fn prog_fd(id: u32) -> std::io::Result<OwnedFd> {
    let mut a = GetFdAttr {
        prog_id: id,
        ..Default::default()
    };
    sys_bpf(BPF_PROG_GET_FD_BY_ID, &mut a).map(owned_fd)
}

#[repr(C)]
#[derive(Default)]
struct InfoAttr {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

/// The head of `struct bpf_prog_info` (the kernel fills at most `info_len` bytes).
#[repr(C)]
#[derive(Default)]
struct ProgInfo {
    prog_type: u32,
    id: u32,
    tag: [u8; 8],
    jited_prog_len: u32,
    xlated_prog_len: u32,
    jited_prog_insns: u64,
    xlated_prog_insns: u64,
    load_time: u64,
    created_by_uid: u32,
    nr_map_ids: u32,
    map_ids: u64,
    name: [u8; 16],
}

fn prog_info(fd: BorrowedFd<'_>, insns: Option<&mut Vec<Insn>>) -> std::io::Result<ProgInfo> {
    let mut info = ProgInfo::default();
    if let Some(buf) = insns {
        info.xlated_prog_len = (buf.len() * 8) as u32;
        info.xlated_prog_insns = buf.as_mut_ptr() as u64;
    }
    let mut a = InfoAttr {
        bpf_fd: fd.as_raw_fd() as u32,
        info_len: std::mem::size_of::<ProgInfo>() as u32,
        info: &mut info as *mut ProgInfo as u64,
    };
    sys_bpf(BPF_OBJ_GET_INFO_BY_FD, &mut a)?;
    Ok(info)
}

/// The program's type and its instructions as the kernel runs them (`xlated_prog_insns`).
pub fn prog_insns(fd: BorrowedFd<'_>) -> std::io::Result<(u32, Vec<Insn>)> {
    let head = prog_info(fd, None)?;
    let n = head.xlated_prog_len as usize / 8;
    if n == 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            "the kernel does not show the program's instructions (needs CAP_SYS_ADMIN or CAP_BPF)",
        ));
    }
    let mut buf = vec![Insn::new(0, 0, 0, 0, 0); n];
    let info = prog_info(fd, Some(&mut buf))?;
    if info.xlated_prog_len as usize != n * 8 {
        return Err(std::io::Error::other(
            "the program changed size between two reads",
        ));
    }
    Ok((info.prog_type, buf))
}

#[repr(C)]
#[derive(Default)]
struct LoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

/// `BPF_PROG_LOAD` a cgroup device program. A verifier refusal comes back with its log.
pub fn load(insns: &[Insn], name: &str) -> std::io::Result<OwnedFd> {
    const LICENSE: &CStr = c"Apache-2.0";
    let mut prog_name = [0u8; 16];
    for (d, s) in prog_name.iter_mut().zip(name.bytes().take(15)) {
        *d = s;
    }
    let mut log = vec![0u8; 1 << 16];
    let mut a = LoadAttr {
        prog_type: BPF_PROG_TYPE_CGROUP_DEVICE,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: LICENSE.as_ptr() as u64,
        prog_name,
        expected_attach_type: BPF_CGROUP_DEVICE,
        ..Default::default()
    };
    match sys_bpf(BPF_PROG_LOAD, &mut a) {
        Ok(fd) => Ok(owned_fd(fd)),
        Err(e) if e.raw_os_error() == Some(libc::EACCES) || e.raw_os_error() == Some(libc::EINVAL) => {
            // Load again with the verifier's log, for the message.
            a.log_level = 1;
            a.log_size = log.len() as u32;
            a.log_buf = log.as_mut_ptr() as u64;
            match sys_bpf(BPF_PROG_LOAD, &mut a) {
                Ok(fd) => Ok(owned_fd(fd)),
                Err(_) => {
                    let text = String::from_utf8_lossy(&log);
                    let text = text.trim_end_matches('\0').trim();
                    let tail: String = text.lines().rev().take(3).collect::<Vec<_>>().join(" / ");
                    Err(std::io::Error::new(
                        e.kind(),
                        format!("{e}; the verifier says: {tail}"),
                    ))
                }
            }
        }
        Err(e) => Err(e),
    }
}

#[repr(C)]
#[derive(Default)]
struct AttachAttr {
    target_fd: u32,
    attach_bpf_fd: u32,
    attach_type: u32,
    attach_flags: u32,
    replace_bpf_fd: u32,
}

/// `BPF_PROG_ATTACH` a device program to a cgroup with `flags`; with `replace` (and
/// `BPF_F_ALLOW_MULTI` in `flags`) it takes that program's place atomically.
pub fn attach(
    cgroup: BorrowedFd<'_>,
    prog: BorrowedFd<'_>,
    flags: u32,
    replace: Option<BorrowedFd<'_>>,
) -> std::io::Result<()> {
    let mut a = AttachAttr {
        target_fd: cgroup.as_raw_fd() as u32,
        attach_bpf_fd: prog.as_raw_fd() as u32,
        attach_type: BPF_CGROUP_DEVICE,
        attach_flags: flags,
        replace_bpf_fd: 0,
    };
    if let Some(r) = replace {
        a.attach_flags |= BPF_F_REPLACE;
        a.replace_bpf_fd = r.as_raw_fd() as u32;
    }
    sys_bpf(BPF_PROG_ATTACH, &mut a).map(|_| ())
}

/// The prologue that allows `grants` (char devices) and otherwise falls through to whatever
/// follows it.
pub fn prologue(grants: &[Grant]) -> Vec<Insn> {
    const BLOCK: i16 = 7;
    let mut p = vec![
        Insn::ldx_w(2, 1, 0), // r2 = ctx->access_type
        Insn::mov(3, 2),
        Insn::and_imm(3, 0xffff), // r3 = type
        Insn::rsh_imm(2, 16),     // r2 = access
        Insn::ldx_w(4, 1, 4),     // r4 = ctx->major
        Insn::ldx_w(5, 1, 8),     // r5 = ctx->minor
        Insn::jne_imm(3, DEV_CHAR, BLOCK * grants.len() as i16),
    ];
    for g in grants {
        let not_granted = (!g.access & 0xffff) as i32;
        p.extend([
            Insn::jne_imm(4, g.major as i32, BLOCK - 1),
            Insn::jne_imm(5, g.minor as i32, BLOCK - 2),
            Insn::mov(0, 2),
            Insn::and_imm(0, not_granted),
            Insn::jne_imm(0, 0, 2),
            Insn::mov_imm(0, 1),
            Insn::exit(),
        ]);
    }
    p
}

/// Why an existing program cannot be extended, if it cannot: helper calls (their translated
/// immediates are kernel addresses) and map or other pseudo references in 64-bit loads.
pub(crate) fn unextendable(insns: &[Insn]) -> Option<&'static str> {
    for i in insns {
        if i.code == 0x85 {
            return Some("it calls helpers or subprograms");
        }
        if i.code == 0x18 && i.src() != 0 {
            return Some("it references maps");
        }
        if i.src() > 10 || i.regs & 0xf > 10 {
            return Some("the kernel shows it with blinded constants (net.core.bpf_jit_harden=2)");
        }
    }
    None
}

/// The successor of one program: the prologue, then the original.
pub(crate) fn extend(original: &[Insn], grants: &[Grant]) -> Vec<Insn> {
    let mut p = prologue(grants);
    p.extend_from_slice(original);
    p
}

/// One program swapped: the runtime's and ours, to swap back.
struct Swapped {
    original: OwnedFd,
    ours: OwnedFd,
}

/// The programs the hook put in place on one cgroup, to take back when a later step fails.
pub(crate) struct Extended {
    cgroup: OwnedFd,
    flags: u32,
    swapped: Vec<Swapped>,
    /// Programs on ancestor cgroups also decide; the hook cannot change those.
    pub ancestors: usize,
}

impl Extended {
    /// Put every original program back (each swap is atomic; all are tried). The ids of the
    /// ones that could not be restored, with the first error.
    pub(crate) fn restore(self) -> Result<(), (Vec<u32>, std::io::Error)> {
        let mut left = Vec::new();
        let mut first = None;
        for s in self.swapped.iter().rev() {
            if let Err(e) = swap(
                self.cgroup.as_fd(),
                self.flags,
                s.original.as_fd(),
                s.ours.as_fd(),
            ) {
                left.push(prog_info(s.ours.as_fd(), None).map(|i| i.id).unwrap_or(0));
                first.get_or_insert(e);
            }
        }
        match first {
            None => Ok(()),
            Some(e) => Err((left, e)),
        }
    }
    /// How many programs were extended.
    pub(crate) fn count(&self) -> usize {
        self.swapped.len()
    }
}

/// Put `new` where `old` is attached.
fn swap(cgroup: BorrowedFd<'_>, flags: u32, new: BorrowedFd<'_>, old: BorrowedFd<'_>) -> std::io::Result<()> {
    if flags & BPF_F_ALLOW_MULTI != 0 {
        attach(cgroup, new, flags, Some(old))
    } else {
        // Without ALLOW_MULTI a cgroup holds one program per type; attaching with the same
        // flags replaces it in one step.
        attach(cgroup, new, flags, None)
    }
}

/// Extend every device program attached to `cgroup` (an open cgroup v2 directory) with
/// `grants`. On any failure every program already swapped is swapped back and the error
/// names the step. With no program attached to the cgroup nothing is done (`count() == 0`).
pub(crate) fn grant(cgroup: OwnedFd, grants: &[Grant]) -> Result<Extended, BpfError> {
    let own = query(cgroup.as_fd(), false)
        .map_err(|e| fail("BPF_PROG_QUERY (device programs of the cgroup)", e))?;
    let effective =
        query(cgroup.as_fd(), true).map_err(|e| fail("BPF_PROG_QUERY (effective device programs)", e))?;
    let mut ext = Extended {
        cgroup,
        flags: own.flags & (BPF_F_ALLOW_MULTI | BPF_F_ALLOW_OVERRIDE),
        swapped: Vec::new(),
        ancestors: effective.ids.iter().filter(|i| !own.ids.contains(i)).count(),
    };
    // Everything is read, checked and loaded before the first swap.
    let mut plan = Vec::new();
    for &id in &own.ids {
        let step = format!("device program {id}");
        let original = prog_fd(id).map_err(|e| fail(format!("{step}: BPF_PROG_GET_FD_BY_ID"), e))?;
        let (ty, insns) =
            prog_insns(original.as_fd()).map_err(|e| fail(format!("{step}: BPF_OBJ_GET_INFO_BY_FD"), e))?;
        if ty != BPF_PROG_TYPE_CGROUP_DEVICE {
            return Err(refuse(step, "not a cgroup device program"));
        }
        if let Some(why) = unextendable(&insns) {
            return Err(refuse(step, &format!("cannot be extended: {why}")));
        }
        let ours = load(&extend(&insns, grants), "gpupass_dev")
            .map_err(|e| fail(format!("{step}: BPF_PROG_LOAD of its extension"), e))?;
        plan.push(Swapped { original, ours });
    }
    for s in plan {
        if let Err(e) = swap(ext.cgroup.as_fd(), ext.flags, s.ours.as_fd(), s.original.as_fd()) {
            let id = prog_info(s.original.as_fd(), None).map(|i| i.id).unwrap_or(0);
            let mut err = fail(
                format!("device program {id}: BPF_PROG_ATTACH of its extension"),
                e,
            );
            if let Err((left, re)) = ext.restore() {
                err.step +=
                    &format!(" (and restoring the programs swapped before failed for {left:?}: {re})");
            }
            return Err(err);
        }
        ext.swapped.push(s);
    }
    Ok(ext)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny interpreter for exactly the instructions the prologue and the tests use.
    pub(crate) fn eval(p: &[Insn], ty: u32, access: u32, major: u32, minor: u32) -> u64 {
        let ctx = [access << 16 | ty, major, minor];
        let mut r = [0u64; 11];
        let mut pc = 0usize;
        loop {
            let i = p[pc];
            let (d, s) = ((i.regs & 0xf) as usize, (i.regs >> 4) as usize);
            pc += 1;
            match i.code {
                0x61 => r[d] = ctx[(i.off / 4) as usize] as u64,
                0xbf => r[d] = r[s],
                0xb7 => r[d] = i.imm as i64 as u64,
                0x57 => r[d] &= i.imm as i64 as u64,
                0x77 => r[d] >>= i.imm,
                0x55 if r[d] != i.imm as i64 as u64 => pc = (pc as isize + i.off as isize) as usize,
                0x15 if r[d] == i.imm as i64 as u64 => pc = (pc as isize + i.off as isize) as usize,
                0x55 | 0x15 => {}
                0x95 => return r[0],
                c => panic!("opcode {c:#x}"),
            }
        }
    }

    /// "Allow c 1:3 rw, deny everything else": a stand-in for a runtime's program.
    fn runtime() -> Vec<Insn> {
        vec![
            Insn::ldx_w(2, 1, 0),
            Insn::and_imm(2, 0xffff),
            Insn::ldx_w(4, 1, 4),
            Insn::ldx_w(5, 1, 8),
            Insn::jne_imm(2, DEV_CHAR, 4),
            Insn::jne_imm(4, 1, 3),
            Insn::jne_imm(5, 3, 2),
            Insn::mov_imm(0, 1),
            Insn::exit(),
            Insn::mov_imm(0, 0),
            Insn::exit(),
        ]
    }

    #[test]
    fn the_extension_allows_the_grants_and_defers_the_rest() {
        let rw = ACC_READ | ACC_WRITE;
        let rwm = rw | ACC_MKNOD;
        let grants = [
            Grant {
                major: 240,
                minor: 40,
                access: rwm,
            },
            Grant {
                major: 10,
                minor: 196,
                access: rw,
            },
        ];
        let p = extend(&runtime(), &grants);
        let c = DEV_CHAR as u32;
        let b = DEV_BLOCK as u32;
        assert_eq!(eval(&p, c, rwm, 240, 40), 1);
        assert_eq!(eval(&p, c, ACC_READ, 240, 40), 1);
        assert_eq!(eval(&p, c, rw, 10, 196), 1);
        assert_eq!(eval(&p, c, ACC_MKNOD, 10, 196), 0, "mknod was not granted");
        assert_eq!(eval(&p, c, rw, 240, 41), 0, "not requested");
        assert_eq!(
            eval(&p, b, rw, 240, 40),
            0,
            "a block device with the same numbers"
        );
        assert_eq!(eval(&p, c, rw, 1, 3), 1, "the runtime's own allow");
        assert_eq!(eval(&p, c, rw, 1, 5), 0, "the runtime's own deny");
        assert_eq!(eval(&extend(&runtime(), &[]), c, rw, 1, 3), 1);
        assert_eq!(unextendable(&runtime()), None);
        assert!(unextendable(&[Insn::new(0x85, 0, 0, 0, 1)]).is_some());
        assert!(unextendable(&[Insn::new(0x18, 1, 1, 0, 3), Insn::new(0, 0, 0, 0, 0)]).is_some());
        assert!(unextendable(&[Insn::mov_imm(11, 3)]).is_some());
    }
}
