package main

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/maasflow"
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
	assert.Equal(t, maasflow.DefaultRetryMaxWait, o.MAASRetryMaxWait, "default")
}

func TestOptionsMAASRetryMaxWait(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args    []string
		env     map[string]string
		want    time.Duration
		wantErr string
	}{
		{want: 15 * time.Minute},
		{args: []string{"-maas-retry-max-wait", "40m"}, want: 40 * time.Minute},
		{env: map[string]string{"GPUAAS_MAAS_RETRY_MAX_WAIT": "5m"}, want: 5 * time.Minute},
		{args: []string{"-maas-retry-max-wait", "10s"}, want: 10 * time.Second},
		{args: []string{"-maas-retry-max-wait", "24h"}, want: 24 * time.Hour},
		{args: []string{"-maas-retry-max-wait", "0s"}, wantErr: "maas-retry-max-wait 0s: give a duration from 10s to 24h"},
		{args: []string{"-maas-retry-max-wait", "-1m"}, wantErr: "maas-retry-max-wait -1m0s"},
		{args: []string{"-maas-retry-max-wait", "9s"}, wantErr: "maas-retry-max-wait 9s"},
		{args: []string{"-maas-retry-max-wait", "25h"}, wantErr: "maas-retry-max-wait 25h0m0s"},
		{args: []string{"-maas-retry-max-wait", "soon"}, wantErr: "maas-retry-max-wait"},
	} {
		o, err := parseOptions(tc.args, func(k string) string { return tc.env[k] }, io.Discard)
		if tc.wantErr != "" {
			require.Error(t, err, "%v %v", tc.args, tc.env)
			assert.Contains(t, err.Error(), tc.wantErr)
			continue
		}
		require.NoError(t, err, "%v %v", tc.args, tc.env)
		assert.Equal(t, tc.want, o.MAASRetryMaxWait, "%v %v", tc.args, tc.env)
	}
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
		"ca cert alone":      {args: []string{"-ca-cert", "ca.pem"}},
		"ca key alone":       {env: map[string]string{"GPUAAS_CA_KEY": "ca.key"}},
		"insecure with a CA": {args: []string{"-insecure-http", "-ca-cert", "ca.pem", "-ca-key", "ca.key"}},
		"insecure with SANs": {args: []string{"-insecure-http", "-tls-san", "coord.example"}},
		"node cert ttl zero": {args: []string{"-node-cert-ttl", "0s"}},
		"node cert ttl long": {args: []string{"-node-cert-ttl", "2000h"}},
		"pprof not loopback": {args: []string{"-pprof-addr", "0.0.0.0:6060"}},
		"pprof no port":      {args: []string{"-pprof-addr", "127.0.0.1"}},
		"pprof a name":       {args: []string{"-pprof-addr", "coord.example:6060"}},
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

// TestLoadTLS: where a server's CA comes from on its first start.
func TestLoadTLS(t *testing.T) {
	t.Parallel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx := context.Background()
	opts := func(args ...string) *options {
		o, err := parseOptions(append([]string{"-data-dir", t.TempDir()}, args...), func(string) string { return "" }, io.Discard)
		require.NoError(t, err)
		return o
	}

	// Alone: creates one, and a restart reuses it.
	o := opts("-bootstrap-expect", "1", "-http-addr", "127.0.0.1:0", "-tls-san", "coord.example,10.1.2.3")
	a, err := loadTLS(ctx, o, "", "", "10.9.8.7:7300", "", quiet)
	require.NoError(t, err)
	assert.Contains(t, a.Cert.Leaf.DNSNames, "coord.example")
	var ips []string
	for _, ip := range a.Cert.Leaf.IPAddresses {
		ips = append(ips, ip.String())
	}
	assert.Subset(t, ips, []string{"127.0.0.1", "10.1.2.3", "10.9.8.7"})
	again, err := loadTLS(ctx, o, "", "", "10.9.8.7:7300", "", quiet)
	require.NoError(t, err)
	assert.True(t, again.CA.Cert.Equal(a.CA.Cert))

	// Servers forming a cluster derive the same CA from their secret.
	const secret = "a-shared-cluster-secret"
	b1, err := loadTLS(ctx, opts("-bootstrap-expect", "3", "-node-id", "c1", "-join", "127.0.0.1:1"), secret, "", "", "", quiet)
	require.NoError(t, err)
	b2, err := loadTLS(ctx, opts("-bootstrap-expect", "3", "-node-id", "c2", "-join", "127.0.0.1:1"), secret, "", "", "", quiet)
	require.NoError(t, err)
	assert.True(t, b1.CA.Key.Equal(b2.CA.Key))

	// Given files win; a joiner with neither files nor a credential is told what to do.
	dir := t.TempDir()
	require.NoError(t, a.CA.WriteFiles(filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ca.key")))
	g, err := loadTLS(ctx, opts("-bootstrap-expect", "0", "-join", "127.0.0.1:1", "-ca-cert", filepath.Join(dir, "ca.pem"), "-ca-key", filepath.Join(dir, "ca.key")), "", "", "", "", quiet)
	require.NoError(t, err)
	assert.True(t, g.CA.Cert.Equal(a.CA.Cert))
	_, err = loadTLS(ctx, opts("-bootstrap-expect", "0", "-join", "127.0.0.1:1"), "", "", "", "", quiet)
	require.ErrorContains(t, err, "give -ca-cert and -ca-key")

	// -insecure-http: no TLS at all.
	n, err := loadTLS(ctx, opts("-insecure-http"), "", "", "", "", quiet)
	require.NoError(t, err)
	assert.Nil(t, n)
}
