#!/usr/bin/env bash
# setup.sh - prepare the two-VM Soft-RoCE (rdma_rxe) testbed. Idempotent; a re-run with the cache present
# takes well under a second.
#
#   deploy/rdma-testbed/setup.sh [--refresh] [--quiet]
#     --refresh  re-resolve the kernel apt offers now (default: keep using the cached one)
#     --quiet    print only the work actually done (run-pair.sh uses this)
#
# What it does:
#   1. apt-get installs (only what is missing) the host tools: qemu-system-x86 busybox-static rdma-core
#      ibverbs-providers libibverbs-dev perftest cpio kmod iproute2 ibverbs-utils xz-utils.
#   2. Resolves the Debian 12 kernel that the metapackage linux-image-amd64 depends on
#      (linux-image-6.1.0-NN-amd64, never the -cloud flavour: that one lacks rdma_rxe.ko), fetches it with
#      `apt-get download`, unpacks it with `dpkg -x`, keeps vmlinuz plus the handful of modules we need.
#      On a PVH-capable kernel it also extracts the uncompressed vmlinux ELF (faster boot under TCG).
#   3. Builds a gzip cpio initramfs: busybox-static, those modules (in dependency order) and init.sh as /init.
#   4. Writes $CACHE/testbed.env (KVER, KERNEL, INITRD) for run-pair.sh.
#
# Knobs (environment):
#   B2B_TESTBED_CACHE       cache directory (default <repo>/.cache/rdma-testbed)
#   B2B_TESTBED_KERNEL_PKG  pin a kernel package, e.g. linux-image-6.1.0-56-amd64 (default: what apt offers
#                           the first time; later runs reuse the cached one unless --refresh is given)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CACHE=${B2B_TESTBED_CACHE:-$REPO/.cache/rdma-testbed}
# ibverbs-utils (ibv_devices, ibv_devinfo, ibv_rc_pingpong) is not strictly needed but makes debugging possible.
PKGS=(qemu-system-x86 busybox-static rdma-core ibverbs-providers libibverbs-dev perftest cpio kmod iproute2
	ibverbs-utils xz-utils)
# Modules to load, in this order; setup.sh expands each into its dependencies (depmod/modprobe --show-depends).
# crc32_generic is not a dependency of anything but rdma_rxe needs the crc32 crypto algorithm at
# `rdma link add` time ("No such file or directory" without it). The expanded order is the one that was
# seen to work: crc32_generic virtio_ring virtio virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci
# netfs fscache 9pnet 9p 9pnet_virtio udp_tunnel ip6_udp_tunnel ib_core ib_uverbs rdma_rxe failover
# net_failover virtio_net.
MOD_TARGETS=(crc32_generic virtio_pci 9p 9pnet_virtio rdma_rxe virtio_net)

refresh=0 quiet=0
for arg in "$@"; do
	case $arg in
	--refresh) refresh=1 ;;
	--quiet | -q) quiet=1 ;;
	-h | --help)
		sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"
		exit 0
		;;
	*)
		echo "setup.sh: unknown argument: $arg" >&2
		exit 2
		;;
	esac
done

say() { printf 'setup: %s\n' "$*" >&2; }       # work being done: always printed
note() { [ "$quiet" = 1 ] || say "$@"; } # nothing to do: silenced by --quiet
die() {
	printf 'setup: ERROR: %s\n' "$*" >&2
	exit 1
}
is_root() { [ "$(id -u)" = 0 ]; }

export DEBIAN_FRONTEND=noninteractive

apt_lists_present() { compgen -G '/var/lib/apt/lists/*_Packages*' >/dev/null; }
apt_update() {
	is_root || die "apt-get update needs root"
	say "apt-get update"
	apt-get update -q >&2 || die "apt-get update failed"
}

# --- 1. host packages ------------------------------------------------------------------------------------
pkg_installed() { [ "$(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null)" = installed ]; }
install_packages() {
	local missing=() p
	for p in "${PKGS[@]}"; do pkg_installed "$p" || missing+=("$p"); done
	if [ "${#missing[@]}" = 0 ]; then
		note "packages: all ${#PKGS[@]} present"
		return
	fi
	is_root || die "missing packages (${missing[*]}); run setup.sh as root"
	apt_lists_present || apt_update
	say "apt-get install ${missing[*]}"
	if ! apt-get install -y -q --no-install-recommends "${missing[@]}" >&2; then
		say "apt-get install failed; refreshing package lists and retrying"
		apt_update
		apt-get install -y -q --no-install-recommends "${missing[@]}" >&2 || die "apt-get install failed"
	fi
}

# --- 2. kernel ---------------------------------------------------------------------------------------------
resolve_kernel_pkg() {
	local dep
	apt_lists_present || apt_update
	dep=$(apt-cache depends linux-image-amd64 2>/dev/null |
		sed -n 's/^ *|\{0,1\}Depends: \(linux-image-[0-9][^ ]*-amd64\)$/\1/p' | head -n 1) || true
	if [ -z "$dep" ]; then
		apt_update
		dep=$(apt-cache depends linux-image-amd64 2>/dev/null |
			sed -n 's/^ *|\{0,1\}Depends: \(linux-image-[0-9][^ ]*-amd64\)$/\1/p' | head -n 1) || true
	fi
	[ -n "$dep" ] || die "cannot resolve the dependency of linux-image-amd64 (apt-cache depends linux-image-amd64)"
	printf '%s\n' "$dep"
}

KPKG="" KVER=""
pick_kernel() {
	local cached=
	[ -f "$CACHE/testbed.env" ] && cached=$(sed -n 's/^KPKG=//p' "$CACHE/testbed.env")
	if [ -n "${B2B_TESTBED_KERNEL_PKG:-}" ]; then
		KPKG=$B2B_TESTBED_KERNEL_PKG
	elif [ "$refresh" = 0 ] && [ -n "$cached" ] && [ -f "$CACHE/kernel/${cached#linux-image-}/.complete" ]; then
		KPKG=$cached # keep using the cached kernel: runs stay comparable (--refresh re-resolves)
	else
		KPKG=$(resolve_kernel_pkg)
		say "kernel: linux-image-amd64 depends on $KPKG"
	fi
	case $KPKG in
	*-cloud-amd64) die "$KPKG is the -cloud flavour, which has no rdma_rxe.ko; use the stock -amd64 one" ;;
	linux-image-*-amd64) ;;
	*) die "unexpected kernel package name: $KPKG" ;;
	esac
	KVER=${KPKG#linux-image-}
}

fetch_kernel() {
	local kdir=$CACHE/kernel/$KVER deb tmp m f name
	if [ -f "$kdir/.complete" ]; then
		note "kernel: $KVER cached ($kdir)"
		return
	fi
	mkdir -p "$CACHE/debs"
	deb=$(compgen -G "$CACHE/debs/${KPKG}_*_amd64.deb" | head -n 1) || true
	if [ -z "$deb" ]; then
		say "kernel: apt-get download $KPKG"
		apt_lists_present || apt_update
		# apt warns that it cannot drop privileges to _apt for a directory _apt cannot write: harmless.
		if ! (cd "$CACHE/debs" && apt-get download -q "$KPKG" >&2); then
			apt_update
			(cd "$CACHE/debs" && apt-get download -q "$KPKG" >&2) || die "apt-get download $KPKG failed"
		fi
		deb=$(compgen -G "$CACHE/debs/${KPKG}_*_amd64.deb" | head -n 1) || die "downloaded .deb not found"
	fi
	say "kernel: dpkg -x $(basename "$deb")"
	tmp=$CACHE/kernel/.extract.$$
	rm -rf "$tmp" "$kdir"
	mkdir -p "$tmp" "$kdir/modules"
	dpkg -x "$deb" "$tmp"
	[ -f "$tmp/boot/vmlinuz-$KVER" ] || die "no boot/vmlinuz-$KVER in $deb"
	[ -d "$tmp/lib/modules/$KVER" ] || die "no lib/modules/$KVER in $deb"
	depmod -b "$tmp" "$KVER"
	: >"$kdir/modules.order"
	for m in "${MOD_TARGETS[@]}"; do
		modprobe -d "$tmp" -S "$KVER" --show-depends "$m" >"$tmp/deps" || die "module $m not found in $KPKG"
		while read -r kind f _; do
			[ "$kind" = insmod ] || continue # "builtin NAME" lines need nothing
			name=$(basename "$f")
			name=${name%.xz}
			name=${name%.zst}
			name=${name%.ko}
			grep -qx "$name" "$kdir/modules.order" && continue
			case $f in
			*.ko) cp "$f" "$kdir/modules/$name.ko" ;;
			*.ko.xz) xz -dc "$f" >"$kdir/modules/$name.ko" ;;
			*.ko.zst) zstd -qdc "$f" >"$kdir/modules/$name.ko" ;;
			*) die "unexpected module file $f" ;;
			esac
			echo "$name" >>"$kdir/modules.order"
		done <"$tmp/deps"
	done
	cp "$tmp/boot/vmlinuz-$KVER" "$kdir/vmlinuz"
	cp "$tmp/boot/config-$KVER" "$kdir/config"
	if grep -qx 'CONFIG_PVH=y' "$kdir/config" && extract_vmlinux "$kdir/vmlinuz" "$kdir/vmlinux"; then
		say "kernel: extracted the uncompressed ELF vmlinux (PVH boot: about 3 s faster per VM under TCG)"
	else
		say "kernel: no PVH vmlinux; booting the compressed vmlinuz"
	fi
	echo "$KPKG $(basename "$deb")" >"$kdir/.complete"
	rm -rf "$tmp"
	say "kernel: modules $(tr '\n' ' ' <"$kdir/modules.order")"
}

# --- 3. initramfs ------------------------------------------------------------------------------------------
build_initramfs() {
	local kdir=$CACHE/kernel/$KVER out=$CACHE/initramfs-$KVER.cpio.gz stamp busybox stage
	busybox=$(command -v busybox || true)
	[ -x /bin/busybox ] && busybox=/bin/busybox
	[ -n "$busybox" ] || die "busybox not found (package busybox-static)"
	file_is_static "$busybox" || die "$busybox is not statically linked (install busybox-static)"
	stamp=$({
		cat "$kdir/.complete" "$kdir/modules.order"
		sha256sum "$HERE/init.sh" "$HERE/setup.sh" "$busybox"
	} | sha256sum | cut -d' ' -f1)
	if [ -f "$out" ] && [ "$(cat "$out.stamp" 2>/dev/null)" = "$stamp" ]; then
		note "initramfs: up to date ($out)"
		return
	fi
	say "initramfs: building $out"
	stage=$CACHE/.initramfs.$$
	rm -rf "$stage"
	mkdir -p "$stage"/{bin,dev,proc,sys,mnt,host,lib/modules}
	cp "$busybox" "$stage/bin/busybox"
	ln -s busybox "$stage/bin/sh" # /init's interpreter; init.sh installs the other applets itself
	cp "$HERE/init.sh" "$stage/init"
	chmod 0755 "$stage/init" "$stage/bin/busybox"
	cp "$kdir"/modules/*.ko "$stage/lib/modules/"
	cp "$kdir/modules.order" "$stage/lib/modules/order"
	# The kernel opens /dev/console for init before init runs; init also re-opens it after mounting devtmpfs.
	if is_root; then mknod -m 600 "$stage/dev/console" c 5 1; fi
	find "$stage" -exec touch -h -d @0 {} +
	(cd "$stage" && find . -print0 | LC_ALL=C sort -z |
		cpio --null -o -H newc --reproducible --owner=0:0 --quiet) | gzip -9n >"$out.tmp"
	mv "$out.tmp" "$out"
	echo "$stamp" >"$out.stamp"
	rm -rf "$stage"
	say "initramfs: $(du -k "$out" | cut -f1) KiB"
}

# extract_vmlinux BZIMAGE OUT: find the compressed payload in a bzImage and decompress it into an ELF
# (what the kernel's scripts/extract-vmlinux does). QEMU boots such an ELF directly through its PVH entry
# point, skipping the in-guest decompression, which under TCG costs about 3 s.
extract_vmlinux() {
	local in=$1 out=$2 magic tool off
	for pair in $'\xfd7zXZ:xz -dc' $'\x28\xb5\x2f\xfd:zstd -qdc' $'\x1f\x8b\x08:gzip -dc'; do
		magic=${pair%%:*} tool=${pair#*:}
		command -v "${tool%% *}" >/dev/null || continue
		for off in $(LC_ALL=C grep -abo "$magic" "$in" 2>/dev/null | cut -d: -f1 | head -n 5); do
			# trailing garbage after the stream makes the decompressor complain: judge by the output
			tail -c +$((off + 1)) "$in" | $tool >"$out.tmp" 2>/dev/null || true
			if [ "$(head -c 4 "$out.tmp" | od -An -c | tr -d ' ')" = '177ELF' ]; then
				mv "$out.tmp" "$out"
				return 0
			fi
		done
	done
	rm -f "$out.tmp"
	return 1
}

file_is_static() {
	# A static ELF has no PT_INTERP; `ldd` prints "not a dynamic executable" for it.
	! ldd "$1" >/dev/null 2>&1
}

write_env() {
	local env=$CACHE/testbed.env new kernel=$CACHE/kernel/$KVER/vmlinux
	[ -f "$kernel" ] || kernel=$CACHE/kernel/$KVER/vmlinuz
	new="KPKG=$KPKG
KVER=$KVER
KERNEL=$kernel
INITRD=$CACHE/initramfs-$KVER.cpio.gz"
	if [ "$(cat "$env" 2>/dev/null)" != "$new" ]; then
		printf '%s\n' "$new" >"$env.tmp"
		mv "$env.tmp" "$env"
	fi
	note "ready: $env"
}

main() {
	mkdir -p "$CACHE"
	# keep the cache (and the run outputs under it) out of `git status` without touching the repo's .gitignore
	[ -f "$CACHE/.gitignore" ] || echo '*' >"$CACHE/.gitignore"
	# Serialise concurrent setups (two run-pair.sh started at once on a fresh cache).
	exec 9>"$CACHE/.setup.lock"
	flock 9
	install_packages
	pick_kernel
	fetch_kernel
	build_initramfs
	write_env
}
main
