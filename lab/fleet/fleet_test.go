package fleet

import (
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/agent/config"
	"github.com/gpuaas/gpuaas/agent/daemon"
	"github.com/gpuaas/gpuaas/lab/hostsim/hostsimtest"
)

func TestNewHostRefusesBadNames(t *testing.T) {
	for _, name := range []string{"", "../etc", "a/b", "j22u15\n"} {
		_, err := NewHost(name, "/x", "/y")
		assert.Error(t, err, "%q", name)
	}
	h, err := NewHost("j22u15", "/x", "/y")
	require.NoError(t, err)
	assert.NotEqual(t, h.Diag, h.Gossip)
}

func TestEnsureRootGeneratesOnceAndReplacesPartialTrees(t *testing.T) {
	t.Parallel()
	h := Host{Name: "j22u11", Root: filepath.Join(hostsimtest.Dir(t), "j22u11")}
	gen, err := EnsureRoot(h)
	require.NoError(t, err)
	assert.True(t, gen)
	_, err = os.Stat(filepath.Join(h.Root, "sys", "bus", "pci", "devices"))
	require.NoError(t, err)
	marker := filepath.Join(h.Root, "etc", "lab-marker")
	require.NoError(t, os.WriteFile(marker, []byte("kept"), 0o644))

	gen, err = EnsureRoot(h)
	require.NoError(t, err)
	assert.False(t, gen, "a complete tree is reused")
	_, err = os.Stat(marker)
	require.NoError(t, err, "reuse leaves the tree alone")

	// A tree without its runtime file was cut short: generated again.
	require.NoError(t, os.Remove(filepath.Join(h.Root, "run", "hostsim", "runtime.json")))
	gen, err = EnsureRoot(h)
	require.NoError(t, err)
	assert.True(t, gen)
	_, err = os.Stat(marker)
	assert.ErrorIs(t, err, os.ErrNotExist)

	_, err = EnsureRoot(Host{Name: "nope", Root: filepath.Join(hostsimtest.Dir(t), "nope")})
	assert.ErrorContains(t, err, "generate host nope")
}

func TestAgentProcTokenFileAndArgs(t *testing.T) {
	state := t.TempDir()
	h, err := NewHost("j22u15", "/lab/hosts/j22u15", state)
	require.NoError(t, err)
	a := Agents{Bin: "/bin/gpuaas-agent", Coordinators: []string{"http://127.0.0.1:1"}, GossipJoin: []string{"127.0.0.1:2"}, LogDir: t.TempDir()}
	p, err := a.Proc(h, "gpb_secret")
	require.NoError(t, err)
	assert.NotContains(t, p.Args, "gpb_secret", "the token never shows in the process table")
	st, err := os.Stat(filepath.Join(state, TokenFile))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), st.Mode().Perm())

	cfg, err := config.Load(p.Args[1:], func(string) string { return "" }, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, "gpb_secret", cfg.BootstrapToken)
	assert.Equal(t, h.Diag, cfg.DiagAddr)
	assert.Equal(t, h.Gossip, cfg.GossipBind)
	assert.Equal(t, config.EvidenceHostsim, cfg.Evidence)

	// Not enrolled yet: the token stays. Enrolled: it goes.
	require.NoError(t, ForgetToken(h))
	_, err = os.Stat(filepath.Join(state, TokenFile))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(state, daemon.CredentialFile), []byte("gpn_x\n"), 0o600))
	assert.True(t, Enrolled(h))
	require.NoError(t, ForgetToken(h))
	_, err = os.Stat(filepath.Join(state, TokenFile))
	assert.ErrorIs(t, err, os.ErrNotExist)
	require.NoError(t, ForgetToken(h), "forgetting twice is fine")

	// An enrolled agent restarts without a token (the same arguments
	// load even though the token file is gone).
	_, err = config.Load(p.Args[1:], func(string) string { return "" }, io.Discard)
	require.NoError(t, err)
}
