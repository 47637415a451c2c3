package fsm_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/fsm"
	"github.com/gpuaas/gpuaas/coordinator/fsm/fsmtest"
	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/proto/prototest"
)

func digestOf(s string) string {
	sum := sha256.Sum256([]byte(s))
	return "sha256:" + hex.EncodeToString(sum[:])
}

func testImage(name, version string, kind proto.ImageKind) proto.Image {
	return proto.Image{Name: name, Version: version, Kind: kind, Digest: digestOf(name + version), Size: 64 << 20}
}

func upsertImage(h *fsmtest.Harness, im proto.Image) *proto.Image {
	h.TB.Helper()
	return h.OK(proto.ImageUpsertType, proto.ImageUpsertRequest{At: h.At(), Image: im}).(*proto.Image)
}

func decideImage(h *fsmtest.Harness, name, version string, action proto.ImageState) *proto.Image {
	h.TB.Helper()
	return h.OK(proto.ImageApproveType, proto.ImageApproveRequest{At: h.At(), Name: name, Version: version, Action: action, By: "admin", Note: "checked"}).(*proto.Image)
}

// addImages writes a catalog with every state into h (for every-table tests).
func addImages(h *fsmtest.Harness) {
	upsertImage(h, testImage("ubuntu-base", "24.04.1", proto.ImageSliceBase))
	decideImage(h, "ubuntu-base", "24.04.1", proto.ImageApproved)
	upsertImage(h, testImage("ubuntu-cuda", "12.6", proto.ImageSliceCUDA))
	upsertImage(h, testImage("h200-host", "2026.04", proto.ImageMAASTgz))
	decideImage(h, "h200-host", "2026.04", proto.ImageApproved)
	decideImage(h, "h200-host", "2026.04", proto.ImageRevoked)
}

func TestImageUpsertApproveRevoke(t *testing.T) {
	t.Parallel()
	h := fsmtest.New(t)
	im := upsertImage(h, testImage("ubuntu-base", "1", proto.ImageSliceBase))
	assert.Equal(t, proto.ImagePending, im.State)
	assert.Equal(t, h.Index, im.CreateIndex)
	assert.Equal(t, fsmtest.Epoch, im.CreatedAt)

	// Same fields again: no write. A pending entry may change its digest.
	again := upsertImage(h, testImage("ubuntu-base", "1", proto.ImageSliceBase))
	assert.Equal(t, im.ModifyIndex, again.ModifyIndex)
	fixed := testImage("ubuntu-base", "1", proto.ImageSliceBase)
	fixed.Digest = digestOf("rebuilt")
	im = upsertImage(h, fixed)
	assert.Equal(t, digestOf("rebuilt"), im.Digest)
	assert.Equal(t, h.Index, im.ModifyIndex)

	// Approving with the wrong digest is a conflict; with the right one it approves.
	h.Refuse(proto.ImageApproveType, proto.ImageApproveRequest{At: h.At(), Name: "ubuntu-base", Version: "1", Action: proto.ImageApproved, By: "admin", Digest: digestOf("other")}, proto.CodeConflict)
	im = h.OK(proto.ImageApproveType, proto.ImageApproveRequest{At: h.At(), Name: "ubuntu-base", Version: "1", Action: proto.ImageApproved, By: "admin", Digest: fixed.Digest}).(*proto.Image)
	assert.Equal(t, proto.ImageApproved, im.State)
	require.Len(t, im.Approvals, 1)
	assert.Equal(t, "admin", im.Approvals[0].By)
	// The same admin approving again writes nothing; a second approver is recorded.
	same := decideImage(h, "ubuntu-base", "1", proto.ImageApproved)
	assert.Equal(t, im.ModifyIndex, same.ModifyIndex)
	second := h.OK(proto.ImageApproveType, proto.ImageApproveRequest{At: h.At(), Name: "ubuntu-base", Version: "1", Action: proto.ImageApproved, By: "sec-team"}).(*proto.Image)
	assert.Len(t, second.Approvals, 2)

	// An approved digest is immutable: another digest (or kind) is refused.
	other := testImage("ubuntu-base", "1", proto.ImageSliceBase)
	other.Digest = digestOf("sneaky")
	e := h.Refuse(proto.ImageUpsertType, proto.ImageUpsertRequest{At: h.At(), Image: other}, proto.CodeIllegalTransition)
	assert.Contains(t, e.Detail, "new version")
	kind := fixed
	kind.Kind = proto.ImageSliceCUDA
	h.Refuse(proto.ImageUpsertType, proto.ImageUpsertRequest{At: h.At(), Image: kind}, proto.CodeIllegalTransition)
	// Re-upserting the approved entry unchanged is fine and keeps it approved.
	assert.Equal(t, proto.ImageApproved, upsertImage(h, fixed).State)

	rev := decideImage(h, "ubuntu-base", "1", proto.ImageRevoked)
	assert.Equal(t, proto.ImageRevoked, rev.State)
	assert.Len(t, rev.Approvals, 3)
	h.Refuse(proto.ImageUpsertType, proto.ImageUpsertRequest{At: h.At(), Image: other}, proto.CodeIllegalTransition)
	h.Refuse(proto.ImageApproveType, proto.ImageApproveRequest{At: h.At(), Name: "ubuntu-base", Version: "9", Action: proto.ImageApproved, By: "admin"}, proto.CodeNotFound)
	require.NoError(t, fsm.CheckInvariants(h.Snap()))
}

func TestImageValidation(t *testing.T) {
	t.Parallel()
	h := fsmtest.New(t)
	for name, mut := range map[string]func(*proto.Image){
		"bad name":        func(im *proto.Image) { im.Name = "Ubuntu/../x" },
		"bad version":     func(im *proto.Image) { im.Version = "" },
		"bad kind":        func(im *proto.Image) { im.Kind = "qcow2" },
		"digest no algo":  func(im *proto.Image) { im.Digest = proto.DigestHex(im.Digest) },
		"digest short":    func(im *proto.Image) { im.Digest = "sha256:abc" },
		"digest upper":    func(im *proto.Image) { im.Digest = "sha256:" + "AB" + proto.DigestHex(im.Digest)[2:] },
		"size zero":       func(im *proto.Image) { im.Size = 0 },
		"size negative":   func(im *proto.Image) { im.Size = -1 },
		"size too large":  func(im *proto.Image) { im.Size = proto.MaxImageSize + 1 },
		"readiness check": func(im *proto.Image) { im.ReadinessCheck = "rm -rf /" },
	} {
		im := testImage("ubuntu-base", "1", proto.ImageSliceBase)
		mut(&im)
		e := h.Refuse(proto.ImageUpsertType, proto.ImageUpsertRequest{At: h.At(), Image: im}, proto.CodeInvalidArgument)
		assert.NotEmpty(t, e.Detail, name)
	}
	upsertImage(h, testImage("ubuntu-base", "1", proto.ImageSliceBase))
	for name, req := range map[string]proto.ImageApproveRequest{
		"action":   {Name: "ubuntu-base", Version: "1", Action: proto.ImagePending, By: "admin"},
		"no by":    {Name: "ubuntu-base", Version: "1", Action: proto.ImageApproved},
		"bad note": {Name: "ubuntu-base", Version: "1", Action: proto.ImageApproved, By: "admin", Note: string(make([]byte, 2000))},
		"digest":   {Name: "ubuntu-base", Version: "1", Action: proto.ImageApproved, By: "admin", Digest: "md5:00"},
	} {
		req.At = h.At()
		e := h.Refuse(proto.ImageApproveType, req, proto.CodeInvalidArgument)
		assert.NotEmpty(t, e.Detail, name)
	}
}

// TestPlaceResolvesImage: a slice's image resolves to the newest approved
// slice version and the provision task carries its reference; unknown,
// pending, revoked and wrong-kind images are refused with nothing written;
// no image keeps ImageRef nil.
func TestPlaceResolvesImage(t *testing.T) {
	t.Parallel()
	h := fsmtest.New(t)
	h.Load(fsmtest.Inventory{Regions: []string{"us-east"}, SliceNodes: 2, BaremetalNodes: 1})
	addImages(h)
	v2 := testImage("ubuntu-base", "24.04.2", proto.ImageSliceBase)
	v2.ReadinessCheck = "base-ssh"
	upsertImage(h, v2)

	payload := func(allocID string) proto.AllocationTaskPayload {
		t.Helper()
		o, ok := h.Snap().OutboxEntry(allocID + "-provision")
		require.True(t, ok)
		var p proto.AllocationTaskPayload
		require.NoError(t, json.Unmarshal(o.Task.Payload, &p))
		return p
	}
	place := func(id, image string, idx int) *proto.Error {
		req := h.SliceRequest(id, "k-"+id, n0, slot(n0, idx))
		req.Allocation.Image = image
		if r, ok := h.Apply(proto.AllocationPlaceType, req).(*proto.Error); ok {
			return r
		}
		return nil
	}

	// 24.04.2 is pending: "ubuntu-base" is 24.04.1.
	require.Nil(t, place("a1", "ubuntu-base", 0))
	ref := payload("a1").ImageRef
	require.NotNil(t, ref)
	assert.Equal(t, proto.ImageRef{Name: "ubuntu-base", Version: "24.04.1", Kind: "slice_base", Digest: digestOf("ubuntu-base24.04.1"),
		Size: 64 << 20, URL: "/v1/images/ubuntu-base/24.04.1/blob"}, *ref)

	decideImage(h, "ubuntu-base", "24.04.2", proto.ImageApproved)
	require.Nil(t, place("a2", "ubuntu-base", 1))
	assert.Equal(t, "24.04.2", payload("a2").ImageRef.Version)
	assert.Equal(t, "base-ssh", payload("a2").ImageRef.ReadinessCheck)
	require.Nil(t, place("a3", "ubuntu-base:24.04.1", 2))
	assert.Equal(t, "24.04.1", payload("a3").ImageRef.Version)

	// No image: as before, no reference.
	require.Nil(t, place("a4", "", 3))
	assert.Nil(t, payload("a4").ImageRef)

	for image, code := range map[string]proto.Code{
		"nope":                proto.CodeNotFound,
		"ubuntu-base:9":       proto.CodeNotFound,
		"ubuntu-cuda":         proto.CodeInvalidArgument, // pending only
		"ubuntu-cuda:12.6":    proto.CodeInvalidArgument,
		"h200-host:2026.04":   proto.CodeInvalidArgument, // revoked (and not a slice image)
		"Bad:Image":           proto.CodeInvalidArgument,
		"ubuntu-base:24.04:1": proto.CodeInvalidArgument,
	} {
		req := h.SliceRequest("bad", "k-bad", n1, slot(n1, 0))
		req.Allocation.Image = image
		e := h.Refuse(proto.AllocationPlaceType, req, code)
		assert.Contains(t, e.Detail, "image", image)
	}

	// Baremetal: a maas_tgz deploys; a ddgz and a slice image are refused.
	upsertImage(h, testImage("h200-host", "2026.05", proto.ImageMAASTgz))
	decideImage(h, "h200-host", "2026.05", proto.ImageApproved)
	upsertImage(h, testImage("h200-disk", "1", proto.ImageMAASDdgz))
	decideImage(h, "h200-disk", "1", proto.ImageApproved)
	bm := fsmtest.BaremetalNodeID("us-east", 0)
	for _, image := range []string{"h200-disk", "ubuntu-base"} {
		req := h.BaremetalRequest("bm", "k-bm", bm)
		req.Allocation.Image = image
		e := h.Refuse(proto.AllocationPlaceType, req, proto.CodeInvalidArgument)
		assert.Contains(t, e.Detail, image)
	}
	req := h.BaremetalRequest("bm", "k-bm", bm)
	req.Allocation.Image = "h200-host"
	h.Place(req)
	o, ok := h.Snap().OutboxEntry("bm-handoff")
	require.True(t, ok)
	var p proto.AllocationTaskPayload
	require.NoError(t, json.Unmarshal(o.Task.Payload, &p))
	require.NotNil(t, p.ImageRef)
	assert.Equal(t, "2026.05", p.ImageRef.Version)
	assert.Equal(t, "tgz", proto.ImageKind(p.ImageRef.Kind).MAASFileType())
	require.NoError(t, fsm.CheckInvariants(h.Snap()))
}

// TestCheckerSeesImageDamage: the invariant Checker checks the catalog
// whenever a command wrote it.
func TestCheckerImages(t *testing.T) {
	t.Parallel()
	h := fsmtest.New(t)
	addImages(h)
	c := fsm.NewChecker()
	for _, e := range h.Log {
		_, err := c.Apply(e.Index, e.Data)
		require.NoError(t, err)
	}
	assert.Equal(t, tables(h.Snap())["images"], tables(c.FSM().Store().Snapshot())["images"])
}

// TestImageApprovalScopes: an approval scoped to a MAAS site covers the
// nodes of that site's pools only; a global one covers every node; a
// revocation voids every earlier approval.
func TestImageApprovalScopes(t *testing.T) {
	t.Parallel()
	h := fsmtest.New(t)
	h.Load(fsmtest.Inventory{Regions: []string{"us-east", "eu-west"}, SliceNodes: 2})
	addSites(h) // site-a: us-east's pool
	site := maasSite().Name
	east, west := fsmtest.NodeID("us-east", 0), fsmtest.NodeID("eu-west", 0)
	upsertImage(h, testImage("base", "1", proto.ImageSliceBase))
	approve := func(req proto.ImageApproveRequest) *proto.Image {
		req.At, req.Name, req.Version, req.By = h.At(), "base", "1", "admin"
		if req.Action == "" {
			req.Action = proto.ImageApproved
		}
		return h.OK(proto.ImageApproveType, req).(*proto.Image)
	}
	n := 0
	place := func(node string, ok bool) {
		t.Helper()
		n++
		id := fmt.Sprintf("p%d", n)
		req := h.SliceRequest(id, "k-"+id, node, slot(node, n))
		req.Allocation.Image = "base"
		if ok {
			h.Place(req)
			return
		}
		e := h.Refuse(proto.AllocationPlaceType, req, proto.CodeInvalidArgument)
		assert.Contains(t, e.Detail, "approved")
	}

	im := approve(proto.ImageApproveRequest{Site: site, Profile: "slice", Note: "site-a only"})
	assert.Equal(t, "site "+site+" profile slice", im.Scope())
	place(east, true)
	place(west, false)
	im = approve(proto.ImageApproveRequest{Note: "everywhere"})
	assert.Equal(t, "everywhere", im.Scope())
	place(west, true)
	approve(proto.ImageApproveRequest{Action: proto.ImageRevoked})
	place(east, false)
	approve(proto.ImageApproveRequest{Site: site})
	place(east, true)
	place(west, false) // the global approval came before the revocation

	h.Refuse(proto.ImageApproveType, proto.ImageApproveRequest{At: h.At(), Name: "base", Version: "1", Action: proto.ImageApproved, By: "admin", Site: "nowhere"}, proto.CodeNotFound)
	h.Refuse(proto.ImageApproveType, proto.ImageApproveRequest{At: h.At(), Name: "base", Version: "1", Action: proto.ImageApproved, By: "admin", Site: site, Profile: "gpu-x"}, proto.CodeNotFound)
	h.Refuse(proto.ImageApproveType, proto.ImageApproveRequest{At: h.At(), Name: "base", Version: "1", Action: proto.ImageApproved, By: "admin", Profile: "slice"}, proto.CodeInvalidArgument)
	h.Refuse(proto.ImageApproveType, proto.ImageApproveRequest{At: h.At(), Name: "base", Version: "1", Action: proto.ImageRevoked, By: "admin", Site: site}, proto.CodeInvalidArgument)

	got, ok := h.Snap().Image("base", "1")
	require.True(t, ok)
	assert.True(t, fsm.ImageApprovedForNode(h.Snap(), got, east))
	assert.False(t, fsm.ImageApprovedForNode(h.Snap(), got, west))
	require.NoError(t, fsm.CheckInvariants(h.Snap()))
}

// TestBaremetalHostImageFollowsStorageLayout: a ddgz disk image deploys a
// baremetal node only when its site profile's storage layout is blank;
// with flat (seed 002's failure) it is refused, a tgz always fits.
func TestBaremetalHostImageFollowsStorageLayout(t *testing.T) {
	t.Parallel()
	h := fsmtest.New(t)
	h.Load(fsmtest.Inventory{Regions: []string{"us-east", "eu-west"}, BaremetalNodes: 1})
	addSites(h) // profile bm of site-a maps us-east's pool
	bm := prototest.SiteProfile()
	bm.Name, bm.Intent, bm.FabricMode, bm.EnablePhase2RoCE = "bm", proto.IntentBaremetal, proto.FabricIB, false
	bm.StorageLayoutProfile = "flat"
	h.OK(proto.SiteProfileUpsertType, proto.SiteProfileUpsertRequest{At: h.At(), Profile: bm})
	upsertImage(h, testImage("disk", "1", proto.ImageMAASDdgz))
	decideImage(h, "disk", "1", proto.ImageApproved)
	node := fsmtest.BaremetalNodeID("us-east", 0)

	req := h.BaremetalRequest("b1", "k-b1", node)
	req.Allocation.Image = "disk"
	e := h.Refuse(proto.AllocationPlaceType, req, proto.CodeInvalidArgument)
	assert.Contains(t, e.Detail, "flat storage layout needs a maas_tgz")

	bm.StorageLayoutProfile = "blank"
	h.OK(proto.SiteProfileUpsertType, proto.SiteProfileUpsertRequest{At: h.At(), Profile: bm})
	req = h.BaremetalRequest("b1", "k-b1", node)
	req.Allocation.Image = "disk"
	h.Place(req)
}

// TestInvariantsCatchImageDamage: the catalog checks fail on an entry
// approved without a decision, an unknown state, and a provision task
// whose image reference no longer matches the catalog.
func TestInvariantsCatchImageDamage(t *testing.T) {
	t.Parallel()
	for name, damage := range map[string]func(h *fsmtest.Harness, tx *state.Txn){
		"approved without decision": func(h *fsmtest.Harness, tx *state.Txn) {
			im, _ := h.Snap().Image("ubuntu-cuda", "12.6")
			x := *im
			x.State = proto.ImageApproved
			require.NoError(t, tx.PutImage(&x))
		},
		"unknown state": func(h *fsmtest.Harness, tx *state.Txn) {
			im, _ := h.Snap().Image("ubuntu-cuda", "12.6")
			x := *im
			x.State = "blessed"
			require.NoError(t, tx.PutImage(&x))
		},
		"digest swapped under a task": func(h *fsmtest.Harness, tx *state.Txn) {
			im, _ := h.Snap().Image("ubuntu-base", "24.04.1")
			x := *im
			x.Digest = digestOf("swapped")
			require.NoError(t, tx.PutImage(&x))
		},
	} {
		t.Run(name, func(t *testing.T) {
			h := fsmtest.New(t)
			h.Load(fsmtest.Inventory{Regions: []string{"us-east"}, SliceNodes: 1})
			addImages(h)
			req := h.SliceRequest("a1", "k-a1", n0, slot(n0, 0))
			req.Allocation.Image = "ubuntu-base"
			h.Place(req)
			require.NoError(t, fsm.CheckInvariants(h.Snap()))
			corrupt(t, h.FSM.Store(), h.Index+1, func(tx *state.Txn) { damage(h, tx) })
			require.Error(t, fsm.CheckInvariants(h.Snap()))
		})
	}
}

// TestApprovedHostImage: the host image an onboarding deploys is the
// last-created MAAS image approved for the site/profile (or globally);
// slice images, pending, revoked and other sites' approvals never count.
func TestApprovedHostImage(t *testing.T) {
	t.Parallel()
	h := fsmtest.New(t)
	h.Load(fsmtest.Inventory{Regions: []string{"us-east"}, SliceNodes: 1})
	addSites(h)
	site := maasSite().Name
	_, ok := fsm.ApprovedHostImage(h.Snap(), site, "slice")
	assert.False(t, ok, "empty catalog")
	addImages(h) // an approved slice image, a revoked host image
	_, ok = fsm.ApprovedHostImage(h.Snap(), site, "slice")
	assert.False(t, ok, "slice images and revoked host images do not count")

	upsertImage(h, testImage("h200-host", "2026.05", proto.ImageMAASTgz))
	_, ok = fsm.ApprovedHostImage(h.Snap(), site, "slice")
	assert.False(t, ok, "pending")
	h.OK(proto.ImageApproveType, proto.ImageApproveRequest{At: h.At(), Name: "h200-host", Version: "2026.05", Action: proto.ImageApproved, By: "admin", Site: site})
	_, ok = fsm.ApprovedHostImage(h.Snap(), "elsewhere", "slice")
	assert.False(t, ok, "approved for another site only")
	im, ok := fsm.ApprovedHostImage(h.Snap(), site, "bm")
	require.True(t, ok, "a site-wide approval covers every profile of the site")
	assert.Equal(t, "2026.05", im.Version)

	upsertImage(h, testImage("h200-host", "2026.06", proto.ImageMAASTgz))
	decideImage(h, "h200-host", "2026.06", proto.ImageApproved)
	im, ok = fsm.ApprovedHostImage(h.Snap(), site, "bm")
	require.True(t, ok)
	assert.Equal(t, "2026.06", im.Version, "the newest usable version wins")
	im, ok = fsm.ApprovedHostImage(h.Snap(), "elsewhere", "slice")
	require.True(t, ok, "a global approval counts everywhere")
	assert.Equal(t, "2026.06", im.Version)
}

func TestDefaultSliceImage(t *testing.T) {
	t.Parallel()
	h := fsmtest.New(t)
	h.Load(fsmtest.Inventory{Regions: []string{"us-east"}, SliceNodes: 1})
	_, ok := fsm.DefaultSliceImage(h.Snap())
	assert.False(t, ok, "empty catalog")
	upsertImage(h, testImage("ubuntu-cuda", "12.6", proto.ImageSliceCUDA))
	decideImage(h, "ubuntu-cuda", "12.6", proto.ImageApproved)
	upsertImage(h, testImage("ubuntu-base", "24.04.1", proto.ImageSliceBase))
	_, ok = fsm.DefaultSliceImage(h.Snap())
	assert.False(t, ok, "a CUDA image is never the default; a pending base is not approved")
	decideImage(h, "ubuntu-base", "24.04.1", proto.ImageApproved)
	spec, ok := fsm.DefaultSliceImage(h.Snap())
	require.True(t, ok)
	assert.Equal(t, "ubuntu-base:24.04.1", spec)
	upsertImage(h, testImage("ubuntu-base", "24.04.2", proto.ImageSliceBase))
	decideImage(h, "ubuntu-base", "24.04.2", proto.ImageApproved)
	spec, _ = fsm.DefaultSliceImage(h.Snap())
	assert.Equal(t, "ubuntu-base:24.04.2", spec, "the base approved last")
	decideImage(h, "ubuntu-base", "24.04.2", proto.ImageRevoked)
	spec, _ = fsm.DefaultSliceImage(h.Snap())
	assert.Equal(t, "ubuntu-base:24.04.1", spec, "a revoked version is skipped")
	ref, err := fsm.ResolveImage(h.Snap(), spec, proto.ShapeGPUSlice)
	require.NoError(t, err)
	assert.Equal(t, "24.04.1", ref.Version)
}
