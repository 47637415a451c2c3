package fsm

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
)

// Image catalog commands (types 32–33) and the resolution of an
// allocation's image to an approved catalog entry.

// applyImage applies an image command; ok is false for a type it does not
// know.
func (f *FSM) applyImage(t proto.MessageType, body []byte, index uint64) (resp any, ok bool) {
	switch t {
	case proto.ImageUpsertType:
		return f.applyImageUpsert(body, index), true
	case proto.ImageApproveType:
		return f.applyImageApprove(body, index), true
	}
	return nil, false
}

func (f *FSM) applyImageUpsert(body []byte, index uint64) any {
	req := decode[proto.ImageUpsertRequest](proto.ImageUpsertType, body, index)
	return f.write(index, func(tx *state.Txn) (any, error) {
		in := req.Image
		if err := in.Validate(); err != nil {
			return nil, err
		}
		old, exists := tx.Image(in.Name, in.Version)
		if !exists {
			im := &proto.Image{Name: in.Name, Version: in.Version, Kind: in.Kind, Digest: in.Digest, Size: in.Size,
				ReadinessCheck: in.ReadinessCheck, MarkerSHA256: in.MarkerSHA256, State: proto.ImagePending, CreatedAt: at(req.At)}
			return im, tx.PutImage(im)
		}
		same := old.Kind == in.Kind && old.Digest == in.Digest && old.Size == in.Size && old.ReadinessCheck == in.ReadinessCheck &&
			old.MarkerSHA256 == in.MarkerSHA256
		if same {
			return old, nil // unchanged: no write, no index bump
		}
		if old.State != proto.ImagePending {
			if old.Digest != in.Digest {
				return nil, illegal("image_upsert: image %s is %s with digest %s; its digest never changes (publish a new version for %s)", old, old.State, old.Digest, in.Digest)
			}
			return nil, illegal("image_upsert: image %s is %s; its kind, size, readiness check and marker are fixed (publish a new version)", old, old.State)
		}
		im := *old
		im.Kind, im.Digest, im.Size, im.ReadinessCheck, im.MarkerSHA256 = in.Kind, in.Digest, in.Size, in.ReadinessCheck, in.MarkerSHA256
		return &im, tx.PutImage(&im)
	})
}

func (f *FSM) applyImageApprove(body []byte, index uint64) any {
	req := decode[proto.ImageApproveRequest](proto.ImageApproveType, body, index)
	return f.write(index, func(tx *state.Txn) (any, error) {
		if err := req.Validate(); err != nil {
			return nil, err
		}
		old, ok := tx.Image(req.Name, req.Version)
		if !ok {
			return nil, notFound("image", req.Name+":"+req.Version)
		}
		if req.Digest != "" && req.Digest != old.Digest {
			return nil, conflict("image_approve: image %s has digest %s, not %s", old, old.Digest, req.Digest)
		}
		if req.Site != "" {
			site, ok := tx.Site(req.Site)
			if !ok {
				return nil, notFound("site", req.Site)
			}
			if req.Profile != "" && site.Profiles[req.Profile] == "" {
				return nil, proto.Errorf(proto.CodeNotFound, "image_approve: site %s has no profile %s", req.Site, req.Profile)
			}
		}
		if old.State == req.Action {
			if req.Action == proto.ImageRevoked {
				return old, nil // revoked stays revoked
			}
			for i := len(old.Approvals) - 1; i >= 0 && old.Approvals[i].Action == proto.ImageApproved; i-- {
				a := old.Approvals[i]
				if a.By == req.By && a.Site == req.Site && a.Profile == req.Profile {
					return old, nil // a repeat of the same decision: no write
				}
			}
		}
		im := *old
		im.State = req.Action
		im.Approvals = append(slices.Clone(old.Approvals), proto.ImageApproval{By: req.By, At: at(req.At), Note: req.Note,
			Action: req.Action, Site: req.Site, Profile: req.Profile})
		return &im, tx.PutImage(&im)
	})
}

// imageScope is where an allocation's node sits: the MAAS site whose
// profiles map the node's pool, and those profiles ("" / none when no
// site does: only a global approval counts there).
type imageScope struct {
	site     string
	profiles []string
	// layout is the storage layout of the node's baremetal profile ("":
	// MAAS's default, flat).
	layout string
}

// scopeOfNode finds the site and profiles of a node's pool.
func scopeOfNode(snap *state.Snapshot, nodeID string) *imageScope {
	sc := &imageScope{}
	n, ok := snap.Node(nodeID)
	if !ok {
		return sc
	}
	for _, site := range snap.Sites() {
		for _, name := range sortedKeys(site.Profiles) {
			if site.Profiles[name] == n.Pool {
				sc.site = site.Name
				sc.profiles = append(sc.profiles, name)
				if p, ok := snap.SiteProfile(site.Name, name); ok && p.Intent == proto.IntentBaremetal {
					sc.layout = p.StorageLayoutProfile
				}
			}
		}
		if sc.site != "" {
			return sc
		}
	}
	return sc
}

// usable reports whether im may be used in scope (nil: approved anywhere).
func (sc *imageScope) usable(im *proto.Image) bool {
	if sc == nil {
		return im.State == proto.ImageApproved
	}
	return im.ApprovedFor(sc.site, sc.profiles...)
}

func (sc *imageScope) String() string {
	if sc == nil {
		return "anywhere"
	}
	if sc.site == "" {
		return "everywhere (the node belongs to no site)"
	}
	return "site " + sc.site + " (profiles " + strings.Join(sc.profiles, ", ") + ")"
}

// resolveImage turns an allocation's image ("name" = the usable version
// created last, or "name:version") into the reference its provision task
// carries. A slice needs an approved slice image; a baremetal node a MAAS
// root-filesystem tarball (a ddgz disk image does not fit the flat
// storage path). The approval must cover scope (the node's site; nil:
// approved anywhere, the planner's early check). An empty spec resolves
// to nil.
func resolveImage(snap *state.Snapshot, spec string, shape proto.CapacityShape, scope *imageScope) (*proto.ImageRef, error) {
	if spec == "" {
		return nil, nil
	}
	name, version, err := proto.ParseImageSpec(spec)
	if err != nil {
		return nil, err
	}
	var im *proto.Image
	if version != "" {
		x, ok := snap.Image(name, version)
		if !ok {
			return nil, proto.Errorf(proto.CodeNotFound, "image %s:%s is not in the catalog", name, version)
		}
		if x.State != proto.ImageApproved {
			return nil, proto.Errorf(proto.CodeInvalidArgument, "image %s:%s is %s, not approved", name, version, x.State)
		}
		if !scope.usable(x) {
			return nil, proto.Errorf(proto.CodeInvalidArgument, "image %s:%s is approved for %s, not for %s", name, version, x.Scope(), scope)
		}
		im = x
	} else {
		versions := snap.Images(name)
		if len(versions) == 0 {
			return nil, proto.Errorf(proto.CodeNotFound, "image %s is not in the catalog", name)
		}
		approved := 0
		for _, x := range versions {
			if x.State == proto.ImageApproved {
				approved++
			}
			if scope.usable(x) && (im == nil || x.CreateIndex > im.CreateIndex) {
				im = x
			}
		}
		switch {
		case im == nil && approved == 0:
			return nil, proto.Errorf(proto.CodeInvalidArgument, "image %s has no approved version (%d known)", name, len(versions))
		case im == nil:
			return nil, proto.Errorf(proto.CodeInvalidArgument, "image %s has %d approved version(s), none approved for %s", name, approved, scope)
		}
	}
	switch {
	case shape == proto.ShapeGPUSlice && !im.Kind.Slice():
		return nil, proto.Errorf(proto.CodeInvalidArgument, "image %s is a %s image; a gpu_slice needs slice_base or slice_cuda", im, im.Kind)
	case shape == proto.ShapeBaremetal && scope == nil && im.Kind.MAASFileType() == "":
		return nil, proto.Errorf(proto.CodeInvalidArgument, "image %s is a %s image; a baremetal node needs a MAAS host image (maas_tgz)", im, im.Kind)
	case shape == proto.ShapeBaremetal && scope != nil:
		// The node's profile decides whether a ddgz disk image fits.
		if err := im.CheckHostImage(scope.layout); err != nil {
			return nil, err
		}
	}
	return im.Ref(), nil
}

// ResolveImage is the leader planner's early check: it refuses an
// unknown, unapproved or unfitting image before any placement is planned.
// (Apply re-checks against the chosen node's site.)
func ResolveImage(snap *state.Snapshot, spec string, shape proto.CapacityShape) (*proto.ImageRef, error) {
	return resolveImage(snap, spec, shape, nil)
}

// DefaultSliceImage is the image a slice request that names none gets:
// the slice_base image approved last (by create index) among those
// approved anywhere, as "name:version", so the allocation records exactly
// what it runs. ok is false when no slice_base image is approved: the
// request keeps no image, which only a simulated slice runtime accepts
// (the real one refuses it at the image stage).
func DefaultSliceImage(snap *state.Snapshot) (string, bool) {
	var best *proto.Image
	for _, im := range snap.Images("") {
		if im.Kind != proto.ImageSliceBase || im.State != proto.ImageApproved {
			continue
		}
		if best == nil || im.CreateIndex > best.CreateIndex {
			best = im
		}
	}
	if best == nil {
		return "", false
	}
	return best.Name + ":" + best.Version, true
}

// ImageApprovedForNode reports whether im may be used on node (its
// site's approvals, or a global one): the MAAS predeploy check "selected
// image version exists and is approved for the site".
func ImageApprovedForNode(snap *state.Snapshot, im *proto.Image, nodeID string) bool {
	return scopeOfNode(snap, nodeID).usable(im)
}

// eachImageObject adds every catalog entry (false: not the images table).
func eachImageObject(snap *state.Snapshot, table string, add func(any)) bool {
	if table != state.TableImages {
		return false
	}
	for _, o := range snap.Images("") {
		add(o)
	}
	return true
}

// restoreImageRecord loads one snapshot record of the images table.
func restoreImageRecord(tx *state.Txn, rec recordIn) (err error, ok bool) {
	if rec.T != state.TableImages {
		return nil, false
	}
	return restoreInto(rec.V, tx.PutImage), true
}

// checkImages checks the catalog: every entry valid, in a known state,
// approved and revoked entries carrying the decision that put them there.
func checkImages(snap *state.Snapshot) error {
	for _, im := range snap.Images("") {
		if err := im.Validate(); err != nil {
			return fmt.Errorf("image %s: %w", im, err)
		}
		switch im.State {
		case proto.ImagePending:
		case proto.ImageApproved, proto.ImageRevoked:
			if n := len(im.Approvals); n == 0 || im.Approvals[n-1].Action != im.State {
				return fmt.Errorf("image %s: %s without a matching last decision in its approvals", im, im.State)
			}
		default:
			return fmt.Errorf("image %s: unknown state %q", im, im.State)
		}
	}
	return nil
}

// checkImageRefs checks that every image reference a provision task (or
// its outbox entry) carries names a catalog entry with that digest and
// size: approved entries are immutable and never deleted, so a reference
// can never go stale.
func checkImageRefs(snap *state.Snapshot) error {
	check := func(t *proto.Task) error {
		if t.Type != proto.TaskSliceProvision && t.Type != proto.TaskBaremetalHandoff || len(t.Payload) == 0 {
			return nil
		}
		var p proto.AllocationTaskPayload
		if json.Unmarshal(t.Payload, &p) != nil || p.ImageRef == nil {
			return nil // a proposer-given payload of another shape
		}
		r := p.ImageRef
		im, ok := snap.Image(r.Name, r.Version)
		switch {
		case !ok:
			return fmt.Errorf("task %s: image %s:%s is not in the catalog", t.ID, r.Name, r.Version)
		case im.Digest != r.Digest || im.Size != r.Size:
			return fmt.Errorf("task %s: image %s carries digest %s (%d bytes), the catalog has %s (%d bytes)", t.ID, im, r.Digest, r.Size, im.Digest, im.Size)
		}
		return nil
	}
	for _, t := range snap.Tasks("", "", "", 0) {
		if err := check(t); err != nil {
			return err
		}
	}
	for _, o := range snap.Outbox() {
		if err := check(&o.Task); err != nil {
			return err
		}
	}
	return nil
}

// ApprovedHostImage returns the MAAS host image (maas_tgz or maas_ddgz)
// created last among those approved for site/profile (a global approval
// counts): what an onboarding of that profile deploys. ok is false when
// none is approved there — the stock distro series is deployed then.
func ApprovedHostImage(snap *state.Snapshot, site, profile string) (*proto.Image, bool) {
	sc := &imageScope{site: site, profiles: []string{profile}}
	var best *proto.Image
	for _, im := range snap.Images("") {
		if im.Kind.MAASFileType() == "" || !sc.usable(im) {
			continue
		}
		if best == nil || im.CreateIndex > best.CreateIndex {
			best = im
		}
	}
	return best, best != nil
}
