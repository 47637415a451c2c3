package client

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
)

// TestGetBlob: the blob download skips a dead coordinator and one that
// lacks the blob, sends the credential and the Range, and hands back the
// streaming 206; a refusal other than 404/503 is returned at once.
func TestGetBlob(t *testing.T) {
	t.Parallel()
	data := bytes.Repeat([]byte("0123456789"), 1000)
	lacking := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		problem(w, http.StatusNotFound, proto.CodeNotFound, "blob is on no coordinator")
	}))
	t.Cleanup(lacking.Close)
	var gotAuth, gotRange string
	has := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotAuth, gotRange = r.Header.Get("Authorization"), r.Header.Get("Range")
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(data))
	}))
	t.Cleanup(has.Close)
	c, err := New([]string{deadURL(t), lacking.URL, has.URL}, "gpn_cred")
	require.NoError(t, err)
	resp, err := c.GetBlob(context.Background(), "/v1/images/base/1/blob", 9000)
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.Equal(t, http.StatusPartialContent, resp.StatusCode)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	assert.Equal(t, data[9000:], b)
	assert.Equal(t, "Bearer gpn_cred", gotAuth)
	assert.Equal(t, "bytes=9000-", gotRange)

	forbidden := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		problem(w, http.StatusConflict, proto.CodeIllegalTransition, "image base:1 is revoked")
	}))
	t.Cleanup(forbidden.Close)
	c2, err := New([]string{forbidden.URL, has.URL}, "gpn_cred")
	require.NoError(t, err)
	_, err = c2.GetBlob(context.Background(), "/v1/images/base/1/blob", 0)
	require.Error(t, err)
	assert.Equal(t, proto.CodeIllegalTransition, proto.CodeOf(err))
	assert.Contains(t, err.Error(), "revoked")

	for _, bad := range []string{"http://elsewhere/x", "/v1/images/../../etc/passwd", "/v1/images/x?y=1"} {
		_, err := c.GetBlob(context.Background(), bad, 0)
		assert.Error(t, err, bad)
	}
}
