package proto_test

import (
	"encoding/json"
	"strings"
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

// FuzzImageManifest decodes a catalog entry's body (PUT
// /v1/images/{name}/{version}: an admin's upload manifest) strictly, as
// the API does, and validates the entry: never a panic; an accepted entry
// re-encodes to one that is accepted again, names itself as the image
// spec name:version, and the reference a provision task carries from it
// is the same image.
func FuzzImageManifest(f *testing.F) {
	digest := "sha256:" + strings.Repeat("ab", 32)
	f.Add("lab-guest", "v1", []byte(`{"kind":"slice_base","digest":"`+digest+`","size":67108864,"readiness_check":"base-ssh","marker_sha256":"`+strings.Repeat("0f", 32)+`"}`))
	f.Add("ubuntu-cuda", "24.04.1", []byte(`{"kind":"slice_cuda","digest":"`+digest+`","size":1,"readiness_check":"cuda"}`))
	f.Add("lab", "1", []byte(`{"kind":"baremetal_tgz","digest":"`+digest+`","size":9223372036854775807}`))
	f.Add("lab", "1", []byte(`{"kind":"slice_base","digest":"SHA256:`+strings.Repeat("AB", 32)+`","size":1}`))
	f.Add("../x", "1", []byte(`{"kind":"slice_base","digest":"`+digest+`","size":1,"kind":"baremetal_tgz"}`))
	f.Add("lab", "v:1", []byte(`{"Kind":"slice_base"}`))
	f.Fuzz(func(t *testing.T, name, version string, raw []byte) {
		var body proto.ImageBody
		if err := proto.DecodeResult("image body", raw, &body); err != nil {
			return
		}
		im := proto.Image{Name: name, Version: version, Kind: body.Kind, Digest: body.Digest, Size: body.Size,
			ReadinessCheck: body.ReadinessCheck, MarkerSHA256: body.MarkerSHA256}
		if im.Validate() != nil {
			return
		}
		b, err := json.Marshal(im)
		if err != nil {
			t.Fatalf("encode an accepted entry: %v", err)
		}
		var again proto.Image
		if err := json.Unmarshal(b, &again); err != nil {
			t.Fatalf("an accepted entry does not decode again: %v (%s)", err, b)
		}
		if err := again.Validate(); err != nil {
			t.Fatalf("an accepted entry is refused once re-encoded: %v (%s)", err, b)
		}
		n, v, err := proto.ParseImageSpec(im.String())
		if err != nil || n != name || v != version {
			t.Fatalf("entry %s names itself as %q %q (%v)", im.String(), n, v, err)
		}
		ref := im.Ref()
		if ref.Name != name || ref.Version != version || ref.Digest != im.Digest || ref.Size != im.Size ||
			ref.URL != proto.BlobPath(name, version) || strings.Count(ref.URL, "/") != 5 {
			t.Fatalf("the task's reference %+v is not entry %s", ref, im.String())
		}
	})
}

// FuzzParseImageSpec: an allocation's image ("name" or "name:version",
// from a tenant) either parses into valid identifiers that spell it back
// or is refused with a clear error.
func FuzzParseImageSpec(f *testing.F) {
	for _, s := range []string{"lab-guest", "lab-guest:v1", "ubuntu-cuda:24.04.1", ":", "a:", ":b", "a:b:c", "../etc:passwd", "Lab", "a\x00b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		name, version, err := proto.ParseImageSpec(s)
		if err != nil {
			if proto.CodeOf(err) != proto.CodeInvalidArgument {
				t.Fatalf("refusal of %q is %s, not invalid_argument: %v", s, proto.CodeOf(err), err)
			}
			return
		}
		if proto.ValidateID("name", name) != nil || version != "" && proto.ValidateID("version", version) != nil {
			t.Fatalf("%q parsed into invalid parts %q %q", s, name, version)
		}
		back := name
		if version != "" || strings.HasSuffix(s, ":") {
			back += ":" + version
		}
		if back != s {
			t.Fatalf("%q parsed into %q %q, which spell %q", s, name, version, back)
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

// FuzzAppLaunchAndResult decodes what the app instance paths take from
// outside: a launch body (from a tenant) and an app task's result (from an
// agent): never a panic; an accepted launch request validates again after
// a round trip, and an accepted result's image reference and endpoints
// stay what they were.
func FuzzAppLaunchAndResult(f *testing.F) {
	f.Add([]byte(`{"app":"hello","version":"1.0.0"}`), []byte(`{"instance_id":"a-1.hello.9","state":"running","endpoints":{"8080":"10.213.0.2:8080"}}`))
	f.Add([]byte(`{"app":"compatible"}`), []byte(`{"state":"failed","detail":"health check"}`))
	f.Add([]byte(`{"app":"Hello","version":""}`), []byte(`{"endpoints":{"x":"y"}}`))
	f.Fuzz(func(t *testing.T, launch, result []byte) {
		var body proto.AppLaunchBody
		if proto.DecodeResult("app launch", launch, &body) == nil {
			req := proto.AppLaunchRequest{AllocationID: "a-1", App: body.App, Version: body.Version, Caller: "tenant"}
			if req.Validate() == nil {
				b, err := json.Marshal(req)
				if err != nil {
					t.Fatalf("encode: %v", err)
				}
				var again proto.AppLaunchRequest
				if err := json.Unmarshal(b, &again); err != nil || again.Validate() != nil {
					t.Fatalf("an accepted launch is refused once re-encoded: %v (%s)", err, b)
				}
				if again.App == "compatible" {
					t.Fatalf("the reserved name was accepted")
				}
			}
		}
		var res proto.AppTaskResult
		if proto.DecodeResult("app task result", result, &res) == nil {
			b, err := json.Marshal(res)
			if err != nil {
				t.Fatalf("encode: %v", err)
			}
			var again proto.AppTaskResult
			if err := json.Unmarshal(b, &again); err != nil || len(again.Endpoints) != len(res.Endpoints) {
				t.Fatalf("a decoded result does not survive a round trip: %v (%s)", err, b)
			}
		}
	})
}
