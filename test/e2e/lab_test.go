// Package e2e drives the real binaries the way an operator does: `make
// lab` (gpuaas-lab), then gpuaasctl against it.
package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/lab/hostsim/hostsimtest"
)

// buildBinaries returns the directory of the binaries TestMain built.
func buildBinaries(t *testing.T) string {
	t.Helper()
	require.NoError(t, buildErr)
	require.NotEmpty(t, binDir)
	return binDir
}

// labReady is the last line of gpuaas-lab's summary (its SummaryEnd):
// seen, the whole summary is there.
const labReady = "gpuaas lab: ready (Ctrl-C stops it)."

type lab struct {
	cmd    *exec.Cmd
	out    *bytes.Buffer
	dir    string
	bin    string
	env    []string
	exited chan error
}

func startLab(t *testing.T, bin, dir string, args ...string) *lab {
	t.Helper()
	l := &lab{dir: dir, bin: bin, out: &bytes.Buffer{}, exited: make(chan error, 1)}
	if !slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "-slice-host") }) {
		// The lab tests follow the simulated hosts; TestPrivilegedLabSliceEndToEnd
		// runs the real slice host.
		args = append(args, "-slice-host=none")
	}
	if !slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "-hosts-dir") }) {
		// The lab keeps its simulated host roots in a /dev/shm folder
		// named after the lab folder, across runs, until `gpuaas-lab
		// clean`; a test's go with the test (removed after the lab
		// stopped: cleanups run last first).
		args = append(args, "-hosts-dir", hostsimtest.Dir(t))
	}
	l.cmd = exec.Command(filepath.Join(bin, "gpuaas-lab"), append([]string{"-dir", dir}, args...)...)
	l.cmd.Stdout, l.cmd.Stderr = l.out, l.out
	require.NoError(t, l.cmd.Start())
	go func() { l.exited <- l.cmd.Wait() }()
	t.Cleanup(func() {
		if l.cmd.ProcessState == nil {
			_ = l.cmd.Process.Signal(syscall.SIGINT)
			select {
			case <-l.exited:
			case <-time.After(30 * time.Second):
				_ = l.cmd.Process.Kill()
				<-l.exited
			}
		}
		// Whatever the lab left behind (it was killed, or failed to stop
		// a child): its children run in their own process groups, so find
		// them by the lab folder in their arguments.
		killByArg(t, dir)
	})
	if !waitFor(90*time.Second, func() bool { return strings.Contains(l.out.String(), labReady) }) {
		t.Fatalf("the lab was not ready within 90 s; lab output:\n%s\n%s", l.out, logTails(dir))
	}
	envFile, err := os.ReadFile(filepath.Join(dir, "env"))
	require.NoError(t, err)
	sc := bufio.NewScanner(bytes.NewReader(envFile))
	for sc.Scan() {
		l.env = append(l.env, strings.TrimPrefix(sc.Text(), "export "))
	}
	return l
}

// killByArg SIGKILLs every process whose command line mentions arg (a
// unique temp path of this test).
func killByArg(t *testing.T, arg string) {
	t.Helper()
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || !bytes.Contains(b, []byte(arg)) {
			continue
		}
		pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		if err != nil || pid == os.Getpid() {
			continue
		}
		t.Logf("killing leftover process %d: %s", pid, bytes.ReplaceAll(b, []byte{0}, []byte{' '}))
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

func (l *lab) ctl(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(filepath.Join(l.bin, "gpuaasctl"), args...)
	cmd.Env = append(os.Environ(), l.env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		return stdout.String() + stderr.String(), err
	}
	return stdout.String(), nil
}

func (l *lab) stop(t *testing.T) {
	t.Helper()
	require.NoError(t, l.cmd.Process.Signal(syscall.SIGINT))
	select {
	case err := <-l.exited:
		require.NoError(t, err, "the lab exits cleanly on Ctrl-C:\n%s", l.out)
	case <-time.After(60 * time.Second):
		t.Fatalf("lab did not stop within 60s:\n%s", l.out)
	}
}

// TestLabOperatorPath is the README's first five minutes: start the lab
// (coordinators, then one agent per lab host, onboarded and auto-approved),
// read the summary, look at nodes and availability, take a 2-GPU slice and
// see the agent's plan, stop with Ctrl-C, start again and find the state
// and the agents' credentials kept, release.
func TestLabOperatorPath(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the lab's processes")
	}
	bin := buildBinaries(t)
	dir := filepath.Join(t.TempDir(), "lab")
	hosts := hostsimtest.Dir(t)
	l := startLab(t, bin, dir, "-hosts-dir", hosts)

	// The summary: auto-approve said, each node's readiness.
	summary := l.out.String()
	require.Contains(t, summary, "Auto-approve is ON")
	require.Contains(t, summary, "15 new slot(s)", "8 complete candidates on j22u15, 7 on j22u11")
	require.Regexp(t, `j22u15 +slice_vm +active +slice-ready +8 slots`, summary)
	require.Regexp(t, `j22u11 +slice_vm +active +NOT slice-ready +7 slots`, summary)
	require.Contains(t, summary, "blocker: ipoib_netplan_missing")
	require.Regexp(t, `j27u15 +baremetal +active +baremetal`, summary)
	require.Equal(t, 3, strings.Count(summary, "minted a bootstrap token"), "one token per host on the first start")
	cred, err := os.ReadFile(filepath.Join(dir, "agents", "j22u15", "credential"))
	require.NoError(t, err)

	out, err := l.ctl(t, "node", "list")
	require.NoError(t, err, out)
	for _, n := range []string{"j22u15", "j22u11", "j27u15"} {
		require.Contains(t, out, n)
	}
	out, err = l.ctl(t, "availability", "-o", "json")
	require.NoError(t, err, out)
	require.NotContains(t, out, "0000:", "availability never exposes PCI addresses")

	out, err = l.ctl(t, "alloc", "create", "--gpus", "2", "--region", "lab-east", "--idempotency-key", "e2e-lab-1", "-o", "json")
	require.NoError(t, err, out)
	var alloc struct {
		ID       string   `json:"id"`
		State    string   `json:"state"`
		NodeID   string   `json:"node_id"`
		ClaimIDs []string `json:"claim_ids"`
		GPUCount int      `json:"gpu_count"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &alloc), out)
	require.Equal(t, 2, alloc.GPUCount)
	require.Len(t, alloc.ClaimIDs, 2, "one slot claim per GPU")
	require.Equal(t, "j22u15", alloc.NodeID, "slices go to the slice-ready host")

	// The agent leases the slots and the simulated slice runtime brings
	// the slice up.
	require.Eventually(t, func() bool {
		out, err := l.ctl(t, "alloc", "show", alloc.ID, "-o", "json")
		return err == nil && strings.Contains(out, `"active"`)
	}, 30*time.Second, 200*time.Millisecond, "the simulated slice runtime activates the allocation")
	out, err = l.ctl(t, "alloc", "tasks", alloc.ID, "-o", "json")
	require.NoError(t, err, out)
	require.Contains(t, out, `"slice.provision"`)
	require.Contains(t, out, `"succeeded"`)
	require.Contains(t, out, `"guest_ip"`, "the task result is the slice result")

	// The same key returns the same allocation.
	out, err = l.ctl(t, "alloc", "create", "--gpus", "2", "--region", "lab-east", "--idempotency-key", "e2e-lab-1", "-o", "json")
	require.NoError(t, err, out)
	require.Contains(t, out, alloc.ID)

	// Bad input is refused with a clear message and a non-zero exit.
	out, err = l.ctl(t, "alloc", "create", "--gpus", "3", "--region", "lab-east")
	require.Error(t, err)
	require.Contains(t, out, "gpu_count 3 is not allowed")

	out, err = l.ctl(t, "alloc", "show", alloc.ID)
	require.NoError(t, err, out)
	require.Contains(t, out, alloc.ID)

	l.stop(t)

	// Restart: same ports, same state, the agents' credentials kept (no
	// new token), nothing new to approve.
	l2 := startLab(t, bin, dir, "-hosts-dir", hosts)
	summary = l2.out.String()
	require.NotContains(t, summary, "minted a bootstrap token")
	require.NotContains(t, summary, "generated host root", "the host roots are reused")
	require.Contains(t, summary, "0 new slot(s)")
	require.Regexp(t, `j22u15 +slice_vm +active +slice-ready +8 slots`, summary)
	cred2, err := os.ReadFile(filepath.Join(dir, "agents", "j22u15", "credential"))
	require.NoError(t, err)
	require.Equal(t, string(cred), string(cred2))
	out, err = l2.ctl(t, "alloc", "show", alloc.ID, "-o", "json")
	require.NoError(t, err, out)
	require.Contains(t, out, alloc.ID)
	// An operator releases; the agent wipes the simulated disks, whose
	// proofs make the slots available again.
	out, err = l2.ctl(t, "alloc", "release", alloc.ID)
	require.NoError(t, err, out)
	require.Eventually(t, func() bool {
		out, err := l2.ctl(t, "alloc", "show", alloc.ID, "-o", "json")
		return err == nil && strings.Contains(out, `"released"`)
	}, 30*time.Second, 200*time.Millisecond, "the release ends")
	out, err = l2.ctl(t, "slot", "list", "--node", "j22u15", "-o", "json")
	require.NoError(t, err, out)
	require.NotContains(t, out, `"releasing"`)
	require.NotContains(t, out, `"cleanup_blocked"`)
	require.Contains(t, out, `"sample_digest"`, "released slots carry their wipe proof")

	// Force-release is an admin's; the touched slot waits for a cleanup.
	out, err = l2.ctl(t, "alloc", "create", "--gpus", "1", "--region", "lab-east", "--wait", "-o", "json")
	require.NoError(t, err, out)
	var one struct {
		ID string `json:"id"`
	}
	require.NoError(t, json.Unmarshal([]byte(out[strings.LastIndex(out, "\n{")+1:]), &one), out)
	out, err = l2.ctl(t, "alloc", "force-release", one.ID, "--reason", "e2e")
	require.Error(t, err)
	require.Contains(t, out, "needs role admin")
	var toks struct {
		Admin string `json:"admin"`
	}
	b, err := os.ReadFile(filepath.Join(dir, "tokens.secret.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &toks))
	out, err = l2.ctl(t, "--token", toks.Admin, "alloc", "force-release", one.ID, "--reason", "e2e")
	require.NoError(t, err, out)
	out, err = l2.ctl(t, "alloc", "show", one.ID, "-o", "json")
	require.NoError(t, err, out)
	require.Contains(t, out, `"released"`)
	var slots struct {
		Items []struct {
			ID     string `json:"id"`
			Status string `json:"status"`
		} `json:"items"`
	}
	out, err = l2.ctl(t, "slot", "list", "--node", "j22u15", "-o", "json")
	require.NoError(t, err, out)
	require.NoError(t, json.Unmarshal([]byte(out), &slots), out)
	var blocked []string
	for _, s := range slots.Items {
		if s.Status == "cleanup_blocked" {
			blocked = append(blocked, s.ID)
		}
	}
	require.Len(t, blocked, 1, out)
	out, err = l2.ctl(t, "--token", toks.Admin, "slot", "repair", blocked[0])
	require.Error(t, err)
	require.Contains(t, out, "gpuaasctl slot cleanup "+blocked[0]+" --wait")
	out, err = l2.ctl(t, "--token", toks.Admin, "slot", "cleanup", blocked[0], "--wait")
	require.NoError(t, err, out)
	require.Contains(t, out, "available")
	l2.stop(t)
}

// waitFor polls cond every 100 ms until it holds or d has passed.
func waitFor(d time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}

// logTails returns the last lines of every log of a lab folder (for a
// failure message).
func logTails(dir string) string {
	var b strings.Builder
	logs, _ := filepath.Glob(filepath.Join(dir, "logs", "*.log"))
	for _, f := range logs {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
		if len(lines) > 40 {
			lines = lines[len(lines)-40:]
		}
		fmt.Fprintf(&b, "--- %s (last %d lines)\n%s\n", filepath.Base(f), len(lines), strings.Join(lines, "\n"))
	}
	return b.String()
}
