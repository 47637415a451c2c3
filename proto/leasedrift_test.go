package proto

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/assert"
)

func slotRef(slot, claim string, gen uint64) ClaimRef {
	return ClaimRef{ClaimID: claim, Kind: ClaimSlot, NodeID: "n1", SlotID: slot, Generation: gen}
}

func TestCompareLeases(t *testing.T) {
	live := func(r ClaimRef, st AllocState) LiveClaim { return LiveClaim{Claim: r, AllocState: st} }
	tests := []struct {
		name              string
		leases            []ClaimRef
		claims            []LiveClaim
		missing, orphaned []ClaimRef
	}{
		{name: "nothing"},
		{name: "in agreement",
			leases: []ClaimRef{slotRef("s1", "c1", 3), slotRef("s0", "c0", 1)},
			claims: []LiveClaim{live(slotRef("s0", "c0", 1), AllocActive), live(slotRef("s1", "c1", 3), AllocProvisioning)}},
		{name: "lease of an ended claim is orphaned",
			leases:   []ClaimRef{slotRef("s0", "c0", 1)},
			orphaned: []ClaimRef{slotRef("s0", "c0", 1)}},
		{name: "stale generation or another claim on the slot is orphaned",
			leases:   []ClaimRef{slotRef("s0", "c0", 1), slotRef("s1", "old", 2)},
			claims:   []LiveClaim{live(slotRef("s0", "c0", 2), AllocPlaced), live(slotRef("s1", "new", 3), AllocPlaced)},
			orphaned: []ClaimRef{slotRef("s0", "c0", 1), slotRef("s1", "old", 2)}},
		{name: "claims of placed allocations are not leased yet",
			claims: []LiveClaim{live(slotRef("s0", "c0", 1), AllocPlaced), live(slotRef("s1", "c1", 1), AllocPending)}},
		{name: "claims of provisioning or active allocations without a lease are missing, sorted",
			claims: []LiveClaim{live(slotRef("s2", "c2", 1), AllocActive), live(slotRef("s1", "c1", 1), AllocProvisioning),
				live(slotRef("s3", "c3", 1), AllocReleasing)},
			missing: []ClaimRef{slotRef("s1", "c1", 1), slotRef("s2", "c2", 1)}},
		{name: "node-exclusive claims hold no leases",
			claims: []LiveClaim{live(ClaimRef{ClaimID: "bm", Kind: ClaimNodeExclusive, NodeID: "n1", Generation: 4}, AllocActive)}},
		{name: "both at once",
			leases:   []ClaimRef{slotRef("s5", "c5", 1)},
			claims:   []LiveClaim{live(slotRef("s4", "c4", 1), AllocActive)},
			missing:  []ClaimRef{slotRef("s4", "c4", 1)},
			orphaned: []ClaimRef{slotRef("s5", "c5", 1)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			missing, orphaned := CompareLeases(tt.leases, tt.claims)
			if d := cmp.Diff(tt.missing, missing); d != "" {
				t.Errorf("missing (-want +got):\n%s", d)
			}
			if d := cmp.Diff(tt.orphaned, orphaned); d != "" {
				t.Errorf("orphaned (-want +got):\n%s", d)
			}
		})
	}
}

func TestConfirmedRefsAndSameAs(t *testing.T) {
	a, b, c := slotRef("s0", "c0", 1), slotRef("s1", "c1", 1), slotRef("s2", "c2", 1)
	assert.Equal(t, []ClaimRef{b}, ConfirmedRefs([]ClaimRef{a, b}, []ClaimRef{b, c}))
	assert.Nil(t, ConfirmedRefs(nil, []ClaimRef{a}), "one heartbeat is not enough")
	assert.Nil(t, ConfirmedRefs([]ClaimRef{a}, nil), "gone at once")

	var none *LeaseDrift
	assert.True(t, none.SameAs(&LeaseDrift{}))
	assert.True(t, (&LeaseDrift{Missing: []ClaimRef{a}}).SameAs(&LeaseDrift{Missing: []ClaimRef{a}}))
	assert.False(t, (&LeaseDrift{Missing: []ClaimRef{a}}).SameAs(&LeaseDrift{Orphaned: []ClaimRef{a}}))
	assert.False(t, none.SameAs(&LeaseDrift{Orphaned: []ClaimRef{a}}))
}
