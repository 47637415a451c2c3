package maassim_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/canonical/gomaasclient/client"
	"github.com/canonical/gomaasclient/entity"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/lab/maassim"
)

var epoch = time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)

// fixture is a simulator on an httptest server with a manual clock and a
// real gomaasclient pointed at it.
type fixture struct {
	sim    *maassim.Server
	clock  *maassim.ManualClock
	ts     *httptest.Server
	base   string // http://127.0.0.1:port/MAAS/
	client *client.Client
}

func newFixture(t testing.TB, mut ...func(*maassim.Options)) *fixture {
	t.Helper()
	clock := maassim.NewManualClock(epoch)
	opts := maassim.Options{
		Clock: clock,
		Subnets: []maassim.Subnet{
			{ID: 1, Name: "pxe", CIDR: "10.10.0.0/24", GatewayIP: "10.10.0.1"},
			{ID: 2, Name: "roce", CIDR: "192.168.50.0/24", VID: 50},
		},
	}
	for _, m := range mut {
		m(&opts)
	}
	sim := maassim.New(opts)
	ts := httptest.NewServer(sim)
	t.Cleanup(ts.Close)
	base := ts.URL + "/MAAS/"
	c, err := client.GetClient(base, maassim.DefaultAPIKey, "2.0")
	require.NoError(t, err)
	return &fixture{sim: sim, clock: clock, ts: ts, base: base, client: c}
}

// create makes a machine (not commissioned) and returns its system_id.
func (f *fixture) create(t testing.TB, hostname string, macs ...string) string {
	t.Helper()
	no := false
	m, err := f.client.Machines.Create(&entity.MachineCreateParams{
		Architecture: "amd64/generic", MACAddresses: macs, Hostname: hostname,
		PowerType: "ipmi", Commission: &no,
	}, map[string]any{"power_parameters_power_address": "10.0.0.9", "power_parameters_power_pass": "hunter2"})
	require.NoError(t, err)
	return m.SystemID
}

// ready creates a machine and commissions it to Ready.
func (f *fixture) ready(t testing.TB, hostname string, macs ...string) string {
	t.Helper()
	id := f.create(t, hostname, macs...)
	_, err := f.client.Machine.Commission(id, &entity.MachineCommissionParams{})
	require.NoError(t, err)
	f.clock.Advance(time.Hour)
	f.requireStatus(t, id, maassim.StatusReady)
	return id
}

func (f *fixture) requireStatus(t testing.TB, id string, want maassim.Status) {
	t.Helper()
	m, err := f.client.Machine.Get(id)
	require.NoError(t, err)
	require.Equal(t, int(want), int(m.Status), "status of %s is %q", id, m.StatusName)
	require.Equal(t, want.String(), m.StatusName)
}

// raw sends a signed request with the default key and returns status,
// headers and body.
func (f *fixture) raw(t testing.TB, method, path string, form url.Values) (int, http.Header, string) {
	t.Helper()
	return rawWithAuth(t, method, f.ts.URL+"/MAAS/api/2.0/"+path, form, oauthHeader(maassim.DefaultAPIKey, ""))
}

var nonceSeq atomic.Int64

func oauthHeader(key, nonce string) string {
	parts := strings.Split(key, ":")
	if nonce == "" {
		nonce = "n" + strconv.FormatInt(nonceSeq.Add(1), 10) + strconv.FormatInt(time.Now().UnixNano(), 36)
	}
	return `OAuth realm="", oauth_consumer_key="` + parts[0] + `", oauth_token="` + parts[1] +
		`", oauth_signature_method="PLAINTEXT", oauth_signature="%26` + parts[2] +
		`", oauth_timestamp="` + strconv.FormatInt(time.Now().Unix(), 10) + `", oauth_nonce="` + nonce +
		`", oauth_version="1.0"`
}

func rawWithAuth(t testing.TB, method, u string, form url.Values, auth string) (int, http.Header, string) {
	t.Helper()
	var body io.Reader
	if form != nil && method != http.MethodGet {
		body = strings.NewReader(form.Encode())
	} else if form != nil {
		sep := "?"
		if strings.Contains(u, "?") {
			sep = "&"
		}
		u += sep + form.Encode()
	}
	req, err := http.NewRequest(method, u, body)
	require.NoError(t, err)
	if body != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, resp.Header, string(b)
}
