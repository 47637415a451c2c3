package e2e

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/images/guest"
	"github.com/gpuaas/gpuaas/lab/fleet"
	"github.com/gpuaas/gpuaas/lab/hostsim/hostsimtest"
	"github.com/gpuaas/gpuaas/lab/labagent"
	"github.com/gpuaas/gpuaas/lab/labhost"
	"github.com/gpuaas/gpuaas/lab/launch"
	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/test/libvirttest"
	"github.com/gpuaas/gpuaas/test/testenv"
)

// TestPrivilegedLabSliceEndToEnd is the operator's slice path on real
// parts: three coordinator processes (the lab), a j22u15 agent process
// running the real slice runtime (its GPUs, fabric VFs and VFIO are the
// simulated host tree; its slot NVMe disks are real loop devices), the
// machine's userspace Open vSwitch, dnsmasq and libvirt (TCG). The
// operator pushes and approves the lab guest image with gpuaasctl, then
// `gpuaasctl alloc create --wait` follows a 1-GPU slice to active and
// prints the SSH command; the test reaches the guest with the tenant's
// key and reads the marker's digest on the cloned disk and the seed's
// instance-id; `gpuaasctl alloc release` wipes and verifies the disk and
// the slot returns to available with the wipe proof.
func TestPrivilegedLabSliceEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a VM")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	rl := startRealSliceLab(t, ctx)
	l, api, toks, m, img := rl.l, rl.api, struct{ Admin string }{rl.admin}, rl.m, rl.img

	// The operator's path, through gpuaasctl.
	// Publishing and approving an image is an admin's job; the rest is
	// the operator's (the lab's env token).
	admin := &lab{bin: l.bin, env: append(append([]string(nil), l.env...), "GPUAAS_TOKEN="+toks.Admin)}
	out, err := admin.ctl(t, "image", "push", img, "--name", "lab-guest", "--version", "v1", "--kind", "slice_base", "--marker-sha256", m.MarkerSHA256)
	require.NoError(t, err, out)
	out, err = admin.ctl(t, "image", "approve", "lab-guest:v1")
	require.NoError(t, err, out)
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	signer, err := ssh.NewSignerFromKey(priv)
	require.NoError(t, err)
	tenantKey := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(signer.PublicKey())))
	start := time.Now()
	out, err = l.ctl(t, "alloc", "create", "--gpus", "1", "--region", "lab-east", "--image", "lab-guest",
		"--ssh-key", tenantKey, "--wait", "--wait-timeout", "10m")
	require.NoError(t, err, out)
	t.Logf("alloc create --wait (%.1f s):\n%s", time.Since(start).Seconds(), out)
	for _, stage := range proto.SliceStages {
		assert.Contains(t, out, stage, "the live view shows stage %s", stage)
	}
	sshLine := regexp.MustCompile(`ssh (?:-J \S+ )?\S+@(\d+\.\d+\.\d+\.\d+)`).FindStringSubmatch(out)
	require.NotNil(t, sshLine, "the SSH command ends the output")

	var list proto.List[proto.Allocation]
	require.NoError(t, getJSON(ctx, api, "/v1/allocations?node=j22u15", &list))
	require.Len(t, list.Items, 1)
	a := list.Items[0]
	require.Equal(t, proto.AllocActive, a.State, a.Reason)
	require.NotNil(t, a.Access)
	assert.Equal(t, sshLine[1], a.Access.GuestIP)
	var cl proto.List[proto.Claim]
	require.NoError(t, getJSON(ctx, api, "/v1/allocations/"+a.ID+"/claims", &cl))
	require.Len(t, cl.Items, 1)
	claims := cl.Items
	var slot proto.Slot
	require.NoError(t, getJSON(ctx, api, "/v1/slots/"+claims[0].SlotID, &slot))
	assert.Equal(t, a.Access.GuestIP, slot.Capacity.PrivateIP, "the guest holds the slot's reserved address")
	assert.Equal(t, proto.HealthHealthy, slot.HealthState)
	id := regexp.MustCompile(`instance-id (\S+) from the seed`).FindStringSubmatch(slot.HealthDetail)
	require.NotNil(t, id, "readiness evidence names the instance-id: %s", slot.HealthDetail)

	// The tenant reaches the guest (the bridge's gateway is on this
	// machine) with their own key: the marker on the cloned disk and the
	// seed's instance-id.
	cli := dialGuest(t, a.Access.GuestIP, signer, a.Access.HostKeys...)
	marker := guestRun(t, cli, "shasum -a 256 /disk"+guest.MarkerPath)
	assert.Equal(t, m.MarkerSHA256, strings.Fields(marker)[0], "marker digest over SSH")
	assert.Equal(t, id[1], strings.TrimSpace(guestRun(t, cli, "cat /run/gpuaas/instance-id")))
	cli.Close()

	out, err = l.ctl(t, "alloc", "timeline", a.ID)
	require.NoError(t, err, out)
	t.Logf("timeline:\n%s", out)

	// Release: stop, network clean-up, wipe with proof, slot available.
	out, err = l.ctl(t, "alloc", "release", a.ID)
	require.NoError(t, err, out)
	relStart := time.Now()
	require.Eventually(t, func() bool {
		var s proto.Slot
		return getJSON(ctx, api, "/v1/slots/"+claims[0].SlotID, &s) == nil && s.Status == proto.SlotAvailable
	}, 5*time.Minute, 200*time.Millisecond, "the slot returns to available")
	t.Logf("release to available: %.1f s", time.Since(relStart).Seconds())
	require.NoError(t, getJSON(ctx, api, "/v1/slots/"+claims[0].SlotID, &slot))
	require.NotNil(t, slot.WipeProof, "available only with a wipe proof")
	assert.NotZero(t, slot.WipeProof.Bytes)
	require.NoError(t, getJSON(ctx, api, "/v1/allocations/"+a.ID, &a))
	assert.Equal(t, proto.AllocReleased, a.State)

	// The CUDA developer image, a separate catalog entry with its own
	// readiness check: a 2-GPU slice is active only once nvidia-smi in
	// the guest lists exactly its two H200s (announced by the lab domain
	// over fw_cfg, lab/guestgpu).
	cm, cimg, err := guest.Image(ctx, guest.Options{Variant: guest.VariantCUDA})
	require.NoError(t, err)
	out, err = admin.ctl(t, "image", "push", cimg, "--name", "lab-guest-cuda", "--version", "v1", "--kind", "slice_cuda",
		"--readiness-check", "cuda", "--marker-sha256", cm.MarkerSHA256)
	require.NoError(t, err, out)
	out, err = admin.ctl(t, "image", "approve", "lab-guest-cuda:v1")
	require.NoError(t, err, out)
	start = time.Now()
	out, err = l.ctl(t, "alloc", "create", "--gpus", "2", "--region", "lab-east", "--image", "lab-guest-cuda",
		"--ssh-key", tenantKey, "--wait", "--wait-timeout", "10m")
	require.NoError(t, err, out)
	t.Logf("CUDA alloc create --wait (%.1f s):\n%s", time.Since(start).Seconds(), out)
	require.NoError(t, getJSON(ctx, api, "/v1/allocations?node=j22u15&state=active", &list))
	require.Len(t, list.Items, 1)
	ca := list.Items[0]
	require.NotNil(t, ca.Access)
	require.NoError(t, getJSON(ctx, api, "/v1/allocations/"+ca.ID+"/claims", &cl))
	require.Len(t, cl.Items, 2)
	for _, c := range cl.Items {
		require.NoError(t, getJSON(ctx, api, "/v1/slots/"+c.SlotID, &slot))
		assert.Equal(t, proto.HealthHealthy, slot.HealthState)
		assert.Contains(t, slot.HealthDetail, "nvidia-smi lists 2 GPUs", "the cuda check's evidence")
	}
	cli = dialGuest(t, ca.Access.GuestIP, signer)
	smi := guestRun(t, cli, "nvidia-smi -L")
	cli.Close()
	assert.Equal(t, 2, strings.Count(smi, ": NVIDIA H200 (UUID: GPU-"), "the tenant sees both GPUs: %s", smi)
	out, err = l.ctl(t, "alloc", "release", ca.ID)
	require.NoError(t, err, out)
	require.Eventually(t, func() bool {
		for _, c := range cl.Items {
			var s proto.Slot
			if getJSON(ctx, api, "/v1/slots/"+c.SlotID, &s) != nil || s.Status != proto.SlotAvailable || s.WipeProof == nil {
				return false
			}
		}
		return true
	}, 5*time.Minute, 200*time.Millisecond, "both slots return to available with a wipe proof")
}

// realSliceLab is a lab of 3 coordinator processes and one gpuaas-agent
// on j22u15 running real VMs (TCG), its candidates approved, and the lab
// guest image built.
type realSliceLab struct {
	l     *lab
	bin   string
	api   fleet.API // admin
	admin string    // the admin token
	m     guest.Manifest
	img   string
	// agent is the real slice host's agent process; stateDir its state.
	agent    *launch.Proc
	stateDir string
}

// startRealSliceLab brings the real slice host up (every part it needs, or
// the test skips: it is privileged).
func startRealSliceLab(t *testing.T, ctx context.Context, opts ...func(*fleet.Agents)) realSliceLab {
	t.Helper()
	testenv.Commands(t, "losetup", "dnsmasq", "qemu-img", "objcopy", "sgdisk", "mkfs.vfat", "mmd", "mcopy")
	libvirttest.SharedOVS(t)
	libvirttest.Connect(t)
	for _, f := range []string{"/usr/share/OVMF/OVMF_CODE_4M.fd", "/usr/share/OVMF/OVMF_VARS_4M.fd"} {
		if _, err := os.Stat(f); err != nil {
			testenv.Missing(t, "OVMF (package ovmf)", err.Error())
		}
	}
	m, img, err := guest.Image(ctx, guest.Options{})
	require.NoError(t, err)

	bin := buildBinaries(t)
	dir := filepath.Join(t.TempDir(), "lab")
	l := startLab(t, bin, dir, "-hosts=", "-coordinators", "3")
	var lf labFile
	b, err := os.ReadFile(filepath.Join(dir, "lab.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &lf))
	var toks struct{ Admin string }
	b, err = os.ReadFile(filepath.Join(dir, "tokens.secret.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &toks))
	api, err := fleet.NewAPI(launch.APIURL(lf.Coordinators[0].HTTP), toks.Admin, launch.CAFile(dir))
	require.NoError(t, err)
	api.Poll = 100 * time.Millisecond
	var urls, gossip []string
	for _, c := range lf.Coordinators {
		urls, gossip = append(urls, launch.APIURL(c.HTTP)), append(gossip, c.Gossip)
	}

	// The real slice host: j22u15's tree with its NVMe disks on loop
	// devices, a bridge of its own with a random guest subnet.
	h, err := fleet.NewHost("j22u15", filepath.Join(hostsimtest.Dir(t), "j22u15"), t.TempDir())
	require.NoError(t, err)
	_, err = fleet.EnsureRoot(h)
	require.NoError(t, err)
	root, err := hostops.NewRoot(h.Root)
	require.NoError(t, err)
	rnd := make([]byte, 3)
	_, _ = rand.Read(rnd)
	sh, err := labhost.SetupSlice(ctx, labhost.SliceOptions{Root: root, Dir: t.TempDir(), Bridge: "gpe" + hex.EncodeToString(rnd[:2]),
		Gateway: fmt.Sprintf("10.%d.%d.1/24", 200+int(rnd[0])%50, rnd[1]), JumpHost: "127.0.0.1"}, t.Logf)
	require.NoError(t, err)
	t.Cleanup(func() {
		if err := sh.Close(context.Background()); err != nil {
			t.Errorf("slice host clean-up: %v", err)
		}
	})

	agents := fleet.Agents{Bin: filepath.Join(bin, "gpuaas-agent"), Coordinators: urls, CAFile: launch.CAFile(dir), GossipJoin: gossip,
		LogDir: filepath.Join(dir, "logs"), Fast: true, Slices: map[string]labagent.Slice{"j22u15": sh.Slice}}
	for _, o := range opts {
		o(&agents)
	}
	token, err := api.MintToken(ctx, "j22u15", time.Hour)
	require.NoError(t, err)
	p, err := agents.Proc(h, token)
	require.NoError(t, err)
	require.NoError(t, p.Start())
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			b, _ := os.ReadFile(p.LogPath)
			if len(b) > 8000 {
				b = b[len(b)-8000:]
			}
			t.Logf("agent log (tail):\n%s", b)
		}
	})
	_, err = api.WaitNode(ctx, "j22u15", "slice-ready", func(d proto.NodeDetail) bool {
		return d.Node.State == proto.NodeActive && d.Node.Readiness != nil && d.Node.Readiness.SliceReady
	})
	require.NoError(t, err)
	topo, err := api.Discover(ctx, "j22u15")
	require.NoError(t, err)
	approved, err := api.ApproveComplete(ctx, topo)
	require.NoError(t, err)
	require.NotEmpty(t, approved, "complete candidates of j22u15")
	return realSliceLab{l: l, bin: bin, api: api, admin: toks.Admin, m: m, img: img, agent: p, stateDir: h.StateDir}
}

// getJSON reads path from the coordinator into out.
func getJSON(ctx context.Context, api fleet.API, path string, out any) error {
	var q url.Values
	if p, raw, ok := strings.Cut(path, "?"); ok {
		var err error
		if q, err = url.ParseQuery(raw); err != nil {
			return err
		}
		path = p
	}
	r, err := api.C.Do(ctx, http.MethodGet, path, q, nil, nil)
	if err != nil {
		return err
	}
	return json.Unmarshal(r.Body, out)
}

// dialGuest waits for the guest's sshd.
// With hostKeys (the allocation's access), the guest must present one
// of them.
func dialGuest(t *testing.T, ip string, signer ssh.Signer, hostKeys ...string) *ssh.Client {
	t.Helper()
	cfg := &ssh.ClientConfig{User: "root", Auth: []ssh.AuthMethod{ssh.PublicKeys(signer)},
		HostKeyCallback: ssh.InsecureIgnoreHostKey(), Timeout: 10 * time.Second}
	if len(hostKeys) > 0 {
		var pinned []ssh.PublicKey
		for _, k := range hostKeys {
			pk, _, _, _, err := ssh.ParseAuthorizedKey([]byte(k))
			require.NoError(t, err, "host key %q", k)
			pinned = append(pinned, pk)
		}
		cfg.HostKeyCallback = func(_ string, _ net.Addr, k ssh.PublicKey) error {
			for _, p := range pinned {
				if bytes.Equal(p.Marshal(), k.Marshal()) {
					return nil
				}
			}
			return fmt.Errorf("guest host key %s is not the one the access names", ssh.FingerprintSHA256(k))
		}
	}
	var c *ssh.Client
	require.Eventually(t, func() bool {
		var err error
		c, err = ssh.Dial("tcp", net.JoinHostPort(ip, "22"), cfg)
		return err == nil
	}, 60*time.Second, time.Second, "SSH to the guest %s with the tenant key", ip)
	return c
}

func guestRun(t *testing.T, c *ssh.Client, cmd string) string {
	t.Helper()
	s, err := c.NewSession()
	require.NoError(t, err)
	defer s.Close()
	out, err := s.CombinedOutput(cmd)
	require.NoError(t, err, "%s: %s", cmd, out)
	return string(out)
}
