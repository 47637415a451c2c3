// Package guestgpu is the simulated NVIDIA userspace of the lab's CUDA
// guest image. The lab host has no GPUs to pass through, so the lab's
// domain mapping (hostops/vm LabSized) tells the guest about the slice's
// GPUs the way firmware would: one QEMU fw_cfg entry per GPU
// (opt/gpuaas/gpu<N>, see Entry/ParseEntry) carrying its identity from the
// bundle plan. Inside the guest the kernel's qemu_fw_cfg driver shows them
// under /sys/firmware/qemu_fw_cfg/by_name, and the guest's nvidia-smi
// (lab/guestgpu/nvidia-smi, built into the image's u-root initramfs)
// answers queries from them the way the real tool does: same CSV, same
// messages, same exit codes.
package guestgpu

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// FWCfgPrefix is the fw_cfg directory of the GPU entries; entry N is
// FWCfgPrefix + "gpu" + N.
const FWCfgPrefix = "opt/gpuaas/"

// SysfsDir is where the guest kernel's qemu_fw_cfg driver shows fw_cfg.
const SysfsDir = "/sys/firmware/qemu_fw_cfg"

// SysfsEnv, when set, replaces SysfsDir for the nvidia-smi command.
const SysfsEnv = "GPUAAS_FWCFG_SYSFS"

// DriverVersion is the driver the simulated userspace reports: the open
// kernel driver the production CUDA image pins (images/cuda).
const DriverVersion = "570.124.06"

// GPU is one GPU as nvidia-smi reports it.
type GPU struct {
	Index     int
	Name      string // "NVIDIA H200"
	BusID     string // nvidia-smi form "00000000:18:00.0"
	UUID      string // "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
	MemoryMiB int    // memory.total
}

// Entry keys, named as nvidia-smi's query fields.
const (
	keyName   = "name"
	keyBusID  = "pci.bus_id"
	keyUUID   = "uuid"
	keyMemory = "memory.total"
)

var (
	busIDRE = regexp.MustCompile(`^[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]$`)
	uuidRE  = regexp.MustCompile(`^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	nameRE  = regexp.MustCompile(`^NVIDIA [A-Za-z0-9 .-]{1,60}$`)
	entryRE = regexp.MustCompile(`^gpu([0-9]|[1-9][0-9])$`)
)

// Validate checks g's fields (Index aside).
func (g GPU) Validate() error {
	switch {
	case !nameRE.MatchString(g.Name):
		return fmt.Errorf("GPU name %q: want \"NVIDIA <model>\"", g.Name)
	case !busIDRE.MatchString(g.BusID):
		return fmt.Errorf("GPU %s: bus id %q: want DDDDDDDD:BB:SS.F (upper-case hex)", g.Name, g.BusID)
	case !uuidRE.MatchString(g.UUID):
		return fmt.Errorf("GPU %s: uuid %q: want GPU-<lower-case uuid>", g.BusID, g.UUID)
	case g.MemoryMiB <= 0 || g.MemoryMiB > 1<<24:
		return fmt.Errorf("GPU %s: memory %d MiB out of range", g.BusID, g.MemoryMiB)
	}
	return nil
}

// BusID turns a host PCI address (0000:18:00.0) into nvidia-smi's form
// (00000000:18:00.0).
func BusID(addr string) (string, error) {
	var dom, bus, slot, fn uint
	if n, err := fmt.Sscanf(addr, "%4x:%2x:%2x.%1x", &dom, &bus, &slot, &fn); err != nil || n != 4 || fn > 7 || slot > 0x1f ||
		fmt.Sprintf("%04x:%02x:%02x.%x", dom, bus, slot, fn) != strings.ToLower(addr) {
		return "", fmt.Errorf("PCI address %q: want DDDD:BB:SS.F", addr)
	}
	return fmt.Sprintf("%08X:%02X:%02X.%X", dom, bus, slot, fn), nil
}

// Entry is the fw_cfg content of g: one "key=value" line per field.
func Entry(g GPU) (string, error) {
	if err := g.Validate(); err != nil {
		return "", err
	}
	return fmt.Sprintf("%s=%s\n%s=%s\n%s=%s\n%s=%d MiB\n", keyName, g.Name, keyBusID, g.BusID, keyUUID, g.UUID, keyMemory, g.MemoryMiB), nil
}

// ParseEntry parses an Entry.
func ParseEntry(content string) (GPU, error) {
	var g GPU
	seen := map[string]bool{}
	for i, line := range strings.Split(strings.TrimRight(content, "\x00\n"), "\n") {
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			return GPU{}, fmt.Errorf("line %d: %q is not key=value", i+1, line)
		}
		if seen[k] {
			return GPU{}, fmt.Errorf("line %d: %s given twice", i+1, k)
		}
		seen[k] = true
		switch k {
		case keyName:
			g.Name = v
		case keyBusID:
			g.BusID = v
		case keyUUID:
			g.UUID = v
		case keyMemory:
			n, err := strconv.Atoi(strings.TrimSuffix(v, " MiB"))
			if err != nil {
				return GPU{}, fmt.Errorf("line %d: memory.total %q: want \"<n> MiB\"", i+1, v)
			}
			g.MemoryMiB = n
		default:
			return GPU{}, fmt.Errorf("line %d: unknown key %q", i+1, k)
		}
	}
	if err := g.Validate(); err != nil {
		return GPU{}, err
	}
	return g, nil
}

// ErrNoDriver means the fw_cfg interface is absent (qemu_fw_cfg not
// loaded): to nvidia-smi, the driver is not there.
var ErrNoDriver = errors.New("qemu_fw_cfg is not loaded")

// Read returns the GPUs of the fw_cfg tree at sysfs (SysfsDir in the
// guest), by entry number; none is not an error.
func Read(sysfs string) ([]GPU, error) {
	if _, err := os.Stat(filepath.Join(sysfs, "by_name")); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, ErrNoDriver
		}
		return nil, fmt.Errorf("read fw_cfg: %w", err)
	}
	dir := filepath.Join(sysfs, "by_name", filepath.FromSlash(FWCfgPrefix))
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read fw_cfg %s: %w", FWCfgPrefix, err)
	}
	type numbered struct {
		n int
		g GPU
	}
	var found []numbered
	for _, e := range ents {
		m := entryRE.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name(), "raw"))
		if err != nil {
			return nil, fmt.Errorf("read fw_cfg %s%s: %w", FWCfgPrefix, e.Name(), err)
		}
		g, err := ParseEntry(string(b))
		if err != nil {
			return nil, fmt.Errorf("fw_cfg %s%s: %w", FWCfgPrefix, e.Name(), err)
		}
		n, _ := strconv.Atoi(m[1])
		found = append(found, numbered{n, g})
	}
	sort.Slice(found, func(i, j int) bool { return found[i].n < found[j].n })
	gpus := make([]GPU, len(found))
	for i, f := range found {
		f.g.Index = i
		gpus[i] = f.g
	}
	return gpus, nil
}
