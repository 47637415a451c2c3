package labagent

import (
	"io"
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

	_, err = Config(Options{Host: "nope"})
	assert.Error(t, err)
}
