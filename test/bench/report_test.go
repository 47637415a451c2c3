package bench

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestWritePartAndMerge(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("GPUAAS_BENCH_RESULTS", dir)
	require.NoError(t, WritePart("b", []Metric{AtLeast("x_per_s", 10, "1/s", 5, "")}))
	require.NoError(t, WritePart("a", []Metric{AtMost("y_ms", 3, "ms", 1, "slow disk")}))
	ms, err := Merge(dir)
	require.NoError(t, err)
	require.Len(t, ms, 2)
	require.Equal(t, "y_ms", ms[0].Metric)
	require.False(t, ms[0].Met)
	require.True(t, ms[1].Met)

	b, err := os.ReadFile(filepath.Join(dir, "latest.json"))
	require.NoError(t, err)
	var back []map[string]any
	require.NoError(t, json.Unmarshal(b, &back))
	for _, k := range []string{"metric", "value", "unit", "target", "met", "measured_at", "notes"} {
		require.Contains(t, back[0], k)
	}
	md, err := os.ReadFile(filepath.Join(dir, "latest.md"))
	require.NoError(t, err)
	require.Contains(t, string(md), "| y_ms | 3 | ms | <= 1 | **no** |")
}

func TestDerivedRatios(t *testing.T) {
	now := time.Now().UTC()
	p := Metric{Metric: "placements_per_s_3voters", Value: 3000, MeasuredAt: now}
	e := Metric{Metric: "etcd_claims_per_s_3members", Value: 4000, MeasuredAt: now.Add(-10 * time.Minute)}
	d := Derived([]Metric{p, e})
	require.Len(t, d, 1)
	require.Equal(t, "placements_vs_etcd_claims_ratio", d[0].Metric)
	require.InDelta(t, 0.75, d[0].Value, 1e-9)
	require.False(t, d[0].Met, "goal >= 1")
	require.Equal(t, now, d[0].MeasuredAt)

	require.Empty(t, Derived([]Metric{p}), "one side missing")
	e.MeasuredAt = now.Add(-3 * time.Hour)
	require.Empty(t, Derived([]Metric{p, e}), "not measured in one run")
	e.MeasuredAt, e.Value = now, 0
	require.Empty(t, Derived([]Metric{p, e}), "no division by zero")
}
