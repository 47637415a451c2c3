#!/usr/bin/env bash
# Installs what gpuaas needs to build, test and run its lab on a fresh
# Debian/Ubuntu machine as root. Idempotent: does nothing when all is there.
set -euo pipefail

PKGS=(
  # build
  gcc pkg-config libvirt-dev
  # host operations and their real-part tests
  iproute2 nftables openvswitch-switch dnsmasq-base qemu-utils util-linux
  nvme-cli gdisk fdisk parted e2fsprogs lvm2 kmod iputils-ping busybox procps psmisc ethtool
  mtools dosfstools systemd
  # real signatures for the disk-safety tests (LUKS, bcache)
  cryptsetup-bin bcache-tools
  # the lab guest image and the slice VMs: libvirt + QEMU (TCG), OVMF, UKI
  libvirt-daemon-system libvirt-clients libxml2-utils qemu-system-x86 ovmf
  systemd-boot-efi binutils linux-image-amd64
  # a child subreaper for the lab libvirtd (lab/labhost: QEMU reaped at once)
  tini
)

missing=()
for p in "${PKGS[@]}"; do
  case "$p" in \#*) continue ;; esac
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "install-deps: missing packages ${missing[*]} and not root; install them or run as root" >&2
    exit 1
  fi
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! command -v go >/dev/null 2>&1; then
  if [ -x /usr/local/go/bin/go ]; then
    echo "install-deps: go is at /usr/local/go/bin; add it to PATH" >&2
  else
    echo "install-deps: Go 1.26 is required (https://go.dev/dl/)" >&2
  fi
  exit 1
fi
