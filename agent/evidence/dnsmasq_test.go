package evidence

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/hostops/dhcp"
	"github.com/gpuaas/gpuaas/hostops/units"
)

type systemctlReply string

func (r systemctlReply) Run(context.Context, string, ...string) ([]byte, error) {
	return []byte(r), nil
}

// TestAgentSupervisedDnsmasqCounts: on a systemd host whose dnsmasq.service
// is inactive, the dnsmasq the agent supervises (hostops/dhcp, found by its
// pid file) satisfies the gate; another dnsmasq does not.
func TestAgentSupervisedDnsmasqCounts(t *testing.T) {
	t.Parallel()
	root, err := hostops.NewRoot(t.TempDir())
	require.NoError(t, err)
	require.NoError(t, os.MkdirAll(root.RunPath("systemd", "system"), 0o755))
	h := &Host{Root: root, Systemd: units.Systemd{Root: root, Runner: systemctlReply("LoadState=loaded\nActiveState=inactive\nSubState=dead\n")}}
	proc := func(pid string, args ...string) {
		d := root.ProcPath(pid)
		require.NoError(t, os.MkdirAll(d, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(d, "comm"), []byte("dnsmasq\n"), 0o644))
		require.NoError(t, os.WriteFile(filepath.Join(d, "cmdline"), []byte(strings.Join(args, "\x00")+"\x00"), 0o644))
	}

	proc("100", "dnsmasq", "--conf-file=/etc/dnsmasq.conf", "--pid-file=/run/dnsmasq/dnsmasq.pid")
	ev, err := h.Unit(context.Background(), "dnsmasq.service")
	require.NoError(t, err)
	assert.False(t, ev.OK(), "a dnsmasq that is not the agent's does not count: %s", ev)

	proc("200", "dnsmasq", "--keep-in-foreground", "--pid-file="+filepath.Join(dhcp.DefaultDir(root), "dnsmasq.pid"))
	ev, err = h.Unit(context.Background(), "dnsmasq.service")
	require.NoError(t, err)
	assert.True(t, ev.OK(), "%s", ev)
	assert.Contains(t, ev.Detail, "agent-supervised dnsmasq (pid 200")
	assert.Contains(t, ev.Detail, "ActiveState=inactive")

	ev, err = h.Unit(context.Background(), "libvirtd.service")
	require.NoError(t, err)
	assert.False(t, ev.OK(), "only dnsmasq has an agent-supervised stand-in")
}
