package slice

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"libvirt.org/go/libvirtxml"

	"github.com/gpuaas/gpuaas/hostops/disk"
	"github.com/gpuaas/gpuaas/sched"
	"github.com/gpuaas/gpuaas/test/testenv"
)

// TestDomainXML checks the production and lab domains the runtime
// defines, and validates both against libvirt's RelaxNG schema.
func TestDomainXML(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	req := testRequest(t)
	req.Plan.Hugepages = []sched.HugepageNeed{{NUMANode: 0, Pages: 4, SizeKiB: 1 << 20}}
	devs := map[string]disk.Device{"j22u15-s0": {Path: "/dev/nvme0n1"}, "j22u15-s1": {Path: "/dev/nvme1n1"}}
	prod, err := e.rt.DomainXML(req, devs, "/var/lib/gpuaas/vms/alloc-1/seed.iso", "/var/lib/gpuaas/vms/alloc-1/OVMF_VARS.fd")
	require.NoError(t, err)
	var d libvirtxml.Domain
	require.NoError(t, d.Unmarshal(prod))
	assert.Equal(t, "kvm", d.Type)
	assert.Equal(t, uint(4), d.VCPU.Value)
	assert.Equal(t, "gpuaas-owner=j22u15 gpuaas-allocation=alloc-1", d.Description)
	require.NotNil(t, d.MemoryBacking)
	assert.Equal(t, uint(1<<20), d.MemoryBacking.MemoryHugePages.Hugepages[0].Size)
	assert.Equal(t, "strict", d.NUMATune.Memory.Mode)
	assert.Equal(t, "5", d.CPUTune.VCPUPin[3].CPUSet)
	assert.Len(t, d.Devices.Hostdevs, 4)
	assert.Equal(t, "/dev/nvme1n1", d.Devices.Disks[2].Source.Block.Dev)
	assert.NotContains(t, prod, "<graphics")
	assert.NotContains(t, prod, "<kernel")

	e.opts.LabSized, e.opts.ChecksumOffloadOff, e.opts.Hypervisor = true, true, "qemu"
	lab, err := e.newRuntime(t).DomainXML(req, devs, "/tmp/seed.iso", "/tmp/OVMF_VARS.fd")
	require.NoError(t, err)
	d = libvirtxml.Domain{}
	require.NoError(t, d.Unmarshal(lab))
	assert.Equal(t, "qemu", d.Type)
	assert.Equal(t, uint(1), d.VCPU.Value)
	assert.Nil(t, d.MemoryBacking, "no hugepages in the lab")
	assert.Nil(t, d.CPUTune)
	assert.Empty(t, d.Devices.Hostdevs)
	assert.Equal(t, "off", d.Devices.Interfaces[0].Driver.Host.CSum)
	assert.Equal(t, "off", d.Devices.Interfaces[0].Driver.Guest.CSum)

	testenv.Commands(t, "virt-xml-validate", "xmllint")
	dir := t.TempDir()
	for name, x := range map[string]string{"production": prod, "lab": lab} {
		p := filepath.Join(dir, name+".xml")
		require.NoError(t, os.WriteFile(p, []byte(x), 0o644))
		out, err := exec.Command("virt-xml-validate", p, "domain").CombinedOutput()
		require.NoError(t, err, "%s domain: %s\n%s", name, out, x)
		assert.True(t, strings.Contains(string(out), "validates"), string(out))
	}
}
