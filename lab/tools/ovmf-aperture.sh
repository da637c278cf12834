#!/usr/bin/env bash
# Where OVMF puts a 16 GiB 64-bit BAR, by guest CPU width and X-PciMmio64Mb (the facts in
# docs/vm-outputs.md, "What OVMF does with it"). No VFIO and no lab boot: QEMU (TCG) on this
# machine, q35, Debian 12's OVMF (/usr/share/qemu/OVMF.fd, package ovmf), an ivshmem-plain with
# a sparse 16 GiB memory file behind a pcie-root-port (the lab's big-BAR device); after WAIT
# seconds (OVMF's PCI enumeration is over by then) QMP query-pci gives each BAR's address
# (-1: unassigned) and qom-get the 64-bit window QEMU derived.
#
#   lab/tools/ovmf-aperture.sh [QEMU]   (default: the lab's QEMU 10.0 from lab/tools/qemu.sh)
#   WAIT=40 (seconds per case); OVMF=/usr/share/qemu/OVMF.fd
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${GPUPASS_LAB_CACHE:-$HOME/.cache/gpupass-lab}
qemu=${1:-$(bash "$here/qemu.sh" prepare "$cache")}
ovmf=${OVMF:-/usr/share/qemu/OVMF.fd}
wait_s=${WAIT:-40}
[[ -f $ovmf ]] || { echo "ovmf-aperture: $ovmf missing (apt-get install ovmf)" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
truncate -s 16G "$work/big.img"

run() {
  local name=$1
  shift
  local out="$work/$name.out"
  {
    sleep "$wait_s"
    echo '{"execute":"qmp_capabilities"}'
    echo '{"execute":"query-pci"}'
    for p in pci-hole64-start pci-hole64-end; do
      echo '{"execute":"qom-get","arguments":{"path":"/machine/q35","property":"'$p'"}}'
    done
    echo '{"execute":"quit"}'
  } | timeout $((wait_s + 60)) "$qemu" -M q35 -accel tcg -m 512 -nodefaults -display none \
    -bios "$ovmf" -qmp stdio \
    -object "memory-backend-file,id=big,mem-path=$work/big.img,size=16G,share=on" \
    -device pcie-root-port,id=rp1,bus=pcie.0,chassis=1,addr=0x10 \
    -device ivshmem-plain,memdev=big,bus=rp1 "$@" > "$out" 2>&1 || true
  python3 - "$name" "$out" "$*" <<'PY'
import json, sys
name, path, args = sys.argv[1:4]
bars, qom = [], []
for line in open(path):
    try:
        j = json.loads(line)
    except ValueError:
        if "qemu-system" in line:
            print(f"{name}: {line.strip()}")
        continue
    r = j.get("return")
    if isinstance(r, int):
        qom.append(hex(r))
    elif isinstance(r, list):
        def walk(devs):
            for d in devs:
                if d["id"]["vendor"] == 0x1af4:
                    for b in d.get("regions", []):
                        a = b["address"]
                        bars.append(f"BAR{b['bar']} {'unassigned' if a == -1 else hex(a)} size {hex(b['size'])}")
                br = d.get("pci_bridge")
                if br and "devices" in br:
                    walk(br["devices"])
        for bus in r:
            walk(bus["devices"])
print(f"{name} [{args}]: {'; '.join(bars) or 'no reply'}; window {' - '.join(qom)}")
PY
}

run default
run small-40 -fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=8192
run bits-38 -cpu qemu64,phys-bits=38
run bits-36 -cpu qemu64,phys-bits=36
run bits-36-32g -cpu qemu64,phys-bits=36 -fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=32768
run bits-36-small -cpu qemu64,phys-bits=36 -fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=8192
