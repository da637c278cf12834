# The guest side of the cluster lab (docs/cluster.md), sourced by the cluster scenarios
# (busybox sh, after /lab/lib.sh): the node half of a one-node Kubernetes (kubelet, containerd
# 2.x, runc 1.5, the reference CNI plugins) inside the lab guest, joined to the control plane
# that lab/cluster/host.sh runs on the host's loopback. The node's NIC is on QEMU's user network
# (the guest 10.0.2.15; the host's 127.0.0.1:PORT is 10.0.2.2:PORT here); the pod's NIC has no
# peer. lab/cluster/prep.sh made /lab/cluster/ on the host (certificates, kubeconfigs naming
# https://10.0.2.2:PORT, image archives); the binaries are the cluster build's bin/, over 9p.
CL_BIN=/opt/cluster/bin
CL=/lab/cluster
CL_RUN=/run/lab-cluster
CL_LOG=/tmp/lab-cluster
CL_NODE=lab
# The node's address on the NIC lab.sh puts on QEMU's user network (MAC 52:54:00:c1:00:01;
# 10.0.2.15 is the address QEMU's DHCP would give, set here without DHCP), the host as the
# guest reaches it, and the pod network: the CNI host-device plugin moves the second NIC
# (52:54:00:c1:00:02) into the pod's network namespace as eth0, host-local gives it an address.
# (The lab's 6.12 kernel has neither BRIDGE nor VETH, so the bridge plugin cannot run there.)
CL_NODE_NIC=node0
CL_NODE_MAC=52:54:00:c1:00:01
CL_NODE_IP=10.0.2.15
CL_HOST_IP=10.0.2.2
CL_POD_NIC=pod0
CL_POD_MAC=52:54:00:c1:00:02
CL_SUBNET=10.88.1.0/24
# A two-node boot (lab.sh, "# lab-nodes: 2"): the second guest's kernel command line names its
# node (lab.node=lab2), its address on its own QEMU user network (lab.nodeip=10.0.2.16: each
# guest has a user network of its own, the host is 10.0.2.2 in both) and its pods' subnet
# (lab.podnet=10.88.2.0/24); the first guest's has none of them and is the node "lab".
for _w in $(cat /proc/cmdline); do
  case $_w in
    lab.node=*) CL_NODE=${_w#lab.node=} ;;
    lab.nodeip=*) CL_NODE_IP=${_w#lab.nodeip=} ;;
    lab.podnet=*) CL_SUBNET=${_w#lab.podnet=} ;;
  esac
done
# The kubelet's client certificate names its node (prep.sh: kubelet-NAME for the extra nodes).
CL_KUBELET_KC=$CL/kubelet.kubeconfig
[ "$CL_NODE" = lab ] || CL_KUBELET_KC=$CL/kubelet-$CL_NODE.kubeconfig
export PATH=$CL_BIN:$PATH
# Every kubectl call is bounded: kubectl's own --request-timeout is 0 (none), and one call that
# stalls (the API server behind QEMU's user network, a connection left half open by the
# API-outage step) would hold a scenario until the boot's limit. A `--wait=true` delete has its
# own --timeout and a watch that must outlive any request limit.
mkdir -p "$CL_RUN/bin"
printf '#!/bin/sh\ncase " $* " in *" --wait=true "*) exec %s/kubectl "$@" ;; esac\nexec %s/kubectl --request-timeout=60s "$@"\n' \
  "$CL_BIN" "$CL_BIN" > "$CL_RUN/bin/kubectl"
chmod +x "$CL_RUN/bin/kubectl"
export PATH=$CL_RUN/bin:$PATH

# cl_t: seconds since boot, with hundredths (busybox: no subshell-free clock in ms).
cl_t() { cut -d' ' -f1 /proc/uptime; }
# cl_since T0: seconds since T0 (a cl_t value), one decimal.
cl_since() { awk -v a="$1" -v b="$(cl_t)" 'BEGIN { printf "%.1f", b - a }'; }
kc() { kubectl --kubeconfig "$CL/admin.kubeconfig" "$@"; }
# cl_logs POD: what the pod's containers printed, through the CRI (crictl logs; `kubectl logs`
# would need the host's API server to reach the kubelet in the guest, which it cannot).
cl_logs() {
  for _cid in $(crictl --runtime-endpoint unix:///run/containerd/containerd.sock ps -a \
    --label "io.kubernetes.pod.name=$1" -q 2> /dev/null); do
    crictl --runtime-endpoint unix:///run/containerd/containerd.sock logs "$_cid" 2>&1
  done
}

# cl_wait SECONDS CMD...: CMD until it succeeds, every 2 s; 1 when SECONDS passed.
cl_wait() {
  _cw_end=$(( $(cut -d. -f1 /proc/uptime) + $1 )); shift
  while ! "$@" > /dev/null 2>&1; do
    [ "$(cut -d. -f1 /proc/uptime)" -lt "$_cw_end" ] || return 1
    sleep 2
  done
}
# cl_samples TRIES PRED SAMPLE...: SAMPLE's output every 2 s, space-separated, while PRED (one
# command, a function of the scenario) fails, at most TRIES times: what a function's driver was
# while the kubelet or the scheduler retried a claim (`cl_samples 5 false ...`: 10 s more).
cl_samples() {
  _cs_n=$1 _cs_pred=$2 _cs_i=0
  shift 2
  while [ $_cs_i -lt "$_cs_n" ] && ! $_cs_pred > /dev/null 2>&1; do
    printf ' %s' "$("$@")"
    sleep 2
    _cs_i=$((_cs_i + 1))
  done
}

# cl_start NAME CMD...: a component in the background, its output in $CL_LOG/NAME.log.
cl_start() {
  _n=$1; shift
  echo "\$ $* &  (log $CL_LOG/$_n.log)"
  "$@" > "$CL_LOG/$_n.log" 2>&1 &
  echo $! > "$CL_RUN/$_n.pid"
}
cl_alive() { [ -f "$CL_RUN/$1.pid" ] && kill -0 "$(cat "$CL_RUN/$1.pid")" 2> /dev/null; }

# cl_ready STEP NAME T0 SECONDS CMD...: waits for CMD while the component NAME runs; PASS with
# the seconds it took, or FAIL at once when NAME exited, or after SECONDS, with its last log line.
cl_ready() {
  _s=$1 _n=$2 _t0=$3 _lim=$4; shift 4
  _end=$(( $(cut -d. -f1 /proc/uptime) + _lim ))
  _why="not ready after $_lim s"
  while ! "$@" > /dev/null 2>&1; do
    if [ -f "$CL_RUN/$_n.pid" ] && ! cl_alive "$_n"; then _why="exited"; break; fi
    if [ "$(cut -d. -f1 /proc/uptime)" -ge "$_end" ]; then _why="not ready after $_lim s"; break; fi
    sleep 2
  done
  if [ "$_why" != exited ] && "$@" > /dev/null 2>&1; then
    lab_pass "$_s" "$_n ready after $(cl_since "$_t0") s"
    echo "$_s $(cl_since "$_t0")" >> "$CL_LOG/timings.txt"
    return 0
  fi
  lab_fail "$_s" "$_n $_why :: $(tail -1 "$CL_LOG/$_n.log" 2> /dev/null)"
  return 1
}

# cl_files: ship every component's log (the last 3000 lines) and the timings.
cl_files() {
  for _f in "$CL_LOG"/*.log; do
    [ -f "$_f" ] || continue
    tail -n 3000 "$_f" > "$_f.tail"
    lab_file "$(basename "$_f")" "$_f.tail"
  done
  [ -f "$CL_LOG/timings.txt" ] && lab_file timings.txt "$CL_LOG/timings.txt"
}

# cl_kubelet: the kubelet started (its configuration written by cluster_up).
cl_kubelet() {
  cl_start kubelet kubelet --config=/var/lib/kubelet/config.yaml \
    --kubeconfig="$CL_KUBELET_KC" --hostname-override="$CL_NODE" --node-ip="$CL_NODE_IP"
}

# cluster_up: the whole cluster, each stage a step; 0 when the node is Ready. Already up: 0.
cluster_up() {
  [ -f "$CL_RUN/up" ] && return 0
  mkdir -p "$CL_RUN" "$CL_LOG"
  : > "$CL_LOG/timings.txt"
  T0=$(cl_t)

  # The binaries, read-only over 9p (lab.sh: -fsdev local,...,readonly=on, mount tag "cluster").
  mkdir -p /opt/cluster
  if ! mount | grep -q ' /opt/cluster '; then
    lab_check mount-bin mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=524288 cluster /opt/cluster || return 1
  else
    lab_pass mount-bin "already mounted"
  fi
  {
    # The node's components (the control plane's run on the host: host/*.log).
    echo "kubelet: $(kubelet --version 2>&1 | head -1)"
    echo "kubectl: $(kubectl version --client 2>&1 | head -1)"
    echo "containerd: $(containerd --version 2>&1 | head -1)"
    echo "runc: $(runc --version 2>&1 | head -1)"
    echo "crictl: $(crictl --version 2>&1 | head -1)"
    echo "cni host-device: $("$CL_BIN/cni/host-device" 2>&1 | head -1)"
    echo "pause: $(cat "$CL/pause-tag")"
    cat "$CL_BIN/../versions" 2> /dev/null | sed 's/^/build: /'
  } > "$CL_LOG/versions.txt" 2>&1
  cat "$CL_LOG/versions.txt"
  lab_file versions.txt "$CL_LOG/versions.txt"
  if grep -q 'Kubernetes v1\.' "$CL_LOG/versions.txt" && grep -q 'containerd.* v2\.' "$CL_LOG/versions.txt" &&
    grep -q '^runc: runc version 1\.' "$CL_LOG/versions.txt"; then
    lab_pass versions "$(grep -E '^(kubelet|containerd|runc):' "$CL_LOG/versions.txt" | tr '\n' ' ')"
  else
    lab_fail versions "a binary did not say its version (versions.txt)"
    return 1
  fi

  # What a distribution's boot provides and the components expect: a hostname, /etc/hosts and
  # resolv.conf (containerd copies both into each sandbox), a machine id, tmpfs for their state
  # (statfs must report a size: the kubelet's eviction manager reads it).
  hostname "$CL_NODE"
  mkdir -p /etc /var/lib /var/log
  [ -e /var/run ] || ln -s /run /var/run
  printf '127.0.0.1 localhost\n::1 localhost\n' > /etc/hosts
  # The kubelet's user-namespace manager looks the "kubelet" user up in /etc/passwd (its
  # absence is fine, the file's is not: "kubelet mappings: open /etc/passwd").
  [ -f /etc/passwd ] || printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' > /etc/passwd
  [ -f /etc/group ] || printf 'root:x:0:\nnogroup:x:65534:\n' > /etc/group
  : > /etc/resolv.conf
  echo "$CL_NODE" > /etc/hostname
  tr -d '-' < /proc/sys/kernel/random/uuid > /etc/machine-id
  mount | grep -q ' /var/lib ' || mount -t tmpfs -o size=1536m,mode=755 tmpfs /var/lib
  ip link set lo up
  # The two NICs by MAC (no udev: the kernel's ethN names), renamed for what they are.
  for _d in /sys/class/net/*; do
    case $(cat "$_d/address") in
      "$CL_NODE_MAC") ip link set "${_d##*/}" name "$CL_NODE_NIC" ;;
      "$CL_POD_MAC") ip link set "${_d##*/}" name "$CL_POD_NIC" ;;
    esac
  done
  if ip link show "$CL_NODE_NIC" > /dev/null 2>&1 && ip link show "$CL_POD_NIC" > /dev/null 2>&1 &&
    { ip -4 addr show dev "$CL_NODE_NIC" | grep -q "inet $CL_NODE_IP/" ||
      ip addr add "$CL_NODE_IP/24" dev "$CL_NODE_NIC"; } && ip link set "$CL_NODE_NIC" up &&
    { ip route show default | grep -q . || ip route add default via "$CL_HOST_IP" dev "$CL_NODE_NIC"; }; then
    lab_pass node-network "$CL_NODE_NIC $CL_NODE_IP/24 (QEMU user network, host $CL_HOST_IP), $CL_POD_NIC for the pod"
  else
    lab_fail node-network "no NICs with $CL_NODE_MAC and $CL_POD_MAC ($(ls /sys/class/net | tr '\n' ' '))"
    return 1
  fi

  # containerd 2.x with runc 1.5 and the CNI plugins from the build. The guest's root is the
  # initramfs, where pivot_root is not possible: runc runs with --no-pivot (NoPivotRoot).
  mkdir -p /etc/containerd /etc/cni/net.d
  # crictl's endpoint (without it, every crictl call warns before its output).
  echo 'runtime-endpoint: unix:///run/containerd/containerd.sock' > /etc/crictl.yaml
  cat > /etc/containerd/config.toml << EOF
version = 3
root = "/var/lib/containerd"
state = "/run/containerd"
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "registry.k8s.io/pause:$(cat "$CL/pause-tag")"
[plugins.'io.containerd.cri.v1.runtime']
  enable_cdi = true
  cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "$CL_BIN/runc"
        NoPivotRoot = true
        SystemdCgroup = false
    # The "gpupass" handler (RuntimeClass gpupass): runc 1.5 with gpupass oci-hook as the
    # createRuntime hook of its base spec (prep.sh), and the Pod's gpupass.dev/* annotations
    # passed into the OCI spec, where the hook reads which devices the container gets.
    # (No backquotes in this unquoted here-document: they would run.)
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.gpupass]
      runtime_type = "io.containerd.runc.v2"
      base_runtime_spec = "$CL/gpupass-hook-spec.json"
      pod_annotations = ["gpupass.dev/*"]
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.gpupass.options]
        BinaryName = "$CL_BIN/runc"
        NoPivotRoot = true
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["$CL_BIN/cni"]
    conf_dir = "/etc/cni/net.d"
EOF
  # containerd runs the loopback plugin for each sandbox's lo itself.
  cat > /etc/cni/net.d/10-lab.conflist << EOF
{
  "cniVersion": "1.0.0",
  "name": "lab",
  "plugins": [
    {
      "type": "host-device",
      "device": "$CL_POD_NIC",
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$CL_SUBNET"}]],
        "dataDir": "/var/lib/cni/networks"
      }
    }
  ]
}
EOF
  t=$(cl_t)
  cl_start containerd containerd --config /etc/containerd/config.toml
  cl_ready containerd containerd "$t" 120 ctr --address /run/containerd/containerd.sock version || return 1

  # The two images, from the archives prep.sh made on the host (never a registry).
  t=$(cl_t)
  _ok=1
  while read -r _a _name; do
    if ctr --address /run/containerd/containerd.sock -n k8s.io images import --platform linux/amd64 "$CL/$_a" > "$CL_LOG/import-$(basename "$_a").txt" 2>&1 &&
      ctr --address /run/containerd/containerd.sock -n k8s.io images ls -q | grep -qx "$_name"; then
      :
    else
      _ok=0; lab_fail images-imported "$_name :: $(tail -1 "$CL_LOG/import-$(basename "$_a").txt")"
    fi
  done < "$CL/images.txt"
  [ $_ok = 1 ] || return 1
  lab_pass images-imported "$(awk '{ printf "%s ", $2 }' "$CL/images.txt")in $(cl_since "$t") s"
  echo "images $(cl_since "$t")" >> "$CL_LOG/timings.txt"

  # The control plane on the host (lab/cluster/host.sh, started before this boot): its API
  # server's /readyz through kubectl with this boot's admin certificate, over QEMU's user
  # network, checked against this boot's CA (the serving certificate names 10.0.2.2).
  t=$(cl_t)
  if cl_wait 300 kc get --raw /readyz; then
    lab_pass control-plane "the host's kube-apiserver ($(sed -n 's#^ *server: ##p' "$CL/admin.kubeconfig")) ready, waited $(cl_since "$t") s; $(kc version 2>&1 | grep -i '^server' | head -1)"
    echo "control-plane $(cl_since "$t")" >> "$CL_LOG/timings.txt"
  else
    lab_fail control-plane "no /readyz from $(sed -n 's#^ *server: ##p' "$CL/admin.kubeconfig") in 300 s :: $(kc get --raw /readyz 2>&1 | tail -1)"
    return 1
  fi

  # The kubelet: cgroup v2 through cgroupfs, containerd's CRI socket, x509 + webhook auth.
  mkdir -p /var/lib/kubelet
  cat > /var/lib/kubelet/config.yaml << EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $CL_NODE_IP
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $CL/pki/ca.crt}
authorization: {mode: Webhook}
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
resolvConf: ""
failSwapOn: false
# The lab's 6.12 kernel has no CONFIG_CFS_BANDWIDTH, so cgroup v2 has no cpu.max; with the CFS
# quota on, the kubelet asks runc for a CPU period on every container ("openat2
# .../cpu.max: no such file or directory"). CPU limits are not enforced in the lab.
cpuCFSQuota: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "50Mi", nodefs.available: "1%", imagefs.available: "1%"}
EOF
  t=$(cl_t)
  cl_kubelet
  cl_ready kubelet kubelet "$t" 600 sh -c 'wget -q -O - http://127.0.0.1:10248/healthz | grep -qx ok' || return 1
  cl_ready node-registered kubelet "$t" 600 kc get node "$CL_NODE" || return 1
  # Ready for real: the kubelet says so once the runtime and its network (CNI) are ready;
  # the node lifecycle controller then lifts the not-ready taint. Nothing is removed by hand.
  if cl_wait 600 sh -c "kubectl --kubeconfig $CL/admin.kubeconfig get node $CL_NODE -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -qx True"; then
    lab_pass node-ready "$CL_NODE Ready after $(cl_since "$t") s from the kubelet's start, $(cl_since "$T0") s from the scenario's"
    echo "node-ready $(cl_since "$t")" >> "$CL_LOG/timings.txt"
    echo "bring-up $(cl_since "$T0")" >> "$CL_LOG/timings.txt"
  else
    lab_fail node-ready "$(kc get node "$CL_NODE" -o jsonpath='{range .status.conditions[*]}{.type}={.status} {.reason}: {.message}; {end}' 2>&1 | tail -1)"
    return 1
  fi
  kc get node "$CL_NODE" -o yaml > "$CL_LOG/node.yaml" 2>&1
  touch "$CL_RUN/up"
}

# cluster_down: stops everything cluster_up started, pods first; 0 when nothing is left.
cluster_down() {
  # The kubelet's pods go with containerd's tasks; stop the kubelet first so it does not
  # restart them, then remove every pod sandbox through the CRI.
  for _n in kubelet; do cl_alive $_n && kill "$(cat "$CL_RUN/$_n.pid")"; done
  sleep 1
  if cl_alive containerd; then
    crictl --runtime-endpoint unix:///run/containerd/containerd.sock rmp -a -f > "$CL_LOG/rmp.txt" 2>&1
  fi
  for _n in containerd; do
    cl_alive $_n && kill "$(cat "$CL_RUN/$_n.pid")"
  done
  # Up to 90 s (TCG). The host's control plane is stopped by lab.sh after the boot.
  _left='' _i=0
  while [ $_i -lt 90 ]; do
    _left=''
    for _n in kubelet containerd; do
      cl_alive $_n && _left="$_left $_n"
    done
    [ -z "$_left" ] && break
    sleep 1; _i=$((_i + 1))
  done
  # Shims outlive containerd by design; none may be left with its container.
  _shims=$(pidof containerd-shim-runc-v2)
  [ -n "$_shims" ] && kill $_shims
  rm -f "$CL_RUN/up"
  if [ -z "$_left" ] && [ -z "$_shims" ]; then
    lab_pass teardown "every component stopped in $_i s"
  else
    lab_fail teardown "still running after 90 s:$_left${_shims:+ shims $_shims}"
  fi
}

# cluster_begin: how every cluster scenario starts: cgroup v2 (6.12; 6.1 for the scenarios that
# declare it), then the cluster (already up when an earlier scenario of the boot brought it up);
# the scenario ends here when either fails.
cluster_begin() {
  if [ "$LAB_CGROUP" != v2 ]; then
    lab_fail leg "the cluster lab needs the unified cgroup hierarchy (kubelet 1.37 refuses v1): $LAB_SCENARIO runs on the 6.12 leg (lab/lab.sh --kernel 6.12 run $LAB_SCENARIO); cluster, clusterdra and clustervm also on 6.1, where they declare '# lab-cgroup: v2'"
    exit 1
  fi
  lab_pass leg "kernel $(uname -r), cgroup v2"
  if ! cluster_up; then
    cl_files
    cluster_down
    exit 1
  fi
}

# cluster_end: how every cluster scenario ends: the logs shipped, the cluster torn down by the
# boot's last cluster scenario (left up for the next one otherwise).
cluster_end() {
  cl_files
  if cluster_last; then cluster_down; else lab_pass teardown "left up for the next cluster scenario"; fi
}

# cluster_last: 0 when no later scenario of this boot is a cluster one (it tears down).
cluster_last() {
  _seen=0
  for _s in $LAB_SCENARIOS; do
    [ $_seen = 1 ] && case $_s in cluster*) return 1 ;; esac
    [ "$_s" = "$LAB_SCENARIO" ] && _seen=1
  done
  return 0
}

# cl_lab_values FILE: the chart's values for the lab (clusterhelm, clustertwo): the image as
# `ctr images import` left it (pullPolicy Never: never pulled), the API server as the nodes reach
# it (no kube-proxy in the lab, so not the kubernetes Service's ClusterIP), the node's network.
cl_lab_values() {
  cat > "$1" << EOF
image: {repository: gpupass.dev/gpupass, tag: lab-1, pullPolicy: Never}
apiServer: {host: $CL_HOST_IP, port: $(awk '$1 == "api" { print $2 }' "$CL/host-ports")}
kubeletPlugin: {hostNetwork: true}
EOF
}

# cl_template NAME CLASS CEL [POLICY] [TAINT]: writes NAME.yaml, a ResourceClaimTemplate NAME
# (namespace default) with one request "vfio" of device class CLASS whose device the CEL
# expression selects (one line, in YAML single quotes: no ' in it). POLICY, when not empty, is
# the request's opaque VfioConfig backendPolicy (for the driver $DRIVER); TAINT, a taint key the
# request tolerates (operator Exists, effect NoSchedule). The caller applies it.
cl_template() {
  {
    cat << EOF
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: $1, namespace: default}
spec:
  spec:
    devices:
      requests:
      - name: vfio
        exactly:
          deviceClassName: $2
EOF
    [ -z "${5:-}" ] || echo "          tolerations: [{key: $5, operator: Exists, effect: NoSchedule}]"
    cat << EOF
          selectors:
          - cel:
              expression: '$3'
EOF
    [ -z "${4:-}" ] || cat << EOF
      config:
      - requests: ["vfio"]
        opaque:
          driver: ${DRIVER:-vfio.gpupass.dev}
          parameters: {apiVersion: gpupass.dev/v1alpha1, kind: VfioConfig, backendPolicy: $4}
EOF
  } > "$1.yaml"
}

# cl_claim_pod NAME TEMPLATE [NODE]: a Pod (namespace default) with one claim from TEMPLATE that
# opens every VFIO/iommufd node it has, prints the KEP-5304 metadata it can see, says READY and
# waits to be deleted (the DRA scenarios); with NODE, a nodeSelector for that node's hostname.
# CL_POD_AFFINITY, when set: one line of the Pod's spec (e.g. "affinity: {...}" in flow style).
cl_claim_pod() {
  _sel=""
  [ -z "${3:-}" ] || _sel="nodeSelector: {kubernetes.io/hostname: $3}"
  cat > "$1.yaml" << EOF
apiVersion: v1
kind: Pod
metadata: {name: $1, namespace: default}
spec:
  $_sel
  ${CL_POD_AFFINITY:-}
  restartPolicy: Never
  automountServiceAccountToken: false
  dnsPolicy: Default
  terminationGracePeriodSeconds: 5
  resourceClaims:
  - name: vfio
    resourceClaimTemplateName: $2
  containers:
  - name: probe
    image: $(cat "$CL/busybox-image")
    imagePullPolicy: Never
    resources:
      claims: [{name: vfio}]
    command:
    - /bin/sh
    - -c
    - |
      for p in /dev/vfio/* /dev/vfio/devices/* /dev/iommu; do
        [ -c "\$p" ] || continue
        if (exec 3<>"\$p") 2>/dev/null; then echo "open OK \$p"; else echo "open FAILED \$p"; fi
      done
      find /var/run/kubernetes.io/dra-device-attributes -name '*.json' -exec sh -c 'echo "metadata \$1"; cat "\$1"; echo' _ {} \; 2>/dev/null
      echo READY
      trap 'exit 0' TERM
      sleep 3600 & wait
EOF
  kc apply -f "$1.yaml" > /dev/null
}

# cl_resource_pod NAME RESOURCE: a Pod (namespace default) asking for one RESOURCE (a device
# plugin's extended resource) that opens every VFIO/iommufd node it has, prints the
# PCI_RESOURCE_* environment the plugin gave, and exits.
cl_resource_pod() {
  cat > "$1.yaml" << EOF
apiVersion: v1
kind: Pod
metadata: {name: $1, namespace: default}
spec:
  restartPolicy: Never
  automountServiceAccountToken: false
  dnsPolicy: Default
  containers:
  - name: probe
    image: $(cat "$CL/busybox-image")
    imagePullPolicy: Never
    resources:
      limits: {"$2": 1}
    command:
    - /bin/sh
    - -c
    - |
      for p in /dev/vfio/* /dev/vfio/devices/* /dev/iommu; do
        [ -c "\$p" ] || continue
        if (exec 3<>"\$p") 2>/dev/null; then echo "open OK \$p"; else echo "open FAILED \$p: \$( (exec 3<>"\$p") 2>&1)"; fi
      done
      env | grep '^PCI_RESOURCE' || echo "no PCI_RESOURCE env"
EOF
  kc apply -f "$1.yaml" > /dev/null
}
