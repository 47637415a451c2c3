package server

import (
	"fmt"
	"runtime/debug"
)

// DefaultGCPercent is the coordinator's GOGC. The ledger is an immutable
// radix-tree store: every write copies tree nodes, so the heap churns
// fast while the live set stays small (tens of MiB for thousands of
// nodes); with Go's default of 100 the collector took ~40% of the CPU of
// a placement run. 400 trades a few times the live heap in memory for
// far fewer collections.
const DefaultGCPercent = 400

// TuneGC sets the process's garbage collector: GOGC percent (<= 0 leaves
// it as is) and a soft memory limit in bytes (<= 0 leaves it as is; with
// a limit the collector runs more often as the heap nears it, whatever
// percent says). It returns the previous percent.
func TuneGC(percent int, memoryLimit int64) (previous int, err error) {
	if memoryLimit < 0 {
		return 0, fmt.Errorf("gc memory limit %d: must be >= 0", memoryLimit)
	}
	previous = debug.SetGCPercent(-1)
	debug.SetGCPercent(previous)
	if percent > 0 {
		previous = debug.SetGCPercent(percent)
	}
	if memoryLimit > 0 {
		debug.SetMemoryLimit(memoryLimit)
	}
	return previous, nil
}
