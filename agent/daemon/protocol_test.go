package daemon

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/pki"
	"github.com/gpuaas/gpuaas/proto"
)

// enroll enrolls node as an agent does, with a CSR; c.do then presents
// the signed certificate with the returned credential.
func enroll(t *testing.T, c *coord, node, token string) (int, string, proto.EnrollResponse) {
	t.Helper()
	key, csr, err := pki.NewNodeKey(node)
	require.NoError(t, err)
	var r proto.EnrollResponse
	code, body := c.do(http.MethodPost, proto.AgentEnrollPath, "", proto.EnrollRequest{NodeID: node, BootstrapToken: token, Hostname: node, CSR: string(csr)}, &r)
	if code == http.StatusCreated {
		cert, err := pki.KeyPair([]byte(r.Certificate), key)
		require.NoError(t, err)
		c.nodeCert(r.Credential, &cert)
	}
	return code, body, r
}

func TestEnrollmentRefusals(t *testing.T) {
	t.Parallel()
	c := startCoord(t, "j22u15", "j22u11")
	tok := c.mint("j22u15", 0)

	code, body := c.do(http.MethodPost, "/v1/nodes/j22u15/bootstrap-tokens", c.op, nil, nil)
	assert.Equal(t, http.StatusForbidden, code, "minting needs the admin role: %s", body)
	code, body = c.do(http.MethodPost, "/v1/nodes/nope/bootstrap-tokens", c.admin, nil, nil)
	assert.Equal(t, http.StatusNotFound, code, body)

	// Forged and another node's token are refused.
	code, body, _ = enroll(t, c, "j22u15", "gpb_forged")
	assert.Equal(t, http.StatusUnauthorized, code)
	assert.Contains(t, body, "unknown or forged")
	code, body, _ = enroll(t, c, "j22u11", tok)
	assert.Equal(t, http.StatusUnauthorized, code)
	assert.Contains(t, body, "not valid for node j22u11")
	assert.Equal(t, proto.NodeRegistered, c.node("j22u11").State, "a refused enrollment changes nothing")

	code, body, r := enroll(t, c, "j22u15", tok)
	require.Equal(t, http.StatusCreated, code, body)
	assert.NotEmpty(t, r.Credential)
	assert.Equal(t, proto.NodeActive, c.node("j22u15").State, "enrolled node is active")
	cred, ok := c.srv.Enrollment().Credential("j22u15")
	require.True(t, ok)
	assert.NotContains(t, cred.Hash, r.Credential, "only the hash is stored")

	// Reused.
	code, body, _ = enroll(t, c, "j22u15", tok)
	assert.Equal(t, http.StatusUnauthorized, code)
	assert.Contains(t, body, "already used")

	// Expired.
	short := c.mint("j22u11", 1)
	time.Sleep(1100 * time.Millisecond)
	code, body, _ = enroll(t, c, "j22u11", short)
	assert.Equal(t, http.StatusUnauthorized, code)
	assert.Contains(t, body, "expired at")

	// The credential works, and stops working once revoked.
	var hb proto.HeartbeatResponse
	code, body = c.do(http.MethodPost, proto.AgentHeartbeatPath, r.Credential, proto.HeartbeatRequest{}, &hb)
	require.Equal(t, http.StatusOK, code, body)
	assert.Equal(t, "j22u15", hb.NodeID)
	code, body = c.do(http.MethodDelete, "/v1/nodes/j22u15/credential", c.admin, nil, nil)
	require.Equal(t, http.StatusOK, code, body)
	code, body = c.do(http.MethodPost, proto.AgentHeartbeatPath, r.Credential, proto.HeartbeatRequest{}, nil)
	assert.Equal(t, http.StatusUnauthorized, code)
	assert.Contains(t, body, "enroll again")
	code, _ = c.do(http.MethodPost, proto.AgentHeartbeatPath, c.admin, proto.HeartbeatRequest{}, nil)
	assert.Equal(t, http.StatusUnauthorized, code, "an operator token is not a node credential")
}

func TestCredentialScoping(t *testing.T) {
	t.Parallel()
	c := startCoord(t, "j22u15", "j22u11")
	_, _, a := enroll(t, c, "j22u15", c.mint("j22u15", 0))
	_, _, b := enroll(t, c, "j22u11", c.mint("j22u11", 0))

	var task proto.Task
	code, body := c.do(http.MethodPost, "/v1/nodes/j22u15/topology/discover", c.admin, nil, &task)
	require.Equal(t, http.StatusAccepted, code, body)

	// B sees none of A's tasks, cannot update them, cannot report for A.
	var got proto.AgentTasksResponse
	code, body = c.do(http.MethodGet, proto.AgentTasksPath+"?wait=0s", b.Credential, nil, &got)
	require.Equal(t, http.StatusOK, code, body)
	assert.Empty(t, got.Tasks)
	code, body = c.do(http.MethodPost, proto.AgentTasksPath+"/"+task.ID, b.Credential, proto.AgentTaskUpdate{State: proto.TaskSucceeded}, nil)
	assert.Equal(t, http.StatusForbidden, code)
	assert.Contains(t, body, "belongs to node j22u15")
	code, body = c.do(http.MethodPut, proto.AgentTopologyPath, b.Credential, proto.CandidateTopology{NodeID: "j22u15"}, nil)
	assert.Equal(t, http.StatusForbidden, code, body)

	// A sees and completes its task.
	code, body = c.do(http.MethodGet, proto.AgentTasksPath+"?wait=0s", a.Credential, nil, &got)
	require.Equal(t, http.StatusOK, code, body)
	require.Len(t, got.Tasks, 1)
	assert.Equal(t, task.ID, got.Tasks[0].ID)
	code, body = c.do(http.MethodPost, proto.AgentTasksPath+"/"+task.ID, a.Credential, proto.AgentTaskUpdate{State: proto.TaskSucceeded}, nil)
	require.Equal(t, http.StatusOK, code, body)

	// The long-poll waits for a change, then answers with it.
	code, body = c.do(http.MethodGet, proto.AgentTasksPath+"?wait=0s", a.Credential, nil, &got)
	require.Equal(t, http.StatusOK, code, body)
	assert.Empty(t, got.Tasks, "the finished task is no longer pending")
	done := make(chan proto.AgentTasksResponse, 1)
	go func() {
		var r proto.AgentTasksResponse
		c.do(http.MethodGet, proto.AgentTasksPath+"?wait=10s&index="+itoa(got.Index), a.Credential, nil, &r)
		done <- r
	}()
	time.Sleep(200 * time.Millisecond)
	select {
	case <-done:
		t.Fatal("the long-poll answered before anything changed")
	default:
	}
	code, body = c.do(http.MethodPost, "/v1/nodes/j22u15/topology/discover", c.admin, nil, &task)
	require.Equal(t, http.StatusAccepted, code, body)
	select {
	case r := <-done:
		require.Len(t, r.Tasks, 1)
		assert.Equal(t, task.ID, r.Tasks[0].ID)
	case <-time.After(5 * time.Second):
		t.Fatal("the long-poll did not answer the new task")
	}
}

// A refused enrollment ends Run at once with the coordinator's reason
// (the diagnostics server started before it stops too).
func TestRefusedEnrollmentEndsRun(t *testing.T) {
	t.Parallel()
	c := startCoord(t, "j22u15")
	cfg := agentConfig(t, c, "j22u15", hostBase(t, "j22u15"), t.TempDir(), "gpb_forged")
	d, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Close() })
	done := make(chan error, 1)
	go func() { done <- d.Run(context.Background()) }()
	select {
	case err := <-done:
		require.Error(t, err)
		assert.Contains(t, err.Error(), "unknown or forged")
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after the coordinator refused the token")
	}
	assert.Equal(t, proto.NodeRegistered, c.node("j22u15").State)
}
