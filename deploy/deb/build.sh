#!/bin/bash
# build.sh VERSION OUTDIR: builds b2bd (and b2bctl when cmd/b2bctl exists,
# else bin/b2bctl when built) and packs them with the systemd unit, the
# default config, man pages, copyright and changelog into
# OUTDIR/b2bd_VERSION_ARCH.deb with dpkg-deb. Run from the repository root.
# The man pages (one per command: b2bd.8, b2bd-doctor.8, b2bctl.1,
# b2bctl-transfer.1, ...) come from the commands' cobra trees (cmd/b2b-man),
# the bash completions from `b2bd completion bash` and `b2bctl completion bash`.
set -euo pipefail
version=$1 out=$2
arch=$(dpkg --print-architecture)
here=deploy/deb
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
root=$stage/root
mkdir -p "$root/DEBIAN" "$root/usr/bin" "$root/lib/systemd/system" "$root/etc/b2bd" \
	"$root/usr/share/doc/b2bd" "$root/usr/share/man/man8" "$root/usr/share/man/man1" \
	"$root/usr/share/bash-completion/completions"

export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}
ldflags="-s -w -X github.com/b2bd/b2bd/internal/daemon.Version=$version"
gobuild() { go build -trimpath -buildmode=pie -ldflags "$ldflags" -o "$1" "$2"; }
gobuild "$root/usr/bin/b2bd" ./cmd/b2bd
gobuild "$root/usr/bin/b2bctl" ./cmd/b2bctl
gobuild "$stage/b2b-man" ./cmd/b2b-man
"$stage/b2b-man" "$stage/man"
install -m 0644 "$stage"/man/*.8 "$root/usr/share/man/man8/"
install -m 0644 "$stage"/man/*.1 "$root/usr/share/man/man1/"
gzip -9n "$root"/usr/share/man/man*/*
for prog in b2bd b2bctl; do
	"$root/usr/bin/$prog" completion bash >"$root/usr/share/bash-completion/completions/$prog"
	chmod 0644 "$root/usr/share/bash-completion/completions/$prog"
done

install -m 0644 deploy/systemd/b2bd.service "$root/lib/systemd/system/b2bd.service"
conf=deploy/b2bd.toml
[ -f "$conf" ] || conf=$here/b2bd.toml
install -m 0644 "$conf" "$root/etc/b2bd/b2bd.toml"
install -m 0644 "$here/copyright" "$root/usr/share/doc/b2bd/copyright"
# A native package: the changelog is changelog.gz, one entry for this build.
{
	echo "b2bd ($version) unstable; urgency=medium"
	echo
	echo "  * Build of $(git rev-parse --short HEAD 2>/dev/null || echo 'an unversioned tree')."
	echo
	echo " -- b2bd maintainers <b2bd-maintainers@lists.example.org>  $(date -u -R -d "@$SOURCE_DATE_EPOCH")"
} | gzip -9n >"$root/usr/share/doc/b2bd/changelog.gz"

for f in postinst prerm postrm; do install -m 0755 "$here/$f" "$root/DEBIAN/$f"; done
install -m 0644 "$here/conffiles" "$root/DEBIAN/conffiles"
size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
sed -e "s/@VERSION@/$version/" -e "s/@ARCH@/$arch/" -e "s/@SIZE@/$size/" "$here/control.in" >"$root/DEBIAN/control"
(cd "$root" && find . -type f ! -path './DEBIAN/*' -printf '%P\0' | sort -z | xargs -0 md5sum) >"$root/DEBIAN/md5sums"
chmod 0644 "$root/DEBIAN/md5sums"
find "$root" -type d -exec chmod 0755 {} +

mkdir -p "$out"
deb=$out/b2bd_${version}_${arch}.deb
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >/dev/null
echo "$deb"
