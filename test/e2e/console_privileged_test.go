package e2e

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/gpuaas/gpuaas/coordinator/cli"
	"github.com/gpuaas/gpuaas/proto"
)

// The lab guest's console login (images/guest/uinit/console.go).
const (
	labConsoleUser     = "root"
	labConsolePassword = "gpuaas-lab"
)

// TestPrivilegedLabSliceConsole opens the serial console of a real lab VM
// (j22u15 under libvirt, TCG) with `gpuaasctl alloc console` through a
// coordinator's gateway — libvirt's console stream on the agent —, logs
// in on the guest's ttyS0 getty, runs a command and sees its output,
// takes the guest's network down (SSH stops answering) and keeps working
// over the console, brings it back (SSH answers again), leaves with
// Ctrl-] and finds the session's audit record with bytes each way.
func TestPrivilegedLabSliceConsole(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a VM")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	rl := startRealSliceLab(t, ctx)
	l := rl.l
	admin := &lab{bin: l.bin, env: append(append([]string(nil), l.env...), "GPUAAS_TOKEN="+rl.admin)}
	out, err := admin.ctl(t, "image", "push", rl.img, "--name", "lab-guest", "--version", "v1", "--kind", "slice_base", "--marker-sha256", rl.m.MarkerSHA256)
	require.NoError(t, err, out)
	out, err = admin.ctl(t, "image", "approve", "lab-guest:v1")
	require.NoError(t, err, out)
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	signer, err := ssh.NewSignerFromKey(priv)
	require.NoError(t, err)
	tenantKey := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(signer.PublicKey())))
	out, err = l.ctl(t, "alloc", "create", "--gpus", "1", "--region", "lab-east", "--image", "lab-guest",
		"--ssh-key", tenantKey, "--wait", "--wait-timeout", "10m")
	require.NoError(t, err, out)
	var list proto.List[proto.Allocation]
	require.NoError(t, getJSON(ctx, rl.api, "/v1/allocations?node=j22u15&state=active", &list))
	require.Len(t, list.Items, 1)
	a := list.Items[0]
	require.NotNil(t, a.Access)
	guestSSH := net.JoinHostPort(a.Access.GuestIP, "22")
	dialGuest(t, a.Access.GuestIP, signer).Close()

	// The tenant's console, through the gateway (the lab's env names a
	// coordinator and the operator's token: the owner).
	start := time.Now()
	c := startConsoleCLI(t, rl.bin, l.env, a.ID)
	c.send("\n") // a fresh login prompt from the getty
	c.expect("login: ", 60*time.Second)
	t.Logf("console: login prompt %.2f s after gpuaasctl started", time.Since(start).Seconds())
	require.Contains(t, c.stderr(), proto.ConsoleReadWrite)
	c.send(labConsoleUser + "\n")
	c.expect("Password: ", 30*time.Second)
	c.send(labConsolePassword + "\n")
	c.expect("~# ", 30*time.Second)
	c.send("cat /run/gpuaas/instance-id\n")
	c.expect("\ni-", 30*time.Second)
	c.expect("~# ", 30*time.Second)

	// Break the guest's network: SSH stops answering, the console does not.
	c.send("ip link set eth0 down\n")
	c.expect("~# ", 30*time.Second)
	require.Eventually(t, func() bool {
		conn, err := net.DialTimeout("tcp", guestSSH, 2*time.Second)
		if err == nil {
			conn.Close()
			return false
		}
		return true
	}, 30*time.Second, time.Second, "SSH to %s still answers with the guest's link down", guestSSH)
	c.send("echo console-works-$HOME\n")
	c.expect("\nconsole-works-/root", 30*time.Second)
	c.expect("~# ", 30*time.Second)
	// Fix it over the console: SSH answers again.
	c.send("ip link set eth0 up\n")
	c.expect("~# ", 30*time.Second)
	require.Eventually(t, func() bool {
		conn, err := net.DialTimeout("tcp", guestSSH, 2*time.Second)
		if err != nil {
			return false
		}
		conn.Close()
		return true
	}, 60*time.Second, time.Second, "SSH to %s answers again once the link is back", guestSSH)

	c.send(string(rune(cli.ConsoleEscape)))
	require.NoError(t, c.wait(30*time.Second), "stderr: %s", c.stderr())

	// The audit record.
	var sessions proto.ConsoleSessionList
	require.Eventually(t, func() bool {
		sessions = proto.ConsoleSessionList{}
		return getJSON(ctx, rl.api, "/v1/allocations/"+a.ID+"/console/sessions", &sessions) == nil &&
			len(sessions.Sessions) == 1 && sessions.Sessions[0].Result != nil
	}, 10*time.Second, 100*time.Millisecond)
	s := sessions.Sessions[0]
	assert.Equal(t, a.Owner, s.Session.User)
	assert.NotEmpty(t, s.Session.RemoteAddr)
	assert.Equal(t, proto.TaskSucceeded, s.State)
	assert.Equal(t, proto.ConsoleReadWrite, s.Result.Mode)
	assert.Greater(t, s.Result.BytesIn, int64(40))
	assert.Greater(t, s.Result.BytesOut, int64(100))
	t.Logf("console session %s: %s, %d bytes in, %d out, closed: %s", s.Session.ID, s.Result.Duration().Round(time.Millisecond), s.Result.BytesIn, s.Result.BytesOut, s.Result.Closed)
	// And in the hash-chained audit log: its open and its close.
	var audit proto.List[proto.AuditRecord]
	require.Eventually(t, func() bool { // the replica may be a moment behind
		audit = proto.List[proto.AuditRecord]{}
		return getJSON(ctx, rl.api, "/v1/audit?kind=console_session&object="+s.Session.ID, &audit) == nil && len(audit.Items) == 2
	}, 10*time.Second, 100*time.Millisecond, "the session's open and close in the audit log: %+v", audit.Items)
	for _, rec := range audit.Items {
		assert.Equal(t, a.Owner, rec.Actor)
		assert.Equal(t, "/v1/allocations/"+a.ID+"/console", rec.Path)
	}
	tr, err := rl.api.C.Do(ctx, http.MethodGet, "/v1/allocations/"+a.ID+"/console/sessions/"+s.Session.ID+"/transcript",
		map[string][]string{"reason": {"e2e: audit check"}}, nil, nil)
	require.NoError(t, err)
	assert.Contains(t, string(tr.Body), "ip link set eth0 down")
	assert.NotContains(t, string(tr.Body), labConsolePassword, "the password is redacted")

	out, err = l.ctl(t, "alloc", "release", a.ID)
	require.NoError(t, err, out)
	require.Eventually(t, func() bool {
		var got proto.Allocation
		return getJSON(ctx, rl.api, "/v1/allocations/"+a.ID, &got) == nil && got.State == proto.AllocReleased
	}, 5*time.Minute, time.Second, "the slice is released")
}
