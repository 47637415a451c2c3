package main

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSiteKeyFileFlag(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	key := filepath.Join(dir, "site.key")
	require.NoError(t, os.WriteFile(key, []byte("00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n"), 0o644))
	o, err := parseOptions([]string{"-site-key-file", key, "-data-dir", filepath.Join(dir, "data")},
		func(k string) string { return map[string]string{"GPUAAS_BOOTSTRAP_EXPECT": "1"}[k] }, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, key, o.SiteKeyFile)
	// A key file others can read stops the coordinator before it serves.
	err = run(context.Background(), o, slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.ErrorContains(t, err, "lets group or others read it")
}
