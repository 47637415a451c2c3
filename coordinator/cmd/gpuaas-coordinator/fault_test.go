package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"

	"github.com/gpuaas/gpuaas/coordinator/fsm"
	"github.com/gpuaas/gpuaas/coordinator/server"
	"github.com/gpuaas/gpuaas/coordinator/server/proctest"
	"github.com/gpuaas/gpuaas/proto"
)

// faultRun is the shared record of the clients.
type faultRun struct {
	c *proctest.Cluster

	mu       sync.Mutex
	acked    map[string]string // idempotency key → allocation ID
	requests map[string]proto.AllocationCreateRequest

	placed, noCap, retries, released, resent atomic.Int64
}

func (r *faultRun) ack(t testing.TB, key, id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if prev, ok := r.acked[key]; ok {
		assert.Equal(t, prev, id, "key %s answered with two allocations", key)
		return
	}
	r.acked[key] = id
}

// pickNode returns a random running server.
func (r *faultRun) pickNode(rng *rand.Rand) int {
	for {
		i := rng.IntN(len(r.c.Nodes))
		if r.c.Running(i) {
			return i
		}
	}
}

// transient reports an error a client retries with the same key: the
// server died, had no leader, or lost leadership mid-write.
func transient(code int, err error) bool {
	if err == nil {
		return false
	}
	switch proto.CodeOf(err) {
	case proto.CodeNotLeader, proto.CodeUnavailable:
		return true
	}
	var pe *proto.Error
	if errors.As(err, &pe) {
		return false
	}
	return true // transport error, 502 from a forward to a dead leader, ...
}

// place sends one create, retrying the same key across failures until
// it gets an answer. ok=false: no capacity.
func (r *faultRun) place(ctx context.Context, t testing.TB, rng *rand.Rand, key string, req proto.AllocationCreateRequest) (string, bool) {
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			r.retries.Add(1)
			time.Sleep(50 * time.Millisecond)
		}
		var a proto.Allocation
		code, err := r.c.Do(ctx, r.pickNode(rng), http.MethodPost, "/v1/allocations", key, req, &a)
		if ctx.Err() != nil {
			return "", false
		}
		if transient(code, err) {
			continue
		}
		if proto.CodeOf(err) == proto.CodeNoCapacity {
			r.noCap.Add(1)
			return "", false
		}
		require.NoError(t, err, "place %s", key)
		require.Contains(t, []int{http.StatusCreated, http.StatusOK}, code)
		r.ack(t, key, a.ID)
		return a.ID, true
	}
}

func (r *faultRun) release(ctx context.Context, t testing.TB, rng *rand.Rand, id string) {
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			time.Sleep(50 * time.Millisecond)
		}
		code, err := r.c.Do(ctx, r.pickNode(rng), http.MethodPost, "/v1/allocations/"+id+"/force-release", "", map[string]string{"reason": "fault test"}, nil)
		if ctx.Err() != nil {
			return
		}
		if transient(code, err) {
			continue
		}
		// A retried release whose first attempt committed finds the
		// allocation released already.
		if proto.CodeOf(err) == proto.CodeIllegalTransition {
			return
		}
		require.NoError(t, err, "release %s", id)
		r.released.Add(1)
		return
	}
}

func TestClusterFaultLeaderKilledTwice(t *testing.T) {
	if testing.Short() {
		t.Skip("process cluster test; skipped with -short")
	}
	c := proctest.Start(t, coordinatorBin, proctest.Options{
		Inventory: server.SyntheticInventory("us-east", 32, 8),
		// Keep the whole log (no compaction) so the checker can replay
		// every index from 1.
		Args: []string{"-raft-snapshot-threshold", "10000000"},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	_, err := c.Leader(ctx)
	require.NoError(t, err)
	waitFreeGPUs(ctx, t, c, 256)

	run := &faultRun{c: c, acked: map[string]string{}, requests: map[string]proto.AllocationCreateRequest{}}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for cl := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(cl), 7))
			var held []string
			for seq := 0; ; seq++ {
				select {
				case <-stop:
					return
				default:
				}
				key := fmt.Sprintf("c%02d-%05d", cl, seq)
				req := proto.AllocationCreateRequest{CapacityShape: proto.ShapeGPUSlice, SKU: "h200-sxm-slice",
					GPUCount: []int{1, 1, 2, 4}[rng.IntN(4)], Region: "us-east"}
				run.mu.Lock()
				run.requests[key] = req
				run.mu.Unlock()
				id, ok := run.place(ctx, t, rng, key, req)
				if ok {
					run.placed.Add(1)
					held = append(held, id)
				}
				// Hold at most two; on no capacity give one back, so
				// capacity keeps turning over.
				if len(held) > 2 || !ok && len(held) > 0 {
					run.release(ctx, t, rng, held[0])
					held = held[1:]
				}
				if ctx.Err() != nil {
					return
				}
			}
		}()
	}

	resend := func() {
		// Re-send a sample of acknowledged keys: same allocation ID.
		run.mu.Lock()
		var keys []string
		for k := range run.acked {
			keys = append(keys, k)
			if len(keys) == 40 {
				break
			}
		}
		run.mu.Unlock()
		rng := rand.New(rand.NewPCG(99, uint64(len(keys))))
		for _, k := range keys {
			run.mu.Lock()
			req := run.requests[k]
			run.mu.Unlock()
			_, ok := run.place(ctx, t, rng, k, req)
			require.True(t, ok, "re-sent key %s", k)
			run.resent.Add(1)
		}
	}

	for kill := range 2 {
		time.Sleep(3 * time.Second)
		leader, err := c.Leader(ctx)
		require.NoError(t, err)
		t.Logf("kill -9 leader %s (kill %d), placed so far %d", c.Nodes[leader].ID, kill+1, run.placed.Load())
		c.Kill(leader)
		time.Sleep(time.Second)
		resend()
		c.StartNode(leader)
	}
	time.Sleep(3 * time.Second)
	close(stop)
	wg.Wait()
	resend()
	t.Logf("placed %d, no capacity %d, released %d, retried requests %d, re-sent keys %d",
		run.placed.Load(), run.noCap.Load(), run.released.Load(), run.retries.Load(), run.resent.Load())
	require.Greater(t, run.placed.Load(), int64(200), "the workload must have made progress")
	require.Greater(t, run.retries.Load(), int64(0), "the kills must have interrupted some requests")

	// Full-cluster restart: kill -9 every server, restart all, the state
	// every replica serves is identical to before.
	before, index := converge(ctx, t, c, 0)
	for i := range c.Nodes {
		c.Kill(i)
	}
	for i := range c.Nodes {
		c.StartNode(i)
	}
	_, err = c.Leader(ctx)
	require.NoError(t, err)
	// A restarted server replays its log before it serves that state:
	// wait until every server is back at the index it served before.
	after, _ := converge(ctx, t, c, index)
	assert.Equal(t, before, after, "state after a full-cluster restart")

	for i := range c.Nodes {
		require.NoError(t, c.Stop(i), "graceful stop of %s", c.Nodes[i].ID)
	}

	// Offline: replay every replica's Raft log into a fresh FSM, checking
	// the invariants after every index.
	var dumps []string
	var logs [][]*raft.Log
	for _, n := range c.Nodes {
		entries := readLog(t, filepath.Join(n.DataDir, "raft", "raft.db"))
		chk := fsm.NewChecker()
		for _, l := range entries {
			_, err := chk.ApplyLog(l)
			require.NoError(t, err, "replica %s", n.ID)
		}
		snap := chk.FSM().Store().Snapshot()
		require.NoError(t, fsm.CheckInvariants(snap), "replica %s final state", n.ID)
		for key, id := range run.acked {
			a, ok := snap.AllocationByKey(key)
			if assert.True(t, ok, "replica %s lost acknowledged allocation %s (key %s)", n.ID, id, key) {
				assert.Equal(t, id, a.ID, "replica %s key %s", n.ID, key)
			}
		}
		var buf bytes.Buffer
		require.NoError(t, fsm.WriteSnapshot(&buf, snap))
		dumps = append(dumps, buf.String())
		logs = append(logs, entries)
		t.Logf("replica %s: %d log entries replayed, state index %d", n.ID, len(entries), snap.Index())
	}
	for i := 1; i < len(dumps); i++ {
		assert.True(t, dumps[0] == dumps[i], "replica %s state differs from %s", c.Nodes[i].ID, c.Nodes[0].ID)
		common := min(len(logs[0]), len(logs[i]))
		for j := range common {
			a, b := logs[0][j], logs[i][j]
			if a.Index != b.Index || a.Term != b.Term || !bytes.Equal(a.Data, b.Data) {
				t.Fatalf("replica %s log differs from %s at index %d", c.Nodes[i].ID, c.Nodes[0].ID, a.Index)
			}
		}
	}
}

func waitFreeGPUs(ctx context.Context, t testing.TB, c *proctest.Cluster, want int) {
	t.Helper()
	for {
		var av proto.List[*proto.Availability]
		_, err := c.Do(ctx, 0, http.MethodGet, "/v1/availability?region=us-east&sku=h200-sxm-slice", "", nil, &av)
		if err == nil && len(av.Items) == 1 && av.Items[0].FreeGPUs == want {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("inventory never loaded: %v", err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// converge waits until every server reports the same state index, at
// least minIndex (read twice, 300 ms apart, to let the outbox pump
// settle) and returns the allocations and slots every server serves,
// checked equal, and that index.
func converge(ctx context.Context, t testing.TB, c *proctest.Cluster, minIndex uint64) (string, uint64) {
	t.Helper()
	var last uint64
	for {
		idx := map[uint64]bool{}
		for i := range c.Nodes {
			st, err := c.Status(ctx, i)
			if err != nil {
				idx[0], idx[1] = true, true
				break
			}
			idx[st.Index] = true
		}
		if len(idx) == 1 {
			var cur uint64
			for k := range idx {
				cur = k
			}
			if cur == last && cur >= minIndex {
				break
			}
			last = cur
		}
		select {
		case <-ctx.Done():
			t.Fatalf("replicas never converged")
		case <-time.After(300 * time.Millisecond):
		}
	}
	var first string
	for i := range c.Nodes {
		d := dumpAPI(ctx, t, c, i, "/v1/allocations") + dumpAPI(ctx, t, c, i, "/v1/slots")
		if i == 0 {
			first = d
		} else {
			require.Equal(t, first, d, "server %s serves different state", c.Nodes[i].ID)
		}
	}
	return first, last
}

// dumpAPI reads every page of a list from server i.
func dumpAPI(ctx context.Context, t testing.TB, c *proctest.Cluster, i int, path string) string {
	t.Helper()
	var out bytes.Buffer
	after := ""
	for {
		var page struct {
			Items []any  `json:"items"`
			Next  string `json:"next"`
		}
		q := url.Values{"limit": {"1000"}}
		if after != "" {
			q.Set("after", after)
		}
		_, err := c.Do(ctx, i, http.MethodGet, path+"?"+q.Encode(), "", nil, &page)
		require.NoError(t, err)
		fmt.Fprintf(&out, "%v\n", page.Items)
		if page.Next == "" {
			return out.String()
		}
		after = page.Next
	}
}

// readLog returns every entry of a stopped server's raft-boltdb log.
func readLog(t testing.TB, path string) []*raft.Log {
	t.Helper()
	st, err := raftboltdb.New(raftboltdb.Options{Path: path, BoltOptions: &bbolt.Options{ReadOnly: true, Timeout: 5 * time.Second}})
	require.NoError(t, err)
	defer st.Close()
	first, err := st.FirstIndex()
	require.NoError(t, err)
	last, err := st.LastIndex()
	require.NoError(t, err)
	require.EqualValues(t, 1, first, "log was compacted; the checker needs every index")
	var out []*raft.Log
	for i := first; i <= last; i++ {
		l := new(raft.Log)
		require.NoError(t, st.GetLog(i, l))
		out = append(out, l)
	}
	return out
}
