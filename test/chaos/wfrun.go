package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/gpuaas/gpuaas/lab/maassim"
	"github.com/gpuaas/gpuaas/proto"
)

// Workflow faults: what the workflow rig's nemesis adds to KillLeader.
const (
	// MAASAPIErrors: the simulator refuses the machine's next mutating
	// requests, unapplied — 503 rack unavailable, then 409 transient
	// conflict, both with Retry-After.
	MAASAPIErrors = "maas-api-errors"
	// MAASAcceptedTimeout: the next deploy or release is applied and then
	// answered 504 after 3 s (the outcome is unknown to the coordinator).
	MAASAcceptedTimeout = "maas-accepted-timeout"
	// MAASDeployFail: the next deploy fails in curtin (Failed deployment).
	MAASDeployFail = "maas-deploy-fail"
	// MAASDeployStuck: the next deploy never reports back; MAAS fails it
	// at its 40-minute deploy timeout (4 s at 600x).
	MAASDeployStuck = "maas-deploy-stuck"
	// MAASDeployLost: the next deploy acquires the machine and is lost
	// before it starts (504): the machine stays Allocated with no deploy
	// in flight.
	MAASDeployLost = "maas-deploy-lost"
	// MAASEraseFail: the next release's disk erase fails (Failed disk
	// erasing).
	MAASEraseFail = "maas-erase-fail"
	// MAASRestart: the simulator's HTTP server goes away for the hold
	// (connections cut and refused) and comes back with its state.
	MAASRestart = "maas-restart"
	// AgentKill: kill -9 the slice host's agent while a slice provision
	// or release runs there (waiting up to 5 s for one), restart it after
	// the hold.
	AgentKill = "agent-kill"
)

// WFFaults lists the workflow rig's fault kinds.
var WFFaults = []string{MAASAPIErrors, MAASAcceptedTimeout, MAASDeployFail, MAASDeployStuck, MAASDeployLost,
	MAASEraseFail, MAASRestart, AgentKill, KillLeader}

// WFConfig shapes one workflow run.
type WFConfig struct {
	Clients  int // default 5: two take the baremetal node 4 times in 5
	Duration time.Duration
	Faults   []string
	Hold     time.Duration // default 3 s
	Seed     uint64
	OutDir   string
	// NoAgentRestart leaves a killed agent down (the can-fail test).
	NoAgentRestart bool
}

// WFReport is what a workflow run found: the ledger checks of Report,
// plus the allocations and workflows that did not end.
type WFReport struct {
	*Report
	Allocations int            `json:"allocations"`
	ByShape     map[string]int `json:"by_shape"`
	EndStates   map[string]int `json:"end_states"`
	// Stuck names every allocation or workflow that stayed in one
	// transient state longer than the bound, with the stage it was in.
	Stuck []string `json:"stuck"`
	// Longest transient state seen per shape/state ("baremetal
	// provisioning"), the bound they are held to.
	Longest map[string]time.Duration `json:"longest"`
	// Slowest names the allocation of each Longest entry.
	Slowest map[string]string `json:"slowest"`
	Bound   time.Duration     `json:"bound"`
	// Failed names the allocations that ended failed, with why (their
	// last timeline stage): what the faults cost the workload.
	Failed []string `json:"failed"`
	// LifecycleViolations: per allocation, consistent reads that went
	// back in its lifecycle, or missed an acknowledged create/release.
	LifecycleViolations int `json:"lifecycle_violations"`
}

// OK reports whether every check held (lifecycle violations count as
// allocation violations, stuck ones as StuckWorkflows).
func (r *WFReport) OK() bool { return r.Report.OK() }

func (r *WFReport) String() string {
	var ls []string
	for k, d := range r.Longest {
		ls = append(ls, fmt.Sprintf("%s %.1fs", k, d.Seconds()))
	}
	sort.Strings(ls)
	return fmt.Sprintf("%s; allocations %d %v, end states %v, failed %q; lifecycle violations %d; stuck (bound %s) %d %v; longest transient states: %s",
		r.Report, r.Allocations, r.ByShape, r.EndStates, r.Failed, r.LifecycleViolations, r.Bound, len(r.Stuck), r.Stuck, strings.Join(ls, ", "))
}

// allocSeen is what the observer saw of one allocation.
type allocSeen struct {
	id, key, shape string
	first          map[proto.AllocState]time.Duration // first seen in each state
	state          proto.AllocState                   // last seen
}

// Run runs the workload under the nemesis, releases everything, waits
// for every allocation and workflow to end (up to Bound), and checks.
func (rg *WFRig) Run(t testing.TB, cfg WFConfig) *WFReport {
	t.Helper()
	if cfg.Clients == 0 {
		cfg.Clients = 5
	}
	if cfg.Hold == 0 {
		cfg.Hold = 3 * time.Second
	}
	h := NewHistory()
	obs := &observer{rg: rg, h: h, seen: map[string]*allocSeen{}}
	octx, ocancel := context.WithCancel(context.Background())
	var owg sync.WaitGroup
	owg.Add(1)
	go func() { defer owg.Done(); obs.run(octx) }()

	w := &wfWorkload{rg: rg, h: h, seed: cfg.Seed}
	// The workload runs for Duration, and on until the last fault healed
	// (a MAAS fault waits for a workflow to run into it, a kill for work
	// in flight: every fault is injected).
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for cl := range cfg.Clients {
		wg.Add(1)
		go func() { defer wg.Done(); w.client(ctx, cl, rg.Bound) }()
	}
	nem := &wfNemesis{rg: rg, h: h, obs: obs, hold: cfg.Hold, rng: rand.New(rand.NewPCG(cfg.Seed, 0x6e656d)), log: t.Logf,
		noRestart: cfg.NoAgentRestart}
	gap := max(time.Second, (cfg.Duration-time.Duration(len(cfg.Faults))*2*cfg.Hold)/time.Duration(len(cfg.Faults)+1))
	runEnd := time.Now().Add(cfg.Duration)
	for _, f := range cfg.Faults {
		sleep(ctx, gap)
		if err := nem.inject(ctx, f); err != nil {
			t.Errorf("nemesis: %v", err)
			break
		}
	}
	sleep(ctx, max(time.Until(runEnd), gap))
	cancel()
	// Heal: every coordinator runs; the agent too, unless the test keeps
	// it down.
	for i := range rg.C.Nodes {
		if !rg.C.Running(i) {
			rg.C.StartNode(i)
		}
	}
	if !cfg.NoAgentRestart && !rg.AgentRunning(WFSliceHost) {
		if err := rg.RestartAgent(WFSliceHost); err != nil {
			t.Errorf("restart agent: %v", err)
		}
	}
	// The clients release what they hold and wait for it to end.
	wg.Wait()
	t.Logf("%6.1fs workload done (the clients released what they held)", h.Now().Seconds())
	// Every allocation and workflow must end within the bound.
	rep := &WFReport{ByShape: map[string]int{}, EndStates: map[string]int{}, Longest: map[string]time.Duration{}, Slowest: map[string]string{}, Bound: rg.Bound}
	deadline := time.Now().Add(rg.Bound)
	for time.Now().Before(deadline) && !obs.allEnded() {
		time.Sleep(300 * time.Millisecond)
	}
	sleep(context.Background(), 600*time.Millisecond) // one more observation
	t.Logf("%6.1fs every allocation ended: %v", h.Now().Seconds(), obs.allEnded())
	ocancel()
	owg.Wait()
	rep.Stuck = append(rep.Stuck, obs.stuck(rg.Bound, rep)...)
	rep.Stuck = append(rep.Stuck, rg.stuckWorkflows(rg.Bound)...)
	for _, k := range []string{"baremetal provisioning", "baremetal releasing", "gpu_slice provisioning", "gpu_slice releasing"} {
		if id := rep.Slowest[k]; id != "" {
			t.Logf("slowest %s: %s, %.1fs; its timeline:\n%s", k, id, rep.Longest[k].Seconds(), rg.Timeline(id))
		}
	}

	ops := h.Ops()
	acked := map[string]string{}
	for _, op := range ops {
		if op.Kind == OpCreate && op.Result == ResOK {
			acked[op.Key] = op.AllocID
		}
	}
	rep.Report = &Report{ByKind: map[string]int{}, Workflows: true}
	for _, op := range ops {
		rep.Ops++
		rep.ByKind[string(op.Kind)+" "+string(op.Result)]++
		if op.Result == ResUnknown {
			rep.Unknown++
		}
		lat := op.Return - op.Call
		rep.MaxLatency = max(rep.MaxLatency, lat)
		if lat > StuckAfter {
			rep.Report.Stuck++
		}
	}
	rep.Faults = nem.faults
	rep.StuckWorkflows = len(rep.Stuck)
	checkLifecycle(ops, cfg.OutDir, rep)
	// Nothing acknowledged is lost: every acknowledged key is in the
	// ledger (and, below, in every replica's log).
	for key, id := range acked {
		if _, ok := obs.byID(id); !ok {
			rep.LostAcks++
			rep.Violations = append(rep.Violations, fmt.Sprintf("allocation %s (key %s) was acknowledged and never listed", id, key))
		}
	}
	c := rg.C
	if err := (&Rig{C: c}).converge(time.Minute); err != nil {
		rep.NotConverged++
		rep.Violations = append(rep.Violations, err.Error())
	}
	for i := range c.Nodes {
		if err := c.Stop(i); err != nil {
			rep.SlowStops++
			t.Logf("stop %s: %v", c.Nodes[i].ID, err)
		}
	}
	if err := Replay(c, acked, rep.Report); err != nil {
		t.Fatalf("replay: %v", err)
	}
	t.Logf("%6.1fs checked (converged, stopped, replayed)", h.Now().Seconds())
	return rep
}

// observer lists the allocations every 250 ms and keeps when each was
// first seen in each state.
type observer struct {
	rg   *WFRig
	h    *History
	mu   sync.Mutex
	seen map[string]*allocSeen
	ok   bool // the last listing succeeded
}

func (o *observer) run(ctx context.Context) {
	for i := 0; ctx.Err() == nil; i++ {
		o.observe(ctx, i)
		sleep(ctx, 250*time.Millisecond)
	}
}

func (o *observer) observe(ctx context.Context, i int) {
	rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	var page proto.List[*proto.Allocation]
	node := i % len(o.rg.C.Nodes)
	if !o.rg.C.Running(node) {
		return
	}
	_, err := o.rg.C.Do(rctx, node, http.MethodGet, "/v1/allocations?limit=1000", "", nil, &page)
	now := o.h.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	o.ok = err == nil
	if err != nil {
		return
	}
	for _, a := range page.Items {
		s := o.seen[a.ID]
		if s == nil {
			s = &allocSeen{id: a.ID, key: a.IdempotencyKey, shape: string(a.Shape), first: map[proto.AllocState]time.Duration{}}
			o.seen[a.ID] = s
		}
		if _, ok := s.first[a.State]; !ok {
			s.first[a.State] = now
		}
		s.state = a.State
	}
}

// allEnded reports whether every allocation seen is released or failed
// (by a listing that succeeded).
func (o *observer) allEnded() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.ok {
		return false
	}
	for _, s := range o.seen {
		if s.state != proto.AllocReleased && s.state != proto.AllocFailed {
			return false
		}
	}
	return true
}

func (o *observer) byID(id string) (*allocSeen, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	s, ok := o.seen[id]
	return s, ok
}

// inState returns the allocations of shape last seen in state.
func (o *observer) inState(shape proto.CapacityShape, state proto.AllocState) []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []string
	for _, s := range o.seen {
		if s.shape == string(shape) && s.state == state {
			out = append(out, s.id)
		}
	}
	return out
}

var transient = []proto.AllocState{proto.AllocPending, proto.AllocPlaced, proto.AllocProvisioning, proto.AllocReleasing}

// stuck names the allocations that stayed in a transient state longer
// than bound (or had not ended at all), each with its last timeline
// stage, and fills the report's counts.
func (o *observer) stuck(bound time.Duration, rep *WFReport) []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	end := o.h.Now()
	var out []string
	ids := make([]string, 0, len(o.seen))
	for id := range o.seen {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		s := o.seen[id]
		rep.Allocations++
		rep.ByShape[s.shape]++
		rep.EndStates[string(s.state)]++
		if s.state == proto.AllocFailed {
			rep.Failed = append(rep.Failed, fmt.Sprintf("%s (%s): %s", id, s.shape, o.rg.lastStage(id)))
		}
		// Time in each transient state: until first seen in a later one.
		for _, st := range transient {
			from, ok := s.first[st]
			if !ok {
				continue
			}
			until, left := end, false
			for st2, at := range s.first {
				if lifeRank(st2) > lifeRank(st) && at >= from && at < until {
					until, left = at, true
				}
			}
			d := until - from
			k := s.shape + " " + string(st)
			if d > rep.Longest[k] {
				rep.Longest[k], rep.Slowest[k] = d, id
			}
			if d > bound || !left {
				out = append(out, fmt.Sprintf("allocation %s (%s, key %s) %s for %.1fs (bound %s), last stage %s", id, s.shape, s.key, st, d.Seconds(), bound, o.rg.lastStage(id)))
				break
			}
		}
	}
	return out
}

// Timeline is an allocation's timeline, one event a line (for a test's
// log).
func (rg *WFRig) Timeline(id string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var tl proto.List[*proto.TimelineEvent]
	for i := range rg.C.Nodes {
		if _, err := rg.C.Do(ctx, i, http.MethodGet, "/v1/allocations/"+url.PathEscape(id)+"/timeline?limit=1000", "", nil, &tl); err == nil {
			break
		}
	}
	var b strings.Builder
	for _, e := range tl.Items {
		fmt.Fprintf(&b, "%s %s %s %s\n", e.At.Format("15:04:05.000"), e.Stage, e.Status, e.Message)
	}
	return b.String()
}

// lastStage is an allocation's last timeline event, as "stage status
// (message)".
func (rg *WFRig) lastStage(id string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var tl proto.List[*proto.TimelineEvent]
	for i := range rg.C.Nodes {
		if _, err := rg.C.Do(ctx, i, http.MethodGet, "/v1/allocations/"+url.PathEscape(id)+"/timeline?limit=1000", "", nil, &tl); err == nil {
			break
		}
	}
	if len(tl.Items) == 0 {
		return "(no timeline)"
	}
	e := tl.Items[len(tl.Items)-1]
	return fmt.Sprintf("%s %s (%s)", e.Stage, e.Status, e.Message)
}

// stuckWorkflows names the MAAS workflows still running whose stage
// started more than bound ago.
func (rg *WFRig) stuckWorkflows(bound time.Duration) []string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var page proto.List[*proto.MAASWorkflow]
	var err error
	for i := range rg.C.Nodes {
		if _, err = rg.C.Do(ctx, i, http.MethodGet, "/v1/workflows?state=running&limit=1000", "", nil, &page); err == nil {
			break
		}
	}
	if err != nil {
		return []string{fmt.Sprintf("workflows could not be listed: %v", err)}
	}
	var out []string
	for _, w := range page.Items {
		if since := time.Since(w.StageStartedAt); w.StageStartedAt.IsZero() || since > bound {
			out = append(out, fmt.Sprintf("workflow %s (%s %s) running in stage %s for %.0fs, attempts %d, last error %q",
				w.ID, w.Kind, w.Hostname, w.Stage, since.Seconds(), w.Attempts, w.LastError))
		}
	}
	return out
}

// wfWorkload: each client takes one allocation at a time — a slice (one
// or two GPUs) or, for clients 0 and 1 four times in five, the baremetal
// node — follows it to active or failed with consistent reads, holds it
// a moment and releases it, following the release to its end.
type wfWorkload struct {
	rg   *WFRig
	h    *History
	seed uint64
}

func (w *wfWorkload) client(ctx context.Context, cl int, settle time.Duration) {
	rng := rand.New(rand.NewPCG(w.seed, uint64(cl)))
	for seq := 0; ctx.Err() == nil; seq++ {
		req := proto.AllocationCreateRequest{CapacityShape: proto.ShapeGPUSlice, SKU: WFSliceSKU, GPUCount: 1 + rng.IntN(2), Region: WFRegion,
			SSHPublicKeys: []string{wfTenantKey}}
		if cl < 2 && rng.IntN(5) > 0 {
			req = proto.AllocationCreateRequest{CapacityShape: proto.ShapeBaremetal, SKU: WFBMSKU, Region: WFRegion, SSHPublicKeys: []string{wfTenantKey}}
		}
		key := fmt.Sprintf("wf%d-c%d-%04d", w.seed%1000, cl, seq)
		// Work begun finishes after ctx ends, within settle.
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settle)
		id, ok := w.create(fctx, rng, cl, key, req)
		if !ok {
			cancel()
			sleep(ctx, time.Duration(200+rng.IntN(800))*time.Millisecond)
			continue
		}
		st := w.follow(fctx, rng, cl, key, id, proto.AllocActive, proto.AllocFailed)
		if st == proto.AllocActive {
			sleep(ctx, time.Duration(rng.IntN(1500))*time.Millisecond)
			w.release(fctx, rng, cl, key, id)
			w.follow(fctx, rng, cl, key, id, proto.AllocReleased, proto.AllocFailed)
		}
		cancel()
	}
}

// do sends one request to a random running coordinator and records it.
func (w *wfWorkload) do(ctx context.Context, rng *rand.Rand, op Op, idem, method, path string, body, out any) Op {
	n := len(w.rg.C.Nodes)
	op.Node = rng.IntN(n)
	rctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	op.Call = w.h.Now()
	code, err := w.rg.C.Do(rctx, op.Node, method, path, idem, body, out)
	op.Return = w.h.Now()
	op.Status = code
	op.Result = classify(code, err)
	if err != nil {
		op.Err = err.Error()
	}
	return op
}

func (w *wfWorkload) create(ctx context.Context, rng *rand.Rand, cl int, key string, req proto.AllocationCreateRequest) (string, bool) {
	for attempt := 0; ctx.Err() == nil; attempt++ {
		if attempt > 0 {
			sleep(ctx, 200*time.Millisecond)
		}
		var a proto.Allocation
		op := w.do(ctx, rng, Op{Client: cl, Kind: OpCreate, Key: key}, key, http.MethodPost, "/v1/allocations", req, &a)
		if op.Result == ResOK {
			op.AllocID, op.ClaimIDs, op.State = a.ID, a.ClaimIDs, a.State
			op.Created = op.Status == http.StatusCreated
		}
		w.h.Add(op)
		switch op.Result {
		case ResOK:
			return a.ID, true
		case ResUnknown:
			continue
		default:
			return "", false
		}
	}
	return "", false
}

// follow reads id (consistent) until it is in one of want or ctx ends.
func (w *wfWorkload) follow(ctx context.Context, rng *rand.Rand, cl int, key, id string, want ...proto.AllocState) proto.AllocState {
	for ctx.Err() == nil {
		var a proto.Allocation
		op := w.do(ctx, rng, Op{Client: cl, Kind: OpRead, Key: key, AllocID: id}, "", http.MethodGet,
			"/v1/allocations/"+url.PathEscape(id)+"?consistent=true", nil, &a)
		if op.Result == ResOK {
			op.State, op.Ended = a.State, !a.Live()
		}
		if op.Result != ResUnknown {
			w.h.Add(op)
		}
		if op.Result == ResOK && slices.Contains(want, a.State) {
			return a.State
		}
		if op.Result == ResOK && !a.Live() {
			return a.State
		}
		sleep(ctx, 300*time.Millisecond)
	}
	return ""
}

func (w *wfWorkload) release(ctx context.Context, rng *rand.Rand, cl int, key, id string) {
	for attempt := 0; ctx.Err() == nil; attempt++ {
		if attempt > 0 {
			sleep(ctx, 300*time.Millisecond)
		}
		op := w.do(ctx, rng, Op{Client: cl, Kind: OpRelease, Key: key, AllocID: id}, "", http.MethodPost,
			"/v1/allocations/"+url.PathEscape(id)+"/release", nil, nil)
		w.h.Add(op)
		if op.Result != ResUnknown {
			return
		}
	}
}

// lifeRank orders an allocation's states: a consistent read never sees
// one before a state already seen.
func lifeRank(s proto.AllocState) int {
	switch s {
	case proto.AllocPending:
		return 0
	case proto.AllocPlaced:
		return 1
	case proto.AllocProvisioning:
		return 2
	case proto.AllocActive:
		return 3
	case proto.AllocReleasing:
		return 4
	case proto.AllocReleased, proto.AllocFailed:
		return 5
	}
	return -1
}

type lifeState struct {
	Created  bool
	ID       string
	State    proto.AllocState // furthest state a linearized answer showed
	Released bool             // a release was acknowledged
}

// LifecycleModel is the sequential specification of one allocation
// through its workflow, keyed by idempotency key: one allocation per key,
// consistent reads never go back in its lifecycle (pending → placed →
// provisioning → active → releasing → released | failed), see every
// acknowledged create, and after an acknowledged release never show it
// live and not releasing; a terminal state never changes.
var LifecycleModel = porcupine.Model{
	Init: func() any { return lifeState{} },
	Step: func(state, input, output any) (bool, any) {
		st, op := state.(lifeState), input.(Op)
		sameID := st.ID == "" || st.ID == op.AllocID
		forward := func(to proto.AllocState) bool {
			if lifeRank(to) < 0 || lifeRank(to) < lifeRank(st.State) {
				return false
			}
			if lifeRank(st.State) == 5 && to != st.State {
				return false // released and failed are final
			}
			return !st.Released || lifeRank(to) >= lifeRank(proto.AllocReleasing)
		}
		switch op.Kind {
		case OpCreate:
			switch op.Result {
			case ResOK:
				if !st.Created {
					return forward(op.State), lifeState{Created: true, ID: op.AllocID, State: op.State}
				}
				if !sameID || op.Created || !forward(op.State) {
					return false, st
				}
				st.ID, st.State = op.AllocID, op.State
				return true, st
			case ResNoCap:
				return !st.Created, st
			case ResUnknown:
				if !st.Created {
					return true, lifeState{Created: true}
				}
				return true, st
			}
		case OpRead:
			switch op.Result {
			case ResOK:
				if !st.Created || !sameID || !forward(op.State) {
					return false, st
				}
				st.ID, st.State = op.AllocID, op.State
				return true, st
			case ResNotFound:
				return !st.Created, st
			}
		case OpRelease:
			switch op.Result {
			case ResOK:
				if !st.Created || !sameID || lifeRank(st.State) == 5 {
					return false, st
				}
				st.Released = true
				return true, st
			case ResAlready:
				return st.Created, st
			case ResNotFound:
				return !st.Created, st
			case ResUnknown:
				if st.Created && lifeRank(st.State) < 5 {
					st.Released = true
				}
				return true, st
			}
		}
		return false, st
	},
	DescribeOperation: func(input, output any) string {
		op := input.(Op)
		out := string(op.Result)
		if op.Result == ResOK && op.Kind != OpRelease {
			out = fmt.Sprintf("%s %s", op.AllocID, op.State)
		}
		if op.Err != "" {
			out += " [" + op.Err[:min(len(op.Err), 160)] + "]"
		}
		return fmt.Sprintf("%s %s → %s (c%d→node %d)", op.Kind, op.Key, out, op.Client, op.Node)
	},
	DescribeState: func(state any) string {
		st := state.(lifeState)
		if !st.Created {
			return "absent"
		}
		return fmt.Sprintf("%s %s released=%v", st.ID, st.State, st.Released)
	},
}

// checkLifecycle runs porcupine with LifecycleModel per idempotency key.
func checkLifecycle(ops []Op, outDir string, rep *WFReport) {
	var end time.Duration
	for _, op := range ops {
		end = max(end, op.Return)
	}
	byKey := map[string][]porcupine.Operation{}
	for _, op := range ops {
		ret := int64(op.Return)
		if op.Result == ResUnknown {
			ret = int64(end + time.Hour)
		}
		byKey[op.Key] = append(byKey[op.Key], porcupine.Operation{ClientId: op.Client, Input: op, Call: int64(op.Call), Output: nil, Return: ret})
	}
	keys := make([]string, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	rep.Keys = len(keys)
	for _, k := range keys {
		res, info := porcupine.CheckOperationsVerbose(LifecycleModel, byKey[k], 30*time.Second)
		switch res {
		case porcupine.Illegal:
			rep.LifecycleViolations++
			rep.AllocViolations++
			v := fmt.Sprintf("allocation key %s: no linearization of its lifecycle", k)
			if outDir != "" && len(rep.Visualizations) < 5 {
				if err := os.MkdirAll(outDir, 0o755); err == nil {
					p := filepath.Join(outDir, "lifecycle-"+k+".html")
					if err := porcupine.VisualizePath(LifecycleModel, info, p); err == nil {
						rep.Visualizations = append(rep.Visualizations, p)
						v += " (" + p + ")"
					}
				}
			}
			rep.Violations = append(rep.Violations, v)
		case porcupine.Unknown:
			rep.CheckTimeouts++
		}
	}
}

// wfNemesis injects the workflow rig's faults.
type wfNemesis struct {
	rg        *WFRig
	h         *History
	obs       *observer
	hold      time.Duration
	rng       *rand.Rand
	log       func(string, ...any)
	noRestart bool
	faults    []Fault
}

func (n *wfNemesis) inject(ctx context.Context, kind string) error {
	rg := n.rg
	f := Fault{Kind: kind, Start: n.h.Now()}
	hold := n.hold
	maasFault := func(fs ...maassim.Fault) error {
		for _, mf := range fs {
			if err := rg.ML.Sim.InjectFault(rg.SystemID, mf); err != nil {
				return err
			}
		}
		f.Target = rg.SystemID
		// Hold until the faults fired (a baremetal deploy or release ran
		// into them), at most 3 holds; then disarm what is left.
		limit := time.Now().Add(3 * hold)
		for time.Now().Before(limit) && ctx.Err() == nil && len(rg.ML.Sim.ArmedFaults(rg.SystemID)) > 0 {
			sleep(ctx, 100*time.Millisecond)
		}
		if left := rg.ML.Sim.ArmedFaults(rg.SystemID); len(left) > 0 {
			n.log("%6.1fs nemesis: %s: %v never fired", n.h.Now().Seconds(), kind, left)
			f.Target += " (not fired)"
		}
		rg.ML.Sim.ClearFaults(rg.SystemID)
		return nil
	}
	n.log("%6.1fs nemesis: %s", n.h.Now().Seconds(), kind)
	var err error
	switch kind {
	case MAASAPIErrors:
		err = maasFault(maassim.Fault{Kind: maassim.FaultRackUnavailable, Times: 1}, maassim.Fault{Kind: maassim.FaultTransientConflict, Times: 1})
	case MAASAcceptedTimeout:
		err = maasFault(maassim.Fault{Kind: maassim.FaultAcceptedTimeout, Op: []string{"deploy", "release"}[n.rng.IntN(2)], Times: 1, Delay: 3 * time.Second})
	case MAASDeployFail:
		err = maasFault(maassim.Fault{Kind: maassim.FaultCurtinFailure, Times: 1})
	case MAASDeployStuck:
		err = maasFault(maassim.Fault{Kind: maassim.FaultDeployStuck, Times: 1})
	case MAASDeployLost:
		err = maasFault(maassim.Fault{Kind: maassim.FaultDeployLostAfterAllocate, Times: 1})
	case MAASEraseFail:
		err = maasFault(maassim.Fault{Kind: maassim.FaultEraseFailure, Times: 1})
	case MAASRestart:
		f.Target = "maassim"
		err = rg.ML.Restart(hold)
	case AgentKill:
		// Mid-provisioning (or mid-release): wait up to 5 s for a slice in
		// flight on the host.
		limit := time.Now().Add(5 * time.Second)
		for time.Now().Before(limit) && ctx.Err() == nil &&
			len(n.obs.inState(proto.ShapeGPUSlice, proto.AllocProvisioning))+len(n.obs.inState(proto.ShapeGPUSlice, proto.AllocReleasing)) == 0 {
			sleep(ctx, 50*time.Millisecond)
		}
		inflight := append(n.obs.inState(proto.ShapeGPUSlice, proto.AllocProvisioning), n.obs.inState(proto.ShapeGPUSlice, proto.AllocReleasing)...)
		f.Target = "agent-" + WFSliceHost
		n.log("%6.1fs nemesis: kill -9 agent %s (slices in flight: %v)", n.h.Now().Seconds(), WFSliceHost, inflight)
		rg.KillAgent(WFSliceHost)
		sleep(ctx, hold)
		if !n.noRestart {
			err = rg.RestartAgent(WFSliceHost)
		}
	case KillLeader:
		// Mid-workflow when one runs: wait up to 5 s for a baremetal
		// deploy or release in flight.
		limit := time.Now().Add(5 * time.Second)
		for time.Now().Before(limit) && ctx.Err() == nil &&
			len(n.obs.inState(proto.ShapeBaremetal, proto.AllocProvisioning))+len(n.obs.inState(proto.ShapeBaremetal, proto.AllocReleasing)) == 0 {
			sleep(ctx, 50*time.Millisecond)
		}
		lctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		leader, lerr := rg.C.Leader(lctx)
		cancel()
		if lerr != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("%s: %w", kind, lerr)
		}
		f.Targets, f.Target = []int{leader}, rg.C.Nodes[leader].ID
		rg.C.Kill(leader)
		sleep(ctx, hold)
		rg.C.StartNode(leader)
	default:
		return fmt.Errorf("unknown workflow fault %q (known: %s)", kind, strings.Join(WFFaults, ", "))
	}
	if strings.HasPrefix(kind, "maas-deploy-") || kind == MAASEraseFail {
		if !strings.HasSuffix(f.Target, "(not fired)") {
			// The operator's way back when a failed deploy or erase
			// drained the node: undrain it and reset its breaker (admin).
			wait := 10 * time.Second
			if kind == MAASDeployStuck || kind == MAASDeployLost {
				wait = 5 * time.Second // retried or resumed: usually no drain
			}
			n.undrain(ctx, wait)
		}
	}
	f.Stop = n.h.Now()
	n.faults = append(n.faults, f)
	return err
}

func (n *wfNemesis) undrain(ctx context.Context, wait time.Duration) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 20*time.Second)
	defer cancel()
	// The failure drains the node once the workflow that met it has
	// failed: wait for that (up to wait; a deploy retried after a stuck
	// one may never drain it), then undrain.
	limit := time.Now().Add(wait)
	for i := 0; time.Now().Before(limit); i++ {
		var d proto.NodeDetail
		if _, err := n.rg.C.Do(rctx, i%len(n.rg.C.Nodes), http.MethodGet, "/v1/nodes/"+WFBMHost, "", nil, &d); err == nil && d.Node.Draining {
			n.log("%6.1fs nemesis: %s is drained; undraining it", n.h.Now().Seconds(), WFBMHost)
			break
		}
		sleep(rctx, 200*time.Millisecond)
	}
	for _, path := range []string{"/v1/nodes/" + WFBMHost + "/undrain", "/v1/nodes/" + WFBMHost + "/breaker/reset"} {
		for i := 0; rctx.Err() == nil; i++ {
			// Done once a coordinator answered (a node not drained, a
			// breaker not open are answers too).
			if code, _ := n.rg.C.Do(rctx, i%len(n.rg.C.Nodes), http.MethodPost, path, "", map[string]string{}, nil); code > 0 && code < 500 {
				break
			}
			sleep(rctx, 200*time.Millisecond)
		}
	}
}
