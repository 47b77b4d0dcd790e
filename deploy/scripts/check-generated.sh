#!/usr/bin/env bash
# Fails when the committed Go and Python stubs differ from what `make generate`
# would produce from proto/.
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$top"
go build -o "$tmp/protoc-gen-go" google.golang.org/protobuf/cmd/protoc-gen-go
go build -o "$tmp/protoc-gen-go-grpc" google.golang.org/grpc/cmd/protoc-gen-go-grpc
mkdir -p "$tmp/go" "$tmp/py"
protoc -I proto \
  --plugin=protoc-gen-go="$tmp/protoc-gen-go" --go_out="$tmp/go" --go_opt=paths=source_relative \
  --plugin=protoc-gen-go-grpc="$tmp/protoc-gen-go-grpc" --go-grpc_out="$tmp/go" --go-grpc_opt=paths=source_relative \
  b2b/v1/b2b.proto
# Each transport's own messages (Go only).
tprotos=(b2b/transport/verbs/v1/verbs.proto b2b/transport/tcp/v1/tcp.proto b2b/transport/local/v1/local.proto)
protoc -I proto \
  --plugin=protoc-gen-go="$tmp/protoc-gen-go" --go_out="$tmp/go" --go_opt=paths=source_relative \
  "${tprotos[@]}"
protoc -I proto --python_out="$tmp/py" --pyi_out="$tmp/py" \
  --plugin=protoc-gen-grpc_python="$(command -v grpc_python_plugin)" --grpc_python_out="$tmp/py" \
  b2b/v1/b2b.proto
fail=0
for f in b2b.pb.go b2b_grpc.pb.go; do
  cmp -s "$tmp/go/b2b/v1/$f" "proto/b2b/v1/$f" || { echo "stale: proto/b2b/v1/$f (run make generate)"; fail=1; }
done
for p in "${tprotos[@]}"; do
  f=${p%.proto}.pb.go
  cmp -s "$tmp/go/$f" "proto/$f" || { echo "stale: proto/$f (run make generate)"; fail=1; }
done
for f in b2b_pb2.py b2b_pb2.pyi b2b_pb2_grpc.py; do
  cmp -s "$tmp/py/b2b/v1/$f" "client/python/b2b/v1/$f" || { echo "stale: client/python/b2b/v1/$f (run make generate)"; fail=1; }
done
[ $fail -eq 0 ] && echo "generated code is current"
exit $fail
