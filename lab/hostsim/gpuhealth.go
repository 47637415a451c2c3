package hostsim

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/hostops/gpuhealth"
)

// GPU health, as a real host shows it:
//
//   - every PCI function has a "config" file (its config space header:
//     vendor, device, class); GPUOffBus makes a GPU's read all-ones, as a
//     device that dropped off the bus does, while its cached sysfs
//     attributes stay;
//   - dev/kmsg holds /dev/kmsg-format records; LogXID appends the nvidia
//     driver's "NVRM: Xid" line for a GPU on the nvidia driver, and
//     ClearKernelLog starts a new boot's log;
//   - run/hostsim/bin/nvidia-smi answers the agent's telemetry query and
//     "nvlink -e" for the GPUs on the nvidia driver when it runs (GPUs on
//     vfio-pci are invisible to it, "No devices were found" when none is
//     left), from run/hostsim/nvidia-smi/<bdf>.{query,nvlink}, which
//     SetGPUHealth renders.

// GPUHealth is what the simulated nvidia-smi reports for one GPU.
type GPUHealth struct {
	ECCUncorrected int64
	RemapPending   bool
	RemapFailure   bool
	HWThermal      bool
	SWThermal      bool
	TempC          int
	// NVLinkRecovery and NVLinkCRC are error counters per link (18 links
	// on an H200; links not listed count 0).
	NVLinkRecovery map[int]int64
	NVLinkCRC      map[int]int64
}

// HealthyGPU is a GPU at idle temperature without errors.
var HealthyGPU = GPUHealth{TempC: 34}

const nvlinks = 18

// configSpace renders the first 64 bytes of a function's config space.
func configSpace(k Kind) ([]byte, error) {
	b := make([]byte, 64)
	for _, f := range []struct {
		off  int
		hexs string
		n    int
	}{{0, k.Vendor, 2}, {2, k.Device, 2}, {0x2c, orDefault(k.SubsystemVendor, "0x0000"), 2}, {0x2e, orDefault(k.SubsystemDevice, "0x0000"), 2}} {
		v, err := strconv.ParseUint(strings.TrimPrefix(f.hexs, "0x"), 16, 16)
		if err != nil {
			return nil, fmt.Errorf("config space: %q is not a 16-bit hex id", f.hexs)
		}
		binary.LittleEndian.PutUint16(b[f.off:], uint16(v))
	}
	c, err := strconv.ParseUint(strings.TrimPrefix(k.Class, "0x"), 16, 32)
	if err != nil {
		return nil, fmt.Errorf("config space: class %q is not hex", k.Class)
	}
	b[9], b[10], b[11] = byte(c), byte(c>>8), byte(c>>16) // prog-if, subclass, base class
	return b, nil
}

func (g *gen) gpuHealth() error {
	var gpus []string
	for _, d := range g.devs {
		if isGPU(d.kind) {
			gpus = append(gpus, d.Addr)
		}
	}
	slices.Sort(gpus)
	dir := g.root.RunPath("hostsim", "nvidia-smi")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := writeFile(filepath.Join(dir, "gpus"), strings.Join(gpus, "\n")+"\n"); err != nil {
		return err
	}
	for _, a := range gpus {
		if err := renderGPUHealth(g.root, a, HealthyGPU); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(g.root.RunPath("hostsim", "bin"), 0o755); err != nil {
		return err
	}
	script := strings.NewReplacer("@QUERY@", strings.Join(gpuhealth.QueryArgs(), " ")).Replace(nvidiaSMIScript)
	if err := os.WriteFile(g.root.RunPath("hostsim", "bin", "nvidia-smi"), []byte(script), 0o755); err != nil {
		return err
	}
	boot := []string{"Linux version 6.8.0-49-generic (buildd@lcy02-amd64-103)", "Command line: " + g.p.Cmdline}
	var log strings.Builder
	for i, m := range boot {
		fmt.Fprintf(&log, "6,%d,%d,-;%s\n", i, i*1000, m)
	}
	return writeFile(g.root.DevPath("kmsg"), log.String())
}

// nvidiaSMIScript is the simulated nvidia-smi: the agent's query and
// nvlink -e, numbering the GPUs on the nvidia driver from 0 as the real
// one does.
const nvidiaSMIScript = `#!/bin/sh
# Simulated nvidia-smi of a lab/hostsim host (generated): answers the agent's
# GPU telemetry query and "nvlink -e" for the GPUs bound to the nvidia driver.
base=$(cd "$(dirname "$0")/../../.." && pwd) || exit 9
sys=$base/sys
dir=$base/run/hostsim/nvidia-smi
case "$*" in
"@QUERY@") ext=query ;;
"nvlink -e") ext=nvlink ;;
*) echo "simulated nvidia-smi: unsupported arguments: $*" >&2; exit 2 ;;
esac
i=0
for g in $(cat "$dir/gpus"); do
	case "$(readlink "$sys/bus/pci/devices/$g/driver" 2>/dev/null)" in
	*/nvidia) ;;
	*) continue ;;
	esac
	sed "s/@IDX@/$i/" "$dir/$g.$ext" || exit 9
	i=$((i + 1))
done
if [ "$i" = 0 ]; then
	echo "No devices were found"
	exit 6
fi
`

func isGPU(k Kind) bool {
	return k.Vendor == "0x10de" && (strings.HasPrefix(k.Class, "0x0302") || strings.HasPrefix(k.Class, "0x0300"))
}

func renderGPUHealth(root hostops.Root, addr string, h GPUHealth) error {
	dir := root.RunPath("hostsim", "nvidia-smi")
	yn := func(b bool, y, n string) string {
		if b {
			return y
		}
		return n
	}
	bus := "0000" + strings.ToUpper(addr)
	q := fmt.Sprintf("@IDX@, %s, %d, %s, %s, %s, %s, %d\n", bus, h.ECCUncorrected, yn(h.RemapPending, "Yes", "No"), yn(h.RemapFailure, "Yes", "No"),
		yn(h.HWThermal, "Active", "Not Active"), yn(h.SWThermal, "Active", "Not Active"), h.TempC)
	uuid := "GPU-" + hex.EncodeToString([]byte(addr))[:16]
	var nv strings.Builder
	fmt.Fprintf(&nv, "GPU @IDX@: NVIDIA H200 (UUID: %s)\n", uuid)
	for l := range nvlinks {
		fmt.Fprintf(&nv, "\t Link %d: Replay Errors: 0\n\t Link %d: Recovery Errors: %d\n\t Link %d: CRC Errors: %d\n", l, l, h.NVLinkRecovery[l], l, h.NVLinkCRC[l])
	}
	if err := writeFile(filepath.Join(dir, addr+".query"), q); err != nil {
		return err
	}
	return writeFile(filepath.Join(dir, addr+".nvlink"), nv.String())
}

// onNvidia checks that addr is a GPU bound to the nvidia driver: only
// then does the host's driver log Xids for it and nvidia-smi see it.
func onNvidia(root hostops.Root, addr string) error {
	if err := validAddr(addr); err != nil {
		return err
	}
	if _, err := os.Stat(root.RunPath("hostsim", "nvidia-smi", addr+".query")); err != nil {
		return fmt.Errorf("%s is not a GPU of this host", addr)
	}
	t, err := os.Readlink(root.SysPath("bus/pci/devices", addr, "driver"))
	if err != nil || filepath.Base(t) != "nvidia" {
		drv := "no driver"
		if err == nil {
			drv = filepath.Base(t)
		}
		return fmt.Errorf("GPU %s is on %s, not nvidia: the host's nvidia driver does not see it", addr, drv)
	}
	return nil
}

// SetGPUHealth sets what nvidia-smi reports for the GPU at addr, which
// must be on the nvidia driver.
func SetGPUHealth(root hostops.Root, addr string, h GPUHealth) error {
	if err := onNvidia(root, addr); err != nil {
		return fmt.Errorf("set GPU health: %w", err)
	}
	return renderGPUHealth(root, addr, h)
}

// LogXID appends the nvidia driver's Xid record for the GPU at addr (on
// the nvidia driver) to the kernel log.
func LogXID(root hostops.Root, addr string, code int, detail string) error {
	if err := onNvidia(root, addr); err != nil {
		return fmt.Errorf("log Xid %d: %w", code, err)
	}
	if strings.ContainsAny(detail, "\n\x00") {
		return fmt.Errorf("log Xid %d: detail must be one line", code)
	}
	bus, _, _ := strings.Cut(addr, ".")
	return appendKmsg(root, 3, fmt.Sprintf("NVRM: Xid (PCI:%s): %d, pid=2417, name=python3, %s", bus, code, detail))
}

// appendKmsg appends one record with the next sequence number.
func appendKmsg(root hostops.Root, prio int, msg string) error {
	p := root.DevPath("kmsg")
	b, err := os.ReadFile(p)
	if err != nil {
		return fmt.Errorf("kernel log: %w", err)
	}
	seq := 0
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if last := lines[len(lines)-1]; last != "" {
		r, err := gpuhealth.ParseKmsg(last)
		if err != nil {
			return fmt.Errorf("kernel log: %w", err)
		}
		seq = int(r.Seq) + 1
	}
	f, err := os.OpenFile(p, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("kernel log: %w", err)
	}
	_, err = fmt.Fprintf(f, "%d,%d,%d,-;%s\n", prio, seq, 5_000_000+seq*1000, msg)
	return errors.Join(err, f.Close())
}

// ClearKernelLog starts a new boot's kernel log (what a reboot leaves):
// the log is truncated to its first record.
func ClearKernelLog(root hostops.Root) error {
	p := root.DevPath("kmsg")
	b, err := os.ReadFile(p)
	if err != nil {
		return fmt.Errorf("clear kernel log: %w", err)
	}
	first, _, _ := strings.Cut(string(b), "\n")
	return os.WriteFile(p, []byte(first+"\n"), 0o644)
}

// GPUOffBus makes the GPU at addr read all-ones from its config space
// (off) as a GPU that fell off the bus does, or restores its header.
func GPUOffBus(root hostops.Root, addr string, off bool) error {
	if err := validAddr(addr); err != nil {
		return fmt.Errorf("GPU off bus: %w", err)
	}
	p := root.SysPath("bus/pci/devices", addr, "config")
	b, err := os.ReadFile(p)
	if err != nil {
		return fmt.Errorf("GPU off bus: %w", err)
	}
	if _, err := os.Stat(root.RunPath("hostsim", "nvidia-smi", addr+".query")); err != nil {
		return fmt.Errorf("GPU off bus: %s is not a GPU of this host", addr)
	}
	saved := p + ".hostsim-saved"
	if off {
		if _, err := os.Stat(saved); err == nil {
			return nil // already off
		}
		if err := os.WriteFile(saved, b, 0o644); err != nil {
			return fmt.Errorf("GPU off bus: %w", err)
		}
		return os.WriteFile(p, []byte(strings.Repeat("\xff", len(b))), 0o644)
	}
	orig, err := os.ReadFile(saved)
	if errors.Is(err, os.ErrNotExist) {
		return nil // on the bus
	}
	if err != nil {
		return fmt.Errorf("GPU off bus: %w", err)
	}
	if err := os.WriteFile(p, orig, 0o644); err != nil {
		return fmt.Errorf("GPU off bus: %w", err)
	}
	return os.Remove(saved)
}
