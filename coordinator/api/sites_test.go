package api

import (
	"bytes"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/sitekey"
	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/proto/prototest"
)

// sealingBackend is the in-process ledger with a site key.
type sealingBackend struct {
	*ledgerBackend
	key *sitekey.Key
}

func (b sealingBackend) SealSiteSecret(site string, secret []byte) (*proto.SealedSecret, error) {
	return b.key.Seal(site, secret)
}

const testMAASKey = "Cons1:Tok2en:TopSecretMaasValue"

func siteEnv(t *testing.T) (*env, *sitekey.Key) {
	t.Helper()
	key, err := sitekey.New(bytes.Repeat([]byte{9}, sitekey.KeySize))
	require.NoError(t, err)
	lb := newLedgerBackend()
	e := newEnvWith(t, sealingBackend{lb, key})
	e.lb = lb
	e.seedRegion("r1", "pool-slice")
	e.apply(proto.PoolUpsertType, proto.PoolUpsertRequest{At: fixtureAt, Pool: proto.Pool{Name: "pool-bm", Region: "r1"}})
	return e, key
}

func siteBody() proto.SiteBody {
	return proto.SiteBody{Site: prototest.Site(), MAASAPIKey: testMAASKey}
}

func TestSitePutGetNeverReturnsCredentials(t *testing.T) {
	t.Parallel()
	e, key := siteEnv(t)
	b := siteBody()
	r := e.do(RoleAdmin, http.MethodPut, "/v1/sites/site-a", b)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	for _, leak := range []string{"TopSecretMaasValue", "ciphertext", "nonce", "maas_api_key"} {
		assert.NotContains(t, string(r.body), leak)
	}
	var v proto.SiteView
	r.decode(t, &v)
	assert.True(t, v.CredentialsSet)
	assert.Equal(t, key.ID(), v.CredentialsKeyID)
	assert.Equal(t, "r1", v.Region)

	// Stored sealed, opens to the key on the leader.
	s, ok := e.b.Store().Snapshot().Site("site-a")
	require.True(t, ok)
	plain, err := key.Open("site-a", s.Credentials)
	require.NoError(t, err)
	assert.Equal(t, testMAASKey, string(plain))

	g := e.do(RoleViewer, http.MethodGet, "/v1/sites/site-a", nil)
	require.Equal(t, http.StatusOK, g.status)
	assert.NotContains(t, string(g.body), "TopSecretMaasValue")
	assert.NotContains(t, string(g.body), "ciphertext")

	// An update without the key keeps it.
	b.MAASAPIKey = ""
	b.PXEVLAN = 12
	r = e.do(RoleAdmin, http.MethodPut, "/v1/sites/site-a", b)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	r.decode(t, &v)
	assert.True(t, v.CredentialsSet)
	assert.Equal(t, 12, v.PXEVLAN)
	s2, _ := e.b.Store().Snapshot().Site("site-a")
	assert.Equal(t, s.Credentials, s2.Credentials)

	e.do(RoleViewer, http.MethodGet, "/v1/sites/site-z", nil).requireProblem(t, http.StatusNotFound, proto.CodeNotFound)

	// The audit records of both puts carry the site's view, not the key
	// nor its sealed form.
	recs := e.auditList("kind=site")
	require.Len(t, recs, 2)
	assert.Contains(t, string(recs[1].Before), `"credentials_set":true`)
	exp := strings.Join(e.exportLines(), "\n")
	for _, leak := range []string{"TopSecretMaasValue", testMAASKey, "ciphertext", "nonce", "maas_api_key"} {
		assert.NotContains(t, exp, leak)
	}
}

func TestSitePutRefusals(t *testing.T) {
	t.Parallel()
	e, _ := siteEnv(t)
	cases := []struct {
		name   string
		role   Role
		path   string
		body   func(*proto.SiteBody)
		status int
		code   proto.Code
		want   string
	}{
		{"viewer", RoleViewer, "/v1/sites/site-a", nil, http.StatusForbidden, proto.CodeForbidden, "needs role admin"},
		{"operator", RoleOperator, "/v1/sites/site-a", nil, http.StatusForbidden, proto.CodeForbidden, "needs role admin"},
		{"no key on create", RoleAdmin, "/v1/sites/site-a", func(b *proto.SiteBody) { b.MAASAPIKey = "" }, http.StatusBadRequest, proto.CodeInvalidArgument, "maas credentials are required"},
		{"bad key", RoleAdmin, "/v1/sites/site-a", func(b *proto.SiteBody) { b.MAASAPIKey = "only-one-part-secret" }, http.StatusBadRequest, proto.CodeInvalidArgument, "consumer:token:secret"},
		{"sealed in body", RoleAdmin, "/v1/sites/site-a", func(b *proto.SiteBody) {
			b.Credentials = &proto.SealedSecret{KeyID: "x", Nonce: make([]byte, 12), Ciphertext: make([]byte, 30)}
		}, http.StatusBadRequest, proto.CodeInvalidArgument, "sealed by the coordinator"},
		{"name mismatch", RoleAdmin, "/v1/sites/site-b", nil, http.StatusBadRequest, proto.CodeInvalidArgument, "differs from the path"},
		{"bad wipe", RoleAdmin, "/v1/sites/site-a", func(b *proto.SiteBody) { b.WipePolicy = "shred" }, http.StatusBadRequest, proto.CodeInvalidArgument, "wipe_policy"},
		{"unknown pool", RoleAdmin, "/v1/sites/site-a", func(b *proto.SiteBody) { b.Profiles = map[string]string{"slice": "nope"} }, http.StatusNotFound, proto.CodeNotFound, "pool nope"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := siteBody()
			if tc.body != nil {
				tc.body(&b)
			}
			p := e.do(tc.role, http.MethodPut, tc.path, b).requireProblem(t, tc.status, tc.code)
			assert.Contains(t, p.Detail, tc.want)
			assert.NotContains(t, p.Detail, "TopSecretMaasValue", "errors never echo the key")
		})
	}
	_, ok := e.b.Store().Snapshot().Site("site-a")
	assert.False(t, ok, "refused writes change nothing")
}

func TestSitePutWithoutSealer(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.seedRegion("r1", "pool-slice")
	e.apply(proto.PoolUpsertType, proto.PoolUpsertRequest{At: fixtureAt, Pool: proto.Pool{Name: "pool-bm", Region: "r1"}})
	e.do(RoleAdmin, http.MethodPut, "/v1/sites/site-a", siteBody()).requireProblem(t, http.StatusServiceUnavailable, proto.CodeUnavailable)
}

func TestSiteProfilePutGet(t *testing.T) {
	t.Parallel()
	e, _ := siteEnv(t)
	require.Equal(t, http.StatusOK, e.do(RoleAdmin, http.MethodPut, "/v1/sites/site-a", siteBody()).status)
	p := prototest.SiteProfile()
	r := e.do(RoleAdmin, http.MethodPut, "/v1/sites/site-a/profiles/slice", p)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	var got proto.SiteProfile
	r.decode(t, &got)
	assert.Equal(t, "site-a", got.Site)
	assert.Equal(t, "slice", got.Name)
	assert.Equal(t, 4, got.BatchMaxParallel)
	assert.True(t, strings.Contains(string(r.body), `"hardware_sync_interval":"15m0s"`))

	g := e.do(RoleViewer, http.MethodGet, "/v1/sites/site-a/profiles/slice", nil)
	require.Equal(t, http.StatusOK, g.status)
	var again proto.SiteProfile
	g.decode(t, &again)
	assert.Equal(t, got, again)

	e.do(RoleViewer, http.MethodGet, "/v1/sites/site-a/profiles/bm", nil).requireProblem(t, http.StatusNotFound, proto.CodeNotFound)
	e.do(RoleOperator, http.MethodPut, "/v1/sites/site-a/profiles/slice", p).requireProblem(t, http.StatusForbidden, proto.CodeForbidden)
	bad := p
	bad.BatchMaxParallel = 0
	pr := e.do(RoleAdmin, http.MethodPut, "/v1/sites/site-a/profiles/slice", bad).requireProblem(t, http.StatusBadRequest, proto.CodeInvalidArgument)
	assert.Contains(t, pr.Detail, "batch_max_parallel 0")
	other := p
	other.Site = "site-b"
	e.do(RoleAdmin, http.MethodPut, "/v1/sites/site-a/profiles/slice", other).requireProblem(t, http.StatusBadRequest, proto.CodeInvalidArgument)
	unmapped := p
	unmapped.Name = "gpu-x"
	e.do(RoleAdmin, http.MethodPut, "/v1/sites/site-a/profiles/gpu-x", unmapped).requireProblem(t, http.StatusNotFound, proto.CodeNotFound)
}
