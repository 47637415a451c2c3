package readiness

import (
	"context"
	"encoding/json"
	"net/netip"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/agent/discovery"
	"github.com/gpuaas/gpuaas/agent/evidence"
	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/hostops/fabric"
	"github.com/gpuaas/gpuaas/lab/hostsim"
	"github.com/gpuaas/gpuaas/lab/hostsim/hostsimtest"
	"github.com/gpuaas/gpuaas/proto"
)

var gw = netip.MustParsePrefix("10.200.0.1/24")

// fabricSpec is the site fabric configuration of a lab host.
func fabricSpec(host string) *fabric.Spec {
	last := map[string]string{"j22u15": "22.15", "j22u11": "22.11", "j27u15": "27.15"}[host]
	return &fabric.Spec{
		Interface: "ibp26s0",
		Address:   netip.MustParsePrefix("172.16." + last + "/16"),
		Route:     fabric.Route{To: netip.MustParsePrefix("172.16.0.0/12"), Via: netip.MustParseAddr("172.16.0.1")},
	}
}

func evaluate(t *testing.T, root hostops.Root, host string, node Node) proto.Readiness {
	t.Helper()
	src := evidence.Hostsim{Root: root}
	rep, err := discovery.Discover(context.Background(), root, discovery.Options{
		NodeID: host, GuestGateway: gw, ImageCacheDir: root.VarPath("lib", "gpuaas"), Evidence: src,
	})
	require.NoError(t, err)
	r, err := Evaluate(context.Background(), root, src, Inputs{
		Node:     node,
		Spec:     Spec{Fabric: fabricSpec(host), OVSBridge: "ovsbr0", GuestGateway: gw},
		Topology: &rep.Topology,
		At:       time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC),
	})
	require.NoError(t, err)
	return r
}

var enrolled = Node{Enrolled: true, CredentialValid: true, CoordinatorReachable: true}

func codes(bs []string) []string {
	var out []string
	for _, b := range bs {
		out = append(out, Code(b))
	}
	slices.Sort(out)
	return out
}

func TestLabHosts(t *testing.T) {
	t.Parallel()
	for _, host := range []string{"j22u15", "j22u11", "j27u15"} {
		t.Run(host, func(t *testing.T) {
			t.Parallel()
			root, _ := hostsimtest.Host(t, host)
			p, _, err := hostsim.LoadProfile(host)
			require.NoError(t, err)
			r := evaluate(t, root, host, enrolled)
			assert.True(t, r.Active, "enrolled and reachable: active")
			assert.Equal(t, p.Expect.SliceReady, r.SliceReady, "blockers: %v", r.Blockers)
			want := slices.Clone(p.Expect.Blockers)
			slices.Sort(want)
			assert.Equal(t, want, codes(r.Blockers), "the lab profile names exactly these blockers")
			for _, b := range r.Blockers {
				assert.Contains(t, b, ": ", "every blocker says what was seen")
			}
			assert.Len(t, r.Evidence, 3+1+4+4+1+2+1)
			if host == "j22u15" {
				for _, e := range r.Evidence {
					assert.True(t, e.OK, "%s: %s", e.Check, e.Detail)
				}
			}
		})
	}
}

func TestActiveAndSliceReadyAreSeparate(t *testing.T) {
	t.Parallel()
	root, _ := hostsimtest.Host(t, "j22u15")
	r := evaluate(t, root, "j22u15", Node{Enrolled: true, CredentialValid: true, CoordinatorReachable: false, Detail: "dial tcp: connection refused"})
	assert.False(t, r.Active)
	assert.False(t, r.SliceReady, "a node that is not active is not slice-ready")
	assert.Equal(t, []string{BlockerCoordinatorUnreached}, codes(r.Blockers))
	assert.Contains(t, r.Blockers[0], "connection refused")

	r = evaluate(t, root, "j22u15", Node{})
	assert.Equal(t, []string{BlockerCoordinatorUnreached, BlockerCredentialInvalid, BlockerNotEnrolled}, codes(r.Blockers))
}

// Drift on the slice host turns into named blockers, one per broken part.
func TestDriftBecomesBlockers(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		mutate func(t *testing.T, root hostops.Root)
		want   []string
	}{
		"dnsmasq stopped": {func(t *testing.T, root hostops.Root) {
			editRuntime(t, root, func(rt map[string]any) { rt["units"].(map[string]any)["dnsmasq.service"] = "failed" })
		}, []string{BlockerUnitInactive + "dnsmasq.service"}},
		"fabric route gone": {func(t *testing.T, root hostops.Root) {
			editRuntime(t, root, func(rt map[string]any) {
				var keep []any
				for _, r := range rt["routes"].([]any) {
					if r.(map[string]any)["dst"] != "172.16.0.0/12" {
						keep = append(keep, r)
					}
				}
				rt["routes"] = keep
			})
		}, []string{BlockerFabricRoute}},
		"bridge lost its gateway": {func(t *testing.T, root hostops.Root) {
			editRuntime(t, root, func(rt map[string]any) { rt["ovs_bridges"] = []any{} })
		}, []string{BlockerOVSGateway}},
		"ib port down": {func(t *testing.T, root hostops.Root) {
			require.NoError(t, hostsim.TamperFile(root, "sys/class/infiniband/mlx5_0/ports/1/state", "1: DOWN\n"))
		}, []string{BlockerIBPort}},
		"netplan edited": {func(t *testing.T, root hostops.Root) {
			require.NoError(t, os.WriteFile(fabric.NetplanPath(root), []byte("network: {version: 2}\n"), 0o600))
		}, []string{BlockerNetplan}},
		"profile retagged": {func(t *testing.T, root hostops.Root) {
			require.NoError(t, hostsim.TamperFile(root, "etc/gpuaas/profile", "gpuaas-profile-baremetal\n"))
		}, []string{BlockerProfileTag}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			root, _ := hostsimtest.Host(t, "j22u15")
			tc.mutate(t, root)
			r := evaluate(t, root, "j22u15", enrolled)
			assert.False(t, r.SliceReady)
			assert.Equal(t, tc.want, codes(r.Blockers))
		})
	}
}

func TestTopologyGate(t *testing.T) {
	t.Parallel()
	root, _ := hostsimtest.Host(t, "j22u15")
	src := evidence.Hostsim{Root: root}
	in := Inputs{Node: enrolled, Spec: Spec{Fabric: fabricSpec("j22u15"), OVSBridge: "ovsbr0", GuestGateway: gw}}
	r, err := Evaluate(context.Background(), root, src, in)
	require.NoError(t, err)
	assert.Equal(t, []string{BlockerTopologyMissing}, codes(r.Blockers))

	in.Topology = &proto.CandidateTopology{Blockers: []string{"iommu_off: kernel command line lacks intel_iommu=on"}}
	r, err = Evaluate(context.Background(), root, src, in)
	require.NoError(t, err)
	assert.Equal(t, []string{BlockerTopology}, codes(r.Blockers))
	assert.Contains(t, r.Blockers[0], "iommu_off")

	in.Spec.Fabric = nil
	r, err = Evaluate(context.Background(), root, src, in)
	require.NoError(t, err)
	assert.Contains(t, codes(r.Blockers), BlockerFabricUnconfigured)
}

func TestUnreadableRuntimeIsAnError(t *testing.T) {
	t.Parallel()
	root, _ := hostsimtest.Host(t, "j22u15")
	require.NoError(t, os.WriteFile(evidence.Hostsim{Root: root}.Path(), []byte("{not json"), 0o644))
	_, err := Evaluate(context.Background(), root, evidence.Hostsim{Root: root}, Inputs{Node: enrolled, Spec: Spec{Fabric: fabricSpec("j22u15"), OVSBridge: "ovsbr0", GuestGateway: gw}})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "runtime.json")
}

func editRuntime(t *testing.T, root hostops.Root, edit func(map[string]any)) {
	t.Helper()
	p := evidence.Hostsim{Root: root}.Path()
	b, err := os.ReadFile(p)
	require.NoError(t, err)
	var rt map[string]any
	require.NoError(t, json.Unmarshal(b, &rt))
	edit(rt)
	b, err = json.Marshal(rt)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(p, b, 0o644))
}

func TestSlotHardwareGate(t *testing.T) {
	t.Parallel()
	root, _ := hostsimtest.Host(t, "j22u15")
	src := evidence.Hostsim{Root: root}
	rep, err := discovery.Discover(context.Background(), root, discovery.Options{
		NodeID: "j22u15", GuestGateway: gw, ImageCacheDir: root.VarPath("lib", "gpuaas"), Evidence: src,
	})
	require.NoError(t, err)
	ok := proto.SlotHardware{SlotID: "j22u15-s0", State: proto.HardwareOK}
	bad := proto.SlotHardware{SlotID: "j22u15-s1", State: proto.HardwareMissing, What: []string{"gpu_pci_address"},
		Evidence: []string{"GPU 0000:2a:00.0 is no longer discovered"}}
	in := Inputs{Node: enrolled, Spec: Spec{Fabric: fabricSpec("j22u15"), OVSBridge: "ovsbr0", GuestGateway: gw}, Topology: &rep.Topology,
		Hardware: []SlotHardware{{Observed: ok}, {Observed: bad, Status: proto.SlotAvailable}}}

	r, err := Evaluate(context.Background(), root, src, in)
	require.NoError(t, err)
	assert.False(t, r.SliceReady, "a finding the ledger has not recorded blocks the node")
	assert.Equal(t, []string{BlockerSlotHardware}, codes(r.Blockers))
	assert.Equal(t, "slot_hardware: j22u15-s1 missing{gpu_pci_address}: GPU 0000:2a:00.0 is no longer discovered", r.Blockers[0])
	assert.Equal(t, []proto.SlotHardware{ok, bad}, r.SlotHardware)

	// Recorded by the ledger (the slot is out of placement): the node
	// serves its other slots again; the evidence still names the slot.
	rec := bad
	in.Hardware[1].Recorded = &rec
	r, err = Evaluate(context.Background(), root, src, in)
	require.NoError(t, err)
	assert.True(t, r.SliceReady, "%v", r.Blockers)
	i := slices.IndexFunc(r.Evidence, func(e proto.Evidence) bool { return e.Check == "slot_hardware.j22u15-s1" })
	require.GreaterOrEqual(t, i, 0)
	assert.False(t, r.Evidence[i].OK)
	assert.Contains(t, r.Evidence[i].Detail, "out of placement in the ledger")

	// A new finding on the same slot blocks again until recorded.
	worse := bad
	worse.Evidence = append(slices.Clone(bad.Evidence), "disk serial S1 is no longer discovered")
	in.Hardware[1].Observed = worse
	r, err = Evaluate(context.Background(), root, src, in)
	require.NoError(t, err)
	assert.False(t, r.SliceReady)

	// An operator-disabled slot does not block either.
	in.Hardware[1].Recorded, in.Hardware[1].Status = nil, proto.SlotDisabled
	r, err = Evaluate(context.Background(), root, src, in)
	require.NoError(t, err)
	assert.True(t, r.SliceReady, "%v", r.Blockers)
}
