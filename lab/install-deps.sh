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
  # the OCI runtimes of launchable apps (agent/apprun): crun in the lab
  # guest's initramfs and on a cgroup2 host, runc on a cgroup v1/hybrid one
  crun runc
  # a child subreaper for the lab libvirtd (lab/labhost: QEMU reaped at once)
  tini
  # the web console's browser tests (test/e2e TestLabWebConsole, chromedp)
  chromium
)

missing=()
for p in "${PKGS[@]}"; do
  case "$p" in \#*) continue ;; esac
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

# progress turns apt's status lines (APT::Status-Fd) into two lines per
# package (unpacking, installed) and one per 10 % of the download.
progress() {
  local kind id pct msg p last_dl=-10
  while IFS=: read -r kind id pct msg; do
    p=${pct%%.*}
    case "$kind" in
      dlstatus)
        if [ "$p" -ge $((last_dl + 10)) ]; then
          last_dl=$p
          echo "install-deps:   downloading ${p}% (${msg})"
        fi ;;
      pmstatus)
        case "$msg" in
          Unpacking*|Installed*) echo "install-deps:   [${p}%] ${msg}" ;;
        esac ;;
      pmerror) echo "install-deps:   error: ${id}: ${msg}" ;;
    esac
  done
}

if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "install-deps: missing packages ${missing[*]} and not root; install them or run as root" >&2
    exit 1
  fi
  log=$(mktemp "${TMPDIR:-/tmp}/gpuaas-install-deps.XXXXXX")
  echo "install-deps: installing ${#missing[@]} missing package(s) (a few minutes on a fresh machine; apt output in $log):"
  echo "install-deps:   ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  echo "install-deps: apt-get update"
  if ! apt-get update 2>&1 | tee -a "$log" | { grep --line-buffered -E '^(Hit|Get|Err):' || true; } | sed -u 's/^/install-deps:   /'; then
    echo "install-deps: apt-get update failed; see $log" >&2
    exit 1
  fi
  echo "install-deps: apt-get install"
  if ! { apt-get install -y --no-install-recommends -o APT::Status-Fd=3 "${missing[@]}" 3>&1 1>>"$log" 2>&1; } | progress; then
    echo "install-deps: apt-get install failed; the last lines of $log:" >&2
    tail -n 20 "$log" >&2
    exit 1
  fi
  echo "install-deps: installed ${#missing[@]} package(s)"
  rm -f "$log"
fi

if ! command -v go >/dev/null 2>&1; then
  if [ -x /usr/local/go/bin/go ]; then
    echo "install-deps: go is at /usr/local/go/bin; add it to PATH" >&2
  else
    echo "install-deps: Go 1.26 is required (https://go.dev/dl/)" >&2
  fi
  exit 1
fi
