package vm

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/lab/hostsim"
	"github.com/gpuaas/gpuaas/test/testenv"
)

// cudaSpec is productionSpec with its GPU's identity, as the agent gives
// it in the lab.
func cudaSpec(t *testing.T) DomainSpec {
	t.Helper()
	s := productionSpec()
	g, err := LabGPU(hostops.Root{}, "j22u15", "0000:18:00.0")
	require.NoError(t, err)
	s.GPUs = []GPU{g}
	return s
}

func TestLabGPU(t *testing.T) {
	t.Parallel()
	root, err := hostsim.Generate(filepath.Join(t.TempDir(), "host"), "j22u15")
	require.NoError(t, err)
	g, err := LabGPU(root, "j22u15", "0000:18:00.0")
	require.NoError(t, err)
	assert.Equal(t, "NVIDIA H200", g.Model, "10de:2335 in the simulated host tree")
	assert.Equal(t, 143771, g.MemoryMiB)
	assert.Regexp(t, `^GPU-[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`, g.UUID)
	again, err := LabGPU(root, "j22u15", "0000:18:00.0")
	require.NoError(t, err)
	assert.Equal(t, g, again, "the same GPU always has the same UUID")
	other, err := LabGPU(root, "j22u11", "0000:18:00.0")
	require.NoError(t, err)
	assert.NotEqual(t, g.UUID, other.UUID, "another host's GPU at the same address")
	noRoot, err := LabGPU(hostops.Root{}, "j22u15", "0000:18:00.0")
	require.NoError(t, err)
	assert.Equal(t, g, noRoot, "without a host tree: the lab's H200")

	_, err = LabGPU(root, "j22u15", "0000:58:00.0") // a ConnectX-7 PF
	assert.ErrorContains(t, err, "is not a GPU model the lab knows")
	_, err = LabGPU(root, "j22u15", "0000:99:00.0")
	assert.ErrorContains(t, err, "0000:99:00.0")
	_, err = LabGPU(root, "j22u15", "../../etc")
	assert.Error(t, err)
	_, err = LabGPU(root, "../x", "0000:18:00.0")
	assert.Error(t, err)
}

// TestLabSizedAnnouncesGPUs: the lab domain drops the GPU hostdevs and
// carries one fw_cfg entry per GPU; the production domain is unchanged by
// the GPUs' identity.
func TestLabSizedAnnouncesGPUs(t *testing.T) {
	t.Parallel()
	s := cudaSpec(t)
	prod, err := XML(s)
	require.NoError(t, err)
	plain, err := XML(productionSpec())
	require.NoError(t, err)
	assert.Empty(t, cmp.Diff(plain, prod), "GPU identity does not change the production domain")
	assert.NotContains(t, prod, "sysinfo")

	l := LabSized(s)
	assert.Empty(t, l.Hostdevs)
	require.Len(t, l.FWCfg, 1)
	assert.Equal(t, FWCfg{Name: "opt/gpuaas/gpu0", Value: "name=NVIDIA H200\npci.bus_id=00000000:18:00.0\nuuid=" + s.GPUs[0].UUID + "\nmemory.total=143771 MiB\n"}, l.FWCfg[0])
	assert.Nil(t, s.FWCfg, "LabSized must not modify its argument")
	l.NIC = NIC{Kind: NICUser, MAC: "52:54:00:22:15:01"}
	l.BootDisk = "/dev/loop7"
	x, err := XML(l)
	require.NoError(t, err)
	golden(t, "lab-cuda.xml", x)
	assert.Contains(t, x, `<sysinfo type="fwcfg">`)
	assert.Contains(t, x, `<entry name="opt/gpuaas/gpu0">name=NVIDIA H200&#xA;pci.bus_id=00000000:18:00.0&#xA;`)

	// Two GPUs: entries numbered by position.
	s2 := productionSpec()
	s2.Hostdevs = []string{"0000:18:00.0", "0000:58:00.2", "0000:2a:00.0", "0000:58:00.3"}
	for _, a := range []string{"0000:18:00.0", "0000:2a:00.0"} {
		g, err := LabGPU(hostops.Root{}, "j22u15", a)
		require.NoError(t, err)
		s2.GPUs = append(s2.GPUs, g)
	}
	l2 := LabSized(s2)
	require.Len(t, l2.FWCfg, 2)
	assert.Equal(t, "opt/gpuaas/gpu1", l2.FWCfg[1].Name)
	assert.Contains(t, l2.FWCfg[1].Value, "pci.bus_id=00000000:2A:00.0\n")
}

// TestLabCUDADomainValidates runs virt-xml-validate on the lab domain
// with fw_cfg entries.
func TestLabCUDADomainValidates(t *testing.T) {
	testenv.Commands(t, "virt-xml-validate", "xmllint")
	t.Parallel()
	l := LabSized(cudaSpec(t))
	x, err := XML(l)
	require.NoError(t, err)
	p := filepath.Join(t.TempDir(), "lab-cuda.xml")
	require.NoError(t, os.WriteFile(p, []byte(x), 0o644))
	out, err := exec.Command("virt-xml-validate", p, "domain").CombinedOutput()
	require.NoError(t, err, "virt-xml-validate: %s\n%s", out, x)
}

func TestValidateGPUsAndFWCfg(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		mut  func(*DomainSpec)
		want string
	}{
		"gpu not a hostdev": {func(s *DomainSpec) { s.GPUs[0].Addr = "0000:2a:00.0" }, "not among the hostdevs"},
		"gpu bad address":   {func(s *DomainSpec) { s.GPUs[0].Addr = "18:00.0" }, "PCI address"},
		"gpu bad model":     {func(s *DomainSpec) { s.GPUs[0].Model = "H200\nuuid=x" }, "model"},
		"gpu bad uuid":      {func(s *DomainSpec) { s.GPUs[0].UUID = "GPU-1" }, "uuid"},
		"gpu no memory":     {func(s *DomainSpec) { s.GPUs[0].MemoryMiB = 0 }, "memory"},
		"fwcfg not opt":     {func(s *DomainSpec) { s.FWCfg = []FWCfg{{Name: "etc/gpu0", Value: "x"}} }, "fw_cfg name"},
		"fwcfg traversal":   {func(s *DomainSpec) { s.FWCfg = []FWCfg{{Name: "opt/gpuaas/../x", Value: "x"}} }, "fw_cfg name"},
		"fwcfg reserved":    {func(s *DomainSpec) { s.FWCfg = []FWCfg{{Name: "opt/ovmf/x", Value: "x"}} }, "reserved"},
		"fwcfg too long":    {func(s *DomainSpec) { s.FWCfg = []FWCfg{{Name: "opt/gpuaas/" + strings.Repeat("a", 45), Value: "x"}} }, "at most 55"},
		"fwcfg control":     {func(s *DomainSpec) { s.FWCfg = []FWCfg{{Name: "opt/gpuaas/x", Value: "a\x00b"}} }, "printable"},
		"fwcfg huge":        {func(s *DomainSpec) { s.FWCfg = []FWCfg{{Name: "opt/gpuaas/x", Value: strings.Repeat("a", 4097)}} }, "4096"},
		"fwcfg twice": {func(s *DomainSpec) {
			s.FWCfg = []FWCfg{{Name: "opt/gpuaas/x", Value: "a"}, {Name: "opt/gpuaas/x", Value: "b"}}
		}, "twice"},
	} {
		t.Run(name, func(t *testing.T) {
			s := cudaSpec(t)
			tc.mut(&s)
			_, err := Domain(s)
			require.ErrorContains(t, err, tc.want)
		})
	}
}
