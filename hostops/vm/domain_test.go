package vm

import (
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/test/testenv"
)

var update = flag.Bool("update", false, "rewrite golden files")

// productionSpec is a 1-GPU slice as the agent plans it on an H200 host.
func productionSpec() DomainSpec {
	return DomainSpec{
		Name:       "slice-a1b2c3",
		UUID:       "6f1c2d3e-4a5b-4c6d-8e9f-0a1b2c3d4e5f",
		Hypervisor: KVM,
		VCPUs:      24,
		MemoryMiB:  64 << 10,
		Firmware:   DefaultFirmware("/var/lib/gpuaas/vm/slice-a1b2c3/OVMF_VARS.fd"),
		BootDisk:   "/dev/nvme3n1",
		SeedISO:    "/var/lib/gpuaas/vm/slice-a1b2c3/seed.iso",
		SerialLog:  "/var/log/gpuaas/vm/slice-a1b2c3.serial.log",
		NIC: NIC{
			Kind: NICOpenVSwitch, MAC: "52:54:00:22:15:01", Bridge: "ovsbr0",
			InterfaceID: "0c9d8e7f-6a5b-4c3d-9e1f-2a3b4c5d6e7f",
		},
		Hostdevs:    []string{"0000:18:00.0", "0000:1a:00.2"},
		CPUPins:     []int{2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 98, 99, 100, 101, 102, 103, 104, 105, 106, 107, 108, 109},
		NUMANodes:   []int{0},
		HugepageKiB: 1048576,
	}
}

func labSpec() DomainSpec {
	s := LabSized(productionSpec())
	s.NIC = NIC{Kind: NICUser, MAC: "52:54:00:22:15:01"}
	s.BootDisk = "/dev/loop7"
	return s
}

func golden(t *testing.T, name, got string) {
	t.Helper()
	p := filepath.Join("testdata", name)
	if *update {
		require.NoError(t, os.WriteFile(p, []byte(got), 0o644))
	}
	want, err := os.ReadFile(p)
	require.NoError(t, err, "run go test -update to create %s", p)
	if d := cmp.Diff(string(want), got); d != "" {
		t.Fatalf("%s (-want +got):\n%s", p, d)
	}
}

func TestDomainXMLGolden(t *testing.T) {
	t.Parallel()
	for name, s := range map[string]DomainSpec{"production.xml": productionSpec(), "lab.xml": labSpec()} {
		x, err := XML(s)
		require.NoError(t, err)
		golden(t, name, x)
	}
}

func TestLabSized(t *testing.T) {
	t.Parallel()
	p := productionSpec()
	l := LabSized(p)
	want := p
	want.Hypervisor, want.VCPUs, want.MemoryMiB, want.Hostdevs = TCG, 1, 512, nil
	want.CPUPins, want.NUMANodes, want.HugepageKiB = nil, nil, 0
	if d := cmp.Diff(want, l); d != "" {
		t.Fatalf("LabSized (-want +got):\n%s", d)
	}
	require.Len(t, p.Hostdevs, 2, "LabSized must not modify its argument")
	require.NoError(t, l.Validate())
}

// TestDomainXMLValidates checks both generated domains against libvirt's
// RelaxNG schema with virt-xml-validate (package libvirt-clients, which
// needs xmllint from libxml2-utils).
func TestDomainXMLValidates(t *testing.T) {
	testenv.Commands(t, "virt-xml-validate", "xmllint")
	t.Parallel()
	for _, s := range []DomainSpec{productionSpec(), labSpec()} {
		x, err := XML(s)
		require.NoError(t, err)
		p := filepath.Join(t.TempDir(), s.Name+".xml")
		require.NoError(t, os.WriteFile(p, []byte(x), 0o644))
		out, err := exec.Command("virt-xml-validate", p, "domain").CombinedOutput()
		require.NoError(t, err, "virt-xml-validate: %s\n%s", out, x)
	}
	// And the schema check can fail: a domain XML with a bogus element.
	p := filepath.Join(t.TempDir(), "bad.xml")
	require.NoError(t, os.WriteFile(p, []byte("<domain type='qemu'><name>x</name><bogus/></domain>"), 0o644))
	_, err := exec.Command("virt-xml-validate", p, "domain").CombinedOutput()
	require.Error(t, err)
}

func TestDomainNoKernelNoGraphics(t *testing.T) {
	t.Parallel()
	d, err := Domain(labSpec())
	require.NoError(t, err)
	require.Empty(t, d.OS.Kernel, "the guest boots from its disk")
	require.Empty(t, d.OS.Initrd)
	require.Empty(t, d.Devices.Graphics, "no VNC/SPICE/any graphics device: the serial console through the gateway is the only console")
	require.Empty(t, d.Devices.Videos)
	require.Empty(t, d.Devices.Channels, "no spice/qemu-ga channel either")
	require.Len(t, d.Devices.Serials, 1, "one serial device for the console stream")
	sr := d.Devices.Serials[0]
	require.NotNil(t, sr.Source.Pty, "the serial device is a pty: libvirt's console stream (virDomainOpenConsole) attaches to it")
	require.Equal(t, uint(0), *sr.Target.Port)
	require.NotNil(t, sr.Log, "the console output is also logged on the host")
	x, err := d.Marshal()
	require.NoError(t, err)
	for _, banned := range []string{"<graphics", "vnc", "spice", "<video"} {
		require.NotContains(t, x, banned)
	}
	require.Contains(t, x, `<serial type="pty">`)
	require.Equal(t, "no", d.OS.Loader.Secure)
	require.Equal(t, uint(1), d.Devices.Disks[0].Boot.Order)
}

func TestValidate(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		mut  func(*DomainSpec)
		want string
	}{
		"empty name":        {func(s *DomainSpec) { s.Name = "" }, "domain name"},
		"name with slash":   {func(s *DomainSpec) { s.Name = "a/../b" }, "domain name"},
		"bad uuid":          {func(s *DomainSpec) { s.UUID = "xyz" }, "UUID"},
		"bad hypervisor":    {func(s *DomainSpec) { s.Hypervisor = "xen" }, "hypervisor"},
		"no vcpu":           {func(s *DomainSpec) { s.VCPUs = 0 }, "vCPUs"},
		"tiny memory":       {func(s *DomainSpec) { s.MemoryMiB = 64 }, "memory"},
		"relative disk":     {func(s *DomainSpec) { s.BootDisk = "dev/nvme0n1" }, "boot disk"},
		"unclean disk":      {func(s *DomainSpec) { s.BootDisk = "/dev/../etc/shadow" }, "boot disk"},
		"no seed":           {func(s *DomainSpec) { s.SeedISO = "" }, "seed ISO"},
		"no nvram":          {func(s *DomainSpec) { s.Firmware.NVRAM = "" }, "NVRAM"},
		"no serial log":     {func(s *DomainSpec) { s.SerialLog = "" }, "serial log"},
		"bad mac":           {func(s *DomainSpec) { s.NIC.MAC = "52:54:00:22:15" }, "MAC"},
		"multicast mac":     {func(s *DomainSpec) { s.NIC.MAC = "01:54:00:22:15:01" }, "MAC"},
		"bad bridge":        {func(s *DomainSpec) { s.NIC.Bridge = "../br" }, "OVS bridge"},
		"bad interface id":  {func(s *DomainSpec) { s.NIC.InterfaceID = "iface" }, "interface id"},
		"bad nic kind":      {func(s *DomainSpec) { s.NIC.Kind = "macvtap" }, "NIC kind"},
		"user nic + bridge": {func(s *DomainSpec) { s.NIC.Kind = NICUser }, "user-mode NIC"},
		"bad hostdev":       {func(s *DomainSpec) { s.Hostdevs = []string{"18:00.0"} }, "PCI address"},
		"dup hostdev":       {func(s *DomainSpec) { s.Hostdevs = []string{"0000:18:00.0", "0000:18:00.0"} }, "twice"},
		"short pin set":     {func(s *DomainSpec) { s.CPUPins = s.CPUPins[:3] }, "3 CPU pins for 24 vCPUs"},
		"dup pin":           {func(s *DomainSpec) { s.CPUPins[1] = s.CPUPins[0] }, "pinned twice"},
		"negative pin":      {func(s *DomainSpec) { s.CPUPins[0] = -1 }, "CPU pin -1"},
		"bad numa node":     {func(s *DomainSpec) { s.NUMANodes = []int{64} }, "NUMA node 64"},
		"odd hugepage size": {func(s *DomainSpec) { s.HugepageKiB = 4096 }, "hugepage size 4096"},
		"partial hugepages": {func(s *DomainSpec) { s.MemoryMiB = 65537 }, "whole number"},
	} {
		t.Run(name, func(t *testing.T) {
			s := productionSpec()
			tc.mut(&s)
			_, err := Domain(s)
			require.ErrorContains(t, err, tc.want)
		})
	}
}
