package slice

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/test/bench"
)

// TestBenchSlice provisions and releases one real lab slice (u-root guest
// under TCG on a userspace OVS bridge, clone onto a loop device) and
// reports the provisioning time split into its stages.
func TestBenchSlice(t *testing.T) {
	if os.Getenv("GPUAAS_BENCH") == "" {
		t.Skip("set GPUAAS_BENCH=1 (make bench)")
	}
	cfg := labHost(t, true)
	realNetwork(t, cfg)
	p, err := buildRuntime(cfg, nil)
	require.NoError(t, err)
	defer p.close()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()

	start := time.Now()
	res, err := p.rt.Provision(ctx, cfg.Request, nil)
	if err != nil {
		logSerial(t, cfg)
	}
	require.NoError(t, err)
	total := time.Since(start).Seconds()
	start = time.Now()
	rel, err := p.rt.Release(ctx, ReleaseRequest{AllocationID: cfg.Request.AllocationID}, nil)
	require.NoError(t, err)
	release := time.Since(start).Seconds()
	require.NotNil(t, rel.Slots[0].Proof)

	sec := func(ms int64) float64 { return float64(ms) / 1000 }
	rec, _, err := p.journal.Get(cfg.Request.AllocationID)
	require.NoError(t, err)
	// The guest's boot runs from the hypervisor's start of the domain
	// (inside define_start) to the end of ssh_ready.
	boot := sec(rec.VMStartMS + res.Durations[proto.StageDHCPLease] + res.Durations[proto.StageSSHReady])
	control := total - sec(res.Durations[proto.StageClone]) - boot
	ms := []bench.Metric{
		bench.AtMost("slice_alloc_to_ssh_ready_s", total, "s", 25,
			"provision of a 1-GPU lab slice: image verify, disk check, clone of the 64 MiB u-root image onto a loop device, seed, define/start, DHCP lease, SSH readiness (TCG firmware boot included)"),
		bench.AtMost("slice_control_plane_share_s", control, "s", 1,
			"everything but the clone and the guest boot (libvirt starting the domain through ssh_ready): image verify, disk check, seed, bridge check, DHCP reservation, NAT, define, OVS port and flows"),
		bench.Info("release_to_available_s", release, "s",
			"release: graceful stop (ACPI power button; the u-root guest powers itself off, destroy only after a 3 s timeout), undefine, network cleanup, blkdiscard wipe + verify of 128 MiB"),
	}
	for _, st := range append(append([]string{}, proto.SliceStages[1:]...), proto.ReleaseStages...) {
		d, ok := res.Durations[st]
		if !ok {
			d = rel.Durations[st]
		}
		ms = append(ms, bench.Info("slice_stage_"+st+"_s", sec(d), "s", "stage "+st))
	}
	for _, m := range ms {
		t.Logf("%s = %.3f %s", m.Metric, m.Value, m.Unit)
	}
	require.NoError(t, bench.WritePart("slice", ms))
}
