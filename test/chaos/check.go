package chaos

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// allocState is the allocation model's state for one idempotency key.
type allocState struct {
	Created bool
	ID      string // "" while only an unknown-outcome create may have made it
	Ended   bool
}

// AllocModel is the sequential specification of one allocation, keyed by
// its idempotency key: create is idempotent (every answer for a key names
// the same allocation), a consistent read sees every acknowledged create
// and release before it, release ends it once.
//
// An unknown-outcome operation (Result unknown) gets a return time after
// every other operation, so the checker may place it anywhere after its
// call — including after everything, which is the same as never
// happening.
var AllocModel = porcupine.Model{
	Init: func() any { return allocState{} },
	Step: func(state, input, output any) (bool, any) {
		st, op := state.(allocState), input.(Op)
		sameID := st.ID == "" || st.ID == op.AllocID
		switch op.Kind {
		case OpCreate:
			switch op.Result {
			case ResOK:
				if !st.Created {
					// The first answer is normally the one that created it
					// (201). It may also report the key as known (200): a
					// follower re-sends a keyed create to the new leader
					// when the old one was lost mid-request, and the old
					// one may have applied it (coordinator/api/forward.go).
					return !op.Ended, allocState{Created: true, ID: op.AllocID}
				}
				st.ID = op.AllocID
				return sameID && !op.Created && op.Ended == st.Ended, st
			case ResNoCap:
				return !st.Created, st
			case ResUnknown:
				if !st.Created {
					return true, allocState{Created: true}
				}
				return true, st
			}
		case OpRead:
			switch op.Result {
			case ResOK:
				return st.Created && sameID && st.Ended == op.Ended, st
			case ResNotFound:
				return !st.Created, st
			}
		case OpRelease:
			switch op.Result {
			case ResOK:
				if !st.Created || !sameID || st.Ended {
					return false, st
				}
				st.Ended = true
				return true, st
			case ResAlready:
				return st.Created && st.Ended, st
			case ResNotFound:
				return !st.Created, st
			case ResUnknown:
				if st.Created {
					st.Ended = true
				}
				return true, st
			}
		}
		return false, st
	},
	DescribeOperation: func(input, output any) string { return describe(input.(Op)) },
	DescribeState: func(state any) string {
		st := state.(allocState)
		switch {
		case !st.Created:
			return "absent"
		case st.Ended:
			return st.ID + " ended"
		default:
			return st.ID + " live"
		}
	},
}

// slotOp is one operation as the slot model sees it: a claim made
// (create acknowledged, 201), confirmed (a re-sent create answered with
// the live allocation), freed (release), or read.
type slotOp struct {
	Op
	Claim string
	What  string // claim, confirm, free, read
}

// SlotModel is the sequential specification of one slot: at most one live
// claim holds it; a claim takes a free slot, a release frees it, a
// consistent read names the holder.
var SlotModel = porcupine.Model{
	Init: func() any { return "" },
	Step: func(state, input, output any) (bool, any) {
		owner, op := state.(string), input.(slotOp)
		unknown := op.Result == ResUnknown
		switch op.What {
		case "claim":
			switch {
			case owner == "":
				return true, op.Claim
			case unknown:
				return true, owner // did not happen here
			default:
				return false, owner
			}
		case "confirm":
			switch owner {
			case op.Claim:
				return true, owner
			case "":
				// The create this answer confirms was applied by a
				// leader lost mid-request and re-sent by the follower
				// (see AllocModel): the claim is taken here.
				return true, op.Claim
			}
			return false, owner
		case "free":
			switch {
			case owner == op.Claim:
				return true, ""
			case unknown:
				return true, owner
			case op.Result == ResAlready:
				return true, owner
			default:
				return false, owner
			}
		case "read":
			return owner == op.ClaimID, owner
		}
		return false, owner
	},
	DescribeOperation: func(input, output any) string {
		op := input.(slotOp)
		if op.What == "read" {
			return fmt.Sprintf("read %s → %q (c%d→%d)", op.SlotID, op.ClaimID, op.Client, op.Node)
		}
		return fmt.Sprintf("%s %s by %s (%s, c%d→%d)", op.What, op.SlotID, op.Claim, op.Result, op.Client, op.Node)
	},
	DescribeState: func(state any) string {
		if state.(string) == "" {
			return "free"
		}
		return "held by " + state.(string)
	},
}

func describe(op Op) string {
	out := string(op.Result)
	switch {
	case op.Result == ResOK && op.Kind == OpCreate:
		out = fmt.Sprintf("%s (created=%v ended=%v)", op.AllocID, op.Created, op.Ended)
	case op.Result == ResOK && op.Kind == OpRead:
		out = fmt.Sprintf("%s ended=%v", op.AllocID, op.Ended)
	}
	if op.Err != "" {
		out += " [" + op.Err[:min(len(op.Err), 160)] + "]"
	}
	return fmt.Sprintf("%s %s → %s (c%d→node %d)", op.Kind, op.Key, out, op.Client, op.Node)
}

// Report is what a run found.
type Report struct {
	Ops     int            `json:"ops"`
	ByKind  map[string]int `json:"by_kind"`
	Unknown int            `json:"unknown_outcomes"`
	Faults  []Fault        `json:"faults"`
	Stuck   int            `json:"stuck_requests"` // answered (or given up on) after more than StuckAfter
	// StuckHealthy are the stuck requests sent to a server no fault
	// targeted while they ran.
	StuckHealthy int           `json:"stuck_requests_healthy"`
	MaxLatency   time.Duration `json:"max_latency"`
	// Allocations and slots checked, and how many have no linearization.
	Keys              int `json:"keys"`
	Slots             int `json:"slots"`
	AllocViolations   int `json:"alloc_violations"`
	SlotViolations    int `json:"slot_violations"`
	CheckTimeouts     int `json:"check_timeouts"` // partitions porcupine gave up on (not counted as violations)
	DoubleClaims      int `json:"double_claims"`  // invariant failures of the log replay
	LostAcks          int `json:"lost_acks"`      // acknowledged allocations missing from a replica
	ReplicaDivergence int `json:"replica_divergence"`
	// NotConverged: the replicas did not reach the same applied index
	// within a minute of the heal (liveness, counted as a violation).
	NotConverged int `json:"not_converged"`
	// StuckWorkflows are allocations and MAAS workflows that did not end
	// within their bound (the workflow rig; a liveness violation).
	StuckWorkflows int `json:"stuck_workflows"`
	// Workflows marks a report of the workflow rig.
	Workflows bool `json:"workflows,omitempty"`
	// SlowStops are servers that did not stop within 10 s of SIGTERM.
	SlowStops int `json:"slow_stops"`
	// Violations names each violation; Visualizations are porcupine's
	// HTML views of them.
	Violations     []string `json:"violations"`
	Visualizations []string `json:"visualizations"`
}

// StuckAfter is the longest a request may take (issue: 10 s outside
// blocking queries).
const StuckAfter = 10 * time.Second

// Linearizable reports whether the run found no violation.
func (r *Report) Linearizable() bool { return r.AllocViolations == 0 && r.SlotViolations == 0 }

// OK reports whether every checked property held.
func (r *Report) OK() bool {
	return r.Linearizable() && r.DoubleClaims == 0 && r.LostAcks == 0 && r.ReplicaDivergence == 0 && r.NotConverged == 0 && r.StuckWorkflows == 0
}

func (r *Report) String() string {
	var kinds []string
	for k, n := range r.ByKind {
		kinds = append(kinds, fmt.Sprintf("%s %d", k, n))
	}
	sort.Strings(kinds)
	var fs []string
	for _, f := range r.Faults {
		fs = append(fs, fmt.Sprintf("%s(%s)@%.1fs+%.1fs", f.Kind, f.Target, f.Start.Seconds(), (f.Stop-f.Start).Seconds()))
	}
	return fmt.Sprintf("ops %d (%s), unknown outcomes %d; faults %d: %s; keys %d, slots %d; linearizability violations: allocations %d, slots %d (check timeouts %d); double claims %d, lost acks %d, replica divergence %d, not converged %d, slow stops %d; stuck requests (> %s) %d (to servers no fault targeted: %d), max latency %s",
		r.Ops, strings.Join(kinds, ", "), r.Unknown, len(r.Faults), strings.Join(fs, " "), r.Keys, r.Slots,
		r.AllocViolations, r.SlotViolations, r.CheckTimeouts, r.DoubleClaims, r.LostAcks, r.ReplicaDivergence, r.NotConverged, r.SlowStops,
		StuckAfter, r.Stuck, r.StuckHealthy, r.MaxLatency.Round(time.Millisecond))
}

// Ledger is what the healed cluster holds after a run, read back for the
// slot view: which allocation each idempotency key made (so a create whose
// every attempt had an unknown outcome still claims its slots), each
// allocation's claims and each claim's slot.
type Ledger struct {
	KeyAlloc    map[string]string
	AllocClaims map[string][]string
	ClaimSlot   map[string]string
}

// Check runs porcupine over the history, per allocation and per slot.
// Violations are visualized under outDir (when set), at most five files.
func Check(ops []Op, l Ledger, outDir string, timeout time.Duration) *Report {
	keyAlloc, claimSlot := l.KeyAlloc, l.ClaimSlot
	r := &Report{ByKind: map[string]int{}}
	var end time.Duration
	for _, op := range ops {
		end = max(end, op.Return)
	}
	never := int64(end + time.Hour) // return time of an unknown outcome
	byKey := map[string][]porcupine.Operation{}
	bySlot := map[string][]porcupine.Operation{}
	claimsOf := map[string][]string{} // allocation → claims
	for _, op := range ops {
		if op.Kind == OpCreate && op.Result == ResOK {
			claimsOf[op.AllocID] = op.ClaimIDs
		}
	}
	for a, cs := range l.AllocClaims {
		if _, ok := claimsOf[a]; !ok {
			claimsOf[a] = cs
		}
	}
	// An unknown-outcome write is open until the end of the history, and
	// each open write multiplies what porcupine must search. Bound them
	// with what the ledger's semantics allow: once an attempt for a key
	// is answered, a late commit of an earlier attempt is a no-op (the
	// key is taken; the allocation is released already). So an unknown
	// attempt returns, at the latest, when the answered one did, and not
	// at all when the answered one says it made the change itself (201
	// Created, release ok).
	type answer struct {
		ret  time.Duration
		made bool
	}
	created, released := map[string]answer{}, map[string]answer{}
	for _, op := range ops {
		var m map[string]answer
		var k string
		switch {
		case op.Kind == OpCreate && op.Result == ResOK:
			m, k = created, op.Key
		case op.Kind == OpRelease && (op.Result == ResOK || op.Result == ResAlready):
			m, k = released, op.AllocID
		default:
			continue
		}
		if a, ok := m[k]; !ok || op.Return < a.ret {
			m[k] = answer{op.Return, op.Result == ResOK && (op.Kind == OpRelease || op.Created)}
		}
	}
	for i, op := range ops {
		r.Ops++
		r.ByKind[string(op.Kind)+" "+string(op.Result)]++
		lat := op.Return - op.Call
		r.MaxLatency = max(r.MaxLatency, lat)
		if lat > StuckAfter {
			r.Stuck++
		}
		ret := int64(op.Return)
		if op.Result == ResUnknown {
			r.Unknown++
			if op.Kind == OpRead || op.Kind == OpReadSlot {
				continue // no effect
			}
			ret = never
			a, ok := created[op.Key]
			if op.Kind == OpRelease {
				a, ok = released[op.AllocID]
			}
			if ok && a.ret >= op.Call {
				if a.made {
					continue // the answered attempt made the change: this one did nothing
				}
				ret = int64(a.ret)
			}
		}
		pop := porcupine.Operation{ClientId: op.Client, Input: op, Call: int64(op.Call), Return: ret, Metadata: i}
		byKey[op.Key] = append(byKey[op.Key], pop)
		// The slot view.
		add := func(claim, what string) {
			slot := claimSlot[claim]
			if slot == "" {
				return
			}
			so := op
			so.SlotID = slot
			p := pop
			p.Input = slotOp{Op: so, Claim: claim, What: what}
			bySlot[slot] = append(bySlot[slot], p)
		}
		switch op.Kind {
		case OpCreate:
			id := op.AllocID
			if op.Result == ResUnknown {
				id = keyAlloc[op.Key]
			}
			if op.Result == ResOK && op.Ended {
				continue // a re-send answered with the ended allocation: no slot effect
			}
			for _, c := range claimsOf[id] {
				switch {
				case op.Result == ResUnknown:
					add(c, "claim")
				case op.Result == ResOK && op.Created:
					add(c, "claim")
				case op.Result == ResOK:
					add(c, "confirm")
				}
			}
		case OpRelease:
			if op.Result == ResNotFound {
				continue
			}
			for _, c := range claimsOf[op.AllocID] {
				add(c, "free")
			}
		case OpReadSlot:
			if op.Result == ResOK {
				p := pop
				p.Input = slotOp{Op: op, What: "read"}
				bySlot[op.SlotID] = append(bySlot[op.SlotID], p)
			}
		}
	}
	delete(byKey, "") // slot reads
	r.Keys, r.Slots = len(byKey), len(bySlot)
	r.AllocViolations += unaccounted(ops, l, r)
	// A slot read that names a claim no operation of the slot's history
	// made has no linearization; say which allocation the claim is of,
	// so the violation names its cause (see unaccounted).
	notes := map[string][]string{}
	noted := map[string]bool{}
	claimAlloc := map[string]string{}
	for a, cs := range l.AllocClaims {
		for _, c := range cs {
			claimAlloc[c] = a
		}
	}
	inHistory := map[string]bool{} // slot + claim
	for slot, hist := range bySlot {
		for _, p := range hist {
			if so := p.Input.(slotOp); so.What != "read" {
				inHistory[slot+" "+so.Claim] = true
			}
		}
	}
	for _, op := range ops {
		if op.Kind != OpReadSlot || op.Result != ResOK || op.ClaimID == "" || inHistory[op.SlotID+" "+op.ClaimID] || noted[op.SlotID+" "+op.ClaimID] {
			continue
		}
		noted[op.SlotID+" "+op.ClaimID] = true
		var why string
		switch a := claimAlloc[op.ClaimID]; {
		case a == "":
			why = "which no allocation of the healed ledger holds"
		case claimSlot[op.ClaimID] != op.SlotID:
			why = fmt.Sprintf("of allocation %s, which the healed ledger puts on slot %q", a, claimSlot[op.ClaimID])
		default:
			why = fmt.Sprintf("of allocation %s (key %s), which no recorded create could have made", a, keyOf(l.KeyAlloc, a))
		}
		notes[op.SlotID] = append(notes[op.SlotID], fmt.Sprintf("read at %.3fs names claim %s %s", op.Call.Seconds(), op.ClaimID, why))
	}
	viz := 0
	check := func(model porcupine.Model, kind, name string, hist []porcupine.Operation) {
		res, info := porcupine.CheckOperationsVerbose(model, hist, timeout)
		switch res {
		case porcupine.Unknown:
			r.CheckTimeouts++
		case porcupine.Illegal:
			if kind == "allocation" {
				r.AllocViolations++
			} else {
				r.SlotViolations++
			}
			msg := fmt.Sprintf("%s %s: no linearization of its %d operations", kind, name, len(hist))
			if kind == "slot" && len(notes[name]) > 0 {
				msg += " (" + strings.Join(notes[name], "; ") + ")"
			}
			if outDir != "" && viz < 5 {
				viz++
				path := filepath.Join(outDir, fmt.Sprintf("violation-%s-%s.html", kind, sanitize(name)))
				if err := os.MkdirAll(outDir, 0o755); err == nil {
					if err := porcupine.VisualizePath(model, info, path); err == nil {
						r.Visualizations = append(r.Visualizations, path)
						msg += " (see " + path + ")"
					}
				}
			}
			r.Violations = append(r.Violations, msg)
		}
	}
	for _, k := range sortedKeys(byKey) {
		check(AllocModel, "allocation", k, byKey[k])
	}
	for _, s := range sortedKeys(bySlot) {
		check(SlotModel, "slot", s, bySlot[s])
	}
	return r
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' {
			return r
		}
		return '_'
	}, s)
}

// unaccounted reports each allocation of the healed ledger that no
// recorded create could have made: its key was never sent, or every
// create of its key was refused (no capacity, not found). Such an
// allocation holds capacity the client was told it did not get; the
// slot view cannot see it (no operation names its claims), so without
// this its claims show only as reads no linearization explains. It is a
// violation of the key's sequential specification (a refused create took
// effect) and counts as an allocation violation.
func unaccounted(ops []Op, l Ledger, r *Report) int {
	type answers struct {
		couldMake bool // an acknowledged or unknown create
		refused   []string
	}
	byKey := map[string]*answers{}
	for _, op := range ops {
		if op.Kind != OpCreate {
			continue
		}
		a := byKey[op.Key]
		if a == nil {
			a = &answers{}
			byKey[op.Key] = a
		}
		switch op.Result {
		case ResOK, ResUnknown:
			a.couldMake = true
		default:
			a.refused = append(a.refused, fmt.Sprintf("%s at %.3fs→%.3fs (c%d→%d)", op.Result, op.Call.Seconds(), op.Return.Seconds(), op.Client, op.Node))
		}
	}
	n := 0
	for _, key := range sortedKeys(l.KeyAlloc) {
		id := l.KeyAlloc[key]
		a := byKey[key]
		switch {
		case a == nil:
			r.Violations = append(r.Violations, fmt.Sprintf("allocation %s (key %q) is in the healed ledger, but no create of its key was recorded", id, key))
		case !a.couldMake:
			r.Violations = append(r.Violations, fmt.Sprintf("allocation %s (key %s) is in the healed ledger, but every create of its key was refused: %s", id, key, strings.Join(a.refused, ", ")))
		default:
			continue
		}
		n++
	}
	return n
}

func keyOf(keyAlloc map[string]string, id string) string {
	for k, a := range keyAlloc {
		if a == id {
			return k
		}
	}
	return ""
}
