// Package chaos is the fault rig: real gpuaas-coordinator processes, each
// in its own network namespace, a workload of concurrent clients, a
// nemesis (kill -9, SIGSTOP longer than the election timeout, network
// partitions and one-way drops with nftables) and two checkers: porcupine
// over the recorded history (per allocation and per slot, see AllocModel
// and SlotModel) and the offline replay of every replica's Raft log with
// the ledger's invariant checker (Replay). The workflow rig (StartWF,
// WFRig.Run) adds real agents and the MAAS simulator, MAAS faults and
// agent kills mid-provisioning, and checks that every allocation and
// workflow ends within its bound (LifecycleModel, the stuck check). See
// the README, "The fault rig".
package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/coordinator/server"
	"github.com/gpuaas/gpuaas/coordinator/server/proctest"
	"github.com/gpuaas/gpuaas/proto"
)

// Config shapes one run.
type Config struct {
	Bin      string // gpuaas-coordinator binary
	Nodes    int    // coordinators (default 3)
	Clients  int    // workload clients (default 8)
	Duration time.Duration
	// Faults are injected one after another, spread over Duration, each
	// held for Hold (default 3 s: longer than the 500 ms election
	// timeout).
	Faults []string
	Hold   time.Duration
	// HoldMax, when above Hold, makes each fault hold for a random time
	// in [Hold, HoldMax].
	HoldMax time.Duration
	Seed    uint64
	// OutDir receives porcupine's visualizations of violations.
	OutDir string
	// Timeout bounds each client request (default 20 s, so requests that
	// hang past StuckAfter are seen).
	Timeout time.Duration
}

// Rig is a formed cluster in its namespaces.
type Rig struct {
	C    *proctest.Cluster
	Net  *Net
	Disk *Disk
}

// Region, SKU and the inventory every run uses: 6 nodes of 8 slots, so
// the clients contend for slots and capacity runs out now and then.
const (
	Region    = "us-east"
	SKU       = "h200-sxm-slice"
	rigNodes  = 6
	rigSlots  = 8
	rigGPUs   = rigNodes * rigSlots
	bootLimit = 90 * time.Second
)

// Start forms a cluster of n coordinators, one per namespace, and waits
// until the leader has loaded the inventory.
func Start(t testing.TB, bin string, n int) *Rig {
	t.Helper()
	nw := NewNet(t, n)
	disk := &Disk{}
	c := proctest.Start(t, bin, proctest.Options{
		Prepare:   disk.Prepare(t),
		Size:      n,
		Inventory: server.SyntheticInventory(Region, rigNodes, rigSlots),
		Args: []string{
			// The replay checker needs every index from 1.
			"-raft-snapshot-threshold", "10000000",
			// The clients come from the hub address, not loopback.
			"-rate-per-address", "0", "-rate-per-principal", "0", "-lockout-after", "0",
			// No agents: provision tasks must not fail the allocations
			// under the workload's feet.
			"-task-stall-timeout", "24h",
		},
		Addrs: nw.Addrs, Wrap: nw.Wrap, DialContext: nw.DialContext, ClientTimeout: time.Minute,
	})
	if d := os.Getenv("GPUAAS_CHAOS_OUT"); d != "" {
		// Keep the servers' logs with the run's other evidence when it
		// failed (or GPUAAS_CHAOS_KEEP_LOGS is set).
		t.Cleanup(func() {
			if !t.Failed() && os.Getenv("GPUAAS_CHAOS_KEEP_LOGS") == "" {
				return
			}
			keepLogs(t, c, filepath.Join(d, fmt.Sprintf("%s-%d-logs", strings.ReplaceAll(t.Name(), "/", "_"), time.Now().UnixNano())))
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), bootLimit)
	defer cancel()
	if _, err := c.Leader(ctx); err != nil {
		t.Fatalf("cluster never agreed on a leader: %v", err)
	}
	for {
		var av proto.List[*proto.Availability]
		_, err := c.Do(ctx, 0, http.MethodGet, "/v1/availability?region="+Region+"&sku="+SKU, "", nil, &av)
		if err == nil && len(av.Items) == 1 && av.Items[0].FreeGPUs == rigGPUs {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("inventory never loaded: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return &Rig{C: c, Net: nw, Disk: disk}
}

// Run runs the workload under the nemesis, heals everything, lets the
// clients settle their unknown outcomes, reads which slot each claim took,
// checks the history with porcupine, stops the servers and replays their
// logs. It fails t only on a rig error; what the checkers found is in the
// report.
func (rg *Rig) Run(t testing.TB, cfg Config) *Report {
	t.Helper()
	if cfg.Clients == 0 {
		cfg.Clients = 10
	}
	if cfg.Hold == 0 {
		cfg.Hold = 3 * time.Second
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 20 * time.Second
	}
	c := rg.C
	slots := rg.slotIDs(t)
	h := NewHistory()
	w := &Workload{C: c, H: h, Clients: cfg.Clients, Region: Region, SKU: SKU, Slots: slots, Timeout: cfg.Timeout, Seed: cfg.Seed}
	nem := &Nemesis{C: c, Net: rg.Net, Disk: rg.Disk, H: h, Hold: cfg.Hold, HoldMax: cfg.HoldMax, Rng: rand.New(rand.NewPCG(cfg.Seed, 0x6e656d)), Log: t.Logf}

	ctx, cancel := context.WithTimeout(context.Background(), cfg.Duration)
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		w.Run(ctx, 30*time.Second)
	}()
	// Faults spread over the run: a quiet gap, the fault, the next.
	meanHold := (cfg.Hold + max(cfg.Hold, cfg.HoldMax)) / 2
	gap := (cfg.Duration - time.Duration(len(cfg.Faults))*meanHold) / time.Duration(len(cfg.Faults)+1)
	var nemErr error
	for _, f := range cfg.Faults {
		sleep(ctx, max(gap, time.Second))
		if ctx.Err() != nil {
			break
		}
		if err := nem.Inject(ctx, f); err != nil {
			nemErr = err
			break
		}
	}
	<-ctx.Done()
	// Heal whatever is left, so the clients can settle.
	if err := rg.Net.Heal(context.Background()); err != nil {
		t.Errorf("heal: %v", err)
	}
	for i := range c.Nodes {
		if rg.Disk != nil {
			if err := rg.Disk.Free(i); err != nil {
				t.Errorf("free disk: %v", err)
			}
		}
		if c.Exited(i) {
			// It stopped by itself (e.g. Raft gave up on a full disk):
			// restart it like a supervisor would.
			t.Logf("%s had exited; restarting it. Its last log lines:\n%s", c.Nodes[i].ID, tail(c.Nodes[i].LogPath, 10))
			c.Kill(i)
		}
		if c.Running(i) {
			_ = c.Thaw(i)
		} else {
			c.StartNode(i)
		}
	}
	wg.Wait()
	if nemErr != nil {
		t.Errorf("nemesis: %v", nemErr)
	}
	ops := h.Ops()

	// Which slot each acknowledged allocation's claims took.
	acked := map[string]string{}
	for _, op := range ops {
		if op.Kind == OpCreate && op.Result == ResOK {
			acked[op.Key] = op.AllocID
		}
	}
	ledger := rg.resolve(t)
	rep := Check(ops, ledger, cfg.OutDir, time.Minute)
	rep.Faults = nem.Faults()
	rep.StuckHealthy = stuckHealthy(ops, rep.Faults)

	// Every replica must hold the whole log before the replay compares
	// them: a server restarted by the last fault may still be catching up.
	if err := rg.converge(time.Minute); err != nil {
		rep.NotConverged++
		rep.Violations = append(rep.Violations, err.Error())
	}
	for i := range c.Nodes {
		if err := c.Stop(i); err != nil {
			rep.SlowStops++
			t.Logf("stop %s: %v; its last log lines:\n%s", c.Nodes[i].ID, err, tail(c.Nodes[i].LogPath, 25))
		}
	}
	if d := os.Getenv("GPUAAS_CHAOS_OUT"); d != "" && rep.SlowStops > 0 {
		keepLogs(t, c, filepath.Join(d, fmt.Sprintf("%s-%d-slowstop-logs", strings.ReplaceAll(t.Name(), "/", "_"), time.Now().UnixNano())))
	}
	if err := Replay(c, acked, rep); err != nil {
		t.Fatalf("replay: %v", err)
	}
	if d := os.Getenv("GPUAAS_CHAOS_OUT"); d != "" && (rep.ReplicaDivergence+rep.LostAcks+rep.DoubleClaims > 0 || !rep.Linearizable()) {
		// The logs the replay read, the history and the healed ledger
		// the checker saw are the evidence: keep them.
		dir := filepath.Join(d, fmt.Sprintf("%s-%d-raft", strings.ReplaceAll(t.Name(), "/", "_"), time.Now().UnixNano()))
		keepRaftLogs(t, c, dir)
		keepHistory(t, ops, ledger, filepath.Join(dir, "history.json"))
	}
	return rep
}

// converge waits until every server reports the same applied index twice,
// 300 ms apart.
func (rg *Rig) converge(limit time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	var last []uint64
	for {
		var idx []uint64
		for i := range rg.C.Nodes {
			st, err := rg.C.Status(ctx, i)
			if err != nil {
				idx = append(idx, 0)
				continue
			}
			idx = append(idx, st.Index)
		}
		same := idx[0] > 0
		for _, x := range idx {
			same = same && x == idx[0]
		}
		if same && slices.Equal(idx, last) {
			return nil
		}
		last = idx
		select {
		case <-ctx.Done():
			return fmt.Errorf("replicas did not converge within %s after the faults healed: applied indexes %v", limit, idx)
		case <-time.After(300 * time.Millisecond):
		}
	}
}

// keepLogs copies every server's log into dir.
func keepLogs(t testing.TB, c *proctest.Cluster, dir string) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Logf("keep logs: %v", err)
		return
	}
	for _, n := range c.Nodes {
		b, err := os.ReadFile(n.LogPath)
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, n.ID+".log"), b, 0o644)
		}
		if err != nil {
			t.Logf("keep log of %s: %v", n.ID, err)
		}
	}
}

// tail returns the last n lines of a server log, API request lines left
// out.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if !strings.Contains(l, `msg="api request"`) {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// stuckHealthy counts the requests that took longer than StuckAfter
// although the server they went to was not a fault's target while they
// ran: the ones a client of a healthy server waits on.
func stuckHealthy(ops []Op, faults []Fault) int {
	n := 0
	for _, op := range ops {
		if op.Return-op.Call <= StuckAfter {
			continue
		}
		hit := false
		for _, f := range faults {
			for _, i := range f.Targets {
				if i == op.Node && f.Start <= op.Return && op.Call <= f.Stop {
					hit = true
				}
			}
		}
		if !hit {
			n++
		}
	}
	return n
}

func (rg *Rig) slotIDs(t testing.TB) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var page proto.List[*proto.Slot]
	if _, err := rg.C.Do(ctx, 0, http.MethodGet, "/v1/slots?limit=1000", "", nil, &page); err != nil {
		t.Fatalf("list slots: %v", err)
	}
	var ids []string
	for _, s := range page.Items {
		ids = append(ids, s.ID)
	}
	return ids
}

// resolve reads, from the healed cluster, every allocation the ledger
// holds (each names its idempotency key) and the slot of each of its
// claims: keyAlloc resolves keys whose creates all had unknown outcomes,
// claimSlot maps every claim to its slot.
func (rg *Rig) resolve(t testing.TB) Ledger {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// get retries on any server until ctx ends (t.Fatal only from the
	// test's goroutine: the claim readers report through get's error).
	get := func(path string, out any) error {
		for i := 0; ; i++ {
			_, err := rg.C.Do(ctx, i%len(rg.C.Nodes), http.MethodGet, path, "", nil, out)
			if err == nil {
				return nil
			}
			if ctx.Err() != nil {
				return fmt.Errorf("GET %s: %w", path, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	keyAlloc, allocClaims := map[string]string{}, map[string][]string{}
	for after := ""; ; {
		var page proto.List[*proto.Allocation]
		q := url.Values{"limit": {"1000"}, "consistent": {"true"}}
		if after != "" {
			q.Set("after", after)
		}
		if err := get("/v1/allocations?"+q.Encode(), &page); err != nil {
			t.Fatal(err)
		}
		for _, a := range page.Items {
			keyAlloc[a.IdempotencyKey] = a.ID
			allocClaims[a.ID] = a.ClaimIDs
		}
		if page.Next == "" {
			break
		}
		after = page.Next
	}
	claimSlot := map[string]string{}
	var mu sync.Mutex
	var getErr error
	ids := make(chan string)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range ids {
				var cl proto.List[*proto.Claim]
				if err := get("/v1/allocations/"+url.PathEscape(id)+"/claims?consistent=true", &cl); err != nil {
					mu.Lock()
					getErr = err
					mu.Unlock()
					continue
				}
				mu.Lock()
				for _, c := range cl.Items {
					claimSlot[c.ID] = c.SlotID
				}
				mu.Unlock()
			}
		}()
	}
	for _, id := range keyAlloc {
		ids <- id
	}
	close(ids)
	wg.Wait()
	if getErr != nil {
		t.Fatal(getErr)
	}
	return Ledger{KeyAlloc: keyAlloc, AllocClaims: allocClaims, ClaimSlot: claimSlot}
}

// RandomFaults picks k fault kinds at random (each kind at most once
// while kinds remain).
func RandomFaults(rng *rand.Rand, k int) []string {
	var out []string
	for len(out) < k {
		for _, i := range rng.Perm(len(AllFaults)) {
			if len(out) < k {
				out = append(out, AllFaults[i])
			}
		}
	}
	return out
}

// keepRaftLogs copies every server's raft.db into dir (stopped servers).
func keepRaftLogs(t testing.TB, c *proctest.Cluster, dir string) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Logf("keep raft logs: %v", err)
		return
	}
	for _, n := range c.Nodes {
		b, err := os.ReadFile(filepath.Join(n.DataDir, "raft", "raft.db"))
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, n.ID+"-raft.db"), b, 0o644)
		}
		if err != nil {
			t.Logf("keep raft log of %s: %v", n.ID, err)
		}
	}
	t.Logf("raft logs kept in %s", dir)
}

// keepHistory writes the history and the healed ledger the checker saw as
// JSON, so a violation can be re-checked and read offline.
func keepHistory(t testing.TB, ops []Op, l Ledger, path string) {
	b, err := json.Marshal(struct {
		Ops    []Op   `json:"ops"`
		Ledger Ledger `json:"ledger"`
	}{ops, l})
	if err == nil {
		err = os.WriteFile(path, b, 0o644)
	}
	if err != nil {
		t.Logf("keep history: %v", err)
		return
	}
	t.Logf("history and ledger kept in %s", path)
}
