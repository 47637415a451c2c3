package api

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/enroll"
	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/proto/prototest"
)

// bootLedger is the in-process ledger whose enrollment commands reach its
// enrollment table, as the server's enrollment FSM applies them.
type bootLedger struct {
	*ledgerBackend
	tab *enroll.Table
}

func (b bootLedger) Enrollment() *enroll.Table { return b.tab }

func (b bootLedger) Apply(ctx context.Context, t proto.MessageType, req any) (any, uint64, error) {
	switch t &^ proto.IgnoreUnknownTypeFlag {
	case proto.BootstrapTokenMintType:
		return nil, 0, b.tab.Mint(req.(proto.BootstrapTokenMintRequest))
	case proto.NodeBootstrapReportType:
		return nil, 0, b.tab.Report(req.(proto.NodeBootstrapReportRequest))
	case proto.NodeEnrollType:
		c, err := b.tab.Enroll(req.(proto.NodeEnrollRequest))
		return &c, 0, err
	}
	return b.ledgerBackend.Apply(ctx, t, req)
}

const script = "#!/bin/sh\necho site\n"

func TestBundlePublishListGet(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	octet := []string{"Content-Type", "application/octet-stream"}
	r := e.do(RoleAdmin, http.MethodPost, "/v1/bundles?name=site-boot&kind=site_bootstrap", script, octet...)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	var b proto.Bundle
	r.decode(t, &b)
	assert.Equal(t, proto.BundleDigest([]byte(script)), b.Digest)
	assert.Equal(t, int64(len(script)), b.Size)
	assert.Empty(t, b.Content, "records never carry the bytes")
	again := e.do(RoleAdmin, http.MethodPost, "/v1/bundles?name=other-name&kind=site_bootstrap", script, octet...)
	assert.Equal(t, http.StatusOK, again.status, "the same bytes again: the stored bundle")

	e.do(RoleOperator, http.MethodPost, "/v1/bundles?name=x&kind=site_bootstrap", script, octet...).requireProblem(t, http.StatusForbidden, proto.CodeForbidden)
	e.do(RoleAdmin, http.MethodPost, "/v1/bundles?name=x&kind=firmware", script, octet...).requireProblem(t, http.StatusBadRequest, proto.CodeInvalidArgument)
	e.do(RoleAdmin, http.MethodPost, "/v1/bundles?name=x&kind=site_bootstrap", "just text", octet...).requireProblem(t, http.StatusBadRequest, proto.CodeInvalidArgument)

	var l proto.List[proto.Bundle]
	e.do(RoleViewer, http.MethodGet, "/v1/bundles", nil).decode(t, &l)
	require.Len(t, l.Items, 1)
	assert.Empty(t, l.Items[0].Content)
	var got proto.Bundle
	e.do(RoleViewer, http.MethodGet, "/v1/bundles/"+b.Digest, nil).decode(t, &got)
	assert.Equal(t, "site-boot", got.Name)
	e.do(RoleViewer, http.MethodGet, "/v1/bundles/sha256:"+strings.Repeat("0", 64), nil).requireProblem(t, http.StatusNotFound, proto.CodeNotFound)
	e.do(RoleViewer, http.MethodGet, "/v1/bundles/nope", nil).requireProblem(t, http.StatusBadRequest, proto.CodeInvalidArgument)
}

func rawCall(t *testing.T, method, url, token, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, bytes.NewReader([]byte(body)))
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestBootstrapRoutes: a deploying node pings, fetches a bundle and
// posts its progress with its bootstrap token (spent or not, until it
// expires); another node's token, an unknown token or an expired one is
// refused; an operator (viewer) may read bundle bytes too.
func TestBootstrapRoutes(t *testing.T) {
	t.Parallel()
	tab := enroll.New()
	e := newEnvWith(t, bootLedger{newLedgerBackend(), tab})
	ref := e.apply(proto.BundlePublishType, proto.BundlePublishRequest{At: fixtureAt, Bundle: proto.Bundle{
		Digest: proto.BundleDigest([]byte(script)), Name: "site-boot", Kind: proto.BundleSiteBootstrap, Size: int64(len(script)), Content: []byte(script)}}).(*proto.Bundle).Digest
	now := time.Now().UTC()
	tok := enroll.NewSecret("gpb_")
	require.NoError(t, tab.Mint(proto.BootstrapTokenMintRequest{At: now, NodeID: "j22u15", TokenHash: enroll.Hash(tok), ExpiresAt: now.Add(time.Hour)}))
	old := enroll.NewSecret("gpb_")
	require.NoError(t, tab.Mint(proto.BootstrapTokenMintRequest{At: now.Add(-2 * time.Hour), NodeID: "j22u15", TokenHash: enroll.Hash(old), ExpiresAt: now.Add(-time.Hour)}))

	code, body := rawCall(t, http.MethodGet, e.url+proto.BootstrapPingPath, "", "")
	assert.Equal(t, http.StatusOK, code, body)

	code, body = rawCall(t, http.MethodGet, e.url+proto.BundleContentPath(ref), tok, "")
	require.Equal(t, http.StatusOK, code, body)
	assert.Equal(t, script, body)
	code, body = rawCall(t, http.MethodGet, e.url+proto.BundleContentPath(ref), e.tok[RoleViewer], "")
	assert.Equal(t, http.StatusOK, code, body)
	for _, bad := range []string{"", old, enroll.NewSecret("gpb_")} {
		code, _ = rawCall(t, http.MethodGet, e.url+proto.BundleContentPath(ref), bad, "")
		assert.Equal(t, http.StatusUnauthorized, code, "token %q", bad)
	}

	report := `{"node_id":"j22u15","workflow_id":"onboard.lab.j22u15","phase":"bundle_fetch","status":"succeeded","detail":"ok"}`
	code, body = rawCall(t, http.MethodPost, e.url+proto.BootstrapReportPath, tok, report)
	require.Equal(t, http.StatusAccepted, code, body)
	// After enrollment the spent token still reports.
	_, err := tab.Enroll(proto.NodeEnrollRequest{At: now, NodeID: "j22u15", TokenHash: enroll.Hash(tok), CredentialHash: enroll.Hash("gpn_x")})
	require.NoError(t, err)
	code, body = rawCall(t, http.MethodPost, e.url+proto.BootstrapReportPath, tok,
		`{"node_id":"j22u15","phase":"node_bootstrap","status":"succeeded","ib_ports":[{"device":"mlx5_0","port":1,"state":"ACTIVE"}]}`)
	require.Equal(t, http.StatusAccepted, code, body)
	// The enrolled node reads bundles with its credential (node.validate).
	code, body = rawCall(t, http.MethodGet, e.url+proto.BundleContentPath(ref), "gpn_x", "")
	assert.Equal(t, http.StatusOK, code, body)
	reps := tab.Reports("j22u15", now)
	require.Len(t, reps, 2)
	assert.Equal(t, proto.PhaseBundleFetch, reps[0].Phase)
	assert.False(t, reps[0].At.IsZero(), "the coordinator stamps the time")
	assert.Equal(t, "ACTIVE", reps[1].IBPorts[0].State)

	code, _ = rawCall(t, http.MethodPost, e.url+proto.BootstrapReportPath, tok, strings.Replace(report, "j22u15", "j22u11", 1))
	assert.Equal(t, http.StatusForbidden, code, "a token reports for its own node only")
	code, _ = rawCall(t, http.MethodPost, e.url+proto.BootstrapReportPath, old, report)
	assert.Equal(t, http.StatusUnauthorized, code, "an expired token")
	code, _ = rawCall(t, http.MethodPost, e.url+proto.BootstrapReportPath, tok, strings.Replace(report, "bundle_fetch", "firmware", 1))
	assert.Equal(t, http.StatusBadRequest, code)
	assert.Len(t, tab.Reports("j22u15", now), 2, "refused reports change nothing")
}

// TestOnboardGenerations: onboarding a machine again while its workflow
// runs answers that workflow; once it ended, a re-onboard gets the next
// generation's ID.
func TestOnboardGenerations(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.seedRegion("r1", "pool-slice")
	e.apply(proto.PoolUpsertType, proto.PoolUpsertRequest{At: fixtureAt, Pool: proto.Pool{Name: "pool-bm", Region: "r1"}})
	site := prototest.Site()
	site.Credentials = &proto.SealedSecret{KeyID: "k", Nonce: make([]byte, 12), Ciphertext: make([]byte, 32)}
	e.apply(proto.SiteUpsertType, proto.SiteUpsertRequest{At: fixtureAt, Site: site})
	e.apply(proto.SiteProfileUpsertType, proto.SiteProfileUpsertRequest{At: fixtureAt, Profile: prototest.SiteProfile()})
	body := proto.OnboardBody{Profile: "slice", Hostname: "j22u15", MACs: []string{"52:54:00:00:00:15"}}
	var w proto.WorkflowView
	r := e.do(RoleAdmin, http.MethodPost, "/v1/sites/site-a/onboard", body)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	r.decode(t, &w)
	assert.Equal(t, "onboard.site-a.j22u15", w.ID)
	r = e.do(RoleAdmin, http.MethodPost, "/v1/sites/site-a/onboard", body)
	assert.Equal(t, http.StatusOK, r.status, "running: the same workflow")

	end := func(id string) {
		cur, ok := e.b.Store().Snapshot().MAASWorkflow(id)
		require.True(t, ok)
		next := *cur
		next.State = proto.WorkflowFailed
		e.apply(proto.MAASWorkflowUpdateType, proto.MAASWorkflowUpdateRequest{At: fixtureAt, ExpectModifyIndex: cur.ModifyIndex, Workflow: next})
	}
	end(w.ID)
	for gen := 2; gen <= 3; gen++ {
		r = e.do(RoleAdmin, http.MethodPost, "/v1/sites/site-a/onboard", body)
		require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
		r.decode(t, &w)
		assert.Equal(t, proto.OnboardWorkflowIDGen("site-a", "j22u15", gen), w.ID)
		assert.Equal(t, proto.StageResolve, w.Stage, "a fresh workflow with its own timeline")
		end(w.ID)
	}
	assert.Equal(t, "onboard.site-a.j22u15.g3", w.ID)
}

// TestBundleContentUnknownTokenOnFollowerIsForwarded: a bootstrap token
// this follower has not seen yet is judged by the leader.
func TestBundleContentUnknownTokenOnFollowerIsForwarded(t *testing.T) {
	t.Parallel()
	var got []*http.Request
	leader := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.Clone(r.Context()))
		_, _ = w.Write([]byte(script))
	}))
	t.Cleanup(leader.Close)
	lb := newLedgerBackend()
	lb.setFollower(strings.TrimPrefix(leader.URL, "http://"))
	f := httptest.NewServer(New(bootLedger{lb, enroll.New()}, nil, slog.New(slog.NewTextHandler(io.Discard, nil))))
	t.Cleanup(f.Close)
	ref := proto.BundleDigest([]byte(script))
	code, body := rawCall(t, http.MethodGet, f.URL+proto.BundleContentPath(ref), "gpb_fresh", "")
	require.Equal(t, http.StatusOK, code, body)
	assert.Equal(t, script, body)
	require.Len(t, got, 1)
	assert.Equal(t, "1", got[0].Header.Get(proto.ForwardedHeader))
	// Forwarded already: judged here, refused.
	req, err := http.NewRequest(http.MethodGet, f.URL+proto.BundleContentPath(ref), nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer gpb_fresh")
	req.Header.Set(proto.ForwardedHeader, "1")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
}
