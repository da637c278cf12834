# lab-about: runc (Debian's) runs a container with `gpupass oci-hook` as createRuntime hook on the real kernel: the requested VFIO nodes open (never EPERM), unrequested and runtime-denied nodes stay EPERM, a hook failure stops the container, the host's cgroups are as before; 6.12: the cgroup v2 BPF device filter, 6.1: cgroup v1 devices.allow
# lab-needs: gpupass
# lab-files: /usr/sbin/runc
# lab-timeout: 240
# lab-steps: bind runc-version control-run control-denied hook-run hook-nodes
# lab-steps: hook-not-requested hook-runtime-denied hook-runtime-allowed hook-stderr
# lab-steps: failing-hook-stops-container cgroups-unchanged host-still-opens unbind
# lab-steps-6.12: hook-group-or-cdev cgroup-v2-filter
# lab-steps-6.1: hook-group hook-container cgroup-v1-devices
#
# 6.12 boots the unified hierarchy only, so device access in the container is the BPF program
# runc attaches to the container's cgroup, and the hook must extend it (src/containers/oci_hook/bpf.rs).
# 6.1 boots cgroup v1: the same container gets the nodes through devices.allow. The steps
# are the same on both legs, except: which VFIO nodes the hook gives is the backend policy's
# choice where both exist (6.12: the group node or the cdev, hook-group-or-cdev; 6.1 has only
# the legacy group and container: hook-group, hook-container), and what decided
# (cgroup-v2-filter / cgroup-v1-devices).
D=0000:00:07.0
W=/tmp/cgv2
rm -rf $W; mkdir -p $W
lab_check bind gpupass bind $D
g=$(lab_group $D)
cdev=$(ls /sys/bus/pci/devices/$D/vfio-dev 2>/dev/null)
lab_run runc-version runc-version.txt runc --version

# A busybox rootfs; runc's state in /tmp (the guest's root is an initramfs: --no-pivot).
rootfs() {
  mkdir -p "$1/rootfs/bin" "$1/rootfs/proc" "$1/rootfs/dev" "$1/rootfs/tmp"
  cp /bin/busybox "$1/rootfs/bin/busybox"
  for t in sh cat echo head ls stat; do ln -sf busybox "$1/rootfs/bin/$t"; done
}

# probe LABEL PATH...: one line per path, "LABEL: OK" or "LABEL: <the shell's error>"
# (opened read-write; a path that is no character device is reported as such, never created).
cat > $W/probe.sh <<'EOF'
label=$1; shift
for p in "$@"; do
  if [ ! -c "$p" ]; then echo "$label: $p: no character device there"
  elif r=$( (exec 3<>"$p") 2>&1); then echo "$label: OK $p"; else echo "$label: $p: $r"; fi
  label=$label+
done
EOF

# config NAME ANNOTATION DEVICES-JSON SCRIPT: an OCI config as runc spec makes it, smaller:
# deny all devices (runc appends its default allow list: null, zero, full, tty, ...), and an
# explicit deny for c 42:2, which linux.devices creates as /dev/denied together with
# /dev/unasked (c 42:1, no rule: denied by the deny-all). Major 42 is "demo/sample use" in the
# kernel's devices.txt: no driver, so an allowed open gives ENXIO and only the cgroup gives
# EPERM (a real /dev/mem or /dev/kmsg would give EPERM for want of capabilities).
config() {
  b=$W/$1; rootfs $b; cp $W/probe.sh $b/rootfs/probe.sh
  printf '%s\n' "$4" > $b/rootfs/run.sh
  ann=''
  [ -n "$2" ] && ann="\"annotations\": {\"gpupass.dev/devices\": \"$2\"},"
  cat > $b/config.json <<EOF
{
  "ociVersion": "1.0.2",
  "process": {"terminal": false, "user": {"uid": 0, "gid": 0}, "args": ["/bin/sh", "/run.sh"],
              "env": ["PATH=/bin"], "cwd": "/", "noNewPrivileges": true},
  "root": {"path": "rootfs", "readonly": false},
  "hostname": "lab",
  $ann
  "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"},
             {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "mode=755", "size=1024k"]}],
  "hooks": {"createRuntime": [{"path": "/bin/gpupass", "args": ["gpupass", "oci-hook"], "timeout": 20}]},
  "linux": {
    "cgroupsPath": "/gpupass-lab-$1",
    "resources": {"devices": [{"allow": false, "access": "rwm"},
                              {"allow": false, "type": "c", "major": 42, "minor": 2, "access": "rwm"}]},
    "devices": [{"path": "/dev/unasked", "type": "c", "major": 42, "minor": 1, "fileMode": 438},
                {"path": "/dev/denied", "type": "c", "major": 42, "minor": 2, "fileMode": 438} $3],
    "namespaces": [{"type": "pid"}, {"type": "mount"}, {"type": "ipc"}, {"type": "uts"}]
  }
}
EOF
}
runc_run() { runc --root $W/state run --no-pivot -b $W/$1 "lab-$1" </dev/null; }
# Only the "error" part of a probe line: "OK" or the errno text.
probe() { grep "^$1: " "$2" | head -1 | sed 's/^[^:]*: //'; }
not_eperm() {
  v=$(probe "$2" "$3")
  case "$v" in
    '') lab_fail "$1" "no '$2' line in $3: $(tr '\n' '|' < "$3")";;
    *"not permitted"*) lab_fail "$1" "$v";;
    *) lab_pass "$1" "$v";;
  esac
}
eperm() {
  v=$(probe "$2" "$3")
  case "$v" in
    *"not permitted"*) lab_pass "$1" "$v";;
    *) lab_fail "$1" "want EPERM, got '$v'";;
  esac
}
snapshot() {
  { find /sys/fs/cgroup -type d | sort
    if [ "$LAB_CGROUP" = v1 ]; then cat /sys/fs/cgroup/devices/devices.list; fi
  } > "$1"
}

# 1. Control: the group's node put in by the runtime itself (linux.devices), no annotation:
# the hook does nothing, the runtime's filter denies it. Also makes runc enable what it
# enables in the root cgroup once, before the snapshot.
node=$(stat -c '%t %T' /dev/vfio/$g)
maj=$((0x${node% *})); min=$((0x${node#* }))
config control '' ", {\"path\": \"/dev/vfio/$g\", \"type\": \"c\", \"major\": $maj, \"minor\": $min, \"fileMode\": 384}" \
  "sh /probe.sh group /dev/vfio/$g"
lab_run control-run control.txt runc_run control
eperm control-denied group control.txt
snapshot $W/before

# 2. The hook: the annotation names the device.
config hook $D '' "sh /probe.sh group /dev/vfio/$g; sh /probe.sh container /dev/vfio/vfio; \
sh /probe.sh iommu /dev/iommu; sh /probe.sh cdev /dev/vfio/devices/$cdev; \
for p in /dev/vfio/* /dev/vfio/devices/* /dev/iommu; do [ -c \$p ] && sh /probe.sh node \$p; done; \
sh /probe.sh unasked /dev/unasked; sh /probe.sh denied /dev/denied; sh /probe.sh null /dev/null; \
cat /proc/self/cgroup; ls -l /dev/vfio /dev/vfio/devices /dev/iommu 2>&1; true"
lab_run hook-run hook.txt runc_run hook
# Every VFIO node the hook made opens (the group may be busy: EBUSY is fine), never EPERM.
n=$(grep -c '^node: ' hook.txt)
if [ "$n" -ge 1 ] && ! grep '^node: ' hook.txt | grep -q 'not permitted'; then
  lab_pass hook-nodes "$n nodes: $(grep '^node: ' hook.txt | tr '\n' '|')"
else
  lab_fail hook-nodes "$n nodes: $(grep '^node: ' hook.txt | tr '\n' '|')"
fi
eperm hook-not-requested unasked hook.txt
eperm hook-runtime-denied denied hook.txt
v=$(probe null hook.txt)
lab_expect hook-runtime-allowed "OK /dev/null" "$v"
lab_expect hook-stderr "" "$(grep 'gpupass oci-hook' hook.txt.stderr 2>/dev/null | head -1)"
if [ "$LAB_KERNEL" = 6.12 ]; then
  # Opens (or EBUSY and the like): present and not refused by the cgroup.
  opens() { case "$1" in '' | *"not permitted"* | *"no character device"*) return 1;; esac; }
  gr=$(probe group hook.txt) cd=$(probe cdev hook.txt)
  if { opens "$gr" || opens "$cd"; } && ! echo "$gr$cd" | grep -q 'not permitted'; then
    lab_pass hook-group-or-cdev "group: $gr / cdev: $cd"
  else
    lab_fail hook-group-or-cdev "group: $gr / cdev: $cd"
  fi
  # What decided: the container's cgroup (from inside: "0::/gpupass-lab-hook") is on the
  # unified hierarchy, where only a BPF program can have allowed the node.
  if grep -q '^0::/gpupass-lab-hook' hook.txt && [ ! -e /sys/fs/cgroup/devices ]; then
    lab_pass cgroup-v2-filter "$(grep '^0::' hook.txt)"
  else
    lab_fail cgroup-v2-filter "container cgroup: $(grep '^0::' hook.txt)"
  fi
else
  not_eperm hook-group group hook.txt
  not_eperm hook-container container hook.txt
  lab_expect cgroup-v1-devices 1 "$(grep -c ':devices:/gpupass-lab-hook' hook.txt)"
fi

# 3. A hook that fails (the runtime put something else, c 1:3, where the node the hook makes
# goes: the group node, and on 6.12 also the cdev, since the backend policy picks one of them):
# runc refuses to start the container, with the hook's reason.
planted=", {\"path\": \"/dev/vfio/$g\", \"type\": \"c\", \"major\": 1, \"minor\": 3, \"fileMode\": 384}"
[ -n "$cdev" ] && planted="$planted, {\"path\": \"/dev/vfio/devices/$cdev\", \"type\": \"c\", \"major\": 1, \"minor\": 3, \"fileMode\": 384}"
config failing $D "$planted" "echo STARTED"
runc_run failing > failing.txt 2> failing.err
rc=$?
if [ $rc -ne 0 ] && ! grep -q STARTED failing.txt && grep -q 'something else already exists there' failing.err; then
  lab_pass failing-hook-stops-container "rc=$rc $(grep -o 'refusing[^"]*exists there' failing.err | head -1)"
else
  lab_fail failing-hook-stops-container "rc=$rc out=$(cat failing.txt) err=$(tail -2 failing.err | tr '\n' '|')"
fi
runc --root $W/state delete -f lab-failing >/dev/null 2>&1

# 4. The host after the containers: the same cgroups (and on v1 the root's device list), and
# the host (root cgroup) still opens the node and /dev/null.
snapshot $W/after
if cmp -s $W/before $W/after; then
  lab_pass cgroups-unchanged "$(wc -l < $W/after) lines"
else
  lab_fail cgroups-unchanged "$(diff $W/before $W/after | tr '\n' '|')"
fi
sh $W/probe.sh host /dev/vfio/$g /dev/null > host.txt
not_eperm host-still-opens host host.txt
lab_check unbind gpupass unbind $D
