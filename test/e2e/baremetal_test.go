package e2e

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/lab/hostsim/hostsimtest"
	"github.com/gpuaas/gpuaas/lab/maassim"
)

const labTenantKey = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGLghuJL5IalcLDmelfsrpFRWiDXCjN/6o63xOSzdTLS tenant@lab"

// simAdmin reads the MAAS simulator's admin endpoint of a lab.
type simAdmin struct {
	t    *testing.T
	base string
}

func newSimAdmin(t *testing.T, dir string) simAdmin {
	t.Helper()
	var mj struct{ Admin string }
	b, err := os.ReadFile(filepath.Join(dir, "maas.json"))
	require.NoError(t, err, "the lab says where its MAAS simulator is")
	require.NoError(t, json.Unmarshal(b, &mj))
	return simAdmin{t: t, base: mj.Admin}
}

func (s simAdmin) machine(host string) maassim.MachineSnapshot {
	s.t.Helper()
	resp, err := http.Get(s.base + "machines")
	require.NoError(s.t, err)
	defer resp.Body.Close()
	var ms []maassim.MachineSnapshot
	require.NoError(s.t, json.NewDecoder(resp.Body).Decode(&ms))
	for _, m := range ms {
		if m.Hostname == host {
			return m
		}
	}
	s.t.Fatalf("MAAS simulator has no machine %s", host)
	return maassim.MachineSnapshot{}
}

func (s simAdmin) requests() []maassim.Request {
	s.t.Helper()
	resp, err := http.Get(s.base + "requests")
	require.NoError(s.t, err)
	defer resp.Body.Close()
	var log []maassim.Request
	require.NoError(s.t, json.NewDecoder(resp.Body).Decode(&log))
	return log
}

func (s simAdmin) fault(systemID, body string) {
	s.t.Helper()
	resp, err := http.Post(s.base+"machines/"+systemID+"/faults", "application/json", strings.NewReader(body))
	require.NoError(s.t, err)
	resp.Body.Close()
	require.Less(s.t, resp.StatusCode, 300)
}

// allocID is the allocation a `--wait` run followed.
var allocIDPattern = regexp.MustCompile(`allocation (alloc-[0-9a-f]+) placed`)

// TestLabBaremetalThroughMAAS: the default lab (three coordinator
// processes, no -maas) runs the MAAS simulator with j27u15 registered as
// a Ready machine. A baremetal allocation is deployed for its tenant
// through MAAS — the tenant's key and the lab profile's tenant_user_data
// in the user-data — and `--wait` shows the MAAS buckets; release erases
// the machine and j27u15 is available again. A deploy failure fails the
// allocation naming the bucket and drains the node; undrained, the next
// allocation releases the failed machine (erasing) and deploys it.
func TestLabBaremetalThroughMAAS(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the lab's processes")
	}
	bin := buildBinaries(t)
	dir := filepath.Join(t.TempDir(), "lab")
	l := startLab(t, bin, dir, "-hosts", "j27u15", "-hosts-dir", hostsimtest.Dir(t))
	require.Contains(t, l.out.String(), "Bare metal: j27u15 is a machine of the MAAS simulator")
	sim := newSimAdmin(t, dir)
	m := sim.machine("j27u15")
	require.Equal(t, maassim.StatusReady, m.Status, "the enrolled host is registered in MAAS as a Ready machine")

	out, err := l.ctl(t, "node", "list")
	require.NoError(t, err, out)
	assert.Regexp(t, `j27u15 +lab-east +lab-h200 +baremetal +active +8 +no`, out, "node list shows the baremetal node's 8 GPUs")
	available := func() {
		t.Helper()
		out, err := l.ctl(t, "availability")
		require.NoError(t, err, out)
		assert.Regexp(t, `h200-sxm-baremetal +baremetal +8 +1 +8 +8`, out, "j27u15 is available: 8 GPUs, one node")
	}
	available()

	create := func() (string, string, error) {
		t.Helper()
		out, err := l.ctl(t, "alloc", "create", "--shape", "baremetal", "--region", "lab-east", "--ssh-key", labTenantKey, "--wait", "--wait-timeout", "60s")
		id := allocIDPattern.FindStringSubmatch(out)
		require.NotNil(t, id, "create output:\n%s", out)
		return id[1], out, err
	}
	released := func(id string) {
		t.Helper()
		out, err := l.ctl(t, "alloc", "release", id, "--wait", "--wait-timeout", "60s")
		require.NoError(t, err, out)
		assert.Regexp(t, `maas.release_erase succeeded +\S+ +machine \S+ erased, Ready`, out)
		assert.Contains(t, out, "allocation "+id+" is released after")
		assert.NotContains(t, out, "placement", "release --wait shows the release's stages only")
		out, err = l.ctl(t, "alloc", "show", id)
		require.NoError(t, err, out)
		assert.Regexp(t, `State: +released`, out)
		assert.Equal(t, maassim.StatusReady, sim.machine("j27u15").Status, "release leaves the machine Ready")
		available()
	}

	start := time.Now()
	id, out, err := create()
	require.NoError(t, err, out)
	assert.Less(t, time.Since(start), 30*time.Second)
	for _, want := range []string{"maas.ready_to_deploy_wait succeeded", "maas.image_deploy succeeded", "is active", "ssh: ssh ubuntu@10.10.0."} {
		assert.Contains(t, out, want)
	}
	m = sim.machine("j27u15")
	require.Equal(t, maassim.StatusDeployed, m.Status)
	ud := string(m.UserData)
	assert.Contains(t, ud, `- "`+labTenantKey+`"`, "the tenant's key is in the deploy")
	assert.Contains(t, ud, "gpuaas lab: bare-metal H200 node deployed by MAAS", "the profile's tenant_user_data is in the deploy")
	assert.Contains(t, ud, "allocation="+id)
	kept, err := os.ReadFile(filepath.Join(dir, "logs", "tenant-j27u15.user-data"))
	require.NoError(t, err)
	assert.Equal(t, m.UserData, kept, "the lab keeps what MAAS deployed")
	out, err = l.ctl(t, "availability")
	require.NoError(t, err, out)
	assert.Regexp(t, `h200-sxm-baremetal +baremetal +0 +0`, out, "the allocated node is out of availability")
	out, err = l.ctl(t, "alloc", "list")
	require.NoError(t, err, out)
	assert.Regexp(t, id+` +baremetal +h200-sxm-baremetal +8 `, out)

	released(id)
	erases := 0
	for _, r := range sim.requests() {
		if r.SystemID == m.SystemID && r.Op == "release" && r.Applied {
			assert.Equal(t, "true", r.Params.Get("erase"), "every release erases")
			erases++
		}
	}
	assert.Equal(t, 1, erases)
	out, err = l.ctl(t, "alloc", "timeline", id)
	require.NoError(t, err, out)
	assert.Regexp(t, `maas.release_erase +succeeded`, out)

	// A deploy failure: the allocation fails naming the bucket, the node
	// is drained, the machine is left for the operator.
	sim.fault(m.SystemID, `{"kind":"curtin_failure","times":1}`)
	failedID, out, err := create()
	require.Error(t, err, "create --wait exits non-zero on a failed allocation:\n%s", out)
	assert.Contains(t, out, "failed at stage maas.image_deploy")
	assert.Contains(t, out, "curtin command install failed")
	out, err = l.ctl(t, "alloc", "show", failedID)
	require.NoError(t, err, out)
	assert.Regexp(t, `State: +failed`, out)
	assert.Equal(t, maassim.StatusFailedDeployment, sim.machine("j27u15").Status)
	out, err = l.ctl(t, "node", "list")
	require.NoError(t, err, out)
	assert.Regexp(t, `j27u15 .* +yes +- \(baremetal\)`, out, "the node is drained")

	// The operator's way back: undrain (admin); the next handoff releases
	// the failed machine with erase first.
	admin := adminCtl(t, l)
	out, err = admin("node", "undrain", "j27u15")
	require.NoError(t, err, out)
	id, out, err = create()
	require.NoError(t, err, out)
	assert.Contains(t, out, "is active")
	released(id)
}

// adminCtl runs gpuaasctl with the lab's admin token.
func adminCtl(t *testing.T, l *lab) func(args ...string) (string, error) {
	var toks struct{ Admin string }
	b, err := os.ReadFile(filepath.Join(l.dir, "tokens.secret.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &toks))
	return func(args ...string) (string, error) {
		cmd := exec.Command(filepath.Join(l.bin, "gpuaasctl"), args...)
		cmd.Env = append(append(os.Environ(), l.env...), "GPUAAS_TOKEN="+toks.Admin)
		var buf bytes.Buffer
		cmd.Stdout, cmd.Stderr = &buf, &buf
		err := cmd.Run()
		return buf.String(), err
	}
}
