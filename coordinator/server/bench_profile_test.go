package server

import (
	"os"
	"runtime/debug"
	"strconv"
	"syscall"
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
	gc := DefaultGCPercent
	if g, err := strconv.Atoi(os.Getenv("GPUAAS_PROFILE_GOGC")); err == nil {
		gc = g // a GOGC to compare with the default
	}
	prevGC, err := TuneGC(gc, 0)
	require.NoError(t, err)
	defer debug.SetGCPercent(prevGC)
	run := benchPlacementsOn(t, v, true)
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	t.Logf("voters %d, GOGC %d: %.0f placements/s, %.0f log entries/s, CPU per placement %v, FSM apply CPU per placement %v (%d entries replayed), peak RSS %d MiB",
		v, gc, run.perS, run.appliesPerS, run.cpu, run.applyCPU, run.entries, ru.Maxrss/1024)
	if run.applyCPUByGC != nil {
		t.Logf("FSM apply CPU per placement by GOGC: %s", gcSweep(run.applyCPUByGC))
	}
}
