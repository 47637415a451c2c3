package discovery

import (
	"context"
	"github.com/gpuaas/gpuaas/hostops/disk"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/agent/evidence"
	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/lab/hostsim"
	"github.com/gpuaas/gpuaas/lab/hostsim/hostsimtest"
	"github.com/gpuaas/gpuaas/proto"
)

func opts(root hostops.Root, node string) Options {
	return Options{
		NodeID:        node,
		GuestGateway:  netip.MustParsePrefix("10.200.0.1/24"),
		ImageCacheDir: root.VarPath("lib", "gpuaas"),
		Evidence:      evidence.Hostsim{Root: root},
		At:            time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC),
	}
}

func discover(t *testing.T, root hostops.Root, node string) Report {
	t.Helper()
	r, err := Discover(context.Background(), root, opts(root, node))
	require.NoError(t, err)
	return r
}

func TestCompleteSliceHost(t *testing.T) {
	t.Parallel()
	root, _ := hostsimtest.Host(t, "j22u15")
	r := discover(t, root, "j22u15")
	topo := r.Topology

	require.Len(t, r.GPUs, 8)
	require.Len(t, r.Disks, 8)
	require.Len(t, topo.Candidates, 8)
	assert.Empty(t, topo.Blockers)
	assert.Len(t, Complete(topo), 8, "every candidate of the complete host is complete")
	for _, p := range r.Prerequisites {
		assert.True(t, p.OK, "%s: %s", p.Check, p.Detail)
	}
	assert.NotEmpty(t, r.IBPorts)

	disks := map[string]Disk{}
	for _, d := range r.Disks {
		disks[d.Serial] = d
	}
	seen := map[string]bool{}
	for i, c := range topo.Candidates {
		capa := c.Capacity
		assert.Equal(t, i, c.Index)
		assert.Empty(t, capa.MissingBindings(), "candidate %d", i)
		assert.Empty(t, c.Problems, "candidate %d", i)
		// Locality: the paired disk shares the GPU's PCIe switch.
		d := disks[capa.NVMe.Serial]
		assert.Equal(t, capa.PCIeSwitch, d.Switch, "candidate %d disk %s", i, d.Name)
		assert.NotEmpty(t, capa.NVMe.EUI)
		mac, err := net.ParseMAC(capa.ManagementMAC)
		require.NoError(t, err)
		assert.Equal(t, byte(0x02), mac[0]&0x03, "locally administered unicast")
		assert.Equal(t, "10.200.0."+itoa(10+i), capa.PrivateIP)
		assert.LessOrEqual(t, len(capa.OVSPort), 15)
		for _, v := range []string{capa.NVMe.Serial, capa.FabricVFPCIAddress, capa.ManagementMAC, capa.OVSPort, capa.PrivateIP} {
			assert.False(t, seen[v], "%s used twice", v)
			seen[v] = true
		}
	}
	// The GPU with a companion function reports its whole group.
	for _, g := range r.GPUs {
		if g.Addr == "0000:9a:00.0" {
			assert.Equal(t, []string{"0000:9a:00.0", "0000:9a:00.1"}, g.GroupPeers)
			assert.Equal(t, "viable", g.GroupViable)
		}
	}

	// Deterministic: a second discovery gives the same map.
	again := discover(t, root, "j22u15")
	assert.Equal(t, topo, again.Topology)
	// Suggestions depend on the node ID.
	other := discover(t, root, "j22u16")
	assert.NotEqual(t, topo.Candidates[0].Capacity.ManagementMAC, other.Topology.Candidates[0].Capacity.ManagementMAC)
}

func itoa(i int) string { return strconv.Itoa(i) }

func TestMountedDiskIsMarked(t *testing.T) {
	t.Parallel()
	root, _ := hostsimtest.Host(t, "j22u11")
	r := discover(t, root, "j22u11")
	var marked []proto.SlotCandidate
	for _, c := range r.Topology.Candidates {
		if c.DiskMounted {
			marked = append(marked, c)
		}
	}
	require.Len(t, marked, 1, "exactly the disk with /srv/share is marked")
	c := marked[0]
	assert.Contains(t, strings.Join(c.Problems, "\n"), "on /srv/share (ext4)")
	assert.Contains(t, strings.Join(c.DiskSignatures, ","), "ext4")
	assert.Len(t, Complete(r.Topology), 7)
}

func TestMountingADiskLater(t *testing.T) {
	t.Parallel()
	root, _ := hostsimtest.Host(t, "j22u15")
	require.NoError(t, hostsim.MountDisk(root, "nvme3n1", "/scratch"))
	r := discover(t, root, "j22u15")
	n := 0
	for _, c := range r.Topology.Candidates {
		if c.Capacity.NVMe.Device == "nvme3n1" {
			assert.True(t, c.DiskMounted)
			n++
		}
	}
	assert.Equal(t, 1, n)
	assert.Len(t, Complete(r.Topology), 7)
}

func TestBaremetalHost(t *testing.T) {
	t.Parallel()
	root, _ := hostsimtest.Host(t, "j27u15")
	r := discover(t, root, "j27u15")
	require.Len(t, r.GPUs, 8)
	assert.Contains(t, strings.Join(r.Topology.Blockers, "\n"), BlockerIOMMUOff)
	assert.Empty(t, Complete(r.Topology), "no candidate of a baremetal host is complete")
	for _, c := range r.Topology.Candidates {
		assert.Contains(t, strings.Join(c.Problems, "\n"), "not vfio-pci")
		assert.Contains(t, strings.Join(c.Problems, "\n"), "IOMMU is off")
	}
	held := 0
	for _, d := range r.Disks {
		if len(d.Holders) > 0 {
			held++
			assert.Equal(t, []string{"md127"}, d.Holders)
		}
	}
	assert.Positive(t, held, "RAID members report their holder")
}

func TestTamperedAndMissingFilesFailWithTheFile(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		mutate func(hostops.Root) error
		want   string
	}{
		"garbage numa_node": {func(r hostops.Root) error {
			return hostsim.TamperFile(r, "sys/bus/pci/devices/0000:18:00.0/numa_node", "banana\n")
		}, "numa_node"},
		"missing nvme serial": {func(r hostops.Root) error {
			return os.Remove(filepath.Join(r.SysPath("class", "block", "nvme2n1", "device"), "serial"))
		}, "device/serial"},
		"non-printable serial": {func(r hostops.Root) error {
			return hostsim.TamperFile(r, "sys/class/block/nvme2n1/device/serial", "S7\x01X\n")
		}, "device/serial"},
		"garbage eui": {func(r hostops.Root) error {
			return hostsim.TamperFile(r, "sys/class/block/nvme1n1/eui", "zz zz\n")
		}, filepath.Join("nvme1n1", "eui")},
		"garbage dev number": {func(r hostops.Root) error {
			return hostsim.TamperFile(r, "sys/class/block/nvme1n1/dev", "two\n")
		}, filepath.Join("nvme1n1", "dev")},
		"missing cmdline": {func(r hostops.Root) error {
			return os.Remove(r.ProcPath("cmdline"))
		}, "cmdline"},
		"garbage mountinfo": {func(r hostops.Root) error {
			return hostsim.TamperFile(r, "proc/self/mountinfo", "not a mount line\n")
		}, "mountinfo"},
		"garbage hugepages": {func(r hostops.Root) error {
			return hostsim.TamperFile(r, "sys/devices/system/node/node0/hugepages/hugepages-1048576kB/free_hugepages", "-3\n")
		}, "free_hugepages"},
		"controller address outside the host": {func(r hostops.Root) error {
			return hostsim.TamperFile(r, "sys/class/block/nvme0n1/device/address", "0000:ff:00.0\n")
		}, "not a PCI function of this host"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			root, _ := hostsimtest.Host(t, "j22u15")
			require.NoError(t, tc.mutate(root))
			r, err := Discover(context.Background(), root, opts(root, "j22u15"))
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.Empty(t, r.Topology.Candidates, "nothing half-reported")
			assert.Empty(t, r.GPUs)
		})
	}
}

func TestUnpluggedGPUDisappears(t *testing.T) {
	t.Parallel()
	root, _ := hostsimtest.Host(t, "j22u15")
	require.NoError(t, hostsim.UnplugGPU(root, "0000:3a:00.0"))
	r := discover(t, root, "j22u15")
	assert.Len(t, r.Topology.Candidates, 7)
	for _, c := range r.Topology.Candidates {
		assert.NotEqual(t, "0000:3a:00.0", c.Capacity.GPUPCIAddress)
	}
}

func TestParsers(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"00 25 38 01 b5 31 a0 00":              "00253801b531a000",
		"36344830-52a0-0000-0025-3801b531a000": "3634483052a00000002538 01b531a000",
	} {
		got, err := ParseEUI(in)
		require.NoError(t, err)
		assert.Equal(t, strings.ReplaceAll(want, " ", ""), got)
	}
	for _, bad := range []string{"", "0025", "zz25380100000000", "00 25 38 01 b5 31 a0 00 11"} {
		_, err := ParseEUI(bad)
		assert.Error(t, err, bad)
	}
	s, err := ParseSerial("S7DKNE0XJ1100      ")
	require.NoError(t, err)
	assert.Equal(t, "S7DKNE0XJ1100", s)
	_, err = ParseSerial("   ")
	assert.Error(t, err)

	ms, err := disk.ParseMountinfo("36 35 259:7 / /srv/my\\040share rw,noatime shared:1 - ext4 /dev/nvme7n1p1 rw\n")
	require.NoError(t, err)
	require.Len(t, ms, 1)
	assert.Equal(t, disk.MountEntry{Major: 259, Minor: 7, Root: "/", MountPoint: "/srv/my share", FSType: "ext4", Source: "/dev/nvme7n1p1"}, ms[0])
	_, err = disk.ParseMountinfo("36 35 x:y / /a rw - ext4 /dev/x rw\n")
	assert.Error(t, err)

	assert.Equal(t, "ext4", ParseUdevSignature("E:ID_FS_TYPE=ext4\nE:ID_PART_ENTRY_NUMBER=1\n"))
	assert.Equal(t, "partition table gpt", ParseUdevSignature("E:ID_PART_TABLE_TYPE=gpt\n"))
	assert.Equal(t, "", ParseUdevSignature("E:ID_SERIAL=x\n"))

	for cmdline, want := range map[string]bool{
		"ro intel_iommu=on iommu=pt": true,
		"ro intel_iommu=on":          true,
		"ro quiet":                   false,
		"intel_iommu=on iommu=off":   false,
	} {
		got, _ := IOMMUEnabled(cmdline)
		assert.Equal(t, want, got, cmdline)
	}
	ip, err := SuggestIP(netip.MustParsePrefix("10.9.0.1/28"), 3)
	require.NoError(t, err)
	assert.Equal(t, "10.9.0.13", ip.String())
	_, err = SuggestIP(netip.MustParsePrefix("10.9.0.1/28"), 5)
	assert.Error(t, err, "a /28 has 14 hosts")
}
