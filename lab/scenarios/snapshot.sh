# lab-about: gpupass snapshot of the guest, replayed with --root on the host (--update-fixture writes tests/fixtures/hosts/qemu-lab)
# lab-needs: gpupass
# lab-steps: snapshot list-all list-all-json groups-json replay-in-guest replay-equal
# lab-steps: snapshot-size host/unpack host/host-replay host/host-replay-json
lab_run snapshot snapshot.out gpupass snapshot /tmp/snap
lab_run list-all list.txt gpupass list --all
lab_run list-all-json list.json gpupass list --all --json
lab_run groups-json groups.json gpupass groups --json
lab_run replay-in-guest replay.txt gpupass --root /tmp/snap list --all
if cmp -s list.txt replay.txt; then lab_pass replay-equal "--root /tmp/snap list --all == list --all"
else lab_fail replay-equal "$(diff list.txt replay.txt | head -5 | tr '\n' '|')"; fi
tar -C /tmp/snap -czf snapshot.tar.gz .
lab_file snapshot.tar.gz snapshot.tar.gz
lab_pass snapshot-size "$(find /tmp/snap | wc -l) entries, $(wc -c < snapshot.tar.gz) bytes compressed"
