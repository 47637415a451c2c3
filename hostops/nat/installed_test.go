package nat_test

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/hostops/command"
	"github.com/gpuaas/gpuaas/hostops/command/commandtest"
	"github.com/gpuaas/gpuaas/hostops/nat"
)

// TestInstalled compares `nft -j list table` output (captured from nft
// 1.0.6 after RenderBase for ovsbr0 / enp88s0f0np0 / 10.200.0.0/24) with
// the configuration.
func TestInstalled(t *testing.T) {
	t.Parallel()
	captured, err := os.ReadFile("testdata/list-table-gpuaas.json")
	require.NoError(t, err)
	check := func(uplink string, out []byte, runErr error) (bool, error) {
		rec := &commandtest.Recorder{Reply: func(command.Cmd) ([]byte, error) { return out, runErr }}
		n, err := nat.New(nat.Config{Bridge: "ovsbr0", Uplink: uplink, Subnet: netip.MustParsePrefix("10.200.0.0/24"), Runner: rec})
		require.NoError(t, err)
		ok, err := n.Installed(context.Background())
		assert.Equal(t, []string{"nft -j list table inet gpuaas"}, rec.Lines())
		return ok, err
	}
	ok, err := check("enp88s0f0np0", captured, nil)
	require.NoError(t, err)
	assert.True(t, ok)

	ok, err = check("eth9", captured, nil)
	require.NoError(t, err)
	assert.False(t, ok, "another uplink: the rules must be rewritten")

	ok, err = check("enp88s0f0np0", []byte(`{"nftables": [{"table": {"family": "inet", "name": "gpuaas"}}]}`), nil)
	require.NoError(t, err)
	assert.False(t, ok, "a table without its set and chains")

	missing := &command.Error{Cmd: command.Cmd{Name: "nft"}, Stderr: "Error: No such file or directory\nlist table inet gpuaas\n", Err: errors.New("exit status 1")}
	ok, err = check("enp88s0f0np0", nil, missing)
	require.NoError(t, err)
	assert.False(t, ok)

	_, err = check("enp88s0f0np0", nil, &command.Error{Cmd: command.Cmd{Name: "nft"}, Stderr: "Error: Operation not permitted", Err: errors.New("exit status 1")})
	assert.ErrorContains(t, err, "Operation not permitted")
	_, err = check("enp88s0f0np0", []byte("not json"), nil)
	assert.ErrorContains(t, err, "parse nft -j output")
}
