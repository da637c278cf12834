#!/usr/bin/env python3
"""libvirt's QEMU driver for the lab's guests: the command line libvirt makes from a domain XML
that gpupass wrote inside L1, so that L1 can boot an L2 VM from it.

    libvirtnative.py serve DIR QEMU_DIR PARENT_PID

Runs on the host beside a lab boot (lab.sh starts it for scenarios that declare
"# lab-carry: libvirt"). DIR is shared with the guest over virtio-9p (/lab/libvirt there).
The guest writes NAME.xml (and, if it wants more than the defaults below, NAME.opts: lines
`cpu=MODEL` for the L2 CPU and `nommap=ADDR` for a vfio-pci host address to get `x-no-mmap`),
then an empty NAME.req; this answers with

    NAME.libvirt  what `virsh -c qemu:///session domxml-to-native qemu-argv NAME.xml` printed,
                  verbatim (Debian 12's libvirt 9.0 on the host, emulator = the lab's QEMU 10.0)
    NAME.argv     the same command line, one argument a line, made runnable in L1 (below)
    NAME.adjust   what was changed between the two, one line each
    NAME.code.fd, NAME.vars.fd
                  the firmware libvirt chose (its descriptor's executable and NVRAM template)
    NAME.done     written last; or NAME.err with libvirt's words

and exits when PARENT_PID (the lab runner) is gone.

The conversion runs as user nobody in a libvirt session (no daemon of the system, nothing
defined, no device of this machine touched: domxml-to-native only converts). The session's
firmware descriptors mask Debian's two secure-boot ones (an empty file of the same name is
how the firmware spec disables a descriptor), so libvirt picks 60-edk2-x86_64.json, the
build it would pick for `<firmware><feature enabled='no' name='secure-boot'/>`: L2 boots
the leg's kernel directly, which a secure-boot firmware would refuse as unsigned.

What is changed to run libvirt's line in L1, and nothing else (NAME.adjust lists each):
the environment prefix and `-S` (libvirt starts QEMU paused and resumes it over QMP);
`-no-shutdown` (so QEMU exits at L2's power-off); the master-key secret (a file of libvirt's
state directory); the monitor socket and the firmware/NVRAM paths (to L1's copies);
the serial chardev `pty` to a file; `-accel kvm` to `-accel tcg` and `-cpu host,...` to
`-cpu qemu64,phys-bits=36` (L2 runs under TCG in this lab, and 36 bits keep OVMF on its
classic aperture, the one X-PciMmio64Mb sets, as l2ovmf's boots do; `cpu=` in NAME.opts names
another model, such as 39 bits for a 128 GiB aperture); `x-no-mmap` on the vfio-pci devices
NAME.opts names (l2libvirt's 64 GiB BAR: libvirt 9.0 emits only the legacy container, whose
peer-to-peer map of a mmap'ed BAR walks it page by page, minutes per OVMF decode toggle inside
TCG; without the mmap the BAR is trapped, and where the firmware and the kernel place it is
unchanged); and the direct kernel boot added (`-kernel`, `-initrd`, `-append`, `-no-reboot`).
The machine, memory, root ports, vfio-pci devices, the 64-bit window and the OVMF aperture are
libvirt's, as printed.
"""

import json
import os
import shlex
import signal
import shutil
import subprocess
import sys
import tempfile
import time

GUEST_DIR = "/lab/libvirt"
GUEST_QEMU = "/opt/qemu/bin/qemu-system-x86_64"
MASKED = ("40-edk2-x86_64-secure-enrolled.json", "50-edk2-x86_64-secure.json")


def session_home(qemu_dir):
    """A libvirt session home for user nobody, with the lab's QEMU where nobody can run it:
    in /tmp, since nobody may not traverse the checkout (and a socket path must stay short)."""
    home = tempfile.mkdtemp(prefix="gpupass-libvirt-")
    os.chmod(home, 0o755)
    shutil.copytree(qemu_dir, os.path.join(home, "qemu"), symlinks=True,
                    ignore=shutil.ignore_patterns("packages"))
    fw = os.path.join(home, ".config", "qemu", "firmware")
    os.makedirs(fw, exist_ok=True)
    for m in MASKED:
        open(os.path.join(fw, m), "w").close()
    subprocess.run(["chmod", "-R", "a+rwX", home], check=True)
    return home


def descriptor_of(code):
    """The firmware descriptor naming CODE as its executable: its NVRAM template."""
    for d in ("/etc/qemu/firmware", "/usr/share/qemu/firmware"):
        if not os.path.isdir(d):
            continue
        for f in sorted(os.listdir(d)):
            try:
                with open(os.path.join(d, f)) as fh:
                    j = json.load(fh)
            except (OSError, ValueError):
                continue
            m = j.get("mapping", {})
            if m.get("executable", {}).get("filename") == code:
                return m.get("nvram-template", {}).get("filename")
    return None


def adjust(name, words, opts=None):
    """libvirt's words (env prefix included) to a runnable argv in L1, and the changes; opts:
    NAME.opts as a dict of lists (`cpu`, `nommap`)."""
    opts = opts or {}
    cpu = (opts.get("cpu") or ["qemu64,phys-bits=36"])[-1]
    nommap = set(opts.get("nommap", []))
    notes = []
    i = 0
    while i < len(words) and "=" in words[i] and not words[i].startswith("-"):
        i += 1
    if i:
        notes.append(f"environment prefix dropped: {' '.join(words[:i])}")
    notes.append(f"emulator {words[i]} -> {GUEST_QEMU}")
    rest = words[i + 1:]
    out = [GUEST_QEMU]
    code = vars_ = None
    j = 0
    while j < len(rest):
        w = rest[j]
        v = rest[j + 1] if j + 1 < len(rest) else None
        if w in ("-S", "-no-shutdown"):
            notes.append(f"{w} dropped")
            j += 1
            continue
        if w == "-object" and v and '"qom-type":"secret"' in v:
            notes.append(f"-object {v} dropped (a file of libvirt's session state)")
            j += 2
            continue
        if w == "-accel" and v == "kvm":
            notes.append("-accel kvm -> -accel tcg")
            out += ["-accel", "tcg"]
            j += 2
            continue
        if w == "-cpu" and v is not None:
            notes.append(f"-cpu {v} -> -cpu {cpu}")
            out += ["-cpu", cpu]
            j += 2
            continue
        if w == "-chardev" and v and v.startswith("socket,id=charmonitor,"):
            nv = f"socket,id=charmonitor,path={name}.monitor,server=on,wait=off"
            notes.append(f"-chardev {v} -> {nv}")
            out += [w, nv]
            j += 2
            continue
        if w == "-chardev" and v and v.startswith("pty,"):
            cid = v.split("id=", 1)[1].split(",")[0]
            nv = f"file,id={cid},path={name}.console"
            notes.append(f"-chardev {v} -> {nv}")
            out += [w, nv]
            j += 2
            continue
        if w == "-device" and v and v.startswith("{") and '"vfio-pci"' in v:
            dev = json.loads(v)
            if dev.get("host") in nommap:
                dev["x-no-mmap"] = True
                nv = json.dumps(dev, separators=(",", ":"))
                notes.append(f"-device {v} -> {nv}")
                nommap.discard(dev["host"])
                out += [w, nv]
                j += 2
                continue
        if w == "-blockdev" and v and '"filename"' in v:
            b = json.loads(v)
            node = b.get("node-name", "")
            if node.startswith("libvirt-pflash0"):
                code = b["filename"]
                b["filename"] = f"{GUEST_DIR}/{name}.code.fd"
            elif node.startswith("libvirt-pflash1"):
                vars_ = b["filename"]
                b["filename"] = f"{GUEST_DIR}/{name}.vars.fd"
            nv = json.dumps(b, separators=(",", ":"))
            if nv != v:
                notes.append(f"-blockdev {v} -> {nv}")
            out += [w, nv]
            j += 2
            continue
        out.append(w)
        j += 1
    if nommap:
        raise RuntimeError(f"no vfio-pci device of libvirt's line has host {sorted(nommap)}")
    boot = ["-kernel", "/lab/l2/bzImage", "-initrd", "/lab/l2/initrd.gz",
            "-append", "console=ttyS0 panic=-1 quiet", "-no-reboot"]
    notes.append("added: " + " ".join(shlex.quote(x) for x in boot))
    return out + boot, notes, code, vars_


def convert(d, home, name):
    xml = os.path.join(d, f"{name}.xml")
    src = os.path.join(home, f"{name}.xml")
    shutil.copyfile(xml, src)
    os.chmod(src, 0o644)
    env = ["env", f"HOME={home}", f"XDG_RUNTIME_DIR={home}/run",
           f"XDG_CONFIG_HOME={home}/.config", f"PATH={home}/qemu/bin:/usr/bin:/bin"]
    p = subprocess.run(["runuser", "-u", "nobody", "-g", "kvm", "--"] + env +
                       ["virsh", "-c", "qemu:///session", "domxml-to-native", "qemu-argv", src],
                       capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        raise RuntimeError(f"virsh domxml-to-native exited {p.returncode}: {p.stderr.strip()}")
    line = p.stdout.strip()
    ver = subprocess.run(["virsh", "--version"], capture_output=True, text=True).stdout.strip()
    with open(os.path.join(d, f"{name}.libvirt"), "w") as fh:
        fh.write(line + "\n")
    opts = {}
    optf = os.path.join(d, f"{name}.opts")
    if os.path.exists(optf):
        with open(optf) as fh:
            for ln in fh:
                k, sep, v = ln.strip().partition("=")
                if not sep or k not in ("cpu", "nommap"):
                    raise RuntimeError(f"{name}.opts: not cpu=MODEL or nommap=ADDR: {ln.strip()!r}")
                opts.setdefault(k, []).append(v)
    argv, notes, code, vars_ = adjust(name, shlex.split(line), opts)
    if not code:
        raise RuntimeError("libvirt's command line has no pflash0 firmware")
    shutil.copyfile(code, os.path.join(d, f"{name}.code.fd"))
    tmpl = descriptor_of(code)
    if not tmpl:
        raise RuntimeError(f"no firmware descriptor names {code} (its NVRAM template)")
    shutil.copyfile(tmpl, os.path.join(d, f"{name}.vars.fd"))
    notes.append(f"firmware {code} (NVRAM {vars_} from the template {tmpl}), copied for L1")
    notes.insert(0, f"libvirt {ver}, virsh -c qemu:///session domxml-to-native qemu-argv")
    with open(os.path.join(d, f"{name}.argv"), "w") as fh:
        fh.write("\n".join(argv) + "\n")
    with open(os.path.join(d, f"{name}.adjust"), "w") as fh:
        fh.write("\n".join(notes) + "\n")


def serve(d, qemu_dir, parent):
    """Answers requests until PARENT is gone (or SIGTERM); the session home is removed then
    (libvirt's session daemon, started on demand, leaves by its own idle timeout)."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    home = None
    try:
        while True:
            try:
                os.kill(parent, 0)
            except ProcessLookupError:
                return 0
            for f in sorted(os.listdir(d)):
                if not f.endswith(".req"):
                    continue
                name = f[:-4]
                os.unlink(os.path.join(d, f))
                try:
                    if home is None:
                        home = session_home(qemu_dir)
                    convert(d, home, name)
                    open(os.path.join(d, f"{name}.done"), "w").close()
                except Exception as e:  # every failure goes back to the guest, in words
                    with open(os.path.join(d, f"{name}.err"), "w") as fh:
                        fh.write(f"{e}\n")
            time.sleep(0.5)
    finally:
        if home:
            shutil.rmtree(home, ignore_errors=True)


def main():
    if len(sys.argv) == 5 and sys.argv[1] == "serve":
        return serve(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    if len(sys.argv) == 4 and sys.argv[1] == "once":
        # libvirtnative.py once DIR QEMU_DIR < NAME: one conversion in the foreground (by hand).
        d = sys.argv[2]
        name = sys.stdin.read().strip()
        home = session_home(sys.argv[3])
        try:
            convert(d, home, name)
        finally:
            shutil.rmtree(home, ignore_errors=True)
        return 0
    print(__doc__.split("\n\n")[1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
