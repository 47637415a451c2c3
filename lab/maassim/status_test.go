package maassim_test

import (
	"encoding/json"
	"net/url"
	"slices"
	"strconv"
	"testing"

	"github.com/canonical/gomaasclient/entity/node"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/lab/maassim"
)

// TestStatusCodesMatchGomaasclient cross-checks the NODE_STATUS numbering
// against gomaasclient's own constants (written independently from
// maasserver/enum.py) and the display names against MAAS's
// NODE_STATUS_CHOICES.
func TestStatusCodesMatchGomaasclient(t *testing.T) {
	t.Parallel()
	pairs := []struct {
		sim  maassim.Status
		gmc  node.Status
		name string
	}{
		{maassim.StatusNew, node.StatusNew, "New"},
		{maassim.StatusCommissioning, node.StatusCommissioning, "Commissioning"},
		{maassim.StatusFailedCommissioning, node.StatusFailedCommissioning, "Failed commissioning"},
		{maassim.StatusMissing, node.StatusMissing, "Missing"},
		{maassim.StatusReady, node.StatusReady, "Ready"},
		{maassim.StatusReserved, node.StatusReserved, "Reserved"},
		{maassim.StatusDeployed, node.StatusDeployed, "Deployed"},
		{maassim.StatusRetired, node.StatusRetired, "Retired"},
		{maassim.StatusBroken, node.StatusBroken, "Broken"},
		{maassim.StatusDeploying, node.StatusDeploying, "Deploying"},
		{maassim.StatusAllocated, node.StatusAllocated, "Allocated"},
		{maassim.StatusFailedDeployment, node.StatusFailedDeployment, "Failed deployment"},
		{maassim.StatusReleasing, node.StatusReleasing, "Releasing"},
		{maassim.StatusFailedReleasing, node.StatusFailedReleasing, "Releasing failed"},
		{maassim.StatusDiskErasing, node.StatusDiskErasing, "Disk erasing"},
		{maassim.StatusFailedDiskErasing, node.StatusFailedDiskErasing, "Failed disk erasing"},
		{maassim.StatusRescueMode, node.StatusRescueMode, "Rescue mode"},
		{maassim.StatusEnteringRescueMode, node.StatusEnteringRescueMode, "Entering rescue mode"},
		{maassim.StatusFailedEnteringRescueMode, node.StatusFailedEnteringRescueMode, "Failed to enter rescue mode"},
		{maassim.StatusExitingRescueMode, node.StatusExitingRescueMode, "Exiting rescue mode"},
		{maassim.StatusFailedExitingRescueMode, node.StatusFailedExitingRescueMode, "Failed to exit rescue mode"},
		{maassim.StatusTesting, node.StatusTesting, "Testing"},
		{maassim.StatusFailedTesting, node.StatusFailedTesting, "Failed testing"},
	}
	require.Len(t, pairs, len(maassim.AllStatuses))
	for i, p := range pairs {
		assert.Equal(t, i, int(p.sim))
		assert.Equal(t, int(p.gmc), int(p.sim), p.name)
		assert.Equal(t, p.name, p.sim.String())
		back, ok := maassim.ParseStatusLabel(p.sim.Label())
		require.True(t, ok)
		assert.Equal(t, p.sim, back)
	}
}

func TestCanTransitionKnownRules(t *testing.T) {
	t.Parallel()
	cases := []struct {
		from, to maassim.Status
		ok       bool
	}{
		{maassim.StatusFailedDeployment, maassim.StatusDeploying, false}, // the retry path is release first
		{maassim.StatusFailedDeployment, maassim.StatusReleasing, true},
		{maassim.StatusReleasing, maassim.StatusReady, true},
		{maassim.StatusReady, maassim.StatusAllocated, true},
		{maassim.StatusAllocated, maassim.StatusDeploying, true},
		{maassim.StatusReady, maassim.StatusDeploying, false}, // deploy acquires first
		{maassim.StatusDeployed, maassim.StatusDeploying, false},
		{maassim.StatusDeploying, maassim.StatusDeployed, true},
		{maassim.StatusDeploying, maassim.StatusFailedDeployment, true},
		{maassim.StatusDiskErasing, maassim.StatusFailedDiskErasing, true},
		{maassim.StatusFailedDiskErasing, maassim.StatusReleasing, true},
		{maassim.StatusNew, maassim.StatusDeployed, false},
		{maassim.StatusCommissioning, maassim.StatusTesting, true},
		{maassim.StatusTesting, maassim.StatusReady, true},
		{maassim.StatusBroken, maassim.StatusAllocated, false},
		{maassim.StatusRescueMode, maassim.StatusReady, false},
	}
	for _, c := range cases {
		assert.Equal(t, c.ok, maassim.CanTransition(c.from, c.to), "%s -> %s", c.from, c.to)
	}
	// Staying put is always allowed; every in-progress status can fail;
	// every status can be marked broken.
	failures := map[maassim.Status]maassim.Status{
		maassim.StatusCommissioning: maassim.StatusFailedCommissioning,
		maassim.StatusDeploying:     maassim.StatusFailedDeployment,
		maassim.StatusReleasing:     maassim.StatusFailedReleasing,
		maassim.StatusDiskErasing:   maassim.StatusFailedDiskErasing,
		maassim.StatusTesting:       maassim.StatusFailedTesting,
	}
	for _, s := range maassim.AllStatuses {
		assert.True(t, maassim.CanTransition(s, s), s.String())
		assert.True(t, maassim.CanTransition(s, maassim.StatusBroken), s.String())
		if f, ok := failures[s]; ok {
			assert.True(t, maassim.CanTransition(s, f), s.String())
			assert.True(t, f.IsFailed())
		}
	}
}

// TestTransitionMatrix puts a machine in every status and tries every
// lifecycle op through the API: each op is accepted exactly in the statuses
// MAAS accepts it, a refusal is a 409 NodeStateViolation (text, no
// Retry-After) that changes nothing, and an acceptance only makes moves
// NODE_TRANSITIONS allows.
func TestTransitionMatrix(t *testing.T) {
	t.Parallel()
	releasable := []maassim.Status{maassim.StatusAllocated, maassim.StatusReserved, maassim.StatusBroken,
		maassim.StatusDeploying, maassim.StatusDeployed, maassim.StatusFailedDeployment,
		maassim.StatusFailedDiskErasing, maassim.StatusFailedReleasing}
	ops := []struct {
		op      string
		path    string // relative to the machine
		form    url.Values
		allowed []maassim.Status
	}{
		{"deploy", "", nil, []maassim.Status{maassim.StatusReady, maassim.StatusAllocated}},
		{"release", "", nil, append([]maassim.Status{maassim.StatusReady, maassim.StatusReleasing}, releasable...)},
		{"release", "", url.Values{"erase": {"true"}}, append([]maassim.Status{maassim.StatusReady, maassim.StatusReleasing}, releasable...)},
		{"commission", "", nil, []maassim.Status{maassim.StatusNew, maassim.StatusCommissioning,
			maassim.StatusFailedCommissioning, maassim.StatusReady, maassim.StatusMissing, maassim.StatusBroken,
			maassim.StatusFailedTesting, maassim.StatusTesting}},
		{"mark_broken", "", nil, maassim.AllStatuses},
		{"mark_fixed", "", nil, []maassim.Status{maassim.StatusBroken}},
		{"abort", "", nil, []maassim.Status{maassim.StatusDiskErasing, maassim.StatusCommissioning,
			maassim.StatusDeploying, maassim.StatusTesting}},
		{"set_storage_layout", "", url.Values{"storage_layout": {"flat"}}, []maassim.Status{maassim.StatusReady}},
		{"set_boot_disk", "blockdevices", nil, []maassim.Status{maassim.StatusReady}},
		{"link_subnet", "interfaces", url.Values{"mode": {"dhcp"}}, []maassim.Status{maassim.StatusNew,
			maassim.StatusReady, maassim.StatusFailedTesting, maassim.StatusAllocated, maassim.StatusBroken}},
	}
	f := newFixture(t)
	id := f.ready(t, "matrix", "52:54:00:00:10:01")
	var disks []struct {
		ID int `json:"id"`
	}
	_, _, body := f.raw(t, "GET", "nodes/"+id+"/blockdevices/", nil)
	require.NoError(t, json.Unmarshal([]byte(body), &disks))
	var ifs []struct {
		ID int `json:"id"`
	}
	_, _, body = f.raw(t, "GET", "nodes/"+id+"/interfaces/", nil)
	require.NoError(t, json.Unmarshal([]byte(body), &ifs))
	require.NotEmpty(t, disks)
	require.NotEmpty(t, ifs)

	for _, o := range ops {
		for _, from := range maassim.AllStatuses {
			require.NoError(t, f.sim.ForceStatus(id, from))
			var path string
			switch o.path {
			case "":
				path = "machines/" + id + "/?op=" + o.op
			case "blockdevices":
				path = "nodes/" + id + "/blockdevices/" + strconv.Itoa(disks[0].ID) + "/?op=" + o.op
			case "interfaces":
				path = "nodes/" + id + "/interfaces/" + strconv.Itoa(ifs[0].ID) + "/?op=" + o.op
			}
			code, hdr, body := f.raw(t, "POST", path, o.form)
			if len(body) > 200 {
				body = body[:200]
			}
			after, _ := f.sim.Machine(id)
			want := slices.Contains(o.allowed, from)
			if want {
				assert.Equal(t, 200, code, "%s from %s: %s", o.op, from, body)
				assert.True(t, maassim.CanTransition(from, after.Status) ||
					// deploy from Ready passes through Allocated
					(from == maassim.StatusReady && after.Status == maassim.StatusDeploying),
					"%s from %s went to %s", o.op, from, after.Status)
			} else {
				assert.Equal(t, 409, code, "%s from %s: %s", o.op, from, body)
				assert.Equal(t, "text/plain; charset=utf-8", hdr.Get("Content-Type"))
				assert.Empty(t, hdr.Get("Retry-After"), "a state violation is not retryable")
				assert.Equal(t, from, after.Status, "%s from %s changed state", o.op, from)
			}
		}
	}
}
