#!/bin/sh
# init.sh - /init of the rdma-testbed initramfs (copied there by setup.sh). POSIX sh.
#
# Stage 1 runs as PID 1 under busybox:
#   loads the modules listed in /lib/modules/order, mounts the host's root read-only over 9p (tag "host"),
#   overlays /proc /sys /dev /dev/pts /dev/shm /tmp /run /var/tmp with VM-private filesystems, mounts the
#   run's output directory read-write over 9p (tag "out") at its host path, then chroots into the host root
#   and runs stage 2 with the host's /bin/sh. Whatever happens it ends with `poweroff -f`.
# Stage 2 (`init.sh stage2`, inside the chroot, host binaries):
#   lo up, eth0 = $b2b_ip, `rdma link add rxe0 type rxe netdev eth0`, then the test script with
#   B2B_ROLE B2B_SELF_IP B2B_PEER_IP B2B_RDMA_DEV B2B_OUT B2B_RUN_ID (and ulimit -l unlimited, HOME=/tmp).
#   Output goes to the console and to $B2B_OUT/<role>.log; the exit code to $B2B_OUT/<role>.rc.
#
# Kernel command line parameters (run-pair.sh sets them; no spaces allowed in values):
#   b2b_role=a|b  b2b_ip=10.77.0.1/24  b2b_peer=10.77.0.2  b2b_script=/abs/script  b2b_out=/abs/outdir
#   b2b_run=RUNID  [b2b_dev=rxe0] [b2b_mtu=1500] [b2b_ip2=10.78.0.1/24 b2b_peer2=10.78.0.2] [b2b_rootcache=none]  [b2b_expose=/tmp/x:/run/y]  (host paths under a VM-private overlay
#   such as /tmp that must stay visible, read-only, inside the VM)
#
# Exit codes written to <role>.rc by the testbed itself (the script's own code otherwise):
#   96 network set-up failed, 97 `rdma link add` failed or the port never became ACTIVE,
#   98 the script does not exist, 99 stage 2 could not start.

ROOT=/mnt

msg() { echo "[init $(uptime_s)] $*"; }
uptime_s() {
	_u=
	read -r _u _ </proc/uptime 2>/dev/null
	echo "${_u:-?}s"
}

stage2() {
	export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
	export HOME=/tmp TMPDIR=/tmp LC_ALL=C.UTF-8
	# dash (Debian's /bin/sh) and busybox ash both implement -l and -n.
	# shellcheck disable=SC3045
	ulimit -l unlimited
	# shellcheck disable=SC3045
	ulimit -n 65536 2>/dev/null || true
	cd /tmp || exit 99
	role=$b2b_role
	out=$b2b_out
	dev=${b2b_dev:-rxe0}
	(
		run_guest
		echo $? >"$out/$role.rc.tmp"
	) </dev/null 2>&1 | tee "$out/$role.log"
	[ -f "$out/$role.rc.tmp" ] || echo 99 >"$out/$role.rc.tmp"
	mv -f "$out/$role.rc.tmp" "$out/$role.rc"
	msg "script exit code $(cat "$out/$role.rc") -> $out/$role.rc"
}

run_guest() {
	msg "role=$role self=$b2b_ip peer=$b2b_peer run=$b2b_run"
	ip link set lo up || return 96
	ip addr add "$b2b_ip" dev eth0 || return 96
	if [ -n "${b2b_mtu:-}" ]; then ip link set eth0 mtu "$b2b_mtu" || return 96; fi
	ip link set eth0 up || return 96
	rdma link add "$dev" type rxe netdev eth0 || return 97
	n=0
	until grep -q ACTIVE "/sys/class/infiniband/$dev/ports/1/state" 2>/dev/null; do
		n=$((n + 1))
		if [ "$n" -gt 100 ]; then
			msg "$dev port 1 not ACTIVE after 10 s"
			return 97
		fi
		sleep 0.1
	done
	msg "$dev up on eth0 ($b2b_ip)"
	if [ -n "${b2b_ip2:-}" ]; then
		# The second wire (run-pair.sh --wires 2): eth1, rxe1.
		n=0
		until [ -e /sys/class/net/eth1 ]; do
			n=$((n + 1))
			[ "$n" -gt 100 ] && return 96
			sleep 0.1
		done
		ip addr add "$b2b_ip2" dev eth1 || return 96
		if [ -n "${b2b_mtu:-}" ]; then ip link set eth1 mtu "$b2b_mtu" || return 96; fi
		ip link set eth1 up || return 96
		rdma link add rxe1 type rxe netdev eth1 || return 97
		n=0
		until grep -q ACTIVE /sys/class/infiniband/rxe1/ports/1/state 2>/dev/null; do
			n=$((n + 1))
			if [ "$n" -gt 100 ]; then
				msg "rxe1 port 1 not ACTIVE after 10 s"
				return 97
			fi
			sleep 0.1
		done
		msg "rxe1 up on eth1 ($b2b_ip2)"
		export B2B_RDMA_DEV2=rxe1 B2B_SELF_IP2="${b2b_ip2%/*}" B2B_PEER_IP2="$b2b_peer2"
	fi
	export B2B_ROLE="$role" B2B_SELF_IP="${b2b_ip%/*}" B2B_PEER_IP="$b2b_peer" B2B_RDMA_DEV="$dev"
	export B2B_OUT="$out" B2B_RUN_ID="$b2b_run"
	if [ ! -f "$b2b_script" ]; then
		msg "script $b2b_script not found inside the VM"
		return 98
	fi
	msg "running $b2b_script"
	if [ -x "$b2b_script" ]; then
		"$b2b_script"
	elif [ -x /bin/bash ]; then
		/bin/bash "$b2b_script"
	else
		/bin/sh "$b2b_script"
	fi
}

# ------------------------------------------------------------------------------------------------- stage 1
finish() {
	sync
	[ -n "${b2b_out:-}" ] && umount "$ROOT$b2b_out" 2>/dev/null
	msg "poweroff"
	poweroff -f
	echo o >/proc/sysrq-trigger
	while :; do sleep 60; done
}

fail() {
	msg "FATAL: $*"
	if [ -n "${out_mounted:-}" ]; then
		echo "[init] FATAL: $*" >>"$ROOT$b2b_out/$b2b_role.log"
		echo 99 >"$ROOT$b2b_out/$b2b_role.rc"
	fi
	finish
}

# Mount a VM-private filesystem over a host directory, if that directory exists on the host.
overlay() { # overlay TYPE OPTIONS DIR
	[ -d "$ROOT$3" ] || return 0
	mount -t "$1" -o "$2" "$1" "$ROOT$3" || fail "mount $1 on $3"
}

stage1() {
	/bin/busybox mkdir -p /proc /sys /dev /mnt /host
	/bin/busybox --install -s /bin
	export PATH=/bin
	mount -t proc proc /proc
	mount -t sysfs sysfs /sys
	mount -t devtmpfs devtmpfs /dev
	exec </dev/console >/dev/console 2>&1

	# Parameters: read /proc/cmdline before anything else moves.
	read -r cmdline </proc/cmdline
	for kv in $cmdline; do
		case $kv in
		b2b_*=*)
			k=${kv%%=*}
			case $k in *[!a-z_]*) continue ;; esac
			eval "$k=\${kv#*=}"
			;;
		esac
	done
	for k in b2b_role b2b_ip b2b_peer b2b_script b2b_out b2b_run; do
		eval "[ -n \"\${$k:-}\" ]" || fail "kernel parameter $k= missing"
	done
	echo
	msg "kernel up; loading modules"

	while read -r m; do
		insmod "/lib/modules/$m.ko" || msg "insmod $m failed"
	done </lib/modules/order

	n=0
	until [ -e /sys/class/net/eth0 ]; do
		n=$((n + 1))
		[ "$n" -gt 100 ] && fail "no eth0 (virtio-net) after 10 s"
		sleep 0.1
	done

	# Host root, read-only (QEMU exports it with readonly=on as well).
	mount -t 9p -o "trans=virtio,version=9p2000.L,msize=512000,ro,cache=${b2b_rootcache:-none}" host "$ROOT" ||
		fail "mount 9p host root"
	# A second, non-recursive view of the host root, to re-expose paths hidden by the overlays below.
	mount --bind "$ROOT" /host || fail "bind host root"

	overlay proc nosuid,nodev,noexec /proc
	overlay sysfs nosuid,nodev,noexec /sys
	overlay devtmpfs mode=755 /dev
	mkdir -p "$ROOT/dev/pts" "$ROOT/dev/shm"
	overlay devpts gid=5,mode=620,ptmxmode=666 /dev/pts
	overlay tmpfs mode=1777,nosuid,nodev /dev/shm
	overlay tmpfs mode=1777,nosuid,nodev /tmp
	overlay tmpfs mode=755,nosuid,nodev /run
	overlay tmpfs mode=1777,nosuid,nodev /var/tmp

	old_ifs=$IFS
	IFS=:
	for p in ${b2b_expose:-}; do
		case $p in
		/tmp/* | /run/* | /var/tmp/* | /dev/shm/*)
			[ -d "/host$p" ] || continue
			if ! { mkdir -p "$ROOT$p" && mount --bind "/host$p" "$ROOT$p"; }; then msg "cannot expose $p"; fi
			;;
		esac
	done
	IFS=$old_ifs

	# The run's output directory: the only place the VM writes to on the host.
	[ -d "$ROOT$b2b_out" ] || mkdir -p "$ROOT$b2b_out" || fail "no mount point for $b2b_out"
	mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 out "$ROOT$b2b_out" || fail "mount 9p out"
	out_mounted=1

	cp /init "$ROOT/tmp/.b2b-init.sh" || fail "copy stage 2"
	export b2b_role b2b_ip b2b_peer b2b_script b2b_out b2b_run b2b_dev b2b_mtu b2b_ip2 b2b_peer2
	msg "chroot into the host root"
	chroot "$ROOT" /bin/sh /tmp/.b2b-init.sh stage2 || msg "stage 2 exited with $?"
	[ -f "$ROOT$b2b_out/$b2b_role.rc" ] || fail "stage 2 wrote no exit code"
	finish
}

if [ "${1:-}" = stage2 ]; then
	stage2
else
	stage1
fi
