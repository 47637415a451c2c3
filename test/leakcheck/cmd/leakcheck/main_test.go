package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestRunArguments(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.json")
	require.NoError(t, os.WriteFile(bad, []byte(`{"procs":[]}`), 0o644))
	for _, tc := range []struct {
		args []string
		err  string
	}{
		{nil, "usage"},
		{[]string{"diff"}, `unknown command "diff"`},
		{[]string{"snapshot"}, "usage"},
		{[]string{"snapshot", "-o", filepath.Join(dir, "s.json"), "extra"}, "usage"},
		{[]string{"check"}, "usage"},
		{[]string{"check", "-before", bad, "-settle", "-1s"}, "usage"},
		{[]string{"check", "-before", filepath.Join(dir, "absent.json")}, "no such file"},
		{[]string{"check", "-before", bad}, `unknown field "procs"`},
	} {
		err := run(context.Background(), tc.args, &bytes.Buffer{})
		require.ErrorContains(t, err, tc.err, "args %q", tc.args)
		require.NotErrorIs(t, err, errLeaks)
	}
}

// A snapshot written by the command is read back by check.
func TestSnapshotWritesSnapshot(t *testing.T) {
	path := filepath.Join(t.TempDir(), "before.json")
	require.NoError(t, run(context.Background(), []string{"snapshot", "-o", path}, &bytes.Buffer{}))
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Contains(t, string(b), `"processes"`)
}
