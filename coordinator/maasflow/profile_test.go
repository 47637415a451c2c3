package maasflow_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/maas"
	"github.com/gpuaas/gpuaas/lab/maassim"
	"github.com/gpuaas/gpuaas/proto"
)

// TestProfileFieldEffects: flipping a profile field changes what reaches
// MAAS or the ledger.
func TestProfileFieldEffects(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		change func(*proto.SiteProfile)
		check  func(t *testing.T, e *env, sys string, m maassim.MachineSnapshot)
	}{
		{"require_hw_sync on", nil, func(t *testing.T, e *env, sys string, m maassim.MachineSnapshot) {
			d := e.sim.Requests(func(r maassim.Request) bool { return r.SystemID == sys && r.Op == "deploy" })
			require.Len(t, d, 1)
			assert.Equal(t, "true", d[0].Params.Get("enable_hw_sync"))
		}},
		{"require_hw_sync off", func(p *proto.SiteProfile) { p.RequireHWSync, p.HardwareSyncInterval = false, 0 },
			func(t *testing.T, e *env, sys string, m maassim.MachineSnapshot) {
				d := e.sim.Requests(func(r maassim.Request) bool { return r.SystemID == sys && r.Op == "deploy" })
				require.Len(t, d, 1)
				assert.Empty(t, d[0].Params.Get("enable_hw_sync"))
			}},
		{"enrollment_token_ttl_seconds", func(p *proto.SiteProfile) { p.EnrollmentTokenTTLSeconds = 900 },
			func(t *testing.T, e *env, _ string, _ maassim.MachineSnapshot) {
				e.ledger.mu.Lock()
				m := e.ledger.lastMint
				e.ledger.mu.Unlock()
				assert.Equal(t, 900*time.Second, m.ExpiresAt.Sub(m.At))
			}},
		{"site_bootstrap_bundle_ref and validation bundle", func(p *proto.SiteProfile) {
			p.SiteBootstrapBundleRef = proto.BundleDigest([]byte(siteBundle2))
			p.PostDeployValidationBundleRef = proto.BundleDigest([]byte(validationBundle))
		}, func(t *testing.T, e *env, _ string, m maassim.MachineSnapshot) {
			assert.Contains(t, string(m.UserData), "GPUAAS_SITE_BUNDLE="+proto.BundleDigest([]byte(siteBundle2))+"\n")
			assert.Contains(t, string(m.UserData), "GPUAAS_VALIDATION_BUNDLE="+proto.BundleDigest([]byte(validationBundle))+"\n")
		}},
		{"fabric_mode ib", func(p *proto.SiteProfile) { p.FabricMode, p.EnablePhase2RoCE = proto.FabricIB, false },
			func(t *testing.T, _ *env, _ string, m maassim.MachineSnapshot) {
				assert.Contains(t, string(m.UserData), "GPUAAS_FABRIC_MODE=ib\n")
			}},
		{"intent baremetal", func(p *proto.SiteProfile) { p.Intent = proto.IntentBaremetal },
			func(t *testing.T, e *env, _ string, m maassim.MachineSnapshot) {
				assert.Equal(t, []string{"gpuaas-profile-baremetal"}, m.Tags)
				n, _ := e.ledger.Store().Snapshot().Node(m.Hostname)
				assert.Equal(t, proto.IntentBaremetal, n.ProfileIntent)
			}},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, tc.change)
			publishBundle(e, "site-boot-2", proto.BundleSiteBootstrap, siteBundle2)
			publishBundle(e, "validate", proto.BundlePostDeployValidation, validationBundle)
			e.fakeNode(nodeScript{ibPorts: []proto.IBPortState{{Device: "mlx5_0", Port: 1, State: "ACTIVE"}}})
			host := fmt.Sprintf("pf%d", i)
			id := e.onboard(host, fmt.Sprintf("52:54:00:00:04:%02x", i), "")
			e.start()
			e.waitState(id, proto.WorkflowSucceeded)
			sys := e.systemID(host)
			m, _ := e.sim.Machine(sys)
			tc.check(t, e, sys, m)
		})
	}
}

// TestBatchMaxParallel: batch_max_parallel 1 runs a site profile's
// onboardings one after the other; 3 runs them together.
func TestBatchMaxParallel(t *testing.T) {
	t.Parallel()
	for _, limit := range []int{1, 3} {
		t.Run(fmt.Sprint(limit), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, func(p *proto.SiteProfile) { p.BatchMaxParallel = limit })
			var ids []string
			for i := range 3 {
				ids = append(ids, e.onboard(fmt.Sprintf("b%d", i), fmt.Sprintf("52:54:00:00:05:%02x", i), ""))
			}
			e.start()
			for _, id := range ids {
				e.waitState(id, proto.WorkflowSucceeded)
			}
			// The machines named by applied mutations, in order.
			var seq []string
			for _, r := range e.sim.Requests(func(r maassim.Request) bool {
				return r.Applied && r.SystemID != "" && slices.Contains([]string{"create", "commission", "deploy"}, r.Kind())
			}) {
				seq = append(seq, r.SystemID)
			}
			require.Len(t, seq, 9)
			switches := 0
			for i := 1; i < len(seq); i++ {
				if seq[i] != seq[i-1] {
					switches++
				}
			}
			if limit == 1 {
				assert.Equal(t, 2, switches, "one machine at a time: %v", seq)
			} else {
				assert.Greater(t, switches, 2, "machines interleave: %v", seq)
			}
		})
	}
}

func TestStrictPXEPreflight(t *testing.T) {
	t.Parallel()
	for _, strict := range []bool{true, false} {
		t.Run(fmt.Sprint(strict), func(t *testing.T) {
			t.Parallel()
			e := newEnvSite(t, func(s *proto.Site) { s.PXESubnets = []string{"10.99.0.0/24"} },
				func(p *proto.SiteProfile) { p.StrictPXEPreflight = strict })
			id := e.onboard("pxe", "52:54:00:00:06:01", "")
			e.start()
			want := proto.WorkflowSucceeded
			if strict {
				want = proto.WorkflowFailed
			}
			w := e.waitState(id, want)
			sys := e.systemID("pxe")
			kinds := map[string]bool{}
			for _, ev := range w.Events {
				kinds[ev.Kind] = true
			}
			if strict {
				assert.Equal(t, proto.StagePXE, w.Stage)
				assert.Contains(t, w.LastError, "none of the site's PXE subnets [10.99.0.0/24] (strict_pxe_preflight)")
				assert.Zero(t, e.sim.Mutations(sys, "deploy"), "no deploy after a failed preflight")
			} else {
				assert.True(t, kinds["pxe_warning"], "recorded, not fatal")
				assert.Equal(t, 1, e.sim.Mutations(sys, "deploy"))
			}
		})
	}
}

func TestStorageLayoutProfile(t *testing.T) {
	t.Parallel()
	for _, layout := range []string{"flat", ""} {
		t.Run("layout="+layout, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, func(p *proto.SiteProfile) { p.StorageLayoutProfile = layout })
			hw := maassim.DefaultHardware
			require.NoError(t, e.sim.SetHardware("52:54:00:00:07:01", hw))
			id := e.onboard("st", "52:54:00:00:07:01", "")
			e.start()
			e.waitState(id, proto.WorkflowSucceeded)
			sys := e.systemID("st")
			m, _ := e.sim.Machine(sys)
			if layout == "" {
				assert.Zero(t, e.sim.Mutations(sys, "set_storage_layout"))
				return
			}
			assert.Equal(t, 1, e.sim.Mutations(sys, "set_storage_layout"))
			assert.Equal(t, "flat", m.StorageLayout)
			c := e.sim.Requests(func(r maassim.Request) bool { return r.SystemID == sys && r.Op == "set_storage_layout" })
			require.Len(t, c, 1)
			assert.Equal(t, fmt.Sprint(m.RootDeviceID), c[0].Params.Get("root_device"))
			assert.LessOrEqual(t, e.sim.Mutations(sys, "set_boot_disk"), 1)
		})
	}
}

func TestAutoClaimSingleNewMachine(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name     string
		on       bool
		enlisted int
		want     proto.WorkflowState
		creates  int
	}{
		{"on, one New machine: claimed", true, 1, proto.WorkflowSucceeded, 0},
		{"off: a machine is created", false, 1, proto.WorkflowSucceeded, 1},
		{"on, two New machines: refused", true, 2, proto.WorkflowFailed, 0},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, func(p *proto.SiteProfile) { p.AutoClaimSingleNewMachine = tc.on })
			var enlisted []string
			for j := range tc.enlisted {
				id, err := e.sim.Enlist(maassim.Enlistment{Hostname: fmt.Sprintf("maas-random-%d", j), MACs: []string{fmt.Sprintf("52:54:00:00:08:%d%d", i, j)}})
				require.NoError(t, err)
				enlisted = append(enlisted, id)
			}
			// The operator's MAC is not one MAAS saw (a data NIC, say).
			id := e.onboard("claim", fmt.Sprintf("52:54:00:00:09:%02x", i), "")
			e.start()
			w := e.waitState(id, tc.want)
			creates := e.sim.Requests(func(r maassim.Request) bool {
				return r.Applied && r.Kind() == "create" && r.Path == "/MAAS/api/2.0/machines/"
			})
			assert.Len(t, creates, tc.creates)
			switch {
			case tc.want == proto.WorkflowFailed:
				assert.Contains(t, w.LastError, "2 machines are New")
			case tc.on:
				assert.Equal(t, enlisted[0], w.SystemID)
				m, _ := e.sim.Machine(enlisted[0])
				assert.Equal(t, "claim", m.Hostname)
			default:
				assert.NotEqual(t, enlisted[0], w.SystemID)
			}
		})
	}
}

// TestPhase2RoCE: with enable_phase2_roce each machine gets the next free
// address of the site's pool on its RoCE NIC before deploy, verified by
// read-back; without it nothing is linked.
func TestPhase2RoCE(t *testing.T) {
	t.Parallel()
	for _, on := range []bool{true, false} {
		t.Run(fmt.Sprint(on), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, func(p *proto.SiteProfile) { p.EnablePhase2RoCE = on })
			var ids []string
			for i := range 2 {
				hw := maassim.DefaultHardware
				hw.Interfaces = []maassim.InterfaceSpec{{Name: "ens1f0np0", MAC: fmt.Sprintf("52:54:00:00:0b:%02x", i)}}
				mac := fmt.Sprintf("52:54:00:00:0a:%02x", i)
				require.NoError(t, e.sim.SetHardware(mac, hw))
				ids = append(ids, e.onboard(fmt.Sprintf("roce%d", i), mac, ""))
			}
			e.start()
			var addrs []string
			for i, id := range ids {
				w := e.waitState(id, proto.WorkflowSucceeded)
				sys := e.systemID(fmt.Sprintf("roce%d", i))
				m, _ := e.sim.Machine(sys)
				if !on {
					assert.Empty(t, w.RoCEAddress)
					assert.Zero(t, e.sim.Mutations(sys, "link_subnet"))
					continue
				}
				assert.Equal(t, 1, e.sim.Mutations(sys, "link_subnet"))
				assert.Contains(t, m.Links, maassim.LinkSnapshot{Interface: "ens1f0np0", Mode: "static", IP: w.RoCEAddress, SubnetID: 2},
					"the RoCE NIC has the ledger's address in MAAS")
				addrs = append(addrs, w.RoCEAddress)
			}
			if on {
				slices.Sort(addrs)
				assert.Equal(t, []string{"10.50.0.10", "10.50.0.11"}, addrs, "distinct, lowest first")
			}
		})
	}
}

// TestRequireHWSyncGate: require_hw_sync holds completion until MAAS
// reports a hardware sync; a sync that never comes fails the workflow.
func TestRequireHWSyncGate(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil) // fixture: require_hw_sync on
	c, err := maas.New(maas.Config{URL: e.sim.URL, APIKey: e.sim.APIKey})
	require.NoError(t, err)
	m, err := c.Create(context.Background(), maas.CreateParams{Hostname: "stale", MACs: []string{"52:54:00:00:0c:01"}})
	require.NoError(t, err)
	require.NoError(t, e.sim.InjectFault(m.SystemID, maassim.Fault{Kind: maassim.FaultHwSyncStale}))
	stale := e.onboard("stale", "52:54:00:00:0c:01", "")
	fresh := e.onboard("fresh", "52:54:00:00:0c:02", "")
	e.start()
	w := e.waitState(fresh, proto.WorkflowSucceeded)
	synced := false
	for _, ev := range w.Events {
		synced = synced || ev.Kind == "hw_sync"
	}
	assert.True(t, synced)
	w = e.waitState(stale, proto.WorkflowFailed)
	assert.Equal(t, proto.StageHWSync, w.Stage)
	assert.Contains(t, w.LastError, "reported no hardware sync")
}

// TestWorkflowDeployAcceptedThen504: MAAS applies the deploy and answers
// 504; the workflow records the unknown outcome, polls, and finishes with
// one deploy in the request log.
func TestWorkflowDeployAcceptedThen504(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	c, err := maas.New(maas.Config{URL: e.sim.URL, APIKey: e.sim.APIKey})
	require.NoError(t, err)
	m, err := c.Create(context.Background(), maas.CreateParams{Hostname: "slow", MACs: []string{"52:54:00:00:0d:01"}})
	require.NoError(t, err)
	require.NoError(t, e.sim.InjectFault(m.SystemID, maassim.Fault{Kind: maassim.FaultAcceptedTimeout, Op: "deploy", Times: 1, Delay: 10 * time.Millisecond}))
	id := e.onboard("slow", "52:54:00:00:0d:01", "")
	e.start()
	w := e.waitState(id, proto.WorkflowSucceeded)
	assert.Equal(t, 1, e.sim.Mutations(m.SystemID, "deploy"))
	assert.Len(t, e.sim.Requests(func(r maassim.Request) bool { return r.SystemID == m.SystemID && r.Op == "deploy" }), 1, "never re-sent")
	unknown := false
	for _, ev := range w.Events {
		unknown = unknown || ev.Kind == "unknown_outcome" && ev.Stage == proto.StageDeploy
	}
	assert.True(t, unknown, "the unknown outcome is on the workflow's record")
	assert.Equal(t, 1, w.DeployAttempts)
}
