package api

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"testing"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A WebSocket the workload proxy relays is answered 101 by
// ReverseProxy on the hijacked connection, never through WriteHeader:
// the session's audit record must say 101, not the 502 of "no status".
func TestAppProxyStatusOfUpgrade(t *testing.T) {
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		typ, b, err := c.Read(r.Context())
		if err != nil {
			return
		}
		_ = c.Write(r.Context(), typ, b)
		c.Close(websocket.StatusNormalClosure, "done")
	}))
	t.Cleanup(app.Close)
	target, err := url.Parse(app.URL)
	require.NoError(t, err)
	status := make(chan int, 1)
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := &statusCapture{ResponseWriter: w}
		httputil.NewSingleHostReverseProxy(target).ServeHTTP(sw, r)
		status <- sw.status
	}))
	t.Cleanup(gw.Close)

	ctx := context.Background()
	c, _, err := websocket.Dial(ctx, gw.URL, nil)
	require.NoError(t, err)
	defer c.CloseNow()
	require.NoError(t, c.Write(ctx, websocket.MessageText, []byte("echo")))
	_, b, err := c.Read(ctx)
	require.NoError(t, err)
	assert.Equal(t, "echo", string(b))
	c.Close(websocket.StatusNormalClosure, "")
	assert.Equal(t, http.StatusSwitchingProtocols, <-status)
}

// App routes name the app version they act on, as image routes do.
func TestAuditObjectOfAppRoutes(t *testing.T) {
	for _, tc := range []struct {
		pattern, path, kind, id string
	}{
		{"/v1/apps/{name}/{version}", "/v1/apps/jupyter/1.2.0", "app", "jupyter/1.2.0"},
		{"/v1/apps/{name}/{version}/approve", "/v1/apps/jupyter/1.2.0/approve", "app", "jupyter/1.2.0"},
		{"/v1/apps/{name}/{version}/blob", "/v1/apps/jupyter/1.2.0/blob", "app", "jupyter/1.2.0"},
		{"/v1/images/{name}/{version}", "/v1/images/ubuntu/24.04", "image", "ubuntu/24.04"},
	} {
		mux := http.NewServeMux()
		var kind, id string
		mux.HandleFunc(tc.pattern, func(_ http.ResponseWriter, r *http.Request) { kind, id = auditObject(tc.pattern, r) })
		mux.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, tc.path, nil))
		assert.Equal(t, tc.kind, kind, tc.pattern)
		assert.Equal(t, tc.id, id, tc.pattern)
	}
}

// requestTokenID names the bearer token of records written outside the
// route middleware (proxy and console sessions).
func TestRequestTokenID(t *testing.T) {
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	assert.Empty(t, requestTokenID(r))
	r.Header.Set("Authorization", "Bearer s3cret")
	assert.Equal(t, tokenID("s3cret"), requestTokenID(r))
	assert.Len(t, requestTokenID(r), 12)
}
