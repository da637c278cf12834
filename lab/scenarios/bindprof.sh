# lab-about: profile: where a gpupass bind/unbind spends its time (-vv JSON log timestamps, strace counts); not a test
# lab-needs: gpupass
# lab-files: /usr/bin/strace
# lab-timeout: 300
# lab-steps: end-driver
# Prints phase timestamps of three bind+unbind round trips (the JSON log's timestamps are
# microseconds) and one `strace -c` per command, for docs/performance.md.
VGA=0000:00:05.0
D=/sys/bus/pci/devices
i=0
while [ $i -lt 3 ]; do
  echo "=== PHASES bind $i"
  gpupass bind 00:05.0 -vv --log-format json 2>&1 >/dev/null | cut -c1-200
  echo "=== PHASES unbind $i"
  gpupass unbind 00:05.0 -vv --log-format json 2>&1 >/dev/null | cut -c1-200
  i=$((i + 1))
done
echo "=== STRACE-C bind"; strace -c -f -o /tmp/c.trace gpupass bind 00:05.0 >/dev/null; cat /tmp/c.trace
echo "=== STRACE-C unbind"; strace -c -f -o /tmp/c.trace gpupass unbind 00:05.0 >/dev/null; cat /tmp/c.trace
strace -f -tt -T -o /tmp/bind.trace gpupass bind 00:05.0 >/dev/null
strace -f -tt -T -o /tmp/unbind.trace gpupass unbind 00:05.0 >/dev/null
echo "=== BIND TRACE"; cat /tmp/bind.trace
echo "=== UNBIND TRACE"; cat /tmp/unbind.trace
echo "=== END"
lab_expect end-driver bochs-drm "$(basename "$(readlink $D/$VGA/driver)")"
