package proto_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/proto"
)

// FuzzSliceProvisionResult decodes an agent's slice.provision result (a
// task report body: outside input) the way the API does, then validates
// it: never a panic, and an accepted result re-encodes to one that is
// accepted again.
func FuzzSliceProvisionResult(f *testing.F) {
	f.Add([]byte(`{"allocation_id":"alloc-1","domain":"gpuaas-alloc-1","access":{"guest_ip":"10.200.0.10","guest_mac":"52:54:00:00:00:01","user":"root","ssh_command":"ssh root@10.200.0.10"},"slots":[{"slot_id":"n1-s0","health_state":"ready","evidence":["ssh ok"]}]}`))
	f.Add([]byte(`{"allocation_id":"alloc-1","failed_stage":"clone","touched_slots":["n1-s0"]}`))
	f.Add([]byte(`{"allocation_id":"alloc-1","allocation_id":"alloc-2"}`))
	f.Add([]byte(`{"Allocation_ID":"alloc-1"}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		var r proto.SliceProvisionResult
		if err := proto.DecodeResult("slice.provision result", raw, &r); err != nil {
			return
		}
		for _, ok := range []bool{true, false} {
			if r.Validate("alloc-1", []string{"n1-s0", "n1-s1"}, ok) != nil {
				continue
			}
			b, err := json.Marshal(r)
			if err != nil {
				t.Fatalf("encode an accepted result: %v", err)
			}
			var again proto.SliceProvisionResult
			if err := proto.DecodeResult("slice.provision result", b, &again); err != nil {
				t.Fatalf("an accepted result does not decode again: %v (%s)", err, b)
			}
			if err := again.Validate("alloc-1", []string{"n1-s0", "n1-s1"}, ok); err != nil {
				t.Fatalf("an accepted result is refused once re-encoded: %v (%s)", err, b)
			}
		}
	})
}

// FuzzDecodeAuditLine decodes one line of an audit export (a file anyone
// may hand to "gpuaasctl audit verify --file"): never a panic, and an
// accepted record hashes the same after it is encoded and decoded again,
// so a re-written export of the same records still verifies.
func FuzzDecodeAuditLine(f *testing.F) {
	rec := proto.AuditRecord{Seq: 1, Time: time.Date(2026, 11, 25, 20, 0, 0, 123, time.UTC), Index: 42, Actor: "admin", Role: "admin",
		TokenID: "0123456789ab", Remote: "192.0.2.7:51000", RequestID: "3f1c2a9e8b7d6c5a", Method: "POST",
		Route: "/v1/allocations/{id}/force-release", Path: "/v1/allocations/a1/force-release", ObjectKind: "allocation",
		ObjectID: "a1", Slots: []string{"n1-s0"}, Reason: "agent lost <again>", Before: json.RawMessage(`{"state":"placed"}`),
		After: json.RawMessage(`{"state":"released"}`), Status: 200}
	h, err := proto.AuditHash("", &rec)
	if err != nil {
		f.Fatal(err)
	}
	rec.Hash = h
	line, err := json.Marshal(rec)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(line)
	f.Add([]byte(`{"seq":7,"time":"2026-11-25T20:00:00Z","index":9,"actor":"","method":"","route":"","status":0,"pruned":true,"prev_hash":"","hash":"` + h + `"}`))
	f.Add([]byte(`{"seq":1,"seq":2}`))
	f.Add([]byte(`{"Seq":1}`))
	f.Add([]byte(`{"seq":1,"time":"2026-11-25T21:00:00+01:00","index":1,"actor":"a\ud800","method":"POST","route":"/x","before":{ "a" : [1, 2] },"status":200,"prev_hash":"","hash":"` + h + `"}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		r, err := proto.DecodeAuditLine(raw)
		if err != nil {
			return
		}
		want, err := proto.AuditHash(r.PrevHash, r)
		if err != nil {
			return // a record whose fields cannot be hashed never verifies
		}
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatalf("encode an accepted record: %v", err)
		}
		again, err := proto.DecodeAuditLine(b)
		if err != nil {
			t.Fatalf("an accepted record does not decode once re-encoded: %v (%s)", err, b)
		}
		got, err := proto.AuditHash(again.PrevHash, again)
		if err != nil {
			t.Fatalf("hash the re-decoded record: %v", err)
		}
		if got != want {
			t.Fatalf("hash changed across encode/decode: %s != %s\nline: %s\nagain: %s", got, want, raw, b)
		}
	})
}
