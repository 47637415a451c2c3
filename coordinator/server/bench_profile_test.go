package server

import (
	"encoding/gob"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"syscall"
	"testing"

	"github.com/hashicorp/raft"
	"github.com/stretchr/testify/require"
)

// TestProfilePlacements runs one placement run of the bench (audited, as
// the API proposes, unless GPUAAS_PROFILE_AUDIT=off) on
// GPUAAS_PROFILE_VOTERS voters (1 or 3) and writes
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
	// GPUAAS_PROFILE_AUDIT=off runs without audit records (what they
	// cost is the difference).
	audited := os.Getenv("GPUAAS_PROFILE_AUDIT") != "off"
	run := benchPlacementsOn(t, v, audited)
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	t.Logf("voters %d, audited %v, GOGC %d: %.0f placements/s, %.0f log entries/s, CPU per placement %v, %.1f KB allocated per placement, FSM apply CPU per placement %v (%d entries replayed), peak RSS %d MiB",
		v, audited, gc, run.perS, run.appliesPerS, run.cpu, run.allocKB, run.applyCPU, run.entries, ru.Maxrss/1024)
	if run.applyCPUByGC != nil {
		t.Logf("FSM apply CPU per placement by GOGC: %s", gcSweep(run.applyCPUByGC))
	}
}

// TestProfileReplay profiles the FSM apply alone: the committed log of
// one single-voter placement run (recorded to GPUAAS_REPLAY_LOG on the
// first call, read back from it after; GPUAAS_PROFILE_AUDIT=off records
// one without audit records) replayed GPUAAS_REPLAY_ROUNDS times
// into fresh FSM stacks. Run it under `go test -cpuprofile` to see where
// fsm_apply_us_per_placement goes without the run's other work.
func TestProfileReplay(t *testing.T) {
	path := os.Getenv("GPUAAS_REPLAY_LOG")
	if path == "" {
		t.Skip("set GPUAAS_REPLAY_LOG=file (and -cpuprofile)")
	}
	prevGC, err := TuneGC(DefaultGCPercent, 0)
	require.NoError(t, err)
	defer debug.SetGCPercent(prevGC)
	rec, err := readReplay(path)
	if os.IsNotExist(err) {
		// GPUAAS_PROFILE_AUDIT=off records a run without audit records.
		run := benchPlacementsCA(t, 1, os.Getenv("GPUAAS_PROFILE_AUDIT") != "off", nil, false)
		require.NotNil(t, run.logs, "the run's log was compacted")
		rec = replayRecord{Logs: run.logs, From: run.from, Placed: run.placed}
		require.NoError(t, writeReplay(path, rec))
		err = nil
	}
	require.NoError(t, err)
	rounds, _ := strconv.Atoi(os.Getenv("GPUAAS_REPLAY_ROUNDS"))
	rounds = max(rounds, 1)
	for range rounds {
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		d, n := replayCPU(t, rec.Logs, rec.From, rec.Placed)
		runtime.ReadMemStats(&m1)
		// Allocation does not move with the machine's load: the whole
		// replay's (warm-up included) per placement.
		t.Logf("FSM apply CPU per placement %v (%d entries, %.0f placements); replay allocated %.0f objects, %.1f KB per placement",
			d, n, rec.Placed, float64(m1.Mallocs-m0.Mallocs)/rec.Placed, float64(m1.TotalAlloc-m0.TotalAlloc)/rec.Placed/1024)
	}
	objs, kb := replayRetained(t, rec)
	t.Logf("the ledger keeps %.0f heap objects, %.1f KB per placement (live after a GC, what every later GC marks again)", objs, kb)
}

// replayRetained applies rec into a fresh FSM stack and returns the heap
// objects and KB per placement still live after it (beyond the inventory
// the run started from), while the stack is held.
func replayRetained(t *testing.T, rec replayRecord) (objects, kb float64) {
	f := newPeerFSM(newEnrollFSM(newLedger(testLogger(t)).fsm))
	split := 0
	for split < len(rec.Logs) && rec.Logs[split].Index <= rec.From {
		split++
	}
	live := func() runtime.MemStats {
		var m runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&m)
		return m
	}
	apply := func(ls []*raft.Log) {
		for len(ls) > 0 {
			n := min(len(ls), DefaultTiming.MaxAppendEntries)
			f.ApplyBatch(ls[:n])
			ls = ls[n:]
		}
	}
	apply(rec.Logs[:split])
	m0 := live()
	apply(rec.Logs[split:])
	m1 := live()
	runtime.KeepAlive(f)
	return float64(int64(m1.HeapObjects)-int64(m0.HeapObjects)) / rec.Placed,
		float64(int64(m1.HeapAlloc)-int64(m0.HeapAlloc)) / rec.Placed / 1024
}

// replayRecord is a recorded placement run's log for TestProfileReplay.
type replayRecord struct {
	Logs   []*raft.Log
	From   uint64
	Placed float64
}

func writeReplay(path string, rec replayRecord) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := gob.NewEncoder(f).Encode(rec); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func readReplay(path string) (replayRecord, error) {
	var rec replayRecord
	f, err := os.Open(path)
	if err != nil {
		return rec, err
	}
	defer f.Close()
	return rec, gob.NewDecoder(f).Decode(&rec)
}
