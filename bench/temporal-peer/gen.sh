#!/usr/bin/env bash
# Regenerates gen/ (the Go stubs of proto/inventory.proto and proto/payment.proto), which is
# committed so that building the peer needs no protobuf compiler:
#
#   bench/temporal-peer/gen.sh
#
# protoc: the one the workspace builds with (the protoc-bin-vendored crate, in cargo's registry
# once any workspace crate has been built; or PROTOC=...). The plugins, from the Go module
# proxy at the versions below, go to a temporary GOBIN.
set -euo pipefail
cd "$(dirname "$0")"
export GOTOOLCHAIN=local
PROTOC_GEN_GO=google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
PROTOC_GEN_GO_GRPC=google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
MODULE=sagaworks.dev/bench/temporal-peer

if [ -z "${PROTOC:-}" ]; then
    PROTOC="$(find "${CARGO_HOME:-$HOME/.cargo}"/registry/src -path '*/protoc-bin-vendored-linux-x86_64-*/bin/protoc' 2>/dev/null | sort -V | tail -n 1)"
fi
[ -x "${PROTOC:-}" ] || { echo "no protoc: build a workspace crate first (cargo fetches protoc-bin-vendored) or set PROTOC" >&2; exit 1; }
INCLUDE="$(dirname "$(dirname "$PROTOC")")/include"

bin="$(mktemp -d)"
trap 'rm -rf "$bin"' EXIT
GOBIN="$bin" go install "$PROTOC_GEN_GO"
GOBIN="$bin" go install "$PROTOC_GEN_GO_GRPC"

rm -rf gen && mkdir gen
maps="Minventory.proto=$MODULE/gen/inventorypb,Mpayment.proto=$MODULE/gen/paymentpb"
PATH="$bin:$PATH" "$PROTOC" -I ../../proto -I "$INCLUDE" \
    --go_out=gen --go_opt="module=$MODULE/gen,$maps" \
    --go-grpc_out=gen --go-grpc_opt="module=$MODULE/gen,$maps" \
    inventory.proto payment.proto
echo "gen/ regenerated with $("$PROTOC" --version), ${PROTOC_GEN_GO##*/}, ${PROTOC_GEN_GO_GRPC##*/}"
