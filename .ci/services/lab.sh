#!/usr/bin/env bash
# A lab of hosts on this machine for the multi-host tests (tests/engine/test_lab.py, docs/lab.md).
#
# Each host is a network namespace on a Linux bridge with its own address and its own sshd (root logs in
# with a key this script generates); the file system stays shared, like NFS, so `python -m engine...` works
# on every host. Everything stays on the lab's own addresses: the bridge cdbr0 is 10.99.0.1/24 (this
# machine, where the launcher runs), host labN is the namespace cdlabN at 10.99.0.(10+N), reached through
# the veth pair cdlabN-v (bridge side) / cdlabN-p (inside); each sshd listens on its host's address only.
# Each host is a one-core machine: its sshd (so everything started there over ssh) runs on core (N-1) mod nproc
# (LAB_PIN=0: on every core).
#
#   lab.sh up          create (or complete) the lab; idempotent; waits until every host accepts ssh
#   lab.sh down        remove every namespace, veth and the bridge; end the lab's sshds and their sessions
#   lab.sh status      say what is there (exit 0 when the lab is up and every sshd answers)
#   lab.sh cut HOST    a partition: the host's link goes down (lab.sh heal HOST brings it back)
#   lab.sh heal HOST
#   lab.sh sshd-stop HOST / sshd-start HOST    the host's sshd alone
#   lab.sh slow HOST [PERCENT]   a slower host: all it runs gets PERCENT (30) of one core (a CPU cgroup's quota)
#   lab.sh unslow HOST
#
# Root is needed (namespaces, links). Files: /tmp/clusterdeck-lab (CLUSTERDECK_LAB_DIR): the client key
# id_ed25519, ssh_config (Host lab1, lab2, ...: `ssh -F /tmp/clusterdeck-lab/ssh_config lab1`), each
# sshd's config, pid file and log. LAB_HOSTS (3, at most 8) sets how many hosts `up` creates.
set -euo pipefail

DIR=${CLUSTERDECK_LAB_DIR:-/tmp/clusterdeck-lab}
HOSTS=${LAB_HOSTS:-3}
BRIDGE=cdbr0
NET=10.99.0
SSHD=$(command -v sshd || echo /usr/sbin/sshd)

say() { echo "lab.sh: $*" >&2; }

need_root() {
  if [ "$(id -u)" != 0 ]; then
    say "needs root (network namespaces, links)"; exit 1
  fi
  if ! command -v ip >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
    say "installing iproute2"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2) >/dev/null 2>&1 || true
  fi
  command -v ip >/dev/null 2>&1 || { say "the ip command (iproute2) is missing"; exit 1; }
  [ -x "$SSHD" ] || { say "sshd is missing (apt-get install openssh-server)"; exit 1; }
}

index_of() {  # lab2 -> 2
  local name=$1
  case "$name" in
    lab[1-8]) echo "${name#lab}" ;;
    *) say "unknown host '$name': expected lab1..lab8"; exit 2 ;;
  esac
}

sshd_alive() {  # the host's sshd runs (its pid file names a live sshd)
  local n=$1 pid
  [ -f "$DIR/sshd-lab$n.pid" ] || return 1
  pid=$(cat "$DIR/sshd-lab$n.pid" 2>/dev/null || true)
  [ -n "$pid" ] && [ -r "/proc/$pid/comm" ] && grep -q sshd "/proc/$pid/comm"
}

keys() {
  mkdir -p "$DIR"
  chmod 700 "$DIR"
  [ -f "$DIR/host_key" ] || ssh-keygen -q -t ed25519 -N "" -C clusterdeck-lab-host -f "$DIR/host_key"
  [ -f "$DIR/id_ed25519" ] || ssh-keygen -q -t ed25519 -N "" -C clusterdeck-lab -f "$DIR/id_ed25519"
  cp "$DIR/id_ed25519.pub" "$DIR/authorized_keys"
  chmod 600 "$DIR/authorized_keys"
  local n cfg="$DIR/ssh_config.tmp"
  : >"$cfg"
  for n in $(seq 1 8); do
    cat >>"$cfg" <<EOF
Host lab$n
  HostName $NET.$((10 + n))
  User root
  IdentityFile $DIR/id_ed25519
  IdentitiesOnly yes
  StrictHostKeyChecking no
  UserKnownHostsFile /dev/null
  ConnectTimeout 3
  SendEnv CLUSTERDECK_TEST_SESSION

EOF
  done
  mv "$cfg" "$DIR/ssh_config"
}

host_up() {
  local n=$1 ns=cdlab$1 addr=$NET.$((10 + $1))
  ip netns list | grep -qw "^$ns" || ip netns add "$ns"
  if ! ip link show "$ns-v" >/dev/null 2>&1; then
    ip link add "$ns-v" type veth peer name "$ns-p"
    ip link set "$ns-p" netns "$ns"
  fi
  ip link set "$ns-v" master "$BRIDGE"
  ip link set "$ns-v" up
  ip netns exec "$ns" ip link set lo up
  ip netns exec "$ns" ip addr replace "$addr/24" dev "$ns-p"
  ip netns exec "$ns" ip link set "$ns-p" up
  sshd_start "$n"
}

sshd_start() {
  local n=$1 ns=cdlab$1 addr=$NET.$((10 + $1))
  sshd_alive "$n" && return 0
  mkdir -p /run/sshd
  cat >"$DIR/sshd-lab$n.conf" <<EOF
ListenAddress $addr
Port 22
HostKey $DIR/host_key
AuthorizedKeysFile $DIR/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
AcceptEnv CLUSTERDECK_*
MaxStartups 64
MaxSessions 64
PidFile $DIR/sshd-lab$n.pid
LogLevel ERROR
EOF
  # each host is a one-core machine: its sshd, and so all that runs there over ssh, on core (N-1) mod nproc
  local pin=()
  if [ "${LAB_PIN:-1}" = 1 ] && command -v taskset >/dev/null 2>&1; then
    pin=(taskset -c "$(( (n - 1) % $(nproc) ))")
  fi
  ip netns exec "$ns" "${pin[@]}" "$SSHD" -f "$DIR/sshd-lab$n.conf" -E "$DIR/sshd-lab$n.log"
}

sshd_stop() {
  local n=$1 pid
  if sshd_alive "$n"; then
    pid=$(cat "$DIR/sshd-lab$n.pid")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do sshd_alive "$n" || break; sleep 0.05; done
  fi
  rm -f "$DIR/sshd-lab$n.pid"
}

cpu_group() {  # the host's CPU cgroup folder (cgroup v1 cpu controller, else v2 with cpu enabled), or nothing
  local n=$1
  if [ -w /sys/fs/cgroup/cpu/cgroup.procs ] || [ -d /sys/fs/cgroup/cpu/cdlab$n ]; then
    echo "/sys/fs/cgroup/cpu/cdlab$n"
  elif grep -qw cpu /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null; then
    echo "/sys/fs/cgroup/cdlab$n"
  fi
}

slow() {  # the host gets PERCENT of one core from now on: everything running there, and what starts there later
  local n=$1 percent=$2 group pid
  group=$(cpu_group "$n")
  [ -n "$group" ] || { say "no writable cpu cgroup here: a host cannot be slowed"; exit 1; }
  mkdir -p "$group"
  if [ -f "$group/cpu.cfs_quota_us" ]; then
    echo 10000 >"$group/cpu.cfs_period_us"
    echo $((percent * 100)) >"$group/cpu.cfs_quota_us"
  else
    echo "$((percent * 100)) 10000" >"$group/cpu.max"
  fi
  for pid in $(ip netns pids "cdlab$n"); do echo "$pid" >"$group/cgroup.procs" 2>/dev/null || true; done
}

unslow() {  # the host's processes back in the root cgroup; its cgroup removed
  local n=$1 group pid root
  group=$(cpu_group "$n")
  [ -n "$group" ] && [ -d "$group" ] || return 0
  root=$(dirname "$group")
  for pid in $(cat "$group/cgroup.procs" 2>/dev/null); do echo "$pid" >"$root/cgroup.procs" 2>/dev/null || true; done
  rmdir "$group" 2>/dev/null || true
}

answers() {  # root logs in on labN
  ssh -F "$DIR/ssh_config" -o BatchMode=yes -o ConnectTimeout=2 "lab$1" true >/dev/null 2>&1
}

up() {
  need_root
  keys
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    ip link add "$BRIDGE" type bridge
  fi
  ip addr replace "$NET.1/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  local n
  for n in $(seq 1 "$HOSTS"); do host_up "$n"; done
  for n in $(seq 1 "$HOSTS"); do
    local ok=0
    for _ in $(seq 100); do
      if answers "$n"; then ok=1; break; fi
      sleep 0.1
    done
    if [ "$ok" != 1 ]; then
      say "lab$n ($NET.$((10 + n))) does not accept ssh; its sshd log: $(tail -n 3 "$DIR/sshd-lab$n.log" 2>/dev/null)"
      exit 1
    fi
  done
  say "up: $(seq -s ' ' -f 'lab%g' 1 "$HOSTS") on $BRIDGE ($NET.1/24); ssh -F $DIR/ssh_config lab1"
}

down() {
  need_root
  local ns n
  for n in $(seq 1 8); do sshd_stop "$n"; unslow "$n"; done
  for ns in $(ip netns list | awk '{print $1}' | grep -E '^cdlab[1-8]$' || true); do
    # whatever still runs in the host (its ssh sessions, tasks): ended with it
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$ns"
  done
  for n in $(seq 1 8); do
    ip link show "cdlab$n-v" >/dev/null 2>&1 && ip link del "cdlab$n-v"
  done
  if ip link show "$BRIDGE" >/dev/null 2>&1; then ip link del "$BRIDGE"; fi
  say "down: no cdlab namespace, veth or $BRIDGE left"
}

status() {
  local n bad=0 any=0
  ip link show "$BRIDGE" >/dev/null 2>&1 || { echo "no lab ($BRIDGE missing)"; return 1; }
  for n in $(seq 1 8); do
    ip netns list | grep -qw "^cdlab$n" || continue
    any=1
    local link state sshd
    link=$(ip -o link show "cdlab$n-v" 2>/dev/null | grep -q 'state UP\|,UP' && echo up || echo down)
    sshd=$(sshd_alive "$n" && echo running || echo stopped)
    state=$(answers "$n" && echo answers || { bad=1; echo "does not answer"; })
    echo "lab$n $NET.$((10 + n)) link $link, sshd $sshd, ssh $state"
  done
  [ "$any" = 1 ] && [ "$bad" = 0 ]
}

cmd=${1:-}
case "$cmd" in
  up) up ;;
  down) down ;;
  status) status ;;
  cut) need_root; ip link set "cdlab$(index_of "${2:?host}")-v" down ;;
  heal) need_root; ip link set "cdlab$(index_of "${2:?host}")-v" up ;;
  sshd-stop) need_root; sshd_stop "$(index_of "${2:?host}")" ;;
  sshd-start) need_root; sshd_start "$(index_of "${2:?host}")" ;;
  slow) need_root; slow "$(index_of "${2:?host}")" "${3:-30}" ;;
  unslow) need_root; unslow "$(index_of "${2:?host}")" ;;
  *) echo "usage: $0 up|down|status|cut HOST|heal HOST|sshd-stop HOST|sshd-start HOST|slow HOST [PERCENT]|unslow HOST" >&2
     exit 2 ;;
esac
