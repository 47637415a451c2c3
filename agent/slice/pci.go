package slice

import (
	"fmt"

	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/hostops/pci"
	"github.com/gpuaas/gpuaas/hostops/vfio"
)

// PCI reads and repairs the driver binding of a slice's passthrough
// functions (GPUs and fabric VFs). Driver returns "" for an unbound
// function.
type PCI interface {
	Driver(addr string) (string, error)
	BindVFIO(addr string) error
}

// HostPCI is the real PCI over hostops/pci and hostops/vfio: it reads
// sysfs under Root and binds through driver_override with W (the sysfs
// writer; the simulated kernel on a lab host).
type HostPCI struct {
	Root hostops.Root
	W    pci.Writer
}

// Driver implements PCI.
func (h HostPCI) Driver(addr string) (string, error) {
	if err := pci.ValidateAddr(addr); err != nil {
		return "", fmt.Errorf("read driver of %q: %w", addr, err)
	}
	f, err := pci.Read(h.Root, addr)
	if err != nil {
		return "", fmt.Errorf("read driver of %s: %w", addr, err)
	}
	return f.Driver, nil
}

// BindVFIO implements PCI (vfio.Binder.Bind: refuses a function whose
// IOMMU group is not viable or whose host driver is in use).
func (h HostPCI) BindVFIO(addr string) error {
	if err := pci.ValidateAddr(addr); err != nil {
		return fmt.Errorf("bind %q to vfio-pci: %w", addr, err)
	}
	if h.W == nil {
		return fmt.Errorf("bind %s to vfio-pci: no sysfs writer", addr)
	}
	return (&vfio.Binder{Root: h.Root, W: h.W}).Bind(addr)
}
