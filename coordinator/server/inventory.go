package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/gpuaas/gpuaas/coordinator/state"
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
// that is already there. A slot whose binding the ledger refuses is
// quarantined with the reason (slot_approve quarantine_invalid) and the
// node's other slots load; every other failure is returned (all of them,
// joined) after the rest of the inventory was tried.
func (s *Server) LoadInventory(ctx context.Context, inv *Inventory) error {
	_, err := s.loadInventory(ctx, inv, false)
	return err
}

// InventoryReport is what one inventory load did beyond loading.
type InventoryReport struct {
	// Quarantined maps each slot the load quarantined to why.
	Quarantined map[string]string
}

// loadInventory is LoadInventory; resume skips regions, pools and nodes
// already in the ledger (an operator may have changed them since the
// interrupted load) and adds only what is missing.
func (s *Server) loadInventory(ctx context.Context, inv *Inventory, resume bool) (InventoryReport, error) {
	at := s.cfg.Now().UTC()
	rep := InventoryReport{Quarantined: map[string]string{}}
	var (
		mu   sync.Mutex
		errs []error
	)
	fail := func(err error) {
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
	}
	apply := func(t proto.MessageType, req any) (any, error) {
		resp, _, err := s.Apply(ctx, t, req)
		if err != nil {
			return nil, fmt.Errorf("load inventory: %s: %w", t, err)
		}
		return resp, nil
	}
	start := s.Store().Snapshot()
	for _, r := range inv.Regions {
		if _, ok := start.Region(r.Name); resume && ok {
			continue
		}
		if _, err := apply(proto.RegionUpsertType, proto.RegionUpsertRequest{At: at, Region: r}); err != nil {
			fail(err)
		}
	}
	for _, p := range inv.Pools {
		if _, ok := start.Pool(p.Name); resume && ok {
			continue
		}
		if _, err := apply(proto.PoolUpsertType, proto.PoolUpsertRequest{At: at, Pool: p}); err != nil {
			fail(err)
		}
	}
	var (
		wg  sync.WaitGroup
		sem = make(chan struct{}, 64)
	)
	for _, n := range inv.Nodes {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if _, ok := start.Node(n.Node.ID); !resume || !ok {
				if _, err := apply(proto.NodeUpsertType, proto.NodeUpsertRequest{At: at, Node: n.Node}); err != nil {
					fail(err)
					return // its readiness and slots need the node
				}
			}
			snap := s.Store().Snapshot()
			if node, ok := snap.Node(n.Node.ID); n.Readiness != nil && (!ok || node.Readiness == nil) {
				if _, err := apply(proto.NodeReadinessType, proto.NodeReadinessRequest{At: at, NodeID: n.Node.ID, Readiness: *n.Readiness}); err != nil {
					fail(err)
				}
			}
			for i, c := range n.Slots {
				if _, ok := snap.Slot(proto.SlotID(n.Node.ID, i)); ok {
					continue
				}
				resp, err := apply(proto.SlotApproveType, proto.SlotApproveRequest{At: at, NodeID: n.Node.ID, Index: i, Capacity: c, QuarantineInvalid: true})
				if err != nil {
					fail(err)
					continue // the node's other slots still load
				}
				if sl, ok := resp.(*proto.Slot); ok && sl.Status == proto.SlotQuarantined {
					s.log.Warn("inventory: slot quarantined", "slot", sl.ID, "reason", sl.StatusReason)
					mu.Lock()
					rep.Quarantined[sl.ID] = sl.StatusReason
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	return rep, errors.Join(errs...)
}

// inventoryMissing lists what of inv the ledger lacks (IDs, in inventory
// order; slots as "node/index").
func inventoryMissing(snap *state.Snapshot, inv *Inventory) []string {
	var out []string
	for _, r := range inv.Regions {
		if _, ok := snap.Region(r.Name); !ok {
			out = append(out, "region "+r.Name)
		}
	}
	for _, p := range inv.Pools {
		if _, ok := snap.Pool(p.Name); !ok {
			out = append(out, "pool "+p.Name)
		}
	}
	for _, n := range inv.Nodes {
		node, ok := snap.Node(n.Node.ID)
		if !ok {
			out = append(out, "node "+n.Node.ID)
			continue
		}
		if n.Readiness != nil && node.Readiness == nil {
			out = append(out, "readiness of node "+n.Node.ID)
		}
		for i := range n.Slots {
			if _, ok := snap.Slot(proto.SlotID(n.Node.ID, i)); !ok {
				out = append(out, "slot "+proto.SlotID(n.Node.ID, i))
			}
		}
	}
	return out
}

// Bounds of the inventory load's retry backoff.
const (
	inventoryRetryMin = time.Second
	inventoryRetryMax = time.Minute
)

// loadInventoryUntilDone is a leader loop: with Config.Inventory set it
// loads the inventory into an empty ledger (no region yet), or resumes a
// load a failure or a leader change interrupted (every region of the
// inventory is there but some of its objects are not). A failed or
// partial attempt is logged and retried with backoff (1 s doubling to
// 1 min) until the whole inventory is in the ledger or leadership ends.
func (s *Server) loadInventoryUntilDone(ctx context.Context) {
	if s.cfg.Inventory != nil {
		s.retryInventoryLoad(ctx, s.cfg.Inventory, inventoryRetryMin, inventoryRetryMax)
	}
}

// retryInventoryLoad makes load attempts, backoff doubling from lo to hi
// between them, until one succeeds or ctx ends.
func (s *Server) retryInventoryLoad(ctx context.Context, inv *Inventory, lo, hi time.Duration) {
	backoff := lo
	for attempt := 1; ; attempt++ {
		err := s.loadInventoryAttempt(ctx, inv)
		if err == nil || ctx.Err() != nil {
			return
		}
		s.log.Error("inventory load failed; retrying", "attempt", attempt, "retry_in", backoff, "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, hi)
	}
}

// loadInventoryAttempt makes one attempt: nil when the inventory is
// loaded (or is not this ledger's to load).
func (s *Server) loadInventoryAttempt(ctx context.Context, inv *Inventory) error {
	if err := s.Barrier(ctx); err != nil {
		return fmt.Errorf("inventory: barrier: %w", err)
	}
	snap := s.Store().Snapshot()
	resume := len(snap.Regions()) > 0
	if resume {
		for _, r := range inv.Regions {
			if _, ok := snap.Region(r.Name); !ok {
				return nil // a ledger built otherwise: not ours to fill
			}
		}
		missing := inventoryMissing(snap, inv)
		if len(missing) == 0 {
			return nil
		}
		s.log.Warn("inventory: resuming a partial load", "missing", len(missing), "first", missing[0])
	}
	rep, err := s.loadInventory(ctx, inv, resume)
	if err != nil {
		return err
	}
	if missing := inventoryMissing(s.Store().Snapshot(), inv); len(missing) > 0 {
		return fmt.Errorf("inventory: %d objects still missing after the load, first %s", len(missing), missing[0])
	}
	s.log.Info("inventory loaded", "regions", len(inv.Regions), "nodes", len(inv.Nodes), "quarantined_slots", len(rep.Quarantined))
	return nil
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
				NVMe:               proto.DiskIdentity{Serial: fmt.Sprintf("S%s-%d", id, i), Model: "SAMSUNG MZWLO3T8HCLS", SizeBytes: 3_840_755_982_336},
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
