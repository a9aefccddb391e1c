# shellcheck shell=bash
# compat.sh — run one set of bench arguments against a bench binary of
# another build (make bench BASE=<ref>), leaving out the flags it lacks.
# Sourced by bench/bench.sh; bench/compat_test.go tests it.
#
# Every flag must be written as one word, -name or -name=value, so that a
# flag can be left out without guessing whether the next word is its value.

# bench_flag_names BIN — the flag names BIN's -help lists, space-separated
# (Go's flag package prints each as "  -name [type]"); empty when it lists
# none.
bench_flag_names() {
	local names
	names=$("$1" -help 2>&1 | sed -n 's/^  *-\([A-Za-z0-9][A-Za-z0-9_.-]*\).*/\1/p' | sort -u | tr '\n' ' ') || true
	echo "${names% }"
}

# bench_filter_args NAMES ARG... — KEPT_ARGS: the arguments whose flag is in
# NAMES (a bench_flag_names list) and every argument that is no flag;
# DROPPED_FLAGS: the flags left out, as given. A word "--" ends the flags.
bench_filter_args() {
	local have=" $1 " a n ended=0
	shift
	KEPT_ARGS=()
	DROPPED_FLAGS=()
	for a in "$@"; do
		if ((!ended)) && [[ $a == -?* ]]; then
			if [[ $a == -- ]]; then
				ended=1
			else
				n=${a#-}
				n=${n#-}
				n=${n%%=*}
				if [[ $have != *" $n "* ]]; then
					DROPPED_FLAGS+=("$a")
					continue
				fi
			fi
		fi
		KEPT_ARGS+=("$a")
	done
}
