package server

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/audit"
	"github.com/gpuaas/gpuaas/proto"
)

func pending(actor, method, route, kind, id string) *audit.Pending {
	p := audit.New(proto.AuditRecord{Actor: actor, Role: "admin", Remote: "192.0.2.1:4000", RequestID: "r-" + actor,
		Method: method, Route: route, Path: route, ObjectKind: kind, ObjectID: id})
	p.SetOKStatus(200)
	return p
}

// A request's audit record rides in the entry of its first ledger
// command (server.Apply and the planner): written when the command
// commits, left to the API when it is refused; concurrent placements
// each get exactly one record; the chain survives a snapshot and a
// restart of every server.
func TestAuditRecordsRideWithCommands(t *testing.T) {
	t.Parallel()
	nodes := startCluster(t, 3, nil)
	leader := waitLeader(t, nodes)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, leader.srv.LoadInventory(ctx, SyntheticInventory("us-east", 2, 8)))
	slot := proto.SlotID("us-east-n0001", 2)

	// Committed: written with the command, after state from the ledger.
	p := pending("admin", "POST", "/v1/slots/{id}/disable", "slot", slot)
	_, idx, err := leader.srv.Apply(audit.With(ctx, p), proto.SlotDisableType, proto.SlotDisableRequest{At: time.Now().UTC(), SlotID: slot, Reason: "riser"})
	require.NoError(t, err)
	_, again := p.Finish(200)
	assert.False(t, again, "written with the command: nothing left for the API")
	head, ok := leader.srv.Store().Snapshot().AuditHead()
	require.True(t, ok)
	assert.Equal(t, idx, head.Index, "the record is in the command's entry")
	assert.Contains(t, string(head.After), `"status":"disabled"`)
	assert.Equal(t, []string{slot}, head.Slots)

	// A later command of the same request goes without it.
	_, _, err = leader.srv.Apply(audit.With(ctx, p), proto.SlotRepairType, proto.SlotRepairRequest{At: time.Now().UTC(), SlotID: slot})
	require.NoError(t, err)
	assert.Equal(t, 1, leader.srv.Store().Snapshot().AuditCount())

	// Refused: nothing written, the record is the API's to append.
	p = pending("admin", "POST", "/v1/slots/{id}/repair", "slot", "nope")
	_, _, err = leader.srv.Apply(audit.With(ctx, p), proto.SlotRepairType, proto.SlotRepairRequest{At: time.Now().UTC(), SlotID: "nope"})
	require.Error(t, err)
	rec, open := p.Finish(404)
	require.True(t, open)
	assert.Equal(t, 404, rec.Status)
	assert.Equal(t, 1, leader.srv.Store().Snapshot().AuditCount())
	_, _, err = leader.srv.Apply(ctx, proto.AuditAppendType, proto.AuditAppendRequest{At: time.Now().UTC(), Record: rec})
	require.NoError(t, err)

	// Concurrent placements through the planner: one record each, naming
	// its allocation, in the placements' own entries.
	const n = 12
	var wg sync.WaitGroup
	allocs := make([]string, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := pending(fmt.Sprintf("op%d", i), "POST", "/v1/allocations", "allocation", "")
			p.SetOKStatus(201)
			a, _, err := leader.srv.Place(audit.With(ctx, p), sliceReq(1), fmt.Sprintf("k-%d", i))
			if assert.NoError(t, err) {
				allocs[i] = a.ID
				_, left := p.Finish(201)
				assert.False(t, left, "placement %d recorded with its command", i)
			}
		}()
	}
	wg.Wait()
	snap := leader.srv.Store().Snapshot()
	byAlloc := map[string]*proto.AuditRecord{}
	for _, r := range snap.AuditRecords(0, 0, nil) {
		if r.Route == "/v1/allocations" {
			byAlloc[r.ObjectID] = r
		}
	}
	require.Len(t, byAlloc, n)
	for _, id := range allocs {
		r := byAlloc[id]
		require.NotNil(t, r, id)
		a, _ := snap.Allocation(id)
		assert.Equal(t, a.CreateIndex, r.Index, "record %d is in allocation %s's entry", r.Seq, id)
		assert.Equal(t, 201, r.Status)
		assert.Len(t, r.Slots, 1)
	}
	res := proto.VerifyAuditChain(snap.AuditRecords(0, 0, nil))
	require.True(t, res.OK, res.Problem)

	// Every replica holds the same chain; it survives a snapshot and a
	// restart of every server (snapshot + log replay).
	require.NoError(t, leader.srv.Barrier(ctx))
	for _, nd := range nodes {
		require.Eventually(t, func() bool {
			h, ok := nd.srv.Store().Snapshot().AuditHead()
			return ok && h.Hash == res.HeadHash
		}, 10*time.Second, 10*time.Millisecond, "%s has the chain", nd.cfg.NodeID)
		require.NoError(t, nd.srv.raft.Snapshot().Error())
		nd.stop()
	}
	var again2 []*testNode
	for _, nd := range nodes {
		cfg := nd.cfg
		cfg.Logger = nil
		again2 = append(again2, startNode(t, cfg))
	}
	waitLeader(t, again2)
	for _, nd := range again2 {
		require.Eventually(t, func() bool {
			r := proto.VerifyAuditChain(nd.srv.Store().Snapshot().AuditRecords(0, 0, nil))
			return r.OK && r.HeadHash == res.HeadHash && r.Records == res.Records
		}, 15*time.Second, 20*time.Millisecond, "%s restored the chain", nd.cfg.NodeID)
	}
}
