package api

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/blobs"
	"github.com/gpuaas/gpuaas/coordinator/enroll"
	"github.com/gpuaas/gpuaas/proto"
)

// blobLedger is the in-process ledger with a blob store and an
// enrollment table.
type blobLedger struct {
	*ledgerBackend
	store *blobs.Store
	tab   *enroll.Table
}

func (b blobLedger) Blobs() *blobs.Store       { return b.store }
func (b blobLedger) Enrollment() *enroll.Table { return b.tab }

func newBlobEnv(t *testing.T) (*env, blobLedger) {
	t.Helper()
	st, err := blobs.Open(t.TempDir())
	require.NoError(t, err)
	bl := blobLedger{ledgerBackend: newLedgerBackend(), store: st, tab: enroll.New()}
	e := newEnvWith(t, bl)
	e.lb = bl.ledgerBackend
	return e, bl
}

func blobOf(t testing.TB, n int) ([]byte, string) {
	t.Helper()
	b := make([]byte, n)
	_, err := rand.Read(b)
	require.NoError(t, err)
	sum := sha256.Sum256(b)
	return b, "sha256:" + hex.EncodeToString(sum[:])
}

// nodeCredential enrolls node id in the env's table and returns the
// credential.
func nodeCredential(t *testing.T, tab *enroll.Table, id string) string {
	t.Helper()
	tok, cred := enroll.NewSecret("gpb_"), enroll.NewSecret("gpn_")
	now := time.Now().UTC()
	require.NoError(t, tab.Mint(proto.BootstrapTokenMintRequest{At: now, NodeID: id, TokenHash: enroll.Hash(tok), ExpiresAt: now.Add(time.Hour)}))
	_, err := tab.Enroll(proto.NodeEnrollRequest{At: now, NodeID: id, TokenHash: enroll.Hash(tok), CredentialHash: enroll.Hash(cred)})
	require.NoError(t, err)
	return cred
}

func TestImageCatalogAPI(t *testing.T) {
	t.Parallel()
	e, _ := newBlobEnv(t)
	_, digest := blobOf(t, 1000)
	body := proto.ImageBody{Kind: proto.ImageSliceBase, Digest: digest, Size: 1000, ReadinessCheck: "base-ssh"}

	e.do(RoleOperator, http.MethodPut, "/v1/images/ubuntu-base/24.04.1", body).requireProblem(t, http.StatusForbidden, proto.CodeForbidden)
	r := e.do(RoleAdmin, http.MethodPut, "/v1/images/ubuntu-base/24.04.1", body)
	require.Equal(t, http.StatusOK, r.status, string(r.body))
	var im proto.Image
	r.decode(t, &im)
	assert.Equal(t, proto.ImagePending, im.State)
	assert.Equal(t, digest, im.Digest)

	for _, bad := range []any{
		proto.ImageBody{Kind: "qcow2", Digest: digest, Size: 1000},
		proto.ImageBody{Kind: proto.ImageSliceBase, Digest: "sha256:1234", Size: 1000},
		proto.ImageBody{Kind: proto.ImageSliceBase, Digest: digest, Size: 0},
		`{"kind":"slice_base","digest":"` + digest + `","size":1000,"extra":1}`,
	} {
		before := e.index()
		e.do(RoleAdmin, http.MethodPut, "/v1/images/ubuntu-base/24.04.2", bad).requireProblem(t, http.StatusBadRequest, proto.CodeInvalidArgument)
		assert.Equal(t, before, e.index())
	}
	e.do(RoleAdmin, http.MethodPut, "/v1/images/Ubuntu/1", body).requireProblem(t, http.StatusBadRequest, proto.CodeInvalidArgument)

	// Scopes name an existing site; a revocation takes none.
	e.do(RoleAdmin, http.MethodPost, "/v1/images/ubuntu-base/24.04.1/approve", proto.ImageApproveBody{Site: "nowhere"}).requireProblem(t, http.StatusNotFound, proto.CodeNotFound)
	e.do(RoleAdmin, http.MethodPost, "/v1/images/ubuntu-base/24.04.1/revoke", proto.ImageApproveBody{Site: "nowhere"}).requireProblem(t, http.StatusBadRequest, proto.CodeInvalidArgument)

	// Approve with a note; the approver is the token's name.
	r = e.do(RoleAdmin, http.MethodPost, "/v1/images/ubuntu-base/24.04.1/approve", proto.ImageApproveBody{Note: "boot-tested", Digest: digest})
	require.Equal(t, http.StatusOK, r.status, string(r.body))
	r.decode(t, &im)
	assert.Equal(t, proto.ImageApproved, im.State)
	require.Len(t, im.Approvals, 1)
	assert.Equal(t, "admin-user", im.Approvals[0].By)
	assert.Equal(t, "boot-tested", im.Approvals[0].Note)

	// The approved digest is fixed.
	_, other := blobOf(t, 1000)
	p := e.do(RoleAdmin, http.MethodPut, "/v1/images/ubuntu-base/24.04.1", proto.ImageBody{Kind: proto.ImageSliceBase, Digest: other, Size: 1000}).
		requireProblem(t, http.StatusConflict, proto.CodeIllegalTransition)
	assert.Contains(t, p.Detail, "new version")
	e.do(RoleAdmin, http.MethodPost, "/v1/images/ubuntu-base/9/approve", nil).requireProblem(t, http.StatusNotFound, proto.CodeNotFound)

	// Lists and filters.
	e.do(RoleAdmin, http.MethodPut, "/v1/images/ubuntu-cuda/12.6", proto.ImageBody{Kind: proto.ImageSliceCUDA, Digest: other, Size: 1000})
	var l proto.List[*proto.Image]
	e.do(RoleViewer, http.MethodGet, "/v1/images", nil).decode(t, &l)
	require.Len(t, l.Items, 2)
	e.do(RoleViewer, http.MethodGet, "/v1/images?state=approved", nil).decode(t, &l)
	require.Len(t, l.Items, 1)
	assert.Equal(t, "ubuntu-base", l.Items[0].Name)
	e.do(RoleViewer, http.MethodGet, "/v1/images?name=ubuntu-cuda", nil).decode(t, &l)
	require.Len(t, l.Items, 1)
	e.do(RoleViewer, http.MethodGet, "/v1/images?state=gone", nil).requireProblem(t, http.StatusBadRequest, proto.CodeInvalidArgument)
	r = e.do(RoleViewer, http.MethodGet, "/v1/images/ubuntu-cuda/12.6", nil)
	require.Equal(t, http.StatusOK, r.status)

	r = e.do(RoleAdmin, http.MethodPost, "/v1/images/ubuntu-base/24.04.1/revoke", proto.ImageApproveBody{Note: "CVE"})
	require.Equal(t, http.StatusOK, r.status, string(r.body))
	r.decode(t, &im)
	assert.Equal(t, proto.ImageRevoked, im.State)
	assert.Len(t, im.Approvals, 2)
}

func TestImageBlobUploadDownload(t *testing.T) {
	t.Parallel()
	e, bl := newBlobEnv(t)
	data, digest := blobOf(t, 3<<20+5)
	size := int64(len(data))
	octet := []string{"Content-Type", "application/octet-stream"}

	// No entry yet: refused.
	e.do(RoleAdmin, http.MethodPut, "/v1/images/base/1/blob", data, octet...).requireProblem(t, http.StatusNotFound, proto.CodeNotFound)
	r := e.do(RoleAdmin, http.MethodPut, "/v1/images/base/1", proto.ImageBody{Kind: proto.ImageSliceBase, Digest: digest, Size: size})
	require.Equal(t, http.StatusOK, r.status, string(r.body))
	e.do(RoleOperator, http.MethodPut, "/v1/images/base/1/blob", data, octet...).requireProblem(t, http.StatusForbidden, proto.CodeForbidden)

	// Wrong bytes of the right size, or the wrong size: refused, nothing kept.
	bad := bytes.Clone(data)
	bad[100] ^= 1
	p := e.do(RoleAdmin, http.MethodPut, "/v1/images/base/1/blob", bad, octet...).requireProblem(t, http.StatusBadRequest, proto.CodeInvalidArgument)
	assert.Contains(t, p.Detail, digest)
	badSum := sha256.Sum256(bad)
	assert.Contains(t, p.Detail, hex.EncodeToString(badSum[:]))
	p = e.do(RoleAdmin, http.MethodPut, "/v1/images/base/1/blob", data[:1000], octet...).requireProblem(t, http.StatusBadRequest, proto.CodeInvalidArgument)
	assert.Contains(t, p.Detail, "1000 bytes")
	assert.False(t, bl.store.Has(digest, size))
	tmps, err := os.ReadDir(filepath.Join(bl.store.Dir(), "tmp"))
	require.NoError(t, err)
	assert.Empty(t, tmps, "no temporary file left behind")
	e.do(RoleViewer, http.MethodGet, "/v1/images/base/1/blob", nil).requireProblem(t, http.StatusNotFound, proto.CodeNotFound)

	r = e.do(RoleAdmin, http.MethodPut, "/v1/images/base/1/blob", data, octet...)
	require.Equal(t, http.StatusOK, r.status, string(r.body))
	assert.True(t, bl.store.Has(digest, size))
	stored, err := os.ReadFile(filepath.Join(bl.store.Dir(), "sha256", proto.DigestHex(digest)))
	require.NoError(t, err)
	assert.True(t, bytes.Equal(data, stored))

	// Download whole, then resumed with Range.
	r = e.do(RoleViewer, http.MethodGet, "/v1/images/base/1/blob", nil)
	require.Equal(t, http.StatusOK, r.status)
	assert.True(t, bytes.Equal(data, r.body))
	assert.Equal(t, `"`+digest+`"`, r.header.Get("ETag"))
	r = e.do(RoleViewer, http.MethodGet, "/v1/images/base/1/blob", nil, "Range", "bytes=1048576-")
	require.Equal(t, http.StatusPartialContent, r.status)
	assert.True(t, bytes.Equal(data[1<<20:], r.body))
	assert.Equal(t, fmt.Sprintf("bytes 1048576-%d/%d", size-1, size), r.header.Get("Content-Range"))

	// A node credential may download; it may not upload.
	cred := nodeCredential(t, bl.tab, "j22u15")
	get := func(method, tok string, body []byte) int {
		req, err := http.NewRequest(method, e.url+"/v1/images/base/1/blob", bytes.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	assert.Equal(t, http.StatusOK, get(http.MethodGet, cred, nil))
	assert.Equal(t, http.StatusUnauthorized, get(http.MethodPut, cred, data))
	assert.Equal(t, http.StatusUnauthorized, get(http.MethodGet, "gpn_forged", nil))

	// Revoked: no longer served.
	e.do(RoleAdmin, http.MethodPost, "/v1/images/base/1/revoke", nil)
	e.do(RoleViewer, http.MethodGet, "/v1/images/base/1/blob", nil).requireProblem(t, http.StatusConflict, proto.CodeIllegalTransition)
}

// TestAllocationImage: an allocation's image resolves to an approved slice
// image and the provision task carries its reference; an unknown or
// unapproved image is refused with nothing written.
func TestAllocationImage(t *testing.T) {
	t.Parallel()
	e, _ := newBlobEnv(t)
	e.seedLab()
	_, digest := blobOf(t, 4096)
	e.do(RoleAdmin, http.MethodPut, "/v1/images/ubuntu-base/1", proto.ImageBody{Kind: proto.ImageSliceBase, Digest: digest, Size: 4096})
	create := func(image, key string) resp {
		return e.do(RoleOperator, http.MethodPost, "/v1/allocations",
			proto.AllocationCreateRequest{CapacityShape: proto.ShapeGPUSlice, SKU: "h200-sxm-slice", GPUCount: 1, Region: "us-east", Image: image},
			proto.IdempotencyKeyHeader, key)
	}
	for image, code := range map[string]proto.Code{
		"nope": proto.CodeNotFound, "ubuntu-base": proto.CodeInvalidArgument, "ubuntu-base:2": proto.CodeNotFound, "UBUNTU": proto.CodeInvalidArgument,
	} {
		before := e.index()
		p := create(image, "k-"+image).requireProblem(t, code.HTTPStatus(), code)
		assert.Contains(t, p.Detail, "image")
		assert.Equal(t, before, e.index(), "refused %s wrote nothing", image)
	}
	e.do(RoleAdmin, http.MethodPost, "/v1/images/ubuntu-base/1/approve", nil)
	for _, image := range []string{"ubuntu-base", "ubuntu-base:1", ""} {
		r := create(image, "k-ok-"+image)
		require.Equal(t, http.StatusCreated, r.status, string(r.body))
		var a proto.Allocation
		r.decode(t, &a)
		var task *proto.Task
		for _, o := range e.b.Store().Snapshot().Outbox() {
			if o.Task.AllocationID == a.ID {
				task = &o.Task
			}
		}
		require.NotNil(t, task, "the provision task is queued")
		var pl proto.AllocationTaskPayload
		require.NoError(t, json.Unmarshal(task.Payload, &pl))
		if image == "" {
			assert.Nil(t, pl.ImageRef)
			continue
		}
		require.NotNil(t, pl.ImageRef)
		assert.Equal(t, proto.ImageRef{Name: "ubuntu-base", Version: "1", Kind: "slice_base", Digest: digest, Size: 4096, URL: "/v1/images/ubuntu-base/1/blob"}, *pl.ImageRef)
	}
}

// TestImageBlobPeerFetch: three real coordinators; the blob is uploaded
// to one and downloaded from another, which fetches it from its peer,
// verifies it and keeps it.
func TestImageBlobPeerFetch(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three coordinators")
	}
	t.Parallel()
	rs := startReplicas(t, 3)
	leader, followers := leaderOf(t, rs)
	data, digest := blobOf(t, 2<<20)
	size := int64(len(data))
	octet := []string{"Content-Type", "application/octet-stream"}
	r := leader.env.do(RoleAdmin, http.MethodPut, "/v1/images/base/1", proto.ImageBody{Kind: proto.ImageSliceBase, Digest: digest, Size: size})
	require.Equal(t, http.StatusOK, r.status, string(r.body))
	r = leader.env.do(RoleAdmin, http.MethodPut, "/v1/images/base/1/blob", data, octet...)
	require.Equal(t, http.StatusOK, r.status, string(r.body))
	// The replica that took the upload has the others fetch it.
	for _, x := range followers {
		require.Eventually(t, func() bool { return x.srv.Blobs().Has(digest, size) }, 20*time.Second, 20*time.Millisecond, "replicated to %s", x.srv.NodeID())
	}
	// A replica that lost it (or joined later) fetches it on first download.
	f := followers[0]
	require.NoError(t, os.Remove(filepath.Join(f.srv.Blobs().Dir(), "sha256", proto.DigestHex(digest))))
	require.False(t, f.srv.Blobs().Has(digest, size))

	r = f.env.do(RoleViewer, http.MethodGet, "/v1/images/base/1/blob", nil, "Range", "bytes=100-")
	require.Equal(t, http.StatusPartialContent, r.status, string(r.body))
	assert.True(t, bytes.Equal(data[100:], r.body))
	assert.True(t, f.srv.Blobs().Has(digest, size), "the follower kept the verified blob")

	// An upload sent to a follower (forwarded when it does not know the
	// entry yet, stored there otherwise) is then served by every replica.
	data2, digest2 := blobOf(t, 1<<20)
	r = leader.env.do(RoleAdmin, http.MethodPut, "/v1/images/base/2", proto.ImageBody{Kind: proto.ImageSliceBase, Digest: digest2, Size: int64(len(data2))})
	require.Equal(t, http.StatusOK, r.status, string(r.body))
	r = followers[1].env.do(RoleAdmin, http.MethodPut, "/v1/images/base/2/blob", data2, octet...)
	require.Equal(t, http.StatusOK, r.status, string(r.body))
	for _, x := range rs {
		require.Eventually(t, func() bool { _, ok := x.srv.Store().Snapshot().Image("base", "2"); return ok }, 10*time.Second, 10*time.Millisecond)
		r = x.env.do(RoleViewer, http.MethodGet, "/v1/images/base/2/blob", nil)
		require.Equal(t, http.StatusOK, r.status, string(r.body))
		assert.True(t, bytes.Equal(data2, r.body))
	}

	// A blob no replica has is a clear 404 naming the upload route.
	_, digest3 := blobOf(t, 10)
	leader.env.do(RoleAdmin, http.MethodPut, "/v1/images/base/3", proto.ImageBody{Kind: proto.ImageSliceBase, Digest: digest3, Size: 10})
	p := leader.env.do(RoleViewer, http.MethodGet, "/v1/images/base/3/blob", nil).requireProblem(t, http.StatusNotFound, proto.CodeNotFound)
	assert.Contains(t, p.Detail, "PUT /v1/images/base/3/blob")

	// The leader refuses a placement naming an unknown image before planning.
	leader.env.do(RoleOperator, http.MethodPost, "/v1/allocations",
		proto.AllocationCreateRequest{CapacityShape: proto.ShapeGPUSlice, SKU: "h200-sxm-slice", GPUCount: 1, Region: "us-east", Image: "nope"},
		proto.IdempotencyKeyHeader, "k-nope").requireProblem(t, http.StatusNotFound, proto.CodeNotFound)
}

// TestBlobUnknownCredentialOnFollowerIsForwarded: a follower that does not
// know a node credential yet hands the download to the leader once,
// streaming its answer; a request forwarded already is refused.
func TestBlobUnknownCredentialOnFollowerIsForwarded(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var got []*http.Request
	leader := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Clone(r.Context()))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/octet-stream")
		_, _ = w.Write([]byte("blob bytes"))
	}))
	t.Cleanup(leader.Close)
	e, bl := newBlobEnv(t)
	bl.setFollower(strings.TrimPrefix(leader.URL, "http://"))
	get := func(hdr ...string) (int, string) {
		req, err := http.NewRequest(http.MethodGet, e.url+"/v1/images/base/1/blob", nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer gpn_fresh")
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	code, body := get()
	require.Equal(t, http.StatusOK, code, body)
	assert.Equal(t, "blob bytes", body)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, got, 1)
	assert.Equal(t, "Bearer gpn_fresh", got[0].Header.Get("Authorization"))
	assert.Equal(t, "1", got[0].Header.Get(proto.ForwardedHeader))
	mu.Unlock()
	code, _ = get(proto.ForwardedHeader, "1")
	assert.Equal(t, http.StatusUnauthorized, code)
	code, _ = get(blobPeerHeader, "1")
	assert.Equal(t, http.StatusUnauthorized, code)
	mu.Lock()
	assert.Len(t, got, 1)
}
