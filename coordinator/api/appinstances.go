package api

// App instances (proto/appinstance.go): launch, list, show, stop and the
// logs of the apps running on an allocation, and the app blob routes (an
// app's OCI layout archive in the blob store, which the agents fetch by
// digest). The launch handler checks what it can for a clear answer, but
// the launch command's apply (fsm.applyAppLaunch) is the authority: it
// re-judges compatibility, state and ownership on the ledger it writes.

import (
	"context"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/coordinator/blobs"
	"github.com/gpuaas/gpuaas/coordinator/fsm"
	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
)

func (a *API) appInstanceRoutes() []Route {
	return []Route{
		{http.MethodPost, "/v1/allocations/{id}/apps", RoleOperator, true, a.launchApp},
		{http.MethodGet, "/v1/allocations/{id}/apps", RoleViewer, false, a.listAppInstances},
		{http.MethodGet, "/v1/allocations/{id}/apps/{app}", RoleViewer, false, a.getAppInstance},
		{http.MethodGet, "/v1/allocations/{id}/apps/{app}/logs", RoleViewer, false, a.appLogs},
		{http.MethodPost, "/v1/allocations/{id}/apps/{app}/stop", RoleOperator, true, a.stopApp},
		{http.MethodPut, "/v1/apps/{name}/{version}/blob", RoleAdmin, true, a.putAppBlob},
		{http.MethodGet, "/v1/apps/{name}/{version}/blob", RoleViewer, false, a.getAppBlob},
	}
}

func (c *call) appName() (string, error) {
	name, err := c.pathID("app", "app name")
	if err != nil {
		return "", err
	}
	return name, proto.ValidateAppInstanceName(name)
}

// ownsOrAdmin: the caller owns the allocation or is an admin.
func (c *call) ownsOrAdmin(al *proto.Allocation) error {
	if c.p.Role >= RoleAdmin || al.Owner == c.p.Name {
		return nil
	}
	return proto.Errorf(proto.CodeForbidden, "%s does not own allocation %s: only its owner (or an admin) runs apps on it", c.p.Name, al.ID)
}

// launchApp is POST /v1/allocations/{id}/apps.
func (a *API) launchApp(c *call) error {
	if _, err := c.query(); err != nil {
		return err
	}
	key := c.r.Header.Get(proto.IdempotencyKeyHeader)
	if key == "" {
		return proto.Errorf(proto.CodeInvalidArgument, "the %s header is required: retries with the same key return the same instance", proto.IdempotencyKeyHeader)
	}
	if err := proto.ValidateIdempotencyKey(key); err != nil {
		return err
	}
	id, err := c.pathID("id", "allocation id")
	if err != nil {
		return err
	}
	var body proto.AppLaunchBody
	if err := c.decode(&body, false); err != nil {
		return err
	}
	if err := proto.ValidateID("app name", body.App); err != nil {
		return err
	}
	if err := proto.ValidateAppInstanceName(body.App); err != nil {
		return err
	}
	snap := a.b.Store().Snapshot()
	al, ok := snap.Allocation(id)
	if !ok {
		return errNoAllocation(id)
	}
	if err := c.ownsOrAdmin(al); err != nil {
		return err
	}
	if body.Version == "" {
		for _, x := range fsm.LatestApprovedApps(snap) {
			if x.Name == body.App {
				body.Version = x.Version
			}
		}
		if body.Version == "" {
			if len(snap.Apps(body.App)) == 0 {
				return proto.Errorf(proto.CodeNotFound, "app %s is not in the catalog", body.App)
			}
			return proto.Errorf(proto.CodeInvalidArgument, "app %s has no approved version", body.App)
		}
	}
	req := proto.AppLaunchRequest{At: now(), AllocationID: id, App: body.App, Version: body.Version, Caller: c.p.Name,
		Admin: c.p.Role >= RoleAdmin, IdempotencyKey: key}
	if err := req.Validate(); err != nil {
		return err
	}
	if old, ok := snap.AppInstance(id, body.App); ok && old.IdempotencyKey == key && old.Version == body.Version {
		c.index = old.ModifyIndex
		c.w.Header().Set("Location", "/v1/allocations/"+id+"/apps/"+old.App)
		return c.reply(http.StatusOK, old) // a retry: nothing proposed
	}
	resp, idx, err := a.b.Apply(c.r.Context(), proto.AppLaunchType, req)
	if err != nil {
		return err
	}
	if e, ok := resp.(*proto.Error); ok {
		return e
	}
	c.index = idx
	inst, ok := resp.(*proto.AppInstance)
	if !ok {
		return fmt.Errorf("app_launch answered %T", resp)
	}
	c.w.Header().Set("Location", "/v1/allocations/"+id+"/apps/"+inst.App)
	return c.reply(http.StatusCreated, inst)
}

// stopApp is POST /v1/allocations/{id}/apps/{app}/stop.
func (a *API) stopApp(c *call) error {
	if _, err := c.query(); err != nil {
		return err
	}
	id, err := c.pathID("id", "allocation id")
	if err != nil {
		return err
	}
	app, err := c.appName()
	if err != nil {
		return err
	}
	var empty struct{}
	if err := c.decode(&empty, true); err != nil {
		return err
	}
	resp, idx, err := a.b.Apply(c.r.Context(), proto.AppStopType, proto.AppStopRequest{At: now(), AllocationID: id, App: app,
		Caller: c.p.Name, Admin: c.p.Role >= RoleAdmin})
	if err != nil {
		return err
	}
	if e, ok := resp.(*proto.Error); ok {
		return e
	}
	c.index = idx
	return c.reply(http.StatusOK, resp)
}

// listAppInstances is GET /v1/allocations/{id}/apps (paged by app name).
func (a *API) listAppInstances(c *call) error {
	o := readOpts{tables: []string{state.TableAppInstances, state.TableAllocations}, block: true, paging: true, filters: []string{"state"}}
	return c.read(o, func(s *state.Snapshot, q url.Values, p page) (any, error) {
		al, err := c.allocation(s)
		if err != nil {
			return nil, err
		}
		st := proto.AppInstanceState(q.Get("state"))
		if st != "" && !st.Valid() {
			return nil, proto.Errorf(proto.CodeInvalidArgument, "state=%q is not one of %v", st, proto.AppInstanceStates)
		}
		var items []*proto.AppInstance
		for _, inst := range s.AppInstances(al.ID) {
			if st == "" || inst.State == st {
				items = append(items, inst)
			}
		}
		items, next := cut(items, func(x *proto.AppInstance) string { return x.App }, p)
		return list(items, next, c.index), nil
	})
}

// getAppInstance is GET /v1/allocations/{id}/apps/{app}.
func (a *API) getAppInstance(c *call) error {
	o := readOpts{tables: []string{state.TableAppInstances, state.TableAllocations}, block: true}
	return c.read(o, func(s *state.Snapshot, _ url.Values, _ page) (any, error) {
		al, err := c.allocation(s)
		if err != nil {
			return nil, err
		}
		app, err := c.appName()
		if err != nil {
			return nil, err
		}
		return instanceOf(s, al.ID, app)
	})
}

func instanceOf(s *state.Snapshot, alloc, app string) (*proto.AppInstance, error) {
	inst, ok := s.AppInstance(alloc, app)
	if !ok {
		return nil, proto.Errorf(proto.CodeNotFound, "allocation %s has no instance of app %s (launch it: POST /v1/allocations/%s/apps)", alloc, app, alloc)
	}
	return inst, nil
}

// appLogs is GET /v1/allocations/{id}/apps/{app}/logs: the end of the
// instance's output, fetched from its agent over the workload proxy's
// channel.
func (a *API) appLogs(c *call) error {
	q, err := c.query("max_bytes")
	if err != nil {
		return err
	}
	maxBytes := 64 << 10
	if v := q.Get("max_bytes"); v != "" {
		if maxBytes, err = strconv.Atoi(v); err != nil || maxBytes < 1 || maxBytes > proto.MaxAppLogBytes {
			return proto.Errorf(proto.CodeInvalidArgument, "max_bytes %q is not an integer in 1..%d", v, proto.MaxAppLogBytes)
		}
	}
	snap := a.b.Store().Snapshot()
	al, err := c.allocation(snap)
	if err != nil {
		return err
	}
	app, err := c.appName()
	if err != nil {
		return err
	}
	inst, err := instanceOf(snap, al.ID, app)
	if err != nil {
		return err
	}
	if inst.State.Terminal() || inst.State == proto.AppInstancePending {
		detail := ""
		if d := strings.TrimSpace(inst.Detail); d != "" {
			detail = " (detail: " + d + ")"
		}
		return proto.Errorf(proto.CodeIllegalTransition, "app %s on %s is %s: its logs live with its running container%s", app, al.ID, inst.State, detail)
	}
	if !a.appProxy.has(inst.NodeID) && !a.b.IsLeader() && c.r.Header.Get(proto.ForwardedHeader) == "" {
		a.forwardStream(c)
		return nil
	}
	b, truncated, err := a.appProxy.logs(c.r.Context(), inst, maxBytes)
	if err != nil {
		return err
	}
	return c.reply(http.StatusOK, proto.AppLogs{AllocationID: al.ID, App: app, InstanceID: inst.ID, Logs: string(b), Truncated: truncated})
}

// putAppBlob is PUT /v1/apps/{name}/{version}/blob: the app's OCI image
// layout archive, checked against the manifest's digest and image_size.
func (a *API) putAppBlob(c *call) error {
	if _, err := c.query(); err != nil {
		return err
	}
	name, version, err := c.appKey()
	if err != nil {
		return err
	}
	app, ok := a.b.Store().Snapshot().App(name, version)
	if !ok && !a.b.IsLeader() && c.r.Header.Get(proto.ForwardedHeader) == "" {
		a.forwardStream(c)
		return nil
	}
	if !ok {
		return proto.Errorf(proto.CodeNotFound, "app %s:%s is not in the catalog; publish it first with PUT /v1/apps/%s/%s", name, version, name, version)
	}
	ref, err := proto.AppImageRef(app)
	if err != nil {
		return err
	}
	if app.State == proto.ImageRevoked {
		return proto.Errorf(proto.CodeIllegalTransition, "app %s is revoked; publish a new version", app)
	}
	if ct := c.r.Header.Get("Content-Type"); ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/octet-stream" {
			return proto.Errorf(proto.CodeUnsupportedMediaType, "Content-Type %q is not application/octet-stream", truncateHeader(ct))
		}
	}
	if cl := c.r.ContentLength; cl >= 0 && cl != ref.Size {
		return proto.Errorf(proto.CodeInvalidArgument, "body is %d bytes; app %s's image_size is %d (digest %s)", cl, app, ref.Size, ref.Digest)
	}
	store, err := a.blobStore()
	if err != nil {
		return err
	}
	n, err := store.Put(c.r.Body, ref.Digest, ref.Size)
	if err != nil {
		if blobs.IsMismatch(err) {
			return proto.Errorf(proto.CodeInvalidArgument, "app %s: %v", app, err)
		}
		return fmt.Errorf("store blob of app %s: %w", app, err)
	}
	a.log.Info("app blob stored", "app", app.String(), "digest", ref.Digest, "bytes", n, "by", c.p.Name)
	return c.reply(http.StatusOK, app)
}

// getAppBlob is GET /v1/apps/{name}/{version}/blob (operators and the
// agents' node credentials); a replica lacking the blob fetches it from
// its peers first.
func (a *API) getAppBlob(c *call) error {
	if _, err := c.query(); err != nil {
		return err
	}
	name, version, err := c.appKey()
	if err != nil {
		return err
	}
	app, err := appOf(a.b.Store().Snapshot(), name, version)
	if err != nil {
		return err
	}
	ref, err := proto.AppImageRef(app)
	if err != nil {
		return err
	}
	store, err := a.blobStore()
	if err != nil {
		return err
	}
	if !store.Has(ref.Digest, ref.Size) {
		if c.r.Header.Get(blobPeerHeader) != "" {
			return proto.Errorf(proto.CodeNotFound, "app %s: blob %s is not stored on this coordinator", app, ref.Digest)
		}
		im := &proto.Image{Name: ref.Name, Version: ref.Version, Digest: ref.Digest, Size: ref.Size}
		if err := a.fetchBlobFromPeers(c, im, ref.URL, store); err != nil {
			return err
		}
	}
	f, err := store.Open(ref.Digest)
	if err != nil {
		return err
	}
	defer f.Close()
	h := c.w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("ETag", `"`+ref.Digest+`"`)
	h.Set("Cache-Control", "private, max-age=31536000, immutable")
	http.ServeContent(c.w, c.r, "", app.CreatedAt, f)
	return nil
}

// expireAppInstances proposes app_instance_expire for the instances whose
// deadline passed (the leader's sweep); it returns how many it named.
func (a *API) expireAppInstances(ctx context.Context) (int, error) {
	st := a.b.Store()
	if st == nil {
		return 0, nil
	}
	exp := fsm.ExpiredAppInstances(st.Snapshot(), time.Now().UTC())
	if len(exp) == 0 {
		return 0, nil
	}
	resp, _, err := a.b.Apply(ctx, proto.AppInstanceExpireType, proto.AppInstanceExpireRequest{At: now(), Instances: exp})
	if err == nil {
		if e, ok := resp.(*proto.Error); ok {
			err = e
		}
	}
	return len(exp), err
}

var _ = io.EOF
