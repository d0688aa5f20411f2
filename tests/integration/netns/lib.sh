# netns/lib.sh: a private network of N "hosts" on this machine, for tests
# that must cross real interfaces (sourced by test_netns.sh; also usable by
# hand: `. tests/integration/netns/lib.sh; netns_up demo 4; ...; netns_down demo`).
#
# Topology, all inside namespaces the caller names by TAG (nothing is added
# to the root namespace, so the addresses below exist only in the sandbox):
#   TAG-br        a namespace holding bridge br0 and one veth end per host
#   TAG-h0 ...    one namespace per host: lo, and eth0 (the other veth end)
#                 with address 10.200.0.(10+i)/24
# Traffic between hosts leaves one namespace through eth0, crosses the veth
# pair and the bridge, and enters the other through its eth0.
#
# netns_check             0 when namespaces can be made here, else prints why
# netns_up TAG N          build it (fails loudly on any step)
# netns_down TAG          kill every process left in TAG's namespaces, delete
#                         them (their veths go with them); safe to repeat
# netns_name TAG i        the namespace of host i
# netns_addr i            host i's address
# netns_exec TAG i CMD..  run CMD in host i's namespace
# netns_scratch TAG NAME  the test's scratch dir T=/tmp/pw-NAME.XXXXXX and, on
#                         any exit, its cleanup: the pids in PIDS killed, TAG's
#                         namespaces deleted, T removed (KEEP=1 keeps it)
# ${NETNS_PRIVATE[@]}     a command prefix: a private filesystem (private_host.sh)

NETNS_SUBNET=10.200.0
# The system python starts in 0.1 s; a pyenv shim can take seconds.
NETNS_PY=$([ -x /usr/bin/python3 ] && echo /usr/bin/python3 || echo python3)

netns_name() { echo "$1-h$2"; }
netns_addr() { echo "$NETNS_SUBNET.$((10 + $1))"; }
netns_exec() { local tag=$1 i=$2; shift 2; ip netns exec "$(netns_name "$tag" "$i")" "$@"; }

netns_check() {
  if ! command -v ip >/dev/null 2>&1; then
    echo "the ip command (iproute2) is missing"
    return 1
  fi
  local probe="pwprobe-$$-$RANDOM" out
  if ! out=$(ip netns add "$probe" 2>&1); then
    echo "'ip netns add' is not permitted here: $out"
    return 1
  fi
  if ! out=$(ip -n "$probe" link add br0 type bridge 2>&1 &&
             ip -n "$probe" link add va type veth peer name vb 2>&1); then
    ip netns del "$probe" 2>/dev/null
    echo "cannot make bridges or veth pairs in a namespace: $out"
    return 1
  fi
  ip netns del "$probe"
  return 0
}

netns_up() {
  local tag=$1 n=$2 br="$1-br" i ns
  ip netns add "$br" || return 1
  ip -n "$br" link set lo up &&
  ip -n "$br" link add br0 type bridge &&
  ip -n "$br" link set br0 up || return 1
  for ((i = 0; i < n; i++)); do
    ns=$(netns_name "$tag" "$i")
    ip netns add "$ns" || return 1
    ip -n "$ns" link set lo up &&
    ip -n "$br" link add "v$i" type veth peer name eth0 netns "$ns" &&
    ip -n "$br" link set "v$i" master br0 &&
    ip -n "$br" link set "v$i" up &&
    ip -n "$ns" addr add "$(netns_addr "$i")/24" dev eth0 &&
    ip -n "$ns" link set eth0 up || return 1
  done
}

netns_down() {
  local tag=$1 ns pids
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$tag-(br|h[0-9]+)\$"); do
    pids=$(ip netns pids "$ns" 2>/dev/null)
    if [ -n "$pids" ]; then
      kill $pids 2>/dev/null
      sleep 0.5
      pids=$(ip netns pids "$ns" 2>/dev/null)
      [ -z "$pids" ] || kill -9 $pids 2>/dev/null
    fi
    ip netns del "$ns" 2>/dev/null
  done
  return 0
}

netns_scratch() {
  NETNS_TAG=$1
  T=$(mktemp -d "/tmp/pw-$2.XXXXXX") && chmod 755 "$T" || return 1
  PIDS=()
  trap netns_cleanup EXIT
  trap 'exit 130' INT TERM
}

netns_cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  netns_down "$NETNS_TAG"
  if [ "${KEEP:-0}" = 1 ]; then echo "kept $T"; else rm -rf "$T"; fi
}

# Bytes received and sent on host i's eth0 ("RX TX").
netns_eth0_bytes() {
  netns_exec "$1" "$2" cat /sys/class/net/eth0/statistics/rx_bytes /sys/class/net/eth0/statistics/tx_bytes | tr '\n' ' '
}

# A TCP round trip from host j to host i (a ping without iputils): 0 when
# host i's listener got "ping" and host j got "pong" back.
netns_probe() {
  local tag=$1 i=$2 j=$3 port=$((20000 + RANDOM % 20000)) lpid rc
  netns_exec "$tag" "$i" "$NETNS_PY" -c '
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1); s.settimeout(5)
c, _ = s.accept(); c.settimeout(5)
sys.exit(0 if c.recv(4) == b"ping" and c.sendall(b"pong") is None else 1)' "$(netns_addr "$i")" "$port" &
  lpid=$!
  netns_exec "$tag" "$j" "$NETNS_PY" -c '
import socket, sys, time
for _ in range(50):
    try:
        c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2); break
    except OSError:
        time.sleep(0.1)
else:
    sys.exit("cannot connect to %s:%s" % (sys.argv[1], sys.argv[2]))
c.sendall(b"ping"); c.settimeout(5)
sys.exit(0 if c.recv(4) == b"pong" else 1)' "$(netns_addr "$i")" "$port"
  rc=$?
  wait "$lpid" || rc=1
  return $rc
}

# A host with a private filesystem: host i's network namespace, a mount
# namespace of its own, and private_host.sh in it (see there). Spelt out at
# the call, not wrapped in a function, so that `... &` leaves the daemon
# itself in $! (a function would leave the subshell running it):
#   ip netns exec "$(netns_name TAG i)" "${NETNS_PRIVATE[@]}" ROOT HOST [--put NAME=FILE].. -- CMD.. &
NETNS_PRIVATE=(unshare --mount --propagation private bash "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/private_host.sh")
