#!/usr/bin/env bash
# The cluster lab's control plane on the host (docs/cluster.md, "What runs where"): etcd,
# kube-apiserver, kube-controller-manager and kube-scheduler from the cluster build, natively,
# listening on 127.0.0.1 only, with the certificates lab/cluster/prep.sh made for this boot.
# The kubelet, containerd and runc run in the 6.12 lab guest and reach the API server through
# QEMU's user network: the guest's 10.0.2.2:PORT is the host's 127.0.0.1:PORT (libslirp turns a
# connection to its host address into one to the host's loopback). Nothing listens anywhere
# but loopback; every process is stopped by `down`, or by the watchdog when the lab runner
# that started them is gone (a runner killed by a test's timeout leaves nothing behind).
#
# Usage:
#   lab/cluster/host.sh ports STATE              free loopback ports -> STATE/ports ("name port")
#   lab/cluster/host.sh up BINDIR CLDIR STATE PID
#                                                start the control plane (returns at once);
#                                                CLDIR: prep.sh's output (pki/, *.kubeconfig),
#                                                PID: the runner; when it exits, all is stopped
#   lab/cluster/host.sh wait STATE SECONDS       until /readyz and both /healthz answer;
#                                                prints "apiserver S", "controllers S" (seconds)
#   lab/cluster/host.sh down STATE               stop every component, remove its state;
#                                                prints what was left, exit 1 if anything was
#   (lab/cluster/host.sh supervise STATE PID: started by `up`, in a session of its own)
# Exit status: 0 done, 1 a component failed or did not stop (named), 2 usage or setup.
set -euo pipefail
die() { echo "cluster host: $*" >&2; exit 2; }
COMPONENTS="kube-scheduler kube-controller-manager kube-apiserver etcd"

port() { awk -v n="$1" '$1 == n { print $2 }' "$2/ports"; }
now() { date +%s.%N | cut -c1-14; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
alive() { [ -f "$1/run/$2.pid" ] && kill -0 "$(cat "$1/run/$2.pid")" 2>/dev/null; }

cmd_ports() {
  local st=$1
  mkdir -p "$st"
  # Each port is held until all are chosen, so no two are the same.
  python3 - "$st/ports" <<'EOF'
import socket, sys
names = ["api", "etcd", "etcd-peer", "kcm", "sched"]
socks = []
for n in names:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append((n, s))
with open(sys.argv[1], "w") as f:
    for n, s in socks:
        f.write(f"{n} {s.getsockname()[1]}\n")
for _, s in socks:
    s.close()
EOF
}

start() { # STATE NAME CMD...
  local st=$1 n=$2; shift 2
  echo "\$ $*" > "$st/log/$n.log"
  setsid "$@" >> "$st/log/$n.log" 2>&1 < /dev/null &
  echo $! > "$st/run/$n.pid"
}

cmd_up() {
  local bin=$1 cl=$2 st=$3 runner=$4 c
  [ -f "$st/ports" ] || die "no $st/ports: run 'host.sh ports $st' first"
  for c in etcd kube-apiserver kube-controller-manager kube-scheduler; do
    [ -x "$bin/$c" ] || die "no $bin/$c (lab/cluster/build.sh)"
  done
  [ -f "$cl/pki/ca.crt" ] || die "no $cl/pki (lab/cluster/prep.sh)"
  mkdir -p "$st/run" "$st/log" "$st/pki"
  cp "$cl"/pki/* "$st/pki/"
  local api etcd peer
  api=$(port api "$st") etcd=$(port etcd "$st") peer=$(port etcd-peer "$st")
  # The host's kubeconfigs: the guest's, with this host's paths and the loopback address.
  for c in admin controller-manager scheduler; do
    sed "s#/lab/cluster/pki#$st/pki#g; s#server: https://[^ ]*#server: https://127.0.0.1:$api#" \
      "$cl/$c.kubeconfig" > "$st/$c.kubeconfig"
  done
  now > "$st/run/t0"
  echo "$bin" > "$st/bin"

  start "$st" etcd "$bin/etcd" --name lab --data-dir "$st/etcd" \
    --listen-client-urls "http://127.0.0.1:$etcd" --advertise-client-urls "http://127.0.0.1:$etcd" \
    --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
    --initial-cluster "lab=http://127.0.0.1:$peer" --listen-metrics-urls '' --log-level warn
  # --advertise-address: the address the guest reaches it at (the "kubernetes" Service's
  # endpoint; with --endpoint-reconciler-type=none nothing else uses it). Bound to loopback only.
  start "$st" kube-apiserver "$bin/kube-apiserver" --etcd-servers="http://127.0.0.1:$etcd" \
    --bind-address=127.0.0.1 --advertise-address=10.0.2.2 --secure-port="$api" \
    --cert-dir="$st/apiserver" \
    --tls-cert-file="$st/pki/apiserver.crt" --tls-private-key-file="$st/pki/apiserver.key" \
    --client-ca-file="$st/pki/ca.crt" \
    --kubelet-client-certificate="$st/pki/apiserver-kubelet-client.crt" \
    --kubelet-client-key="$st/pki/apiserver-kubelet-client.key" \
    --service-account-issuer=https://kubernetes.default.svc \
    --service-account-key-file="$st/pki/sa.pub" --service-account-signing-key-file="$st/pki/sa.key" \
    --service-cluster-ip-range=10.96.0.0/24 --authorization-mode=Node,RBAC \
    --allow-privileged=true --endpoint-reconciler-type=none --profiling=false
  # The controller manager and the scheduler exit on their first API error at start
  # ("unable to load configmap based request-header-client-ca-file: ... TLS handshake
  # timeout"), so the supervisor below starts them once the API server is ready.
  setsid "$0" supervise "$st" "$runner" < /dev/null > "$st/log/supervisor.log" 2>&1 &
  echo $! > "$st/run/supervisor.pid"
}

# supervise STATE RUNNER: the controllers once the API server is ready, then the watchdog: when
# the runner is gone (killed by a test's timeout, say), `down` (in its own session, so that the
# end of the caller's process group does not end it).
cmd_supervise() {
  local st=$1 runner=$2 api
  api=$(port api "$st")
  until healthy "$st" "$api" /readyz; do
    [ -f "$st/run/t0" ] && alive "$st" kube-apiserver && kill -0 "$runner" 2>/dev/null || break
    sleep 0.5
  done
  if [ -f "$st/run/t0" ] && healthy "$st" "$api" /readyz; then
    echo "kube-apiserver ready; starting the controller manager and the scheduler"
    controllers "$st"
  fi
  while kill -0 "$runner" 2>/dev/null && [ -f "$st/run/t0" ]; do sleep 2; done
  if [ -f "$st/run/t0" ]; then
    echo "the runner (pid $runner) is gone; stopping the control plane"
    rm -f "$st/run/supervisor.pid"
    cmd_down "$st"
  fi
}

controllers() { # STATE
  local st=$1 kcm sched bin
  bin=$(cat "$st/bin")
  kcm=$(port kcm "$st") sched=$(port sched "$st")
  local k=$st/controller-manager.kubeconfig s=$st/scheduler.kubeconfig
  now > "$st/run/t-controllers"
  start "$st" kube-controller-manager "$bin/kube-controller-manager" --kubeconfig="$k" \
    --authentication-kubeconfig="$k" --authorization-kubeconfig="$k" \
    --bind-address=127.0.0.1 --secure-port="$kcm" --leader-elect=false --cert-dir="$st/kcm" \
    --service-account-private-key-file="$st/pki/sa.key" --root-ca-file="$st/pki/ca.crt" \
    --cluster-signing-cert-file="$st/pki/ca.crt" --cluster-signing-key-file="$st/pki/ca.key" \
    --use-service-account-credentials=true --profiling=false
  start "$st" kube-scheduler "$bin/kube-scheduler" --kubeconfig="$s" \
    --authentication-kubeconfig="$s" --authorization-kubeconfig="$s" \
    --bind-address=127.0.0.1 --secure-port="$sched" --leader-elect=false --cert-dir="$st/sched" \
    --profiling=false
}

# healthy STATE PORT PATH: 200 from https://127.0.0.1:PORT/PATH with the admin certificate. -k:
# the controller manager and the scheduler serve self-signed certificates (the guest checks the
# API server's against this boot's CA, step control-plane).
healthy() {
  [ "$(curl -s -k -o /dev/null -w '%{http_code}' --max-time 5 --cert "$1/pki/admin.crt" \
    --key "$1/pki/admin.key" "https://127.0.0.1:$2$3" 2>/dev/null)" = 200 ]
}

cmd_wait() {
  local st=$1 lim=$2 t0 end c
  t0=$(cat "$st/run/t0")
  end=$(( $(date +%s) + lim ))
  until healthy "$st" "$(port api "$st")" /readyz; do
    for c in etcd kube-apiserver; do
      alive "$st" "$c" || { echo "cluster host: $c exited: $(tail -1 "$st/log/$c.log")" >&2; return 1; }
    done
    [ "$(date +%s)" -lt "$end" ] || { echo "cluster host: kube-apiserver not ready after $lim s: $(tail -1 "$st/log/kube-apiserver.log")" >&2; return 1; }
    sleep 0.5
  done
  echo "apiserver $(since "$t0")"
  until healthy "$st" "$(port kcm "$st")" /healthz && healthy "$st" "$(port sched "$st")" /healthz; do
    for c in kube-controller-manager kube-scheduler; do
      [ ! -f "$st/run/$c.pid" ] || alive "$st" "$c" || { echo "cluster host: $c exited: $(tail -1 "$st/log/$c.log")" >&2; return 1; }
    done
    [ "$(date +%s)" -lt "$end" ] || { echo "cluster host: controller manager or scheduler not healthy after $lim s" >&2; return 1; }
    sleep 0.5
  done
  echo "controllers $(since "$t0")"
}

cmd_down() {
  local st=$1 c left=
  [ -d "$st/run" ] || { echo "cluster host: nothing was started in $st"; return 0; }
  rm -f "$st/run/t0"   # the supervisor's signal to end
  alive "$st" supervisor && kill -TERM "$(cat "$st/run/supervisor.pid")" 2>/dev/null || true
  # In order, each given 30 s after SIGTERM: the clients first, etcd last (an API server whose
  # etcd is gone drags its shutdown out).
  local t0 n
  t0=$(now)
  for c in $COMPONENTS; do
    alive "$st" "$c" || continue
    kill -TERM "$(cat "$st/run/$c.pid")" 2>/dev/null || true
    n=0
    while alive "$st" "$c" && [ $n -lt 60 ]; do sleep 0.5; n=$((n + 1)); done
    if alive "$st" "$c"; then
      kill -KILL "$(cat "$st/run/$c.pid")" 2>/dev/null || true
      left="$left $c"
    fi
  done
  [ -z "$left" ] || echo "cluster host: still running 30 s after SIGTERM, killed:$left"
  rm -rf "$st/etcd" "$st/apiserver" "$st/kcm" "$st/sched" "$st/pki"
  echo "cluster host: stopped ($COMPONENTS) in $(since "$t0") s"
  [ -z "$left" ]
}

case ${1:-} in
  ports) [ $# = 2 ] || die "usage: host.sh ports STATE"; cmd_ports "$2" ;;
  up) [ $# = 5 ] || die "usage: host.sh up BINDIR CLDIR STATE PID"; cmd_up "$2" "$3" "$4" "$5" ;;
  wait) [ $# = 3 ] || die "usage: host.sh wait STATE SECONDS"; cmd_wait "$2" "$3" ;;
  down) [ $# = 2 ] || die "usage: host.sh down STATE"; cmd_down "$2" ;;
  supervise) [ $# = 3 ] || die "usage: host.sh supervise STATE RUNNER"; cmd_supervise "$2" "$3" ;;
  *) die "usage: host.sh ports|up|wait|down ..." ;;
esac
