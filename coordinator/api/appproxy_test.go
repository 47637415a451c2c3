package api

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// wsPair is a real WebSocket connection: the server end (parked in the
// hub as a coordinator would) and the client end (the agent's).
func wsPair(t *testing.T) (server, client *websocket.Conn) {
	t.Helper()
	got := make(chan *websocket.Conn, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		got <- c
		<-r.Context().Done()
	}))
	t.Cleanup(srv.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	client, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http"), nil)
	require.NoError(t, err)
	t.Cleanup(func() { client.CloseNow() })
	return <-got, client
}

func parkPair(t *testing.T, h *appProxyHub, node string) (*parkedConn, *websocket.Conn) {
	t.Helper()
	s, c := wsPair(t)
	p := &parkedConn{conn: s, done: make(chan struct{}), first: make(chan firstMessage, 1), gone: make(chan struct{})}
	require.True(t, h.park(node, p))
	go h.watch(node, p)
	return p, c
}

// A parked connection the agent closes leaves the hub at once; one that
// speaks before it is asked is dropped; a node holds at most
// appProxyMaxParked.
func TestAppProxyHubWatchAndBound(t *testing.T) {
	var h appProxyHub
	p, agent := parkPair(t, &h, "n1")
	_, _ = parkPair(t, &h, "n2")
	assert.Equal(t, 1, h.count("n1"))
	assert.Equal(t, 2, h.total())

	agent.CloseNow() // the agent's last instance stopped
	select {
	case <-p.gone:
	case <-time.After(5 * time.Second):
		t.Fatal("the closed connection stayed parked")
	}
	assert.Equal(t, 0, h.count("n1"))
	assert.Equal(t, 1, h.total())

	p, agent = parkPair(t, &h, "n1")
	require.NoError(t, agent.Write(context.Background(), websocket.MessageText, []byte(`{"instance_id":"x"}`)))
	select {
	case <-p.gone:
	case <-time.After(5 * time.Second):
		t.Fatal("a connection that spoke unasked stayed parked")
	}
	assert.Equal(t, 0, h.count("n1"))

	for range appProxyMaxParked {
		parkPair(t, &h, "n3")
	}
	s, _ := wsPair(t)
	assert.False(t, h.park("n3", &parkedConn{conn: s, done: make(chan struct{}), first: make(chan firstMessage, 1), gone: make(chan struct{})}),
		"over the bound")
	assert.Equal(t, appProxyMaxParked, h.count("n3"))

	// A taken connection's first message is the taker's.
	p, agent = parkPair(t, &h, "n4")
	got, err := h.take(context.Background(), "n4", time.Second)
	require.NoError(t, err)
	require.Same(t, p, got)
	require.NoError(t, agent.Write(context.Background(), websocket.MessageText, []byte(`{"instance_id":"x"}`)))
	select {
	case m := <-p.first:
		require.NoError(t, m.err)
		assert.JSONEq(t, `{"instance_id":"x"}`, string(m.b))
	case <-time.After(5 * time.Second):
		t.Fatal("the taker never got the answer")
	}
	_, err = h.take(context.Background(), "n4", 10*time.Millisecond)
	assert.ErrorContains(t, err, "no workload proxy connection")
}
