package guest

import (
	"fmt"
	"slices"
)

// Variant is one flavour of the lab guest: the same u-root + Debian kernel
// recipe with extra kernel modules and extra Go commands in the initramfs,
// published under its own name, catalog kind and readiness check, and
// cached under its own input hash.
type Variant struct {
	Name           string // image name (manifest, os-release ID)
	Kind           string // manifest kind; CatalogKind is what the image catalog records
	CatalogKind    string // proto.ImageKind: slice_base | slice_cuda
	ReadinessCheck string // the agent's image-specific readiness check ("" = base checks only)
	// ExtraModules are loaded after the base modules (dependencies first).
	ExtraModules []string
	// ExtraCommands are module-relative Go main packages built into the
	// initramfs (u-root names each after its directory).
	ExtraCommands []string
	// SourceDirs are the module-relative directories whose Go sources the
	// extra commands are built from (part of the cache key).
	SourceDirs []string
}

// Variant names.
const (
	VariantBase = "base"
	VariantCUDA = "cuda"
)

// CUDAName is the lab CUDA developer image.
const CUDAName = "gpuaas-lab-guest-cuda"

// CUDAModules are the cuda variant's extra modules: qemu_fw_cfg shows the
// fw_cfg entries through which the lab host announces the slice's GPUs
// (hostops/vm LabSized) under /sys/firmware/qemu_fw_cfg.
var CUDAModules = []string{"qemu_fw_cfg"}

// Variants are the lab guest's flavours by name. The base image carries no
// CUDA pieces; the cuda image adds the simulated NVIDIA userspace
// (lab/guestgpu/nvidia-smi) and the module it reads the GPUs through.
var Variants = map[string]Variant{
	VariantBase: {Name: Name, Kind: Kind, CatalogKind: "slice_base"},
	VariantCUDA: {Name: CUDAName, Kind: "slice_cuda", CatalogKind: "slice_cuda", ReadinessCheck: "cuda",
		ExtraModules:  CUDAModules,
		ExtraCommands: []string{"./lab/guestgpu/nvidia-smi"},
		SourceDirs:    []string{"lab/guestgpu", "lab/guestgpu/nvidia-smi"}},
}

// variant resolves a variant name ("" is the base).
func variant(name string) (Variant, error) {
	if name == "" {
		name = VariantBase
	}
	v, ok := Variants[name]
	if !ok {
		names := make([]string, 0, len(Variants))
		for n := range Variants {
			names = append(names, n)
		}
		slices.Sort(names)
		return Variant{}, fmt.Errorf("guest image variant %q: want one of %v", name, names)
	}
	return v, nil
}
