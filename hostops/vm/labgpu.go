package vm

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"strings"

	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/hostops/pci"
)

// The lab's GPUs are simulated host trees: QEMU cannot open them, so
// LabSized drops their hostdevs. To let a CUDA guest image still check the
// slice's GPUs, LabSized announces each planned GPU to the guest as a QEMU
// firmware config entry (libvirt <sysinfo type='fwcfg'>), the one channel
// from host to guest firmware that needs no device:
//
//	opt/gpuaas/gpu<N>  (N = position among the slice's GPUs)
//	  name=NVIDIA H200
//	  pci.bus_id=00000000:18:00.0      (the host address, nvidia-smi's form)
//	  uuid=GPU-<uuid>
//	  memory.total=143771 MiB
//
// The lab CUDA guest's nvidia-smi (lab/guestgpu) reads them back from
// /sys/firmware/qemu_fw_cfg. Production domains carry no fw_cfg entries.
// libvirt renders the entries as QEMU -fw_cfg name=...,string=... (libvirt
// 6.5 or newer; the lab runs 9.0).

// GPU is the identity of a GPU among a domain's hostdevs.
type GPU struct {
	Addr      string // host PCI address (also in DomainSpec.Hostdevs)
	Model     string // as the driver names it, e.g. "NVIDIA H200"
	UUID      string // "GPU-" + a lower-case UUID
	MemoryMiB int    // memory.total as the driver reports it
}

// FWCfg is one QEMU firmware config entry given to the guest.
type FWCfg struct {
	Name  string // "opt/..." path
	Value string
}

// LabGPUPrefix is the fw_cfg directory of the lab's GPU entries.
const LabGPUPrefix = "opt/gpuaas/gpu"

type gpuModel struct {
	name      string
	memoryMiB int
}

// gpuModels names GPUs by PCI vendor:device as the NVIDIA driver does.
var gpuModels = map[[2]uint16]gpuModel{
	{0x10de, 0x2335}: {"NVIDIA H200", 143771},          // H200 SXM 141GB (HGX H200)
	{0x10de, 0x2330}: {"NVIDIA H100 80GB HBM3", 81559}, // H100 SXM5 80GB
	{0x10de, 0x20b2}: {"NVIDIA A100-SXM4-80GB", 81920}, // A100 SXM4 80GB
}

// DefaultLabGPUModel is the model of a lab GPU whose host tree cannot be
// read (a spec built without a host root): the lab simulates HGX H200
// hosts only.
var DefaultLabGPUModel = gpuModel{"NVIDIA H200", 143771}

// LabGPU returns the identity of the GPU at addr on node: its model from
// the host tree's PCI vendor:device (the default H200 when root is the zero
// Root), its UUID derived from node and address so the same simulated GPU
// always reports the same one.
func LabGPU(root hostops.Root, node, addr string) (GPU, error) {
	if err := pci.ValidateAddr(addr); err != nil {
		return GPU{}, fmt.Errorf("lab GPU: %w", err)
	}
	if err := hostops.ValidName(node); err != nil {
		return GPU{}, fmt.Errorf("lab GPU %s: node: %w", addr, err)
	}
	m := DefaultLabGPUModel
	if root != (hostops.Root{}) {
		f, err := pci.Read(root, addr)
		if err != nil {
			return GPU{}, fmt.Errorf("lab GPU %s: %w", addr, err)
		}
		var ok bool
		if m, ok = gpuModels[[2]uint16{f.Vendor, f.Device}]; !ok || m.name == "" {
			return GPU{}, fmt.Errorf("lab GPU %s: PCI ID %04x:%04x is not a GPU model the lab knows", addr, f.Vendor, f.Device)
		}
	}
	h := sha256.Sum256([]byte("gpuaas-lab-gpu:" + node + "/" + addr))
	h[6] = h[6]&0x0f | 0x40
	h[8] = h[8]&0x3f | 0x80
	x := hex.EncodeToString(h[:16])
	return GPU{Addr: addr, Model: m.name, MemoryMiB: m.memoryMiB,
		UUID: "GPU-" + x[0:8] + "-" + x[8:12] + "-" + x[12:16] + "-" + x[16:20] + "-" + x[20:32]}, nil
}

var (
	gpuModelRE = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9 .-]{0,63}$`)
	gpuUUIDRE  = regexp.MustCompile(`^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	fwcfgRE    = regexp.MustCompile(`^opt/[a-z0-9][a-z0-9._-]*(/[a-z0-9][a-z0-9._-]*)+$`)
)

// validate checks one GPU identity.
func (g GPU) validate() error {
	if err := pci.ValidateAddr(g.Addr); err != nil {
		return fmt.Errorf("GPU: %w", err)
	}
	switch {
	case !gpuModelRE.MatchString(g.Model):
		return fmt.Errorf("GPU %s: model %q: want letters, digits, spaces, '.', '-'", g.Addr, g.Model)
	case !gpuUUIDRE.MatchString(g.UUID):
		return fmt.Errorf("GPU %s: uuid %q: want GPU-<lower-case uuid>", g.Addr, g.UUID)
	case g.MemoryMiB <= 0 || g.MemoryMiB > 1<<24:
		return fmt.Errorf("GPU %s: memory %d MiB out of range", g.Addr, g.MemoryMiB)
	}
	return nil
}

// validate checks one fw_cfg entry as libvirt and QEMU accept it: an
// "opt/" name (not the reserved opt/ovmf/ or opt/org.qemu/) of at most 55
// bytes, and a printable value of at most 4 KiB.
func (f FWCfg) validate() error {
	if len(f.Name) > 55 || !fwcfgRE.MatchString(f.Name) || strings.Contains(f.Name, "..") {
		return fmt.Errorf("fw_cfg name %q: want opt/<dir>/<name> of [a-z0-9._-], at most 55 bytes", f.Name)
	}
	if strings.HasPrefix(f.Name, "opt/ovmf/") || strings.HasPrefix(f.Name, "opt/org.qemu/") {
		return fmt.Errorf("fw_cfg name %q is reserved", f.Name)
	}
	if len(f.Value) > 4096 {
		return fmt.Errorf("fw_cfg %s: value of %d bytes: at most 4096", f.Name, len(f.Value))
	}
	for _, c := range f.Value {
		if (c < 0x20 && c != '\n') || c > 0x7e {
			return fmt.Errorf("fw_cfg %s: value holds %q: printable ASCII and newlines only", f.Name, c)
		}
	}
	return nil
}

// labGPUEntries are the fw_cfg entries announcing a lab domain's GPUs,
// in order; GPUs whose address does not parse are left to Validate.
func labGPUEntries(gpus []GPU) []FWCfg {
	var out []FWCfg
	for i, g := range gpus {
		var dom, bus, slot, fn uint
		if err := pci.ValidateAddr(g.Addr); err != nil {
			continue
		}
		if _, err := fmt.Sscanf(g.Addr, "%x:%x:%x.%x", &dom, &bus, &slot, &fn); err != nil {
			continue
		}
		out = append(out, FWCfg{
			Name: fmt.Sprintf("%s%d", LabGPUPrefix, i),
			Value: fmt.Sprintf("name=%s\npci.bus_id=%08X:%02X:%02X.%X\nuuid=%s\nmemory.total=%d MiB\n",
				g.Model, dom, bus, slot, fn, g.UUID, g.MemoryMiB),
		})
	}
	return out
}
