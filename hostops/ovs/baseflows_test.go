package ovs_test

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/hostops/command"
	"github.com/gpuaas/gpuaas/hostops/command/commandtest"
	"github.com/gpuaas/gpuaas/hostops/ovs"
)

// dump-flows output of ovs-ofctl 3.1 after EnsureBridge.
const baseDump = `NXST_FLOW reply (xid=0x4):
 cookie=0x6770000000000000, duration=0.031s, table=0, n_packets=0, n_bytes=0, priority=100,in_port=LOCAL,dl_dst=01:00:00:00:00:00/01:00:00:00:00:00 actions=FLOOD
 cookie=0x6770000000000000, duration=0.031s, table=0, n_packets=0, n_bytes=0, priority=0 actions=drop
`

func TestBaseFlowsInstalled(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]struct {
		out  string
		want bool
	}{
		"both":          {baseDump, true},
		"none":          {"NXST_FLOW reply (xid=0x4):\n", false},
		"no drop":       {strings.Join(strings.Split(baseDump, "\n")[:2], "\n") + "\n", false},
		"other actions": {strings.ReplaceAll(baseDump, "actions=drop", "actions=NORMAL"), false},
	} {
		rec := &commandtest.Recorder{Reply: func(command.Cmd) ([]byte, error) { return []byte(c.out), nil }}
		sw, err := ovs.New(ovs.Options{Gateway: netip.MustParsePrefix("10.200.0.1/24"), Runner: rec, Netlink: &fakeNetlink{}})
		require.NoError(t, err)
		ok, err := sw.BaseFlowsInstalled(context.Background())
		require.NoError(t, err, name)
		assert.Equal(t, c.want, ok, name)
		lines := rec.Lines()
		require.Len(t, lines, 1, name)
		assert.Contains(t, lines[0], "dump-flows ovsbr0 cookie=0x6770000000000000/0xffffffffffffffff", name)
	}
}
