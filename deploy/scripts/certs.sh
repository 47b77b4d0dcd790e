#!/usr/bin/env bash
# Makes a development CA and one certificate per daemon, for mutual TLS
# between daemons. Not for production: use your own PKI there.
# Usage: certs.sh OUT_DIR NAME[=IP,IP...] ...   e.g. certs.sh certs hostA=10.0.0.1 hostB=10.0.0.2
# Each certificate names NAME (its identity, used by export_to), localhost,
# 127.0.0.1 and the given IPs.
set -euo pipefail
out=${1:?usage: certs.sh OUT_DIR NAME[=IP,...] ...}; shift
[ $# -gt 0 ] || set -- a b
mkdir -p "$out"
if [ ! -f "$out/ca.pem" ]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 825 \
    -subj "/CN=b2bd development CA" -keyout "$out/ca-key.pem" -out "$out/ca.pem" 2>/dev/null
fi
for spec in "$@"; do
  name=${spec%%=*}; ips=""; [ "$spec" != "$name" ] && ips=${spec#*=}
  san="DNS:$name,DNS:localhost,IP:127.0.0.1"
  for ip in ${ips//,/ }; do san="$san,IP:$ip"; done
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=$name" \
    -keyout "$out/$name-key.pem" -out "$out/$name.csr" 2>/dev/null
  openssl x509 -req -in "$out/$name.csr" -CA "$out/ca.pem" -CAkey "$out/ca-key.pem" -CAcreateserial -days 825 \
    -extfile <(printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$san") -out "$out/$name.pem" 2>/dev/null
  rm -f "$out/$name.csr"
  echo "certs: $out/$name.pem ($san)"
done
