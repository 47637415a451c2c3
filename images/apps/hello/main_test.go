package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/require"
)

func TestHelloRoutes(t *testing.T) {
	t.Setenv("GPUAAS_INSTANCE", "inst-1")
	srv := httptest.NewServer(handler())
	defer srv.Close()
	get := func(path string) (int, string) {
		resp, err := http.Get(srv.URL + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b)
	}
	code, body := get("/healthz")
	require.Equal(t, 200, code)
	require.Equal(t, "ok\n", body)
	code, body = get("/")
	require.Equal(t, 200, code)
	require.Contains(t, body, "inst-1")
	code, _ = get("/nope")
	require.Equal(t, 404, code)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http")+"/ws", nil)
	require.NoError(t, err)
	defer c.CloseNow()
	require.NoError(t, c.Write(ctx, websocket.MessageText, []byte("ping 1")))
	typ, msg, err := c.Read(ctx)
	require.NoError(t, err)
	require.Equal(t, websocket.MessageText, typ)
	require.Equal(t, "ping 1", string(msg))
}
