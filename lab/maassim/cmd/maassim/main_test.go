package main

import (
	"context"
	"encoding/base64"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/canonical/gomaasclient/client"
	"github.com/canonical/gomaasclient/entity"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRunServesAndRecordsDeployed runs the binary's main loop on a loopback
// port, drives a machine to Deployed with the real gomaasclient and checks
// the user-data file the lab watches for.
func TestRunServesAndRecordsDeployed(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	addrc := make(chan string, 1)
	errc := make(chan error, 1)
	go func() {
		errc <- run(ctx, []string{"-listen", "127.0.0.1:0", "-speed", "100000", "-api-key", "a:b:c",
			"-subnet", "10.20.0.0/24,0,10.20.0.1", "-hardware", "52:54:00:00:50:01=j22u15", "-deployed-dir", dir}, func(a string) { addrc <- a })
	}()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-errc)
	})
	var addr string
	select {
	case addr = <-addrc:
	case err := <-errc:
		t.Fatalf("run: %v", err)
	}
	c, err := client.GetClient("http://"+addr+"/MAAS/", "a:b:c", "2.0")
	require.NoError(t, err)
	m, err := c.Machines.Create(&entity.MachineCreateParams{Architecture: "amd64/generic",
		MACAddresses: []string{"52:54:00:00:50:01"}, PowerType: "manual"}, nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		got, err := c.Machine.Get(m.SystemID)
		return err == nil && got.StatusName == "Ready"
	}, 10*time.Second, 10*time.Millisecond)
	_, err = c.Machine.Deploy(m.SystemID, &entity.MachineDeployParams{UserData: base64.StdEncoding.EncodeToString([]byte("#cloud-config\n"))})
	require.NoError(t, err)
	var ud []byte
	require.Eventually(t, func() bool {
		if _, err := os.Stat(filepath.Join(dir, m.SystemID+".json")); err != nil {
			return false
		}
		ud, err = os.ReadFile(filepath.Join(dir, m.SystemID+".user-data"))
		return err == nil
	}, 10*time.Second, 10*time.Millisecond)
	assert.Equal(t, "#cloud-config\n", string(ud))
	bds, err := c.BlockDevices.Get(m.SystemID)
	require.NoError(t, err)
	assert.Equal(t, "Micron_5400_MTFDDAK480TGA", bds[0].Model, "-hardware applied the j22u15 profile")
}

func TestRunRejectsBadFlags(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"-listen", "0.0.0.0:0"},
		{"-listen", "192.0.2.1:5240"},
		{"-api-key", "only:two"},
		{"-subnet", "not-a-cidr"},
		{"-nosuchflag"},
		{"-hardware", "52:54:00:00:50:01"},
		{"-hardware", "52:54:00:00:50:01=nosuchhost"},
	} {
		err := run(context.Background(), args, nil)
		assert.Error(t, err, "%v", args)
	}
}
