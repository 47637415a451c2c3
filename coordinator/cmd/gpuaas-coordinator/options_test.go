package main

import (
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/server"
)

func TestOptionsPrecedence(t *testing.T) {
	t.Parallel()
	cfg := filepath.Join(t.TempDir(), "c.json")
	require.NoError(t, os.WriteFile(cfg, []byte(`{"node-id":"fromfile","bootstrap-expect":3,"join":["a:1","b:2"],"http-addr":"127.0.0.1:9","raft-heartbeat-timeout":"700ms"}`), 0o600))
	env := map[string]string{"GPUAAS_CONFIG": cfg, "GPUAAS_HTTP_ADDR": "127.0.0.1:8", "GPUAAS_DATA_DIR": "/envdir", "GPUAAS_MEMORY_LIMIT": "1073741824"}
	o, err := parseOptions([]string{"-data-dir", "/flagdir"}, func(k string) string { return env[k] }, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, "fromfile", o.NodeID, "file beats default")
	assert.Equal(t, 3, o.BootstrapExpect)
	assert.Equal(t, []string{"a:1", "b:2"}, o.Join)
	assert.Equal(t, "127.0.0.1:8", o.HTTPAddr, "env beats file")
	assert.Equal(t, "/flagdir", o.DataDir, "flag beats env")
	assert.Equal(t, 700*time.Millisecond, o.HeartbeatTimeout)
	assert.Equal(t, "127.0.0.1:7301", o.RaftAddr, "default")
	assert.Equal(t, server.DefaultGCPercent, o.GCPercent, "default")
	assert.Equal(t, int64(1<<30), o.MemoryLimit)
}

func TestOptionsRefuseBadInput(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(body), 0o600))
		return p
	}
	for name, tc := range map[string]struct {
		args []string
		env  map[string]string
	}{
		"unknown flag":       {args: []string{"-nope"}},
		"stray argument":     {args: []string{"extra"}},
		"bad int":            {args: []string{"-bootstrap-expect", "x"}},
		"bad env":            {env: map[string]string{"GPUAAS_BOOTSTRAP_EXPECT": "three"}},
		"bad log level":      {args: []string{"-log-level", "loud"}},
		"bad log format":     {args: []string{"-log-format", "xml"}},
		"gc percent zero":    {args: []string{"-gc-percent", "0"}},
		"negative mem limit": {env: map[string]string{"GPUAAS_MEMORY_LIMIT": "-1"}},
		"missing config":     {args: []string{"-config", filepath.Join(dir, "absent.json")}},
		"config not json":    {args: []string{"-config", write("bad.json", "{")}},
		"config unknown key": {args: []string{"-config", write("unk.json", `{"nodeid":"x"}`)}},
		"config bad value":   {args: []string{"-config", write("val.json", `{"bootstrap-expect":{"a":1}}`)}},
		"negative rate":      {args: []string{"-rate-per-address", "-1"}},
		"negative lockout":   {args: []string{"-lockout-after", "-2"}},
	} {
		_, err := parseOptions(tc.args, func(k string) string { return tc.env[k] }, io.Discard)
		assert.Error(t, err, name)
	}
}

func TestReadSecretFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	short := filepath.Join(dir, "short")
	require.NoError(t, os.WriteFile(short, []byte("abc\n"), 0o600))
	_, err := readSecretFile("cluster secret", short)
	assert.ErrorContains(t, err, "at least 16")
	good := filepath.Join(dir, "good")
	require.NoError(t, os.WriteFile(good, []byte("  0123456789abcdef0123\n"), 0o600))
	v, err := readSecretFile("cluster secret", good)
	require.NoError(t, err)
	assert.Equal(t, "0123456789abcdef0123", v)
	v, err = readSecretFile("cluster secret", "")
	require.NoError(t, err)
	assert.Empty(t, v)
	_, err = readSecretFile("cluster secret", filepath.Join(dir, "absent"))
	assert.Error(t, err)
}
