package proto

// The fields below extend CandidateTopology (types.go) through an embedded
// struct so the agent's discovery report carries bootstrap prerequisites
// and reboot_required (seed 004 phase 2) without editing the shared type.

// TopologyPrereqs are a discovery's prerequisite checks.
type TopologyPrereqs struct {
	// Prerequisites are the slice-host prerequisite checks (IOMMU, VFIO,
	// SR-IOV, OVS, libvirt, UEFI firmware, cloud-init tooling, RDMA
	// tools, image cache, reboot required), each observed.
	Prerequisites []Evidence `json:"prerequisites,omitempty"`
	// RebootRequired is set when the host asks for a reboot.
	RebootRequired bool `json:"reboot_required,omitempty"`
}
