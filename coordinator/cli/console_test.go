package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
)

// fakeGateway is a console gateway: it checks the token and query, says
// attached, echoes what it gets upper-cased and records it.
type fakeGateway struct {
	mu    sync.Mutex
	typed bytes.Buffer
	query string
	done  chan struct{}
}

func (g *fakeGateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Authorization") != "Bearer tok" {
		w.Header().Set("Content-Type", proto.ProblemContentType)
		w.WriteHeader(http.StatusForbidden)
		p := proto.ProblemFor(proto.CodeForbidden, "not the owner")
		_ = json.NewEncoder(w).Encode(p)
		return
	}
	g.mu.Lock()
	g.query = r.URL.RawQuery
	g.mu.Unlock()
	c, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	defer close(g.done)
	ctx := context.Background()
	ctl, _ := json.Marshal(proto.ConsoleControl{Type: "attached", Session: "con-1", Mode: proto.ConsoleReadOnly})
	_ = c.Write(ctx, websocket.MessageText, ctl)
	for {
		typ, b, err := c.Read(ctx)
		if err != nil {
			return
		}
		if typ == websocket.MessageBinary {
			g.mu.Lock()
			g.typed.Write(b)
			g.mu.Unlock()
			_ = c.Write(ctx, websocket.MessageBinary, bytes.ToUpper(b))
		}
	}
}

// slowReader hands out its chunks one per Read, a moment apart (a user
// typing).
type slowReader struct{ chunks []string }

func (s *slowReader) Read(p []byte) (int, error) {
	if len(s.chunks) == 0 {
		select {} // a terminal that stays open
	}
	time.Sleep(100 * time.Millisecond)
	n := copy(p, s.chunks[0])
	s.chunks = s.chunks[1:]
	return n, nil
}

func TestAllocConsole(t *testing.T) {
	g := &fakeGateway{done: make(chan struct{})}
	srv := httptest.NewServer(g)
	defer srv.Close()
	env := map[string]string{"GPUAAS_ADDR": srv.URL, "GPUAAS_TOKEN": "tok"}
	var out, errOut bytes.Buffer
	in := &slowReader{chunks: []string{"ls\n", "abc" + string(rune(ConsoleEscape)) + "never sent"}}
	code := RunWithStdin(context.Background(), []string{"alloc", "console", "a-1", "--read-only", "--reason", "look"}, in, &out, &errOut,
		func(k string) string { return env[k] }, nil)
	require.Equal(t, ExitOK, code, "stderr: %s", errOut.String())
	select {
	case <-g.done:
	case <-time.After(5 * time.Second):
		t.Fatal("the gateway's connection did not end")
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	assert.Equal(t, "ls\nabc", g.typed.String(), "everything typed before Ctrl-], nothing after")
	assert.Equal(t, "read_only=true&reason=look", g.query)
	assert.Contains(t, out.String(), "LS\n")
	assert.Contains(t, errOut.String(), "read-only, session con-1")
	assert.Contains(t, errOut.String(), "left with Ctrl-]")

	// A refusal is the gateway's problem, rendered like any API error.
	out.Reset()
	errOut.Reset()
	env["GPUAAS_TOKEN"] = "wrong"
	code = RunWithStdin(context.Background(), []string{"alloc", "console", "a-1"}, strings.NewReader(""), &out, &errOut,
		func(k string) string { return env[k] }, nil)
	assert.Equal(t, ExitError, code)
	assert.Contains(t, errOut.String(), "not the owner")
	assert.Contains(t, errOut.String(), "forbidden")
}

// A read-only watch needs no input: with stdin at its end at once (a
// pipe, </dev/null) it keeps printing what the console writes until the
// session ends, instead of leaving on "end of input".
func TestAllocConsoleReadOnlyWatchesWithoutInput(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		ctx := r.Context()
		ctl, _ := json.Marshal(proto.ConsoleControl{Type: "attached", Session: "con-2", Mode: proto.ConsoleReadOnly})
		_ = c.Write(ctx, websocket.MessageText, ctl)
		time.Sleep(300 * time.Millisecond) // the guest writes later
		_ = c.Write(ctx, websocket.MessageBinary, []byte("login: "))
		closed, _ := json.Marshal(proto.ConsoleControl{Type: "closed", Reason: "idle"})
		_ = c.Write(ctx, websocket.MessageText, closed)
		_ = c.Close(websocket.StatusNormalClosure, "idle")
	}))
	defer srv.Close()
	env := map[string]string{"GPUAAS_ADDR": srv.URL, "GPUAAS_TOKEN": "tok"}
	var out, errOut bytes.Buffer
	code := RunWithStdin(context.Background(), []string{"alloc", "console", "a-1", "--read-only"}, strings.NewReader(""), &out, &errOut,
		func(k string) string { return env[k] }, nil)
	require.Equal(t, ExitOK, code, "stderr: %s", errOut.String())
	assert.Equal(t, "login: ", out.String(), "what the console wrote after stdin ended")
	assert.Contains(t, errOut.String(), "read-only, session con-2")
	assert.Contains(t, errOut.String(), "console closed: idle")
	assert.NotContains(t, errOut.String(), "end of input")
}
