#!/usr/bin/env bash
# Installs the Debian packages named as arguments when a command they provide is missing.
# As root it runs apt-get (saying so); otherwise it prints one line naming the package and fails.
set -euo pipefail

# command_of maps a package to a command that proves it is installed.
command_of() {
  case "$1" in
    kmod) echo modprobe ;;
    ca-certificates) echo update-ca-certificates ;;
    qemu-system-x86) echo qemu-system-x86_64 ;;
    containernetworking-plugins) echo /usr/lib/cni/bridge ;;
    *) echo "$1" ;;
  esac
}

missing=()
for pkg in "$@"; do
  cmd=$(command_of "$pkg")
  if ! command -v "$cmd" >/dev/null 2>&1 && [ ! -x "/usr/sbin/$cmd" ] && [ ! -x "/sbin/$cmd" ]; then
    missing+=("$pkg")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
  echo "missing Debian package(s): ${missing[*]} — install them with: sudo apt-get install -y --no-install-recommends ${missing[*]}" >&2
  exit 1
fi
echo ">> installing Debian package(s) the tests need: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
