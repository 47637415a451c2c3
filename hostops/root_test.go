package hostops

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestNewRoot(t *testing.T) {
	_, err := NewRoot("relative/dir")
	require.ErrorContains(t, err, "absolute")

	r, err := NewRoot("/tmp/host")
	require.NoError(t, err)
	require.Equal(t, "/tmp/host/sys/bus/pci/devices/0000:18:00.0", r.SysPath("bus/pci/devices", "0000:18:00.0"))
	require.Equal(t, "/tmp/host/proc/self/mountinfo", r.ProcPath("self", "mountinfo"))
	require.False(t, r.IsReal())
	require.True(t, RealRoot().IsReal())
}

func TestValidName(t *testing.T) {
	for _, bad := range []string{"", ".", "..", "a/b", "x\x00"} {
		require.Error(t, ValidName(bad), "%q", bad)
	}
	require.NoError(t, ValidName("0000:18:00.0"))
}
