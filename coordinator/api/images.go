package api

// The image catalog routes and the blob routes. Catalog entries are
// ledger objects (image_upsert / image_approve). Blobs live in each
// replica's content-addressed store (coordinator/blobs): an upload is
// streamed and verified against the entry, a download is served with
// Range support (http.ServeContent) and a replica lacking the blob
// fetches it from a peer first.

import (
	"context"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/coordinator/audit"
	"github.com/gpuaas/gpuaas/coordinator/blobs"
	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
)

// BlobBackend is a Backend with an image blob store (*server.Server is
// one). Blob routes answer 503 on a backend without it.
type BlobBackend interface {
	Backend
	Blobs() *blobs.Store
}

// blobPeerHeader marks a blob download one replica makes from another:
// the peer answers from its own store only (no further peer fetch).
const blobPeerHeader = "X-Gpuaas-Blob-Peer"

func (a *API) imageRoutes() []Route {
	return []Route{
		{http.MethodGet, "/v1/images", RoleViewer, false, a.listImages},
		{http.MethodPut, "/v1/images/{name}/{version}", RoleAdmin, true, a.putImage},
		{http.MethodGet, "/v1/images/{name}/{version}", RoleViewer, false, a.getImage},
		{http.MethodPost, "/v1/images/{name}/{version}/approve", RoleAdmin, true, a.decideImage(proto.ImageApproved)},
		{http.MethodPost, "/v1/images/{name}/{version}/revoke", RoleAdmin, true, a.decideImage(proto.ImageRevoked)},
		{http.MethodPut, "/v1/images/{name}/{version}/blob", RoleAdmin, true, a.putImageBlob},
		{http.MethodGet, "/v1/images/{name}/{version}/blob", RoleViewer, false, a.getImageBlob},
	}
}

// isBlobRoute: blob routes stream their bodies and are not wrapped like
// JSON routes.
func isBlobRoute(rt Route) bool { return strings.HasSuffix(rt.Pattern, "/blob") }

func (c *call) imageKey() (string, string, error) {
	name, err := c.pathID("name", "image name")
	if err != nil {
		return "", "", err
	}
	version, err := c.pathID("version", "image version")
	if err != nil {
		return "", "", err
	}
	return name, version, nil
}

func imageOf(s *state.Snapshot, name, version string) (*proto.Image, error) {
	im, ok := s.Image(name, version)
	if !ok {
		return nil, proto.Errorf(proto.CodeNotFound, "image %s:%s is not in the catalog", name, version)
	}
	return im, nil
}

func (a *API) listImages(c *call) error {
	o := readOpts{tables: []string{state.TableImages}, block: true, paging: true, filters: []string{"name", "state"}}
	return c.read(o, func(s *state.Snapshot, q url.Values, p page) (any, error) {
		name, err := idParam(q, "name")
		if err != nil {
			return nil, err
		}
		st := proto.ImageState(q.Get("state"))
		if st != "" && st != proto.ImagePending && st != proto.ImageApproved && st != proto.ImageRevoked {
			return nil, proto.Errorf(proto.CodeInvalidArgument, "state=%q is not one of %v", st, proto.ImageStates)
		}
		var items []*proto.Image
		for _, im := range s.Images(name) {
			if st == "" || im.State == st {
				items = append(items, im)
			}
		}
		// Paged by name:version (the cursor), in that order.
		slices.SortFunc(items, func(x, y *proto.Image) int { return strings.Compare(imageCursor(x), imageCursor(y)) })
		items, next := cut(items, imageCursor, p)
		return list(items, next, c.index), nil
	})
}

// imageCursor is an image's key in the paged catalog list.
func imageCursor(im *proto.Image) string { return im.Name + ":" + im.Version }

func (a *API) getImage(c *call) error {
	o := readOpts{tables: []string{state.TableImages}, block: true}
	return c.read(o, func(s *state.Snapshot, _ url.Values, _ page) (any, error) {
		name, version, err := c.imageKey()
		if err != nil {
			return nil, err
		}
		return imageOf(s, name, version)
	})
}

func (a *API) replyImage(c *call, name, version string) error {
	im, err := imageOf(a.b.Store().Snapshot(), name, version)
	if err != nil {
		return err
	}
	if c.index == 0 {
		c.index = im.ModifyIndex
	}
	return c.reply(http.StatusOK, im)
}

func (a *API) putImage(c *call) error {
	if _, err := c.query(); err != nil {
		return err
	}
	name, version, err := c.imageKey()
	if err != nil {
		return err
	}
	var body proto.ImageBody
	if err := c.decode(&body, false); err != nil {
		return err
	}
	im := proto.Image{Name: name, Version: version, Kind: body.Kind, Digest: body.Digest, Size: body.Size, ReadinessCheck: body.ReadinessCheck, MarkerSHA256: body.MarkerSHA256}
	if err := im.Validate(); err != nil {
		return err
	}
	if err := c.apply(proto.ImageUpsertType, proto.ImageUpsertRequest{At: now(), Image: im}); err != nil {
		return err
	}
	return a.replyImage(c, name, version)
}

func (a *API) decideImage(action proto.ImageState) func(*call) error {
	return func(c *call) error {
		if _, err := c.query(); err != nil {
			return err
		}
		name, version, err := c.imageKey()
		if err != nil {
			return err
		}
		var body proto.ImageApproveBody
		if err := c.decode(&body, true); err != nil {
			return err
		}
		req := proto.ImageApproveRequest{At: now(), Name: name, Version: version, Action: action, By: c.p.Name, Note: body.Note,
			Digest: body.Digest, Site: body.Site, Profile: body.Profile}
		if err := req.Validate(); err != nil {
			return err
		}
		if err := c.apply(proto.ImageApproveType, req); err != nil {
			return err
		}
		return a.replyImage(c, name, version)
	}
}

func (a *API) blobStore() (*blobs.Store, error) {
	bb, ok := a.b.(BlobBackend)
	if !ok || bb.Blobs() == nil {
		return nil, proto.Errorf(proto.CodeUnavailable, "this coordinator has no image blob store")
	}
	return bb.Blobs(), nil
}

// blobHandler authenticates a blob route (an operator token with the
// route's role or, for downloads, a node credential) and runs it without
// buffering the body.
func (a *API) blobHandler(rt Route) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tok, ok := bearer(r)
		if !ok {
			w.Header().Set("WWW-Authenticate", `Bearer realm="gpuaas"`)
			writeProblem(w, r, proto.Errorf(proto.CodeUnauthenticated, "an Authorization: Bearer <token> header is required"))
			return
		}
		p, ok := a.authenticate(tok)
		if !ok && rt.Method == http.MethodGet {
			if ab, isAgent := a.b.(AgentBackend); isAgent && ab.Enrollment() != nil {
				tab := ab.Enrollment()
				if id, known := tab.Authenticate(tok); known {
					// A node credential downloads like every other agent
					// route: with the same node's client certificate.
					if err := a.checkAgentCert(r, tab, rt, id); err != nil {
						writeProblem(w, r, err)
						return
					}
					p, ok = Principal{Name: "node:" + id, Role: RoleViewer}, true
				}
			}
		}
		if !ok && rt.Method == http.MethodGet && !a.b.IsLeader() && r.Header.Get(proto.ForwardedHeader) == "" && r.Header.Get(blobPeerHeader) == "" {
			// A node credential issued a moment ago may not have reached
			// this replica yet: the leader, which issued it, decides.
			a.forwardStream(&call{a: a, w: w, r: r, rt: rt})
			return
		}
		if !ok {
			w.Header().Set("WWW-Authenticate", `Bearer realm="gpuaas", error="invalid_token"`)
			writeProblem(w, r, proto.Errorf(proto.CodeUnauthenticated, "the bearer token is not known"))
			return
		}
		if !a.authorize(w, r, rt, p) {
			return
		}
		if r.Method == http.MethodPut {
			// An authorised upload streams for as long as it takes.
			a.clearBodyDeadline(w)
		}
		c := &call{a: a, w: w, r: r, rt: rt, p: p}
		if err := rt.handle(c); err != nil {
			if proto.CodeOf(err) == proto.CodeInternal {
				a.log.Error("blob request failed", "request_id", w.Header().Get(proto.RequestIDHeader), "method", r.Method, "path", r.URL.Path, "err", err)
			}
			writeProblem(w, r, err)
		}
	})
}

func (a *API) putImageBlob(c *call) error {
	if _, err := c.query(); err != nil {
		return err
	}
	name, version, err := c.imageKey()
	if err != nil {
		return err
	}
	im, ok := a.b.Store().Snapshot().Image(name, version)
	if !ok && !a.b.IsLeader() && c.r.Header.Get(proto.ForwardedHeader) == "" {
		// The entry may have been created a moment ago on the leader.
		a.forwardStream(c)
		return nil
	}
	if !ok && a.b.IsLeader() {
		// A leader elected a moment ago may not have applied the
		// entry yet: it answers from a ledger that holds its log.
		if ready, why := a.awaitLeaderReady(c.r.Context()); !ready {
			return proto.Errorf(proto.CodeUnavailable, "this replica has just become the leader and has not applied its log yet (%s); the upload was not stored; retry shortly", why)
		}
		im, ok = a.b.Store().Snapshot().Image(name, version)
	}
	if !ok {
		return proto.Errorf(proto.CodeNotFound, "image %s:%s is not in the catalog; create it first with PUT /v1/images/%s/%s", name, version, name, version)
	}
	if im.State == proto.ImageRevoked {
		return proto.Errorf(proto.CodeIllegalTransition, "image %s is revoked; publish a new version", im)
	}
	if ct := c.r.Header.Get("Content-Type"); ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/octet-stream" {
			return proto.Errorf(proto.CodeUnsupportedMediaType, "Content-Type %q is not application/octet-stream", truncateHeader(ct))
		}
	}
	if cl := c.r.ContentLength; cl >= 0 && cl != im.Size {
		return proto.Errorf(proto.CodeInvalidArgument, "body is %d bytes; image %s has %d (digest %s)", cl, im, im.Size, im.Digest)
	}
	store, err := a.blobStore()
	if err != nil {
		return err
	}
	start := time.Now()
	n, err := store.Put(c.r.Body, im.Digest, im.Size)
	if err != nil {
		if blobs.IsMismatch(err) {
			return proto.Errorf(proto.CodeInvalidArgument, "image %s: %v", im, err)
		}
		return fmt.Errorf("store blob of image %s: %w", im, err)
	}
	a.log.Info("image blob stored", "image", im.String(), "digest", im.Digest, "bytes", n, "duration_ms", time.Since(start).Milliseconds(), "by", c.p.Name)
	go a.replicateBlob(im, c.r.Header.Get("Authorization"))
	return a.replyImage(c, name, version)
}

func (a *API) getImageBlob(c *call) error {
	if _, err := c.query(); err != nil {
		return err
	}
	name, version, err := c.imageKey()
	if err != nil {
		return err
	}
	im, err := imageOf(a.b.Store().Snapshot(), name, version)
	if err != nil {
		return err
	}
	if im.State == proto.ImageRevoked {
		return proto.Errorf(proto.CodeIllegalTransition, "image %s is revoked; its blob is no longer served", im)
	}
	store, err := a.blobStore()
	if err != nil {
		return err
	}
	if !store.Has(im.Digest, im.Size) {
		if c.r.Header.Get(blobPeerHeader) != "" {
			return proto.Errorf(proto.CodeNotFound, "image %s: blob %s is not stored on this coordinator", im, im.Digest)
		}
		if err := a.fetchFromPeers(c, im, store); err != nil {
			return err
		}
	}
	f, err := store.Open(im.Digest)
	if err != nil {
		return err
	}
	defer f.Close()
	h := c.w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("ETag", `"`+im.Digest+`"`)
	h.Set("Cache-Control", "private, max-age=31536000, immutable")
	http.ServeContent(c.w, c.r, "", im.CreatedAt, f)
	return nil
}

// fetchFromPeers downloads a blob this replica lacks from the other
// replicas (with the caller's credential), verifying it before storing.
func (a *API) fetchFromPeers(c *call, im *proto.Image, store *blobs.Store) error {
	return a.fetchBlobFromPeers(c, im, proto.BlobPath(im.Name, im.Version), store)
}

// fetchBlobFromPeers downloads the blob of im (its digest and size) that
// the peers serve at path.
func (a *API) fetchBlobFromPeers(c *call, im *proto.Image, path string, store *blobs.Store) error {
	peers, err := a.b.Peers()
	if err != nil {
		return fmt.Errorf("list peers for blob %s: %w", im.Digest, err)
	}
	self := ""
	if n, ok := a.b.(interface{ NodeID() string }); ok {
		self = n.NodeID()
	}
	auth := c.r.Header.Get("Authorization")
	client := &http.Client{Transport: a.proxy.transport}
	var reasons []string
	err = store.Fetch(c.r.Context(), im.Digest, im.Size, func(ctx context.Context) (io.ReadCloser, error) {
		for _, p := range peers {
			if p.ID == self || p.HTTPAddr == "" {
				continue
			}
			base, err := a.proxy.leaderURL(p.HTTPAddr)
			if err != nil {
				reasons = append(reasons, p.ID+": "+err.Error())
				continue
			}
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, base.String()+path, nil)
			if err != nil {
				return nil, err
			}
			req.Header.Set("Authorization", auth)
			req.Header.Set(blobPeerHeader, "1")
			if v := nodeCertHeader(c.r); v != "" {
				req.Header.Set(proto.NodeCertHeader, v)
			}
			req.Header.Set(proto.RequestIDHeader, c.w.Header().Get(proto.RequestIDHeader))
			resp, err := client.Do(req)
			if err != nil {
				reasons = append(reasons, p.ID+": "+err.Error())
				continue
			}
			if resp.StatusCode != http.StatusOK {
				b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
				resp.Body.Close()
				reasons = append(reasons, fmt.Sprintf("%s: HTTP %d %s", p.ID, resp.StatusCode, strings.TrimSpace(string(b))))
				continue
			}
			a.log.Info("fetching image blob from peer", "image", im.String(), "digest", im.Digest, "peer", p.ID)
			return resp.Body, nil
		}
		return nil, proto.Errorf(proto.CodeNotFound, "image %s: blob %s is on no coordinator (upload it with PUT %s): %s",
			im, im.Digest, path, strings.Join(reasons, "; "))
	})
	if err != nil && blobs.IsMismatch(err) {
		return proto.Errorf(proto.CodeUnavailable, "image %s: a peer sent a blob that failed verification: %v", im, err)
	}
	return err
}

// replicateBlob asks every other replica for the blob just stored (a HEAD
// of the blob route: a replica lacking it fetches it from its peers,
// verifies and keeps it), so it survives the loss of this one. Best
// effort: a replica that misses it fetches it on first download.
func (a *API) replicateBlob(im *proto.Image, auth string) {
	peers, err := a.b.Peers()
	if err != nil {
		a.log.Warn("replicate image blob: list peers", "image", im.String(), "err", err)
		return
	}
	self := ""
	if n, ok := a.b.(interface{ NodeID() string }); ok {
		self = n.NodeID()
	}
	client := &http.Client{Transport: a.proxy.transport}
	for _, p := range peers {
		if p.ID == self || p.HTTPAddr == "" {
			continue
		}
		base, err := a.proxy.leaderURL(p.HTTPAddr)
		if err != nil {
			continue
		}
		// A replica that has not applied the image entry yet answers 404:
		// asked again shortly, it has (a few tries, backing off).
		for try, pause := 0, 200*time.Millisecond; ; try, pause = try+1, pause*2 {
			var status int
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
			req, rerr := http.NewRequestWithContext(ctx, http.MethodHead, base.String()+proto.BlobPath(im.Name, im.Version), nil)
			err = rerr
			if err == nil {
				req.Header.Set("Authorization", auth)
				var resp *http.Response
				if resp, err = client.Do(req); err == nil {
					resp.Body.Close()
					if status = resp.StatusCode; status != http.StatusOK {
						err = fmt.Errorf("HTTP %d", resp.StatusCode)
					}
				}
			}
			cancel()
			if err == nil || try >= 5 || (status != 0 && status != http.StatusNotFound && status < 500) {
				break
			}
			time.Sleep(pause)
		}
		if err != nil {
			a.log.Warn("replicate image blob", "image", im.String(), "peer", p.ID, "err", err)
			continue
		}
		a.log.Info("image blob replicated", "image", im.String(), "digest", im.Digest, "peer", p.ID)
	}
}

// forwardStream proxies a blob request to the leader without buffering
// its body (an upload of an entry this replica does not know yet, or a
// download with a credential it does not know yet).
func (a *API) forwardStream(c *call) {
	audit.From(c.r.Context()).Skip() // the leader records it
	noteForwarded(c.r)
	addr := a.b.LeaderHTTPAddr()
	if addr == "" {
		writeProblem(c.w, c.r, proto.Errorf(proto.CodeUnavailable, "this replica cannot serve the request alone and no leader is known; retry shortly"))
		return
	}
	target, err := a.proxy.leaderURL(addr)
	if err != nil {
		writeProblem(c.w, c.r, err)
		return
	}
	reqID := c.w.Header().Get(proto.RequestIDHeader)
	// The route deadline bounds the wait for the leader's answer, not an
	// upgraded session (a console, a proxied WebSocket): ReverseProxy
	// closes the leader's connection when the request context ends, so
	// the context relayed is cut loose from the deadline once the leader
	// switches protocols. Until then the caller going away (or the
	// deadline) still cancels it.
	ctx, cancel := context.WithCancel(context.WithoutCancel(c.r.Context()))
	defer cancel()
	stop := context.AfterFunc(c.r.Context(), cancel)
	defer stop()
	in := c.r.WithContext(ctx)
	rp := &httputil.ReverseProxy{
		Transport: a.proxy.transport,
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Host = target.Host
			pr.Out.Header.Set(proto.ForwardedHeader, "1")
			pr.Out.Header.Set(proto.RequestIDHeader, reqID)
			// Only this replica says which agent certificate it verified.
			pr.Out.Header.Del(proto.NodeCertHeader)
			if v := nodeCertHeader(pr.In); v != "" {
				pr.Out.Header.Set(proto.NodeCertHeader, v)
			}
		},
		ModifyResponse: func(resp *http.Response) error {
			resp.Header.Del(proto.RequestIDHeader)
			if resp.StatusCode == http.StatusSwitchingProtocols {
				stop()
			}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			writeProblem(w, r, proto.Errorf(proto.CodeUnavailable, "forwarding to the leader at %s failed: %v", addr, err))
		},
	}
	rp.ServeHTTP(c.w, in)
}
