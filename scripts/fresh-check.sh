#!/usr/bin/env bash
# fresh-check.sh — try the README's two commands the way a new user would, on a
# Debian that has nothing the project installs itself. Not part of `make test`
# (it takes 10–20 minutes and downloads a few hundred MB of packages).
#
#   1. debootstrap a minimal Debian bookworm (variant minbase) with only git,
#      make, curl and ca-certificates, and copy in this machine's Go
#      (/usr/local/go) — "Debian, as root, with Go 1.26";
#   2. clone this repository (its HEAD) into it;
#   3. enter it in its own network, PID, mount and UTS namespaces: nothing of
#      this machine's services is reachable (its loopback is its own, so
#      Redis, MariaDB and RabbitMQ must be installed and started from scratch
#      by `make services`);
#   4. run `make demo`, then `make test`, printing each command's time and
#      result; exit non-zero if either failed.
#
# The namespace reaches the outside only through a veth pair and a small
# forward proxy on the host side (scripts/fwdproxy), which lets through the
# Debian mirrors and the Go module proxy and nothing else; apt, go and curl
# in the namespace are pointed at it. The host's firewall, routes and
# services are not touched; the namespace, the veth pair and the proxy are
# removed on exit. The CA certificates this host trusts beyond Debian's
# (/usr/local/share/ca-certificates) are copied in, so that HTTPS through the
# host's own egress works as it does on the host.
#
# Environment:
#   FRESH_DIR=/var/tmp/seckill-fresh   where the Debian tree goes
#   FRESH_KEEP=1                       keep the tree afterwards (for a look)
#   FRESH_REUSE_BASE=1                 reuse a bootstrapped base from an
#                                      earlier run (copied, so the run still
#                                      starts from the pristine base)
#   FRESH_MIRROR=http://deb.debian.org/debian
#   FRESH_STEPS="demo test"            which README commands to run
set -euo pipefail

export PATH="$PATH:/usr/local/go/bin:/usr/local/sbin:/usr/sbin:/sbin"
export DEBIAN_FRONTEND=noninteractive

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DIR=${FRESH_DIR:-/var/tmp/seckill-fresh}
MIRROR=${FRESH_MIRROR:-http://deb.debian.org/debian}
STEPS=${FRESH_STEPS:-demo test}
BASE=$DIR/base
ROOT=$DIR/run
NS=seckill-fresh-$$
VH=sfk$$h
VN=sfk$$n
NET=10.211.$(($$ % 250)).
HOST_IP=${NET}1
NS_IP=${NET}2
PROXY_PORT=3128
PROXY_PID=
started=$SECONDS

log() { printf 'fresh-check: %s\n' "$*" >&2; }
die() {
	printf 'fresh-check: ERROR: %s\n' "$*" >&2
	exit 1
}

cleanup() {
	local rc=$?
	[[ -n $PROXY_PID ]] && kill "$PROXY_PID" 2>/dev/null || true
	ip netns del "$NS" 2>/dev/null || true
	ip link del "$VH" 2>/dev/null || true
	if [[ -z ${FRESH_KEEP:-} && -d $ROOT ]]; then
		rm -rf --one-file-system "$ROOT"
	fi
	log "done in $((SECONDS - started)) s (exit $rc)"
}

[[ $EUID -eq 0 ]] || die "needs root (debootstrap, namespaces, veth)"
for t in ip unshare chroot git go; do
	command -v "$t" >/dev/null || die "$t not found"
done
[[ -d /usr/local/go ]] || die "/usr/local/go not found: the check copies this machine's Go into the fresh Debian"
if ! command -v debootstrap >/dev/null; then
	log "installing debootstrap"
	apt-get update -q >/dev/null
	apt-get install -y -q --no-install-recommends debootstrap >/dev/null
fi
trap cleanup EXIT
mkdir -p "$DIR"

# ---- 1. a minimal Debian --------------------------------------------------------
t0=$SECONDS
if [[ -n ${FRESH_REUSE_BASE:-} && -f $BASE/.seckill-base-ok ]]; then
	log "reusing the bootstrapped base in $BASE"
else
	rm -rf --one-file-system "$BASE"
	log "debootstrap bookworm (minbase + git make curl ca-certificates) into $BASE"
	debootstrap --variant=minbase --include=git,make,curl,ca-certificates \
		bookworm "$BASE" "$MIRROR" >"$DIR/debootstrap.log" 2>&1 ||
		{ tail -n 20 "$DIR/debootstrap.log" >&2; die "debootstrap failed (log: $DIR/debootstrap.log)"; }
	touch "$BASE/.seckill-base-ok"
fi
rm -rf --one-file-system "$ROOT"
cp -a "$BASE" "$ROOT"
log "base ready in $((SECONDS - t0)) s"

# Go as a user installs it by hand; the CAs this host trusts; a hostname that
# resolves (RabbitMQ's node name is rabbit@<hostname>).
cp -a /usr/local/go "$ROOT/usr/local/go"
if compgen -G "/usr/local/share/ca-certificates/*" >/dev/null; then
	cp -a /usr/local/share/ca-certificates/. "$ROOT/usr/local/share/ca-certificates/"
	chroot "$ROOT" update-ca-certificates >/dev/null 2>&1 || die "update-ca-certificates failed in the fresh Debian"
fi
printf '127.0.0.1\tlocalhost\n::1\tlocalhost\n127.0.1.1\tfresh\n' >"$ROOT/etc/hosts"
echo fresh >"$ROOT/etc/hostname"
: >"$ROOT/etc/resolv.conf" # no DNS in the namespace: the proxy resolves names
cat >"$ROOT/etc/apt/apt.conf.d/90fresh-check-proxy" <<EOF
Acquire::http::Proxy "http://$HOST_IP:$PROXY_PORT";
Acquire::https::Proxy "http://$HOST_IP:$PROXY_PORT";
EOF

# ---- 2. the repository ------------------------------------------------------------
if [[ -n "$(git -C "$REPO" status --porcelain 2>/dev/null)" ]]; then
	log "note: $REPO has uncommitted changes; the check clones HEAD ($(git -C "$REPO" rev-parse --short HEAD)) only"
fi
git clone -q "$REPO" "$ROOT/root/seckill"
log "cloned $(git -C "$ROOT/root/seckill" log --oneline -1)"

# ---- 3. network: a veth pair and the forward proxy --------------------------------
ip netns add "$NS"
ip link add "$VH" type veth peer name "$VN"
ip link set "$VN" netns "$NS"
ip addr add "$HOST_IP/30" dev "$VH"
ip link set "$VH" up
ip -n "$NS" addr add "$NS_IP/30" dev "$VN"
ip -n "$NS" link set "$VN" up
ip -n "$NS" link set lo up
(cd "$REPO" && go build -o "$DIR/fwdproxy" ./scripts/fwdproxy)
"$DIR/fwdproxy" -listen "$HOST_IP:$PROXY_PORT" 2>"$DIR/fwdproxy.log" &
PROXY_PID=$!
for _ in $(seq 50); do
	timeout 1 bash -c "exec 3<>/dev/tcp/$HOST_IP/$PROXY_PORT" 2>/dev/null && break
	sleep 0.1
done

# ---- 4. the README's commands, inside the namespaces --------------------------------
# PID 1 of the new PID namespace is the bash below: when it exits, every
# service the run started (mariadbd, rabbitmq, redis) ends with it.
inner=$(
	cat <<'EOS'
set -u
cd /root/seckill
status=0
for step in $STEPS; do
	t=$SECONDS
	printf '\nfresh-check: === make %s ===\n' "$step"
	if make "$step" >"/root/make-$step.log" 2>&1; then r=ok; else r="FAIL (exit $?)"; status=1; fi
	tail -n 25 "/root/make-$step.log"
	printf 'fresh-check: RESULT make %s: %s in %d s\n' "$step" "$r" $((SECONDS - t))
	if [ "$r" != ok ]; then
		printf 'fresh-check: failures of make %s:\n' "$step"
		grep -E -A3 '^(--- FAIL|FAIL|panic:)' "/root/make-$step.log" | head -n 60
	fi
	if [ "$step" = test ]; then
		printf 'fresh-check: go test: %s packages ok, %s FAIL lines\n' \
			"$(grep -c '^ok ' "/root/make-$step.log")" "$(grep -c '^FAIL' "/root/make-$step.log")"
	fi
done
exit $status
EOS
)
log "running: make ${STEPS// /, make } in namespace $NS (logs kept in $ROOT/root when FRESH_KEEP=1)"
set +e
ip netns exec "$NS" unshare --pid --fork --uts --mount --propagation private bash -c '
	set -e
	R=$1
	mount -t proc proc "$R/proc"
	mount --rbind /dev "$R/dev"
	mount -t sysfs sysfs "$R/sys"
	mount -t tmpfs tmpfs "$R/tmp"
	mount -t tmpfs tmpfs "$R/run"
	hostname fresh
	exec chroot "$R" /usr/bin/env -i HOME=/root TERM=dumb LANG=C.UTF-8 \
		PATH=/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
		http_proxy="http://$2" https_proxy="http://$2" HTTP_PROXY="http://$2" HTTPS_PROXY="http://$2" \
		no_proxy=localhost,127.0.0.1,::1 NO_PROXY=localhost,127.0.0.1,::1 \
		GOPROXY="$3" STEPS="$4" bash -c "$5"
' fresh "$ROOT" "$HOST_IP:$PROXY_PORT" "$(go env GOPROXY)" "$STEPS" "$inner"
rc=$?
set -e
if [[ -s $DIR/fwdproxy.log ]] && grep -q refused "$DIR/fwdproxy.log"; then
	log "the proxy refused these hosts:"
	grep refused "$DIR/fwdproxy.log" | sed 's/^/  /' >&2
fi
log "total $((SECONDS - started)) s; $([[ $rc -eq 0 ]] && echo 'every step ok' || echo 'a step FAILED')"
exit $rc
