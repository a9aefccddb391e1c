#!/usr/bin/env bash
# services.sh — bring Redis, MariaDB and RabbitMQ up on this machine (Debian
# bookworm, as root) for the tests and the demo. Called by `make services`.
#
#   * Quick and idempotent: a service that already answers is left alone
#     (never stopped or restarted).
#   * A service that is installed but not running is started.
#   * A service that is not installed is installed with apt-get (one
#     `apt-get update`, then `apt-get install -y --no-install-recommends` of
#     the missing packages: the servers and what they depend on, no mail
#     server or other Recommends).
#   * Every start is followed by a bounded wait for readiness; a service that
#     does not come up fails the script, naming the service.
#   * MariaDB: root must be able to log in over TCP 127.0.0.1:3306 with no
#     password (what the tests and conf/seckill.toml expect); fixed if not.
#     Readiness is checked on 127.0.0.1:3306 itself, and the mariadbd this
#     script starts is tracked by its own pid file, so another mariadbd on the
#     machine (another port or socket) is neither mistaken for ours nor
#     waited on.
#
# Environment:
#   SERVICES_TIMEOUT=60     seconds to wait for each service to become ready
#   SERVICES_DRY_RUN=1      print what would be done, change nothing
#   SERVICES_ASSUME_DOWN="redis mariadb rabbitmq"     (dry run only) treat these
#   SERVICES_ASSUME_MISSING="redis mariadb rabbitmq"  as down / not installed,
#                           to exercise the start and install paths
set -euo pipefail

export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"
export DEBIAN_FRONTEND=noninteractive

TIMEOUT="${SERVICES_TIMEOUT:-60}"
DRY_RUN="${SERVICES_DRY_RUN:-}"
ASSUME_DOWN=" ${SERVICES_ASSUME_DOWN:-} "
ASSUME_MISSING=" ${SERVICES_ASSUME_MISSING:-} "
if [[ -z "$DRY_RUN" ]]; then
	ASSUME_DOWN="  "
	ASSUME_MISSING="  "
fi

SERVICES=(redis mariadb rabbitmq)
declare -A PKG=([redis]=redis-server [mariadb]=mariadb-server [rabbitmq]=rabbitmq-server)
declare -A BIN=([redis]=redis-server [mariadb]=mariadbd [rabbitmq]=rabbitmq-server)
declare -A ADDR=([redis]=127.0.0.1:6379 [mariadb]=127.0.0.1:3306 [rabbitmq]=127.0.0.1:5672)
declare -A STATUS=()
MARIADB_PIDFILE=/run/mysqld/seckill-services.pid

log() { printf 'services: %s\n' "$*" >&2; }
die() {
	printf 'services: ERROR: %s\n' "$*" >&2
	exit 1
}

# run CMD... — execute, or only print under SERVICES_DRY_RUN.
run() {
	if [[ -n "$DRY_RUN" ]]; then
		printf 'services: [dry-run]' >&2
		printf ' %q' "$@" >&2
		printf '\n' >&2
		return 0
	fi
	"$@"
}

port_open() { timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null; }

# ---- readiness checks -------------------------------------------------------

redis_ready() {
	[[ "$(timeout 5 redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null)" == "PONG" ]]
}

# The server on 127.0.0.1:3306, over TCP (not whichever mariadbd owns the
# default socket). mariadb-admin may exit 0 while printing an error: trust its
# output only. "Access denied" also proves a server answers there; the login
# is fixed by ensure_mariadb_root_tcp.
mariadb_ready() {
	port_open 3306 &&
		timeout 10 mariadb-admin --protocol=TCP -h127.0.0.1 -P3306 -uroot ping 2>&1 |
		grep -q -E 'mysqld is alive|Access denied'
}

mariadb_tcp_root_ok() {
	timeout 10 mariadb --protocol=TCP -h127.0.0.1 -P3306 -uroot -e 'select 1' >/dev/null 2>&1
}

rabbitmq_ready() {
	port_open 5672 && timeout 30 rabbitmqctl await_startup >/dev/null 2>&1
}

ready() {
	[[ "$ASSUME_DOWN" == *" $1 "* ]] && return 1
	command -v "${BIN[$1]}" >/dev/null 2>&1 || return 1
	"$1_ready"
}

installed() {
	[[ "$ASSUME_MISSING" == *" $1 "* ]] && return 1
	command -v "${BIN[$1]}" >/dev/null 2>&1
}

# wait_ready SERVICE — poll until ready or TIMEOUT seconds have passed.
wait_ready() {
	local svc=$1 deadline=$((SECONDS + TIMEOUT))
	if [[ -n "$DRY_RUN" ]]; then
		log "[dry-run] would wait up to ${TIMEOUT}s for $svc"
		return 0
	fi
	until "${svc}_ready"; do
		if ((SECONDS >= deadline)); then
			return 1
		fi
		sleep 1
	done
}

show_log() {
	local f
	for f in "$@"; do
		[[ -r "$f" ]] || continue
		log "last lines of $f:"
		tail -n 20 "$f" >&2 || true
	done
}

# ---- starting -----------------------------------------------------------------

start_redis() {
	run mkdir -p /var/lib/redis /var/log/redis
	run redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 \
		--save "" --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log
}

start_mariadb() {
	# The socket/pid directory lives on tmpfs: recreate it for user mysql.
	run install -d -o mysql -g mysql -m 0755 /run/mysqld
	if [[ ! -d /var/lib/mysql/mysql ]]; then
		run mariadb-install-db --user=mysql --datadir=/var/lib/mysql >/dev/null
	fi
	# mariadbd refuses to run as root: --user=mysql makes it drop privileges
	# whatever my.cnf says. The pid file names the process this script
	# started: --oknodo then leaves only that one alone, not any mariadbd on
	# the machine. Port and address are given, not taken from my.cnf.
	run start-stop-daemon --start --oknodo --background \
		--pidfile "$MARIADB_PIDFILE" --make-pidfile \
		--exec /usr/sbin/mariadbd -- --user=mysql --port=3306 --bind-address=127.0.0.1
}

# Fallback when mariadbd did not come up from start_mariadb.
start_mariadb_service() {
	if [[ -x /etc/init.d/mariadb ]]; then
		run service mariadb start
	else
		return 1
	fi
}

start_rabbitmq() {
	# Takes ~7 s; wait_ready polls port 5672, then `rabbitmqctl await_startup`.
	run rabbitmq-server -detached
}

# Debian's root@localhost uses unix_socket auth: add the empty TCP password the
# tests use (root@localhost also covers TCP from 127.0.0.1 when names resolve;
# root@127.0.0.1 covers skip-name-resolve).
ensure_mariadb_root_tcp() {
	if [[ "$ASSUME_DOWN$ASSUME_MISSING" != *" mariadb "* ]] && mariadb_tcp_root_ok; then
		return 0
	fi
	log "mariadb: allowing root over TCP 127.0.0.1:3306 with an empty password"
	run mariadb -uroot -e "
ALTER USER root@localhost IDENTIFIED VIA mysql_native_password USING PASSWORD('') OR unix_socket;
CREATE USER IF NOT EXISTS root@'127.0.0.1' IDENTIFIED VIA mysql_native_password USING PASSWORD('');
GRANT ALL PRIVILEGES ON *.* TO root@'127.0.0.1' WITH GRANT OPTION;
FLUSH PRIVILEGES;"
	if [[ -z "$DRY_RUN" ]] && ! mariadb_tcp_root_ok; then
		die "mariadb: root still cannot log in with 'mariadb -h127.0.0.1 -uroot'"
	fi
}

# ---- main ---------------------------------------------------------------------

need_root() {
	if [[ $EUID -ne 0 && -z "$DRY_RUN" ]]; then
		die "$1 needs root (or start the services yourself: redis ${ADDR[redis]}, mariadb ${ADDR[mariadb]}, rabbitmq ${ADDR[rabbitmq]})"
	fi
}

main() {
	local svc down=() missing=() pkgs=()

	for svc in "${SERVICES[@]}"; do
		if ready "$svc"; then
			STATUS[$svc]="already running"
		else
			down+=("$svc")
			installed "$svc" || missing+=("$svc")
		fi
	done

	# Install what is missing (the packages' own scripts may start them).
	if ((${#missing[@]})); then
		for svc in "${missing[@]}"; do pkgs+=("${PKG[$svc]}"); done
		need_root "installing ${pkgs[*]}"
		log "installing ${pkgs[*]}"
		run apt-get update -q
		# A package whose own start fails in a container (no init system) can
		# make apt-get exit non-zero: go on when the binary is there, start below.
		run apt-get install -y -q --no-install-recommends "${pkgs[@]}" ||
			log "apt-get install reported an error; continuing if the binaries are installed"
		for svc in "${missing[@]}"; do
			if [[ -z "$DRY_RUN" ]] && ! command -v "${BIN[$svc]}" >/dev/null 2>&1; then
				die "$svc: ${PKG[$svc]} installed but ${BIN[$svc]} not found"
			fi
		done
	fi

	# Start every service that is still down, then wait for each.
	local to_start=()
	for svc in ${down[@]+"${down[@]}"}; do
		if [[ -z "$DRY_RUN" ]] && "${svc}_ready"; then
			STATUS[$svc]="started by its package"
			continue
		fi
		need_root "starting $svc"
		log "starting $svc"
		"start_$svc" || die "$svc: start command failed"
		to_start+=("$svc")
	done
	for svc in ${to_start[@]+"${to_start[@]}"}; do
		if wait_ready "$svc"; then
			STATUS[$svc]="started"
			continue
		fi
		case $svc in
		redis) show_log /var/log/redis/ci.log ;;
		rabbitmq) show_log /var/log/rabbitmq/rabbit@*.log ;;
		mariadb)
			log "mariadb: not ready after ${TIMEOUT}s, trying 'service mariadb start'"
			if start_mariadb_service && wait_ready mariadb; then
				STATUS[$svc]="started (service)"
				continue
			fi
			show_log /var/lib/mysql/*.err /var/log/mysql/error.log
			;;
		esac
		die "$svc did not become ready at ${ADDR[$svc]} within ${TIMEOUT}s"
	done

	ensure_mariadb_root_tcp

	for svc in "${SERVICES[@]}"; do
		printf '%-9s %-15s %s\n' "$svc" "${ADDR[$svc]}" "${STATUS[$svc]}${DRY_RUN:+ (dry run)}"
	done
}

main "$@"
