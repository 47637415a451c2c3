package fsm_test

import (
	"bytes"
	"fmt"
	"io"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/gpuaas/gpuaas/coordinator/fsm"
	"github.com/gpuaas/gpuaas/coordinator/fsm/fsmtest"
	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/sched"
)

// placeBench holds an FSM loaded with nodes×8 slots and pre-encoded
// placements of gpus slots each, every one on free slots (so every apply
// succeeds and writes allocation + claims + slots + outbox + timeline).
type placeBench struct {
	f     *fsm.FSM
	index uint64
	cmds  [][]byte
}

func newPlaceBench(b *testing.B, nodes, gpus int) *placeBench {
	b.Helper()
	h := fsmtest.New(b)
	h.Load(fsmtest.Inventory{SliceNodes: nodes})
	snap := h.Snap()
	pb := &placeBench{f: h.FSM, index: h.Index}
	k := 0
	for i := 0; i < nodes; i++ {
		id := fsmtest.NodeID("us-east", i)
		n, _ := snap.Node(id)
		slots := snap.NodeSlots(id)
		for j := 0; j+gpus <= len(slots); j += gpus {
			alloc := fmt.Sprintf("alloc-%d", k)
			req := proto.AllocationPlaceRequest{
				At: fsmtest.Epoch,
				Allocation: proto.Allocation{ID: alloc, IdempotencyKey: "key-" + alloc, Shape: proto.ShapeGPUSlice, SKU: "h200-sxm-slice",
					GPUCount: gpus, Region: "us-east", Owner: "bench", SSHPublicKeys: []string{"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB bench"}},
				NodeID: id, NodeModifyIndex: n.ModifyIndex, Task: proto.Task{ID: alloc + "-provision"},
			}
			for g := 0; g < gpus; g++ {
				s := slots[j+g]
				req.Slots = append(req.Slots, proto.SlotExpect{SlotID: s.ID, ModifyIndex: s.ModifyIndex})
				req.ClaimIDs = append(req.ClaimIDs, fmt.Sprintf("%s-c%d", alloc, g))
			}
			pb.cmds = append(pb.cmds, fsmtest.Command{Type: proto.AllocationPlaceType, Req: req}.Encode())
			k++
		}
	}
	return pb
}

// cpuTime is the process's user+system CPU time: on this shared 2-core
// machine wall time per op swings with other load, CPU time much less.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func benchmarkPlace(b *testing.B, gpus int) { benchmarkPlaceBatch(b, gpus, 1) }

// benchmarkPlaceBatch applies placements through ApplyBatch, batch at a
// time (raft hands a BatchingFSM up to MaxAppendEntries=64 entries).
func benchmarkPlaceBatch(b *testing.B, gpus, batch int) {
	const nodes = 1000
	pb := newPlaceBench(b, nodes, gpus)
	next := 0
	b.ReportAllocs()
	var cpu time.Duration
	defer func() { b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op") }()
	start := cpuTime()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if next == len(pb.cmds) {
			b.StopTimer()
			cpu += cpuTime() - start
			pb = newPlaceBench(b, nodes, gpus)
			next = 0
			start = cpuTime()
			b.StartTimer()
		}
		if batch == 1 {
			pb.index++
			if e, ok := pb.f.ApplyCommand(pb.index, pb.cmds[next]).(*proto.Error); ok {
				b.Fatalf("placement refused: %v", e)
			}
			next++
			continue
		}
		n := min(batch, len(pb.cmds)-next, b.N-i)
		logs := make([]*raft.Log, n)
		for j := range logs {
			pb.index++
			logs[j] = &raft.Log{Index: pb.index, Type: raft.LogCommand, Data: pb.cmds[next+j]}
		}
		for _, r := range pb.f.ApplyBatch(logs) {
			if e, ok := r.(*proto.Error); ok {
				b.Fatalf("placement refused: %v", e)
			}
		}
		next += n
		i += n - 1
	}
	cpu += cpuTime() - start
}

// BenchmarkApplyBatchPlace1GPU applies 1-GPU placements 64 per batch.
func BenchmarkApplyBatchPlace1GPU(b *testing.B) { benchmarkPlaceBatch(b, 1, 64) }

// BenchmarkApplyAllocationPlace1GPU is the cost of one AllocationPlace
// apply (decode, re-checks, one memdb transaction) on 1,000 nodes × 8 slots.
func BenchmarkApplyAllocationPlace1GPU(b *testing.B) { benchmarkPlace(b, 1) }

// BenchmarkApplyAllocationPlace4GPU places 4-GPU slices.
func BenchmarkApplyAllocationPlace4GPU(b *testing.B) { benchmarkPlace(b, 4) }

// BenchmarkCheckerPlace is the incremental invariant check F2's log
// replay pays per placement (apply + check).
func BenchmarkCheckerPlace(b *testing.B) {
	const nodes = 1000
	build := func() (*fsm.Checker, *placeBench) {
		pb := newPlaceBench(b, nodes, 1)
		c := fsm.NewChecker()
		h := fsmtest.New(b)
		for _, cmd := range (fsmtest.Inventory{SliceNodes: nodes}).Commands(fsmtest.Epoch) {
			h.Index++
			if _, err := c.Apply(h.Index, cmd.Encode()); err != nil {
				b.Fatal(err)
			}
		}
		return c, pb
	}
	c, pb := build()
	next := 0
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if next == len(pb.cmds) {
			b.StopTimer()
			c, pb = build()
			next = 0
			b.StartTimer()
		}
		pb.index++
		resp, err := c.Apply(pb.index, pb.cmds[next])
		if err != nil {
			b.Fatal(err)
		}
		if e, ok := resp.(*proto.Error); ok {
			b.Fatalf("placement refused: %v", e)
		}
		next++
	}
}

// BenchmarkWriteSnapshot streams a ledger of 1,000 nodes × 8 slots after
// 8,000 placements (allocations, claims, outbox, timeline): the cost raft
// pays in the background at each snapshot.
func BenchmarkWriteSnapshot(b *testing.B) {
	pb := newPlaceBench(b, 1000, 1)
	for _, c := range pb.cmds {
		pb.index++
		if e, ok := pb.f.ApplyCommand(pb.index, c).(*proto.Error); ok {
			b.Fatal(e)
		}
	}
	snap := pb.f.Store().Snapshot()
	for _, c := range []struct {
		name  string
		write func(io.Writer, *state.Snapshot) error
	}{{"binary", fsm.WriteSnapshot}, {"json-v1", fsm.WriteSnapshotJSON}} {
		b.Run(c.name, func(b *testing.B) {
			var size int
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				var w countingWriter
				if err := c.write(&w, snap); err != nil {
					b.Fatal(err)
				}
				size = int(w)
			}
			b.ReportMetric(float64(size)/1e6, "MB")
		})
	}
}

type countingWriter int

func (w *countingWriter) Write(p []byte) (int, error) {
	*w += countingWriter(len(p))
	return len(p), nil
}

// BenchmarkSchedOnLedgerSnapshot is a 1-GPU slice decision of sched on a
// ledger snapshot of 1,000 nodes × 8 slots (half of the nodes partly
// used): "fresh" opens a new snapshot per decision, "shared" plans on one
// snapshot as a leader batch does (memoized lists).
func BenchmarkSchedOnLedgerSnapshot(b *testing.B) {
	pb := newPlaceBench(b, 1000, 1)
	for i := 0; i < len(pb.cmds); i += 16 { // one slot on every other node
		pb.index++
		if e, ok := pb.f.ApplyCommand(pb.index, pb.cmds[i]).(*proto.Error); ok {
			b.Fatal(e)
		}
	}
	sku, _ := proto.FindSKU(proto.DefaultSKUs(), "h200-sxm-slice")
	req := sched.SliceRequest{SKU: sku, GPUCount: 1, Region: "us-east"}
	b.Run("fresh", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if _, err := sched.PlaceSlice(pb.f.Store().Snapshot(), req); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("shared", func(b *testing.B) {
		snap := pb.f.Store().Snapshot()
		for i := 0; i < b.N; i++ {
			if _, err := sched.PlaceSlice(snap, req); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkRestoreChecked restores the ledger of BenchmarkWriteSnapshot
// (1,000 nodes × 8 slots, 8,000 placements) with every slot checked and
// the invariants run on the result: what a replica pays to trust nothing.
func BenchmarkRestoreChecked(b *testing.B) {
	pb := newPlaceBench(b, 1000, 1)
	for _, c := range pb.cmds {
		pb.index++
		if e, ok := pb.f.ApplyCommand(pb.index, c).(*proto.Error); ok {
			b.Fatal(e)
		}
	}
	for _, c := range []struct {
		name  string
		write func(io.Writer, *state.Snapshot) error
	}{{"binary", fsm.WriteSnapshot}, {"json-v1", fsm.WriteSnapshotJSON}} {
		b.Run(c.name, func(b *testing.B) {
			var buf bytes.Buffer
			if err := c.write(&buf, pb.f.Store().Snapshot()); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				_, rep, err := fsm.ReadCheckedSnapshot(bytes.NewReader(buf.Bytes()))
				if err != nil || rep.Quarantined != 0 || rep.Violations != nil {
					b.Fatal(err, rep.Quarantined, rep.Violations)
				}
			}
		})
	}
}

// BenchmarkApplyPlaceAudit is what an audit record adds to a placement's
// apply: each placement alone in a command_batch entry, and the same with
// its attached audit record behind it (what the planner proposes for an
// API request), 1-GPU, 1,000 nodes × 8 slots.
func BenchmarkApplyPlaceAudit(b *testing.B) {
	for _, audited := range []bool{false, true} {
		b.Run(map[bool]string{false: "plain", true: "audited"}[audited], func(b *testing.B) {
			build := func() *placeBench {
				pb := newPlaceBench(b, 1000, 1)
				for i, c := range pb.cmds {
					cmds := [][]byte{c}
					if audited {
						cmds = append(cmds, fsmtest.Command{Type: proto.AuditAppendType, Req: proto.AuditAppendRequest{At: fsmtest.Epoch, Attached: true,
							Record: proto.AuditRecord{Actor: "bench", Role: "operator", TokenID: "0123456789ab", Remote: "192.0.2.1:40000",
								RequestID: "0123456789abcdef", Method: "POST", Route: "/v1/allocations", Path: "/v1/allocations",
								ObjectKind: "allocation", Status: 201}}}.Encode())
					}
					buf, err := proto.EncodeBatch(cmds)
					if err != nil {
						b.Fatal(err)
					}
					pb.cmds[i] = buf
				}
				return pb
			}
			pb := build()
			next := 0
			b.ReportAllocs()
			var cpu time.Duration
			start := cpuTime()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if next == len(pb.cmds) {
					b.StopTimer()
					cpu += cpuTime() - start
					pb = build()
					next = 0
					start = cpuTime()
					b.StartTimer()
				}
				pb.index++
				br := pb.f.ApplyCommand(pb.index, pb.cmds[next]).(*fsm.BatchResponse)
				for _, r := range br.Responses {
					if e, ok := r.(*proto.Error); ok {
						b.Fatalf("refused: %v", e)
					}
				}
				next++
			}
			cpu += cpuTime() - start
			b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
		})
	}
}
