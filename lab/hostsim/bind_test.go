package hostsim_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/gpuaas/gpuaas/lab/hostsim"
)

// TestBindBlockDeviceRefuses covers the refusals; the agent's slice
// runtime tests bind a real loop device (agent/slice privileged tests).
func TestBindBlockDeviceRefuses(t *testing.T) {
	t.Parallel()
	root := generate(t, "j22u15")
	for _, tc := range []struct{ name, node, want string }{
		{"../x", "/dev/loop0", "bind block device"},
		{"nvme0n1", "dev/loop0", "not a clean absolute path"},
		{"nvme0n1", "/dev/../dev/loop0", "not a clean absolute path"},
		{"nvme0n1", "/dev/null", "not a block device"},
		{"nvme0n1", "/nonexistent/loop", "no such file"},
	} {
		assert.ErrorContains(t, hostsim.BindBlockDevice(root, tc.name, tc.node), tc.want, "%s %s", tc.name, tc.node)
	}
	assert.Equal(t, "259:0", read(t, root.SysPath("class/block/nvme0n1/dev")), "unchanged")
}
