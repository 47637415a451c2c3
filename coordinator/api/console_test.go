package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/agent/console"
	"github.com/gpuaas/gpuaas/proto"
)

func activeSlice(t *testing.T, e *env) proto.Allocation {
	t.Helper()
	e.seedLab()
	a := e.mustCreate("console-1", 1)
	for _, to := range []proto.AllocState{proto.AllocProvisioning, proto.AllocActive} {
		e.apply(proto.AllocationTransitionType, proto.AllocationTransitionRequest{At: time.Now().UTC(), AllocationID: a.ID, To: to})
	}
	return a
}

func TestConsoleRefusals(t *testing.T) {
	e := newEnv(t)
	a := activeSlice(t, e)
	base := "/v1/allocations/" + a.ID + "/console"
	for name, tc := range map[string]struct {
		role   Role
		path   string
		status int
		code   proto.Code
	}{
		"not the owner":             {RoleViewer, base, http.StatusForbidden, proto.CodeForbidden},
		"admin without a reason":    {RoleAdmin, base, http.StatusBadRequest, proto.CodeInvalidArgument},
		"owner, not a WebSocket":    {RoleOperator, base, http.StatusBadRequest, proto.CodeInvalidArgument},
		"unknown parameter":         {RoleOperator, base + "?shell=1", http.StatusBadRequest, proto.CodeInvalidArgument},
		"bad read_only":             {RoleOperator, base + "?read_only=maybe", http.StatusBadRequest, proto.CodeInvalidArgument},
		"unknown allocation":        {RoleOperator, "/v1/allocations/nope/console", http.StatusNotFound, proto.CodeNotFound},
		"no token":                  {0, base, http.StatusUnauthorized, proto.CodeUnauthenticated},
		"sessions of another's":     {RoleViewer, base + "/sessions", http.StatusForbidden, proto.CodeForbidden},
		"transcript by the owner":   {RoleOperator, base + "/sessions/con-1/transcript?reason=x", http.StatusForbidden, proto.CodeForbidden},
		"transcript without reason": {RoleAdmin, base + "/sessions/con-1/transcript", http.StatusBadRequest, proto.CodeInvalidArgument},
		"transcript of no session":  {RoleAdmin, base + "/sessions/con-1/transcript?reason=audit", http.StatusNotFound, proto.CodeNotFound},
	} {
		t.Run(name, func(t *testing.T) {
			e.do(tc.role, http.MethodGet, tc.path, nil).requireProblem(t, tc.status, tc.code)
		})
	}
	r := e.do(RoleOperator, http.MethodGet, base+"/sessions", nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	var list proto.ConsoleSessionList
	r.decode(t, &list)
	assert.Empty(t, list.Sessions, "a refused request records nothing")
}

// An agent that never dials back: the user gets 503 naming it, and the
// session's record is closed failed.
func TestConsoleAgentNeverAnswers(t *testing.T) {
	e := newEnv(t)
	a := activeSlice(t, e)
	e.api.consoles.wait = 300 * time.Millisecond
	u, err := url.Parse(e.url + "/v1/allocations/" + a.ID + "/console")
	require.NoError(t, err)
	h := http.Header{}
	h.Set("Authorization", "Bearer "+e.tok[RoleOperator])
	_, resp, err := websocket.Dial(context.Background(), u.String(), &websocket.DialOptions{HTTPHeader: h})
	require.Error(t, err)
	require.NotNil(t, resp)
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	r := e.do(RoleOperator, http.MethodGet, "/v1/allocations/"+a.ID+"/console/sessions", nil)
	var list proto.ConsoleSessionList
	r.decode(t, &list)
	require.Len(t, list.Sessions, 1)
	s := list.Sessions[0]
	assert.Equal(t, proto.TaskFailed, s.State)
	assert.Contains(t, s.Error, "did not dial back")
	assert.Equal(t, "operator-user", s.Session.User)
	assert.NotEmpty(t, s.Session.RemoteAddr)
	require.NotNil(t, s.Result)
	assert.Empty(t, s.Result.Mode, "never attached")
}

// A session record no gateway holds any more is closed by the leader's
// sweep; one it holds is left alone.
func TestConsoleOrphanSweep(t *testing.T) {
	e := newEnv(t)
	a := activeSlice(t, e)
	open := func(id string) {
		e.apply(proto.ConsoleSessionOpenType, proto.ConsoleSessionOpenRequest{At: time.Now().UTC(), Session: proto.ConsoleSession{
			ID: id, AllocationID: a.ID, NodeID: a.NodeID, Kind: proto.TaskConsoleSession, User: a.Owner, Gateway: "127.0.0.1:1", OpenedAt: time.Now().UTC()}})
	}
	open("con-orphan")
	open("con-held")
	e.api.consoles.mu.Lock()
	e.api.consoles.pending = map[string]*pendingConsole{"con-held": {node: a.NodeID}}
	e.api.consoles.mu.Unlock()
	assert.Zero(t, e.api.closeOrphanedConsoles(context.Background(), time.Hour), "younger than the grace")
	assert.Equal(t, 1, e.api.closeOrphanedConsoles(context.Background(), 0))
	snap := e.b.Store().Snapshot()
	orphan, _ := snap.Task("con-orphan")
	held, _ := snap.Task("con-held")
	assert.Equal(t, proto.TaskFailed, orphan.State)
	assert.Contains(t, orphan.Error, "stopped or lost the leadership")
	var res proto.ConsoleSessionResult
	require.NoError(t, json.Unmarshal(orphan.Result, &res))
	assert.Equal(t, "gateway gone", res.Closed)
	assert.Equal(t, proto.TaskRunning, held.State)
}

// echoConsole is a console whose guest echoes what is typed, upper-cased.
type echoConsole struct {
	r *io.PipeReader
	w *io.PipeWriter
}

func newEchoConsole() *echoConsole {
	r, w := io.Pipe()
	return &echoConsole{r: r, w: w}
}

func (c *echoConsole) Read(p []byte) (int, error) { return c.r.Read(p) }
func (c *echoConsole) Write(p []byte) (int, error) {
	go c.w.Write(bytes.ToUpper(p))
	return len(p), nil
}
func (c *echoConsole) Close() error { return c.r.Close() }

type echoOpener struct{}

func (echoOpener) OpenConsole(context.Context, string) (io.ReadWriteCloser, error) {
	return newEchoConsole(), nil
}

// The whole gateway in one process: a real single-node coordinator, an
// enrolled agent client that picks the session up and dials back with
// agent/console, a user's WebSocket; bytes both ways are counted, a
// second user is read-only, the agent cannot write the record, and the
// release of the allocation closes the session.
func TestConsoleGatewaySplice(t *testing.T) {
	e := newSliceEnv(t)
	a := e.place(1)
	e.provisionToActive(a)
	node := a.NodeID
	ag := e.agents[node]
	mgr := console.NewManager(console.Options{Opener: echoOpener{}, Dir: t.TempDir()})
	defer mgr.Close()
	served := make(chan error, 4)
	go func() { // the agent's console loop, reduced
		seen := map[string]bool{}
		for e.ctx.Err() == nil {
			r, err := ag.Tasks(e.ctx, 0, 0)
			if err != nil {
				continue
			}
			for _, tk := range r.Tasks {
				if !proto.IsConsoleTask(tk.Type) || seen[tk.ID] {
					continue
				}
				seen[tk.ID] = true
				var s proto.ConsoleSession
				if err := json.Unmarshal(tk.Payload, &s); err != nil {
					served <- err
					continue
				}
				go func() {
					conn, err := ag.DialConsole(e.ctx, s.Gateway, s.ID)
					if err != nil {
						served <- err
						return
					}
					att, err := mgr.Attach(e.ctx, s.AllocationID, s.ID, !s.ReadOnly)
					if err != nil {
						served <- err
						return
					}
					served <- console.Serve(e.ctx, conn, att)
				}()
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	dial := func(role Role, q string) *websocket.Conn {
		h := http.Header{}
		h.Set("Authorization", "Bearer "+e.tok[role])
		c, _, err := websocket.Dial(e.ctx, e.url+"/v1/allocations/"+a.ID+"/console"+q, &websocket.DialOptions{HTTPHeader: h})
		require.NoError(t, err)
		return c
	}
	control := func(c *websocket.Conn) proto.ConsoleControl {
		typ, b, err := c.Read(e.ctx)
		require.NoError(t, err)
		require.Equal(t, websocket.MessageText, typ, "%s", b)
		var ctl proto.ConsoleControl
		require.NoError(t, json.Unmarshal(b, &ctl))
		return ctl
	}
	owner := dial(RoleOperator, "")
	ctl := control(owner)
	assert.Equal(t, "attached", ctl.Type)
	assert.Equal(t, proto.ConsoleReadWrite, ctl.Mode)
	watcher := dial(RoleAdmin, "?reason=support+ticket+9")
	assert.Equal(t, proto.ConsoleReadOnly, control(watcher).Mode)

	require.NoError(t, owner.Write(e.ctx, websocket.MessageBinary, []byte("hello\n")))
	for _, c := range []*websocket.Conn{owner, watcher} {
		typ, b, err := c.Read(e.ctx)
		require.NoError(t, err)
		assert.Equal(t, websocket.MessageBinary, typ)
		assert.Equal(t, "HELLO\n", string(b))
	}

	// The agent may not write a session's record.
	var sid string
	for _, tk := range e.snap().Tasks("", a.ID, "", 0) {
		if tk.Type == proto.TaskConsoleSession {
			sid = tk.ID
		}
	}
	require.NotEmpty(t, sid)
	err := e.report(node, sid, proto.AgentTaskUpdate{State: proto.TaskSucceeded})
	require.Error(t, err)
	assert.Equal(t, proto.CodeForbidden, proto.CodeOf(err))

	// Release closes both sessions and records them.
	r := e.do(RoleOperator, http.MethodPost, "/v1/allocations/"+a.ID+"/release", nil)
	require.Equal(t, http.StatusAccepted, r.status, "%s", r.body)
	for _, c := range []*websocket.Conn{owner, watcher} {
		ctl := control(c)
		assert.Equal(t, "closed", ctl.Type)
		assert.Contains(t, ctl.Reason, "allocation released")
		_, _, err := c.Read(e.ctx)
		assert.Equal(t, websocket.StatusNormalClosure, websocket.CloseStatus(err), "%v", err)
	}
	var list proto.ConsoleSessionList
	require.Eventually(t, func() bool {
		r := e.do(RoleAdmin, http.MethodGet, "/v1/allocations/"+a.ID+"/console/sessions", nil)
		list = proto.ConsoleSessionList{}
		r.decode(t, &list)
		for _, s := range list.Sessions {
			if s.Result == nil {
				return false
			}
		}
		return len(list.Sessions) == 2
	}, 10*time.Second, 20*time.Millisecond)
	// The hash-chained audit log has each session's open and close.
	var opens, closes int
	for _, rec := range e.auditList("kind=console_session") {
		require.Equal(t, "/v1/allocations/{id}/console", rec.Route)
		assert.Equal(t, "/v1/allocations/"+a.ID+"/console", rec.Path)
		var body struct {
			Session proto.ConsoleSession        `json:"session"`
			Result  *proto.ConsoleSessionResult `json:"result"`
		}
		require.NoError(t, json.Unmarshal(rec.After, &body))
		assert.Equal(t, body.Session.User, rec.Actor)
		assert.Equal(t, body.Session.ID, rec.ObjectID)
		assert.Equal(t, body.Session.RemoteAddr, rec.Remote)
		if body.Result == nil {
			opens++
			assert.Equal(t, http.StatusSwitchingProtocols, rec.Status)
		} else {
			closes++
			assert.Contains(t, body.Result.Closed, "allocation released")
		}
		wantTok := tokenID(e.tok[RoleOperator])
		if rec.Actor == "admin-user" {
			assert.Equal(t, "support ticket 9", rec.Reason)
			wantTok = tokenID(e.tok[RoleAdmin])
		}
		assert.Equal(t, wantTok, rec.TokenID, "the record names the token that opened the session")
	}
	assert.Equal(t, 2, opens)
	assert.Equal(t, 2, closes)
	v := e.do(RoleAdmin, http.MethodGet, "/v1/audit/verify", nil)
	require.Equal(t, http.StatusOK, v.status, "%s", v.body)
	assert.Contains(t, string(v.body), `"ok":true`)

	for _, s := range list.Sessions {
		assert.Equal(t, proto.TaskSucceeded, s.State)
		assert.Contains(t, s.Result.Closed, "allocation released")
		if s.Session.Admin {
			assert.Equal(t, proto.ConsoleReadOnly, s.Result.Mode)
			assert.Zero(t, s.Result.BytesIn)
			assert.Equal(t, "support ticket 9", s.Session.Reason)
		} else {
			assert.Equal(t, proto.ConsoleReadWrite, s.Result.Mode)
			assert.Equal(t, int64(len("hello\n")), s.Result.BytesIn)
		}
		assert.Equal(t, int64(len("HELLO\n")), s.Result.BytesOut)
	}
}

// TestConsoleThroughFollowerOutlivesRouteDeadline: a follower relays a
// console upgrade to the leader; the route deadline bounds the wait for
// the leader's answer, not the session (it used to cut every console
// reached through a follower after proto.MaxRequestTime).
func TestConsoleThroughFollowerOutlivesRouteDeadline(t *testing.T) {
	old := maxRequestTime
	maxRequestTime = 300 * time.Millisecond
	t.Cleanup(func() { maxRequestTime = old })

	// The "leader": a console gateway reduced to an echo.
	leader := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		for {
			typ, b, err := c.Read(context.Background())
			if err != nil {
				return
			}
			if err := c.Write(context.Background(), typ, b); err != nil {
				return
			}
		}
	}))
	t.Cleanup(leader.Close)

	e := newEnv(t)
	a := activeSlice(t, e)
	e.lb.setFollower(strings.TrimPrefix(leader.URL, "http://"))

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h := http.Header{}
	h.Set("Authorization", "Bearer "+e.tok[RoleOperator])
	c, _, err := websocket.Dial(ctx, e.url+"/v1/allocations/"+a.ID+"/console", &websocket.DialOptions{HTTPHeader: h})
	require.NoError(t, err)
	defer c.CloseNow()
	end := time.Now().Add(4 * maxRequestTime)
	for i := 0; time.Now().Before(end); i++ {
		msg := []byte(fmt.Sprintf("line %d", i))
		require.NoError(t, c.Write(ctx, websocket.MessageBinary, msg), "after %d lines", i)
		_, b, err := c.Read(ctx)
		require.NoError(t, err, "the session through the follower died after %d lines", i)
		assert.Equal(t, msg, b)
		time.Sleep(50 * time.Millisecond)
	}
}
