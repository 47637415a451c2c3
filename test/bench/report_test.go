package bench

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

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
