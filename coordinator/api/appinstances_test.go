package api

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
)

// TestAppInstanceRoutes: a tenant launches on its own active allocation
// (Idempotency-Key required, a retry returns the instance), lists, shows
// and stops it; another tenant's allocation answers 404 as a missing one
// does; a name the routes reserve, an incompatible app and a missing key
// are refused naming why and change nothing.
func TestAppInstanceRoutes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.seedLab()
	mine := e.tenantCreate(RoleTenant, "tenant-1")
	theirs := e.tenantCreate(otherTenant, "other-1")
	compat := proto.AppCompat{Shapes: []proto.CapacityShape{proto.ShapeGPUSlice}, MinGPUs: 1}
	e.publishApp("hello", "1", appBody(proto.AppOCI, compat))
	big := appBody(proto.AppOCI, proto.AppCompat{Shapes: []proto.CapacityShape{proto.ShapeGPUSlice}, MinGPUs: 4})
	e.publishApp("big", "1", big)
	launch := func(who Role, alloc, body, key string) resp {
		hdr := []string{"Content-Type", "application/json"}
		if key != "" {
			hdr = append(hdr, proto.IdempotencyKeyHeader, key)
		}
		return e.doRaw(who, http.MethodPost, "/v1/allocations/"+alloc+"/apps", body, hdr...)
	}
	before := e.index()
	p := launch(RoleTenant, mine.ID, `{"app":"hello"}`, "l1").requireProblem(t, http.StatusConflict, proto.CodeIllegalTransition)
	assert.Contains(t, p.Detail, "apps run on active allocations")
	assert.Equal(t, before, e.index(), "a launch on an inactive allocation changes nothing")
	for _, a := range []proto.Allocation{mine, theirs} {
		for _, to := range []proto.AllocState{proto.AllocProvisioning, proto.AllocActive} {
			e.apply(proto.AllocationTransitionType, proto.AllocationTransitionRequest{At: fixtureAt.Add(time.Hour), AllocationID: a.ID, To: to})
		}
	}
	before = e.index()
	launch(RoleTenant, mine.ID, `{"app":"hello"}`, "").requireProblem(t, http.StatusBadRequest, proto.CodeInvalidArgument)
	launch(RoleTenant, mine.ID, `{"app":"compatible"}`, "l1").requireProblem(t, http.StatusBadRequest, proto.CodeInvalidArgument)
	launch(RoleTenant, mine.ID, `{"app":"hello","extra":1}`, "l1").requireProblem(t, http.StatusBadRequest, proto.CodeInvalidArgument)
	p = launch(RoleTenant, mine.ID, `{"app":"big"}`, "l1").requireProblem(t, http.StatusConflict, proto.CodeIllegalTransition)
	assert.Contains(t, p.Detail, "needs 4+ GPUs; this slice has 1")
	launch(RoleTenant, theirs.ID, `{"app":"hello"}`, "l1").requireProblem(t, http.StatusNotFound, proto.CodeNotFound)
	launch(RoleOperator, theirs.ID, `{"app":"hello"}`, "l1").requireProblem(t, http.StatusForbidden, proto.CodeForbidden)
	assert.Equal(t, before, e.index(), "refused launches change nothing")

	r := launch(RoleTenant, mine.ID, `{"app":"hello"}`, "l1")
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	var inst proto.AppInstance
	r.decode(t, &inst)
	assert.Equal(t, proto.AppInstancePending, inst.State)
	assert.Equal(t, "1", inst.Version, "the newest approved version")
	assert.Equal(t, "tenant-user", inst.Owner)
	assert.Equal(t, "/v1/allocations/"+mine.ID+"/apps/hello", r.header.Get("Location"))
	r = launch(RoleTenant, mine.ID, `{"app":"hello"}`, "l1")
	require.Equal(t, http.StatusOK, r.status, "a retry: body %s", r.body)
	var again proto.AppInstance
	r.decode(t, &again)
	assert.Equal(t, inst.ID, again.ID)
	launch(RoleTenant, mine.ID, `{"app":"hello"}`, "l2").requireProblem(t, http.StatusConflict, proto.CodeAlreadyExists)

	var l proto.List[proto.AppInstance]
	e.do(RoleTenant, http.MethodGet, "/v1/allocations/"+mine.ID+"/apps", nil).decode(t, &l)
	require.Len(t, l.Items, 1)
	e.do(RoleTenant, http.MethodGet, "/v1/allocations/"+mine.ID+"/apps?state=running", nil).decode(t, &l)
	assert.Empty(t, l.Items)
	e.do(RoleTenant, http.MethodGet, "/v1/allocations/"+mine.ID+"/apps?state=happy", nil).requireProblem(t, http.StatusBadRequest, proto.CodeInvalidArgument)
	var got proto.AppInstance
	e.do(RoleTenant, http.MethodGet, "/v1/allocations/"+mine.ID+"/apps/hello", nil).decode(t, &got)
	assert.Equal(t, inst.ID, got.ID)
	e.do(RoleTenant, http.MethodGet, "/v1/allocations/"+mine.ID+"/apps/nope", nil).requireProblem(t, http.StatusNotFound, proto.CodeNotFound)
	e.do(RoleTenant, http.MethodGet, "/v1/allocations/"+theirs.ID+"/apps", nil).requireProblem(t, http.StatusNotFound, proto.CodeNotFound)
	// Logs and the proxy need a running instance.
	pr := e.do(RoleTenant, http.MethodGet, "/v1/allocations/"+mine.ID+"/apps/hello/logs", nil).requireProblem(t, http.StatusConflict, proto.CodeIllegalTransition)
	assert.NotContains(t, pr.Detail, "(detail: )", "no empty detail: %s", pr.Detail)
	assert.True(t, strings.HasSuffix(pr.Detail, "its logs live with its running container"), pr.Detail)
	e.do(RoleTenant, http.MethodGet, "/v1/allocations/"+mine.ID+"/apps/hello/proxy/", nil).requireProblem(t, http.StatusConflict, proto.CodeIllegalTransition)
	e.do(otherTenant, http.MethodGet, "/v1/allocations/"+mine.ID+"/apps/hello/proxy/x", nil).requireProblem(t, http.StatusNotFound, proto.CodeNotFound)

	r = e.do(RoleTenant, http.MethodPost, "/v1/allocations/"+mine.ID+"/apps/hello/stop", nil)
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	r.decode(t, &got)
	assert.Contains(t, []proto.AppInstanceState{proto.AppInstanceStopped, proto.AppInstanceStopping}, got.State)
}

// TestAppBlobRoutes: an admin uploads an app's OCI layout archive; a body
// whose size or digest differs from the manifest is refused.
func TestAppBlobRoutes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	layout := []byte("an OCI image layout archive")
	sum := sha256.Sum256(layout)
	b := appBody(proto.AppOCI, proto.AppCompat{Shapes: []proto.CapacityShape{proto.ShapeGPUSlice}})
	b.Image = "gpuaas.lab/apps/hello@sha256:" + hex.EncodeToString(sum[:])
	b.ImageSize = int64(len(layout))
	e.publishApp("hello", "1", b)
	// A registry image (its manifest digest) published with its archive
	// named separately (the blob store keys it by the archive's digest:
	// agent/daemon TestAppArchiveDigest).
	reg := appBody(proto.AppJupyter, proto.AppCompat{Shapes: []proto.CapacityShape{proto.ShapeGPUSlice}})
	reg.Image = "docker.io/jupyter/base-notebook@sha256:" + strings.Repeat("8c", 32)
	reg.ImageSize = int64(len(layout))
	reg.Archive = "sha256:" + hex.EncodeToString(sum[:])
	e.publishApp("jup", "1", reg)
	var got proto.App
	e.do(RoleViewer, http.MethodGet, "/v1/apps/jup/1", nil).decode(t, &got)
	assert.Equal(t, reg.Archive, got.Archive)
	// An archive digest that is not one is refused at publish.
	bad := reg
	bad.Archive = "sha256:nope"
	pr := e.do(RoleAdmin, http.MethodPut, "/v1/apps/jup/2", bad).requireProblem(t, http.StatusBadRequest, proto.CodeInvalidArgument)
	assert.Contains(t, pr.Detail, "archive digest")
	if _, ok := e.b.(BlobBackend); !ok {
		r := e.doRaw(RoleAdmin, http.MethodPut, "/v1/apps/hello/1/blob", string(layout), "Content-Type", "application/octet-stream")
		r.requireProblem(t, http.StatusServiceUnavailable, proto.CodeUnavailable)
		return
	}
	e.doRaw(RoleAdmin, http.MethodPut, "/v1/apps/hello/1/blob", "short", "Content-Type", "application/octet-stream").
		requireProblem(t, http.StatusBadRequest, proto.CodeInvalidArgument)
	r := e.doRaw(RoleAdmin, http.MethodPut, "/v1/apps/hello/1/blob", string(layout), "Content-Type", "application/octet-stream")
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	r = e.do(RoleViewer, http.MethodGet, "/v1/apps/hello/1/blob", nil)
	require.Equal(t, http.StatusOK, r.status)
	assert.Equal(t, layout, r.body)
}
