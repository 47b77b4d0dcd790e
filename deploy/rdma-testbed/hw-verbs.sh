#!/bin/bash
# hw-verbs.sh - runs the verbs transport's hardware tests (internal/transport/verbs, TestHW*) in VM A of the
# testbed; VM B only powers off. The tests connect two transports on A's rxe0 in one process (loopback).
#
#   CGO_ENABLED=1 GOAMD64=v1 go test -c -o bin/verbs.test ./internal/transport/verbs
#   B2B_HW_TEST=$PWD/bin/verbs.test B2B_HW_RUN='^TestHW(Refused|Revoke|DeadlineStops)' \
#       deploy/rdma-testbed/run-pair.sh "$PWD/deploy/rdma-testbed/hw-verbs.sh" "$PWD/deploy/rdma-testbed/hw-verbs.sh"
#
# run-pair.sh passes no environment of its own choosing into the VMs, so the test binary and the -test.run
# pattern come from $B2B_OUT/hw.env when present (written by the caller), else from the defaults below.
set -euo pipefail
: "${B2B_ROLE:?run me through run-pair.sh}" "${B2B_OUT:?}"
[ "$B2B_ROLE" = a ] || exit 0
[ -f "$B2B_OUT/hw.env" ] && . "$B2B_OUT/hw.env"
bin=${B2B_HW_TEST:-$(dirname "$(readlink -f "$0")")/../../bin/verbs.test}
run=${B2B_HW_RUN:-^TestHW}
echo "[hw-verbs] $bin -test.run '$run'"
cd /tmp
"$bin" -test.run "$run" -test.v -test.timeout "${B2B_HW_TIMEOUT:-600s}"
