package e2e

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/gpuaas/gpuaas/coordinator/cli"
	"github.com/gpuaas/gpuaas/images/apps"
	"github.com/gpuaas/gpuaas/images/guest"
	"github.com/gpuaas/gpuaas/lab/fleet"
	"github.com/gpuaas/gpuaas/proto"
)

// TestPrivilegedLabVMAppLaunch is issue 17's done-when end to end on a
// real lab VM (j22u15's slice under libvirt, TCG): the repository's hello
// app is published and approved, then launched as a user would, with
// `gpuaasctl app launch --wait`; the agent is killed and restarted while
// the launch runs (the guest runner converges on one container in the
// guest); the owner reaches the app through a coordinator's workload
// proxy (HTTP and the app's WebSocket echo); releasing the allocation
// stops the instance and the app is gone with the guest.
func TestPrivilegedLabVMAppLaunch(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a VM")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	rl := startRealSliceLab(t, ctx)
	l := rl.l
	admin := &lab{bin: l.bin, env: append(append([]string(nil), l.env...), "GPUAAS_TOKEN="+rl.admin)}
	out, err := admin.ctl(t, "image", "push", rl.img, "--name", "lab-guest", "--version", "v1", "--kind", "slice_base", "--marker-sha256", rl.m.MarkerSHA256)
	require.NoError(t, err, out)
	out, err = admin.ctl(t, "image", "approve", "lab-guest:v1")
	require.NoError(t, err, out)

	// The hello app, built here and published with its layout.
	wd, _ := os.Getwd()
	root, err := guest.FindModuleRoot(wd)
	require.NoError(t, err)
	built, err := apps.Build(ctx, root, apps.Hello, filepath.Join(t.TempDir(), "hello.oci.tar"))
	require.NoError(t, err)
	layout, err := os.ReadFile(built.Path)
	require.NoError(t, err)
	body := proto.AppBody{Kind: proto.AppOCI, Image: apps.Hello.Repository + "@sha256:" + built.ArchiveSHA256, ImageSize: built.Size,
		Compat: proto.AppCompat{Shapes: []proto.CapacityShape{proto.ShapeGPUSlice}, MinGPUs: 1},
		Ports:  []proto.AppPort{{Name: "http", Port: 8080, Protocol: "http"}}, HealthCheck: &proto.AppHealthCheck{Port: 8080, Path: "/healthz", TimeoutSeconds: 120}}
	_, err = rl.api.C.Do(ctx, http.MethodPut, "/v1/apps/hello/1.0.0", nil, body, nil)
	require.NoError(t, err)
	_, err = rl.api.C.Do(ctx, http.MethodPut, proto.AppBlobPath("hello", "1.0.0"), nil, cli.RawBody{Data: layout, ContentType: "application/octet-stream"}, nil)
	require.NoError(t, err)
	out, err = admin.ctl(t, "app", "approve", "hello:1.0.0")
	require.NoError(t, err, out)

	// The tenant's slice (the lab's env names the operator: the owner).
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
	released := false
	t.Cleanup(func() {
		// A failing run still releases: the guest, and the app in it, go.
		if released {
			return
		}
		cctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if _, err := rl.api.C.Do(cctx, http.MethodPost, "/v1/allocations/"+a.ID+"/release", nil, nil, nil); err != nil {
			t.Logf("clean-up release of %s: %v", a.ID, err)
			return
		}
		for cctx.Err() == nil {
			var x proto.Allocation
			if getJSON(cctx, rl.api, "/v1/allocations/"+a.ID, &x) == nil && x.State == proto.AllocReleased {
				return
			}
			time.Sleep(time.Second)
		}
		t.Errorf("clean-up: %s not released within 3m", a.ID)
	})
	dialGuest(t, a.Access.GuestIP, signer).Close()

	get := func() proto.AppInstance {
		var x proto.AppInstance
		if getJSON(ctx, rl.api, "/v1/allocations/"+a.ID+"/apps/hello", &x) != nil {
			return proto.AppInstance{}
		}
		return x
	}

	// Launch as a user would; kill the agent while the launch runs.
	start := time.Now()
	cmd := exec.CommandContext(ctx, filepath.Join(l.bin, "gpuaasctl"), "app", "launch", a.ID, "hello", "--wait", "--wait-timeout", "10m")
	cmd.Env = append(os.Environ(), l.env...)
	var launchOut strings.Builder
	cmd.Stdout, cmd.Stderr = &launchOut, &launchOut
	require.NoError(t, cmd.Start())
	require.True(t, waitFor(2*time.Minute, func() bool { s := get().State; return s != "" && s != proto.AppInstancePending }),
		"the agent took the launch: %+v", get())
	first := get()
	rl.agent.Kill()
	require.NoError(t, rl.agent.Start(), "restart the agent")
	require.NoError(t, cmd.Wait(), "gpuaasctl app launch --wait:\n%s", launchOut.String())
	healthy := time.Since(start)
	inst := get()
	require.Equal(t, proto.AppInstanceRunning, inst.State, "%+v", inst)
	assert.Equal(t, first.ID, inst.ID, "the same instance after the restart")
	assert.Contains(t, launchOut.String(), inst.ProxyPath)
	t.Logf("launch to healthy on a TCG guest (with an agent restart): %s", healthy.Round(time.Millisecond))

	// One instance: one record on the agent, one bundle in the guest.
	recs, err := os.ReadDir(filepath.Join(rl.stateDir, "apps", "instances"))
	require.NoError(t, err)
	assert.Len(t, recs, 1, "one instance record on the agent")
	gc := dialGuest(t, a.Access.GuestIP, signer)
	sess, err := gc.NewSession()
	require.NoError(t, err)
	ls, err := sess.CombinedOutput("ls /run/gpuaas/apps")
	sess.Close()
	gc.Close()
	require.NoError(t, err, "%s", ls)
	assert.Len(t, strings.Fields(string(ls)), 1, "one app bundle in the guest: %q", ls)
	var all proto.List[proto.AppInstance]
	require.NoError(t, getJSON(ctx, rl.api, "/v1/allocations/"+a.ID+"/apps", &all))
	assert.Len(t, all.Items, 1, "one instance on the allocation")

	// The workload proxy, as the owner: HTTP, then the WebSocket echo.
	owner, err := fleet.NewAPI(rl.api.C.Base.String(), envValue(l.env, "GPUAAS_TOKEN"), rl.api.CAFile)
	require.NoError(t, err)
	var greeting string
	require.True(t, waitFor(60*time.Second, func() bool {
		r, err := owner.C.Do(ctx, http.MethodGet, inst.ProxyPath, nil, nil, nil)
		if err != nil {
			greeting = err.Error()
			return false
		}
		greeting = string(r.Body)
		return true
	}), "the proxy answered: %s", greeting)
	assert.Contains(t, greeting, "hello from gpuaas app")
	h := http.Header{}
	h.Set("Authorization", "Bearer "+owner.C.Token)
	wsURL := strings.Replace(owner.C.Base.String(), "https://", "wss://", 1) + inst.ProxyPath + "ws"
	ws, _, err := websocket.Dial(ctx, wsURL, &websocket.DialOptions{HTTPClient: owner.C.HTTP, HTTPHeader: h})
	require.NoError(t, err)
	require.NoError(t, ws.Write(ctx, websocket.MessageText, []byte("echo from a TCG guest")))
	_, msg, err := ws.Read(ctx)
	require.NoError(t, err)
	assert.Equal(t, "echo from a TCG guest", string(msg))
	ws.Close(websocket.StatusNormalClosure, "done")

	// Release: the instance stops, its record goes, the guest is gone.
	out, err = l.ctl(t, "alloc", "release", a.ID)
	require.NoError(t, err, out)
	released = true
	require.True(t, waitFor(3*time.Minute, func() bool { return get().State == proto.AppInstanceStopped }), "stopped by the release: %+v", get())
	require.True(t, waitFor(2*time.Minute, func() bool {
		recs, err := os.ReadDir(filepath.Join(rl.stateDir, "apps", "instances"))
		return err == nil && len(recs) == 0
	}), "the agent forgot the instance")
	_, err = owner.C.Do(ctx, http.MethodGet, inst.ProxyPath, nil, nil, nil)
	require.Error(t, err, "the proxy refuses a stopped app")
}

// envValue is the value of name in a list of NAME=value ("" if absent).
func envValue(env []string, name string) string {
	v := ""
	for _, kv := range env {
		if k, x, ok := strings.Cut(kv, "="); ok && k == name {
			v = x
		}
	}
	return v
}
