# lab-about: `gpupass cdi generate --write --watch` rewrites the CDI spec when another tool (plain sysfs writes) binds a device
# lab-needs: gpupass
# lab-steps: initial-no-group refreshed-after-bind refreshed-after-unbind restored refresh-lines
d=0000:00:03.0
dev=/sys/bus/pci/devices/$d
g=$(lab_group $d)
orig=$(lab_driver $d)
mkdir -p /var/run/cdi
gpupass cdi generate --write --watch > watch.log 2> watch.err &
pid=$!
sleep 1
spec=/var/run/cdi/gpupass.json
lab_expect initial-no-group 0 "$(cat $spec 2>/dev/null | grep -c "\"group-$g\"")"
# Bind with plain sysfs writes (as driverctl would): gpupass is not involved.
echo vfio-pci > $dev/driver_override
echo $d > /sys/bus/pci/drivers/$orig/unbind
echo $d > /sys/bus/pci/drivers_probe
sleep 1
lab_expect refreshed-after-bind 1 "$(cat $spec 2>/dev/null | grep -c "\"group-$g\"")"
echo > $dev/driver_override
echo $d > /sys/bus/pci/drivers/vfio-pci/unbind
echo $d > /sys/bus/pci/drivers_probe
sleep 1
lab_expect refreshed-after-unbind 0 "$(cat $spec 2>/dev/null | grep -c "\"group-$g\"")"
kill $pid
lab_expect restored "$orig" "$(lab_driver $d)"
lab_file watch.log watch.log
lab_pass refresh-lines "$(grep -c refreshed watch.log) refreshes"
