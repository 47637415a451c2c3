package fsm_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/fsm"
	"github.com/gpuaas/gpuaas/coordinator/fsm/fsmtest"
	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
)

func testApp(name, version string) proto.App {
	return proto.App{Name: name, Version: version, Kind: proto.AppOCI, Image: "ghcr.io/gpuaas/" + name + "@" + digestOf(name+version),
		Compat: proto.AppCompat{Shapes: []proto.CapacityShape{proto.ShapeGPUSlice}, MinGPUs: 1},
		Ports:  []proto.AppPort{{Name: "http", Port: 8080, Protocol: "http"}}, HealthCheck: &proto.AppHealthCheck{Port: 8080, Path: "/healthz"}}
}

func upsertApp(h *fsmtest.Harness, a proto.App) *proto.App {
	h.TB.Helper()
	return h.OK(proto.AppUpsertType, proto.AppUpsertRequest{At: h.At(), App: a}).(*proto.App)
}

func decideApp(h *fsmtest.Harness, name, version string, action proto.AppState) *proto.App {
	h.TB.Helper()
	return h.OK(proto.AppApproveType, proto.AppApproveRequest{At: h.At(), Name: name, Version: version, Action: action, By: "admin"}).(*proto.App)
}

// addApps writes an app catalog with every state into h.
func addApps(h *fsmtest.Harness) {
	upsertApp(h, testApp("hello-http", "1"))
	decideApp(h, "hello-http", "1", proto.ImageApproved)
	upsertApp(h, testApp("hello-http", "2"))
	upsertApp(h, testApp("old", "1"))
	decideApp(h, "old", "1", proto.ImageApproved)
	decideApp(h, "old", "1", proto.ImageRevoked)
}

func TestAppCatalog(t *testing.T) {
	t.Parallel()
	h := fsmtest.New(t)
	a := upsertApp(h, testApp("hello-http", "1"))
	assert.Equal(t, proto.ImagePending, a.State)
	assert.Equal(t, h.Index, a.CreateIndex)

	// Unchanged: no write. A pending manifest may change.
	again := upsertApp(h, testApp("hello-http", "1"))
	assert.Equal(t, a.ModifyIndex, again.ModifyIndex)
	changed := testApp("hello-http", "1")
	changed.Compat.MinGPUs = 2
	a = upsertApp(h, changed)
	assert.Equal(t, 2, a.Compat.MinGPUs)
	assert.Equal(t, h.Index, a.ModifyIndex)

	// A proposer cannot smuggle a state or approvals in.
	sneaky := testApp("sneaky", "1")
	sneaky.State = proto.ImageApproved
	sneaky.Approvals = []proto.ImageApproval{{By: "me", Action: proto.ImageApproved}}
	s := upsertApp(h, sneaky)
	assert.Equal(t, proto.ImagePending, s.State)
	assert.Empty(t, s.Approvals)

	// Approve with the wrong image: conflict; right one: approved.
	h.Refuse(proto.AppApproveType, proto.AppApproveRequest{At: h.At(), Name: "hello-http", Version: "1", Action: proto.ImageApproved, By: "admin",
		Image: "ghcr.io/gpuaas/other@" + digestOf("x")}, proto.CodeConflict)
	a = h.OK(proto.AppApproveType, proto.AppApproveRequest{At: h.At(), Name: "hello-http", Version: "1", Action: proto.ImageApproved, By: "admin", Image: changed.Image}).(*proto.App)
	assert.Equal(t, proto.ImageApproved, a.State)
	require.Len(t, a.Approvals, 1)
	assert.Equal(t, a.ModifyIndex, decideApp(h, "hello-http", "1", proto.ImageApproved).ModifyIndex, "a repeat writes nothing")

	// A decided manifest is fixed.
	e := h.Refuse(proto.AppUpsertType, proto.AppUpsertRequest{At: h.At(), App: testApp("hello-http", "1")}, proto.CodeIllegalTransition)
	assert.Contains(t, e.Detail, "new version")
	assert.Equal(t, proto.ImageApproved, upsertApp(h, changed).State, "re-publishing it unchanged is fine")

	// Revoked stays revoked.
	decideApp(h, "hello-http", "1", proto.ImageRevoked)
	h.Refuse(proto.AppApproveType, proto.AppApproveRequest{At: h.At(), Name: "hello-http", Version: "1", Action: proto.ImageApproved, By: "admin"}, proto.CodeIllegalTransition)
	h.Refuse(proto.AppApproveType, proto.AppApproveRequest{At: h.At(), Name: "nope", Version: "1", Action: proto.ImageApproved, By: "admin"}, proto.CodeNotFound)

	// Invalid manifests and commands are refused and change nothing.
	before := h.Snap().TableIndex(state.TableApps)
	bad := testApp("bad", "1")
	bad.Image = "ghcr.io/gpuaas/bad:latest"
	h.Refuse(proto.AppUpsertType, proto.AppUpsertRequest{At: h.At(), App: bad}, proto.CodeInvalidArgument)
	h.Refuse(proto.AppApproveType, proto.AppApproveRequest{At: h.At(), Name: "sneaky", Version: "1", Action: "blessed", By: "admin"}, proto.CodeInvalidArgument)
	assert.Equal(t, before, h.Snap().TableIndex(state.TableApps))
	require.NoError(t, fsm.CheckInvariants(h.Snap()))
}

func TestInvariantsCatchAppDamage(t *testing.T) {
	t.Parallel()
	for name, damage := range map[string]func(*proto.App){
		"approved without decision": func(a *proto.App) { a.State, a.Approvals = proto.ImageApproved, nil },
		"unknown state":             func(a *proto.App) { a.State = "blessed" },
		"tag instead of digest":     func(a *proto.App) { a.Image = "ghcr.io/gpuaas/x:latest" },
	} {
		t.Run(name, func(t *testing.T) {
			h := fsmtest.New(t)
			addApps(h)
			require.NoError(t, fsm.CheckInvariants(h.Snap()))
			corrupt(t, h.FSM.Store(), h.Index+1, func(tx *state.Txn) {
				a, _ := h.Snap().App("hello-http", "2")
				x := *a
				damage(&x)
				require.NoError(t, tx.PutApp(&x))
			})
			require.Error(t, fsm.CheckInvariants(h.Snap()))
		})
	}
}
