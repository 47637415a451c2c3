package maaslab

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/maas"
	"github.com/gpuaas/gpuaas/coordinator/maasflow"
	"github.com/gpuaas/gpuaas/lab/fleet"
	"github.com/gpuaas/gpuaas/lab/launch"
	"github.com/gpuaas/gpuaas/lab/maassim"
)

// Register makes an enrolled host a Ready machine of the simulated
// region (once); a tenant deploy's first boot keeps the user-data and
// starts nothing.
func TestRegisterAndTenantDeploy(t *testing.T) {
	t.Parallel()
	logs := t.TempDir()
	l, err := Start(Config{Hosts: []fleet.Host{{Name: "j27u15"}}, Agents: fleet.Agents{LogDir: logs},
		Start: func(p *launch.Proc) error {
			t.Errorf("%s started: nothing is started for a tenant deploy", p.Name)
			return nil
		}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	id, err := l.Register(ctx, "j27u15")
	require.NoError(t, err)
	m, ok := l.Sim.Machine(id)
	require.True(t, ok)
	assert.Equal(t, maassim.StatusReady, m.Status)
	assert.Equal(t, []string{PXEMAC("j27u15")}, m.MACs[:1])
	again, err := l.Register(ctx, "j27u15")
	require.NoError(t, err)
	assert.Equal(t, id, again, "registered once")
	_, err = l.Register(ctx, "j99u99")
	assert.ErrorContains(t, err, "not a lab host")

	ud, err := maasflow.RenderTenantUserData(maasflow.TenantUserData{AllocationID: "alloc-1", Hostname: "j27u15",
		SSHPublicKeys: []string{"ssh-ed25519 AAAA t"}, ProfileUserData: TenantUserData})
	require.NoError(t, err)
	c, err := maas.New(maas.Config{URL: l.URL + "/", APIKey: l.APIKey, PollInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	_, err = c.Deploy(ctx, id, maas.DeployParams{UserData: ud}, maas.Wait{Expiry: 20 * time.Second})
	require.NoError(t, err)
	require.Eventually(t, func() bool { _, ok := l.Tenant("j27u15"); return ok }, 10*time.Second, 10*time.Millisecond)
	d, _ := l.Tenant("j27u15")
	assert.Equal(t, ud, d.UserData)
	kept, err := os.ReadFile(filepath.Join(logs, "tenant-j27u15.user-data"))
	require.NoError(t, err)
	assert.Equal(t, ud, kept)
	assert.Nil(t, l.Bootstrap("j27u15"), "no gpuaas-bootstrap for a tenant deploy")
}

// Restart takes the region away (requests fail while it is down) and
// brings it back on the same address with its machines.
func TestRestartKeepsState(t *testing.T) {
	t.Parallel()
	l, err := Start(Config{Hosts: []fleet.Host{{Name: "j27u15"}}, Agents: fleet.Agents{LogDir: t.TempDir()},
		Start: func(*launch.Proc) error { return nil }})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	id, err := l.Register(ctx, "j27u15")
	require.NoError(t, err)
	c, err := maas.New(maas.Config{URL: l.URL + "/", APIKey: l.APIKey, PollInterval: 20 * time.Millisecond, RequestTimeout: 2 * time.Second})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- l.Restart(500 * time.Millisecond) }()
	time.Sleep(200 * time.Millisecond)
	_, err = c.Machine(ctx, id)
	assert.Error(t, err, "the region is down")
	require.NoError(t, <-done)
	m, err := c.Machine(ctx, id)
	require.NoError(t, err, "the region is back on %s", l.URL)
	assert.Equal(t, "j27u15", m.Hostname)
}
