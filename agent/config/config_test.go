package config

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func hostRoot(t *testing.T) string {
	t.Helper()
	d := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(d, "etc"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(d, "etc", "hostname"), []byte("j22u15\n"), 0o644))
	return d
}

func TestDefaultsWork(t *testing.T) {
	root := hostRoot(t)
	cfg, err := Load([]string{"-host-root", root}, func(string) string { return "" }, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, "j22u15", cfg.NodeID, "node ID defaults to the host name")
	assert.Equal(t, "/var/lib/gpuaas", cfg.StateDir)
	assert.Equal(t, "127.0.0.1:9460", cfg.DiagAddr)
	assert.Equal(t, 30*time.Second, time.Duration(cfg.PollWait))
	assert.Equal(t, DefaultTaskWorkers, cfg.TaskWorkers)
}

func TestTaskWorkers(t *testing.T) {
	root := hostRoot(t)
	none := func(string) string { return "" }
	cfg, err := Load([]string{"-host-root", root, "-task-workers", "1"}, none, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, 1, cfg.TaskWorkers, "1 runs tasks one at a time")
	cfg, err = Load([]string{"-host-root", root}, func(k string) string {
		return map[string]string{"GPUAAS_AGENT_TASK_WORKERS": "3"}[k]
	}, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, 3, cfg.TaskWorkers, "from the environment")
}

func TestPrecedenceFlagsOverEnvOverFile(t *testing.T) {
	root := hostRoot(t)
	file := filepath.Join(t.TempDir(), "agent.json")
	require.NoError(t, os.WriteFile(file, []byte(`{"node_id":"from-file","state_dir":"/file","diag_addr":"127.0.0.1:1","poll_wait":"5s","host_root":"`+root+`"}`), 0o644))
	env := map[string]string{
		"GPUAAS_AGENT_CONFIG":    file,
		"GPUAAS_AGENT_STATE_DIR": "/env",
		"GPUAAS_AGENT_DIAG_ADDR": "127.0.0.1:2",
	}
	cfg, err := Load([]string{"-diag-addr", "127.0.0.1:3"}, func(k string) string { return env[k] }, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, "from-file", cfg.NodeID)
	assert.Equal(t, "/env", cfg.StateDir, "env beats file")
	assert.Equal(t, "127.0.0.1:3", cfg.DiagAddr, "flag beats env")
	assert.Equal(t, 5*time.Second, time.Duration(cfg.PollWait), "file beats default")
}

func TestBadInputNamesTheSetting(t *testing.T) {
	root := hostRoot(t)
	none := func(string) string { return "" }
	for name, tc := range map[string]struct {
		args []string
		want string
	}{
		"relative state dir":  {[]string{"-state-dir", "var/lib"}, "-state-dir"},
		"bad coordinator":     {[]string{"-coordinators", "ftp://x"}, "-coordinators"},
		"bad gateway":         {[]string{"-guest-gateway", "10.0.0.1"}, "-guest-gateway"},
		"half fabric":         {[]string{"-fabric-interface", "ibp26s0"}, "all-or-nothing"},
		"bad evidence":        {[]string{"-evidence", "magic"}, "-evidence"},
		"bad duration":        {[]string{"-poll-wait", "soon"}, "poll-wait"},
		"poll wait too long":  {[]string{"-poll-wait", "6m"}, "-poll-wait: 6m0s: the coordinators answer a task long-poll within 5m0s at the most"},
		"stray argument":      {[]string{"extra"}, "unexpected arguments"},
		"node id with slash":  {[]string{"-node-id", "a/b"}, "-node-id"},
		"missing config file": {[]string{"-config", "/nonexistent/agent.json"}, "read config file"},
		"bad cache budget":    {[]string{"-image-cache-budget", "lots"}, "image-cache-budget"},
		"zero cache budget":   {[]string{"-image-cache-budget", "0"}, "-image-cache-budget"},
		"bad image mirror":    {[]string{"-image-mirror", "ftp://mirror"}, "-image-mirror"},
		"no task workers":     {[]string{"-task-workers", "0"}, "-task-workers: 0: want 1 to 64"},
		"too many workers":    {[]string{"-task-workers", "65"}, "-task-workers: 65: want 1 to 64"},
		"task workers word":   {[]string{"-task-workers", "eight"}, "task-workers"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Load(append([]string{"-host-root", root}, tc.args...), none, io.Discard)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	t.Run("unknown file key", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "agent.json")
		require.NoError(t, os.WriteFile(file, []byte(`{"nodeid":"x"}`), 0o644))
		_, err := Load([]string{"-host-root", root, "-config", file}, none, io.Discard)
		require.ErrorContains(t, err, "unknown field")
	})
}

// A spent bootstrap token file may be gone: the configuration loads
// (an enrolled agent needs no token); an unreadable one is an error.
func TestBootstrapTokenFile(t *testing.T) {
	root := hostRoot(t)
	dir := t.TempDir()
	tf := filepath.Join(dir, "bootstrap.token")
	require.NoError(t, os.WriteFile(tf, []byte("gpb_abc\n"), 0o600))
	cfg, err := Load([]string{"-host-root", root, "-bootstrap-token-file", tf}, func(string) string { return "" }, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, "gpb_abc", cfg.BootstrapToken)

	cfg, err = Load([]string{"-host-root", root, "-bootstrap-token-file", filepath.Join(dir, "gone")}, func(string) string { return "" }, io.Discard)
	require.NoError(t, err)
	assert.Empty(t, cfg.BootstrapToken)

	_, err = Load([]string{"-host-root", root, "-bootstrap-token-file", dir}, func(string) string { return "" }, io.Discard)
	assert.ErrorContains(t, err, "bootstrap token file")
}

func TestSliceRuntimeSettings(t *testing.T) {
	root := hostRoot(t)
	none := func(string) string { return "" }
	cfg, err := Load([]string{"-host-root", root}, none, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, RuntimeNone, cfg.Runtime, "simulated lab agents keep plan/lease-only behaviour")
	file := filepath.Join(t.TempDir(), "agent.json")
	require.NoError(t, os.WriteFile(file, []byte(`{"runtime":"real","domain_type":"qemu","lab_sized":true,"ovs_rundir":"/run/gpuaas-ovs","vm_shutdown_timeout":"5s"}`), 0o644))
	env := map[string]string{"GPUAAS_AGENT_NAT_UPLINK": "eth0", "GPUAAS_AGENT_VNIC_CHECKSUM_OFF": "true"}
	cfg, err = Load([]string{"-host-root", root, "-config", file, "-wipe-policy", "zero"}, func(k string) string { return env[k] }, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, RuntimeReal, cfg.Runtime)
	assert.Equal(t, "qemu", cfg.DomainType)
	assert.True(t, bool(cfg.LabSized))
	assert.True(t, bool(cfg.VNICChecksumOff))
	assert.Equal(t, "eth0", cfg.NATUplink)
	assert.Equal(t, "zero", cfg.WipePolicy)
	assert.Equal(t, "/run/gpuaas-ovs", cfg.OVSRunDir)
	assert.Equal(t, 5*time.Second, time.Duration(cfg.VMShutdownTimeout))
	for args, want := range map[string]string{
		"-runtime magic":                    "-runtime",
		"-runtime real -domain-type xen":    "-domain-type",
		"-runtime real -wipe-policy shred":  "-wipe-policy",
		"-runtime real -vm-dir relative":    "-vm-dir",
		"-runtime real -lab-sized=sometime": "lab-sized",
	} {
		_, err := Load(append([]string{"-host-root", root}, strings.Fields(args)...), none, io.Discard)
		assert.ErrorContains(t, err, want, args)
	}
}
