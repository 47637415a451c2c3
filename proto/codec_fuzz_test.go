package proto_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/proto"
)

// FuzzDecodeBody decodes arbitrary bytes as a Raft command body of a few
// command structs (binary codec, legacy JSON, anything else): never a
// panic, and a body that decodes re-encodes to bytes that decode and
// re-encode to the same bytes (the binary codec is a fixpoint after one
// round, whatever the body was written in).
func FuzzDecodeBody(f *testing.F) {
	at := time.Date(2026, 11, 25, 23, 0, 0, 5, time.UTC)
	place := proto.AllocationPlaceRequest{At: at, Allocation: proto.Allocation{ID: "a1", IdempotencyKey: "k", Shape: proto.ShapeGPUSlice,
		SKU: "h200-sxm-slice", GPUCount: 2, Region: "us-east", SSHPublicKeys: []string{"ssh-ed25519 AAAA x"}},
		NodeID: "n1", NodeModifyIndex: 7, Slots: []proto.SlotExpect{{SlotID: "n1-s0", ModifyIndex: 3}}, ClaimIDs: []string{"c1"},
		Task: proto.Task{ID: "t1"}}
	audit := proto.AuditAppendRequest{At: at, Attached: true, Record: proto.AuditRecord{Actor: "a", Method: "POST", Route: "/v1/allocations",
		Before: []byte(`{"state":"placed"}`), Slots: []string{"n1-s0"}, Status: 201}}
	for _, v := range []any{place, audit, proto.NodeDrainRequest{At: at, NodeID: "n1", Draining: true}} {
		b, err := proto.MarshalBinary(v)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		f.Add(b[:len(b)/2])
	}
	f.Add([]byte(`{"at":"2026-11-25T23:00:00+01:00","node_id":"n1","draining":true}`))
	f.Add([]byte(`{"allocation":{"ssh_public_keys":[]},"slots":[],"claim_ids":null}`))
	f.Add([]byte{0x02, 0x80})
	f.Add([]byte{0x01, 0xdf, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{0x01, 0xdd, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, body []byte) {
		fixpoint(t, body, func() any { return new(proto.AllocationPlaceRequest) })
		fixpoint(t, body, func() any { return new(proto.AuditAppendRequest) })
		fixpoint(t, body, func() any { return new(proto.NodeDrainRequest) })
	})
}

func fixpoint(t *testing.T, body []byte, mk func() any) {
	v := mk()
	if proto.DecodeBody(body, v) != nil {
		return
	}
	b1, err := proto.MarshalBinary(v)
	if err != nil {
		t.Fatalf("encode a decoded %T: %v", v, err)
	}
	v2 := mk()
	if err := proto.DecodeBody(b1, v2); err != nil {
		t.Fatalf("a re-encoded %T does not decode: %v (%x)", v, err, b1)
	}
	b2, err := proto.MarshalBinary(v2)
	if err != nil {
		t.Fatalf("encode %T again: %v", v2, err)
	}
	if !bytes.Equal(b1, b2) {
		t.Fatalf("%T: re-encoding is not stable:\n%x\n%x", v, b1, b2)
	}
}
