package fleetsim

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/server/proctest"
)

// TestFleetSmall runs 50 simulated agents (5 of them gossiping) against a
// real 3-coordinator cluster: they enroll with client certificates,
// heartbeat, report readiness and long-poll; a placement stream places
// and releases slices whose tasks the agents acknowledge; a killed
// gossiping agent's node goes unreachable.
func TestFleetSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs coordinator processes")
	}
	bin, err := proctest.Build(t.TempDir())
	require.NoError(t, err)
	// 50 agents configured to beat every second, a leader that takes at
	// most 25 heartbeats a second: it asks them for one every 2 s (and
	// gives each beat a TTL of three of those, 6 s).
	c := startCluster(t, bin, 50, "-agent-heartbeat-ttl", "3s", "-max-agent-heartbeats-per-second", "25")
	cfg := c.fleetConfig(t, c.nodes)
	cfg.HeartbeatInterval, cfg.ReadinessInterval, cfg.PollWait = time.Second, 2*time.Second, 5*time.Second
	cfg.GossipMembers = 5
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f, err := Start(ctx, cfg)
	require.NoError(t, err)
	defer f.Stop()

	time.Sleep(3 * time.Second) // every agent has its first answer
	beats0, t0 := f.Stats().Heartbeats, time.Now()
	// In a process of its own, as the benchmark runs it.
	ps, err := placeInProcess(t, c, 4*time.Second, PlaceConfig{Region: region, Clients: 2, Rate: 20, Hold: 500 * time.Millisecond})
	require.NoError(t, err)
	rate := float64(f.Stats().Heartbeats-beats0) / time.Since(t0).Seconds()
	t.Logf("heartbeats: %.1f/s from 50 agents configured for 50/s, the leader asking for at most 25/s", rate)
	assert.InDelta(t, 25, rate, 8, "the fleet beats as often as the leader asks, not as configured")
	assert.Positive(t, ps.Placed, "placements committed (last error %q)", ps.LastError)
	assert.Zero(t, ps.Failed, "no placement failed (last error %q)", ps.LastError)
	assert.Equal(t, ps.Placed, ps.Released, "every placement released (last error %q)", ps.LastError)
	assert.Positive(t, ps.Quantile(0.99))

	// A gossiping agent dies: its node goes unreachable.
	victim := f.Nodes()[1]
	require.Equal(t, "active", string(mustState(t, c, victim)))
	require.NoError(t, f.Kill(victim))
	took := c.waitState(t, victim, "unreachable", 30*time.Second)
	t.Logf("death of %s detected in %v", victim, took)

	// Agents outside the pool keep their nodes active by heartbeat; one
	// dies and the leader's heartbeat expiry declares it.
	quiet := f.Nodes()[20]
	for _, n := range f.Nodes()[5:] {
		if n != victim {
			require.Equal(t, "active", mustState(t, c, n), "node %s kept active by its heartbeats", n)
		}
	}
	require.NoError(t, f.Kill(quiet))
	took = c.waitState(t, quiet, "unreachable", 30*time.Second)
	t.Logf("heartbeat expiry of %s in %v", quiet, took)
	assert.Less(t, took, 10*time.Second)

	st := f.Stats()
	assert.Equal(t, 50, st.Agents)
	assert.Positive(t, st.Heartbeats)
	assert.Positive(t, st.Readiness)
	assert.Positive(t, st.Polls)
	assert.GreaterOrEqual(t, st.TasksDone, ps.Placed, "every provision task acknowledged")
	assert.Zero(t, st.Errors, "agents saw no error (last %q)", f.LastError())
	assert.Error(t, f.Kill("nope"))
}

func mustState(t *testing.T, c *cluster, node string) string {
	t.Helper()
	st, err := NodeState(context.Background(), c.apis[0], node)
	require.NoError(t, err)
	return string(st)
}
