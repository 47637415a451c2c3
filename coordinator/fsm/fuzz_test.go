package fsm_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/gpuaas/gpuaas/coordinator/fsm"
	"github.com/gpuaas/gpuaas/coordinator/fsm/fsmtest"
	"github.com/gpuaas/gpuaas/proto"
)

// FuzzApplyCommand applies a command of every ledger type with a fuzzed
// body to a small loaded ledger: the FSM answers (applied or refused), and
// the ledger invariants hold after it (the Checker checks what the
// command wrote). The one panic allowed is the documented one for a body
// that does not decode into the type's request at all — binary (codec
// version byte + MessagePack), legacy JSON, or an unknown codec version
// (proposers only encode validated Go values, so such an entry means the
// log is corrupt); any other panic is a bug. A command_batch is fuzzed through
// DecodeBatch alone: an undecodable batch entry panics on purpose
// (divergence is worse than a crash), and only the leader frames them.
// `go test` runs the seeds; `make fuzz` explores.
func FuzzApplyCommand(f *testing.F) {
	inv := fsmtest.Inventory{SliceNodes: 2, BaremetalNodes: 1, SlotsPerNode: 2}
	setup := inv.Commands(fsmtest.Epoch)
	for _, c := range setup {
		b := c.Encode() // binary: the codec version byte, then MessagePack
		f.Add(b[0], b[1:])
		legacy, err := proto.EncodeJSON(c.Type, c.Req) // a log from before the binary codec
		if err != nil {
			f.Fatal(err)
		}
		f.Add(legacy[0], legacy[1:])
	}
	if b := setup[len(setup)-1].Encode(); len(b) > 8 {
		f.Add(b[0], b[1:len(b)-4])                    // truncated binary body
		f.Add(b[0], append([]byte{0x02}, b[2:]...))   // unknown codec version
		f.Add(b[0], append(b[1:len(b):len(b)], 0xc0)) // trailing bytes
	}
	f.Add(byte(proto.AllocationPlaceType), []byte(`{"at":"2026-01-01T00:00:00Z"}`))
	f.Add(byte(proto.SlotApproveType), []byte(`{"at":"2026-01-01T00:00:00Z","slot":{"id":"../x"}}`))
	f.Add(byte(proto.TaskUpdateType), []byte(`null`))
	types := slices.DeleteFunc(slices.Clone(fsm.LedgerTypes), func(t proto.MessageType) bool { return t == proto.CommandBatchType })
	// typ picks types[typ % len(types)]: the audit seeds name theirs.
	at := func(t proto.MessageType) byte { return byte(slices.Index(types, t)) }
	f.Add(at(proto.AuditAppendType), []byte(`{"at":"2026-01-01T00:00:00Z","record":{"actor":"a","method":"POST","route":"/v1/slots/{id}/disable","object_kind":"slot","object_id":"us-east-n0000-s0","status":200,"before":{"x":[1]}}}`))
	f.Add(at(proto.AuditAppendType), []byte(`{"at":"2026-01-01T00:00:00Z","attached":true,"record":{"actor":"a","method":"POST","route":"/x"}}`))
	f.Add(at(proto.AuditPruneType), []byte(`{"at":"2026-01-01T00:00:00Z","through_seq":1,"hash":"00"}`))
	f.Add(byte(proto.NodeUpsertType), []byte(`{"node":{"id":"`+string(make([]byte, 300))+`"}}`))
	f.Fuzz(func(t *testing.T, typ byte, body []byte) {
		if proto.MessageType(typ) == proto.CommandBatchType {
			_, _ = proto.DecodeBatch(body)
			return
		}
		mt := types[int(typ)%len(types)]
		defer func() {
			if r := recover(); r != nil {
				if msg, ok := r.(string); ok && strings.HasPrefix(msg, "fsm: index ") && strings.Contains(msg, ": decode "+mt.String()+": ") {
					return // undecodable body: the documented fatal path
				}
				panic(r)
			}
		}()
		c := fsm.NewChecker()
		var idx uint64
		for _, s := range setup {
			idx++
			if _, err := c.Apply(idx, s.Encode()); err != nil {
				t.Fatalf("setup: %v", err)
			}
		}
		idx++
		if _, err := c.Apply(idx, append([]byte{byte(mt)}, body...)); err != nil {
			t.Fatalf("%s with body %q: %v", mt, body, err)
		}
	})
}
