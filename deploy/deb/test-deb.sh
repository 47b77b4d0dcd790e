#!/bin/bash
# test-deb.sh DEB VERSION: lintian (no errors), then on this machine (root):
# dpkg -i, the files and the b2bd group are there, b2bd --version says
# VERSION, b2bd doctor --json (when the binary has it) exits 0 or 1 with
# valid JSON, the installed unit passes systemd-analyze verify (man page
# check included), the package installs over itself (the upgrade path),
# dpkg --purge leaves none of the package's files nor an enable link. The
# group stays after the purge (Debian keeps system groups); this test then
# removes it if it created it, so the machine is as it found it.
set -euo pipefail
deb=$1 version=$2
# The package goes into this host's system: two runs at once (two clones' make test) would remove each
# other's install, so they take turns.
exec 9>"${TMPDIR:-/tmp}/b2bd-test-deb.lock"
flock 9
fail() { echo "test-deb: FAIL: $*" >&2; exit 1; }
sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo" # dpkg -i needs root; CI may run as a sudoer
if ! command -v lintian >/dev/null; then
	echo "test-deb: installing lintian"
	$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q lintian >/dev/null
fi
if dpkg -s b2bd >/dev/null 2>&1; then
	fail "a b2bd package is already installed here; refusing to replace it"
fi

echo "+ lintian $deb"
set +e
lint=$(lintian --tag-display-limit 0 "$deb" 2>&1)
set -e
echo "${lint:-(no tags)}"
if grep -q '^E: ' <<<"$lint"; then fail "lintian reports errors"; fi
echo "lintian: $(grep -c '^E: ' <<<"$lint" || true) errors, $(grep -c '^W: ' <<<"$lint" || true) warnings"

group_before=no
getent group b2bd >/dev/null && group_before=yes
cleanup() {
	if dpkg -s b2bd >/dev/null 2>&1; then $sudo dpkg --purge b2bd >/dev/null 2>&1 || true; fi
	if [ "$group_before" = no ] && getent group b2bd >/dev/null; then $sudo delgroup --system --quiet b2bd || true; fi
}
trap cleanup EXIT

echo "+ dpkg -i $deb"
$sudo dpkg -i "$deb"
files=$(dpkg -L b2bd)
for f in /usr/bin/b2bd /lib/systemd/system/b2bd.service /etc/b2bd/b2bd.toml /usr/share/doc/b2bd/copyright \
	/usr/share/doc/b2bd/changelog.gz /usr/share/man/man8/b2bd.8.gz; do
	[ -e "$f" ] || fail "$f not installed"
done
getent group b2bd >/dev/null || fail "postinst did not create the b2bd group"
echo "group: $(getent group b2bd)"

echo "+ b2bd --version"
out=$(/usr/bin/b2bd --version)
echo "$out"
[[ "$out" == "b2bd $version "* ]] || fail "b2bd --version says \"$out\", want \"b2bd $version ...\""
if [ -x /usr/bin/b2bctl ]; then
	echo "+ b2bctl --help"
	/usr/bin/b2bctl --help >/dev/null 2>&1 || true
fi

echo "+ b2bd doctor --json"
set +e
doc=$(/usr/bin/b2bd doctor --json 2>/tmp/test-deb-doctor.err)
rc=$?
set -e
if grep -qiE 'flag provided but not defined: -json|unknown (command|subcommand)' /tmp/test-deb-doctor.err; then
	echo "test-deb: SKIP b2bd doctor: this b2bd has no doctor subcommand yet ($(head -1 /tmp/test-deb-doctor.err))"
else
	[ "$rc" = 0 ] || [ "$rc" = 1 ] || fail "b2bd doctor --json exited $rc (want 0 or 1): $(cat /tmp/test-deb-doctor.err)"
	python3 -c 'import json,sys; json.load(sys.stdin)' <<<"$doc" || fail "b2bd doctor --json did not print valid JSON"
	echo "b2bd doctor --json: exit $rc, valid JSON ($(wc -c <<<"$doc") bytes)"
fi
rm -f /tmp/test-deb-doctor.err

echo "+ systemd-analyze verify /lib/systemd/system/b2bd.service"
msgs=$(systemd-analyze verify /lib/systemd/system/b2bd.service 2>&1) || { echo "$msgs"; fail "systemd-analyze verify"; }
[ -z "$msgs" ] || { echo "$msgs"; fail "systemd-analyze verify printed messages"; }
echo "systemd-analyze verify: OK"

# The package over itself: the upgrade path of the maintainer scripts
# (prerm upgrade, postinst configure with the version before) must pass.
echo "+ dpkg -i $deb (again: an upgrade)"
$sudo dpkg -i "$deb" >/dev/null || fail "installing over itself (an upgrade) failed"
echo "upgrade over itself: OK"

# An enable link (systemctl enable) must not outlive a purge.
if [ -d /etc/systemd/system ]; then
	$sudo mkdir -p /etc/systemd/system/multi-user.target.wants
	$sudo ln -sf /lib/systemd/system/b2bd.service /etc/systemd/system/multi-user.target.wants/b2bd.service
fi

echo "+ dpkg --purge b2bd"
$sudo dpkg --purge b2bd
[ -L /etc/systemd/system/multi-user.target.wants/b2bd.service ] && fail "the unit's enable link outlived the purge"
dpkg -s b2bd >/dev/null 2>&1 && fail "b2bd still known to dpkg after purge"
left=0
while read -r f; do
	case "$f" in /. | /usr | /usr/bin | /usr/share | /usr/share/doc | /usr/share/man | /usr/share/man/man* | /lib | /lib/systemd | /lib/systemd/system | /etc) continue ;; esac
	# A directory other packages own too (/usr/share/bash-completion/completions) stays.
	if [ -d "$f" ] && [ ! -L "$f" ] && dpkg -S "$f" >/dev/null 2>&1; then continue; fi
	if [ -e "$f" ]; then echo "left after purge: $f" >&2; left=1; fi
done <<<"$files"
for d in /etc/b2bd /run/b2bd; do [ -e "$d" ] && { echo "left after purge: $d" >&2; left=1; }; done
[ "$left" = 0 ] || fail "files left after purge"
echo "purge: no files left ($(wc -l <<<"$files") paths checked)"
if getent group b2bd >/dev/null; then
	echo "group b2bd kept after purge (Debian policy for system groups)$([ "$group_before" = no ] && echo "; this test removes it as it created it")"
fi
echo "test-deb: PASS"
