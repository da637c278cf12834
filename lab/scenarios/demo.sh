# lab-about: show gpupass on the emulated GPUs (list, groups, check), streamed to the terminal
# lab-needs: gpupass
# lab-steps: list list-all groups show check
echo; echo "### gpupass list  (GPUs and display devices)"
lab_run list list.txt gpupass list
echo; echo "### gpupass list --all"
lab_run list-all list-all.txt gpupass list --all
echo; echo "### gpupass groups"
lab_run groups groups.txt gpupass groups
echo; echo "### gpupass show 0000:00:05.0  (VGA sharing its group with HDA audio)"
lab_run show show.txt gpupass show 0000:00:05.0
echo; echo "### gpupass check"
lab_run check check.txt gpupass check
