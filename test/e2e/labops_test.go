package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/lab/hostsim/hostsimtest"
)

// TestLabOperatorTools: what an operator uses around the lab, on the real
// binaries — the summary's slice-host mode and env files, .lab/env.admin
// carrying the admin token, the unauthenticated probes and OpenAPI
// document, gpuaas-lab status from another shell, a second lab on the same
// folder refused, and gpuaas-lab stop ending the lab as Ctrl-C does.
func TestLabOperatorTools(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the lab's processes")
	}
	bin := buildBinaries(t)
	dir := filepath.Join(t.TempDir(), "lab")
	l := startLab(t, bin, dir, "-hosts-dir", hostsimtest.Dir(t), "-hosts", "j22u15")
	summary := l.out.String()
	require.Contains(t, summary, "Slice host: -slice-host none: simulated (-slice-host none keeps every host simulated)")
	require.Regexp(t, `j22u15 +slice_vm +active +slice-ready +8 slots +simulated`, summary)
	require.Contains(t, summary, "source "+filepath.Join(dir, "env.admin")+"    # admin token, for: node prepare-slice")
	require.Contains(t, summary, "source "+filepath.Join(dir, "env.tenant")+"   # tenant token lab-tenant")

	envOf := func(name string) []string {
		var env []string
		f, err := os.ReadFile(filepath.Join(dir, name))
		require.NoError(t, err)
		sc := bufio.NewScanner(bytes.NewReader(f))
		for sc.Scan() {
			env = append(env, strings.TrimPrefix(sc.Text(), "export "))
		}
		return env
	}
	// env.admin is the admin token: an admin command works with it and
	// not with env (operator).
	admin := envOf("env.admin")
	out, err := l.ctl(t, "node", "drain", "j22u15")
	require.Error(t, err)
	require.Contains(t, out, "needs role admin")
	ctl := exec.Command(filepath.Join(bin, "gpuaasctl"), "node", "drain", "j22u15")
	ctl.Env = append(os.Environ(), admin...)
	b, err := ctl.CombinedOutput()
	require.NoError(t, err, "%s", b)
	ctl = exec.Command(filepath.Join(bin, "gpuaasctl"), "node", "undrain", "j22u15")
	ctl.Env = append(os.Environ(), admin...)
	b, err = ctl.CombinedOutput()
	require.NoError(t, err, "%s", b)

	// env.tenant is the tenant token: the catalog and its own
	// allocations (none yet), not the inventory.
	tenant := envOf("env.tenant")
	for args, want := range map[string]string{"node list": "not open to tenant tokens", "alloc list": "", "availability": ""} {
		ctl := exec.Command(filepath.Join(bin, "gpuaasctl"), strings.Fields(args)...)
		ctl.Env = append(os.Environ(), tenant...)
		b, err := ctl.CombinedOutput()
		if want != "" {
			require.Error(t, err, "gpuaasctl %s as tenant: %s", args, b)
			require.Contains(t, string(b), want)
		} else {
			require.NoError(t, err, "gpuaasctl %s as tenant: %s", args, b)
		}
	}

	// No token needed for the probes and the document.
	var addr string
	for _, e := range l.env {
		if v, ok := strings.CutPrefix(e, "GPUAAS_ADDR="); ok {
			addr = v
		}
	}
	require.NotEmpty(t, addr)
	get := func(path string) (int, string) {
		res, err := http.Get(addr + path)
		require.NoError(t, err)
		defer res.Body.Close()
		body, err := io.ReadAll(res.Body)
		require.NoError(t, err)
		return res.StatusCode, string(body)
	}
	code, body := get("/healthz")
	require.Equal(t, http.StatusOK, code, body)
	require.Eventually(t, func() bool { code, _ := get("/readyz"); return code == http.StatusOK }, 10*time.Second, 100*time.Millisecond)
	code, body = get("/v1/openapi.json")
	require.Equal(t, http.StatusOK, code)
	var doc map[string]any
	require.NoError(t, json.Unmarshal([]byte(body), &doc))
	require.Contains(t, doc, "paths")

	lab := func(args ...string) (string, error) {
		cmd := exec.Command(filepath.Join(bin, "gpuaas-lab"), args...)
		b, err := cmd.CombinedOutput()
		return string(b), err
	}
	out, err = lab("status", "-dir", dir)
	require.NoError(t, err, out)
	require.Contains(t, out, "running (gpuaas-lab pid")
	require.Regexp(t, `agent-j22u15 +pid \d+ +alive`, out)
	require.Regexp(t, `(?m)^  c\d +pid \d+ +alive .*ready  leader$`, out)
	require.Regexp(t, `j22u15 +slice_vm +active +slice-ready yes`, out)

	out, err = lab("-dir", dir, "-slice-host", "none")
	require.Error(t, err)
	require.Contains(t, out, "a lab is already running in "+dir)

	out, err = lab("stop", "-dir", dir)
	require.NoError(t, err, out)
	require.Contains(t, out, "stopped")
	select {
	case err := <-l.exited:
		require.NoError(t, err, "the lab exits cleanly on gpuaas-lab stop:\n%s", l.out)
	case <-time.After(30 * time.Second):
		t.Fatalf("gpuaas-lab stop returned but the lab still runs:\n%s", l.out)
	}
	require.Contains(t, l.out.String(), "stopping the lab (signal)")
	out, err = lab("status", "-dir", dir)
	require.Error(t, err)
	require.Contains(t, out, "not running")
}
