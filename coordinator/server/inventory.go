package server

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sync"

	"github.com/gpuaas/gpuaas/proto"
)

// Inventory is a fleet description loaded into an empty ledger at start
// (the lab and tests; agents replace it with discovered topology later).
type Inventory struct {
	Regions []proto.Region  `json:"regions"`
	Pools   []proto.Pool    `json:"pools"`
	Nodes   []InventoryNode `json:"nodes"`
}

// InventoryNode is one node with its readiness evidence and the
// capacities of its approved slots (slot i = Slots[i]).
type InventoryNode struct {
	Node      proto.Node           `json:"node"`
	Readiness *proto.Readiness     `json:"readiness,omitempty"`
	Slots     []proto.SlotCapacity `json:"slots,omitempty"`
}

// ReadInventory reads an inventory JSON file (unknown fields refused).
func ReadInventory(path string) (*Inventory, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read inventory: %w", err)
	}
	defer f.Close()
	dec := json.NewDecoder(f)
	dec.DisallowUnknownFields()
	var inv Inventory
	if err := dec.Decode(&inv); err != nil {
		return nil, fmt.Errorf("parse inventory %s: %w", path, err)
	}
	return &inv, nil
}

// LoadInventory proposes the inventory's commands on the leader: regions,
// pools, then per node (concurrently across nodes) the node, its
// readiness and its slot approvals. Region, pool and node upserts of
// unchanged objects write nothing, and readiness and approvals already in
// the ledger are skipped, so a repeated (or resumed) load changes nothing
// that is already there.
func (s *Server) LoadInventory(ctx context.Context, inv *Inventory) error {
	at := s.cfg.Now().UTC()
	apply := func(t proto.MessageType, req any) error {
		_, _, err := s.Apply(ctx, t, req)
		if err != nil {
			return fmt.Errorf("load inventory: %s: %w", t, err)
		}
		return nil
	}
	for _, r := range inv.Regions {
		if err := apply(proto.RegionUpsertType, proto.RegionUpsertRequest{At: at, Region: r}); err != nil {
			return err
		}
	}
	for _, p := range inv.Pools {
		if err := apply(proto.PoolUpsertType, proto.PoolUpsertRequest{At: at, Pool: p}); err != nil {
			return err
		}
	}
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
		sem   = make(chan struct{}, 64)
	)
	for _, n := range inv.Nodes {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			err := func() error {
				if err := apply(proto.NodeUpsertType, proto.NodeUpsertRequest{At: at, Node: n.Node}); err != nil {
					return err
				}
				snap := s.Store().Snapshot()
				if node, ok := snap.Node(n.Node.ID); n.Readiness != nil && (!ok || node.Readiness == nil) {
					if err := apply(proto.NodeReadinessType, proto.NodeReadinessRequest{At: at, NodeID: n.Node.ID, Readiness: *n.Readiness}); err != nil {
						return err
					}
				}
				for i, c := range n.Slots {
					if _, ok := snap.Slot(proto.SlotID(n.Node.ID, i)); ok {
						continue
					}
					if err := apply(proto.SlotApproveType, proto.SlotApproveRequest{At: at, NodeID: n.Node.ID, Index: i, Capacity: c}); err != nil {
						return err
					}
				}
				return nil
			}()
			if err != nil {
				once.Do(func() { first = err })
			}
		}()
	}
	wg.Wait()
	return first
}

// loadInventoryOnce is a leader loop: with Config.Inventory set and an
// empty ledger (no region yet), it loads the inventory once.
func (s *Server) loadInventoryOnce(ctx context.Context) {
	if s.cfg.Inventory == nil {
		return
	}
	if err := s.Barrier(ctx); err != nil {
		s.log.Warn("inventory: barrier", "err", err)
		return
	}
	if len(s.Store().Snapshot().Regions()) > 0 {
		return
	}
	if err := s.LoadInventory(ctx, s.cfg.Inventory); err != nil {
		s.log.Error("inventory load failed", "err", err)
		return
	}
	s.log.Info("inventory loaded", "regions", len(s.cfg.Inventory.Regions), "nodes", len(s.cfg.Inventory.Nodes))
}

// SyntheticInventory builds a simulated fleet for the lab, tests and
// benchmarks: one region with one pool, nodes slice_vm nodes (active,
// slice-ready) with slots complete slots each, bindings unique per node.
func SyntheticInventory(region string, nodes, slots int) *Inventory {
	pool := region + "-pool"
	inv := &Inventory{
		Regions: []proto.Region{{Name: region}},
		Pools:   []proto.Pool{{Name: pool, Region: region}},
	}
	for n := range nodes {
		id := fmt.Sprintf("%s-n%04d", region, n)
		in := InventoryNode{
			Node:      proto.Node{ID: id, Hostname: id, Region: region, Pool: pool, ProfileIntent: proto.IntentSliceVM, State: proto.NodeActive},
			Readiness: &proto.Readiness{Active: true, SliceReady: true},
		}
		for i := range slots {
			in.Slots = append(in.Slots, proto.SlotCapacity{
				GPUPCIAddress:      fmt.Sprintf("0000:%02x:00.0", 0x18+i*0x10),
				NUMANode:           i * 2 / max(slots, 1),
				PCIeSwitch:         fmt.Sprintf("pex%d", i/2),
				NVMe:               proto.DiskIdentity{Serial: fmt.Sprintf("S%s-%d", id, i), Model: "SAMSUNG MZWLO3T8HCLS"},
				ManagementMAC:      fmt.Sprintf("02:%02x:%02x:%02x:00:%02x", byte(n>>16), byte(n>>8), byte(n), i),
				PrivateIP:          fmt.Sprintf("10.%d.%d.%d", byte(n>>8), byte(n), 10+i),
				FabricClaimMode:    proto.FabricPerSlotVF,
				FabricVFPCIAddress: fmt.Sprintf("0000:03:%02x.%d", 1+i/8, i%8),
			})
		}
		inv.Nodes = append(inv.Nodes, in)
	}
	return inv
}
