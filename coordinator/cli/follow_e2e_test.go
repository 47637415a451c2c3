package cli

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/agent/client"
	"github.com/gpuaas/gpuaas/coordinator/api"
	"github.com/gpuaas/gpuaas/coordinator/pki"
	"github.com/gpuaas/gpuaas/proto"
)

// testAgent drives the slice runtime protocol over HTTP for one node,
// with a credential enrolled through a real bootstrap token.
type testAgent struct {
	t    testing.TB
	node string
	cl   *client.Client
	ctx  context.Context
}

func (c *coord) enrollAgent(ctx context.Context, node string) *testAgent {
	c.t.Helper()
	req, err := http.NewRequest(http.MethodPost, "https://"+c.addr+"/v1/nodes/"+node+"/bootstrap-tokens", nil)
	require.NoError(c.t, err)
	req.Header.Set("Authorization", "Bearer "+c.tok[api.RoleAdmin])
	hc, err := HTTPClient(c.caFile)
	require.NoError(c.t, err)
	res, err := hc.Do(req)
	require.NoError(c.t, err)
	defer res.Body.Close()
	require.Equal(c.t, http.StatusCreated, res.StatusCode)
	var tok proto.BootstrapTokenResponse
	require.NoError(c.t, json.NewDecoder(res.Body).Decode(&tok))
	// The agent's side of mutual TLS: a CSR at enrollment, the signed
	// certificate presented on every node route.
	cl, err := client.New([]string{"https://" + c.addr}, "")
	require.NoError(c.t, err)
	cl.UseTLS(c.ca.Pool())
	key, csr, err := pki.NewNodeKey(node)
	require.NoError(c.t, err)
	resp, err := cl.EnrollCSR(ctx, node, tok.Token, node, string(csr))
	require.NoError(c.t, err)
	cert, err := pki.KeyPair([]byte(resp.Certificate), key)
	require.NoError(c.t, err)
	cl.SetCertificate(&cert)
	return &testAgent{t: c.t, node: node, cl: cl, ctx: ctx}
}

// next waits for a pending task of typ on any of the agents.
func nextTask(t testing.TB, agents []*testAgent, typ string, skip map[string]bool) (*testAgent, proto.Task) {
	t.Helper()
	var who *testAgent
	var found proto.Task
	require.Eventually(t, func() bool {
		for _, ag := range agents {
			r, err := ag.cl.Tasks(ag.ctx, 0, 0)
			if err != nil {
				t.Logf("tasks of %s: %v", ag.node, err)
				continue
			}
			for _, tk := range r.Tasks {
				if tk.Type == typ && !skip[tk.ID] {
					who, found = ag, tk
					return true
				}
			}
		}
		return false
	}, 20*time.Second, 20*time.Millisecond, "no %s task", typ)
	skip[found.ID] = true
	return who, found
}

func (ag *testAgent) send(id string, u proto.AgentTaskUpdate) {
	ag.t.Helper()
	require.NoError(ag.t, ag.cl.UpdateTask(ag.ctx, id, u))
}

func (ag *testAgent) stage(id, stage string, pause time.Duration) {
	ag.send(id, proto.AgentTaskUpdate{State: proto.TaskRunning, Event: &proto.StageEvent{Stage: stage, Status: "started"}})
	if stage == proto.StageClone {
		for done := int64(0); done <= 32<<20; done += 8 << 20 {
			ag.send(id, proto.AgentTaskUpdate{State: proto.TaskRunning, Done: done, Total: 32 << 20})
			time.Sleep(pause)
		}
	}
	ag.send(id, proto.AgentTaskUpdate{State: proto.TaskRunning, Event: &proto.StageEvent{Stage: stage, Status: "succeeded"}})
}

// runAsync runs gpuaasctl in the background.
func (c *coord) runAsync(role api.Role, args ...string) <-chan result {
	ch := make(chan result, 1)
	go func() { ch <- c.run(role, args...) }()
	return ch
}

func wait(t testing.TB, ch <-chan result) result {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(60 * time.Second):
		require.FailNow(t, "gpuaasctl did not finish")
		return result{}
	}
}

// The real CLI follows real allocations on a real coordinator while an
// in-test agent drives the slice runtime protocol over HTTP.
func TestCLIFollowsTheSliceRuntime(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	agents := []*testAgent{c.enrollAgent(ctx, "us-east-n0000"), c.enrollAgent(ctx, "us-east-n0001")}
	seen := map[string]bool{}

	// A provision to active: stage lines, clone progress, SSH command.
	done := c.runAsync(api.RoleOperator, "alloc", "create", "--gpus", "1", "--region", "us-east", "--wait")
	ag, task := nextTask(t, agents, proto.TaskSliceProvision, seen)
	var p proto.AllocationTaskPayload
	require.NoError(t, json.Unmarshal(task.Payload, &p))
	for _, st := range proto.SliceStages {
		ag.stage(task.ID, st, 150*time.Millisecond)
	}
	res := proto.SliceProvisionResult{AllocationID: task.AllocationID,
		Access: &proto.SliceAccess{GuestIP: "192.168.122.10", GuestMAC: "52:54:00:aa:00:01", JumpHost: "10.0.0.15", User: "root"},
		Slots:  []proto.SlotReadiness{{SlotID: p.Slots[0], HealthState: "ready", Evidence: []string{"ssh ok"}}}}
	b, err := json.Marshal(res)
	require.NoError(t, err)
	ag.send(task.ID, proto.AgentTaskUpdate{State: proto.TaskSucceeded, Result: b})
	r := wait(t, done).ok(t)
	t.Logf("alloc create --wait:\n%s", r.out)
	var order []int
	for _, st := range proto.SliceStages {
		i := strings.Index(r.out, "\n"+st+" ")
		require.GreaterOrEqual(t, i, 0, "stage %s line in:\n%s", st, r.out)
		order = append(order, i)
	}
	assert.IsIncreasing(t, order, "stages in order")
	assert.Regexp(t, `(?m)^clone +\d+\.\d MiB / 32\.0 MiB \(`, r.out, "plain progress lines off a terminal")
	assert.Regexp(t, `(?m)^clone +succeeded +\d`, r.out, "the clone line has its duration")
	assert.Contains(t, r.out, "ssh: ssh -J root@10.0.0.15 root@192.168.122.10")
	assert.Contains(t, r.out, "is active after")

	r = c.run(api.RoleViewer, "alloc", "timeline", task.AllocationID).ok(t)
	assert.Contains(t, r.out, "DURATION")
	assert.Regexp(t, `clone +succeeded +\d`, r.out)
	requireAligned(t, r.out)
	r = c.run(api.RoleViewer, "alloc", "show", task.AllocationID).ok(t)
	assert.Equal(t, "ssh -J root@10.0.0.15 root@192.168.122.10", field(t, r.out, "SSH"))

	// A failure: the failed stage and reason, exit 1.
	done = c.runAsync(api.RoleOperator, "alloc", "create", "--gpus", "1", "--region", "us-east", "--wait")
	ag, task = nextTask(t, agents, proto.TaskSliceProvision, seen)
	require.NoError(t, json.Unmarshal(task.Payload, &p))
	ag.stage(task.ID, proto.StagePlan, 0)
	ag.send(task.ID, proto.AgentTaskUpdate{State: proto.TaskRunning, Event: &proto.StageEvent{Stage: proto.StageClone, Status: "started"}})
	ag.send(task.ID, proto.AgentTaskUpdate{State: proto.TaskRunning, Event: &proto.StageEvent{Stage: proto.StageClone, Status: "failed", Message: "short write"}})
	b, err = json.Marshal(proto.SliceProvisionResult{AllocationID: task.AllocationID, FailedStage: proto.StageClone, TouchedSlots: p.Slots})
	require.NoError(t, err)
	ag.send(task.ID, proto.AgentTaskUpdate{State: proto.TaskFailed, Error: "short write on /dev/nvme1n1", Result: b})
	r = wait(t, done)
	assert.Equal(t, ExitError, r.code, "stdout: %s\nstderr: %s", r.out, r.err)
	assert.Contains(t, r.err, "failed at stage clone: stage clone failed: short write on /dev/nvme1n1")
	assert.Regexp(t, `(?m)^clone +failed `, r.out)

	// The blocked slot: an operator cleanup followed to its proof.
	blocked := p.Slots[0]
	r = c.run(api.RoleViewer, "slot", "show", blocked).ok(t)
	assert.Equal(t, "cleanup_blocked", field(t, r.out, "Status"))
	r = c.run(api.RoleOperator, "slot", "cleanup", blocked)
	assert.Equal(t, ExitError, r.code, "operator may not: %s", r.err)
	done = c.runAsync(api.RoleAdmin, "slot", "cleanup", blocked, "--wait", "--idempotency-key", "fix-1")
	ag, ct := nextTask(t, agents, proto.TaskSlotCleanup, seen)
	ag.send(ct.ID, proto.AgentTaskUpdate{State: proto.TaskRunning, Done: 1 << 20, Total: 4 << 20})
	time.Sleep(200 * time.Millisecond)
	proof := proto.WipeProof{Method: "zero", Bytes: 4 << 20, DurationMS: 20, Samples: 16, SampleDigest: "sha256:00", VerifiedAt: time.Now().UTC()}
	b, err = json.Marshal(proto.SlotCleanupResult{SlotID: blocked, Proof: proof})
	require.NoError(t, err)
	ag.send(ct.ID, proto.AgentTaskUpdate{State: proto.TaskSucceeded, Result: b})
	r = wait(t, done).ok(t)
	assert.Equal(t, "available", field(t, r.out, "Status"))
	assert.Contains(t, field(t, r.out, "Wipe proof"), "zero")
	// The key again: the task it created, not a new one.
	r = c.run(api.RoleAdmin, "slot", "cleanup", blocked, "--idempotency-key", "fix-1").ok(t)
	assert.Equal(t, ct.ID, field(t, r.out, "ID"))
	assert.Equal(t, "succeeded", field(t, r.out, "State"))
}
