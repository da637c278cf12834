# lab-about: the boot entry point (gpupass startup, as gpupass-startup.service runs it) re-applies a persisted bind and starts an auto mdev definition; idempotent
# lab-needs: gpupass
# lab-steps: persist persisted-file define before-bind startup bound-at-startup mdev-started
# lab-steps: startup-again idempotent unbind unpersist stop undefine restored
d=0000:00:03.0
orig=$(lab_driver $d)
mkdir -p /etc
lab_check persist gpupass persist $d
lab_expect persisted-file vfio-pci "$(cat /etc/driverctl.d/pci-$d 2>/dev/null)"
u=5e1a3b9c-0d2f-4e6a-8b7c-9d0e1f2a3b4c
lab_check define gpupass mdev define --parent mbochs --type mbochs-small --uuid $u --auto
lab_expect before-bind "$orig" "$(lab_driver $d)"
lab_run startup startup.txt gpupass startup
lab_expect bound-at-startup vfio-pci "$(lab_driver $d)"
if [ -e /sys/bus/mdev/devices/$u ]; then lab_pass mdev-started "$u"; else lab_fail mdev-started "no /sys/bus/mdev/devices/$u"; fi
lab_run startup-again startup2.txt gpupass startup
lab_expect idempotent 1 "$(grep -c 'persistent binds: nothing to do' startup2.txt)"
# Clean up: back to the host driver, no persistence, no mdev.
lab_check unbind gpupass unbind $d
lab_check unpersist gpupass persist --remove $d
lab_check stop gpupass mdev stop $u
lab_check undefine gpupass mdev undefine $u
lab_expect restored "$orig" "$(lab_driver $d)"
