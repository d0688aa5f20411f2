#!/bin/sh
# install.sh: the system side of installing pipewright, after the files are
# in place (`cmake --install` runs it; it is also installed as
# PREFIX/share/pipewright/deploy/install.sh to run again by hand).
#
#   install.sh setup  [--confdir DIR] [--templates DIR] [--datadir DIR] [--destdir DIR] [--system yes|no]
#       Makes CONFDIR (default /etc/pipewright) with coordinator.conf and
#       worker.conf from the templates when absent (an edited config is
#       never overwritten; @PW_DATADIR@ in them becomes DATADIR, the
#       installed share/pipewright, by default the templates' parent), and the two tokens when absent: api.token (REST
#       API clients) and cluster.token (workers; copy the coordinator's to
#       every worker host). As root on the real system (no --destdir, and
#       not --system no; cmake says no when CONFDIR is outside /etc) it also
#       makes the `pipewright` system user and group the services run as —
#       tokens are then 0640 root:pipewright, so group members can use the
#       CLI — and reloads systemd.
#       Otherwise the tokens are 0600, owned by whoever installs. The services
#       get the tokens as systemd credentials, readable only by them.
#       Idempotent: running it again changes nothing that exists.
#
#   install.sh tokens [--confdir DIR]
#       Only the two tokens, when absent (0640 root:pipewright when that
#       group exists): what the pipewright-coordinator package runs.
#
#   install.sh worker N [--cpus LIST] [--threads T] [--listen ADDR:PORT]
#                       [--coordinator HOST:PORT] [--confdir DIR] [--dropin-dir DIR]
#       Configures instance N of pipewright-worker@.service: writes
#       CONFDIR/worker-N.conf and, with --cpus, the drop-in
#       DIR/pipewright-worker@N.service.d/cpus.conf (DIR: /etc/systemd/system) that pins
#       it (CPUAffinity=LIST; --threads defaults to the number of CPUs in
#       LIST). Then: systemctl enable --now pipewright-worker@N
set -eu

die() { echo "install.sh: $*" >&2; exit 1; }

confdir=/etc/pipewright
templates=$(cd "$(dirname "$0")" && pwd)
datadir=""
destdir=""
want_system=yes

make_token() { # FILE: 32 random bytes as 64 hex digits
  (umask 077 && od -An -N32 -tx1 /dev/urandom | tr -d ' \n' >"$1.tmp" && echo >>"$1.tmp" && mv "$1.tmp" "$1")
}

# tokens DIR GROUP: DIR/api.token and DIR/cluster.token when absent; 0640
# root:GROUP with a GROUP, else 0600.
tokens() {
  for t in api cluster; do
    f="$1/$t.token"
    if [ -s "$f" ]; then
      echo "install.sh: $f exists, kept"
    else
      make_token "$f"
      if [ -n "$2" ]; then
        chown root:"$2" "$f"
        chmod 0640 "$f"
      else
        chmod 0600 "$f"
      fi
      echo "install.sh: made $f ($(stat -c '%a %U:%G' "$f"))"
    fi
    # Never readable by everyone, even if someone loosened it.
    if [ -n "$(find "$f" -perm /o=rwx)" ]; then
      chmod o-rwx "$f"
      echo "install.sh: $f was accessible to others: fixed" >&2
    fi
  done
}

setup() {
  while [ $# -gt 0 ]; do
    case $1 in
      --confdir) confdir=$2; shift 2 ;;
      --templates) templates=$2; shift 2 ;;
      --datadir) datadir=$2; shift 2 ;;
      --destdir) destdir=$2; shift 2 ;;
      --system) want_system=$2; shift 2 ;;
      *) die "setup: unknown option $1" ;;
    esac
  done
  dir="$destdir$confdir"
  system=no
  if [ "$want_system" = yes ] && [ -z "$destdir" ] && [ "$(id -u)" -eq 0 ]; then system=yes; fi
  mkdir -p "$dir"
  chmod 0755 "$dir"
  for f in coordinator.conf worker.conf; do
    if [ -e "$dir/$f" ]; then
      echo "install.sh: $dir/$f exists, kept"
    else
      [ -f "$templates/$f" ] || die "no template $templates/$f"
      sed "s|@PW_DATADIR@|${datadir:-$(dirname "$templates")}|g" "$templates/$f" >"$dir/$f.tmp"
      chmod 0644 "$dir/$f.tmp"
      mv "$dir/$f.tmp" "$dir/$f"
      echo "install.sh: wrote $dir/$f"
    fi
  done
  group=""
  if [ $system = yes ]; then
    # The services' user (no home, no shell; DynamicUser= uses it when it
    # exists) and its group, whose members may read the tokens.
    if ! getent passwd pipewright >/dev/null 2>&1; then
      if command -v useradd >/dev/null 2>&1; then
        if getent group pipewright >/dev/null 2>&1; then g="-g pipewright"; else g="--user-group"; fi
        # shellcheck disable=SC2086
        useradd --system $g --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin \
          --comment "pipewright services" pipewright && echo "install.sh: made system user pipewright"
      else
        echo "install.sh: no useradd; the services get a transient user, tokens stay root-only" >&2
      fi
    fi
    getent group pipewright >/dev/null 2>&1 && group=pipewright
  fi
  tokens "$dir" "$group"
  if [ $system = yes ] && [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
    systemctl daemon-reload
    echo "install.sh: systemd reloaded; start with: systemctl enable --now pipewright-coordinator pipewright-worker@1"
  fi
}

count_cpus() { # "0-3,6" -> 5
  echo "$1" | tr ',' '\n' | awk -F- 'NF==1{n++} NF==2{n+=$2-$1+1} END{print n+0}'
}

worker() {
  [ $# -ge 1 ] || die "worker: give the instance name N"
  n=$1; shift
  case $n in *[!A-Za-z0-9_.-]*|"") die "worker: instance name '$n' must be letters, digits, _ . -" ;; esac
  cpus="" threads="" listen="" coord="" dropins=/etc/systemd/system
  while [ $# -gt 0 ]; do
    case $1 in
      --cpus) cpus=$2; shift 2 ;;
      --threads) threads=$2; shift 2 ;;
      --listen) listen=$2; shift 2 ;;
      --coordinator) coord=$2; shift 2 ;;
      --confdir) confdir=$2; shift 2 ;;
      --dropin-dir) dropins=$2; shift 2 ;;
      *) die "worker: unknown option $1" ;;
    esac
  done
  if [ -n "$cpus" ]; then
    case $cpus in *[!0-9,-]*) die "worker: --cpus '$cpus' must be a list like 0-3,8" ;; esac
    [ -n "$threads" ] || threads=$(count_cpus "$cpus")
  fi
  mkdir -p "$confdir"
  f="$confdir/worker-$n.conf"
  {
    echo "# pipewright-worker@$n: made by install.sh worker $n"
    [ -z "$threads" ] || echo "PW_THREADS=$threads"
    [ -z "$listen" ] || echo "PW_LISTEN=$listen"
    [ -z "$coord" ] || echo "PW_COORDINATOR=$coord"
  } >"$f"
  chmod 0644 "$f"
  echo "install.sh: wrote $f"
  if [ -n "$cpus" ]; then
    d="$dropins/pipewright-worker@$n.service.d"
    mkdir -p "$d"
    printf '# made by install.sh worker %s --cpus %s\n[Service]\nCPUAffinity=%s\n' "$n" "$cpus" "$cpus" >"$d/cpus.conf"
    echo "install.sh: wrote $d/cpus.conf (CPUAffinity=$cpus)"
  fi
  if [ "$dropins" = /etc/systemd/system ] && [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
    systemctl daemon-reload
  fi
  echo "install.sh: start it with: systemctl enable --now pipewright-worker@$n"
}

cmd=${1:-setup}
[ $# -eq 0 ] || shift
case $cmd in
  setup) setup "$@" ;;
  tokens) # [--confdir DIR]: the packages' postinst
    [ "${1:-}" != --confdir ] || confdir=$2
    g=""; getent group pipewright >/dev/null 2>&1 && g=pipewright
    tokens "$confdir" "$g" ;;
  worker) worker "$@" ;;
  -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0" ;;
  *) die "unknown command '$cmd' (setup | tokens | worker)" ;;
esac
