package api

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

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
