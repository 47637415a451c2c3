package cli

import (
	"bytes"
	"strings"
	"testing"
	"text/tabwriter"

	"github.com/stretchr/testify/assert"

	"github.com/gpuaas/gpuaas/proto"
)

// The SLICE-READY column never shows a stale "yes": readiness is the
// agent's last report, which says nothing about a node that stopped
// answering.
func TestSliceReadyColumn(t *testing.T) {
	t.Parallel()
	ready := &proto.Readiness{Active: true, SliceReady: true}
	blocked := &proto.Readiness{Active: true, SliceReady: false, Blockers: []string{"ipoib_missing: ib0", "route_missing: 10.0.0.0/8"}}
	oneBlocker := &proto.Readiness{Active: true, SliceReady: false, Blockers: []string{"ipoib_missing: ib0"}}
	cases := []struct {
		state proto.NodeState
		rd    *proto.Readiness
		want  string
	}{
		{proto.NodeActive, ready, "yes"},
		{proto.NodeActive, blocked, "no (2 blockers)"},
		{proto.NodeActive, oneBlocker, "no (1 blocker)"},
		{proto.NodeActive, nil, "unknown"},
		{proto.NodeUnreachable, ready, "no (unreachable)"},
		{proto.NodeUnreachable, nil, "no (unreachable)"},
		{proto.NodeDisabled, ready, "no (disabled)"},
		{proto.NodeRegistered, nil, "no (registered)"},
	}
	for _, tc := range cases {
		n := proto.Node{ID: "j22u15", State: tc.state, Readiness: tc.rd, ProfileIntent: proto.IntentSliceVM}
		assert.Equal(t, tc.want, SliceReady(n), "%s", tc.state)
	}
	// A baremetal node never carries slices, whatever its agent says.
	for _, st := range []proto.NodeState{proto.NodeActive, proto.NodeUnreachable} {
		assert.Equal(t, "- (baremetal)", SliceReady(proto.Node{ID: "j27u15", State: st, Readiness: ready, ProfileIntent: proto.IntentBaremetal}))
	}

	var buf bytes.Buffer
	w := tabwriter.NewWriter(&buf, 0, 4, 2, ' ', 0)
	nodeRow(w, proto.Node{ID: "j22u15", Region: "lab-east", Pool: "lab-h200", ProfileIntent: proto.IntentSliceVM,
		State: proto.NodeUnreachable, Readiness: ready})
	w.Flush()
	assert.True(t, strings.HasSuffix(strings.TrimSpace(buf.String()), "no (unreachable)"), buf.String())

	buf.Reset()
	w = tabwriter.NewWriter(&buf, 0, 4, 2, ' ', 0)
	nodeDetail(w, proto.NodeDetail{Node: proto.Node{ID: "j22u15", State: proto.NodeUnreachable, Readiness: ready}})
	w.Flush()
	assert.Contains(t, buf.String(), "no (node is unreachable; the agent's last report said yes)")

	buf.Reset()
	w = tabwriter.NewWriter(&buf, 0, 4, 2, ' ', 0)
	nodeDetail(w, proto.NodeDetail{Node: proto.Node{ID: "j22u15", State: proto.NodeActive},
		SlotSummary: proto.SlotSummary{Total: 2, ByStatus: map[proto.SlotStatus]int{proto.SlotAvailable: 1, proto.SlotQuarantined: 1}},
		Quarantined: []proto.QuarantinedSlot{{SlotID: "j22u15-s1", Reason: "restore: claim c9 points to missing allocation a9"}}})
	w.Flush()
	assert.Contains(t, buf.String(), "2 (available 1, quarantined 1)")
	assert.Contains(t, buf.String(), "Quarantined j22u15-s1:")
	assert.Contains(t, buf.String(), "restore: claim c9 points to missing allocation a9")
}
