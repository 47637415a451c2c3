package maassim_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/canonical/gomaasclient/client"
	"github.com/canonical/gomaasclient/entity"
	gomaasapi "github.com/juju/gomaasapi/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/lab/maassim"
)

func TestAuth(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(o *maassim.Options) {
		o.APIKeys = []string{maassim.DefaultAPIKey, "ops:optoken:opsecret"}
	})
	u := f.ts.URL + "/MAAS/api/2.0/machines/"
	cases := []struct {
		name   string
		auth   string
		status int
		body   string
	}{
		{"default key", oauthHeader(maassim.DefaultAPIKey, ""), 200, "[]"},
		{"second key", oauthHeader("ops:optoken:opsecret", ""), 200, "[]"},
		{"no header", "", 401, "Authorization Required"},
		{"unknown consumer", oauthHeader("nobody:simtoken:simsecret", ""), 401, "Authorization Error: Invalid API key."},
		{"unknown token", oauthHeader("simconsumer:badtoken:simsecret", ""), 401, "Authorization Error: 'Invalid access token: badtoken'"},
		{"wrong secret", oauthHeader("simconsumer:simtoken:wrong", ""), 401, "Authorization Error: 'Invalid signature.'"},
		{"basic auth", "Basic YWRtaW46YWRtaW4=", 401, "Authorization Required"},
		{"hmac", strings.Replace(oauthHeader(maassim.DefaultAPIKey, ""), "PLAINTEXT", "HMAC-SHA1", 1), 401,
			"Authorization Error: 'Signature method HMAC-SHA1 not supported try one of the following: PLAINTEXT'"},
	}
	for _, c := range cases {
		code, _, body := rawWithAuth(t, http.MethodGet, u, nil, c.auth)
		assert.Equal(t, c.status, code, c.name)
		assert.Equal(t, c.body, body, c.name)
	}

	// A replayed nonce is refused.
	h := oauthHeader(maassim.DefaultAPIKey, "fixed-nonce")
	code, _, _ := rawWithAuth(t, http.MethodGet, u, nil, h)
	require.Equal(t, 200, code)
	code, _, body := rawWithAuth(t, http.MethodGet, u, nil, h)
	assert.Equal(t, 401, code)
	assert.Equal(t, "Authorization Error: 'Nonce already used: fixed-nonce'", body)

	// A stale timestamp is refused.
	stale := strings.Replace(oauthHeader(maassim.DefaultAPIKey, ""), `oauth_timestamp="`,
		`oauth_timestamp="1`, 1) // ~30 years in the future
	code, _, body = rawWithAuth(t, http.MethodGet, u, nil, stale)
	assert.Equal(t, 401, code)
	assert.Contains(t, body, "Expired timestamp")

	// version/ needs no credentials.
	code, _, body = rawWithAuth(t, http.MethodGet, f.ts.URL+"/MAAS/api/2.0/version/", nil, "")
	assert.Equal(t, 200, code)
	assert.Contains(t, body, `"version":"3.4.2"`)

	// gomaasclient with a bad key gets a ServerError 401 and changes nothing.
	bad, err := client.GetClient(f.base, "simconsumer:simtoken:nope", "2.0")
	require.NoError(t, err)
	_, err = bad.Machines.Create(&entity.MachineCreateParams{MACAddresses: []string{"52:54:00:aa:00:01"}}, nil)
	se, ok := gomaasapi.GetServerError(err)
	require.True(t, ok, "%v", err)
	assert.Equal(t, 401, se.StatusCode)
	assert.Empty(t, f.sim.Machines())

	// Every refused request is in the request log, with its status.
	refused := f.sim.Requests(func(r maassim.Request) bool { return r.Status == 401 })
	assert.Len(t, refused, 9)
}

func TestOpDispatch(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	id := f.create(t, "h1", "52:54:00:00:20:01")
	cases := []struct {
		method, path string
		status       int
		body         string
	}{
		{"POST", "machines/" + id + "/?op=frobnicate", 400, "Unrecognised signature: method=POST op=frobnicate"},
		{"GET", "machines/" + id + "/?op=deploy", 400, "Unrecognised signature: method=GET op=deploy"},
		{"POST", "machines/?op=frobnicate", 400, "Unrecognised signature: method=POST op=frobnicate"},
		{"GET", "events/", 400, "Unrecognised signature: method=GET op=None"},
		{"GET", "tags/?op=frobnicate", 400, "Unrecognised signature: method=GET op=frobnicate"},
		{"GET", "machines/nosuch/", 404, "No Machine matches the given query."},
		{"GET", "tags/nosuch/", 404, "No Tag matches the given query."},
		{"GET", "nodes/" + id + "/blockdevices/99999/", 404, "No BlockDevice matches the given query."},
	}
	for _, c := range cases {
		code, hdr, body := f.raw(t, c.method, c.path, nil)
		assert.Equal(t, c.status, code, c.path)
		assert.Equal(t, c.body, body, c.path)
		assert.Equal(t, "text/plain; charset=utf-8", hdr.Get("Content-Type"), c.path)
	}
	// The op may also travel in a form-encoded body (MAAS reads GET or POST).
	code, _, body := f.raw(t, "POST", "machines/"+id+"/", url.Values{"op": {"mark_broken"}, "comment": {"x"}})
	assert.Equal(t, 200, code, body)
	f.requireStatus(t, id, maassim.StatusBroken)

	// Form errors are JSON field errors.
	code, hdr, body := f.raw(t, "POST", "machines/", url.Values{"mac_addresses": {"not-a-mac"}})
	assert.Equal(t, 400, code)
	assert.Equal(t, "application/json", hdr.Get("Content-Type"))
	assert.JSONEq(t, `{"mac_addresses":["One or more MAC addresses is invalid. ('not-a-mac' is not a valid MAC address.)"]}`, body)
	code, _, body = f.raw(t, "GET", "machines/", url.Values{"mac_address": {"zz"}})
	assert.Equal(t, 400, code)
	assert.Equal(t, "Invalid MAC address(es): zz", body)
}
