#!/bin/sh
# gid-index.sh - print the GID index of the RoCE v2 GID that carries an IPv4 address (::ffff:a.b.c.d) on an
# RDMA device port; that is the index to give perftest's -x, or ibv_query_gid/ah_attr.grh.sgid_index.
#
#   gid-index.sh [DEV [PORT [IPV4]]]
#     DEV   default $B2B_RDMA_DEV, else rxe0
#     PORT  default 1
#     IPV4  default $B2B_SELF_IP (a /prefix is ignored); empty: the first IPv4-mapped RoCE v2 GID
#   B2B_GID_WAIT  seconds to wait for the GID to appear (default 10: the kernel fills the table asynchronously
#                 after `ip addr add` / `rdma link add`)
#
# rxe (kernel 6.1) is RoCE v2 only; in the testbed its table reads 0 = fe80::<EUI-64 of the MAC>,
# 1 = ::ffff:10.77.0.x, both "RoCE v2", so this prints 1 there. Real RoCE NICs also list RoCE v1 entries and
# any further addresses (IPv6, VLANs), so do not hard-code it. Exit 1 if none is found.
dev=${1:-${B2B_RDMA_DEV:-rxe0}}
port=${2:-1}
ip=${3-${B2B_SELF_IP:-}}
ip=${ip%/*}
want=
if [ -n "$ip" ]; then
	old_ifs=$IFS
	IFS=.
	# shellcheck disable=SC2086
	set -- $ip
	IFS=$old_ifs
	[ $# = 4 ] || {
		echo "gid-index.sh: not an IPv4 address: $ip" >&2
		exit 2
	}
	want=$(printf '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x' "$1" "$2" "$3" "$4")
fi
dir=/sys/class/infiniband/$dev/ports/$port
[ -d "$dir/gids" ] || {
	echo "gid-index.sh: no such RDMA device/port: $dir" >&2
	exit 1
}
deadline=$(($(date +%s) + ${B2B_GID_WAIT:-10}))
while :; do
	best=
	for f in "$dir"/gids/*; do
		i=${f##*/}
		gid=
		read -r gid <"$f" 2>/dev/null || continue
		case $gid in 0000:0000:0000:0000:0000:ffff:*) ;; *) continue ;; esac
		[ -z "$want" ] || [ "$gid" = "$want" ] || continue
		type=
		{ read -r type <"$dir/gid_attrs/types/$i"; } 2>/dev/null || continue
		case $type in [Rr][Oo][Cc][Ee]\ [vV]2) ;; *) continue ;; esac
		if [ -z "$best" ] || [ "$i" -lt "$best" ]; then best=$i; fi
	done
	if [ -n "$best" ]; then
		echo "$best"
		exit 0
	fi
	if [ "$(date +%s)" -ge "$deadline" ]; then
		echo "gid-index.sh: no RoCE v2 IPv4 GID${ip:+ for $ip} on $dev port $port" >&2
		exit 1
	fi
	sleep 0.2
done
