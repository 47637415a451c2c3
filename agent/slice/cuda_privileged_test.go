package slice

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"libvirt.org/go/libvirtxml"

	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/hostops/vm"
	"github.com/gpuaas/gpuaas/images/guest"
	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/sched"
)

// cudaLabHost is labHost with a 2-GPU slice (slots 0 and 1 of j22u15: the
// H200s at 0000:18:00.0 and 0000:19:00.0, their NVMe identities resolving
// to two real loop devices) and the lab CUDA developer image.
func cudaLabHost(t *testing.T) (labConfig, []string) {
	t.Helper()
	cfg := labHost(t, false)
	root, err := hostops.NewRoot(cfg.Base)
	require.NoError(t, err)
	id, loop1 := bindDisk(t, root, "nvme1n1", filepath.Join(filepath.Dir(cfg.Base), "nvme1n1.img"), 64<<20)

	s0 := cfg.Request.Slots[0]
	ip := netip.MustParseAddr(s0.Capacity.PrivateIP).Next()
	mac, err := net.ParseMAC(s0.Capacity.ManagementMAC)
	require.NoError(t, err)
	mac[5] ^= 0x01
	s1 := proto.Slot{ID: "j22u15-s1", NodeID: "j22u15", Index: 1, Generation: 1, Capacity: proto.SlotCapacity{
		GPUPCIAddress: "0000:19:00.0", NVMe: id, ManagementMAC: mac.String(), PrivateIP: ip.String(), FabricVFPCIAddress: "0000:58:00.3"}}
	cfg.Request.Slots = append(cfg.Request.Slots, s1)
	cfg.Request.Plan.Devices = append(cfg.Request.Plan.Devices, sched.BundleDevice{SlotID: s1.ID, Index: 1, GPU: s1.Capacity.GPUPCIAddress,
		VF: s1.Capacity.FabricVFPCIAddress, MAC: mac.String(), IP: ip.String(), Disk: "/dev/nvme1n1", DiskDevice: "nvme1n1", CPUs: []int{1}})
	cfg.Request.Plan.VCPUs = []int{0, 1}

	cfg.Request.Image = guestImage(t, guest.VariantCUDA)
	require.Equal(t, "cuda", cfg.Request.Image.ReadinessCheck)
	return cfg, []string{cfg.Loop, loop1}
}

// dropFWCfg defines domains without the named fw_cfg entries: the guest
// is not told of those GPUs.
type dropFWCfg struct {
	Hypervisor
	names []string
}

func (d dropFWCfg) Define(ctx context.Context, x string) error {
	var dom libvirtxml.Domain
	if err := dom.Unmarshal(x); err != nil {
		return err
	}
	for i := range dom.SysInfo {
		if fw := dom.SysInfo[i].FWCfg; fw != nil {
			var keep []libvirtxml.DomainSysInfoEntry
			for _, e := range fw.Entry {
				if !slices.Contains(d.names, e.Name) {
					keep = append(keep, e)
				}
			}
			fw.Entry = keep
		}
	}
	out, err := dom.Marshal()
	if err != nil {
		return err
	}
	return d.Hypervisor.Define(ctx, out)
}

// TestPrivilegedSliceCUDA provisions a real 2-GPU slice of j22u15 with the
// lab CUDA developer image: the domain carries no GPU hostdevs (they are
// simulated) but one fw_cfg entry per planned GPU; the guest's nvidia-smi
// lists both H200s and the cuda readiness check's evidence names them by
// host bus id and UUID. Release wipes both disks.
func TestPrivilegedSliceCUDA(t *testing.T) {
	cfg, loops := cudaLabHost(t)
	realNetwork(t, cfg)
	p, err := buildRuntime(cfg, nil)
	require.NoError(t, err)
	defer p.close()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()

	start := time.Now()
	res, err := p.rt.Provision(ctx, cfg.Request, &recorder{})
	if err != nil || testing.Verbose() {
		logSerial(t, cfg)
	}
	require.NoError(t, err)
	t.Logf("2-GPU CUDA slice provisioned in %.1f s; stage durations (ms): %v", time.Since(start).Seconds(), res.Durations)
	require.Len(t, res.Slots, 2)
	ev := strings.Join(res.Slots[0].Evidence, "\n")
	t.Logf("evidence:\n%s", ev)
	var want []string
	for _, a := range []string{"0000:18:00.0", "0000:19:00.0"} {
		g, err := vm.LabGPU(p.root, "j22u15", a)
		require.NoError(t, err)
		want = append(want, fmt.Sprintf("NVIDIA H200 00000000:%s %s 143771 MiB", strings.ToUpper(a[5:]), g.UUID))
	}
	assert.Contains(t, ev, "ssh: nvidia-smi lists 2 GPUs as the plan says, driver 570.124.06: "+strings.Join(want, "; "))
	assert.Contains(t, ev, "marker sha256 "+cfg.Request.Image.MarkerSHA256+" matches the image")

	// libvirt's domain: no hostdev (the GPUs are simulated), one fw_cfg
	// entry per planned GPU, which the guest kernel shows byte for byte.
	dom, err := p.hv.lookup(res.Domain)
	require.NoError(t, err)
	x, err := dom.GetXMLDesc(0)
	require.NoError(t, dom.Free())
	require.NoError(t, err)
	var d libvirtxml.Domain
	require.NoError(t, d.Unmarshal(x))
	assert.Empty(t, d.Devices.Hostdevs)
	require.Len(t, d.SysInfo, 1)
	require.NotNil(t, d.SysInfo[0].FWCfg)
	entries := d.SysInfo[0].FWCfg.Entry
	require.Len(t, entries, 2)
	rec, _, err := p.journal.Get(cfg.Request.AllocationID)
	require.NoError(t, err)
	require.NotNil(t, rec.AgentKey)
	signer, err := rec.AgentKey.Signer()
	require.NoError(t, err)
	sshg := &SSHGuest{}
	ip := netip.MustParseAddr(res.Access.GuestIP)
	for i, e := range entries {
		assert.Equal(t, fmt.Sprintf("%s%d", vm.LabGPUPrefix, i), e.Name)
		out, err := sshg.Run(ctx, ip, signer, "cat /sys/firmware/qemu_fw_cfg/by_name/"+e.Name+"/raw")
		require.NoError(t, err)
		assert.Equal(t, e.Value, out, "the guest reads entry %s as the host wrote it", e.Name)
	}
	// The guest answers the real tool's other forms too.
	out, err := sshg.Run(ctx, ip, signer, "nvidia-smi -L")
	require.NoError(t, err)
	assert.Equal(t, 2, strings.Count(out, ": NVIDIA H200 (UUID: GPU-"), out)
	sshg.Forget(ip)

	rel, err := p.rt.Release(ctx, ReleaseRequest{AllocationID: cfg.Request.AllocationID}, &recorder{})
	require.NoError(t, err)
	require.Len(t, rel.Slots, 2)
	for i, s := range rel.Slots {
		require.NotNil(t, s.Proof, s.Error)
		assertZero(t, loops[i])
	}
}

// TestPrivilegedSliceCUDAMissingGPU boots the same 2-GPU CUDA slice but
// the domain is defined without gpu1's fw_cfg entry: the guest's
// nvidia-smi lists one GPU, the cuda readiness check fails on the count,
// the provision fails at ssh_ready with both slots reported touched, and
// the VM is gone.
func TestPrivilegedSliceCUDAMissingGPU(t *testing.T) {
	cfg, _ := cudaLabHost(t)
	realNetwork(t, cfg)
	p, err := buildRuntime(cfg, nil, func(_ *Options, d *Deps) {
		d.Hypervisor = dropFWCfg{Hypervisor: d.Hypervisor, names: []string{vm.LabGPUPrefix + "1"}}
	})
	require.NoError(t, err)
	defer p.close()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	res, err := p.rt.Provision(ctx, cfg.Request, &recorder{})
	require.Error(t, err)
	t.Logf("provision failed as it must: %v", err)
	assert.ErrorContains(t, err, "readiness check cuda: nvidia-smi lists 1 GPUs, the slice has 2")
	assert.Equal(t, proto.StageSSHReady, res.FailedStage)
	assert.Equal(t, []string{"j22u15-s0", "j22u15-s1"}, res.TouchedSlots)
	assert.Nil(t, res.Access)
	s, err := p.hv.State(ctx, DomainName(cfg.Request.AllocationID))
	require.NoError(t, err)
	assert.Equal(t, DomainAbsent, s, "the VM is destroyed")
	ports, err := p.sw.PortsByAllocation(ctx, cfg.Request.AllocationID)
	require.NoError(t, err)
	assert.Empty(t, ports)
}
