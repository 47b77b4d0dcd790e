#!/usr/bin/env bash
# The README's quick start, run as written by `make test-quickstart` (part of `make test`):
# two daemons on this machine (loopback, plaintext, each with its own socket, shm directory
# and free ports), a region on each, and 10,000 gapped 4 KiB blocks moved from one to the
# other three ways (b2bctl, a Go program, a Python script), every block verified.
# Needs bin/ (make build), Go on PATH, and /usr/bin/python3 with Debian's python3-grpcio,
# python3-protobuf and python3-numpy (make deps installs them). Exits non-zero on any
# failure, printing the daemons' logs; the daemons are stopped on every exit.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -x bin/b2bd ] && [ -x bin/b2bctl ] || { echo "quickstart: bin/b2bd and bin/b2bctl missing: run make build" >&2; exit 1; }
work=$(mktemp -d /tmp/b2bd-quickstart.XXXXXX)
pids=()
cleanup() {
  local rc=$?
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  if [ "$rc" -ne 0 ]; then
    echo "quickstart: FAILED (exit $rc, line ${failed_line:-?}); the daemons' logs follow" >&2
    tail -n 20 "$work"/*.log >&2 || true
  fi
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT
trap 'failed_line=$LINENO' ERR
trap 'exit 130' INT TERM

# wait_up SOCKET: until the daemon answers (10 s at most).
wait_up() {
  for _ in $(seq 100); do bin/b2bctl --socket "$1" status >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "quickstart: no daemon answers on $1" >&2
  return 1
}
# peer_of SOCKET: the daemon's peer address (host:port), from `b2bctl status --json`.
peer_of() { bin/b2bctl --socket "$1" --json status | sed -n 's/.*"peer_address": "\(.*\)".*/\1/p'; }

A=$work/a B=$work/b   # each daemon's directory: its API socket and its shm directory

# Two daemons on this machine: A sends, B receives. Port 0: the kernel picks free ports.
bin/b2bd --insecure --socket $A/b2bd.sock --shm-dir $A/shm --peer-listen 127.0.0.1:0 --data-listen 127.0.0.1:0 >$work/a.log 2>&1 & pids+=($!)
bin/b2bd --insecure --socket $B/b2bd.sock --shm-dir $B/shm --peer-listen 127.0.0.1:0 --data-listen 127.0.0.1:0 >$work/b.log 2>&1 & pids+=($!)
wait_up $A/b2bd.sock && wait_up $B/b2bd.sock
B_PEER=$(peer_of $B/b2bd.sock)       # where A's daemon reaches B's, e.g. 127.0.0.1:41234

export B2BD_SOCKET=$A/b2bd.sock      # the daemon b2bctl talks to (default /run/b2bd/b2bd.sock)
bin/b2bctl status
# A region on each daemon: B's exported under the name "kv", A's filled with random bytes.
bin/b2bctl --socket $B/b2bd.sock register --size $((10000 * 8192)) --export kv
SRC=$(bin/b2bctl register --size $((10000 * 8192)) --fill random)
# 10,000 blocks of 4 KiB with a 4 KiB gap after each (so none merge), every block checksummed at both ends.
bin/b2bctl transfer --src $SRC --peer $B_PEER --dst kv --blocks 10000 --size 4096 --gap 4096 --verify --dst-socket $B/b2bd.sock

# The same from Go and from Python: each registers its own two regions, moves 10,000 gapped blocks, verifies them.
go run ./examples/quickstart --dst $B/b2bd.sock --peer $B_PEER
PYTHONPATH=client/python /usr/bin/python3 examples/quickstart/quickstart.py --dst $B/b2bd.sock --peer $B_PEER
if [ -n "${B2B_QUICKSTART_PYTHON:-}" ]; then   # make test-wheel: the same with the installed wheel, away from the source tree
  (cd "$work" && "$B2B_QUICKSTART_PYTHON" "$OLDPWD/examples/quickstart/quickstart.py" --dst $B/b2bd.sock --peer $B_PEER)
fi

bin/b2bctl regions
echo "quickstart: OK"
