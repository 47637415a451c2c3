// Package fsmtest builds claim-ledger fixtures for tests and benchmarks:
// deterministic inventories (regions, pools, nodes, complete slots) as
// command lists any Raft proposer can replay, and a Harness that applies
// commands to an in-process FSM at increasing indexes with a fixed clock.
package fsmtest

import (
	"fmt"
	"time"

	"github.com/gpuaas/gpuaas/proto"
)

// Epoch is the fixed time fixtures start from.
var Epoch = time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)

// Command is one command to propose: its type and request body.
type Command struct {
	Type proto.MessageType
	Req  any
}

// Encode frames the command for raft (proto.Encode); it panics on an
// encoding error, which fixture requests never produce.
func (c Command) Encode() []byte {
	b, err := proto.Encode(c.Type, c.Req)
	if err != nil {
		panic(fmt.Sprintf("fsmtest: %v", err))
	}
	return b
}

// Capacity returns a complete, deterministic binding for slot i of node
// n: unique per node (GPU, VF, disk, MAC, IP), PCIe switch shared by
// pairs, NUMA node by halves of an 8-GPU host.
func Capacity(node string, i int) proto.SlotCapacity {
	h := uint32(2166136261)
	for _, c := range []byte(node) {
		h = (h ^ uint32(c)) * 16777619
	}
	return proto.SlotCapacity{
		GPUPCIAddress:      fmt.Sprintf("0000:%02x:00.0", 0x18+i*0x10),
		NUMANode:           i / 4,
		PCIeSwitch:         fmt.Sprintf("pex%d", i/2),
		NVMe:               proto.DiskIdentity{Serial: fmt.Sprintf("S%s-%d", node, i), Model: "SAMSUNG MZWLO3T8HCLS", Device: fmt.Sprintf("nvme%dn1", i)},
		ManagementMAC:      fmt.Sprintf("02:%02x:%02x:%02x:%02x:%02x", byte(h>>24), byte(h>>16), byte(h>>8), byte(h), i),
		PrivateIP:          fmt.Sprintf("10.%d.%d.%d", byte(h>>8), byte(h), 10+i),
		FabricClaimMode:    proto.FabricPerSlotVF,
		FabricVFPCIAddress: fmt.Sprintf("0000:03:%02x.%d", 1+i/8, i%8),
		OVSPort:            fmt.Sprintf("vm-slot%d", i),
	}
}

// Inventory describes a synthetic fleet.
type Inventory struct {
	Regions        []string // default ["us-east"]
	SliceNodes     int      // slice_vm nodes per region, active and slice-ready
	BaremetalNodes int      // baremetal nodes per region, active
	SlotsPerNode   int      // approved slots per node (default 8)
}

// NodeID names node i of region r ("us-east-n0007").
func NodeID(region string, i int) string { return fmt.Sprintf("%s-n%04d", region, i) }

// BaremetalNodeID names baremetal node i of region r ("us-east-b0007").
func BaremetalNodeID(region string, i int) string { return fmt.Sprintf("%s-b%04d", region, i) }

// PoolName is the single pool of a region.
func PoolName(region string) string { return region + "-pool" }

// Commands returns the commands that create the inventory, in order.
func (inv Inventory) Commands(at time.Time) []Command {
	regions := inv.Regions
	if len(regions) == 0 {
		regions = []string{"us-east"}
	}
	slots := inv.SlotsPerNode
	if slots == 0 {
		slots = 8
	}
	var cmds []Command
	add := func(t proto.MessageType, req any) { cmds = append(cmds, Command{t, req}) }
	for _, r := range regions {
		add(proto.RegionUpsertType, proto.RegionUpsertRequest{At: at, Region: proto.Region{Name: r}})
		add(proto.PoolUpsertType, proto.PoolUpsertRequest{At: at, Pool: proto.Pool{Name: PoolName(r), Region: r}})
		node := func(id string, intent proto.ProfileIntent) {
			add(proto.NodeUpsertType, proto.NodeUpsertRequest{At: at, Node: proto.Node{ID: id, Hostname: id, Region: r,
				Pool: PoolName(r), ProfileIntent: intent, State: proto.NodeActive}})
			if intent == proto.IntentSliceVM {
				add(proto.NodeReadinessType, proto.NodeReadinessRequest{At: at, NodeID: id,
					Readiness: proto.Readiness{Active: true, SliceReady: true, ObservedAt: at}})
			}
			for i := 0; i < slots; i++ {
				add(proto.SlotApproveType, proto.SlotApproveRequest{At: at, NodeID: id, Index: i, Capacity: Capacity(id, i)})
			}
		}
		for i := 0; i < inv.SliceNodes; i++ {
			node(NodeID(r, i), proto.IntentSliceVM)
		}
		for i := 0; i < inv.BaremetalNodes; i++ {
			node(BaremetalNodeID(r, i), proto.IntentBaremetal)
		}
	}
	return cmds
}
