package slice

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/gpuaas/gpuaas/agent/apprun"
	"github.com/gpuaas/gpuaas/images/apps"
	"github.com/gpuaas/gpuaas/images/guest"
	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/test/bench"
)

// TestPrivilegedSliceApp provisions a real lab slice (u-root guest under
// TCG on the lab bridge), then runs the repository's hello app (its OCI
// image layout built by images/apps) inside the guest with the guest
// runner: over SSH with the allocation's own key, bundle streamed in, crun
// in the guest, health-gated. The app answers on the guest's private
// address; Start again converges on the one container; Stop removes the
// container and its files.
func TestPrivilegedSliceApp(t *testing.T) {
	sliceApp(t)
}

// TestBenchSliceApp is TestPrivilegedSliceApp under make bench: it reports
// app_launch_to_healthy_s.
func TestBenchSliceApp(t *testing.T) {
	if os.Getenv("GPUAAS_BENCH") == "" {
		t.Skip("set GPUAAS_BENCH=1 (make bench)")
	}
	launch := sliceApp(t)
	ms := []bench.Metric{bench.AtMost("app_launch_to_healthy_s", launch.Seconds(), "s", 30,
		"OCI app (the repo's hello image, 2.5 MB layout) on a running lab slice under TCG: Start call to health check passing — layout verified and unpacked on the agent, bundle streamed over SSH with the allocation's key, crun run in the guest, GET /healthz on the guest's private address")}
	t.Logf("%s = %.3f %s", ms[0].Metric, ms[0].Value, ms[0].Unit)
	require.NoError(t, bench.WritePart("app", ms))
}

// sliceApp runs the test and returns the launch's Start-to-healthy time.
func sliceApp(t *testing.T) time.Duration {
	cfg := labHost(t, true)
	realNetwork(t, cfg)
	p, err := buildRuntime(cfg, nil)
	require.NoError(t, err)
	t.Cleanup(p.close) // after the release below (cleanups run last first)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	wd, _ := os.Getwd()
	root, err := guest.FindModuleRoot(wd)
	require.NoError(t, err)
	img, err := apps.Build(ctx, root, apps.Hello, filepath.Join(t.TempDir(), "hello.oci.tar"))
	require.NoError(t, err)

	res, err := p.rt.Provision(ctx, cfg.Request, nil)
	if err != nil {
		logSerial(t, cfg)
	}
	require.NoError(t, err)
	alloc := cfg.Request.AllocationID
	guestIP := res.Access.GuestIP
	t.Cleanup(func() {
		if _, err := p.rt.Release(context.Background(), ReleaseRequest{AllocationID: alloc}, nil); err != nil {
			t.Errorf("release: %v", err)
		}
	})

	stateDir := t.TempDir()
	runner, err := apprun.NewGuest(apprun.GuestConfig{StateDir: stateDir,
		Key: func(_ context.Context, a string) (ssh.Signer, error) { return p.rt.GuestKey(a) }})
	require.NoError(t, err)
	spec := apprun.Spec{InstanceID: "app-" + randHex(t, 4), AllocationID: alloc, ImagePath: img.Path, GuestAddr: guestIP,
		App: proto.App{Name: "hello", Version: "1.0.0", Kind: proto.AppKind("oci"), Image: img.Ref,
			Ports:       []proto.AppPort{{Name: "http", Port: 8080, Protocol: "http"}},
			HealthCheck: &proto.AppHealthCheck{Port: 8080, Path: "/healthz", TimeoutSeconds: 60}}}

	start := time.Now()
	st, err := runner.Start(ctx, spec)
	launch := time.Since(start)
	if err != nil || st.State != apprun.StateRunning {
		logSerial(t, cfg)
		if logs, lerr := runner.Logs(ctx, spec.InstanceID, 4096); lerr == nil {
			t.Logf("app output:\n%s", logs)
		}
	}
	require.NoError(t, err)
	require.Equal(t, apprun.StateRunning, st.State, st.Detail)
	t.Logf("app launch to healthy in the guest: %.2f s", launch.Seconds())
	require.Equal(t, guestIP+":8080", st.Endpoints[8080], "the app's port is on the guest's private address")

	get := func(url string) string {
		c := http.Client{Timeout: 10 * time.Second}
		resp, err := c.Get(url)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.Equal(t, 200, resp.StatusCode, string(b))
		return string(b)
	}
	require.Contains(t, get("http://"+guestIP+":8080/"), spec.InstanceID)

	// What runs in the guest: one crun container, its bundle under
	// /run/gpuaas/apps.
	key, err := p.rt.GuestKey(alloc)
	require.NoError(t, err)
	guestRun := func(cmd string) string {
		c, err := ssh.Dial("tcp", guestIP+":22", &ssh.ClientConfig{User: "root", Auth: []ssh.AuthMethod{ssh.PublicKeys(key)},
			HostKeyCallback: ssh.InsecureIgnoreHostKey(), Timeout: 20 * time.Second})
		require.NoError(t, err)
		defer c.Close()
		s, err := c.NewSession()
		require.NoError(t, err)
		defer s.Close()
		out, err := s.CombinedOutput(cmd)
		require.NoError(t, err, "%s: %s", cmd, out)
		return string(out)
	}
	list := func() []string {
		var ids []string
		for _, l := range strings.Split(guestRun("/usr/bin/crun list -q"), "\n") {
			if l = strings.TrimSpace(l); l != "" {
				ids = append(ids, l)
			}
		}
		return ids
	}
	require.Equal(t, []string{"gpuaas-app-" + spec.InstanceID}, list())

	// A restarted agent calls Start again: the same instance, no second.
	again, err := apprun.NewGuest(apprun.GuestConfig{StateDir: stateDir,
		Key: func(_ context.Context, a string) (ssh.Signer, error) { return p.rt.GuestKey(a) }})
	require.NoError(t, err)
	st2, err := again.Start(ctx, spec)
	require.NoError(t, err)
	require.Equal(t, apprun.StateRunning, st2.State)
	require.Equal(t, st.StartedAt, st2.StartedAt, "the same container")
	require.Len(t, list(), 1, "Start twice: one container")
	logs, err := again.Logs(ctx, spec.InstanceID, 1024)
	require.NoError(t, err)
	require.Contains(t, string(logs), "listening on :8080")

	require.NoError(t, again.Stop(ctx, spec.InstanceID))
	require.Empty(t, list())
	require.NotContains(t, guestRun("ls /run/gpuaas/apps"), "gpuaas-app-", "the bundle is removed")
	_, err = again.Status(ctx, spec.InstanceID)
	require.ErrorIs(t, err, apprun.ErrNotFound)
	return launch
}
