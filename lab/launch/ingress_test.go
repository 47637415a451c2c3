package launch

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/hostops/command"
	"github.com/gpuaas/gpuaas/test/testenv"
)

func TestSetupIngressRefusesBadOptions(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    IngressOptions
		want string
	}{
		{"empty name", IngressOptions{}, `name ""`},
		{"long name", IngressOptions{Name: "abcdefghijkl"}, "1-11 characters"},
		{"upper case", IngressOptions{Name: "Lab"}, `name "Lab"`},
		{"link not /30", IngressOptions{Name: "lab", Link: netip.MustParsePrefix("10.0.0.0/24")}, "want an IPv4 /30"},
		{"public not a network", IngressOptions{Name: "lab", Public: netip.MustParsePrefix("203.0.113.7/24")}, "want an IPv4 network"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &recorder{}
			tc.o.Runner = r
			_, err := SetupIngress(context.Background(), tc.o)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.Empty(t, r.cmds, "nothing is run for bad options")
		})
	}
}

type recorder struct{ cmds []command.Cmd }

func (r *recorder) Run(_ context.Context, c command.Cmd) ([]byte, error) {
	r.cmds = append(r.cmds, c)
	return nil, nil
}

// TestPrivilegedSetupIngress creates the lab's ingress namespaces for
// real: the agent's name of this machine's namespace, the public side
// routed to the public prefix over the veth pair, and a client there
// reaching an address of this machine; Close removes every one of them,
// the agent's table with them, and restores forwarding.
func TestPrivilegedSetupIngress(t *testing.T) {
	testenv.Root(t)
	testenv.Commands(t, "ip", "nft", "nsenter", "ping")
	ctx := context.Background()
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	name := "gpt-" + hex.EncodeToString(b)
	table := "gpuaas_lt_" + hex.EncodeToString(b)
	fwdBefore, err := os.ReadFile(forwardFile)
	require.NoError(t, err)
	o := IngressOptions{Name: name, Table: table, Link: netip.MustParsePrefix("172.31.254.0/30")}
	// A run killed before its clean-up left its objects: set-up replaces them.
	left, err := SetupIngress(ctx, o)
	require.NoError(t, err)
	leftClosed := false
	t.Cleanup(func() {
		if !leftClosed {
			_ = left.Close(ctx)
		}
	})
	li, err := SetupIngress(ctx, o)
	require.NoError(t, err)
	closed := false
	t.Cleanup(func() {
		if !closed {
			_ = li.Close(ctx)
		}
	})
	assert.Equal(t, "/run/netns/"+name, li.Netns)
	for _, ns := range []string{name, li.PublicNetns} {
		assert.FileExists(t, filepath.Join("/run/netns", ns))
	}
	fwd, err := os.ReadFile(forwardFile)
	require.NoError(t, err)
	assert.Equal(t, "1\n", string(fwd))
	ex := command.Exec{}
	out, err := ex.Run(ctx, command.Cmd{Name: "ip", Args: []string{"-n", li.PublicNetns, "route"}})
	require.NoError(t, err)
	assert.Contains(t, string(out), "203.0.113.0/24 via 172.31.254.1")
	_, err = ex.Run(ctx, command.Cmd{Name: "ip", Args: []string{"netns", "exec", li.PublicNetns, "ping", "-c", "1", "-W", "5", "172.31.254.1"}})
	require.NoError(t, err, "the public side reaches this machine")
	// The agent's table, as the agent makes it: in the named namespace.
	_, err = command.Exec{Netns: li.Netns}.Run(ctx, command.Cmd{Name: "nft", Args: []string{"add", "table", "inet", table}})
	require.NoError(t, err)
	_, err = ex.Run(ctx, command.Cmd{Name: "nft", Args: []string{"list", "table", "inet", table}})
	require.NoError(t, err, "the named namespace is this machine's")

	require.NoError(t, li.Close(ctx))
	closed = true
	for _, ns := range []string{name, li.PublicNetns} {
		assert.NoFileExists(t, filepath.Join("/run/netns", ns))
	}
	assert.NoDirExists(t, filepath.Join("/sys/class/net", li.HostLink))
	_, err = ex.Run(ctx, command.Cmd{Name: "nft", Args: []string{"list", "table", "inet", table}})
	assert.Error(t, err, "the ingress table is deleted")
	fwd, err = os.ReadFile(forwardFile)
	require.NoError(t, err)
	assert.Equal(t, "1\n", string(fwd), "forwarding was on before this set-up (the left run's): left on")
	require.NoError(t, li.Close(ctx), "a second Close finds nothing to do")
	// The left run's own clean-up finds its objects gone and restores
	// forwarding as it found it.
	require.NoError(t, left.Close(ctx))
	leftClosed = true
	fwd, err = os.ReadFile(forwardFile)
	require.NoError(t, err)
	assert.Equal(t, string(fwdBefore), string(fwd), "forwarding restored")
}
