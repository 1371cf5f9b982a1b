#!/usr/bin/env bash
# keep-fuzz-corpus.sh PKG TARGET: copies the inputs the Go fuzzer found interesting for TARGET (the
# corpus it keeps in $(go env GOCACHE)/fuzz) into PKG/testdata/fuzz/TARGET, where every `go test`
# runs them as seeds and git keeps them. Prints how many were new. `make fuzz` runs it after each
# target unless FUZZ_KEEP=0 (CI: its clone is thrown away).
set -euo pipefail
pkg=$1 target=$2
src="$(go env GOCACHE)/fuzz/$(go list "$pkg")/$target"
dst="$pkg/testdata/fuzz/$target"
[ -d "$src" ] || { echo ">> $target: no cached corpus"; exit 0; }
mkdir -p "$dst"
new=0
for f in "$src"/*; do
	[ -f "$f" ] || continue
	b=$(basename "$f")
	[ -e "$dst/$b" ] && continue
	cp "$f" "$dst/$b"
	new=$((new + 1))
done
echo ">> $target: $new new interesting inputs kept in $dst ($(ls "$dst" | wc -l) in all); commit them"
