package fsm_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/fsm"
	"github.com/gpuaas/gpuaas/coordinator/fsm/fsmtest"
	"github.com/gpuaas/gpuaas/proto"
)

func auditRec(actor, method, route, kind, id string, status int) proto.AuditRecord {
	return proto.AuditRecord{Actor: actor, Role: "admin", TokenID: "0123456789ab", Remote: "192.0.2.7:51000", RequestID: "req-" + actor,
		Method: method, Route: route, Path: route, ObjectKind: kind, ObjectID: id, Status: status}
}

// appendAudit appends a standalone record and returns its response.
func appendAudit(h *fsmtest.Harness, r proto.AuditRecord) *proto.AuditAppendResponse {
	h.TB.Helper()
	return h.OK(proto.AuditAppendType, proto.AuditAppendRequest{At: h.At(), Record: r}).(*proto.AuditAppendResponse)
}

// batch applies cmds as one command_batch entry.
func batch(h *fsmtest.Harness, cmds ...[]byte) *fsm.BatchResponse {
	h.TB.Helper()
	data, err := proto.EncodeBatch(cmds)
	require.NoError(h.TB, err)
	h.Index++
	h.Log = append(h.Log, fsmtest.Entry{Index: h.Index, Data: data})
	return h.FSM.ApplyCommand(h.Index, data).(*fsm.BatchResponse)
}

func enc(t testing.TB, typ proto.MessageType, req any) []byte {
	t.Helper()
	b, err := proto.Encode(typ, req)
	require.NoError(t, err)
	return b
}

// addAudit writes records of every kind into h (for every-table tests):
// standalone, attached to a slot disable, and a pruned prefix.
func addAudit(h *fsmtest.Harness) {
	t := h.TB
	appendAudit(h, auditRec("admin", "POST", "/v1/nodes/{id}/drain", "node", "us-east-n0002", 200))
	r2 := appendAudit(h, auditRec("viewer", "POST", "/v1/slots/{id}/disable", "slot", slot(n0, 5), 403))
	br := batch(h,
		enc(t, proto.SlotDisableType, proto.SlotDisableRequest{At: h.At(), SlotID: slot(n0, 5), Reason: "fan"}),
		enc(t, proto.AuditAppendType, proto.AuditAppendRequest{At: h.At(), Attached: true,
			Record: auditRec("admin", "POST", "/v1/slots/{id}/disable", "slot", slot(n0, 5), 200)}))
	require.IsType(t, &proto.AuditAppendResponse{}, br.Responses[1])
	h.OK(proto.AuditPruneType, proto.AuditPruneRequest{At: h.At(), ThroughSeq: 2, Hash: r2.Hash})
	appendAudit(h, auditRec("admin", "PUT", "/v1/regions/{name}", "region", "us-east", 200))
}

func TestAuditAppendChains(t *testing.T) {
	t.Parallel()
	h := fsmtest.New(t)
	h.Load(fsmtest.Inventory{Regions: []string{"us-east"}, SliceNodes: 1})
	var prev string
	for i, status := range []int{200, 403, 400, 201} {
		r := appendAudit(h, auditRec(fmt.Sprintf("u%d", i), "POST", "/v1/regions/{name}", "region", "us-east", status))
		assert.Equal(t, uint64(i+1), r.Seq)
		got, ok := h.Snap().AuditRecord(r.Seq)
		require.True(t, ok)
		assert.Equal(t, prev, got.PrevHash, "record %d links to the previous hash", r.Seq)
		want, err := proto.AuditHash(prev, got)
		require.NoError(t, err)
		assert.Equal(t, want, got.Hash)
		assert.Equal(t, status, got.Status)
		assert.Equal(t, h.Index, got.Index)
		assert.NotEmpty(t, got.After, "the region's state after the request")
		prev = got.Hash
	}
	res := proto.VerifyAuditChain(h.Snap().AuditRecords(0, 0, nil))
	assert.True(t, res.OK, res.Problem)
	assert.Equal(t, 4, res.Records)
	assert.Equal(t, prev, res.HeadHash)
}

func TestAuditAttached(t *testing.T) {
	t.Parallel()
	h := fsmtest.New(t)
	h.Load(fsmtest.Inventory{Regions: []string{"us-east"}, SliceNodes: 1})
	sid := slot(n0, 2)
	rec := auditRec("admin", "POST", "/v1/slots/{id}/disable", "slot", sid, 200)
	rec.Reason = "riser"

	// Written right after a command that succeeded, with its after state.
	br := batch(h,
		enc(t, proto.SlotDisableType, proto.SlotDisableRequest{At: h.At(), SlotID: sid, Reason: "riser"}),
		enc(t, proto.AuditAppendType, proto.AuditAppendRequest{At: h.At(), Attached: true, Record: rec}))
	require.IsType(t, &proto.Slot{}, br.Responses[0])
	ar := br.Responses[1].(*proto.AuditAppendResponse)
	require.False(t, ar.Skipped)
	got, _ := h.Snap().AuditRecord(ar.Seq)
	var before, after proto.Slot
	require.NoError(t, json.Unmarshal(got.Before, &before), "the FSM read the slot before the disable")
	require.NoError(t, json.Unmarshal(got.After, &after))
	assert.Equal(t, proto.SlotAvailable, before.Status)
	assert.Equal(t, proto.SlotDisabled, after.Status)
	assert.Equal(t, []string{sid}, got.Slots)
	assert.Equal(t, "riser", got.Reason)

	// After a refused command it is skipped (the API records the refusal).
	br = batch(h,
		enc(t, proto.SlotRepairType, proto.SlotRepairRequest{At: h.At(), SlotID: "no-such-slot"}),
		enc(t, proto.AuditAppendType, proto.AuditAppendRequest{At: h.At(), Attached: true, Record: rec}))
	require.Implements(t, (*error)(nil), br.Responses[0])
	assert.True(t, br.Responses[1].(*proto.AuditAppendResponse).Skipped)
	assert.Equal(t, 1, h.Snap().AuditCount())

	// Attached outside a batch, or first in one: refused.
	h.Refuse(proto.AuditAppendType, proto.AuditAppendRequest{At: h.At(), Attached: true, Record: rec}, proto.CodeInvalidArgument)
	br = batch(h, enc(t, proto.AuditAppendType, proto.AuditAppendRequest{At: h.At(), Attached: true, Record: rec}))
	assert.Equal(t, proto.CodeInvalidArgument, proto.CodeOf(br.Responses[0].(error)))

	// A placement's record names the allocation and its slots.
	req := h.SliceRequest("a1", "k1", n0, slot(n0, 0), slot(n0, 1))
	br = batch(h, enc(t, proto.AllocationPlaceType, req),
		enc(t, proto.AuditAppendType, proto.AuditAppendRequest{At: h.At(), Attached: true,
			Record: auditRec("op", "POST", "/v1/allocations", "allocation", "", 201)}))
	ar = br.Responses[1].(*proto.AuditAppendResponse)
	got, _ = h.Snap().AuditRecord(ar.Seq)
	assert.Equal(t, "a1", got.ObjectID)
	assert.ElementsMatch(t, []string{slot(n0, 0), slot(n0, 1)}, got.Slots)
	assert.Equal(t, 201, got.Status)
	assert.True(t, proto.VerifyAuditChain(h.Snap().AuditRecords(0, 0, nil)).OK)
}

func TestAuditAppendRefusesBadRecords(t *testing.T) {
	t.Parallel()
	h := fsmtest.New(t)
	for name, mut := range map[string]func(*proto.AuditRecord){
		"no actor":      func(r *proto.AuditRecord) { r.Actor = "" },
		"no route":      func(r *proto.AuditRecord) { r.Route = "" },
		"status":        func(r *proto.AuditRecord) { r.Status = 1000 },
		"checkpoint":    func(r *proto.AuditRecord) { r.Pruned = true },
		"too many slot": func(r *proto.AuditRecord) { r.Slots = make([]string, proto.MaxAuditSlots+1) },
	} {
		t.Run(name, func(t *testing.T) {
			r := auditRec("admin", "POST", "/v1/x", "", "", 200)
			mut(&r)
			h.Refuse(proto.AuditAppendType, proto.AuditAppendRequest{At: h.At(), Record: r}, proto.CodeInvalidArgument)
		})
	}
}

func TestAuditPrune(t *testing.T) {
	t.Parallel()
	h := fsmtest.New(t)
	var recs []*proto.AuditAppendResponse
	for i := range 5 {
		recs = append(recs, appendAudit(h, auditRec(fmt.Sprintf("u%d", i), "POST", "/v1/x", "", "", 200)))
	}
	h.Refuse(proto.AuditPruneType, proto.AuditPruneRequest{At: h.At(), ThroughSeq: 2, Hash: recs[0].Hash}, proto.CodeConflict)
	h.Refuse(proto.AuditPruneType, proto.AuditPruneRequest{At: h.At(), ThroughSeq: 9, Hash: recs[4].Hash}, proto.CodeNotFound)

	resp := h.OK(proto.AuditPruneType, proto.AuditPruneRequest{At: h.At(), ThroughSeq: 3, Hash: recs[2].Hash}).(*proto.AuditPruneResponse)
	assert.Equal(t, 3, resp.Pruned)
	all := h.Snap().AuditRecords(0, 0, nil)
	require.Len(t, all, 3)
	assert.True(t, all[0].Pruned)
	assert.Equal(t, uint64(3), all[0].Seq)
	res := proto.VerifyAuditChain(all)
	assert.True(t, res.OK, res.Problem)
	assert.Equal(t, uint64(3), res.FirstSeq)

	// Pruning again through the checkpoint's successor.
	resp = h.OK(proto.AuditPruneType, proto.AuditPruneRequest{At: h.At(), ThroughSeq: 4, Hash: recs[3].Hash}).(*proto.AuditPruneResponse)
	assert.Equal(t, 2, resp.Pruned) // the old checkpoint and record 4
	appendAudit(h, auditRec("after", "POST", "/v1/x", "", "", 200))
	res = proto.VerifyAuditChain(h.Snap().AuditRecords(0, 0, nil))
	assert.True(t, res.OK, res.Problem)
	assert.Equal(t, uint64(6), res.LastSeq)

	// Through the head: the checkpoint alone, and the chain goes on from it.
	head, _ := h.Snap().AuditHead()
	h.OK(proto.AuditPruneType, proto.AuditPruneRequest{At: h.At(), ThroughSeq: head.Seq, Hash: head.Hash})
	require.Equal(t, 1, h.Snap().AuditCount())
	appendAudit(h, auditRec("later", "POST", "/v1/x", "", "", 200))
	res = proto.VerifyAuditChain(h.Snap().AuditRecords(0, 0, nil))
	assert.True(t, res.OK, res.Problem)
	assert.Equal(t, uint64(7), res.LastSeq)
}

// snapshotLines returns the snapshot of h as lines.
func snapshotLines(t *testing.T, h *fsmtest.Harness) []string {
	return strings.Split(strings.TrimSuffix(string(snapshotJSON(t, h.FSM)), "\n"), "\n")
}

// restoreLines restores lines (the trailer's count recomputed, as a
// careful tamperer would) and verifies the restored chain.
func restoreLines(t *testing.T, lines []string) proto.AuditVerifyResult {
	t.Helper()
	n := len(lines) - 2
	lines[len(lines)-1] = fmt.Sprintf(`{"t":"end","n":%d}`, n)
	data := []byte(strings.Join(lines, "\n") + "\n")
	_, rep, err := fsm.ReadCheckedSnapshot(bytes.NewReader(data))
	require.NoError(t, err)
	f := fsm.New(nil, nil)
	require.NoError(t, f.Restore(io.NopCloser(bytes.NewReader(data))))
	res := proto.VerifyAuditChain(f.Store().Snapshot().AuditRecords(0, 0, nil))
	assert.Equal(t, res, rep.Audit, "the restore reports the chain's state")
	return res
}

func TestAuditSnapshotKeepsChainAndShowsTampering(t *testing.T) {
	t.Parallel()
	h := fsmtest.New(t)
	h.Load(fsmtest.Inventory{Regions: []string{"us-east"}, SliceNodes: 1})
	for i := range 4 {
		appendAudit(h, auditRec(fmt.Sprintf("u%d", i), "POST", "/v1/slots/{id}/disable", "slot", slot(n0, i), 200))
	}
	auditLine := func(lines []string, seq int) int {
		for i, l := range lines {
			if strings.HasPrefix(l, `{"t":"audit","v":{"seq":`+fmt.Sprint(seq)+`,`) {
				return i
			}
		}
		t.Fatalf("no audit record %d in the snapshot", seq)
		return -1
	}

	t.Run("restore keeps the chain", func(t *testing.T) {
		res := restoreLines(t, snapshotLines(t, h))
		assert.True(t, res.OK, res.Problem)
		assert.Equal(t, uint64(4), res.LastSeq)
	})
	for _, tc := range []struct {
		name   string
		tamper func([]string) []string
		broken uint64
	}{
		{"edited actor", func(l []string) []string {
			i := auditLine(l, 2)
			l[i] = strings.Replace(l[i], `"actor":"u1"`, `"actor":"someone-else"`, 1)
			return l
		}, 2},
		{"edited status", func(l []string) []string {
			i := auditLine(l, 3)
			l[i] = strings.Replace(l[i], `"status":200`, `"status":403`, 1)
			return l
		}, 3},
		{"deleted record", func(l []string) []string {
			i := auditLine(l, 2)
			return append(l[:i], l[i+1:]...)
		}, 3},
		{"deleted first record", func(l []string) []string {
			i := auditLine(l, 1)
			return append(l[:i], l[i+1:]...)
		}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := restoreLines(t, tc.tamper(snapshotLines(t, h)))
			assert.False(t, res.OK)
			assert.Equal(t, tc.broken, res.BrokenSeq, res.Problem)
		})
	}
}

// TestAuditStatesSameOnEveryReplica: the FSM reuses the rendering of a
// stored allocation (the placement record's "after" is the release
// record's "before"). A replica whose cache is empty at every entry (it
// restores a snapshot of itself before each one) must write the same
// records, byte for byte, and every state must be what rendering the
// object gives.
func TestAuditStatesSameOnEveryReplica(t *testing.T) {
	t.Parallel()
	h := fsmtest.New(t)
	h.Load(fsmtest.Inventory{Regions: []string{"us-east"}, SliceNodes: 2})
	attached := func(route, id string, status int) []byte {
		return enc(t, proto.AuditAppendType, proto.AuditAppendRequest{At: h.At(), Attached: true,
			Record: auditRec("op", "POST", route, "allocation", id, status)})
	}
	place := func(id, key, node string, slots ...string) *proto.AuditAppendResponse {
		br := batch(h, enc(t, proto.AllocationPlaceType, h.SliceRequest(id, key, node, slots...)),
			attached("/v1/allocations", "", 201))
		return br.Responses[1].(*proto.AuditAppendResponse)
	}
	release := func(id string) *proto.AuditAppendResponse {
		br := batch(h, enc(t, proto.AllocationForceReleaseType, proto.AllocationForceReleaseRequest{At: h.At(), AllocationID: id, Reason: "test <&>"}),
			attached("/v1/allocations/{id}/force-release", id, 200))
		return br.Responses[1].(*proto.AuditAppendResponse)
	}
	record := func(seq uint64) *proto.AuditRecord {
		r, ok := h.Snap().AuditRecord(seq)
		require.True(t, ok)
		return r
	}

	p1 := place("a1", "k1", n0, slot(n0, 0), slot(n0, 1))
	p2 := place("a2", "k2", fsmtest.NodeID("us-east", 1), slot(fsmtest.NodeID("us-east", 1), 0))
	p1again := place("a1", "k1", n0, slot(n0, 0), slot(n0, 1)) // the key seen: the stored allocation
	h.Transition("a2", proto.AllocProvisioning)                // a2's placed object is gone from the store
	r1 := release("a1")
	r2 := release("a2")
	// A standalone record of a released allocation reads it from the store.
	s1 := appendAudit(h, auditRec("op", "POST", "/v1/allocations/{id}/note", "allocation", "a1", 200))

	// The cache was used: a1's release found the object its placement
	// rendered and shares the bytes; a2 was written in between.
	placed1, released1 := record(p1.Seq), record(r1.Seq)
	require.NotEmpty(t, placed1.After)
	assert.Same(t, &placed1.After[0], &record(p1again.Seq).After[0], "the repeated placement renders the same stored allocation")
	assert.Same(t, &placed1.After[0], &released1.Before[0], "the release's before is the placement's after, shared")
	assert.NotSame(t, &record(p2.Seq).After[0], &record(r2.Seq).Before[0])
	assert.Same(t, &released1.After[0], &record(s1.Seq).After[0])
	var before, after proto.Allocation
	require.NoError(t, json.Unmarshal(released1.Before, &before))
	require.NoError(t, json.Unmarshal(released1.After, &after))
	assert.Equal(t, proto.AllocPlaced, before.State)
	assert.Equal(t, proto.AllocReleased, after.State)
	// Every state is the rendering of the object it names as stored then.
	var b2 proto.Allocation
	require.NoError(t, json.Unmarshal(record(r2.Seq).Before, &b2))
	assert.Equal(t, proto.AllocProvisioning, b2.State)
	assert.Equal(t, string(proto.AuditState(h.Alloc("a1"))), string(released1.After))

	// The other replica: the same log, each entry applied on a freshly
	// restored FSM (an empty cache).
	other := fsm.New(nil, nil)
	for _, e := range h.Log {
		require.NoError(t, other.Restore(io.NopCloser(bytes.NewReader(snapshotBytes(t, other)))))
		other.ApplyCommand(e.Index, e.Data)
	}
	want := h.Snap().AuditRecords(0, 0, nil)
	got := other.Store().Snapshot().AuditRecords(0, 0, nil)
	require.Len(t, got, len(want))
	for i := range want {
		assert.Equal(t, *want[i], *got[i], "record %d", want[i].Seq)
	}
	assert.NotSame(t, &got[p1.Seq-1].After[0], &got[r1.Seq-1].Before[0], "the restored replica rendered the release's before again")
	res := proto.VerifyAuditChain(got)
	assert.True(t, res.OK, res.Problem)
	assert.Equal(t, 6, res.Records)
}

// A stored record's text fields share one allocation and keep their
// values (the record still hashes to its hash).
func TestAuditRecordStringsPacked(t *testing.T) {
	t.Parallel()
	h := fsmtest.New(t)
	h.Load(fsmtest.Inventory{Regions: []string{"us-east"}, SliceNodes: 1})
	rec := auditRec("admin", "POST", "/v1/slots/{id}/disable", "slot", slot(n0, 1), 200)
	rec.Reason, rec.Error = "fan <loud>", "x: \xff"
	ar := appendAudit(h, rec)
	got, ok := h.Snap().AuditRecord(ar.Seq)
	require.True(t, ok)
	assert.Equal(t, rec.Actor, got.Actor)
	assert.Equal(t, rec.Route, got.Route)
	assert.Equal(t, rec.ObjectID, got.ObjectID)
	assert.Equal(t, "fan <loud>", got.Reason)
	assert.Equal(t, "x: \uFFFD", got.Error, "sanitized before it was packed")
	assert.Equal(t, ar.Hash, got.Hash)
	want, err := proto.AuditHash(got.PrevHash, got)
	require.NoError(t, err)
	assert.Equal(t, want, got.Hash)
	// One backing array: each field starts where the one before ends.
	fields := []string{got.Actor, got.Role, got.TokenID, got.Remote, got.RequestID, got.Method, got.Route, got.Path,
		got.ObjectKind, got.ObjectID, got.Reason, got.Error, got.Hash}
	for i := 1; i < len(fields); i++ {
		prev := unsafe.StringData(fields[i-1])
		assert.Equal(t, uintptr(unsafe.Pointer(prev))+uintptr(len(fields[i-1])), uintptr(unsafe.Pointer(unsafe.StringData(fields[i]))), "field %d follows field %d", i, i-1)
	}
}
