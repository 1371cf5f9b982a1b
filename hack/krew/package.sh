#!/usr/bin/env bash
# Builds the krew archives of kubectl-kmm and fills in the krew manifest (hack/krew/kmm.yaml).
#
#   hack/krew/package.sh VERSION [OUT]     # OUT defaults to dist/
#   PLATFORMS="linux/amd64" hack/krew/package.sh v0.3.0
#
# Writes OUT/kubectl-kmm_<os>_<arch>.tar.gz for each platform and OUT/kmm.yaml: the template with
# VERSION replaced and, per platform, SHA256 replaced by that archive's sha256. Platforms not built
# keep the SHA256 placeholder, which krew rejects: upload every archive before publishing.
set -euo pipefail

version=${1:?usage: hack/krew/package.sh VERSION [OUT]}
out=${2:-dist}
platforms=${PLATFORMS:-linux/amd64 linux/arm64 darwin/amd64 darwin/arm64}
root=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
# The template without its comments, VERSION filled in.
manifest=$(grep -v "^#" "$root/hack/krew/kmm.yaml" | sed "s/VERSION/${version}/g")

for p in $platforms; do
  os=${p%/*} arch=${p#*/}
  work=$(mktemp -d)
  (cd "$root" && CGO_ENABLED=0 GOOS=$os GOARCH=$arch go build -trimpath -o "$work/kubectl-kmm" ./cmd/kubectl-kmm)
  archive="$out/kubectl-kmm_${os}_${arch}.tar.gz"
  tar -C "$work" -czf "$archive" kubectl-kmm
  rm -rf "$work"
  sum=$(sha256sum "$archive" | cut -d' ' -f1)
  # The SHA256 line that follows this platform's URI.
  manifest=$(printf '%s\n' "$manifest" | awk -v uri="kubectl-kmm_${os}_${arch}.tar.gz" -v sum="$sum" '
    index($0, uri) { hit = 1 }
    hit && /sha256: SHA256/ { sub(/SHA256/, sum); hit = 0 }
    { print }')
  echo "$archive $sum"
done
printf '%s\n' "$manifest" > "$out/kmm.yaml"
echo "$out/kmm.yaml"
