package chaos

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
)

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

// op builds an operation over [call, ret] ms.
func op(kind Kind, key, id string, call, ret int, res Result) Op {
	return Op{Kind: kind, Key: key, AllocID: id, Call: ms(call), Return: ms(ret), Result: res}
}

func created(o Op, claims ...string) Op { o.Created, o.ClaimIDs = true, claims; return o }
func ended(o Op) Op                     { o.Ended = true; return o }
func slotRead(slot, claim string, call, ret int) Op {
	return Op{Kind: OpReadSlot, SlotID: slot, ClaimID: claim, Call: ms(call), Return: ms(ret), Result: ResOK}
}

// The checker accepts what a correct ledger may answer and rejects what
// it may not: each history is small enough to reason about by hand.
func TestCheck(t *testing.T) {
	claims := map[string]string{"cl1": "s1", "cl2": "s1", "cl3": "s2"}
	for _, tc := range []struct {
		name       string
		ops        []Op
		alloc, slt int // violations expected
		ledger     *Ledger
		want       []string // in the violations' text
	}{
		{name: "every attempt unknown, the ledger shows the claim", ledger: &Ledger{
			KeyAlloc: map[string]string{"k": "a1"}, AllocClaims: map[string][]string{"a1": {"cl1"}}, ClaimSlot: claims},
			ops: []Op{
				op(OpCreate, "k", "", 0, 10, ResUnknown),
				slotRead("s1", "cl1", 20, 30),
			}},
		{name: "a slot read names a claim no create made", slt: 1, ops: []Op{
			op(OpCreate, "k", "", 0, 10, ResUnknown),
			slotRead("s1", "cl1", 20, 30),
		}},
		// Seed 998358's signature: slot reads name a claim no operation of
		// the slot made, because the allocation holding it was created
		// under a key whose every create was answered "no capacity".
		{name: "a create refused with no capacity took effect", alloc: 1, slt: 1,
			want: []string{"every create of its key was refused: no_cap at 0.000s", "names claim cl1 of allocation a1 (key k), which no recorded create could have made"},
			ledger: &Ledger{
				KeyAlloc: map[string]string{"k": "a1"}, AllocClaims: map[string][]string{"a1": {"cl1"}}, ClaimSlot: claims},
			ops: []Op{
				op(OpCreate, "k", "", 0, 10, ResNoCap),
				slotRead("s1", "cl1", 20, 30),
			}},
		{name: "an allocation no create of its key was sent for", alloc: 1, ledger: &Ledger{
			KeyAlloc: map[string]string{"k": "a1"}, AllocClaims: map[string][]string{"a1": {"cl1"}}, ClaimSlot: claims}},
		{name: "refused, then an unknown attempt that made it", ledger: &Ledger{
			KeyAlloc: map[string]string{"k": "a1"}, AllocClaims: map[string][]string{"a1": {"cl1"}}, ClaimSlot: claims},
			ops: []Op{
				op(OpCreate, "k", "", 0, 10, ResUnknown),
				op(OpCreate, "k", "", 20, 30, ResNoCap),
				slotRead("s1", "cl1", 40, 50),
			}},
		{name: "create, read, release, read", ops: []Op{
			created(op(OpCreate, "k", "a1", 0, 10, ResOK), "cl1"),
			op(OpRead, "k", "a1", 20, 30, ResOK),
			op(OpRelease, "k", "a1", 40, 50, ResOK),
			ended(op(OpRead, "k", "a1", 60, 70, ResOK)),
		}},
		{name: "read after the create returned misses it (stale)", alloc: 1, ops: []Op{
			created(op(OpCreate, "k", "a1", 0, 10, ResOK), "cl1"),
			op(OpRead, "k", "a1", 20, 30, ResNotFound),
		}},
		{name: "read concurrent with the create may miss it", ops: []Op{
			created(op(OpCreate, "k", "a1", 0, 10, ResOK), "cl1"),
			op(OpRead, "k", "a1", 5, 30, ResNotFound),
		}},
		{name: "read after the release sees it live (stale)", alloc: 1, ops: []Op{
			created(op(OpCreate, "k", "a1", 0, 10, ResOK), "cl1"),
			op(OpRelease, "k", "a1", 40, 50, ResOK),
			op(OpRead, "k", "a1", 60, 70, ResOK),
		}},
		{name: "re-sent key answered with another allocation", alloc: 1, ops: []Op{
			created(op(OpCreate, "k", "a1", 0, 10, ResOK), "cl1"),
			op(OpCreate, "k", "a2", 20, 30, ResOK),
		}},
		{name: "unknown create, re-send answers 200 with the same allocation", ops: []Op{
			op(OpCreate, "k", "", 0, 10, ResUnknown),
			op(OpCreate, "k", "a1", 20, 30, ResOK),
			op(OpRead, "k", "a1", 40, 50, ResOK),
		}},
		// A follower re-sends a keyed create to the new leader when the old
		// one was lost mid-request; the old one may have applied it, so the
		// client's only answer is a replay (200).
		{name: "a replay (200) with no earlier attempt", ops: []Op{
			op(OpCreate, "k", "a1", 20, 30, ResOK),
			op(OpRead, "k", "a1", 40, 50, ResOK),
		}},
		{name: "a replay (200) of an ended allocation with no earlier attempt", alloc: 1, ops: []Op{
			ended(op(OpCreate, "k", "a1", 20, 30, ResOK)),
		}},
		{name: "unknown release then already released", ops: []Op{
			created(op(OpCreate, "k", "a1", 0, 10, ResOK), "cl1"),
			op(OpRelease, "k", "a1", 20, 30, ResUnknown),
			op(OpRelease, "k", "a1", 40, 50, ResAlready),
		}},
		{name: "released twice", alloc: 1, slt: 1, ops: []Op{
			created(op(OpCreate, "k", "a1", 0, 10, ResOK), "cl1"),
			op(OpRelease, "k", "a1", 20, 30, ResOK),
			op(OpRelease, "k", "a1", 40, 50, ResOK),
		}},
		{name: "no capacity after the key was acknowledged", alloc: 1, ops: []Op{
			created(op(OpCreate, "k", "a1", 0, 10, ResOK), "cl1"),
			op(OpCreate, "k", "", 20, 30, ResNoCap),
		}},
		{name: "slot taken, freed, taken by another", ops: []Op{
			created(op(OpCreate, "k1", "a1", 0, 10, ResOK), "cl1"),
			slotRead("s1", "cl1", 12, 14),
			op(OpRelease, "k1", "a1", 20, 30, ResOK),
			slotRead("s1", "", 32, 34),
			created(op(OpCreate, "k2", "a2", 40, 50, ResOK), "cl2"),
			slotRead("s1", "cl2", 52, 54),
		}},
		{name: "slot double-claimed", slt: 1, ops: []Op{
			created(op(OpCreate, "k1", "a1", 0, 10, ResOK), "cl1"),
			created(op(OpCreate, "k2", "a2", 20, 30, ResOK), "cl2"),
		}},
		{name: "slot read shows a released claim (stale)", slt: 1, ops: []Op{
			created(op(OpCreate, "k1", "a1", 0, 10, ResOK), "cl1"),
			op(OpRelease, "k1", "a1", 20, 30, ResOK),
			slotRead("s1", "cl1", 40, 50),
		}},
		{name: "slot read misses an acknowledged claim (stale)", slt: 1, ops: []Op{
			created(op(OpCreate, "k3", "a3", 0, 10, ResOK), "cl3"),
			slotRead("s2", "", 40, 50),
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			l := Ledger{ClaimSlot: claims}
			if tc.ledger != nil {
				l = *tc.ledger
			}
			r := Check(tc.ops, l, dir, 10*time.Second)
			assert.Equal(t, tc.alloc, r.AllocViolations, "allocation violations: %v", r.Violations)
			assert.Equal(t, tc.slt, r.SlotViolations, "slot violations: %v", r.Violations)
			assert.Len(t, r.Violations, tc.alloc+tc.slt)
			for _, w := range tc.want {
				assert.Contains(t, strings.Join(r.Violations, "\n"), w)
			}
			for _, v := range r.Visualizations {
				b, err := os.ReadFile(v)
				require.NoError(t, err)
				assert.True(t, strings.Contains(string(b), "<html"), "%s is porcupine's HTML", v)
			}
		})
	}
}

func TestStuckHealthy(t *testing.T) {
	ops := []Op{
		{Node: 0, Call: 0, Return: 12 * time.Second}, // to the faulted server
		{Node: 1, Call: 0, Return: 12 * time.Second}, // to a healthy one
		{Node: 1, Call: 0, Return: 2 * time.Second},  // not stuck
	}
	faults := []Fault{{Kind: IsolateLeader, Targets: []int{0}, Start: time.Second, Stop: 5 * time.Second}}
	assert.Equal(t, 1, stuckHealthy(ops, faults))
}

// LifecycleModel (the workflow rig) accepts an allocation's lifecycle as
// consistent reads may see it, and rejects reads that go back, a live
// allocation shown after an acknowledged release, a terminal state that
// changes, and a key answered with two allocations.
func TestLifecycleModel(t *testing.T) {
	st := func(o Op, s proto.AllocState) Op { o.State = s; return o }
	for _, tc := range []struct {
		name  string
		ops   []Op
		legal bool
	}{
		{name: "create, provision, active, release, released", legal: true, ops: []Op{
			created(st(op(OpCreate, "k", "a1", 0, 10, ResOK), proto.AllocPlaced)),
			st(op(OpRead, "k", "a1", 20, 30, ResOK), proto.AllocProvisioning),
			st(op(OpRead, "k", "a1", 40, 50, ResOK), proto.AllocActive),
			op(OpRelease, "k", "a1", 60, 70, ResOK),
			st(op(OpRead, "k", "a1", 80, 90, ResOK), proto.AllocReleasing),
			st(op(OpRead, "k", "a1", 100, 110, ResOK), proto.AllocReleased),
		}},
		{name: "concurrent reads may see either side of a step", legal: true, ops: []Op{
			created(st(op(OpCreate, "k", "a1", 0, 10, ResOK), proto.AllocPlaced)),
			st(op(OpRead, "k", "a1", 20, 60, ResOK), proto.AllocActive),
			st(op(OpRead, "k", "a1", 30, 50, ResOK), proto.AllocProvisioning),
		}},
		{name: "a read goes back from active to provisioning", ops: []Op{
			created(st(op(OpCreate, "k", "a1", 0, 10, ResOK), proto.AllocPlaced)),
			st(op(OpRead, "k", "a1", 20, 30, ResOK), proto.AllocActive),
			st(op(OpRead, "k", "a1", 40, 50, ResOK), proto.AllocProvisioning),
		}},
		{name: "active after an acknowledged release", ops: []Op{
			created(st(op(OpCreate, "k", "a1", 0, 10, ResOK), proto.AllocActive)),
			op(OpRelease, "k", "a1", 20, 30, ResOK),
			st(op(OpRead, "k", "a1", 40, 50, ResOK), proto.AllocActive),
		}},
		{name: "failed, then released", ops: []Op{
			created(st(op(OpCreate, "k", "a1", 0, 10, ResOK), proto.AllocPlaced)),
			st(op(OpRead, "k", "a1", 20, 30, ResOK), proto.AllocFailed),
			st(op(OpRead, "k", "a1", 40, 50, ResOK), proto.AllocReleased),
		}},
		{name: "not found after an acknowledged create", ops: []Op{
			created(st(op(OpCreate, "k", "a1", 0, 10, ResOK), proto.AllocPlaced)),
			op(OpRead, "k", "a1", 20, 30, ResNotFound),
		}},
		{name: "one key, two allocations", ops: []Op{
			created(st(op(OpCreate, "k", "a1", 0, 10, ResOK), proto.AllocPlaced)),
			st(op(OpCreate, "k", "a2", 20, 30, ResOK), proto.AllocPlaced),
		}},
		{name: "an unknown release may have happened", legal: true, ops: []Op{
			created(st(op(OpCreate, "k", "a1", 0, 10, ResOK), proto.AllocActive)),
			op(OpRelease, "k", "a1", 20, 30, ResUnknown),
			st(op(OpRead, "k", "a1", 40, 50, ResOK), proto.AllocReleasing),
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep := &WFReport{Report: &Report{ByKind: map[string]int{}}}
			checkLifecycle(tc.ops, "", rep)
			if tc.legal {
				assert.Zero(t, rep.LifecycleViolations, rep.Violations)
			} else {
				assert.Equal(t, 1, rep.LifecycleViolations, "must be refused")
			}
		})
	}
}
