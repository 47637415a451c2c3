package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/lab/hostsim"
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
	if err := chromedp.Do(ctx, steps...); err != nil {
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
	admin := adminCtl(t, l)
	var toks struct{ Admin, Operator, Viewer string }
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

	// One Chromium per user, so each has its own cookies (a new browser
	// context in one Chromium hangs page actions with chromedp v0.23.0).
	user := func() *browser {
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
	op.shot("wizard")
	op.run("fill the wizard",
		chromedp.Click(chromedp.CSS(`#shape-slice-1 input`)),
		chromedp.SendKeys(chromedp.ID("ssh-key"), "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPuR4dJ6x1t7o9b0b3mO6lq7c1m0m4Zq0qG6Y3m2r2bD ui-test"),
		chromedp.Click(chromedp.ID("review")), chromedp.WaitVisible(chromedp.ID("create")))
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

	// --- operator releases with confirmation; the page follows it live ---
	op.run("release", chromedp.Navigate(base+"allocations/"+allocID), chromedp.WaitVisible(chromedp.ID("release")),
		chromedp.Click(chromedp.ID("release")), chromedp.WaitVisible(chromedp.ID("confirm-release")),
		chromedp.Click(chromedp.ID("confirm-release")), chromedp.WaitVisible(chromedp.ID("msg")))
	op.waitJS("released, live", `document.querySelector('#state').innerText == 'released'`, 60*time.Second)

	// --- admin repairs the disabled slot; a drifted node is flagged ---
	adm.run("repair", chromedp.Navigate(base+"slots/j22u15-s7"), chromedp.WaitVisible(chromedp.ID("slot-status")),
		chromedp.Click(chromedp.CSS(`button.repair`)), chromedp.WaitVisible(chromedp.ID("msg")))
	assert.Equal(t, "available", adm.text("#slot-status"))
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
	adm.run("images", chromedp.Navigate(base+"images"), chromedp.WaitVisible(chromedp.ID("images")))

	// Sign out: the session is gone.
	op.run("sign out", chromedp.Navigate(base+"allocations"), chromedp.Click(chromedp.ID("signout")), chromedp.WaitVisible(chromedp.ID("token")))
	op.run("after sign-out", chromedp.Navigate(base+"allocations"), chromedp.WaitVisible(chromedp.ID("token")))
}
