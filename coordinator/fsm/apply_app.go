package fsm

import (
	"fmt"
	"slices"

	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/sched"
)

// App catalog commands (types 90-91): the apps of seed 004 phase 7, kept
// like the image catalog — created pending, approved or revoked by an
// admin, immutable once decided (a different manifest is a new version).

// applyApp applies an app command; ok is false for a type it does not
// know.
func (f *FSM) applyApp(t proto.MessageType, body []byte, index uint64) (resp any, ok bool) {
	switch t {
	case proto.AppUpsertType:
		return f.applyAppUpsert(body, index), true
	case proto.AppApproveType:
		return f.applyAppApprove(body, index), true
	}
	return nil, false
}

// sameManifest reports whether two entries carry the same manifest.
func sameManifest(a, b *proto.App) bool {
	ha, hb := a.HealthCheck, b.HealthCheck
	return a.Kind == b.Kind && a.Image == b.Image && a.ImageSize == b.ImageSize && a.Archive == b.Archive && a.Description == b.Description &&
		slices.Equal(a.Compat.Shapes, b.Compat.Shapes) && slices.Equal(a.Compat.ImageKinds, b.Compat.ImageKinds) &&
		a.Compat.MinGPUs == b.Compat.MinGPUs && a.Compat.MaxGPUs == b.Compat.MaxGPUs &&
		a.Compat.MinGPUMemoryMiB == b.Compat.MinGPUMemoryMiB && a.Compat.Topology == b.Compat.Topology &&
		a.Compat.NeedsFabric == b.Compat.NeedsFabric && a.Compat.NeedsIngress == b.Compat.NeedsIngress &&
		slices.Equal(a.Ports, b.Ports) && (ha == nil) == (hb == nil) && (ha == nil || *ha == *hb)
}

func (f *FSM) applyAppUpsert(body []byte, index uint64) any {
	req := decode[proto.AppUpsertRequest](proto.AppUpsertType, body, index)
	return f.write(index, func(tx *state.Txn) (any, error) {
		in := req.App
		if err := in.Validate(); err != nil {
			return nil, err
		}
		old, exists := tx.App(in.Name, in.Version)
		if exists && sameManifest(old, &in) {
			return old, nil // unchanged: no write, no index bump
		}
		if exists && old.State != proto.ImagePending {
			return nil, illegal("app_upsert: app %s is %s; its manifest is fixed (publish a new version)", old, old.State)
		}
		app := in
		app.State, app.Approvals, app.CreatedAt, app.Meta = proto.ImagePending, nil, at(req.At), proto.Meta{}
		if exists {
			app.CreatedAt, app.Meta = old.CreatedAt, old.Meta
		}
		return &app, tx.PutApp(&app)
	})
}

func (f *FSM) applyAppApprove(body []byte, index uint64) any {
	req := decode[proto.AppApproveRequest](proto.AppApproveType, body, index)
	return f.write(index, func(tx *state.Txn) (any, error) {
		if err := req.Validate(); err != nil {
			return nil, err
		}
		old, ok := tx.App(req.Name, req.Version)
		if !ok {
			return nil, notFound("app", req.Name+":"+req.Version)
		}
		if req.Image != "" && req.Image != old.Image {
			return nil, conflict("app_approve: app %s runs %s, not %s", old, old.Image, req.Image)
		}
		if old.State == req.Action {
			return old, nil // a repeat of the same decision: no write
		}
		if old.State == proto.ImageRevoked {
			return nil, illegal("app_approve: app %s was revoked; a revoked version stays revoked (publish a new version)", old)
		}
		app := *old
		app.State = req.Action
		app.Approvals = append(slices.Clone(old.Approvals), proto.ImageApproval{By: req.By, At: at(req.At), Note: req.Note, Action: req.Action})
		return &app, tx.PutApp(&app)
	})
}

// eachAppObject adds every app catalog entry (false: not the apps table).
func eachAppObject(snap *state.Snapshot, table string, add func(any)) bool {
	if table != state.TableApps {
		return false
	}
	for _, o := range snap.Apps("") {
		add(o)
	}
	return true
}

// restoreAppRecord loads one snapshot record of the apps table.
func restoreAppRecord(tx *state.Txn, rec recordIn) (err error, ok bool) {
	if rec.T != state.TableApps {
		return nil, false
	}
	return restoreInto(rec.V, tx.PutApp), true
}

// checkApps checks the app catalog: every entry valid, in a known state,
// decided entries carrying the decision that put them there.
func checkApps(snap *state.Snapshot) error {
	for _, a := range snap.Apps("") {
		if err := a.Validate(); err != nil {
			return fmt.Errorf("app %s: %w", a, err)
		}
		switch a.State {
		case proto.ImagePending:
		case proto.ImageApproved, proto.ImageRevoked:
			if n := len(a.Approvals); n == 0 || a.Approvals[n-1].Action != a.State {
				return fmt.Errorf("app %s: %s without a matching last decision in its approvals", a, a.State)
			}
		default:
			return fmt.Errorf("app %s: unknown state %q", a, a.State)
		}
	}
	return nil
}

// AppTargetOf is what the app compatibility evaluator knows of a: its
// SKU's per-GPU facts and its image's catalog kind (an unversioned image
// name takes the kind of the version created last). The API's target
// picker and a launch's apply build it here, so both judge alike.
func AppTargetOf(snap *state.Snapshot, skus []proto.SKU, a *proto.Allocation) sched.AppTarget {
	sku, _ := proto.FindSKU(skus, a.SKU)
	var kind proto.ImageKind
	if a.Image != "" {
		if name, version, err := proto.ParseImageSpec(a.Image); err == nil {
			if version != "" {
				if im, ok := snap.Image(name, version); ok {
					kind = im.Kind
				}
			} else {
				var last *proto.Image
				for _, im := range snap.Images(name) {
					if last == nil || im.CreateIndex > last.CreateIndex {
						last = im
					}
				}
				if last != nil {
					kind = last.Kind
				}
			}
		}
	}
	// Public ingress: a slice whose site declares public addressing
	// (apply_ingress.go hands out the endpoints; bare metal has none).
	ingress := false
	if a.Shape == proto.ShapeGPUSlice {
		if s, ok := snap.Site(siteOfNode(snap, a.NodeID)); ok && s.Ingress != nil {
			ingress = true
		}
	}
	return sched.TargetFor(a, sku, kind, ingress)
}

// LatestApprovedApps returns, per app name, the approved version created
// last: what the target picker offers.
func LatestApprovedApps(snap *state.Snapshot) []*proto.App {
	var out []*proto.App
	for _, a := range snap.Apps("") {
		if a.State != proto.ImageApproved {
			continue
		}
		if n := len(out); n > 0 && out[n-1].Name == a.Name {
			if a.CreateIndex > out[n-1].CreateIndex {
				out[n-1] = a
			}
			continue
		}
		out = append(out, a)
	}
	return out
}
