package proto_test

import (
	"encoding/json"
	"testing"

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

// FuzzAppManifest decodes an app manifest (an admin's PUT body or a
// gpuaasctl app publish file: outside input) strictly and validates it:
// never a panic, and an accepted manifest re-encodes to one that is
// accepted again.
func FuzzAppManifest(f *testing.F) {
	f.Add([]byte(`{"kind":"oci","image":"ghcr.io/gpuaas/hello@sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08","compat":{"shapes":["gpu_slice"],"min_gpus":1},"ports":[{"name":"http","port":8080,"protocol":"http"}],"health_check":{"port":8080,"path":"/healthz"}}`))
	f.Add([]byte(`{"kind":"slurm-cluster","image":"r@sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08","compat":{"shapes":["baremetal"],"topology":"multi_node","needs_fabric":true}}`))
	f.Add([]byte(`{"kind":"oci","image":"x:latest","compat":{"shapes":[]}}`))
	f.Add([]byte(`{"kind":"oci","kind":"vllm"}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		var body proto.AppBody
		if err := proto.DecodeResult("app manifest", raw, &body); err != nil {
			return
		}
		app := proto.App{Name: "fuzz", Version: "1", Kind: body.Kind, Image: body.Image, Description: body.Description,
			Compat: body.Compat, Ports: body.Ports, HealthCheck: body.HealthCheck}
		if app.Validate() != nil {
			return
		}
		b, err := json.Marshal(app)
		if err != nil {
			t.Fatalf("encode an accepted manifest: %v", err)
		}
		var again proto.App
		if err := json.Unmarshal(b, &again); err != nil {
			t.Fatalf("an accepted manifest does not decode again: %v (%s)", err, b)
		}
		if err := again.Validate(); err != nil {
			t.Fatalf("an accepted manifest is refused once re-encoded: %v (%s)", err, b)
		}
	})
}
