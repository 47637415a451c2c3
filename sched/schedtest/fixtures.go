package schedtest

import (
	"fmt"
	"hash/fnv"

	"github.com/gpuaas/gpuaas/proto"
)

// HGX H200 host layout used by SliceHost: 8 GPUs, two per PCIe switch,
// four switches over two NUMA nodes (GPU buses as on an HGX baseboard).
var (
	hgxGPUBus    = [8]int{0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb}
	hgxSwitchBus = [4]int{0x15, 0x37, 0x97, 0xb7}
)

// HGXSwitch returns the PCIe switch key of GPU i on an HGX host.
func HGXSwitch(i int) string { return fmt.Sprintf("0000:%02x:00.0", hgxSwitchBus[(i%8)/2]) }

// HGXNUMA returns the NUMA node of GPU i on an HGX host.
func HGXNUMA(i int) int { return (i % 8) / 4 }

// NodeOption adjusts a fixture node.
type NodeOption func(*proto.Node)

// Node returns an active, slice-ready slice_vm node of region in pool
// "<region>-a".
func Node(id, region string, opts ...NodeOption) *proto.Node {
	n := &proto.Node{
		ID:            id,
		Hostname:      id,
		Region:        region,
		Pool:          region + "-a",
		ProfileIntent: proto.IntentSliceVM,
		State:         proto.NodeActive,
		Readiness:     &proto.Readiness{Active: true, SliceReady: true},
	}
	for _, o := range opts {
		o(n)
	}
	return n
}

// Intent sets the node's profile intent.
func Intent(p proto.ProfileIntent) NodeOption { return func(n *proto.Node) { n.ProfileIntent = p } }

// InState sets the node's lifecycle state.
func InState(st proto.NodeState) NodeOption { return func(n *proto.Node) { n.State = st } }

// NotSliceReady marks the node's convergence gate as failing.
func NotSliceReady(blockers ...string) NodeOption {
	return func(n *proto.Node) {
		n.Readiness = &proto.Readiness{Active: true, SliceReady: false, Blockers: blockers}
	}
}

// GPUs sets the node's discovered GPU count.
func GPUs(n int) NodeOption { return func(nd *proto.Node) { nd.GPUs = n } }

// Draining marks the node draining.
func Draining() NodeOption { return func(n *proto.Node) { n.Draining = true } }

// InPool sets the node's pool.
func InPool(pool string) NodeOption { return func(n *proto.Node) { n.Pool = pool } }

// SlotOption adjusts a fixture slot.
type SlotOption func(*proto.Slot)

// Slot returns slot i of node: available and complete, with HGX locality
// (HGXSwitch(i), HGXNUMA(i)) and identities derived from the node ID, so
// the same arguments always give the same slot.
func Slot(nodeID string, i int, opts ...SlotOption) *proto.Slot {
	h := fnv.New32a()
	h.Write([]byte(nodeID))
	sum := h.Sum32()
	s := &proto.Slot{
		ID:     proto.SlotID(nodeID, i),
		NodeID: nodeID,
		Index:  i,
		Status: proto.SlotAvailable,
		Capacity: proto.SlotCapacity{
			GPUPCIAddress: fmt.Sprintf("0000:%02x:00.0", hgxGPUBus[i%8]),
			NUMANode:      HGXNUMA(i),
			PCIeSwitch:    HGXSwitch(i),
			NVMe: proto.DiskIdentity{
				Serial: fmt.Sprintf("S7KCNE0W%08X%02d", sum, i),
				EUI:    fmt.Sprintf("eui.0025388%08x%02x", sum, i),
				Model:  "SAMSUNG MZWLO3T8HCLS-00A07",
				Device: fmt.Sprintf("nvme%dn1", i),
			},
			ManagementMAC:      fmt.Sprintf("52:54:%02x:%02x:%02x:%02x", byte(sum>>24), byte(sum>>16), byte(sum>>8), byte(i)),
			PrivateIP:          fmt.Sprintf("10.%d.%d.%d", byte(sum>>8), byte(sum), 10+i),
			FabricClaimMode:    proto.FabricPerSlotVF,
			FabricVFPCIAddress: fmt.Sprintf("0000:c1:%02x.%d", (i+2)/8, (i+2)%8),
			OVSPort:            fmt.Sprintf("vm-s%d", i),
		},
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

// Status sets the slot status.
func Status(st proto.SlotStatus) SlotOption { return func(s *proto.Slot) { s.Status = st } }

// Claimed makes the slot held by a live claim: allocated, ClaimID set.
func Claimed(claimID string) SlotOption {
	return func(s *proto.Slot) {
		s.Status, s.ClaimID = proto.SlotAllocated, claimID
		s.Generation++
	}
}

// Touched marks the slot's disk as possibly written.
func Touched() SlotOption { return func(s *proto.Slot) { s.Touched = true } }

// Locality overrides the slot's PCIe switch and NUMA node.
func Locality(sw string, numa int) SlotOption {
	return func(s *proto.Slot) { s.Capacity.PCIeSwitch, s.Capacity.NUMANode = sw, numa }
}

// Binding names of Missing.
const (
	BindGPU        = "gpu_pci_address"
	BindNVMe       = "nvme"
	BindMAC        = "management_mac"
	BindIP         = "private_ip"
	BindFabricMode = "fabric_claim_mode"
	BindVF         = "fabric_vf_pci_address"
)

// Missing clears one runtime binding, making the slot incomplete while its
// status may still say available.
func Missing(binding string) SlotOption {
	return func(s *proto.Slot) {
		c := &s.Capacity
		switch binding {
		case BindGPU:
			c.GPUPCIAddress = ""
		case BindNVMe:
			c.NVMe = proto.DiskIdentity{Device: c.NVMe.Device}
		case BindMAC:
			c.ManagementMAC = ""
		case BindIP:
			c.PrivateIP = ""
		case BindFabricMode:
			c.FabricClaimMode = "shared_pf"
		case BindVF:
			c.FabricVFPCIAddress = ""
		default:
			panic("schedtest.Missing: unknown binding " + binding)
		}
	}
}

// SliceHost returns a realistic HGX H200 slice host: a slice-ready node
// with 8 complete, available slots, 4 PCIe switches × 2 GPUs over 2 NUMA
// nodes. Replace entries of the returned slice to vary single slots.
func SliceHost(id, region string, opts ...NodeOption) (*proto.Node, []*proto.Slot) {
	n := Node(id, region, opts...)
	slots := make([]*proto.Slot, 8)
	for i := range slots {
		slots[i] = Slot(id, i)
	}
	return n, slots
}

// BaremetalHost returns an active baremetal-intent node with 8 available
// slots (the inventory a node_exclusive claim reserves).
func BaremetalHost(id, region string, opts ...NodeOption) (*proto.Node, []*proto.Slot) {
	n, slots := SliceHost(id, region, append([]NodeOption{Intent(proto.IntentBaremetal), func(n *proto.Node) {
		n.Readiness = &proto.Readiness{Active: true}
	}}, opts...)...)
	return n, slots
}
