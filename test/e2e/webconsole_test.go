package e2e

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/gpuaas/gpuaas/agent/slice"
	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/lab/hostsim"
	"github.com/gpuaas/gpuaas/lab/simslice"
	"github.com/gpuaas/gpuaas/proto"
)

// consoleOutDir is where the console test writes its screenshots: the
// GPUAAS_TEST_OUTPUT folder when set (CI keeps it), else the test's temp
// folder.
func consoleOutDir(t *testing.T) string {
	if d := os.Getenv("GPUAAS_TEST_OUTPUT"); d != "" {
		dir := filepath.Join(d, "console")
		require.NoError(t, os.MkdirAll(dir, 0o755))
		return dir
	}
	return t.TempDir()
}

// browser is one signed-in user: a browser context of its own (its own
// cookies) in a shared headless Chromium.
type browser struct {
	t    *testing.T
	ctx  context.Context
	base string // the console's URL, from the lab's env file
	out  string
}

func (b *browser) run(what string, steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 90*time.Second)
	defer cancel()
	err := chromedp.Do(ctx, steps...)
	// Chromium aborts a page load when the host's interfaces change, and
	// the package's other tests create and delete veths and bridges
	// meanwhile; every step list starts with its Navigate, so run it again.
	for try := 0; try < 3 && err != nil && strings.Contains(err.Error(), "ERR_NETWORK_CHANGED"); try++ {
		b.t.Logf("%s: %v; again", what, err)
		err = chromedp.Do(ctx, steps...)
	}
	if err != nil {
		pctx, pcancel := context.WithTimeout(b.ctx, 10*time.Second)
		defer pcancel()
		page, _ := chromedp.Run(pctx, chromedp.Evaluate[string](`location.href + "\n" + document.body.innerText`))
		b.t.Fatalf("%s: %v; page:\n%s", what, err, page)
	}
}

// evalJS evaluates js in the page (awaiting a promise) into a T.
func evalJS[T any](b *browser, js string) T {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 90*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](js, chromedp.EvalAwaitPromise))
	require.NoError(b.t, err, "evaluate %s", js)
	return v
}

func (b *browser) eval(js string, out any) {
	b.t.Helper()
	raw := evalJS[json.RawMessage](b, js)
	require.NoError(b.t, json.Unmarshal(raw, out), "decode %s", raw)
}

func (b *browser) shot(name string) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 90*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(b.t, err, "screenshot %s", name)
	require.NoError(b.t, os.WriteFile(filepath.Join(b.out, name+".png"), png, 0o644))
}

// waitJS polls a JavaScript condition (the page updates itself; nothing
// reloads it).
func (b *browser) waitJS(what, cond string, bound time.Duration) {
	b.t.Helper()
	deadline := time.Now().Add(bound)
	for {
		var ok bool
		b.eval("!!("+cond+")", &ok)
		if ok {
			return
		}
		if time.Now().After(deadline) {
			var body string
			b.eval("document.body.innerText", &body)
			b.t.Fatalf("%s: not within %v; page:\n%s", what, bound, body)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// startBrowser starts a headless Chromium of its own for one user (its own
// cookies: a new browser context in one Chromium hangs page actions with
// chromedp v0.23.0).
func startBrowser(t *testing.T, chromium, base, out string) *browser {
	t.Helper()
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(chromium), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-dev-shm-usage", true), chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
		// The lab serves HTTPS from its own CA (.lab/ca.pem), which this
		// throwaway browser profile does not hold; the other clients of
		// the test (gpuaasctl, the API client) verify it.
		chromedp.Flag("ignore-certificate-errors", true),
		chromedp.WindowSize(1280, 900))
	t.Cleanup(cancelAlloc)
	ctx, cancel := chromedp.NewContext(alloc)
	t.Cleanup(cancel)
	require.NoError(t, chromedp.Do(ctx), "start chromium")
	return &browser{t: t, ctx: ctx, base: base, out: out}
}

// typeInto types s into the serial console page's terminal (xterm.js's
// input element; "\r" is Enter).
func (b *browser) typeConsole(s string) {
	b.t.Helper()
	// Text goes in as one insertText (an input event, as from an IME) and
	// Enter as a bare key press: chromedp.SendKeys' keydown plus char
	// events would reach xterm.js twice.
	b.run("type "+strconv.Quote(s), chromedp.Focus(chromedp.CSS(".xterm-helper-textarea")),
		chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
			for i, part := range strings.Split(s, "\r") {
				if i > 0 {
					for _, typ := range []input.DispatchKeyEventType{input.DispatchKeyEventTypeRawKeyDown, input.DispatchKeyEventTypeKeyUp} {
						if _, err := cdp.Call(ctx, t, input.DispatchKeyEvent, input.DispatchKeyEventParams{Type: typ, Key: "Enter", Code: "Enter", WindowsVirtualKeyCode: 13}); err != nil {
							return err
						}
					}
				}
				if part != "" {
					if _, err := cdp.Call(ctx, t, input.InsertText, input.InsertTextParams{Text: part}); err != nil {
						return err
					}
				}
			}
			return nil
		}))
}

// waitConsole waits for want in the console page's terminal text.
func (b *browser) waitConsole(want string, bound time.Duration) {
	b.t.Helper()
	b.waitJS("console shows "+strconv.Quote(want), "window.gpuaasConsoleText && gpuaasConsoleText().includes("+strconv.Quote(want)+")", bound)
}

// launchSlice runs the wizard for a 1-GPU slice (image "": the site's
// default) and returns the new allocation's ID from the page it lands on.
func (b *browser) launchSlice(image, key string) string {
	b.t.Helper()
	b.run("launch", chromedp.Navigate(b.base+"launch"), chromedp.WaitVisible(chromedp.ID("wizard")))
	b.waitJS("a 1-GPU slice placeable", `document.querySelector('#shape-slice-1 input') && !document.querySelector('#shape-slice-1 input').disabled`, 60*time.Second)
	steps := []chromedp.Action[chromedp.Void]{chromedp.Click(chromedp.CSS(`#shape-slice-1 input`))}
	if image != "" {
		steps = append(steps, chromedp.SetValue(chromedp.ID("image"), image))
	}
	steps = append(steps, chromedp.SendKeys(chromedp.ID("ssh-key"), key), chromedp.Click(chromedp.ID("review")), chromedp.WaitVisible(chromedp.ID("create")))
	b.run("fill the wizard", steps...)
	b.run("create", chromedp.Click(chromedp.ID("create")), chromedp.WaitVisible(chromedp.ID("timeline")))
	var path string
	b.eval(`location.pathname`, &path)
	id, ok := strings.CutPrefix(path, "/ui/allocations/")
	require.True(b.t, ok, "the wizard lands on the allocation page: %s", path)
	return id
}

// waitSSHReady waits for the allocation page (which updates itself) to
// show the slice active with ssh_ready succeeded.
func (b *browser) waitSSHReady(bound time.Duration) {
	b.t.Helper()
	b.waitJS("the timeline reaches ssh_ready, live", `document.querySelector('#state').innerText == 'active' &&
		document.querySelector('tr[data-stage=ssh_ready]') && document.querySelector('tr[data-stage=ssh_ready]').className == 'g-succeeded'`, bound)
}

// release releases the allocation on its page, with the confirmation,
// and waits for the page to show it released.
func (b *browser) release(id string, bound time.Duration) {
	b.t.Helper()
	b.run("release "+id, chromedp.Navigate(b.base+"allocations/"+id), chromedp.WaitVisible(chromedp.ID("release")),
		chromedp.Click(chromedp.ID("release")), chromedp.WaitVisible(chromedp.ID("confirm-release")),
		chromedp.Click(chromedp.ID("confirm-release")), chromedp.WaitVisible(chromedp.ID("msg")))
	b.waitJS("released, live", `document.querySelector('#state').innerText == 'released'`, bound)
}

// labLogs is the tail of the lab's logs when the test failed.
func labLogs(t *testing.T, dir string) {
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("lab logs:\n%s", logTails(dir))
		}
	})
}

func (b *browser) signIn(token string) {
	b.t.Helper()
	b.run("sign in",
		chromedp.Navigate(b.base+"login"),
		chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SendKeys(chromedp.ID("token"), token),
		chromedp.Click(chromedp.ID("signin")),
		chromedp.WaitVisible(chromedp.ID("who")),
	)
}

func (b *browser) text(sel string) string {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 90*time.Second)
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
	require.NoError(b.t, err, "text of %s", sel)
	return s
}

// post sends a POST from the page (same origin, the session cookie) and
// returns the status and body.
func (b *browser) post(path string, form map[string]string) (int, string) {
	b.t.Helper()
	fb, _ := json.Marshal(form)
	var res struct {
		Status int    `json:"status"`
		Body   string `json:"body"`
	}
	b.eval(fmt.Sprintf(`(async () => { const r = await fetch(%q, {method: "POST", body: new URLSearchParams(%s), redirect: "manual"});
		return {status: r.status, body: await r.text()}; })()`, path, fb), &res)
	return res.Status, res.Body
}

func (b *browser) csrf() string {
	var s string
	b.eval(`document.querySelector('input[name=csrf]').value`, &s)
	return s
}

// TestLabWebConsole drives the web console in a real headless Chromium
// against a real lab (3 coordinators, agents on simulated hosts, the
// simulated slice runtime): an operator launches a 1-GPU slice through
// the wizard and watches its timeline reach ssh_ready, sees a disabled
// region it cannot pick and the scheduler's reason for an 8-GPU slice
// that does not fit, releases the slice; an admin approves a candidate,
// disables and repairs a slot and sees a drifted node flagged; a viewer
// sees no write controls and its forged POST is refused by the API; a
// POST without the CSRF token is refused. Each main page is saved as a
// screenshot.
func TestLabWebConsole(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the lab's processes and a browser")
	}
	chromium, err := exec.LookPath("chromium")
	require.NoError(t, err, "Debian's chromium package is needed (make deps installs it)")
	bin := buildBinaries(t)
	dir := t.TempDir()
	l := startLab(t, bin, dir, "-auto-approve=false")
	labLogs(t, dir)
	admin := adminCtl(t, l)
	var toks struct{ Admin, Operator, Viewer, Tenant string }
	b, err := os.ReadFile(filepath.Join(dir, "tokens.secret.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &toks))
	var addr string
	for _, e := range l.env {
		if v, ok := strings.CutPrefix(e, "GPUAAS_ADDR="); ok {
			addr = v
		}
	}
	require.NotEmpty(t, addr)
	base := strings.TrimSuffix(addr, "/") + "/ui/"
	out := consoleOutDir(t)
	t.Logf("screenshots in %s", out)

	// A second region, not open yet.
	_, err = admin("region", "set", "lab-west", "--disabled")
	require.NoError(t, err)

	user := func() *browser { return startBrowser(t, chromium, base, out) }

	// --- admin: approve candidates, disable and repair a slot ---
	adm := user()
	adm.signIn(toks.Admin)
	adm.run("node page", chromedp.Navigate(base+"nodes/j22u15"), chromedp.WaitVisible(chromedp.ID("pairs")))
	adm.waitJS("candidates discovered", `document.querySelectorAll('#pairs button.approve').length == 8`, 30*time.Second)
	adm.run("approve candidate 0", chromedp.Click(chromedp.CSS(`#pair-0 button.approve`)), chromedp.WaitVisible(chromedp.ID("msg")))
	assert.Contains(t, adm.text("#msg"), "candidate 0 approved as slot j22u15-s0")
	assert.Contains(t, adm.text("#pair-0"), "j22u15-s0", "read-your-writes: the page after the write shows the new slot")
	for i := 1; i < 8; i++ {
		_, err := admin("slot", "approve", "j22u15", fmt.Sprint(i))
		require.NoError(t, err)
	}
	// A candidate the completeness gate refuses: the page says why.
	adm.run("j22u11", chromedp.Navigate(base+"nodes/j22u11"), chromedp.WaitVisible(chromedp.ID("pairs")))
	adm.waitJS("j22u11 discovered", `document.querySelectorAll('#pairs button.approve').length > 0`, 30*time.Second)
	var mountedRow string
	adm.eval(`(() => { const r = [...document.querySelectorAll('#pairs tr')].find(r => r.innerText.includes('disk mounted')); return r ? r.id : ''; })()`, &mountedRow)
	require.NotEmpty(t, mountedRow, "j22u11 has a candidate whose disk is mounted")
	adm.run("approve the mounted candidate", chromedp.Click(chromedp.CSS("#"+mountedRow+" button.approve")), chromedp.WaitVisible(chromedp.ID("error")))
	assert.Contains(t, adm.text("#error"), "is mounted or has mounted children", "the completeness gate's reason")
	adm.run("disable a slot", chromedp.Navigate(base+"nodes/j22u15"),
		chromedp.SendKeys(chromedp.CSS(`#pair-7 input[name=reason]`), "ui test"),
		chromedp.Click(chromedp.CSS(`#pair-7 button.disable`)), chromedp.WaitVisible(chromedp.ID("msg")))
	assert.Contains(t, adm.text("#pair-7"), "disabled")
	adm.shot("node")

	// --- operator: the wizard ---
	op := user()
	op.signIn(toks.Operator)
	op.run("launch", chromedp.Navigate(base+"launch"), chromedp.WaitVisible(chromedp.ID("wizard")))
	op.waitJS("slice-ready host placeable", `document.querySelector('#shape-slice-1 input') && !document.querySelector('#shape-slice-1 input').disabled`, 30*time.Second)
	var disabled bool
	op.eval(`document.querySelector('#region-lab-west input').disabled`, &disabled)
	assert.True(t, disabled, "a disabled region is shown but cannot be picked")
	assert.Contains(t, op.text("#region-lab-west"), "not yet open")
	op.eval(`document.querySelector('#shape-slice-8 input').disabled`, &disabled)
	assert.True(t, disabled, "8 GPUs do not fit with a slot disabled")
	assert.Contains(t, op.text("#shape-slice-8"), "no node has 8", "the scheduler's reason is shown")
	// Storage: the slot's raw NVMe with its size (hostsim's lab disks).
	assert.Regexp(t, `Raw NVMe per GPU: at least [0-9.]+ [KMGT]iB`, op.text("#disk-size"))
	assert.Regexp(t, `1 × raw NVMe, at least [0-9.]+ [KMGT]iB each`, op.text("#shape-slice-1"))
	op.shot("wizard")
	op.run("fill the wizard",
		chromedp.Click(chromedp.CSS(`#shape-slice-1 input`)),
		chromedp.SendKeys(chromedp.ID("ssh-key"), "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPuR4dJ6x1t7o9b0b3mO6lq7c1m0m4Zq0qG6Y3m2r2bD ui-test"),
		chromedp.Click(chromedp.ID("review")), chromedp.WaitVisible(chromedp.ID("create")))
	assert.Regexp(t, `^1 × raw NVMe, at least [0-9.]+ [KMGT]iB each$`, op.text("#review-storage"), "the review shows the disk size")
	op.shot("review")
	// A double submit of the same review form makes one allocation.
	var finals []string
	op.eval(`(async () => { const f = document.getElementById('create-form');
		const rs = await Promise.all([fetch(f.action, {method: "POST", body: new URLSearchParams(new FormData(f))}),
			fetch(f.action, {method: "POST", body: new URLSearchParams(new FormData(f))})]);
		return rs.map(r => new URL(r.url).pathname); })()`, &finals)
	require.Len(t, finals, 2)
	assert.Equal(t, finals[0], finals[1], "both submits land on the same allocation")
	require.True(t, strings.HasPrefix(finals[0], "/ui/allocations/"), finals[0])
	allocID := strings.TrimPrefix(finals[0], "/ui/allocations/")
	out2, err := l.ctl(t, "alloc", "list", "-o", "json")
	require.NoError(t, err, out2)
	assert.Equal(t, 1, strings.Count(out2, `"idempotency_key"`), "one allocation for the double submit: %s", out2)
	op.run("allocation page", chromedp.Navigate(base+"allocations/"+allocID), chromedp.WaitVisible(chromedp.ID("timeline")))
	op.waitJS("the timeline reaches ssh_ready, live", `document.querySelector('#state').innerText == 'active' &&
		document.querySelector('tr[data-stage=ssh_ready]') && document.querySelector('tr[data-stage=ssh_ready]').className == 'g-succeeded'`, 60*time.Second)
	assert.Contains(t, op.text("#ssh-command"), "ssh")
	assert.Contains(t, op.text("#claims"), "j22u15-s", "the claim names its slot")
	op.shot("allocation")
	op.run("allocations list", chromedp.Navigate(base+"allocations"), chromedp.WaitVisible(chromedp.ID("allocations")))
	op.shot("allocations")

	// --- viewer: no write controls; a forged POST is refused by the API ---
	vw := user()
	vw.signIn(toks.Viewer)
	vw.run("viewer node page", chromedp.Navigate(base+"nodes/j22u15"), chromedp.WaitVisible(chromedp.ID("pairs")))
	var controls int
	vw.eval(`document.querySelectorAll('main form[method=post], #nav-launch, #release').length`, &controls)
	assert.Zero(t, controls, "a viewer sees no write controls")
	vw.run("viewer allocation page", chromedp.Navigate(base+"allocations/"+allocID), chromedp.WaitVisible(chromedp.ID("timeline")))
	vw.eval(`document.querySelectorAll('main form[method=post], #release').length`, &controls)
	assert.Zero(t, controls)
	status, body := vw.post("/ui/slots/j22u15-s0/disable", map[string]string{"csrf": vw.csrf(), "reason": "forged"})
	assert.Equal(t, 403, status)
	assert.Contains(t, body, "needs role admin", "the API refused it")
	status, body = vw.post("/ui/allocations/"+allocID+"/release", map[string]string{"csrf": vw.csrf(), "confirm": allocID})
	assert.Equal(t, 403, status)
	assert.Contains(t, body, "needs role operator")
	// Missing CSRF token: refused before the API, even for an admin.
	adm.run("admin slots page", chromedp.Navigate(base+"slots?node=j22u15"), chromedp.WaitVisible(chromedp.ID("slots")))
	status, body = adm.post("/ui/slots/j22u15-s6/disable", map[string]string{"reason": "no csrf"})
	assert.Equal(t, 403, status)
	assert.Contains(t, body, "CSRF")
	status, _ = adm.post("/ui/slots/j22u15-s6/disable", map[string]string{"reason": "wrong csrf", "csrf": "x" + adm.csrf()})
	assert.Equal(t, 403, status)
	var s6 proto.Slot
	o, err := admin("slot", "show", "j22u15-s6", "-o", "json")
	require.NoError(t, err, o)
	require.NoError(t, json.Unmarshal([]byte(o), &s6), o)
	assert.NotEqual(t, proto.SlotDisabled, s6.Status, "the refused POSTs changed nothing")
	assert.Empty(t, s6.StatusReason)

	// --- tenant: their own slice through the wizard, only their own
	// allocations, the serial console, the apps of their slice ---
	require.NotEmpty(t, toks.Tenant, "the lab mints a tenant token")
	tn := user()
	tn.signIn(toks.Tenant)
	assert.Contains(t, tn.text("#who"), "tenant")
	tenantAlloc := tn.launchSlice("", "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPuR4dJ6x1t7o9b0b3mO6lq7c1m0m4Zq0qG6Y3m2r2bD tenant")
	tn.waitSSHReady(60 * time.Second)
	assert.Contains(t, tn.text("#alloc-sub"), "lab-tenant")
	tn.run("tenant's allocations", chromedp.Navigate(base+"allocations"), chromedp.WaitVisible(chromedp.ID("allocations")))
	mine := tn.text("#allocations")
	assert.Contains(t, mine, tenantAlloc)
	assert.NotContains(t, mine, allocID, "a tenant does not see another owner's allocation")
	tn.shot("tenant-allocations")
	tn.run("another owner's allocation", chromedp.Navigate(base+"allocations/"+allocID), chromedp.WaitVisible(chromedp.ID("error")))
	assert.Contains(t, tn.text("#error"), "does not exist", "answered as a missing one")
	// The serial console (lab/simslice's getty on a pty) in the browser.
	tn.run("console page", chromedp.Navigate(base+"allocations/"+tenantAlloc), chromedp.WaitVisible(chromedp.ID("open-console")),
		chromedp.Click(chromedp.ID("open-console")), chromedp.WaitVisible(chromedp.ID("terminal")))
	tn.waitJS("attached read-write", `document.querySelector('#console-mode').dataset.mode == 'read-write'`, 30*time.Second)
	tn.waitConsole("login: ", 20*time.Second)
	tn.typeConsole(simslice.ConsoleUser + "\r")
	tn.waitConsole("Password: ", 10*time.Second)
	tn.typeConsole(simslice.ConsolePassword + "\r")
	tn.waitConsole("~# ", 10*time.Second)
	tn.typeConsole("hostname\r")
	tn.waitConsole("\n"+slice.DomainName(tenantAlloc), 10*time.Second)
	tn.shot("console")
	// A second session of the same tenant only watches, and says so.
	tn2 := user()
	tn2.signIn(toks.Tenant)
	tn2.run("second console", chromedp.Navigate(base+"allocations/"+tenantAlloc+"/console"), chromedp.WaitVisible(chromedp.ID("terminal")))
	tn2.waitJS("attached read-only", `document.querySelector('#console-mode').dataset.mode == 'read-only'`, 30*time.Second)
	assert.Contains(t, tn2.text("#console-mode"), "another session holds the console read-write")
	tn.typeConsole("echo seen-by-the-watcher\r")
	tn2.waitConsole("seen-by-the-watcher", 10*time.Second)
	tn2.shot("console-readonly")
	tn2.run("leave", chromedp.Click(chromedp.ID("console-disconnect")))
	tn.run("leave", chromedp.Click(chromedp.ID("console-disconnect")))
	tn.waitJS("closed", `document.querySelector('#console-status').dataset.state == 'closed'`, 10*time.Second)
	// Apps: a catalog entry the admin publishes, judged for the tenant's slice.
	manifest := filepath.Join(t.TempDir(), "hello.json")
	require.NoError(t, os.WriteFile(manifest, []byte(`{"kind":"oci","image":"ghcr.io/gpuaas/hello-http@sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
		"description":"a static HTTP app","compat":{"shapes":["gpu_slice"],"min_gpus":1},"ports":[{"name":"http","port":8080,"protocol":"http"}],
		"health_check":{"port":8080,"path":"/"}}`), 0o644))
	for _, args := range [][]string{{"app", "publish", "hello-http:1", manifest}, {"app", "approve", "hello-http:1"}} {
		o, err := admin(args...)
		require.NoError(t, err, o)
	}
	tn.run("apps of the slice", chromedp.Navigate(base+"allocations/"+tenantAlloc), chromedp.WaitVisible(chromedp.ID("open-apps")),
		chromedp.Click(chromedp.ID("open-apps")), chromedp.WaitVisible(chromedp.ID("compatible-apps")))
	assert.Contains(t, tn.text("#compatible-apps"), "hello-http")
	tn.shot("apps")
	tn.run("target picker", chromedp.Navigate(base+"apps/hello-http"), chromedp.WaitVisible(chromedp.ID("target-picker")))
	var picked bool
	tn.eval(`document.querySelector('#target-`+tenantAlloc+` input').checked`, &picked)
	assert.True(t, picked, "the tenant's active slice is a selectable target")
	tn.shot("app-targets")
	// Launch: the coordinator records the instance and the slice's agent
	// takes it. This manifest names an image digest with no blob behind
	// it, so the instance cannot run; the page follows it live out of
	// pending (TestPrivilegedLabWebConsoleApp runs a real app).
	tn.run("launch the app", chromedp.Click(chromedp.ID("launch-app")), chromedp.WaitVisible(chromedp.ID("msg")))
	assert.Regexp(t, `^hello-http:1 launching on `+tenantAlloc+` \(instance \S+, pending\)$`, tn.text("#msg"))
	assert.Contains(t, tn.text("#app-instances"), "hello-http:1")
	tn.waitJS("the instance leaves pending, live", `(() => { const r = document.querySelector('#app-instances tr[data-app=hello-http]');
		return r && r.dataset.state != 'pending'; })()`, 60*time.Second)
	var instState string
	tn.eval(`document.querySelector('#app-instances tr[data-app=hello-http]').dataset.state`, &instState)
	assert.Equal(t, "failed", instState, "no blob behind the digest: the launch fails: %s", tn.text("#app-instances"))
	tn.shot("app-instance")
	tn.release(tenantAlloc, 60*time.Second)

	// --- operator releases with confirmation; the page follows it live ---
	op.release(allocID, 60*time.Second)

	// --- admin repairs the disabled slot; a drifted node is flagged ---
	adm.run("repair", chromedp.Navigate(base+"slots/j22u15-s7"), chromedp.WaitVisible(chromedp.ID("slot-status")),
		chromedp.Click(chromedp.CSS(`button.repair`)), chromedp.WaitVisible(chromedp.ID("msg")))
	assert.Equal(t, "available", adm.text("#slot-status"))
	trail := adm.text("#slot-history")
	assert.Contains(t, trail, "/v1/slots/j22u15-s7/disable", "the slot's lifecycle trail from the audit log")
	assert.Contains(t, trail, "/v1/slots/j22u15-s7/repair")
	assert.Contains(t, adm.text("#breaker"), "closed")
	adm.shot("slot")
	hostsDir, err := readLabHostsDir(dir)
	require.NoError(t, err)
	hroot, err := hostops.NewRoot(filepath.Join(hostsDir, "j22u15"))
	require.NoError(t, err)
	var s5 proto.Slot
	o, err = admin("slot", "show", "j22u15-s5", "-o", "json")
	require.NoError(t, err, o)
	require.NoError(t, json.Unmarshal([]byte(o), &s5))
	require.NoError(t, hostsim.SetDiskSerial(hroot, s5.Capacity.NVMe.Device, "REPLACED0001"))
	adm.run("nodes list", chromedp.Navigate(base+"nodes"), chromedp.WaitVisible(chromedp.ID("nodes")))
	deadline := time.Now().Add(30 * time.Second)
	for {
		var flagged bool
		adm.run("reload nodes", chromedp.Navigate(base+"nodes"), chromedp.WaitVisible(chromedp.ID("nodes")))
		adm.eval(`!!document.querySelector('#node-j22u15 .flag.drift')`, &flagged)
		if flagged {
			break
		}
		require.True(t, time.Now().Before(deadline), "j22u15 flagged drifted within 30 s")
		time.Sleep(500 * time.Millisecond)
	}
	adm.shot("nodes")
	adm.run("drifted node page", chromedp.Navigate(base+"nodes/j22u15"), chromedp.WaitVisible(chromedp.ID("drift-flag")))
	var rowDrifted bool
	adm.eval(`document.querySelector('#pair-5').classList.contains('drifted')`, &rowDrifted)
	assert.True(t, rowDrifted, "the drifted slot's row is highlighted")
	adm.shot("node-drift")
	require.NoError(t, hostsim.SetDiskSerial(hroot, s5.Capacity.NVMe.Device, s5.Capacity.NVMe.Serial))
	adm.run("overview", chromedp.Navigate(base+"overview"), chromedp.WaitVisible(chromedp.ID("peers")))
	adm.shot("overview")
	// The images page with an image in the catalog (sizes are int64: the
	// page once answered 500 for any image).
	imgFile := filepath.Join(t.TempDir(), "tiny.raw")
	require.NoError(t, os.WriteFile(imgFile, bytes.Repeat([]byte{0xA5}, 3<<20), 0o644))
	o, err = admin("image", "push", imgFile, "--name", "ui-tiny", "--version", "1", "--kind", "slice_base")
	require.NoError(t, err, o)
	adm.run("images", chromedp.Navigate(base+"images"), chromedp.WaitVisible(chromedp.ID("images")))
	assert.Contains(t, adm.text("#images"), "ui-tiny:1")
	assert.Contains(t, adm.text("#images"), "3.0 MiB")
	adm.shot("images")

	// Sign out: the session is gone.
	op.run("sign out", chromedp.Navigate(base+"allocations"), chromedp.Click(chromedp.ID("signout")), chromedp.WaitVisible(chromedp.ID("token")))
	op.run("after sign-out", chromedp.Navigate(base+"allocations"), chromedp.WaitVisible(chromedp.ID("token")))
}

// TestPrivilegedLabWebConsoleWizard is the tenant's web console path on a
// real lab VM (j22u15 under libvirt, TCG; see startRealSliceLab): the
// tenant signs in, launches a 1-GPU slice of the lab guest image through
// the wizard, watches the allocation page's timeline fill to ssh_ready,
// reaches the guest with their key, logs in on the VM's serial console
// in the browser, and releases it; the slot comes back wiped.
func TestPrivilegedLabWebConsoleWizard(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a VM")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	chromium, err := exec.LookPath("chromium")
	require.NoError(t, err, "Debian's chromium package is needed (make deps installs it)")
	rl := startRealSliceLab(t, ctx)
	l := rl.l
	admin := &lab{bin: l.bin, env: append(append([]string(nil), l.env...), "GPUAAS_TOKEN="+rl.admin)}
	out, err := admin.ctl(t, "image", "push", rl.img, "--name", "lab-guest", "--version", "v1", "--kind", "slice_base", "--marker-sha256", rl.m.MarkerSHA256)
	require.NoError(t, err, out)
	out, err = admin.ctl(t, "image", "approve", "lab-guest:v1")
	require.NoError(t, err, out)
	var toks struct{ Tenant string }
	b, err := os.ReadFile(filepath.Join(l.dir, "tokens.secret.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &toks))
	require.NotEmpty(t, toks.Tenant)
	var addr string
	for _, e := range l.env {
		if v, ok := strings.CutPrefix(e, "GPUAAS_ADDR="); ok {
			addr = v
		}
	}
	require.NotEmpty(t, addr)
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	signer, err := ssh.NewSignerFromKey(priv)
	require.NoError(t, err)
	tenantKey := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(signer.PublicKey())))

	tn := startBrowser(t, chromium, strings.TrimSuffix(addr, "/")+"/ui/", consoleOutDir(t))
	tn.signIn(toks.Tenant)
	start := time.Now()
	id := tn.launchSlice("lab-guest:v1", tenantKey)
	tn.waitSSHReady(12 * time.Minute)
	t.Logf("wizard to ssh_ready on a real VM: %.1f s", time.Since(start).Seconds())
	for _, stage := range proto.SliceStages {
		var ok bool
		tn.eval(`!!document.querySelector('tr[data-stage=`+stage+`].g-succeeded')`, &ok)
		assert.True(t, ok, "the timeline shows stage %s succeeded", stage)
	}
	tn.shot("allocation-vm")
	var a proto.Allocation
	require.NoError(t, getJSON(ctx, rl.api, "/v1/allocations/"+id, &a))
	require.Equal(t, "lab-tenant", a.Owner)
	require.NotNil(t, a.Access)
	dialGuest(t, a.Access.GuestIP, signer, a.Access.HostKeys...).Close()

	// The VM's serial console in the browser (libvirt's console stream on
	// the agent, through the gateway).
	tn.run("console page", chromedp.Navigate(tn.base+"allocations/"+id+"/console"), chromedp.WaitVisible(chromedp.ID("terminal")))
	tn.waitJS("attached read-write", `document.querySelector('#console-mode').dataset.mode == 'read-write'`, 60*time.Second)
	tn.typeConsole("\r")
	tn.waitConsole("login: ", 60*time.Second)
	tn.typeConsole(labConsoleUser + "\r")
	tn.waitConsole("Password: ", 30*time.Second)
	tn.typeConsole(labConsolePassword + "\r")
	tn.waitConsole("~# ", 30*time.Second)
	tn.typeConsole("cat /run/gpuaas/instance-id\r")
	tn.waitConsole("\ni-", 30*time.Second)
	tn.shot("console-vm")
	tn.run("leave", chromedp.Click(chromedp.ID("console-disconnect")))

	var cl proto.List[proto.Claim]
	require.NoError(t, getJSON(ctx, rl.api, "/v1/allocations/"+id+"/claims", &cl))
	require.Len(t, cl.Items, 1)
	tn.release(id, 5*time.Minute)
	require.Eventually(t, func() bool {
		var s proto.Slot
		return getJSON(ctx, rl.api, "/v1/slots/"+cl.Items[0].SlotID, &s) == nil && s.Status == proto.SlotAvailable && s.WipeProof != nil
	}, 5*time.Minute, time.Second, "the slot returns to available with a wipe proof")
}
