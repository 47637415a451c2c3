package chaos

import (
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/agent/slice"
	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/test/testenv"
)

var (
	agentOnce sync.Once
	agentBin  string
	agentErr  error
)

// labAgent builds gpuaas-lab-agent once per test process (only the
// workflow tests need it).
func labAgent(t *testing.T) string {
	t.Helper()
	agentOnce.Do(func() { agentBin, agentErr = BuildAgent(binDir) })
	require.NoError(t, agentErr)
	return agentBin
}

// wfFaults picks a run's faults: one MAAS API fault, one MAAS deploy
// fault, the simulator's restart, an agent kill -9 mid-provisioning and a
// leader kill -9 (mid-workflow when one runs), shuffled.
func wfFaults(rng *rand.Rand) []string {
	fs := []string{
		[]string{MAASAPIErrors, MAASAcceptedTimeout}[rng.IntN(2)],
		[]string{MAASDeployFail, MAASDeployStuck, MAASDeployLost, MAASEraseFail}[rng.IntN(4)],
		MAASRestart, AgentKill, KillLeader,
	}
	rng.Shuffle(len(fs), func(i, j int) { fs[i], fs[j] = fs[j], fs[i] })
	if v := os.Getenv("GPUAAS_CHAOS_WF_FAULTS"); v != "" {
		fs = strings.Split(v, ",")
	}
	return fs
}

// TestPrivilegedChaosWorkflows is one randomized short run of the
// workflow rig: three coordinators, the slice host's and the baremetal
// host's real agents, the MAAS simulator; four clients creating slice
// and baremetal allocations, following them to active, releasing them;
// the nemesis injects MAAS faults, restarts the simulator, kills the
// agent mid-provisioning and the leader mid-workflow. Every allocation
// and workflow must end within its bound, every allocation's history
// must linearize (LifecycleModel), and the log replay must find no
// double claim and no lost acknowledgement. make soak WORKFLOWS=1 runs
// it RUNS times beside TestPrivilegedChaos.
func TestPrivilegedChaosWorkflows(t *testing.T) {
	testenv.Root(t)
	soakDeadline(t)
	t.Parallel()
	s := seed(t)
	rng := rand.New(rand.NewPCG(s, 2))
	faults := wfFaults(rng)
	d := duration(t, 30*time.Second)
	t.Logf("seed %d (GPUAAS_CHAOS_SEED), faults %v", s, faults)
	bin := labAgent(t)
	start := time.Now()
	rg := StartWF(t, WFOptions{Bin: coordinatorBin, AgentBin: bin})
	t.Logf("rig up in %.1fs", time.Since(start).Seconds())
	rep := rg.Run(t, WFConfig{Duration: d, Faults: faults, Hold: 2 * time.Second, Seed: s, OutDir: outDir(t)})
	t.Log(rep)
	require.NoError(t, recordSoak(s, rep.Report), "soak summary")
	for _, v := range rep.Violations {
		t.Error(v)
	}
	for _, v := range rep.Stuck {
		t.Error(v)
	}
	if !rep.OK() {
		t.Logf("agent %s log:\n%s", WFSliceHost, rg.AgentLog(WFSliceHost, 30))
	}
	assert.True(t, rep.OK(), "checkers found violations")
	assert.Positive(t, rep.ByShape[string(proto.ShapeGPUSlice)], "slices were allocated")
	assert.Positive(t, rep.ByShape[string(proto.ShapeBaremetal)], "the baremetal node was allocated")
	assert.Positive(t, rep.EndStates[string(proto.AllocReleased)], "allocations were released")
	assert.GreaterOrEqual(t, len(rep.Faults), len(faults)-1, "the faults were injected")
}

// TestPrivilegedChaosWorkflowsCatchesStuck proves the workflow checker
// can fail: the coordinators run with the task deadline disabled
// (-task-stall-timeout 24h) and the slice host's agent dies at its first
// provision (failpoint slice/before-ssh_ready=crash) and stays down.
// Nothing then ends that allocation: the checker must name it, stuck in
// provisioning, with the stage it was in.
func TestPrivilegedChaosWorkflowsCatchesStuck(t *testing.T) {
	testenv.Root(t)
	t.Parallel()
	s := seed(t)
	rg := StartWF(t, WFOptions{Bin: coordinatorBin, AgentBin: labAgent(t), StallTimeout: 24 * time.Hour,
		AgentEnv: []string{slice.FailpointsEnv + "=slice/before-ssh_ready=crash"}})
	rg.Bound = 20 * time.Second // the bound the default -task-stall-timeout would keep, with slack
	rep := rg.Run(t, WFConfig{Duration: duration(t, 10*time.Second), Seed: s, NoAgentRestart: true, OutDir: outDir(t)})
	t.Log(rep)
	require.NotEmpty(t, rep.Stuck, "an allocation whose agent died mid-provision, with no deadline, must be reported stuck")
	assert.False(t, rep.OK())
	found := false
	for _, v := range rep.Stuck {
		if strings.Contains(v, "gpu_slice") && strings.Contains(v, "provisioning for") && strings.Contains(v, "last stage ") {
			found = true
		}
	}
	assert.True(t, found, "the stuck slice is named with its state and stage: %v", rep.Stuck)
	t.Logf("caught, as it must be: %s", rep.Stuck[0])
	assert.Zero(t, rep.DoubleClaims+rep.LostAcks, "the ledger itself is sound")
}
