package apprun_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/agent/apprun"
	"github.com/gpuaas/gpuaas/images/apps"
	"github.com/gpuaas/gpuaas/images/guest"
	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/test/testenv"
)

var (
	helloOnce  sync.Once
	helloBuilt apps.Built
	helloErr   error
)

// helloImage builds the repository's hello app image once per test binary.
func helloImage(t *testing.T) apps.Built {
	t.Helper()
	helloOnce.Do(func() {
		wd, _ := os.Getwd()
		root, err := guest.FindModuleRoot(wd)
		if err != nil {
			helloErr = err
			return
		}
		dir, err := os.MkdirTemp("", "gpuaas-hello-")
		if err != nil {
			helloErr = err
			return
		}
		helloBuilt, helloErr = apps.Build(context.Background(), root, apps.Hello, filepath.Join(dir, "hello.oci.tar"))
	})
	require.NoError(t, helloErr)
	return helloBuilt
}

// helloSpec is an instance of the hello app.
func helloSpec(t *testing.T, id string) apprun.Spec {
	b := helloImage(t)
	return apprun.Spec{InstanceID: id, AllocationID: "alloc-" + id, ImagePath: b.Path,
		Env: map[string]string{"GREETING": "x"},
		App: proto.App{Name: "hello", Version: "1.0.0", Kind: proto.AppKind("oci"), Image: b.Ref,
			Ports:       []proto.AppPort{{Name: "http", Port: 8080, Protocol: "http"}},
			HealthCheck: &proto.AppHealthCheck{Port: 8080, Path: "/healthz", TimeoutSeconds: 30}}}
}

func httpGet(t *testing.T, url string) string {
	t.Helper()
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, 200, resp.StatusCode, string(b))
	return string(b)
}

// TestPrivilegedLocalRunner runs the hello app's OCI image with crun in a
// network namespace: started, healthy, reachable, Start again converges on
// the one container, logs, Stop leaves nothing behind.
func TestPrivilegedLocalRunner(t *testing.T) {
	testenv.Root(t)
	testenv.Commands(t, "ip")
	rt, err := apprun.DefaultLocalRuntime()
	if err != nil {
		testenv.Missing(t, "an OCI runtime", err.Error())
	}
	dir := t.TempDir()
	l, err := apprun.NewLocal(apprun.LocalConfig{Dir: dir})
	require.NoError(t, err)
	s := helloSpec(t, "loc-"+strings.ToLower(randHex(t)))
	t.Cleanup(func() { l.Stop(context.Background(), s.InstanceID) })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	start := time.Now()
	st, err := l.Start(ctx, s)
	require.NoError(t, err)
	require.Equal(t, apprun.StateRunning, st.State, st.Detail)
	t.Logf("local start to healthy: %s", time.Since(start).Round(time.Millisecond))
	ep := st.Endpoints[8080]
	require.NotEmpty(t, ep)
	require.Contains(t, httpGet(t, "http://"+ep+"/"), s.InstanceID)

	// The app runs under crun, in its own pid namespace, as nobody.
	out, err := exec.Command(rt, "--root", filepath.Join(dir, "runtime"), "list", "-q").Output()
	require.NoError(t, err)
	require.Equal(t, []string{apprun.ContainerName(s.InstanceID)}, strings.Fields(string(out)))

	st2, err := l.Start(ctx, s)
	require.NoError(t, err)
	require.Equal(t, apprun.StateRunning, st2.State)
	require.Equal(t, ep, st2.Endpoints[8080])
	out, err = exec.Command(rt, "--root", filepath.Join(dir, "runtime"), "list", "-q").Output()
	require.NoError(t, err)
	require.Len(t, strings.Fields(string(out)), 1, "Start twice: one container")

	// A second runner on the same state (an agent restart) sees it.
	l2, err := apprun.NewLocal(apprun.LocalConfig{Dir: dir})
	require.NoError(t, err)
	st3, err := l2.Status(ctx, s.InstanceID)
	require.NoError(t, err)
	require.Equal(t, apprun.StateRunning, st3.State)

	logs, err := l.Logs(ctx, s.InstanceID, 1<<10)
	require.NoError(t, err)
	require.Contains(t, string(logs), "listening on :8080")

	require.NoError(t, l.Stop(ctx, s.InstanceID))
	_, err = l.Status(ctx, s.InstanceID)
	require.ErrorIs(t, err, apprun.ErrNotFound)
	require.NoFileExists(t, "/run/netns/"+apprun.NetnsName(s.InstanceID))
	require.NoDirExists(t, filepath.Join(dir, "bundles", apprun.ContainerName(s.InstanceID)))
	out, err = exec.Command(rt, "--root", filepath.Join(dir, "runtime"), "list", "-q").Output()
	require.NoError(t, err)
	require.Empty(t, strings.TrimSpace(string(out)))
	require.NoError(t, l.Stop(ctx, s.InstanceID), "stopping a stopped instance is not an error")
}

// TestPrivilegedLocalRunnerFailedHealth: an app that never answers its
// health check is failed with the reason, and Stop clears it.
func TestPrivilegedLocalRunnerFailedHealth(t *testing.T) {
	testenv.Root(t)
	testenv.Commands(t, "ip")
	_, err := apprun.DefaultLocalRuntime()
	if err != nil {
		testenv.Missing(t, "an OCI runtime", err.Error())
	}
	l, err := apprun.NewLocal(apprun.LocalConfig{Dir: t.TempDir()})
	require.NoError(t, err)
	s := helloSpec(t, "bad-"+strings.ToLower(randHex(t)))
	s.App.HealthCheck = &proto.AppHealthCheck{Port: 8080, Path: "/nope", TimeoutSeconds: 3}
	t.Cleanup(func() { l.Stop(context.Background(), s.InstanceID) })
	st, err := l.Start(context.Background(), s)
	require.NoError(t, err)
	require.Equal(t, apprun.StateFailed, st.State)
	require.Contains(t, st.Detail, "404")
	require.NoError(t, l.Stop(context.Background(), s.InstanceID))
	require.NoFileExists(t, "/run/netns/"+apprun.NetnsName(s.InstanceID))
}

func randHex(t *testing.T) string {
	t.Helper()
	b := make([]byte, 4)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return hex.EncodeToString(b)
}

// TestPrivilegedLocalRunnerRecoversCutShortStart: an instance whose
// container is gone but whose record, network namespace and veth pair
// remain (an agent killed mid-launch) starts again at once under the same
// names.
func TestPrivilegedLocalRunnerRecoversCutShortStart(t *testing.T) {
	testenv.Root(t)
	testenv.Commands(t, "ip")
	rt, err := apprun.DefaultLocalRuntime()
	if err != nil {
		testenv.Missing(t, "an OCI runtime", err.Error())
	}
	dir := t.TempDir()
	l, err := apprun.NewLocal(apprun.LocalConfig{Dir: dir})
	require.NoError(t, err)
	s := helloSpec(t, "cut-"+randHex(t))
	t.Cleanup(func() { l.Stop(context.Background(), s.InstanceID) })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	st, err := l.Start(ctx, s)
	require.NoError(t, err)
	require.Equal(t, apprun.StateRunning, st.State, st.Detail)
	out, err := exec.Command(rt, "--root", filepath.Join(dir, "runtime"), "delete", "--force", apprun.ContainerName(s.InstanceID)).CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.FileExists(t, "/run/netns/"+apprun.NetnsName(s.InstanceID))

	st, err = l.Start(ctx, s)
	require.NoError(t, err)
	require.Equal(t, apprun.StateRunning, st.State, st.Detail)
	require.Contains(t, httpGet(t, "http://"+st.Endpoints[8080]+"/"), s.InstanceID)
	require.NoError(t, l.Stop(ctx, s.InstanceID))
	require.NoFileExists(t, "/run/netns/"+apprun.NetnsName(s.InstanceID))
}
