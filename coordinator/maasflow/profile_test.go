package maasflow_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

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
			p.SiteBootstrapBundleRef = "sha256:" + fmt.Sprintf("%064x", 7)
			p.PostDeployValidationBundleRef = "sha256:" + fmt.Sprintf("%064x", 9)
		}, func(t *testing.T, _ *env, _ string, m maassim.MachineSnapshot) {
			assert.Contains(t, string(m.UserData), "GPUAAS_SITE_BUNDLE=sha256:"+fmt.Sprintf("%064x", 7)+"\n")
			assert.Contains(t, string(m.UserData), "GPUAAS_VALIDATION_BUNDLE=sha256:"+fmt.Sprintf("%064x", 9)+"\n")
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
