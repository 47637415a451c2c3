package membership

import (
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/agent/membership/memnet"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func waitEvent(t *testing.T, p *Pool, kind EventKind, name string, within time.Duration) Event {
	t.Helper()
	deadline := time.After(within)
	for {
		select {
		case ev := <-p.Events():
			if ev.Kind == kind && ev.Name == name {
				return ev
			}
		case <-deadline:
			t.Fatalf("no %s event for %s within %s", kind, name, within)
		}
	}
}

// Real UDP/TCP on loopback: join, metadata, a killed agent declared dead,
// a leaving agent reported as left (not dead).
func TestPoolOnLoopback(t *testing.T) {
	coord, err := Start(Config{Name: "coord-1", Meta: Meta{Role: RoleCoordinator, NodeID: "coord-1"}, Logger: quiet()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = coord.Shutdown() })

	var agents []*Pool
	for i := 0; i < 3; i++ {
		a, err := Start(Config{Name: fmt.Sprintf("node-%d", i), Meta: Meta{Role: RoleAgent, NodeID: fmt.Sprintf("node-%d", i)}, Logger: quiet()})
		require.NoError(t, err)
		t.Cleanup(func() { _ = a.Shutdown() })
		_, err = a.Join([]string{coord.Addr()})
		require.NoError(t, err)
		agents = append(agents, a)
	}
	ev := waitEvent(t, coord, EventJoin, "node-2", 5*time.Second)
	require.Equal(t, RoleAgent, ev.Meta.Role)
	require.Equal(t, "node-2", ev.Meta.NodeID)
	require.Eventually(t, func() bool { return coord.NumMembers() == 4 }, 5*time.Second, 20*time.Millisecond)

	require.NoError(t, agents[0].Shutdown()) // crash: no leave message
	// Detection time is measured by TestBenchDetection, not asserted here.
	waitEvent(t, coord, EventGone, "node-0", 30*time.Second)

	require.NoError(t, agents[1].Leave(2*time.Second))
	waitEvent(t, coord, EventGone, "node-1", 5*time.Second)
}

func TestStartRejectsBadConfig(t *testing.T) {
	_, err := Start(Config{})
	require.ErrorContains(t, err, "name is required")
	_, err = Start(Config{Name: "x", Profile: "warp"})
	require.ErrorContains(t, err, `profile "warp"`)
	big := make([]byte, 600)
	for i := range big {
		big[i] = 'a'
	}
	_, err = Start(Config{Name: "x", Meta: Meta{NodeID: string(big)}})
	require.ErrorContains(t, err, "metadata is")
}

// The in-memory network: many members, one killed, the others agree.
func TestPoolOnMemnet(t *testing.T) {
	if testing.Short() {
		t.Skip("gossip convergence takes seconds")
	}
	nw := memnet.New()
	pools := startMemnetPool(t, nw, 16)
	killed := 5
	nw.Kill(pools[killed].tr)
	waitEvent(t, pools[0].p, EventGone, pools[killed].p.ml.LocalNode().Name, 30*time.Second)
	require.Eventually(t, func() bool {
		for i, m := range pools {
			if i != killed && m.p.NumMembers() != len(pools)-1 {
				return false
			}
		}
		return true
	}, 30*time.Second, 50*time.Millisecond, "every live member drops the dead one")
}

type memMember struct {
	p  *Pool
	tr *memnet.Transport
}

func startMemnetPool(tb testing.TB, nw *memnet.Network, n int) []memMember {
	tb.Helper()
	var out []memMember
	for i := 0; i < n; i++ {
		tr := nw.NewTransport()
		name := fmt.Sprintf("node-%04d", i)
		role := RoleAgent
		if i == 0 {
			role, name = RoleCoordinator, "coord-0"
		}
		p, err := Start(Config{Name: name, Meta: Meta{Role: role, NodeID: name}, Transport: tr, Logger: quiet()})
		require.NoError(tb, err)
		tb.Cleanup(func() { _ = p.Shutdown() })
		if i > 0 {
			_, err := p.Join([]string{out[0].tr.Addr()})
			require.NoError(tb, err)
		}
		out = append(out, memMember{p: p, tr: tr})
	}
	require.Eventually(tb, func() bool {
		for _, m := range out {
			if m.p.NumMembers() != n {
				return false
			}
		}
		return true
	}, time.Duration(n/10+45)*time.Second, 100*time.Millisecond, "pool of %d converges", n)
	return out
}

// Statuses keep the level view a late watcher needs: every member seen,
// alive or gone, with a sequence number that moves on each change.
func TestStatusesFollowMembers(t *testing.T) {
	t.Parallel()
	nw := memnet.New()
	pools := startMemnetPool(t, nw, 4)
	observer := pools[0].p
	byName := func() map[string]Status {
		m := map[string]Status{}
		for _, st := range observer.Statuses() {
			m[st.Name] = st
		}
		return m
	}
	before := byName()
	require.Len(t, before, 3, "the observer lists the others, not itself")
	for _, st := range before {
		require.True(t, st.Alive, st.Name)
		require.Equal(t, RoleAgent, st.Meta.Role)
		require.NotZero(t, st.Seq)
	}
	victim := pools[2].p.ml.LocalNode().Name
	nw.Kill(pools[2].tr)
	require.Eventually(t, func() bool { return !byName()[victim].Alive }, 30*time.Second, 20*time.Millisecond)
	after := byName()
	require.Greater(t, after[victim].Seq, before[victim].Seq, "the death is a new change")
	require.Len(t, after, 3, "a gone member stays listed")
	for name, st := range after {
		if name != victim {
			require.True(t, st.Alive, name)
		}
	}
}

// Dilate slows every interval and timeout by the same factor, so the
// suspicion arithmetic (multiples of the probe interval) is unchanged.
func TestDilate(t *testing.T) {
	c := memberlist.DefaultLANConfig()
	require.NoError(t, Tune(c, ProfileFast))
	before := *c
	Dilate(c, 4)
	require.Equal(t, 4*before.ProbeInterval, c.ProbeInterval)
	require.Equal(t, 4*before.ProbeTimeout, c.ProbeTimeout)
	require.Equal(t, 4*before.GossipInterval, c.GossipInterval)
	require.Equal(t, 4*before.PushPullInterval, c.PushPullInterval)
	require.Equal(t, 4*before.GossipToTheDeadTime, c.GossipToTheDeadTime)
	require.Equal(t, 4*before.TCPTimeout, c.TCPTimeout)
	require.Equal(t, before.SuspicionMult, c.SuspicionMult)
	require.Equal(t, before.GossipNodes, c.GossipNodes)
}
