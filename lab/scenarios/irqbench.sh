# lab-about: benchmark: MSI round trips per second through KVM's irqfd vs through userspace injection (gpupass reading the VFIO eventfd and calling KVM_SIGNAL_MSI), on edu (raised by the device) and on the emulated device, interleaved round by round
# lab-needs: gpupass
# lab-timeout: 600
# lab-steps: bind edu-irqfd edu-userspace emu-irqfd emu-userspace unbind
# Not a timed test: it reports figures (LAB-RESULT ... PASS <numbers>) for docs/performance.md.
#
# One round trip: the firmware raises the MSI (edu: a write to its raise register through the
# BAR mapped as a KVM slot, so no VM exit; emulated device: port 0x503, one exit), waits in HLT,
# takes the interrupt, acknowledges edu and EOIs. `--irq-loop N` times N of them between two
# marks (gpupass's clock) and counts the exits and KVM's counters over them. Contenders, the
# same boot, interleaved within each round:
#   irqfd      --irq-path irqfd: the VFIO eventfd is a KVM irqfd, the kernel injects
#   userspace  --irq-path userspace: a gpupass thread polls the eventfd and injects with
#              KVM_SIGNAL_MSI (a VMM without irqfd)
# Everything is nested KVM inside TCG: absolute rates are far below hardware, the ratio is the
# result. Per contender: the median round trips/s over ROUNDS, and the last run's exits.
ROUNDS=${BENCH_ROUNDS:-5}
N=${BENCH_N:-2000}
E=0000:00:06.0
lab_run bind bind.txt gpupass bind $E

# rate FILE: round trips per second from the JSON report ("per_second": ...)
rate() { grep -m1 '"per_second":' "$1" | sed 's/.*: *//; s/,$//; s/\..*//'; }
delivered() { sed -n '/"irq_loop": {/,/"window"/p' "$1" | grep -m1 '"delivered":' | sed 's/.*: *//; s/,$//'; }
exits() { sed -n '/"window": {/,$p' "$1" | grep -m1 '"total":' | sed 's/.*: *//; s/,$//'; }
median() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

for target in edu emu; do
  eval "${target}_irqfd=''; ${target}_userspace=''"
done
r=1
while [ $r -le $ROUNDS ]; do
  for target in edu emu; do
    for path in irqfd userspace; do
      if [ $target = edu ]; then dev="--device $E"; else dev=--emulated; fi
      f=$target-$path-$r.json
      gpupass boot --json --timeout 300 $dev --irq-loop $N --irq-path $path > $f 2> $f.err
      eval "${target}_${path}=\"\$${target}_${path} $(rate $f)\""
      lab_file $f $f
    done
  done
  r=$((r + 1))
done
for target in edu emu; do
  for path in irqfd userspace; do
    f=$target-$path-$ROUNDS.json
    eval "rates=\$${target}_${path}"
    d=$(delivered $f)
    if [ "$d" = "$N" ]; then
      lab_pass $target-$path "median $(echo $rates | median) round trips/s (rounds:$rates) N=$N exits=$(exits $f)"
    else
      lab_fail $target-$path "delivered '$d' of $N: $(head -3 $f.err)"
    fi
  done
done
lab_run unbind unbind.txt gpupass unbind $E
