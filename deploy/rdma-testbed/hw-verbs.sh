#!/bin/bash
# hw-verbs.sh - runs the verbs transport's hardware tests (internal/transport/verbs, TestHW*) in the testbed.
#
#   CGO_ENABLED=1 GOAMD64=v1 go test -c -o bin/verbs.test ./internal/transport/verbs
#   mkdir -p OUT; echo "B2B_HW_RUN='^TestHW(Refused|Revoke|DeadlineStops)'" > OUT/hw.env
#   deploy/rdma-testbed/run-pair.sh "$PWD/deploy/rdma-testbed/hw-verbs.sh" "$PWD/deploy/rdma-testbed/hw-verbs.sh" --out OUT
#
# The VMs get no environment from the caller, so settings come from $B2B_OUT/hw.env when present:
#   B2B_HW_TEST  the test binary (default <repo>/bin/verbs.test)
#   B2B_HW_RUN   -test.run pattern (default ^TestHW; ^TestHWPrepared runs the prepared-transfer tests and
#                TestHWPreparedPost, the plan+post figure of 10,000 WRs per posting thread count)
#   B2B_HW_ARGS  extra test-binary flags, e.g. '-test.bench=HWPreparedWrite -test.benchtime=20x'
#   B2B_HW_PAIR  1: both VMs run the binary (two-host tests such as TestHWPair, with B2B_PAIR=1 and any
#                B2B_PAIR_* settings from hw.env); otherwise only A runs it (loopback tests on A's rxe0)
#                and B powers off at once.
set -euo pipefail
: "${B2B_ROLE:?run me through run-pair.sh}" "${B2B_OUT:?}"
set -a
# shellcheck source=/dev/null
[ -f "$B2B_OUT/hw.env" ] && . "$B2B_OUT/hw.env"
set +a
[ "$B2B_ROLE" = a ] || [ "${B2B_HW_PAIR:-0}" = 1 ] || exit 0
bin=${B2B_HW_TEST:-$(dirname "$(readlink -f "$0")")/../../bin/verbs.test}
run=${B2B_HW_RUN:-^TestHW}
echo "[hw-verbs] $bin -test.run '$run'"
cd /tmp
# The log goes to $B2B_OUT too; TestHWPreparedPost's figures (plan+post of 10,000 WRs per posting thread
# count) are collected in $B2B_OUT/prepared-post.txt.
rc=0
# shellcheck disable=SC2086 # B2B_HW_ARGS is a list of flags
"$bin" -test.run "$run" -test.v -test.timeout "${B2B_HW_TIMEOUT:-600s}" ${B2B_HW_ARGS:-} 2>&1 | tee "$B2B_OUT/hw-verbs-$B2B_ROLE.log" || rc=$?
grep -h 'PREPARED-POST' "$B2B_OUT/hw-verbs-$B2B_ROLE.log" > "$B2B_OUT/prepared-post.txt" 2>/dev/null || true
exit "$rc"
