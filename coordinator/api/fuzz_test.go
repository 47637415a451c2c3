package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/gpuaas/gpuaas/proto"
)

// FuzzAllocationCreateBody sends fuzzed bodies to POST /v1/allocations
// (as an operator or a tenant) on a ledger holding the lab inventory: the
// answer is never a 5xx, a refused request changes nothing, and a placed
// allocation is owned by the caller and re-validates.
func FuzzAllocationCreateBody(f *testing.F) {
	seeds := []string{
		`{"capacity_shape":"gpu_slice","sku":"h200-sxm-slice","gpu_count":1,"region":"us-east"}`,
		`{"capacity_shape":"gpu_slice","sku":"h200-sxm-slice","gpu_count":8,"region":"us-east","ssh_keys":["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIG9h x@y"]}`,
		`{"capacity_shape":"baremetal","sku":"h200-sxm-baremetal","region":"us-east"}`,
		`{"capacity_shape":"gpu_slice","sku":"h200-sxm-slice","gpu_count":1,"region":"us-east","owner":"admin-user"}`,
		`{"capacity_shape":"gpu_slice","sku":"h200-sxm-slice","gpu_count":1,"region":"us-east","image":"lab-guest:v1"}`,
		`{"capacity_shape":"gpu_slice","gpu_count":1,"gpu_count":2}`,
		`{"Capacity_Shape":"gpu_slice"}`,
		`{"capacity_shape":"gpu_slice","sku":"h200-sxm-slice","gpu_count":-1,"region":"us-east"}`,
		`{"capacity_shape":"gpu_slice","sku":"h200-sxm-slice","gpu_count":1e309,"region":"us-east"}`,
		`{"capacity_shape":"gpu_slice","sku":"h200-sxm-slice","gpu_count":1,"region":"mars"}`,
		`[]`, `null`, `{}`, `{"a":{"b":[1,2,{"c":null}]}}`, "\xff",
	}
	for i, s := range seeds {
		f.Add(uint8(i%2), []byte(s))
	}
	e := newEnv(f)
	e.seedLab()
	var n atomic.Int64
	f.Fuzz(func(t *testing.T, who uint8, body []byte) {
		role := RoleOperator
		if who%2 == 1 {
			role = RoleTenant
		}
		before := e.index()
		req := httptest.NewRequest(http.MethodPost, "/v1/allocations", bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+e.tok[role])
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(proto.IdempotencyKeyHeader, fmt.Sprintf("fuzz-%d", n.Add(1)))
		rec := httptest.NewRecorder()
		e.api.ServeHTTP(rec, req)
		switch {
		case rec.Code >= 500:
			t.Fatalf("answered %d to %q: %s", rec.Code, body, rec.Body)
		case rec.Code >= 400:
			if after := e.index(); after != before {
				t.Fatalf("a refused create (%d) moved the ledger from %d to %d: %q", rec.Code, before, after, body)
			}
			var p proto.Problem
			if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil || p.Detail == "" {
				t.Fatalf("a refusal is not a problem with a detail: %s", rec.Body)
			}
		default:
			var a proto.Allocation
			if err := json.Unmarshal(rec.Body.Bytes(), &a); err != nil {
				t.Fatalf("a %d answer is not an allocation: %v", rec.Code, err)
			}
			if want := role.String() + "-user"; a.Owner != want {
				t.Fatalf("%s created an allocation owned by %q from %q", want, a.Owner, body)
			}
			var again proto.AllocationCreateRequest
			if err := decodeStrict(body, &again); err != nil {
				t.Fatalf("an accepted body does not decode again: %v", err)
			}
		}
	})
}
