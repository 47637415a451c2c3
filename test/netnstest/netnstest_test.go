package netnstest_test

import (
	"net"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netns"

	"github.com/gpuaas/gpuaas/test/netnstest"
	"github.com/gpuaas/gpuaas/test/testenv"
)

func TestPrivilegedNamespaceLifecycle(t *testing.T) {
	testenv.Root(t)
	testenv.Commands(t, "nsenter", "ping")
	host, err := netns.Get()
	require.NoError(t, err)
	defer host.Close()

	var path string
	t.Run("create", func(t *testing.T) {
		a := netnstest.New(t, "a")
		b := netnstest.New(t, "b")
		path = a.Path
		_, err := os.Stat(a.Path)
		require.NoError(t, err)

		mac, _ := net.ParseMAC("52:54:00:aa:bb:cc")
		netnstest.Veth(t, a, "va", mac, b, "vb")
		a.AddAddr(t, "va", "192.168.250.1/30")
		b.AddAddr(t, "vb", "192.168.250.2/30")
		a.MustRun(t, "ping", "-c", "1", "-W", "2", "192.168.250.2")

		l, err := a.Handle().LinkByName("va")
		require.NoError(t, err)
		assert.Equal(t, mac, l.Attrs().HardwareAddr)

		// Do enters the namespace and leaves the thread where it was.
		err = a.Do(func() error {
			cur, err := netns.Get()
			if err != nil {
				return err
			}
			defer cur.Close()
			assert.True(t, cur.Equal(a.NsHandle()))
			return nil
		})
		require.NoError(t, err)
		cur, err := netns.Get()
		require.NoError(t, err)
		defer cur.Close()
		assert.True(t, cur.Equal(host), "thread left in the test namespace")
	})
	_, err = os.Stat(path)
	assert.True(t, os.IsNotExist(err), "namespace %s not deleted on cleanup", path)
}
