package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/agent/apprun"
	"github.com/gpuaas/gpuaas/coordinator/cli"
	"github.com/gpuaas/gpuaas/images/apps"
	"github.com/gpuaas/gpuaas/images/guest"
	"github.com/gpuaas/gpuaas/lab/fleet"
	"github.com/gpuaas/gpuaas/lab/launch"
	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/test/testenv"
)

// TestPrivilegedLabWebConsoleApp is the tenant's app path in the web
// console on the lab: the admin publishes, uploads and approves the
// repository's hello app (its OCI image layout, built here); the tenant
// launches a slice through the wizard, launches hello on it from the
// slice's apps page, sees the instance reach running without reloading
// (the lab agent's local runner runs it with crun in a network namespace
// of its own), and opens it through the page's Open link: hello's page
// loads through the console and the workload proxy in the browser.
func TestPrivilegedLabWebConsoleApp(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the lab's processes and a browser")
	}
	testenv.Root(t)
	testenv.Commands(t, "ip")
	if _, err := apprun.DefaultLocalRuntime(); err != nil {
		testenv.Missing(t, "an OCI runtime", err.Error())
	}
	chromium, err := exec.LookPath("chromium")
	require.NoError(t, err, "Debian's chromium package is needed (make deps installs it)")
	bin := buildBinaries(t)
	dir := t.TempDir()
	l := startLab(t, bin, dir)
	labLogs(t, dir)
	var toks struct{ Admin, Tenant string }
	b, err := os.ReadFile(filepath.Join(dir, "tokens.secret.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &toks))
	require.NotEmpty(t, toks.Tenant, "the lab mints a tenant token")
	var addr string
	for _, e := range l.env {
		if v, ok := strings.CutPrefix(e, "GPUAAS_ADDR="); ok {
			addr = v
		}
	}
	require.NotEmpty(t, addr)
	adminAPI, err := fleet.NewAPI(addr, toks.Admin, launch.CAFile(dir))
	require.NoError(t, err)

	// The admin: hello's OCI layout into the catalog (what `make
	// app-image` builds), uploaded and approved.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	wd, _ := os.Getwd()
	root, err := guest.FindModuleRoot(wd)
	require.NoError(t, err)
	built, err := apps.Build(ctx, root, apps.Hello, filepath.Join(t.TempDir(), "hello.oci.tar"))
	require.NoError(t, err)
	layout, err := os.ReadFile(built.Path)
	require.NoError(t, err)
	body := proto.AppBody{Kind: proto.AppOCI, Image: apps.Hello.Repository + "@sha256:" + built.ArchiveSHA256, ImageSize: built.Size,
		Description: "hello, through the web console",
		Compat:      proto.AppCompat{Shapes: []proto.CapacityShape{proto.ShapeGPUSlice}, MinGPUs: 1},
		Ports:       []proto.AppPort{{Name: "http", Port: 8080, Protocol: "http"}}, HealthCheck: &proto.AppHealthCheck{Port: 8080, Path: "/healthz", TimeoutSeconds: 60}}
	_, err = adminAPI.C.Do(ctx, http.MethodPut, "/v1/apps/hello/1.0.0", nil, body, nil)
	require.NoError(t, err)
	_, err = adminAPI.C.Do(ctx, http.MethodPut, "/v1/apps/hello/1.0.0/blob", nil, cli.RawBody{Data: layout, ContentType: "application/octet-stream"}, nil)
	require.NoError(t, err)
	_, err = adminAPI.C.Do(ctx, http.MethodPost, "/v1/apps/hello/1.0.0/approve", nil, proto.AppApproveBody{Note: "e2e web console"}, nil)
	require.NoError(t, err)

	// The tenant: a slice through the wizard, then hello on it.
	base := strings.TrimSuffix(addr, "/") + "/ui/"
	tn := startBrowser(t, chromium, base, consoleOutDir(t))
	tn.signIn(toks.Tenant)
	alloc := tn.launchSlice("", "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPuR4dJ6x1t7o9b0b3mO6lq7c1m0m4Zq0qG6Y3m2r2bD tenant")
	tn.waitSSHReady(90 * time.Second)
	tn.run("apps of the slice", chromedp.Navigate(base+"apps?allocation="+alloc), chromedp.WaitVisible(chromedp.ID("compatible-apps")))
	assert.Contains(t, tn.text("#compatible-apps"), "hello, through the web console")
	start := time.Now()
	tn.run("launch hello", chromedp.Click(chromedp.CSS(`#compatible-apps button.launch-app[data-app=hello]`)), chromedp.WaitVisible(chromedp.ID("msg")))
	assert.Regexp(t, `^hello:1\.0\.0 launching on `+alloc+` \(instance \S+, pending\)$`, tn.text("#msg"))
	// No navigation from here: the card polls until the instance settles.
	tn.waitJS("hello reaches running, live", `(() => { const r = document.querySelector('#app-instances tr[data-app=hello]');
		return r && (r.dataset.state == 'running' || r.dataset.state == 'failed'); })()`, 3*time.Minute)
	require.Equal(t, "running", tn.attr(`#app-instances tr[data-app=hello]`, "data-state"), tn.text("#app-instances"))
	t.Logf("apps page Launch to running: %s", time.Since(start).Round(time.Millisecond))
	tn.shot("app-running")

	// Open: the link the page offers (a new tab in a user's browser; this
	// tab here), through the console's session into the workload proxy.
	href := tn.attr(`#app-instances a.open-app`, "href")
	require.Equal(t, "/ui/allocations/"+alloc+"/apps/hello/open/", href)
	tn.run("open hello", chromedp.Navigate(strings.TrimSuffix(addr, "/")+href), chromedp.WaitVisible(chromedp.CSS("body")))
	tn.waitJS("hello's page through the proxy", `document.body && document.body.innerText.includes('hello from gpuaas app')`, 30*time.Second)
	tn.shot("app-open")

	tn.release(alloc, 90*time.Second)
}

// attr is an attribute of the first element sel matches ("" when none).
func (b *browser) attr(sel, name string) string {
	b.t.Helper()
	q, err := json.Marshal(sel)
	require.NoError(b.t, err)
	n, err := json.Marshal(name)
	require.NoError(b.t, err)
	var v string
	b.eval(`(() => { const e = document.querySelector(`+string(q)+`); return e ? (e.getAttribute(`+string(n)+`) || '') : ''; })()`, &v)
	return v
}
