package labagent

import (
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/agent/config"
)

// Args round-trips through the agent's own flag parsing.
func TestArgsRoundTrip(t *testing.T) {
	c, err := Config(Options{Host: "j22u11", HostBase: "/lab/hosts/j22u11", StateDir: "/lab/agents/j22u11",
		Coordinators: []string{"http://127.0.0.1:7480", "http://127.0.0.1:7481"}, Token: "gpb_x", GossipJoin: []string{"127.0.0.1:7946"}, Fast: true})
	require.NoError(t, err)
	got, err := config.Load(Args(c), func(string) string { return "" }, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, c, got)

	// A token file instead of the token: the agent reads it at start.
	tf := filepath.Join(t.TempDir(), "bootstrap.token")
	require.NoError(t, os.WriteFile(tf, []byte("gpb_from_file\n"), 0o600))
	c, err = Config(Options{Host: "j22u15", HostBase: "/lab/hosts/j22u15", StateDir: "/lab/agents/j22u15",
		Coordinators: []string{"http://127.0.0.1:7480"}, TokenFile: tf})
	require.NoError(t, err)
	got, err = config.Load(Args(c), func(string) string { return "" }, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, tf, got.BootstrapTokenFile)
	assert.Equal(t, "gpb_from_file", got.BootstrapToken)

	_, err = Config(Options{Host: "nope"})
	assert.Error(t, err)
}

func TestSliceArgsRoundTrip(t *testing.T) {
	c, err := Config(Options{Host: "j22u15", HostBase: "/lab/hosts/j22u15", StateDir: "/lab/agents/j22u15",
		Coordinators: []string{"http://127.0.0.1:7480"}, Token: "gpb_x", GossipJoin: []string{"127.0.0.1:7946"}})
	require.NoError(t, err)
	c, err = WithSlice(c, Slice{OVSRunDir: "/run/gpuaas-ovs", Bridge: "labbr15", Gateway: "10.215.0.1/24",
		VMDir: "/var/lib/libvirt/gpuaas/j22u15", SerialLogDir: "/var/log/gpuaas/serial/j22u15", DHCPDir: "/lab/agents/j22u15/dhcp"})
	require.NoError(t, err)
	assert.Equal(t, config.RuntimeReal, c.Runtime)
	got, err := config.Load(Args(c), func(string) string { return "" }, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, c, got)
	_, err = WithSlice(c, Slice{Bridge: "labbr15", Gateway: "10.215.0.1/24", VMDir: "relative"})
	assert.ErrorContains(t, err, "-vm-dir")
}

// Lab agents program public ingress only in a namespace they are given:
// without one the table is off (it would outlive them in this machine's
// own namespace).
func TestIngressArgs(t *testing.T) {
	c, err := Config(Options{Host: "j22u15", HostBase: "/lab/hosts/j22u15", StateDir: "/lab/agents/j22u15", Coordinators: []string{"http://127.0.0.1:7480"}})
	require.NoError(t, err)
	assert.Empty(t, c.IngressTable)
	got, err := config.Load(Args(c), func(string) string { return "" }, io.Discard)
	require.NoError(t, err)
	assert.Empty(t, got.IngressTable, "the agent's default table is turned off")
	c, err = Config(Options{Host: "j22u15", HostBase: "/lab/hosts/j22u15", StateDir: "/lab/agents/j22u15", Coordinators: []string{"http://127.0.0.1:7480"},
		IngressNetns: "/run/netns/gpn-ingh-1"})
	require.NoError(t, err)
	got, err = config.Load(Args(c), func(string) string { return "" }, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, "gpuaas_ingress", got.IngressTable)
	assert.Equal(t, "/run/netns/gpn-ingh-1", got.IngressNetns)
}
