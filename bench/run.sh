#!/usr/bin/env bash
# make bench: the load benchmark (see README "Performance" and bench/runner).
#
# Installs what is missing (wrk, redis-server with redis-benchmark, nginx,
# linux-perf), builds rategate, the floor server, the minimal limiter, the
# open-loop generator and the runner into a temporary directory, and runs
# the runner, which starts every server on free loopback ports, measures,
# stops them, and writes bench/results/.
#
# Knobs: BENCH_DURATION (3s) BENCH_ROUNDS (4) BENCH_CONNECTIONS (50)
# BENCH_THREADS (2) BENCH_USERS (10000) BENCH_SCENARIOS (all; comma list)
# BENCH_RATE (latency check's rate; default half of the measured maximum)
# BENCH_NGINX_KEEPALIVE=N (an experiment: both upstreams keep N idle
# connections instead of the shipped 32 and 16; the results say so)
# BENCH_KEEP=1 keeps the work directory (configs and every server's log).
# BENCH_PPROF=1 saves CPU profiles of rategate (bench/results/profiles-<time>/).
# BENCH_LEASE=0 leaves out hot-key's rategate-lease arm (the rule with lease: true).
set -euo pipefail
cd "$(dirname "$0")/.."

GO=${GO:-go}

SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
updated=""
# apt_install PKG...: install, running apt-get update once if the first try fails.
apt_install() {
	$SUDO apt-get install -y -qq "$@" >/dev/null 2>&1 && return 0
	[ -n "$updated" ] || { $SUDO apt-get update -qq && updated=1; }
	$SUDO apt-get install -y -qq "$@" >/dev/null
}

missing=""
command -v wrk >/dev/null 2>&1 || missing="$missing wrk"
command -v redis-server >/dev/null 2>&1 || missing="$missing redis-server"
command -v redis-benchmark >/dev/null 2>&1 || missing="$missing redis-tools"
command -v nginx >/dev/null 2>&1 || missing="$missing nginx"
if [ -n "$missing" ]; then
	echo "installing:$missing"
	# $missing is a list of package names: split on purpose.
	# shellcheck disable=SC2086
	apt_install $missing
fi
# perf counts the connections NGINX opens to rategate and the app. Optional:
# without it those columns read -1.
if ! command -v perf >/dev/null 2>&1; then
	echo "installing: linux-perf (optional)"
	apt_install linux-perf || echo "linux-perf not installed: connection counts will read -1"
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/rategate-bench.XXXXXX")
chmod 755 "$work"
runner_pid=""

# Whatever happens, nothing the bench started outlives it: the runner stops
# its servers itself; if it could not (killed), stop the process groups it
# listed in $work/pids, one by one, by id.
cleanup() {
	status=$?
	trap - EXIT INT TERM
	if [ -n "$runner_pid" ] && kill -0 "$runner_pid" 2>/dev/null; then
		kill -TERM "$runner_pid" 2>/dev/null || true
		wait "$runner_pid" 2>/dev/null || true
	fi
	if [ -s "$work/pids" ]; then
		while read -r pid; do
			[ -n "$pid" ] && kill -KILL -- "-$pid" 2>/dev/null || true
		done <"$work/pids"
	fi
	if [ -n "${BENCH_KEEP:-}" ]; then
		echo "work directory kept: $work"
	else
		rm -rf "$work"
	fi
	exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

echo "building into $work/bin"
mkdir -p "$work/bin"
CGO_ENABLED=0 $GO build -trimpath -o "$work/bin/rategate" .
$GO build -o "$work/bin/floor" ./bench/floor
$GO build -o "$work/bin/minimal" ./bench/minimal
$GO build -o "$work/bin/openloop" ./bench/openloop
$GO build -o "$work/bin/runner" ./bench/runner

"$work/bin/runner" -work "$work" -bin "$work/bin" -repo . -results bench/results &
runner_pid=$!
wait "$runner_pid"
