package prepare

import (
	"github.com/gpuaas/gpuaas/test/testenv"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
)

func TestParseDefaultRoute(t *testing.T) {
	const head = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
	for name, c := range map[string]struct {
		in, want, err string
	}{
		"one default":    {head + "eth0\t00000000\t0124B10A\t0003\t0\t0\t0\t00000000\t0\t0\t0\n", "eth0", ""},
		"lowest metric":  {head + "eth1\t00000000\t0124B10A\t0003\t0\t0\t200\t00000000\t0\t0\t0\neth0\t00000000\t0124B10A\t0003\t0\t0\t100\t00000000\t0\t0\t0\n", "eth0", ""},
		"no default":     {head + "eth0\t0024B10A\t00000000\t0001\t0\t0\t0\t00FCFFFF\t0\t0\t0\n", "", "no IPv4 default route"},
		"empty":          {"", "", "no IPv4 default route"},
		"bad metric":     {head + "eth0\t00000000\t0124B10A\t0003\t0\t0\tx\t00000000\t0\t0\t0\n", "", "metric"},
		"bad iface name": {head + "a/b\t00000000\t0124B10A\t0003\t0\t0\t0\t00000000\t0\t0\t0\n", "", "interface name"},
	} {
		got, err := parseDefaultRoute(c.in)
		if c.err != "" {
			assert.ErrorContains(t, err, c.err, name)
			continue
		}
		require.NoError(t, err, name)
		assert.Equal(t, c.want, got, name)
	}
}

func TestParseSoftdeps(t *testing.T) {
	got, err := parseSoftdeps("# Managed\nsoftdep mlx5_core pre: vfio-pci\n\nsoftdep nvidia pre: vfio-pci\n")
	require.NoError(t, err)
	assert.Equal(t, []string{"mlx5_core", "nvidia"}, got)
	for _, bad := range []string{"softdep nvidia post: vfio-pci", "options vfio-pci ids=10de:2335", "softdep ../x pre: vfio-pci", "softdep nvidia pre: vfio-pci extra"} {
		_, err := parseSoftdeps(bad + "\n")
		assert.Error(t, err, bad)
	}
}

func TestParsePayloadDefaults(t *testing.T) {
	p, err := ParsePayload(proto.HostPrepareSlicePayload{GuestSubnet: "10.200.0.0/24", FabricInterface: "ibp26s0",
		FabricAddress: "172.16.22.11/16", FabricRoute: "172.16.0.0/12", FabricGateway: "172.16.0.1",
		FabricPFs: []string{"0000:58:00.1", "0000:58:00.0", "0000:58:00.1"}}, "ovsbr0")
	require.NoError(t, err)
	assert.Equal(t, netip.MustParsePrefix("10.200.0.1/24"), p.GuestGateway, "the first address is the gateway")
	assert.Equal(t, []string{"0000:58:00.0", "0000:58:00.1"}, p.FabricPFs)

	_, err = ParsePayload(proto.HostPrepareSlicePayload{GuestSubnet: "nope", FabricAddress: "x", VFsPerPF: 999}, "ovsbr0")
	var pe *PayloadError
	require.ErrorAs(t, err, &pe)
	assert.GreaterOrEqual(t, len(pe.Errs), 3, "every bad field is named: %v", err)
}

// TestRenderUnitsVerify renders the units and has systemd-analyze check
// them (syntax, known directives, executables present).
func TestRenderUnitsVerify(t *testing.T) {
	plan, err := ParsePayload(proto.HostPrepareSlicePayload{GuestSubnet: "10.200.0.0/24", FabricInterface: "ibp26s0",
		FabricAddress: "172.16.22.11/16", FabricRoute: "172.16.0.0/12", FabricGateway: "172.16.0.1"}, "ovsbr0")
	require.NoError(t, err)
	us := RenderUnits(UnitInputs{Plan: plan, NumVFs: map[string]int{"0000:58:00.0": 8}, VFIO: []string{"0000:18:00.0", "0000:58:00.2"}})
	require.Len(t, us, 4)
	var names []string
	for _, u := range us {
		names = append(names, u.Name)
	}
	assert.Equal(t, []string{UnitFabricVFs, UnitVFIODevices, UnitNetworkBaseline, UnitOVSBridge}, names)
	assert.Contains(t, string(us[0].Content), "ExecStart=/bin/sh -c 'echo 8 > /sys/bus/pci/devices/0000:58:00.0/sriov_numvfs'")
	assert.Contains(t, string(us[1].Content), "/sys/bus/pci/devices/0000:58:00.2/driver")
	assert.Contains(t, string(us[2].Content), "ExecStart=/sbin/ip route replace 172.16.0.0/12 via 172.16.0.1 dev ibp26s0\n")
	assert.Contains(t, string(us[3].Content), "ExecStart=/sbin/ip addr replace 10.200.0.1/24 dev ovsbr0\n")

	// make deps installs it (package systemd); CI fails rather than skips.
	testenv.Commands(t, "systemd-analyze")
	dir := t.TempDir()
	var paths []string
	for _, u := range us {
		p := filepath.Join(dir, u.Name)
		require.NoError(t, os.WriteFile(p, u.Content, 0o644))
		paths = append(paths, p)
	}
	out, err := exec.Command("systemd-analyze", append([]string{"verify", "--man=no"}, paths...)...).CombinedOutput()
	// Units this host lacks (openvswitch-switch, udev settle) are
	// reported as missing dependencies; anything else is a defect.
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if line == "" || strings.Contains(line, "not found") || strings.Contains(line, "Failed to create") ||
			strings.Contains(line, "openvswitch-switch.service") || strings.Contains(line, "udev-settle") {
			continue
		}
		t.Errorf("systemd-analyze verify: %s", line)
	}
	_ = err
}
