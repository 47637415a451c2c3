package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/api"
	"github.com/gpuaas/gpuaas/coordinator/pki"
	"github.com/gpuaas/gpuaas/lab/launch"
	"github.com/gpuaas/gpuaas/proto"
)

// fakeProc starts a shell whose argv[0] is name (what /proc shows and
// procAlive checks); it exits on SIGTERM after termDelay.
func fakeProc(t *testing.T, name string, termDelay time.Duration) *exec.Cmd {
	t.Helper()
	// The trap is set before the ready file appears: a SIGTERM sent
	// after that runs it.
	ready := filepath.Join(t.TempDir(), "ready")
	script := fmt.Sprintf("trap 'sleep %.2f; exit 0' TERM; : > %s; while :; do sleep 0.05; done", termDelay.Seconds(), ready)
	cmd := &exec.Cmd{Path: "/bin/sh", Args: []string{name, "-c", script}}
	require.NoError(t, cmd.Start())
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})
	require.Eventually(t, func() bool {
		_, err := os.Stat(ready)
		return err == nil && procAlive(cmd.Process.Pid, name)
	}, 5*time.Second, 10*time.Millisecond)
	return cmd
}

func TestProcAlive(t *testing.T) {
	t.Parallel()
	p := fakeProc(t, "gpuaas-lab", 0)
	assert.True(t, procAlive(p.Process.Pid, "gpuaas-lab"))
	assert.True(t, procAlive(p.Process.Pid, ""))
	assert.False(t, procAlive(p.Process.Pid, "gpuaas-coordinator"), "a recycled pid running something else is not the lab")
	assert.False(t, procAlive(0, ""))
	require.NoError(t, p.Process.Kill())
	// Killed and reaped (or a zombie for a moment): gone either way.
	assert.Eventually(t, func() bool { return !procAlive(p.Process.Pid, "gpuaas-lab") }, 5*time.Second, 10*time.Millisecond)
}

// writeLab writes a lab folder whose coordinator is a fake API server and
// whose run.json names the given processes.
func writeLab(t *testing.T, ri runInfo, api string) string {
	t.Helper()
	dir := t.TempDir()
	st := state{Coordinators: []coord{{ID: "c1", HTTP: api, Raft: "127.0.0.1:1"}}}
	b, err := json.Marshal(st)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "lab.json"), b, 0o644))
	b, err = json.Marshal(tokens{Admin: "a", Operator: "o", Viewer: "v"})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tokens.secret.json"), b, 0o600))
	b, err = json.Marshal(ri)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, runFileName), b, 0o644))
	if ca, ok := fakeCAs.Load(api); ok {
		require.NoError(t, os.WriteFile(launch.CAFile(dir), ca.([]byte), 0o644))
	}
	return dir
}

// fakeCAs are the CA certificates of the fake APIs by address: the lab
// folder of a fake API trusts its CA, as a real lab's trusts .lab/ca.pem.
var fakeCAs sync.Map

func fakeAPI(t *testing.T) string {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, `{"status":"not_ready","reason":"catching up: applied index 3 of 9 learned from the leader"}`)
	})
	auth := func(w http.ResponseWriter, r *http.Request) bool {
		if r.Header.Get("Authorization") != "Bearer v" {
			w.WriteHeader(http.StatusUnauthorized)
			return false
		}
		return true
	}
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, r *http.Request) {
		if auth(w, r) {
			_ = json.NewEncoder(w).Encode(proto.Status{IsLeader: true, LeaderHTTPAddr: r.Host, Index: 9})
		}
	})
	mux.HandleFunc("GET /v1/nodes", func(w http.ResponseWriter, r *http.Request) {
		if !auth(w, r) {
			return
		}
		ready := &proto.Readiness{Active: true, SliceReady: true}
		_ = json.NewEncoder(w).Encode(proto.List[proto.Node]{Items: []proto.Node{
			{ID: "j22u15", ProfileIntent: proto.IntentSliceVM, State: proto.NodeActive, Readiness: ready},
			{ID: "j22u11", ProfileIntent: proto.IntentSliceVM, State: proto.NodeUnreachable, Readiness: ready},
			{ID: "j27u15", ProfileIntent: proto.IntentBaremetal, State: proto.NodeActive},
		}})
	})
	ca, err := pki.NewCA("fake lab CA", time.Now(), time.Hour)
	require.NoError(t, err)
	cert, err := ca.IssueServer("c1", []string{"127.0.0.1"}, time.Now(), time.Hour)
	require.NoError(t, err)
	srv := httptest.NewUnstartedServer(mux)
	srv.TLS = pki.APIServerConfig(ca.Pool(), cert)
	srv.StartTLS()
	t.Cleanup(srv.Close)
	addr := strings.TrimPrefix(srv.URL, "https://")
	fakeCAs.Store(addr, ca.CertPEM)
	return addr
}

func TestStatusAndStop(t *testing.T) {
	t.Parallel()
	labProc := fakeProc(t, "gpuaas-lab", 300*time.Millisecond)
	c1 := fakeProc(t, "gpuaas-coordinator", 0)
	agent := fakeProc(t, "gpuaas-lab-agent", 0)
	mode := sliceMode{Flag: "auto", Cause: "not root: real VMs need root"}
	ri := runInfo{PID: labProc.Process.Pid, Started: time.Now(), Phase: "up", SliceHost: &mode,
		Coordinators: map[string]int{"c1": c1.Process.Pid}, Agents: map[string]int{"agent-j22u15": agent.Process.Pid, "agent-j22u11": 999999999}}
	dir := writeLab(t, ri, fakeAPI(t))

	var out bytes.Buffer
	err := run([]string{"status", "-dir", dir}, &out)
	t.Logf("status:\n%s", out.String())
	// j22u11's agent is down: status says so and fails.
	require.ErrorContains(t, err, "down: agent-j22u11")
	s := out.String()
	assert.Contains(t, s, fmt.Sprintf("running (gpuaas-lab pid %d", labProc.Process.Pid))
	assert.Contains(t, s, "slice host: -slice-host auto: simulated (not root: real VMs need root)")
	assert.Regexp(t, fmt.Sprintf(`c1 +pid %d +alive .* not ready: catching up: applied index 3 of 9 learned from the leader  leader`, c1.Process.Pid), s)
	assert.Regexp(t, fmt.Sprintf(`agent-j22u15 +pid %d +alive`, agent.Process.Pid), s)
	assert.Regexp(t, `agent-j22u11 +pid 999999999 +DOWN`, s)
	assert.Regexp(t, `j22u15 +slice_vm +active +slice-ready yes`, s)
	assert.Regexp(t, `j22u11 +slice_vm +unreachable +slice-ready no \(unreachable\)`, s)
	assert.Regexp(t, `j27u15 +baremetal +active +slice-ready - \(baremetal\)`, s)

	// stop signals gpuaas-lab and waits until it is gone.
	out.Reset()
	require.NoError(t, run([]string{"stop", "-dir", dir}, &out), out.String())
	assert.Contains(t, out.String(), fmt.Sprintf("stopping the lab in %s (gpuaas-lab pid %d)", dir, labProc.Process.Pid))
	assert.Contains(t, out.String(), "stopped")
	assert.False(t, procAlive(labProc.Process.Pid, "gpuaas-lab"))
	assert.True(t, procAlive(c1.Process.Pid, "gpuaas-coordinator"), "the lab itself stops its children, not stop")

	// gpuaas-lab is gone but its coordinator and agent still run (it was
	// killed): stop stops them and removes the stale record.
	out.Reset()
	err = run([]string{"status", "-dir", dir}, &out)
	require.Error(t, err)
	assert.Contains(t, out.String(), "NOT running: gpuaas-lab pid")
	out.Reset()
	require.NoError(t, run([]string{"stop", "-dir", dir}, &out), out.String())
	assert.Contains(t, out.String(), fmt.Sprintf("stopping its agent-j22u15 (pid %d)", agent.Process.Pid))
	assert.Contains(t, out.String(), fmt.Sprintf("stopping its c1 (pid %d)", c1.Process.Pid))
	assert.False(t, procAlive(c1.Process.Pid, "gpuaas-coordinator"))
	assert.False(t, procAlive(agent.Process.Pid, "gpuaas-lab-agent"))
	_, err = os.Stat(filepath.Join(dir, runFileName))
	assert.True(t, errors.Is(err, os.ErrNotExist))

	// Nothing left: stop is a no-op, status says not running.
	out.Reset()
	require.NoError(t, run([]string{"stop", "-dir", dir}, &out))
	assert.Equal(t, "no lab is running in "+dir+"\n", out.String())
	out.Reset()
	assert.ErrorContains(t, run([]string{"status", "-dir", dir}, &out), "is not running")
	assert.Contains(t, out.String(), "not running (no gpuaas-lab recorded")
}

func TestStopWaitsAndGivesUp(t *testing.T) {
	t.Parallel()
	// A gpuaas-lab that takes longer to stop than -timeout.
	labProc := fakeProc(t, "gpuaas-lab", 3*time.Second)
	dir := writeLab(t, runInfo{PID: labProc.Process.Pid, Coordinators: map[string]int{}, Agents: map[string]int{}}, "127.0.0.1:1")
	var out bytes.Buffer
	err := run([]string{"stop", "-dir", dir, "-timeout", "300ms"}, &out)
	require.Error(t, err, out.String())
	assert.Contains(t, err.Error(), fmt.Sprintf("gpuaas-lab pid %d still runs after 300ms", labProc.Process.Pid))
}

func TestStartRefusesASecondLabOnTheSameFolder(t *testing.T) {
	t.Parallel()
	labProc := fakeProc(t, "gpuaas-lab", 0)
	dir := writeLab(t, runInfo{PID: labProc.Process.Pid, Started: time.Now(), Coordinators: map[string]int{}, Agents: map[string]int{}}, "127.0.0.1:1")
	err := run([]string{"-dir", dir, "-slice-host", "none"}, io.Discard)
	require.Error(t, err)
	assert.Contains(t, err.Error(), fmt.Sprintf("a lab is already running in %s (gpuaas-lab pid %d", dir, labProc.Process.Pid))
	assert.Contains(t, err.Error(), "gpuaas-lab stop -dir "+dir)
}

func TestSubcommandsAndStatusWithoutALab(t *testing.T) {
	t.Parallel()
	err := run([]string{"stats"}, io.Discard)
	assert.EqualError(t, err, `unknown subcommand "stats": use status, stop, doctor or clean (or flags only to run the lab)`)
	dir := t.TempDir()
	err = run([]string{"status", "-dir", dir}, io.Discard)
	assert.ErrorContains(t, err, "no lab in "+dir+" (no lab.json)")
	err = run([]string{"status", "-dir", dir, "extra"}, io.Discard)
	assert.ErrorContains(t, err, `unexpected argument "extra"`)
	err = run([]string{"-dir", dir, "-slice-host", "none", "status"}, io.Discard)
	assert.ErrorContains(t, err, "subcommands (status, stop, doctor) come first")
	err = run([]string{"-dir", dir, "-slice-host", "maybe"}, io.Discard)
	assert.ErrorContains(t, err, `-slice-host "maybe": use auto, real or none`)
}

func TestResolveSliceHost(t *testing.T) {
	t.Parallel()
	ok := func() error { return nil }
	missing := func() error { return errors.New("slice host: dnsmasq is not installed (make deps)") }
	cases := []struct {
		flag      string
		euid      int
		installed func() error
		real      bool
		cause     string
	}{
		{"auto", 0, ok, true, ""},
		{"auto", 1000, ok, false, "not root: real VMs need root"},
		{"auto", 0, missing, false, "slice host: dnsmasq is not installed (make deps) (make deps installs it"},
		{"real", 1000, missing, true, ""},
		{"none", 0, ok, false, "-slice-host none keeps every host simulated"},
	}
	for _, tc := range cases {
		m, err := resolveSliceHost(tc.flag, tc.euid, tc.installed)
		require.NoError(t, err)
		assert.Equal(t, tc.real, m.Real, "%s euid %d", tc.flag, tc.euid)
		if tc.cause == "" {
			assert.Empty(t, m.Cause)
		} else {
			assert.Contains(t, m.Cause, tc.cause)
		}
	}
	m, _ := resolveSliceHost("auto", 0, ok)
	assert.True(t, strings.HasPrefix(m.describe(), "-slice-host auto: real VMs on j22u15 (root;"), m.describe())
	m.setupFailed(errors.New(`catalog entry lab-guest: kind "" is not one of [slice_base]`))
	assert.False(t, m.Real)
	assert.Equal(t, `-slice-host auto: simulated (setting up the real slice host failed: catalog entry lab-guest: kind "" is not one of [slice_base])`, m.describe())
	assert.Equal(t, "simulated", m.hostMode("j22u15", proto.IntentSliceVM))
	_, err := resolveSliceHost("sometimes", 0, ok)
	assert.Error(t, err)
}

// The summary names both env files, which commands need the admin one,
// the slice-host mode and, per host, real VMs or simulated with the cause.
func TestSummaryIsHonest(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	require.NoError(t, writeEnv(dir, "127.0.0.1:7300", tokens{Admin: "adm", Operator: "op", Viewer: "vw", Tenant: "tn"}))
	for name, tok := range map[string]string{"env": "op", "env.admin": "adm", "env.tenant": "tn"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		require.NoError(t, err)
		assert.Contains(t, string(b), "export GPUAAS_ADDR=https://127.0.0.1:7300\n")
		assert.Contains(t, string(b), "export GPUAAS_CA_FILE="+filepath.Join(dir, "ca-bundle.pem")+"\n")
		assert.Contains(t, string(b), "export GPUAAS_TOKEN="+tok+"\n")
		fi, err := os.Stat(filepath.Join(dir, name))
		require.NoError(t, err)
		assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	}

	st := state{Coordinators: []coord{{ID: "c1", HTTP: "127.0.0.1:7300"}}}
	views := []hostView{
		{node: proto.NodeDetail{Node: proto.Node{ID: "j22u15", ProfileIntent: proto.IntentSliceVM, State: proto.NodeActive,
			Readiness: &proto.Readiness{Active: true, SliceReady: true}}}},
		{node: proto.NodeDetail{Node: proto.Node{ID: "j27u15", ProfileIntent: proto.IntentBaremetal, State: proto.NodeActive}}},
	}
	simulated := sliceMode{Flag: "auto"}
	simulated.setupFailed(errors.New("image lab-guest: catalog refused it"))
	var out bytes.Buffer
	printSummary(&out, dir, st, "127.0.0.1:7300", views, true, simulated)
	sliceHint(&out, nil, "", simulated, "/lab/tenant-key")
	s := out.String()
	t.Logf("summary:\n%s", s)
	assert.Contains(t, s, "source "+filepath.Join(dir, "env")+" ")
	assert.Contains(t, s, "source "+filepath.Join(dir, "env.admin")+"    # admin token, for: node prepare-slice")
	for _, cmd := range []string{"site onboard|decommission|ingress", "ca status|bundle|rotate|activate|retire", "audit list", "app publish|approve|revoke"} {
		assert.Contains(t, s, cmd, "the admin commands the summary names")
	}
	assert.Contains(t, s, "source "+filepath.Join(dir, "env.tenant")+"   # tenant token lab-tenant: its own allocations")
	assert.Contains(t, s, "slot approve|disable|repair|cleanup")
	assert.Regexp(t, `j22u15 +slice_vm +active +slice-ready +0 slots +simulated`, s)
	assert.Contains(t, s, "simulated because: setting up the real slice host failed: image lab-guest: catalog refused it")
	assert.Contains(t, s, "Slice host: -slice-host auto: simulated (setting up the real slice host failed: image lab-guest: catalog refused it)")
	assert.Contains(t, s, "Slices: every host is simulated: setting up the real slice host failed")
	assert.NotContains(t, s, "make deps —", "the cause is the real one, not a guess about packages")

	out.Reset()
	real := sliceMode{Flag: "auto", Real: true}
	printSummary(&out, dir, st, "127.0.0.1:7300", views, false, real)
	assert.Regexp(t, `j22u15 +slice_vm +active +slice-ready +0 slots +real VMs`, out.String())
	assert.Regexp(t, `j27u15 +baremetal +active .* +0 slots +simulated`, out.String())
	assert.Contains(t, out.String(), "Slice host: -slice-host auto: real VMs on j22u15")
	assert.Contains(t, out.String(), "as admin (source "+filepath.Join(dir, "env.admin"))
}

// TestLabTokens: a new lab folder gets a token per role, tenant included;
// a folder from before the tenant role keeps its secrets and gains one.
func TestLabTokens(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	old := tokens{Admin: "gpuaas_adm", Operator: "gpuaas_op", Viewer: "gpuaas_vw"}
	b, err := json.Marshal(old)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tokens.secret.json"), b, 0o600))
	got, file, err := loadOrMakeTokens(dir)
	require.NoError(t, err)
	assert.Equal(t, old.Admin, got.Admin, "existing secrets are kept")
	assert.Equal(t, old.Operator, got.Operator)
	require.NotEmpty(t, got.Tenant)
	auth, err := api.LoadTokens(file)
	require.NoError(t, err, "the coordinators load the tokens file")
	for secret, want := range map[string]string{got.Admin: "lab-admin/admin", got.Operator: "lab-operator/operator",
		got.Viewer: "lab-viewer/viewer", got.Tenant: "lab-tenant/tenant"} {
		p, ok := auth.Authenticate(secret)
		require.True(t, ok, want)
		assert.Equal(t, want, p.Name+"/"+p.Role.String())
	}
	again, _, err := loadOrMakeTokens(dir)
	require.NoError(t, err)
	assert.Equal(t, got, again, "a second start reuses every secret")
}
