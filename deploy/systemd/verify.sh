#!/bin/bash
# verify.sh: systemd-analyze verify of deploy/systemd/b2bd.service, in a
# scratch root holding this system's units and a freshly built b2bd (the
# unit's ExecStart must exist). The installed unit is verified, man page
# included, by deploy/deb/test-deb.sh.
set -euo pipefail
command -v systemd-analyze >/dev/null || { echo "verify.sh: systemd-analyze not found (apt-get install systemd)" >&2; exit 1; }
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/usr/bin" "$root/etc/systemd/system" "$root/lib"
cp -a /lib/systemd "$root/lib/"
go build -o "$root/usr/bin/b2bd" ./cmd/b2bd
cp deploy/systemd/b2bd.service "$root/etc/systemd/system/"
echo "+ systemd-analyze verify --man=no --root=<scratch> /etc/systemd/system/b2bd.service"
# verify exits 0 on settings it ignores; any message at all is a failure.
msgs=$(systemd-analyze verify --man=no --root="$root" /etc/systemd/system/b2bd.service 2>&1) || { echo "$msgs"; exit 1; }
if [ -n "$msgs" ]; then
	echo "$msgs"
	echo "systemd-analyze verify: messages above; failing" >&2
	exit 1
fi
echo "systemd-analyze verify: OK ($(systemd-analyze --version | head -1))"
