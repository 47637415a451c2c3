package slice

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/gpuaas/gpuaas/agent/discovery"
	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/hostops/command"
	"github.com/gpuaas/gpuaas/hostops/dhcp"
	"github.com/gpuaas/gpuaas/hostops/disk"
	"github.com/gpuaas/gpuaas/hostops/nat"
	"github.com/gpuaas/gpuaas/hostops/ovs"
	"github.com/gpuaas/gpuaas/hostops/vm"
	"github.com/gpuaas/gpuaas/images/guest"
	"github.com/gpuaas/gpuaas/lab/hostsim"
	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/sched"
	"github.com/gpuaas/gpuaas/test/libvirttest"
	"github.com/gpuaas/gpuaas/test/testenv"
)

// labConfig is everything a real runtime on the lab host needs; the crash
// test hands it to a child process as JSON.
type labConfig struct {
	Base       string // hostsim root base
	Loop       string // real loop device behind slot 0's NVMe identity
	Bridge     string
	Gateway    string
	DHCPDir    string
	NATTable   string
	JournalDir string
	StateDir   string
	SerialDir  string
	Owner      string
	KeyFile    string
	Request    ProvisionRequest
}

// labHost makes a j22u15 simulated host whose slot-0 NVMe identity
// resolves to a real loop device, and a request for a 1-GPU slice on it
// with the lab guest image (built and cached by images/guest).
func labHost(t *testing.T, withGuest bool) labConfig {
	t.Helper()
	testenv.Root(t)
	testenv.Commands(t, "losetup", "dnsmasq", "nft")
	dir := vmDir(t)
	var cfg labConfig
	cfg.Base = filepath.Join(dir, "host")
	root, err := hostsim.Generate(cfg.Base, "j22u15")
	require.NoError(t, err)
	var id proto.DiskIdentity
	id, cfg.Loop = bindDisk(t, root, "nvme0n1", filepath.Join(dir, "nvme0n1.img"), 128<<20)

	suffix := randHex(t, 3)
	cfg.Bridge = "gst" + suffix
	var b [2]byte
	_, err = rand.Read(b[:])
	require.NoError(t, err)
	cfg.Gateway = fmt.Sprintf("10.%d.%d.1/24", 100+int(b[0])%100, int(b[1]))
	cfg.DHCPDir = filepath.Join(dir, "dhcp")
	cfg.NATTable = "gpuaas_t" + suffix
	cfg.JournalDir = filepath.Join(dir, "state")
	cfg.StateDir = filepath.Join(dir, "vms")
	cfg.SerialDir = filepath.Join(dir, "serial")
	cfg.Owner = "j22u15-t" + suffix
	cfg.KeyFile = filepath.Join(dir, "id_ed25519")
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	block, err := ssh.MarshalPrivateKey(priv, "test")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(cfg.KeyFile, pem.EncodeToMemory(block), 0o600))

	gw := netip.MustParsePrefix(cfg.Gateway)
	ip := gw.Addr().Next().Next().Next().Next().Next().Next().Next().Next().Next() // .10
	mac := fmt.Sprintf("52:54:00:%s:%s:%s", suffix[0:2], suffix[2:4], suffix[4:6])
	slot := proto.Slot{ID: "j22u15-s0", NodeID: "j22u15", Index: 0, Generation: 1, Capacity: proto.SlotCapacity{
		GPUPCIAddress: "0000:18:00.0", NVMe: id, ManagementMAC: mac, PrivateIP: ip.String(), FabricVFPCIAddress: "0000:58:00.2"}}
	plan := sched.BundlePlan{NodeID: "j22u15", Bridge: cfg.Bridge, NUMANodes: []int{0}, VCPUs: []int{0}, MemoryMiB: 512,
		Devices: []sched.BundleDevice{{SlotID: slot.ID, GPU: slot.Capacity.GPUPCIAddress, VF: slot.Capacity.FabricVFPCIAddress,
			MAC: mac, IP: ip.String(), Disk: "/dev/nvme0n1", DiskDevice: "nvme0n1", CPUs: []int{0}}}}
	cfg.Request = ProvisionRequest{AllocationID: "alloc-" + suffix, Plan: plan, Slots: []proto.Slot{slot},
		SSHKeys: []string{authorizedKey(t, "tenant")}}
	if withGuest {
		cfg.Request.Image = guestImage(t, guest.VariantBase)
	}
	return cfg
}

// bindDisk resolves the simulated NVMe disk name of root to a fresh loop
// device over backing (size bytes) and returns its identity and device.
func bindDisk(t *testing.T, root hostops.Root, name, backing string, size int64) (proto.DiskIdentity, string) {
	t.Helper()
	hw, err := discovery.ReadHardware(root)
	require.NoError(t, err)
	var id proto.DiskIdentity
	for _, d := range hw.Disks {
		if d.Name == name {
			id = proto.DiskIdentity{Serial: d.Serial, WWN: d.WWN, EUI: d.EUI, Device: d.Name}
		}
	}
	require.False(t, id.Empty(), "the simulated host has %s", name)
	loop := attachLoop(t, backing, size)
	require.NoError(t, hostsim.BindBlockDevice(root, name, loop))
	return id, loop
}

// guestImage builds (or takes from the cache) the lab guest variant and
// returns its catalog reference as a local file.
func guestImage(t *testing.T, variant string) proto.ImageRef {
	t.Helper()
	testenv.Commands(t, "qemu-img", "go", "objcopy", "sgdisk", "mkfs.vfat", "mmd", "mcopy")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	m, img, err := guest.Image(ctx, guest.Options{Variant: variant})
	require.NoError(t, err)
	return proto.ImageRef{Name: m.Name, Version: m.Version, Kind: m.CatalogKind, Digest: "sha256:" + m.SHA256,
		Size: m.Size, URL: "file://" + img, MarkerSHA256: m.MarkerSHA256, ReadinessCheck: m.ReadinessCheck}
}

// realParts are the real host parts of a runtime built from a labConfig.
type realParts struct {
	rt      *Runtime
	journal *Journal
	server  *dhcp.Server
	dhcp    *DNSMasq
	hv      *Libvirt
	sw      *ovs.Switch
	nat     *nat.NAT
	root    hostops.Root
}

func buildRuntime(cfg labConfig, fp *Failpoints, mods ...func(*Options, *Deps)) (*realParts, error) {
	root, err := hostops.NewRoot(cfg.Base)
	if err != nil {
		return nil, err
	}
	gw := netip.MustParsePrefix(cfg.Gateway)
	sw, err := ovs.New(ovs.Options{Bridge: cfg.Bridge, DatapathType: "netdev", Gateway: gw, RunDir: libvirttest.OVSRunDir})
	if err != nil {
		return nil, err
	}
	n, err := nat.New(nat.Config{Table: cfg.NATTable, Bridge: cfg.Bridge, Uplink: "lo", Subnet: gw.Masked()})
	if err != nil {
		return nil, err
	}
	signer, _, err := LoadSSHKey(cfg.KeyFile)
	if err != nil {
		return nil, err
	}
	j, err := OpenJournal(cfg.JournalDir)
	if err != nil {
		return nil, err
	}
	p := &realParts{journal: j, server: &dhcp.Server{Dir: cfg.DHCPDir, Interface: cfg.Bridge, Gateway: gw},
		hv: &Libvirt{URI: libvirttest.URI}, sw: sw, nat: n, root: root}
	p.dhcp = &DNSMasq{Server: p.server}
	opts := Options{Owner: cfg.Owner, Gateway: gw, Bridge: cfg.Bridge, StateDir: cfg.StateDir, SerialDir: cfg.SerialDir,
		Hypervisor: vm.TCG, LabSized: true, ChecksumOffloadOff: true, JumpHost: "j22u15.lab",
		LeaseTimeout: 180 * time.Second, SSHTimeout: 120 * time.Second, ShutdownTimeout: 3 * time.Second, PollInterval: 200 * time.Millisecond,
	}
	deps := Deps{Root: root, Images: &FileSource{}, Disks: HostDisks{Root: root, Digests: disk.NewDigestCache()}, Hypervisor: p.hv,
		Switch: sw, DHCP: p.dhcp, NAT: n, Guest: &SSHGuest{}, AgentKey: signer, Journal: j, Failpoints: fp}
	for _, m := range mods {
		m(&opts, &deps)
	}
	p.rt, err = New(opts, deps)
	if err != nil {
		j.Close()
		return nil, err
	}
	return p, nil
}

func (p *realParts) close() {
	p.hv.Close()
	p.journal.Close()
}

// realNetwork creates the test's bridge on the shared userspace OVS (with
// libvirtd started with its OVS_RUNDIR) and the NAT table, removed with
// every domain, port and daemon the test left in t.Cleanup.
func realNetwork(t *testing.T, cfg labConfig) {
	t.Helper()
	libvirttest.SharedOVS(t)
	libvirttest.Connect(t)
	for _, f := range []string{"/usr/share/OVMF/OVMF_CODE_4M.fd", "/usr/share/OVMF/OVMF_VARS_4M.fd"} {
		if _, err := os.Stat(f); err != nil {
			testenv.Missing(t, "OVMF (package ovmf)", err.Error())
		}
	}
	p, err := buildRuntime(cfg, nil)
	require.NoError(t, err)
	defer p.close()
	ctx := context.Background()
	t.Cleanup(func() {
		// Whatever the test left: the domain, dnsmasq (started by this
		// process or by a crashed child), the bridge, the NAT table.
		hv := &Libvirt{URI: libvirttest.URI}
		defer hv.Close()
		name := DomainName(cfg.Request.AllocationID)
		if s, err := hv.State(ctx, name); err == nil && s != DomainAbsent {
			if t.Failed() {
				logSerial(t, cfg)
			}
			_ = hv.Destroy(ctx, name)
			_ = hv.Undefine(ctx, name)
		}
		srv := &dhcp.Server{Dir: cfg.DHCPDir, Interface: cfg.Bridge, Gateway: netip.MustParsePrefix(cfg.Gateway)}
		if pid, ok := srv.Running(); ok {
			_ = syscall.Kill(pid, syscall.SIGTERM)
		}
		if _, err := libvirttest.OVSRunner().Run(ctx, command.Cmd{Name: "ovs-vsctl", Args: []string{"--timeout=10", "--if-exists", "del-br", cfg.Bridge}}); err != nil {
			t.Errorf("delete bridge %s: %v", cfg.Bridge, err)
		}
		n, _ := nat.New(nat.Config{Table: cfg.NATTable, Bridge: cfg.Bridge, Uplink: "lo", Subnet: netip.MustParsePrefix(cfg.Gateway).Masked()})
		if err := n.Delete(ctx); err != nil {
			t.Errorf("delete NAT table: %v", err)
		}
	})
	require.NoError(t, p.sw.EnsureBridge(ctx))
	require.NoError(t, p.nat.Ensure(ctx))
}

// TestPrivilegedSliceProvisionRelease provisions a real 1-GPU slice of
// j22u15: the lab guest image is verified and cloned onto the loop device
// behind slot 0's NVMe identity, the seed made, the domain defined on
// libvirt (TCG, UEFI, boot from the disk) with its vNIC on a userspace OVS
// bridge; the guest gets its reserved address from a real dnsmasq and SSH
// proves the marker's digest and the seed's instance-id. Reconcile removes
// real orphans (a DHCP reservation and NAT entry of a gone allocation)
// and keeps the live slice. Release stops and undefines the VM, removes
// its port, reservation and NAT, and wipes the disk with a verified proof.
func TestPrivilegedSliceProvisionRelease(t *testing.T) {
	cfg := labHost(t, true)
	realNetwork(t, cfg)
	p, err := buildRuntime(cfg, nil)
	require.NoError(t, err)
	defer p.close()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	alloc := cfg.Request.AllocationID

	rep := &recorder{}
	start := time.Now()
	res, err := p.rt.Provision(ctx, cfg.Request, rep)
	if err != nil || testing.Verbose() {
		logSerial(t, cfg)
	}
	require.NoError(t, err, "events: %v", rep.events)
	t.Logf("provisioned in %.1f s; stage durations (ms): %v", time.Since(start).Seconds(), res.Durations)
	assert.Empty(t, res.FailedStage)
	assert.Equal(t, cfg.Request.Slots[0].Capacity.PrivateIP, res.Access.GuestIP)
	ev := strings.Join(res.Slots[0].Evidence, "\n")
	assert.Contains(t, ev, "marker sha256 "+cfg.Request.Image.MarkerSHA256+" matches the image")
	assert.Contains(t, ev, "holds "+res.Access.GuestIP)
	rec, _, err := p.journal.Get(alloc)
	require.NoError(t, err)
	assert.Contains(t, ev, "instance-id "+rec.InstanceID+" from the seed")
	assert.Contains(t, rep.progress, fmt.Sprintf("clone %d/%d", 128<<20, 128<<20))

	// The real objects: dnsmasq's lease, the tagged OVS port, the NAT entry.
	leases, err := p.server.Leases()
	require.NoError(t, err)
	require.NotEmpty(t, leases)
	assert.Equal(t, cfg.Request.Slots[0].Capacity.ManagementMAC, leases[0].MAC.String())
	ports, err := p.sw.PortsByAllocation(ctx, alloc)
	require.NoError(t, err)
	require.Len(t, ports, 1)
	assert.Equal(t, TapName(alloc), ports[0].Name)
	guests, err := p.nat.Guests(ctx)
	require.NoError(t, err)
	assert.Equal(t, []nat.Guest{{AllocationID: alloc, IP: netip.MustParseAddr(res.Access.GuestIP)}}, guests)

	// Real orphans of a gone allocation go; the live slice stays.
	ghostIP := netip.MustParsePrefix(cfg.Gateway).Addr().Next().Next()
	require.NoError(t, p.dhcp.Reserve(ctx, dhcp.Reservation{AllocationID: "ghost", MAC: net.HardwareAddr{0x52, 0x54, 0, 0xee, 0xee, 0xee}, IP: ghostIP}))
	require.NoError(t, p.nat.Apply(ctx, nat.Guest{AllocationID: "ghost", IP: ghostIP}))
	// Flows lost (as when ovs-vswitchd restarts) are re-installed.
	cookie := fmt.Sprintf("cookie=%#x/-1", ovs.AllocationCookie(alloc))
	ofctl := func(args ...string) string {
		out, err := libvirttest.OVSRunner().Run(ctx, command.Cmd{Name: "ovs-ofctl", Args: args})
		require.NoError(t, err)
		return string(out)
	}
	ofctl("del-flows", cfg.Bridge, cookie)
	require.NotContains(t, ofctl("dump-flows", cfg.Bridge, cookie), "priority=")
	r, err := p.rt.Reconcile(ctx, []string{alloc})
	require.NoError(t, err)
	assert.Contains(t, ofctl("dump-flows", cfg.Bridge, cookie), "priority=")
	assert.Equal(t, []string{"ghost"}, r.Reservations)
	assert.Equal(t, []string{"ghost"}, r.NAT)
	assert.Empty(t, r.Domains)
	// The reconcile probe logged in to the real guest with the
	// allocation's key: healthy, with its evidence, no drift.
	assert.Empty(t, r.Drift)
	guestIP := netip.MustParseAddr(res.Access.GuestIP)
	requireHealthy(t, r, alloc, rec.InstanceID)
	assertUntouched(t, p, cfg, res.Domain, ports[0])

	// The guest answers the allocation's own key, and refuses another
	// allocation's key and the agent-wide key (not in its seed).
	require.NotNil(t, rec.AgentKey)
	assert.True(t, strings.HasSuffix(rec.AgentKey.Public, " gpuaas-agent "+alloc), rec.AgentKey.Public)
	st, err := os.Stat(filepath.Join(cfg.JournalDir, JournalFile))
	require.NoError(t, err)
	assert.Equal(t, JournalMode, st.Mode().Perm(), "the journal holds private keys")
	own, err := rec.AgentKey.Signer()
	require.NoError(t, err)
	g := &SSHGuest{}
	out, err := g.Run(ctx, guestIP, own, "cat /run/gpuaas/instance-id")
	require.NoError(t, err, "the allocation's key logs in")
	assert.Equal(t, rec.InstanceID, strings.TrimSpace(out))
	// The tenant gets the host key the readiness gate saw: the one the
	// guest presents.
	require.Len(t, res.Access.HostKeys, 1, "the access pins the guest's host key")
	seen, ok := g.HostKey(guestIP)
	require.True(t, ok)
	assert.Equal(t, strings.TrimSpace(string(ssh.MarshalAuthorizedKey(seen))), res.Access.HostKeys[0])
	otherKey, err := NewAgentKey("alloc-other", "j22u15-s0@2", time.Now())
	require.NoError(t, err)
	other, err := otherKey.Signer()
	require.NoError(t, err)
	agentWide, _, err := LoadSSHKey(cfg.KeyFile)
	require.NoError(t, err)
	for name, k := range map[string]ssh.Signer{"another allocation's key": other, "the agent-wide key": agentWide} {
		_, err := (&SSHGuest{Timeout: 30 * time.Second}).Run(ctx, guestIP, k, "cat /run/gpuaas/instance-id")
		require.Error(t, err, name)
		assert.ErrorContains(t, err, "unable to authenticate", name)
	}

	// The guest becomes unreachable for real: a flow drops everything on
	// its OVS port (a foreign cookie, so the switch reconcile keeps it).
	// Reconcile reports the drift and leaves the slice alone.
	const dropCookie = 0x7e57
	ofctl("add-flow", cfg.Bridge, fmt.Sprintf("cookie=%#x,priority=1000,in_port=%d,actions=drop", dropCookie, ports[0].OFPort))
	ofctl("add-flow", cfg.Bridge, fmt.Sprintf("cookie=%#x,priority=1000,dl_dst=%s,actions=drop", dropCookie, res.Access.GuestMAC))
	start = time.Now()
	r, err = p.rt.Reconcile(ctx, []string{alloc})
	require.NoError(t, err)
	t.Logf("reconcile of an unreachable guest took %.1f s: drift %q", time.Since(start).Seconds(), r.Drift)
	require.Len(t, r.Drift, 1)
	assert.Contains(t, r.Drift[0], "allocation "+alloc+": guest "+res.Access.GuestIP+" unreachable")
	require.Len(t, r.Guests, 1)
	assert.Equal(t, GuestUnreachable, r.Guests[0].State)
	assert.False(t, r.Guests[0].Reachable)
	assert.Equal(t, KeyAllocation, r.Guests[0].Key)
	assert.Empty(t, r.TornDown)
	assert.Empty(t, r.Released)
	assert.Empty(t, r.Domains)
	assert.Empty(t, r.Ports)
	assertUntouched(t, p, cfg, res.Domain, ports[0])
	assert.Contains(t, ofctl("dump-flows", cfg.Bridge, fmt.Sprintf("cookie=%#x/-1", dropCookie)), "actions=drop", "the operator's flow stays")

	// Restored: the next reconcile converges clean.
	ofctl("del-flows", cfg.Bridge, fmt.Sprintf("cookie=%#x/-1", dropCookie))
	r, err = p.rt.Reconcile(ctx, []string{alloc})
	require.NoError(t, err)
	assert.Empty(t, r.Drift)
	requireHealthy(t, r, alloc, rec.InstanceID)
	assertUntouched(t, p, cfg, res.Domain, ports[0])

	rep = &recorder{}
	start = time.Now()
	rel, err := p.rt.Release(ctx, ReleaseRequest{AllocationID: alloc}, rep)
	require.NoError(t, err)
	t.Logf("released in %.1f s; stage durations (ms): %v", time.Since(start).Seconds(), rel.Durations)
	require.Len(t, rel.Slots, 1)
	require.NotNil(t, rel.Slots[0].Proof, rel.Slots[0].Error)
	assert.Equal(t, "blkdiscard", rel.Slots[0].Proof.Method)
	assert.Equal(t, uint64(128<<20), rel.Slots[0].Proof.Bytes)
	s, err := p.hv.State(ctx, res.Domain)
	require.NoError(t, err)
	assert.Equal(t, DomainAbsent, s)
	ports, err = p.sw.PortsByAllocation(ctx, alloc)
	require.NoError(t, err)
	assert.Empty(t, ports)
	res2, err := p.dhcp.Reservations()
	require.NoError(t, err)
	assert.Empty(t, res2)
	guests, err = p.nat.Guests(ctx)
	require.NoError(t, err)
	assert.Empty(t, guests)
	assertZero(t, cfg.Loop)
	rec, _, err = p.journal.Get(alloc)
	require.NoError(t, err)
	assert.Nil(t, rec.AgentKey, "the allocation's key is destroyed with the slice")
}

// requireHealthy checks that Reconcile probed alloc's real guest with the
// allocation's key and found it answering as the seed's instance.
func requireHealthy(t *testing.T, r Reconciliation, alloc, instanceID string) {
	t.Helper()
	require.Len(t, r.Guests, 1, "%+v", r)
	g := r.Guests[0]
	assert.Equal(t, alloc, g.AllocationID)
	assert.Equal(t, GuestHealthy, g.State, g.Evidence)
	assert.True(t, g.Reachable)
	assert.True(t, g.InstanceIDMatch)
	assert.Equal(t, instanceID, g.InstanceID)
	assert.Equal(t, KeyAllocation, g.Key)
	assert.Contains(t, g.Evidence, "instance-id "+instanceID+" matches the seed")
	assert.Empty(t, r.TornDown)
	assert.Empty(t, r.Released)
	assert.Empty(t, r.Wiped)
}

// assertUntouched checks that the live slice's domain still runs, its OVS
// port is the same, its record is active with its key, and its disk still
// holds the cloned image (the GPT header).
func assertUntouched(t *testing.T, p *realParts, cfg labConfig, domain string, port ovs.Port) {
	t.Helper()
	ctx := context.Background()
	alloc := cfg.Request.AllocationID
	s, err := p.hv.State(ctx, domain)
	require.NoError(t, err)
	assert.Equal(t, DomainRunning, s)
	ports, err := p.sw.PortsByAllocation(ctx, alloc)
	require.NoError(t, err)
	require.Len(t, ports, 1)
	assert.Equal(t, port.Name, ports[0].Name)
	assert.Equal(t, port.OFPort, ports[0].OFPort)
	rec, _, err := p.journal.Get(alloc)
	require.NoError(t, err)
	assert.Equal(t, PhaseActive, rec.Phase)
	assert.NotNil(t, rec.AgentKey)
	assert.Nil(t, rec.Slots[0].Proof, "not wiped")
	f, err := os.Open(cfg.Loop)
	require.NoError(t, err)
	defer f.Close()
	hdr := make([]byte, 8)
	_, err = f.ReadAt(hdr, 512)
	require.NoError(t, err)
	assert.Equal(t, "EFI PART", string(hdr), "the disk still holds the image")
}

// TestPrivilegedSliceRefusals proves on the real loop device that a bad
// image digest and a mounted disk are refused before a byte is written.
func TestPrivilegedSliceRefusals(t *testing.T) {
	cfg := labHost(t, false)
	img := filepath.Join(t.TempDir(), "disk.raw")
	require.NoError(t, os.WriteFile(img, bytes.Repeat([]byte{0xa5}, 1<<20), 0o644))
	cfg.Request.Image = proto.ImageRef{Name: "bad", Version: "1", URL: "file://" + img, Digest: "sha256:" + strings.Repeat("0", 64)}
	ctx := context.Background()

	// The fakes stand for the network parts: these failures never reach them.
	e := newEnv(t)
	run := func() (proto.SliceProvisionResult, error) {
		root, err := hostops.NewRoot(cfg.Base)
		require.NoError(t, err)
		rt, err := New(e.opts, Deps{Root: root, Images: &FileSource{}, Disks: HostDisks{Root: root}, Hypervisor: e.hv, Switch: e.sw,
			DHCP: e.dh, NAT: e.nat, Guest: e.guest, Journal: e.journal})
		require.NoError(t, err)
		req := cfg.Request
		req.Plan.Devices[0].IP = "10.200.0.10"
		return rt.Provision(ctx, req, nil)
	}
	res, err := run()
	var de *DigestError
	require.ErrorAs(t, err, &de)
	assert.Equal(t, proto.StageImage, res.FailedStage)
	assert.Empty(t, res.TouchedSlots)
	assertZero(t, cfg.Loop)

	// Good digest, but the disk is mounted (the simulated mount table).
	h, err := hashFile(ctx, img, 1<<20, nil)
	require.NoError(t, err)
	cfg.Request.Image.Digest = "sha256:" + h
	root, err := hostops.NewRoot(cfg.Base)
	require.NoError(t, err)
	require.NoError(t, hostsim.MountDisk(root, "nvme0n1", "/srv/share"))
	res, err = run()
	var me *disk.MountedError
	require.ErrorAs(t, err, &me)
	assert.Equal(t, proto.StageDiskCheck, res.FailedStage)
	assert.Empty(t, res.TouchedSlots)
	assertZero(t, cfg.Loop)
}

// crashEnv carries the child's configuration in the crash test.
const crashEnv = "GPUAAS_SLICE_CRASH_CONFIG"

// TestSliceCrashChild is the child of TestPrivilegedSliceCrash: it runs a
// provision with the failpoints of GPUAAS_FAILPOINTS, which exit the
// process with status 3.
func TestSliceCrashChild(t *testing.T) {
	path := os.Getenv(crashEnv)
	if path == "" {
		t.Skip("child of TestPrivilegedSliceCrash")
	}
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var cfg labConfig
	require.NoError(t, json.Unmarshal(b, &cfg))
	fp, err := FailpointsFromEnv()
	require.NoError(t, err)
	p, err := buildRuntime(cfg, fp)
	require.NoError(t, err)
	_, err = p.rt.Provision(context.Background(), cfg.Request, nil)
	t.Fatalf("the failpoint did not crash the process: %v", err)
}

// TestPrivilegedSliceCrash kills an agent process (a failpoint's os.Exit)
// mid-clone and mid-boot; a fresh runtime's Reconcile then converges: the
// domain, port, reservation and NAT are gone and the touched disk is wiped
// with a proof before the slot could be offered again.
func TestPrivilegedSliceCrash(t *testing.T) {
	cfg := labHost(t, true)
	realNetwork(t, cfg)
	for _, point := range []string{FailpointDuringClone, "slice/after-define_start"} {
		t.Run(strings.TrimPrefix(point, "slice/"), func(t *testing.T) {
			cfgPath := filepath.Join(t.TempDir(), "cfg.json")
			b, err := json.Marshal(cfg)
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(cfgPath, b, 0o600))
			cmd := exec.Command(os.Args[0], "-test.run=^TestSliceCrashChild$", "-test.v")
			cmd.Env = append(os.Environ(), crashEnv+"="+cfgPath, FailpointsEnv+"="+point+"=crash")
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			require.ErrorAs(t, err, &ee, "%s", out)
			require.Equal(t, 3, ee.ExitCode(), "%s", out)
			require.Contains(t, string(out), "gpuaas failpoint "+point+": crash")

			p, err := buildRuntime(cfg, nil)
			require.NoError(t, err)
			defer p.close()
			ctx := context.Background()
			alloc := cfg.Request.AllocationID
			rec, _, err := p.journal.Get(alloc)
			require.NoError(t, err)
			require.Equal(t, PhaseProvisioning, rec.Phase)
			require.Equal(t, []string{"j22u15-s0"}, rec.TouchedSlots())
			if point != FailpointDuringClone {
				s, err := p.hv.State(ctx, DomainName(alloc))
				require.NoError(t, err)
				require.Equal(t, DomainRunning, s, "the crash left the VM running")
			}

			r, err := p.rt.Reconcile(ctx, nil)
			require.NoError(t, err)
			assert.Equal(t, []string{alloc}, r.TornDown)
			assert.Equal(t, []string{"j22u15-s0"}, r.Wiped)
			s, err := p.hv.State(ctx, DomainName(alloc))
			require.NoError(t, err)
			assert.Equal(t, DomainAbsent, s)
			ports, err := p.sw.PortsByAllocation(ctx, alloc)
			require.NoError(t, err)
			assert.Empty(t, ports)
			res, err := p.dhcp.Reservations()
			require.NoError(t, err)
			assert.Empty(t, res)
			guests, err := p.nat.Guests(ctx)
			require.NoError(t, err)
			assert.Empty(t, guests)
			rec, _, err = p.journal.Get(alloc)
			require.NoError(t, err)
			require.NotNil(t, rec.Slots[0].Proof)
			assertZero(t, cfg.Loop)
			require.NoError(t, p.journal.Delete(alloc))
		})
	}
}

// vmDir is a temporary directory QEMU (running as libvirt-qemu) can reach.
func vmDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for d := dir; d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		require.NoError(t, os.Chmod(d, 0o755))
	}
	return dir
}

// attachLoop attaches a sparse file of size bytes to a loop device,
// detached in t.Cleanup.
func attachLoop(t *testing.T, backing string, size int64) string {
	t.Helper()
	f, err := os.Create(backing)
	require.NoError(t, err)
	require.NoError(t, f.Truncate(size))
	require.NoError(t, f.Close())
	out, err := exec.Command("losetup", "-f", "--show", backing).CombinedOutput()
	if err != nil {
		testenv.Missing(t, "loop devices", strings.TrimSpace(string(out)))
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() {
		_ = exec.Command("partx", "-d", dev).Run()
		if out, err := exec.Command("losetup", "-d", dev).CombinedOutput(); err != nil {
			t.Errorf("losetup -d %s: %v: %s", dev, err, out)
		}
	})
	return dev
}

// assertZero checks that every byte of the device reads as zero.
func assertZero(t *testing.T, dev string) {
	t.Helper()
	f, err := os.Open(dev)
	require.NoError(t, err)
	defer f.Close()
	buf := make([]byte, 1<<20)
	var off int64
	for {
		n, err := f.Read(buf)
		for i, c := range buf[:n] {
			if c != 0 {
				t.Fatalf("%s: data at byte %d", dev, off+int64(i))
			}
		}
		off += int64(n)
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
	}
	require.Greater(t, off, int64(0))
}

func logSerial(t *testing.T, cfg labConfig) {
	b, _ := os.ReadFile(filepath.Join(cfg.SerialDir, DomainName(cfg.Request.AllocationID)+".log"))
	lines := strings.Split(string(b), "\n")
	if len(lines) > 80 {
		lines = lines[len(lines)-80:]
	}
	t.Logf("serial console (tail):\n%s", strings.Join(lines, "\n"))
	if b, err := os.ReadFile(filepath.Join(cfg.DHCPDir, "dnsmasq.log")); err == nil {
		t.Logf("dnsmasq log:\n%s", b)
	}
}

func randHex(t testing.TB, n int) string {
	t.Helper()
	b := make([]byte, n)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return hex.EncodeToString(b)
}

// otherMAC reserves the allocation's address for a MAC the guest does not
// have: the real dnsmasq (reservations only) never answers the guest.
type otherMAC struct{ DHCP }

func (o otherMAC) Reserve(ctx context.Context, r dhcp.Reservation) error {
	r.MAC = slices.Clone(r.MAC)
	r.MAC[5] ^= 0xff
	return o.DHCP.Reserve(ctx, r)
}

// TestPrivilegedSliceNoLease boots the real guest on the real bridge while
// the real dnsmasq holds no reservation for its MAC: the readiness gate
// fails at dhcp_lease after its timeout, the provision reports the slot it
// touched (the coordinator makes it cleanup_blocked), and the VM, its OVS
// port, its reservation and its NAT entry are gone.
func TestPrivilegedSliceNoLease(t *testing.T) {
	cfg := labHost(t, true)
	realNetwork(t, cfg)
	p, err := buildRuntime(cfg, nil, func(o *Options, d *Deps) {
		o.LeaseTimeout = 45 * time.Second
		d.DHCP = otherMAC{d.DHCP}
	})
	require.NoError(t, err)
	defer p.close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	alloc := cfg.Request.AllocationID
	res, err := p.rt.Provision(ctx, cfg.Request, &recorder{})
	require.Error(t, err)
	assert.Equal(t, proto.StageDHCPLease, res.FailedStage, "%v", err)
	assert.Equal(t, []string{"j22u15-s0"}, res.TouchedSlots)
	assert.Nil(t, res.Access)
	s, err := p.hv.State(ctx, DomainName(alloc))
	require.NoError(t, err)
	assert.Equal(t, DomainAbsent, s, "the VM is destroyed")
	ports, err := p.sw.PortsByAllocation(ctx, alloc)
	require.NoError(t, err)
	assert.Empty(t, ports)
	rs, err := p.dhcp.Reservations()
	require.NoError(t, err)
	assert.Empty(t, rs)
	guests, err := p.nat.Guests(ctx)
	require.NoError(t, err)
	assert.Empty(t, guests)
	leases, err := p.dhcp.Leases(ctx)
	require.NoError(t, err)
	for _, l := range leases {
		assert.NotEqual(t, cfg.Request.Slots[0].Capacity.PrivateIP, l.IP.String(), "nobody holds the slot's address")
	}
}
