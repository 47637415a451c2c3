package server

import (
	"os"
	"runtime/debug"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestProfilePlacements runs one placement run of the bench (audited, as
// the API proposes) on GPUAAS_PROFILE_VOTERS voters (1 or 3) and writes
// nothing: run it under `go test -cpuprofile` to see where a placement's
// CPU goes (docs/perf.md).
func TestProfilePlacements(t *testing.T) {
	v, err := strconv.Atoi(os.Getenv("GPUAAS_PROFILE_VOTERS"))
	if err != nil {
		t.Skip("set GPUAAS_PROFILE_VOTERS=1 or 3 (and -cpuprofile)")
	}
	prevGC, err := TuneGC(DefaultGCPercent, 0)
	require.NoError(t, err)
	defer debug.SetGCPercent(prevGC)
	run := benchPlacementsOn(t, v, true)
	t.Logf("voters %d: %.0f placements/s, %.0f log entries/s, CPU per placement %v, FSM apply CPU per placement %v (%d entries replayed)",
		v, run.perS, run.appliesPerS, run.cpu, run.applyCPU, run.entries)
	if run.applyCPUByGC != nil {
		t.Logf("FSM apply CPU per placement by GOGC: %s", gcSweep(run.applyCPUByGC))
	}
}
