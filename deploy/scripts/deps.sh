#!/usr/bin/env bash
# Installs the Debian packages b2bd's build and tests need, only when missing.
set -euo pipefail
pkgs=(gcc make protobuf-compiler protobuf-compiler-grpc python3-grpcio python3-protobuf python3-numpy
      python3-pip python3-setuptools python3-wheel python3-venv libibverbs-dev rdma-core ibverbs-providers)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "deps: installing ${missing[*]}"
sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
