package e2e

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netns"
	"golang.org/x/crypto/ssh"

	"github.com/gpuaas/gpuaas/hostops/ingress"
	"github.com/gpuaas/gpuaas/lab/fleet"
	"github.com/gpuaas/gpuaas/lab/launch"
	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/test/netnstest"
	"github.com/gpuaas/gpuaas/test/testenv"
)

// TestPrivilegedLabVMIngress reaches a real lab VM's SSH (j22u15 under
// libvirt, TCG) through a public address: the real agent programs the
// DNAT in this machine's namespace (where the lab's slice bridge lives,
// in its ingress table, deleted when the test ends), and a client in another namespace on
// the "public" side logs in over SSH through the public endpoint the
// ledger handed out. After release the rule is gone and the endpoint
// dead.
func TestPrivilegedLabVMIngress(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a VM")
	}
	testenv.Root(t)
	testenv.Commands(t, "nft", "nsenter", "ip")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	// The lab's own public ingress (what gpuaas-lab sets up for j22u15):
	// the agent's name of this machine's namespace, where the slice bridge
	// lives, and the public side routed to 203.0.113.0/24 over a veth.
	li, err := launch.SetupIngress(ctx, launch.IngressOptions{Name: "gpv-" + netnstest.Suffix(t)[:6], Link: netip.MustParsePrefix("172.31.252.0/30")})
	require.NoError(t, err)
	t.Cleanup(func() {
		if err := li.Close(context.Background()); err != nil {
			t.Errorf("lab ingress clean-up: %v", err)
		}
	})
	rl := startRealSliceLab(t, ctx, func(a *fleet.Agents) {
		a.IngressNetns = map[string]string{"j22u15": li.Netns}
	})
	l := rl.l
	admin := &lab{bin: l.bin, env: append(append([]string(nil), l.env...), "GPUAAS_TOKEN="+rl.admin)}
	out, err := admin.ctl(t, "image", "push", rl.img, "--name", "lab-guest", "--version", "v1", "--kind", "slice_base", "--marker-sha256", rl.m.MarkerSHA256)
	require.NoError(t, err, out)
	out, err = admin.ctl(t, "image", "approve", "lab-guest:v1")
	require.NoError(t, err, out)
	pub := publicSide(li.PublicNetns)

	var n proto.NodeDetail
	require.NoError(t, getJSON(ctx, rl.api, "/v1/nodes/j22u15", &n))
	e := &agentsEnv{t: t, ctx: ctx, api: rl.api}
	site := ingressSite(t, e, n.Node)
	out, err = admin.ctl(t, "site", "ingress", site, "--address", "203.0.113.77", "--public-ports", "42200-42299", "--allow", "22", "--quota", "2")
	require.NoError(t, err, out)

	_, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	signer, err := ssh.NewSignerFromKey(priv)
	require.NoError(t, err)
	tenantKey := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(signer.PublicKey())))
	out, err = l.ctl(t, "alloc", "create", "--gpus", "1", "--region", n.Node.Region, "--image", "lab-guest",
		"--ssh-key", tenantKey, "--ingress", "tcp/22", "--wait", "--wait-timeout", "10m")
	require.NoError(t, err, out)
	var list proto.List[proto.Allocation]
	require.NoError(t, getJSON(ctx, rl.api, "/v1/allocations?node=j22u15&state=active", &list))
	require.Len(t, list.Items, 1)
	a := list.Items[0]
	require.Len(t, a.Ingress, 1)
	endpoint := netip.MustParseAddrPort(a.Ingress[0].Public())
	assert.Equal(t, "203.0.113.77:42200", endpoint.String())
	var v proto.IngressView
	require.Eventually(t, func() bool {
		return getJSON(ctx, rl.api, "/v1/allocations/"+a.ID+"/ingress", &v) == nil && len(v.Routes) == 1 && v.Routes[0].State == proto.IngressProgrammed
	}, time.Minute, 200*time.Millisecond, "the route is reported programmed")
	assert.Equal(t, a.Access.GuestIP, v.Routes[0].PrivateAddress)

	// SSH through the public endpoint, from the public side.
	start := time.Now()
	var sc *ssh.Client
	require.Eventually(t, func() bool {
		var c net.Conn
		if err := pub.Do(func() (err error) { c, err = net.DialTimeout("tcp", endpoint.String(), 5*time.Second); return err }); err != nil {
			return false
		}
		cc, chans, reqs, err := ssh.NewClientConn(c, endpoint.String(), &ssh.ClientConfig{User: "root", Auth: []ssh.AuthMethod{ssh.PublicKeys(signer)},
			HostKeyCallback: ssh.InsecureIgnoreHostKey(), Timeout: 10 * time.Second})
		if err != nil {
			c.Close()
			return false
		}
		sc = ssh.NewClient(cc, chans, reqs)
		return true
	}, 2*time.Minute, 500*time.Millisecond, "SSH through %s", endpoint)
	sess, err := sc.NewSession()
	require.NoError(t, err)
	got, err := sess.Output("cat /run/gpuaas/instance-id")
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(string(got), "i-"), "instance-id %q", got)
	sc.Close()
	t.Logf("ssh through the public endpoint after %.1fs", time.Since(start).Seconds())

	// Release: the rule is gone and the endpoint dead.
	out, err = l.ctl(t, "alloc", "release", a.ID, "--wait", "--wait-timeout", "5m")
	require.NoError(t, err, out)
	ig, err := ingress.New(ingress.Config{Table: ingress.DefaultTable})
	require.NoError(t, err)
	require.Eventually(t, func() bool { rs, err := ig.Rules(ctx); return err == nil && len(rs) == 0 }, time.Minute, 200*time.Millisecond, "rule removed after release")
	err = pub.Do(func() error {
		c, err := net.DialTimeout("tcp", endpoint.String(), time.Second)
		if err == nil {
			c.Close()
		}
		return err
	})
	require.Error(t, err, "the released endpoint still answers")
}

// publicSide runs functions inside the named namespace (the lab's public
// side) on a locked OS thread.
type publicSide string

func (p publicSide) Do(fn func() error) error {
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("get current namespace: %w", err)
	}
	defer orig.Close()
	h, err := netns.GetFromName(string(p))
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("open namespace %s: %w", string(p), err)
	}
	defer h.Close()
	if err := netns.Set(h); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("enter %s: %w", string(p), err)
	}
	ferr := fn()
	if err := netns.Set(orig); err != nil {
		// Stuck in the wrong namespace: the thread stays locked and is
		// discarded when the goroutine exits.
		return fmt.Errorf("leave %s: %w (fn: %v)", string(p), err, ferr)
	}
	runtime.UnlockOSThread()
	return ferr
}
