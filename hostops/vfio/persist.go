package vfio

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/gpuaas/gpuaas/hostops/pci"
	"github.com/gpuaas/gpuaas/internal/atomicfile"
)

// Persistent binding.
//
// Chosen: a udev rule that sets driver_override by PCI address when the
// device appears, plus a modprobe softdep that loads vfio-pci before the
// host GPU driver. Why not the alternatives:
//
//   - "options vfio-pci ids=10de:2335" (modprobe.d) binds by vendor:device:
//     every identical GPU goes to vfio-pci, including any kept for the host,
//     and a device is named by model instead of address.
//   - a systemd unit running a script after boot: by then the host driver
//     has bound the GPU (nvidia-persistenced may already hold it), so the
//     unit has to unbind a device in use.
//
// The rule is numbered 40, before 80-drivers.rules loads the module for the
// device's modalias, so the override is in place before any driver probes;
// RUN loads vfio-pci, which then claims the device. The agent still calls
// Bind on start for every approved function (idempotent: no writes when the
// rule did its job), which repairs the case where a driver in the initramfs
// won the race.

// UdevRulePath and ModprobePath are where Persist writes, under Root.Etc.
const (
	UdevRulePath = "udev/rules.d/40-gpuaas-vfio.rules"
	ModprobePath = "modprobe.d/gpuaas-vfio.conf"
)

// RenderUdevRule renders the udev rule binding addrs to vfio-pci at boot.
// Addresses are validated, sorted and de-duplicated.
func RenderUdevRule(addrs []string) ([]byte, error) {
	as, err := canonical(addrs)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	b.WriteString("# Managed by gpuaas-agent (hostops/vfio): PCI functions passed through to slice VMs.\n")
	b.WriteString("# driver_override is set when the device appears, before 80-drivers.rules loads a host driver.\n")
	for _, a := range as {
		fmt.Fprintf(&b, "ACTION==\"add\", SUBSYSTEM==\"pci\", KERNEL==\"%s\", ATTR{driver_override}=\"vfio-pci\", RUN{builtin}+=\"kmod load vfio-pci\"\n", a)
	}
	return b.Bytes(), nil
}

// RenderModprobe renders the modprobe.d softdeps loading vfio-pci before the
// host drivers of the passed-through functions.
func RenderModprobe(hostDrivers []string) ([]byte, error) {
	var b bytes.Buffer
	b.WriteString("# Managed by gpuaas-agent (hostops/vfio): load vfio-pci before host drivers of passthrough devices.\n")
	ds := slices.Clone(hostDrivers)
	slices.Sort(ds)
	for _, d := range slices.Compact(ds) {
		if d == "" || d == Driver {
			continue
		}
		if err := pci.ValidateDriver(d); err != nil {
			return nil, err
		}
		fmt.Fprintf(&b, "softdep %s pre: vfio-pci\n", strings.ReplaceAll(d, "-", "_"))
	}
	return b.Bytes(), nil
}

func canonical(addrs []string) ([]string, error) {
	as := slices.Clone(addrs)
	for _, a := range as {
		if err := pci.ValidateAddr(a); err != nil {
			return nil, err
		}
	}
	slices.Sort(as)
	return slices.Compact(as), nil
}

// Persist writes the boot-time binding for addrs (the udev rule) and the
// softdeps for hostDrivers (e.g. "nvidia", "snd_hda_intel"). Files are
// replaced atomically and only when their content changes; changed reports
// whether anything was written. Nothing is written when any input is
// invalid.
func (b *Binder) Persist(addrs, hostDrivers []string) (changed bool, err error) {
	rule, err := RenderUdevRule(addrs)
	if err != nil {
		return false, fmt.Errorf("persist vfio-pci binding: %w", err)
	}
	mp, err := RenderModprobe(hostDrivers)
	if err != nil {
		return false, fmt.Errorf("persist vfio-pci binding: %w", err)
	}
	for _, f := range []struct {
		rel  string
		data []byte
	}{{UdevRulePath, rule}, {ModprobePath, mp}} {
		c, err := writeIfChanged(b.Root.EtcPath(f.rel), f.data)
		if err != nil {
			return changed, fmt.Errorf("persist vfio-pci binding: %w", err)
		}
		changed = changed || c
	}
	if changed {
		b.log().Info("persistent vfio-pci binding written", "functions", len(addrs))
	}
	return changed, nil
}

// PersistedAddrs reads back the addresses bound at boot by the udev rule.
func (b *Binder) PersistedAddrs() ([]string, error) {
	raw, err := os.ReadFile(b.Root.EtcPath(UdevRulePath))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read persistent vfio-pci binding: %w", err)
	}
	out, err := parseUdevRule(string(raw))
	if err != nil {
		return nil, fmt.Errorf("read persistent vfio-pci binding: %w", err)
	}
	return out, nil
}

// parseUdevRule extracts KERNEL=="<addr>" from the rule lines.
func parseUdevRule(s string) ([]string, error) {
	var out []string
	for i, line := range strings.Split(s, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		_, rest, ok := strings.Cut(line, `KERNEL=="`)
		addr, _, ok2 := strings.Cut(rest, `"`)
		if !ok || !ok2 || !strings.Contains(line, `ATTR{driver_override}="vfio-pci"`) {
			return nil, fmt.Errorf("line %d: not a gpuaas vfio-pci rule: %q", i+1, line)
		}
		if err := pci.ValidateAddr(addr); err != nil {
			return nil, fmt.Errorf("line %d: %w", i+1, err)
		}
		out = append(out, addr)
	}
	return out, nil
}

func writeIfChanged(p string, data []byte) (bool, error) {
	old, err := os.ReadFile(p)
	if err == nil && bytes.Equal(old, data) {
		return false, nil
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false, err
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return false, err
	}
	return true, atomicfile.WriteFile(p, data, 0o644)
}
