package proto

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"slices"
)

// GPUProfile is what one GPU of a slice brings with it.
type GPUProfile struct {
	VCPUs       int  `json:"vcpus"`
	MemoryMiB   int  `json:"memory_mib"`
	Hugepages   bool `json:"hugepages"`
	RootDiskGiB int  `json:"root_disk_gib,omitempty"`
	FabricVFs   int  `json:"fabric_vfs"`
	// GPUMemoryMiB is each GPU's memory as nvidia-smi reports it (H200
	// SXM: 143771 MiB, 141 GB of HBM3e).
	GPUMemoryMiB int `json:"gpu_memory_mib,omitempty"`
}

// SKU is a sellable product. Slice SKUs allow whole-GPU counts on one node.
type SKU struct {
	Name             string        `json:"name"`
	Shape            CapacityShape `json:"capacity_shape"`
	AllowedGPUCounts []int         `json:"allowed_gpu_counts"`
	PerGPU           GPUProfile    `json:"per_gpu"`
}

//go:embed skus.json
var skusJSON []byte

// DefaultSKUs is the embedded SKU catalog (data, not constants).
func DefaultSKUs() []SKU {
	var s []SKU
	if err := json.Unmarshal(skusJSON, &s); err != nil {
		panic(fmt.Sprintf("embedded skus.json: %v", err))
	}
	return s
}

// FindSKU returns the named SKU.
func FindSKU(skus []SKU, name string) (SKU, bool) {
	for _, s := range skus {
		if s.Name == name {
			return s, true
		}
	}
	return SKU{}, false
}

// AllowsGPUCount reports whether n GPUs can be bought under s.
func (s SKU) AllowsGPUCount(n int) bool { return slices.Contains(s.AllowedGPUCounts, n) }
