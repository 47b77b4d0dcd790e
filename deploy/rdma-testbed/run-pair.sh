#!/usr/bin/env bash
# run-pair.sh - boot two QEMU VMs (A and B) joined by a private virtual Ethernet wire, each with a Soft-RoCE
# device rxe0 on eth0, run SCRIPT_A in A and SCRIPT_B in B, wait for both to power off, report.
#
#   deploy/rdma-testbed/run-pair.sh SCRIPT_A SCRIPT_B [--timeout SECONDS] [--out DIR] [--mem MiB] [--smp N]
#                                                     [--grace SECONDS] [--mtu BYTES] [--wires 1|2]
#
#   SCRIPT_A/B  absolute host paths (the VMs see the host's root, read-only, at the same paths). Executable
#               files run directly (mind the shebang); others run with bash. Each gets:
#               B2B_ROLE=a|b B2B_SELF_IP B2B_PEER_IP (A=10.77.0.1, B=10.77.0.2, /24 on eth0 in the VMs)
#               B2B_RDMA_DEV=rxe0 B2B_OUT=<output dir, the only host path the VMs may write> B2B_RUN_ID.
#               The scripts coordinate over the wire themselves (e.g. B retries until A's port answers).
#   --timeout   seconds for the whole run (default 900); leftovers are killed, exit 124.
#   --out DIR   output directory (default $B2B_TESTBED_CACHE/runs/<run id>); receives a.log b.log (script
#               output), a.rc b.rc (exit codes), a.console b.console (serial consoles), a.qemu b.qemu.
#   --mem MiB   guest memory per VM (default 2048).
#   --smp N     vCPUs per VM (default 1: measured faster than 2 on a 2-core host, see README.md).
#   --grace S   once one VM has failed, how long the other may still run (default 60).
#   --mtu B     eth0 MTU in the VMs (default 1500, which gives rxe an active MTU of 1024; 4200 gives 4096).
#   --wires N   1 (default) or 2: a second virtual wire (its own QEMU socket) between eth1 of both VMs,
#               10.78.0.1/24 (A) and 10.78.0.2/24 (B), with Soft-RoCE device rxe1 on it; the scripts then also
#               get B2B_RDMA_DEV2=rxe1 B2B_SELF_IP2 B2B_PEER_IP2. Two RDMA devices, two wires: rails.
#
# Exit status: 0 both scripts exited 0; 1 a script failed; 124 timeout; 2 usage; 3 QEMU could not start.
# Environment: B2B_TESTBED_CACHE (see setup.sh), B2B_TESTBED_QUIET=1 (do not print the consoles on success),
# B2B_TESTBED_WIRE_RETRIES (default 1, see below).
#
# A stalled wire is QEMU's, not the scripts': under heavy two-way traffic QEMU 7.2's socket backend can stop
# taking a guest's packets for good, and the guest kernel then logs "NETDEV WATCHDOG ... transmit queue 0
# timed out" every 5 s while everything over the wire times out (seen in 2 of 22 runs, both in the 32-client
# load case). When a console shows that, the VMs are stopped at once, everything the run wrote to --out is
# moved to --out/stalled-N, and the run starts again, at most B2B_TESTBED_WIRE_RETRIES times; then it fails.
set -euo pipefail
ORIG_ARGS=("$@")
ATTEMPT=${B2B_PAIR_ATTEMPT:-1}
WIRE_RETRIES=${B2B_TESTBED_WIRE_RETRIES:-1}

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CACHE=${B2B_TESTBED_CACHE:-$REPO/.cache/rdma-testbed}

# Defaults. SMP=1 (measured, perftest-smoke.sh, 5 alternated pairs on the 2-core host): -smp 1 per VM took
# 16-42 s in total against 38-81 s for -smp 2, and ib_write_bw 65536 B averaged 5-21 MB/s against 6-11 MB/s;
# two VMs of 2 vCPUs oversubscribe 2 host cores under TCG. See README.md.
TIMEOUT=900 OUT="" MEM=2048 SMP=1 GRACE=60 MTU="" WIRES=1
# CPU model: plain qemu64 measured faster than -cpu max under TCG (ib_write_bw 65536 B about 23 MB/s vs 15;
# with max, glibc and the kernel pick AVX code paths that TCG emulates slowly). Go binaries must be built for
# GOAMD64=v1 (the default) to run on qemu64.
CPU=${B2B_TESTBED_CPU:-qemu64}
IP_A=10.77.0.1 IP_B=10.77.0.2 PREFIX=24
MAC_A=52:54:00:77:00:01 MAC_B=52:54:00:77:00:02
IP2_A=10.78.0.1 IP2_B=10.78.0.2 MAC2_A=52:54:00:78:00:01 MAC2_B=52:54:00:78:00:02

usage() { # usage [EXIT_CODE]
	sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}" >&2
	exit "${1:-2}"
}
say() { printf '[run-pair] %s\n' "$*" >&2; }
die() {
	say "ERROR: $*"
	exit "${2:-2}"
}

scripts=()
while [ $# -gt 0 ]; do
	case $1 in
	--timeout) TIMEOUT=${2:?}; shift 2 ;;
	--out) OUT=${2:?}; shift 2 ;;
	--mem) MEM=${2:?}; shift 2 ;;
	--smp) SMP=${2:?}; shift 2 ;;
	--grace) GRACE=${2:?}; shift 2 ;;
	--mtu) MTU=${2:?}; shift 2 ;;
	--wires) WIRES=${2:?}; shift 2 ;;
	--wires=*) WIRES=${1#*=}; shift ;;
	--timeout=*) TIMEOUT=${1#*=}; shift ;;
	--out=*) OUT=${1#*=}; shift ;;
	--mem=*) MEM=${1#*=}; shift ;;
	--smp=*) SMP=${1#*=}; shift ;;
	--grace=*) GRACE=${1#*=}; shift ;;
	--mtu=*) MTU=${1#*=}; shift ;;
	-h | --help) usage 0 ;;
	-*) die "unknown option $1" ;;
	*) scripts+=("$1"); shift ;;
	esac
done
[ "${#scripts[@]}" = 2 ] || usage
[ -z "$MTU" ] || [[ $MTU =~ ^[1-9][0-9]*$ ]] || die "--mtu wants a positive integer, got '$MTU'"
[[ $WIRES =~ ^[12]$ ]] || die "--wires wants 1 or 2, got '$WIRES'"
for v in TIMEOUT MEM SMP GRACE; do
	[[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "--${v,,} wants a positive integer, got '${!v}'"
done

# Kernel command line values must not contain spaces (or anything the parsing in init.sh would mangle).
check_path() { # check_path WHAT PATH
	[[ $2 == /* ]] || die "$1 must be an absolute path: $2"
	[[ $2 =~ ^[A-Za-z0-9/._+,@=-]+$ ]] || die "$1 has characters the kernel command line cannot carry: $2"
}

# Paths under the VM-private overlays (/tmp /run /var/tmp /dev/shm) are invisible in the VM unless
# re-exposed; init.sh bind-mounts these back read-only.
expose=()
for i in 0 1; do
	s=${scripts[$i]}
	[[ $s == /* ]] || die "SCRIPT paths must be absolute (the VM sees the same paths): $s"
	[ -f "$s" ] || die "no such script: $s"
	s=$(readlink -f "$s")
	check_path "script" "$s"
	scripts[i]=$s
	case $s in
	/proc/* | /sys/* | /dev/[!s]*) die "script under $s is not shared with the VMs" ;;
	/tmp/* | /run/* | /var/tmp/* | /dev/shm/*)
		d=$(dirname "$s")
		[[ " ${expose[*]} " == *" $d "* ]] || expose+=("$d")
		;;
	esac
done
case $REPO in /tmp/* | /run/* | /var/tmp/* | /dev/shm/*) expose+=("$REPO") ;; esac
expose_arg=
if [ "${#expose[@]}" -gt 0 ]; then
	expose_arg="b2b_expose=$(
		IFS=:
		echo "${expose[*]}"
	)"
fi

# --- run id and output directory ---------------------------------------------------------------------------
if [ -z "$OUT" ]; then
	mkdir -p "$CACHE/runs"
	OUT=$(mktemp -d "$CACHE/runs/$(date +%Y%m%d-%H%M%S)-XXXXXX")
else
	mkdir -p "$OUT"
	OUT=$(cd "$OUT" && pwd -P)
	rm -f "$OUT"/{a,b}.{rc,rc.tmp,log,console,qemu}
fi
# what the caller put in --out before the run: kept when a stalled run is moved aside
PRE_OUT=$(ls -A "$OUT")
RUN_ID=$(basename "$OUT")
# the run id must be unique even when two runs are given the same --out name elsewhere
RUN_ID=$RUN_ID-$$
check_path "--out" "$OUT"

# --- setup (fast when the cache is complete) ---------------------------------------------------------------
"$HERE/setup.sh" --quiet || die "setup.sh failed" 3
# shellcheck source=/dev/null
. "$CACHE/testbed.env"
{ [ -f "$KERNEL" ] && [ -f "$INITRD" ]; } || die "setup.sh left no kernel/initramfs in $CACHE" 3

# --- QEMU ----------------------------------------------------------------------------------------------------
PID_A="" PID_B=""
cleanup() {
	local p
	for p in $PID_A $PID_B; do kill -0 "$p" 2>/dev/null && kill "$p" 2>/dev/null; done
	sleep 0.2
	for p in $PID_A $PID_B; do kill -0 "$p" 2>/dev/null && kill -9 "$p" 2>/dev/null; done
	return 0
}
trap cleanup EXIT
trap 'say "interrupted"; cleanup; exit 130' INT TERM HUP

start_qemu() { # start_qemu ROLE NETDEV_SPEC MAC SELF_IP PEER_IP SCRIPT [NETDEV2_SPEC MAC2 SELF_IP2 PEER_IP2]
	local role=$1 netdev=$2 mac=$3 ip=$4 peer=$5 script=$6 netdev2=${7:-} mac2=${8:-} ip2=${9:-} peer2=${10:-}
	local append="console=ttyS0 quiet panic=-1 mitigations=off no_timer_check"
	append+=" b2b_role=$role b2b_ip=$ip/$PREFIX b2b_peer=$peer b2b_script=$script b2b_out=$OUT b2b_run=$RUN_ID"
	local wire2=()
	if [ -n "$netdev2" ]; then
		append+=" b2b_ip2=$ip2/$PREFIX b2b_peer2=$peer2"
		wire2=(-netdev "socket,id=n1,$netdev2" -device "virtio-net-pci,netdev=n1,mac=$mac2,romfile=")
	fi
	[ -n "$expose_arg" ] && append+=" $expose_arg"
	[ -n "$MTU" ] && append+=" b2b_mtu=$MTU"
	[ -n "${B2B_TESTBED_CMDLINE:-}" ] && append+=" $B2B_TESTBED_CMDLINE"
	local extra=()
	# shellcheck disable=SC2206 # word splitting wanted: a knob for extra QEMU flags
	[ -n "${B2B_TESTBED_QEMU_ARGS:-}" ] && extra=($B2B_TESTBED_QEMU_ARGS)
	qemu-system-x86_64 \
		-name "b2b-$RUN_ID-$role" \
		-machine pc,accel=tcg -cpu "$CPU" -smp "$SMP" -m "$MEM" \
		-nodefaults -nographic -no-reboot -monitor none \
		-serial "file:$OUT/$role.console" \
		-kernel "$KERNEL" -initrd "$INITRD" -append "$append" \
		-virtfs "local,path=/,mount_tag=host,security_model=none,multidevs=remap,readonly=on" \
		-virtfs "local,path=$OUT,mount_tag=out,security_model=none" \
		-netdev "socket,id=n0,$netdev" \
		-device "virtio-net-pci,netdev=n0,mac=$mac,romfile=" \
		"${wire2[@]}" \
		"${extra[@]}" \
		</dev/null >"$OUT/$role.qemu" 2>&1 &
}

# Listening port: random in 20000-59999, free as far as `ss` can tell; if QEMU A still loses a race for it
# (it exits with "Address already in use") try another. We only ever use 127.0.0.1.
port_in_use() { [ -n "$(ss -Htan "sport = :$1" 2>/dev/null)" ]; }
listener_pid_ok() { ss -Hltnp "sport = :$1" 2>/dev/null | grep -q "pid=$2,"; }

T0=$(date +%s.%N)
say "run $RUN_ID: out=$OUT smp=$SMP mem=${MEM}M timeout=${TIMEOUT}s kernel=$KVER"
started=0
for attempt in 1 2 3 4 5 6 7 8 9 10; do
	PORT=$((20000 + (RANDOM * 32768 + RANDOM) % 40000))
	port_in_use "$PORT" && continue
	wire2_a=() PORT2=""
	if [ "$WIRES" = 2 ]; then
		PORT2=$((20000 + (RANDOM * 32768 + RANDOM) % 40000))
		{ [ "$PORT2" = "$PORT" ] || port_in_use "$PORT2"; } && continue
		wire2_a=("listen=127.0.0.1:$PORT2" "$MAC2_A" "$IP2_A" "$IP2_B")
	fi
	start_qemu a "listen=127.0.0.1:$PORT" "$MAC_A" "$IP_A" "$IP_B" "${scripts[0]}" "${wire2_a[@]}"
	PID_A=$!
	for _ in $(seq 100); do
		if ! kill -0 "$PID_A" 2>/dev/null; then break; fi
		if listener_pid_ok "$PORT" "$PID_A" && { [ -z "$PORT2" ] || listener_pid_ok "$PORT2" "$PID_A"; }; then
			started=1
			break
		fi
		sleep 0.05
	done
	[ "$started" = 1 ] && break
	if kill -0 "$PID_A" 2>/dev/null; then
		kill "$PID_A"
		wait "$PID_A" 2>/dev/null || true
		die "QEMU A (pid $PID_A) does not listen on 127.0.0.1:$PORT: $(cat "$OUT/a.qemu")" 3
	fi
	wait "$PID_A" 2>/dev/null || true
	PID_A=
	if grep -qi 'address already in use' "$OUT/a.qemu"; then
		say "port $PORT taken (attempt $attempt), trying another"
		continue
	fi
	die "QEMU A failed to start: $(cat "$OUT/a.qemu")" 3
done
[ "$started" = 1 ] || die "no free port found for the VM wire" 3
wire2_b=()
[ "$WIRES" = 2 ] && wire2_b=("connect=127.0.0.1:$PORT2" "$MAC2_B" "$IP2_B" "$IP2_A")
start_qemu b "connect=127.0.0.1:$PORT" "$MAC_B" "$IP_B" "$IP_A" "${scripts[1]}" "${wire2_b[@]}"
PID_B=$!
say "VM A pid $PID_A (listen 127.0.0.1:$PORT), VM B pid $PID_B"

# --- wait ------------------------------------------------------------------------------------------------------
rc_of() { # the script's exit code, or "" if the VM has not written one
	local f=$OUT/$1.rc
	[ -f "$f" ] && tr -dc '0-9' <"$f"
	return 0
}
elapsed() { awk -v a="$T0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

timed_out=0 fail_since="" T_A="" T_B="" S_A="" S_B="" stalled=""
while :; do
	alive=0
	if [ -n "$PID_A" ] && kill -0 "$PID_A" 2>/dev/null; then alive=$((alive + 1)); elif [ -z "$T_A" ]; then T_A=$(elapsed); fi
	if [ -n "$PID_B" ] && kill -0 "$PID_B" 2>/dev/null; then alive=$((alive + 1)); elif [ -z "$T_B" ]; then T_B=$(elapsed); fi
	# host-side boot time: when init.sh announces the script (guest clocks drift under TCG on a busy host)
	[ -n "$S_A" ] || ! grep -qa '] running /' "$OUT/a.console" 2>/dev/null || S_A=$(elapsed)
	[ -n "$S_B" ] || ! grep -qa '] running /' "$OUT/b.console" 2>/dev/null || S_B=$(elapsed)
	[ "$alive" = 0 ] && break
	for r in a b; do
		if grep -qa 'NETDEV WATCHDOG' "$OUT/$r.console" 2>/dev/null; then stalled=$r; fi
	done
	if [ -n "$stalled" ]; then
		say "VM ${stalled^^}'s virtual NIC stopped transmitting (NETDEV WATCHDOG on its console): the wire is dead; stopping the VMs"
		break
	fi
	now=$(date +%s)
	if awk -v e="$(elapsed)" -v t="$TIMEOUT" 'BEGIN { exit !(e >= t) }'; then
		timed_out=1
		say "timeout after ${TIMEOUT}s; killing the VMs"
		break
	fi
	# A VM that is gone without a zero exit code: give the other one GRACE seconds, then stop it.
	if [ -z "$fail_since" ]; then
		for r in a b; do
			t=T_${r^^}
			if [ -n "${!t}" ] && [ "$(rc_of "$r")" != 0 ]; then
				fail_since=$now
				say "VM ${r^^} ended with exit code '$(rc_of "$r")'; waiting at most ${GRACE}s for the other"
			fi
		done
	elif [ $((now - fail_since)) -ge "$GRACE" ]; then
		say "grace period over; killing the remaining VM"
		break
	fi
	sleep 0.25
done
cleanup
wait 2>/dev/null || true
TOTAL=$(elapsed)

# --- report ----------------------------------------------------------------------------------------------------
RC_A=$(rc_of a) RC_B=$(rc_of b)
status=0
[ "$RC_A" = 0 ] && [ "$RC_B" = 0 ] || status=1
[ "$timed_out" = 1 ] && status=124
[ -n "$stalled" ] && status=1
if [ -n "$stalled" ] && [ "$ATTEMPT" -le "$WIRE_RETRIES" ]; then
	aside=$OUT/stalled-$ATTEMPT
	mkdir -p "$aside"
	for f in $(ls -A "$OUT"); do
		case $f in stalled-*) continue ;; esac
		grep -qxF -- "$f" <<<"$PRE_OUT" || mv "$OUT/$f" "$aside/"
	done
	say "the stalled run is in $aside; running again (attempt $((ATTEMPT + 1)) of $((WIRE_RETRIES + 1)))"
	B2B_PAIR_ATTEMPT=$((ATTEMPT + 1)) exec "$0" "${ORIG_ARGS[@]}"
fi
if [ "$status" != 0 ] || [ "${B2B_TESTBED_QUIET:-0}" != 1 ]; then
	for r in a b; do
		R=${r^^}
		echo "----- VM $R console ($OUT/$r.console) -----"
		[ -s "$OUT/$r.qemu" ] && sed "s/^/[$R] qemu: /" "$OUT/$r.qemu"
		# drop SeaBIOS's terminal escapes (ESC c, ESC [...) and the serial line's CRs
		[ -f "$OUT/$r.console" ] && tr -d '\r' <"$OUT/$r.console" |
			sed -E "s/\x1b(\[[0-9;?]*[A-Za-z]|c)//g; s/^/[$R] /"
	done
fi
off() { if [ -n "$1" ]; then echo "off at ${1}s"; else echo "killed"; fi; }
say "A: exit ${RC_A:-none} (script started at ${S_A:-?}s, $(off "$T_A"))  B: exit ${RC_B:-none} (script started at ${S_B:-?}s, $(off "$T_B"))  total ${TOTAL}s"
say "output: $OUT"
case $status in
0) say "PASS" ;;
124) say "FAIL (timeout)" ;;
*) if [ -n "$stalled" ]; then say "FAIL (the virtual wire stalled in $ATTEMPT attempts)"; else say "FAIL"; fi ;;
esac
exit "$status"
