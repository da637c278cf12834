# lab-about: gpupass events sees the kernel's unbind/bind uevents of a real driver change
# lab-needs: gpupass
# lab-steps: bound restored events-exit unbind-seen vfio-bind-seen native-bind-seen
d=0000:00:03.0
dev=/sys/bus/pci/devices/$d
gpupass events --json --count 6 --timeout 20 > events.json 2> events.err &
pid=$!
sleep 0.5
orig=$(lab_driver $d)
# Move the bochs-display at 00:03.0 to vfio-pci and back with plain sysfs writes.
echo vfio-pci > $dev/driver_override
echo $d > /sys/bus/pci/drivers/$orig/unbind
echo $d > /sys/bus/pci/drivers_probe
lab_expect bound vfio-pci "$(lab_driver $d)"
echo > $dev/driver_override
echo $d > /sys/bus/pci/drivers/vfio-pci/unbind
echo $d > /sys/bus/pci/drivers_probe
lab_expect restored "$orig" "$(lab_driver $d)"
wait $pid
lab_expect events-exit 0 "$?"
lab_file events.json events.json
cat events.json
lab_expect unbind-seen 2 "$(grep -c "\"action\":\"unbind\",\"devpath\":\"[^\"]*$d\"" events.json)"
lab_expect vfio-bind-seen 1 "$(grep "\"action\":\"bind\"" events.json | grep -c '"driver":"vfio-pci"')"
lab_expect native-bind-seen 1 "$(grep "\"action\":\"bind\"" events.json | grep -c "\"driver\":\"$orig\"")"
