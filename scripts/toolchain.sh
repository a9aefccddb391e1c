#!/usr/bin/env bash
# toolchain.sh — make sure `go test -race` can run here. Called by `make test`.
#
# The race detector needs cgo, and cgo needs a C compiler with the C library's
# headers. A fresh Debian has neither, so Go turns cgo off (`go env CGO_ENABLED`
# prints 0) and `go test -race` stops with "-race requires cgo". This script:
#
#   * does nothing when `go env CGO_ENABLED` is already 1;
#   * says so and stops when CGO_ENABLED=0 was set by the user (installing a
#     compiler would not help);
#   * as root on Debian/Ubuntu, installs gcc and libc6-dev with apt-get
#     (--no-install-recommends: nothing but the compiler and headers);
#   * otherwise fails with what is missing and how to get it.
#
# Environment:
#   GO=go                   the go command (the Makefile passes its own)
#   TOOLCHAIN_DRY_RUN=1     print what would be done, change nothing
set -euo pipefail

export PATH="$PATH:/usr/local/go/bin:/usr/local/sbin:/usr/sbin:/sbin"
export DEBIAN_FRONTEND=noninteractive

GO="${GO:-go}"
DRY_RUN="${TOOLCHAIN_DRY_RUN:-}"
PKGS=(gcc libc6-dev)

log() { printf 'toolchain: %s\n' "$*" >&2; }
die() {
	printf 'toolchain: ERROR: %s\n' "$*" >&2
	exit 1
}

cgo_on() { [[ "$("$GO" env CGO_ENABLED 2>/dev/null)" == 1 ]]; }

how_to() {
	cat >&2 <<EOF
toolchain: 'make test' runs 'go test -race', which needs cgo: a C compiler and
toolchain: the C library's headers. Install them, then run 'make test' again:
toolchain:   Debian/Ubuntu:  apt-get install --no-install-recommends gcc libc6-dev
toolchain:   Fedora/RHEL:    dnf install gcc glibc-devel
toolchain:   Alpine:         apk add gcc musl-dev
toolchain:   macOS:          xcode-select --install
toolchain: (or set CC to a C compiler that works)
EOF
}

main() {
	command -v "$GO" >/dev/null 2>&1 || die "'$GO' not found: install Go 1.26 (see README.md, Quick start)"
	if cgo_on; then
		return 0
	fi
	if [[ "${CGO_ENABLED:-}" == 0 ]]; then
		die "CGO_ENABLED=0 is set in the environment, and 'go test -race' needs cgo: unset it (or set CGO_ENABLED=1)"
	fi
	local cc
	cc=$("$GO" env CC 2>/dev/null || true)
	log "cgo is off: no working C compiler ('${cc:-gcc}' not found)"
	if [[ $EUID -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
		[[ $EUID -ne 0 ]] && log "cannot install it: not root"
		command -v apt-get >/dev/null 2>&1 || log "cannot install it: no apt-get (not Debian/Ubuntu)"
		how_to
		exit 1
	fi
	log "installing ${PKGS[*]} with apt-get (for go test -race)"
	if [[ -n "$DRY_RUN" ]]; then
		log "[dry-run] apt-get update -q && apt-get install -y -q --no-install-recommends ${PKGS[*]}"
		return 0
	fi
	apt-get update -q >/dev/null
	apt-get install -y -q --no-install-recommends "${PKGS[@]}" >/dev/null
	if ! cgo_on; then
		how_to
		die "installed ${PKGS[*]}, but 'go env CGO_ENABLED' still prints $("$GO" env CGO_ENABLED) (CC=$("$GO" env CC))"
	fi
	log "cgo is on ($("$GO" env CC))"
}

main "$@"
