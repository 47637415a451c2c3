package bootstrap

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
)

var testToken = "gpb_" + strings.Repeat("ab", 32)

func validEnv(coord string) string {
	return "GPUAAS_COORDINATOR=" + coord + "\nGPUAAS_NODE_ID=j22u15\nGPUAAS_BOOTSTRAP_TOKEN=" + testToken +
		"\nGPUAAS_SITE_BUNDLE=\nGPUAAS_VALIDATION_BUNDLE=\nGPUAAS_FABRIC_MODE=ib\nGPUAAS_WORKFLOW=onboard.site-a.j22u15\n"
}

func TestParseEnv(t *testing.T) {
	t.Parallel()
	in, err := ParseEnv(validEnv("http://127.0.0.1:7480"))
	require.NoError(t, err)
	assert.Equal(t, Inputs{CoordinatorURL: "http://127.0.0.1:7480", NodeID: "j22u15", Token: testToken,
		FabricMode: proto.FabricIB, WorkflowID: "onboard.site-a.j22u15"}, in)
	for name, tc := range map[string]struct{ from, to, want string }{
		"coordinator not a URL": {"http://127.0.0.1:7480", "ftp://x", "GPUAAS_COORDINATOR"},
		"token not a token":     {testToken, "secret", "GPUAAS_BOOTSTRAP_TOKEN"},
		"node id path":          {"GPUAAS_NODE_ID=j22u15", "GPUAAS_NODE_ID=../etc", "GPUAAS_NODE_ID"},
		"bundle ref":            {"GPUAAS_SITE_BUNDLE=", "GPUAAS_SITE_BUNDLE=sha256:xyz", "GPUAAS_SITE_BUNDLE"},
		"fabric":                {"GPUAAS_FABRIC_MODE=ib", "GPUAAS_FABRIC_MODE=omnipath", "GPUAAS_FABRIC_MODE"},
		"not a GPUAAS line":     {"GPUAAS_WORKFLOW=", "PATH=/tmp\nGPUAAS_WORKFLOW=", "not GPUAAS_KEY=value"},
		"ca digest":             {"GPUAAS_WORKFLOW=", "GPUAAS_SITE_CA_SHA256=abc\nGPUAAS_WORKFLOW=", "GPUAAS_SITE_CA_SHA256"},
	} {
		_, err := ParseEnv(strings.Replace(validEnv("http://127.0.0.1:7480"), tc.from, tc.to, 1))
		require.Error(t, err, name)
		assert.Contains(t, err.Error(), tc.want, name)
	}
}

// coordinator is a stand-in for the coordinator's bootstrap routes (the
// real ones are exercised end to end in test/e2e): it serves bundles to
// the token and records the reports.
type coordinator struct {
	mu      sync.Mutex
	bundles map[string][]byte
	reports []proto.BootstrapReport
	srv     *httptest.Server
}

func newCoordinator(t *testing.T, bundles ...[]byte) *coordinator {
	c := &coordinator{bundles: map[string][]byte{}}
	for _, b := range bundles {
		c.bundles[proto.BundleDigest(b)] = b
	}
	c.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/v1/bundles/") && r.Header.Get("Authorization") == "" {
			http.Error(w, "no token", http.StatusUnauthorized)
			return
		}
		if r.Header.Get("Authorization") != "Bearer "+testToken {
			http.Error(w, "bad token", http.StatusUnauthorized)
			return
		}
		switch {
		case r.Method == http.MethodPost && r.URL.Path == proto.BootstrapReportPath:
			var rep proto.BootstrapReport
			if err := json.NewDecoder(r.Body).Decode(&rep); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			c.mu.Lock()
			c.reports = append(c.reports, rep)
			c.mu.Unlock()
			w.WriteHeader(http.StatusAccepted)
		case strings.HasPrefix(r.URL.Path, "/v1/bundles/"):
			d := strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, "/v1/bundles/"), "/content")
			b, ok := c.bundles[d]
			if !ok {
				http.NotFound(w, r)
				return
			}
			_, _ = w.Write(b)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(c.srv.Close)
	return c
}

func (c *coordinator) phases() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, r := range c.reports {
		out = append(out, string(r.Phase)+" "+string(r.Status))
	}
	return out
}

// enrollingAgent is the agent starter of the tests: "starting" the agent
// enrolls it (writes its credential) after reading the token file the
// configuration names, as gpuaas-agent does.
type enrollingAgent struct {
	stateDir string
	started  []string
	token    string
	noEnroll bool // the agent starts but never enrolls
}

func (a *enrollingAgent) Start(_ context.Context, cfgPath string) error {
	a.started = append(a.started, cfgPath)
	var cfg struct {
		TokenFile string `json:"bootstrap_token_file"`
	}
	b, err := os.ReadFile(cfgPath)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, &cfg); err != nil {
		return err
	}
	tok, err := os.ReadFile(cfg.TokenFile)
	if os.IsNotExist(err) {
		if _, cerr := os.Stat(filepath.Join(a.stateDir, credentialFile)); cerr == nil {
			return nil // enrolled: the agent needs no token
		}
	}
	if err != nil {
		return err
	}
	a.token = strings.TrimSpace(string(tok))
	if a.noEnroll {
		return nil
	}
	return os.WriteFile(filepath.Join(a.stateDir, credentialFile), []byte("gpn_x"), 0o600)
}

func writeIBPort(t *testing.T, root, dev, state string) {
	t.Helper()
	p := filepath.Join(root, "sys/class/infiniband", dev, "ports/1")
	require.NoError(t, os.MkdirAll(p, 0o755))
	for f, v := range map[string]string{"state": state, "phys_state": "5: LinkUp", "rate": "400 Gb/sec (4X NDR)", "link_layer": "InfiniBand"} {
		require.NoError(t, os.WriteFile(filepath.Join(p, f), []byte(v+"\n"), 0o644))
	}
}

func tgz(t *testing.T, files map[string]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for name, body := range files {
		require.NoError(t, tw.WriteHeader(&tar.Header{Name: name, Mode: 0o755, Size: int64(len(body)), Typeflag: tar.TypeReg}))
		_, err := tw.Write([]byte(body))
		require.NoError(t, err)
	}
	require.NoError(t, tw.Close())
	require.NoError(t, zw.Close())
	return buf.Bytes()
}

type fixture struct {
	root, state string
	coord       *coordinator
	agent       *enrollingAgent
	b           *Bootstrap
}

func newFixture(t *testing.T, in func(*Inputs), bundles ...[]byte) *fixture {
	t.Helper()
	f := &fixture{root: t.TempDir(), state: t.TempDir(), coord: newCoordinator(t, bundles...)}
	f.agent = &enrollingAgent{stateDir: f.state}
	inputs, err := ParseEnv(validEnv(f.coord.srv.URL))
	require.NoError(t, err)
	if in != nil {
		in(&inputs)
	}
	f.b, err = New(Config{Inputs: inputs, Root: f.root, StateDir: f.state, Runner: ExecRunner{}, Agent: f.agent,
		Poll: 5 * time.Millisecond, EnrollTimeout: time.Second})
	require.NoError(t, err)
	return f
}

// TestRunBootstrapsTheNode: the site bundle (a real script) runs with the
// node's environment, the agent gets its configuration and the token, the
// spent token leaves the disk once it enrolled; every phase is reported
// in order.
func TestRunBootstrapsTheNode(t *testing.T) {
	t.Parallel()
	site := []byte("#!/bin/sh\nset -e\nmkdir -p \"$GPUAAS_HOST_ROOT/etc/site\"\necho \"$GPUAAS_NODE_ID $GPUAAS_WORKFLOW\" > \"$GPUAAS_HOST_ROOT/etc/site/marker\"\necho site wired\n")
	f := newFixture(t, func(in *Inputs) { in.SiteBundleRef = proto.BundleDigest(site) }, site)
	require.NoError(t, f.b.Run(context.Background()))

	marker, err := os.ReadFile(filepath.Join(f.root, "etc/site/marker"))
	require.NoError(t, err)
	assert.Equal(t, "j22u15 onboard.site-a.j22u15\n", string(marker))
	assert.Equal(t, []string{filepath.Join(f.root, "etc/gpuaas/agent.json")}, f.agent.started)
	assert.Equal(t, testToken, f.agent.token, "the agent read the bootstrap token from the installed file")
	_, err = os.Stat(filepath.Join(f.root, "etc/gpuaas", TokenFileName))
	assert.ErrorIs(t, err, os.ErrNotExist, "the spent token is removed")
	want := []string{"cloud_init started", "bundle_fetch started", "bundle_fetch succeeded", "site_bootstrap started", "site_bootstrap succeeded",
		"node_bootstrap started", "node_bootstrap succeeded"}
	if d := cmp.Diff(want, f.coord.phases()); d != "" {
		t.Errorf("reports (-want +got):\n%s", d)
	}
	assert.Contains(t, f.coord.reports[4].Detail, "site wired")

	// Run again (cloud-init re-run, reboot): the agent is only started.
	require.NoError(t, f.b.Run(context.Background()))
	assert.Len(t, f.agent.started, 2)
	assert.Len(t, f.coord.phases(), len(want), "no new reports")
}

// TestRunStopsOnBadInputs: a bundle whose bytes are not its digest, a
// failing site bundle and an agent that never enrolls each stop the run
// with a failed report; nothing past the failure happens.
func TestRunStopsOnBadInputs(t *testing.T) {
	t.Parallel()
	good := []byte("#!/bin/sh\necho ok\n")
	failing := []byte("#!/bin/sh\necho cannot wire the fabric >&2\nexit 3\n")
	cases := []struct {
		name     string
		in       func(*Inputs)
		bundles  [][]byte
		noEnroll bool
		failed   string
		want     string
		started  bool
	}{
		{"digest mismatch", func(in *Inputs) { in.SiteBundleRef = proto.BundleDigest([]byte("other")) }, nil, false,
			"bundle_fetch failed", "404", false},
		{"site bundle fails", func(in *Inputs) { in.SiteBundleRef = proto.BundleDigest(failing) }, [][]byte{failing}, false,
			"site_bootstrap failed", "cannot wire the fabric", false},
		{"agent never enrolls", func(in *Inputs) { in.SiteBundleRef = proto.BundleDigest(good) }, [][]byte{good}, true,
			"node_bootstrap failed", "did not enroll", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, tc.in, tc.bundles...)
			f.agent.noEnroll = tc.noEnroll
			err := f.b.Run(context.Background())
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			ph := f.coord.phases()
			assert.Equal(t, tc.failed, ph[len(ph)-1])
			assert.Equal(t, tc.started, len(f.agent.started) > 0)
		})
	}
}

// TestValidator: the validation bundle (a real tgz) runs with the node's
// environment, then the IB ports must be ACTIVE; a DOWN port fails with
// the ports read, a failing bundle with its output.
func TestValidator(t *testing.T) {
	t.Parallel()
	bundle := tgz(t, map[string]string{"run": "#!/bin/sh\n. ./lib.sh\ncheck\n", "lib.sh": "check() { echo \"validated $GPUAAS_NODE_ID $GPUAAS_FABRIC_MODE\"; }\n"})
	failing := []byte("#!/bin/sh\necho no HCA >&2\nexit 1\n")
	fetch := func(_ context.Context, ref string) ([]byte, error) {
		for _, b := range [][]byte{bundle, failing} {
			if proto.BundleDigest(b) == ref {
				return b, nil
			}
		}
		return nil, fmt.Errorf("no bundle %s", ref)
	}
	v := func(t *testing.T) (Validator, string) {
		root := t.TempDir()
		return Validator{NodeID: "j22u15", Root: root, WorkDir: t.TempDir(), Runner: ExecRunner{}, Fetch: fetch,
			IBWait: 200 * time.Millisecond, Poll: 10 * time.Millisecond}, root
	}
	ok, root := v(t)
	writeIBPort(t, root, "mlx5_0", "4: ACTIVE")
	writeIBPort(t, root, "mlx5_1", "4: ACTIVE")
	res, err := ok.Run(context.Background(), proto.NodeValidatePayload{WorkflowID: "w", BundleRef: proto.BundleDigest(bundle), FabricMode: proto.FabricIB})
	require.NoError(t, err)
	assert.Contains(t, res.Detail, "validated j22u15 ib")
	assert.Equal(t, []proto.IBPortState{{Device: "mlx5_0", Port: 1, State: "ACTIVE", PhysState: "LinkUp"},
		{Device: "mlx5_1", Port: 1, State: "ACTIVE", PhysState: "LinkUp"}}, res.IBPorts)

	down, root := v(t)
	writeIBPort(t, root, "mlx5_0", "1: DOWN")
	res, err = down.Run(context.Background(), proto.NodeValidatePayload{FabricMode: proto.FabricIB})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "mlx5_0/1 DOWN")
	assert.Len(t, res.IBPorts, 1)

	none, _ := v(t)
	_, err = none.Run(context.Background(), proto.NodeValidatePayload{FabricMode: proto.FabricIB})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no InfiniBand port")

	bad, _ := v(t)
	_, err = bad.Run(context.Background(), proto.NodeValidatePayload{BundleRef: proto.BundleDigest(failing), FabricMode: proto.FabricEthernet})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no HCA")

	eth, _ := v(t)
	res, err = eth.Run(context.Background(), proto.NodeValidatePayload{FabricMode: proto.FabricEthernet})
	require.NoError(t, err)
	assert.Equal(t, "nothing to validate", res.Detail)
}

// TestServedBytesMustMatchTheDigest: a server answering other bytes for
// the digest (a stale cache) is refused.
func TestServedBytesMustMatchTheDigest(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	ref := proto.BundleDigest([]byte("#!/bin/sh\necho real\n"))
	f.coord.bundles[ref] = []byte("#!/bin/sh\necho tampered\n")
	_, err := f.b.Fetch(context.Background(), ref)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "digest mismatch")
}

func TestUntarRefusesEscapes(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"../evil", "/etc/passwd", "a/../../b"} {
		err := untar(tgz(t, map[string]string{name: "x"}), t.TempDir())
		require.Error(t, err, name)
		assert.Contains(t, err.Error(), "leaves the bundle directory")
	}
}

func TestSiteCAMustBeTheRenderedOne(t *testing.T) {
	t.Parallel()
	ca := []byte("not a certificate\n")
	sum := sha256.Sum256(ca)
	err := VerifyCA(ca, hex.EncodeToString(sum[:]))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no PEM certificate")
	err = VerifyCA(ca, strings.Repeat("0", 64))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "is not the rendered")
	root := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(root, EtcDir), 0o755))
	_, err = New(Config{Inputs: Inputs{CoordinatorURL: "https://c:7480", NodeID: "n1", Token: testToken, CASHA256: strings.Repeat("1", 64)},
		Root: root, StateDir: root, Runner: ExecRunner{}, Agent: &enrollingAgent{}})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "is missing")
}

// fakeRunner records a transcript.
type fakeRunner struct{ calls []string }

func (f *fakeRunner) Run(_ context.Context, dir string, _ []string, name string, args ...string) ([]byte, error) {
	f.calls = append(f.calls, fmt.Sprintf("%s: %s %s", dir, name, strings.Join(args, " ")))
	return nil, nil
}

func TestSystemdStarterTranscript(t *testing.T) {
	t.Parallel()
	r := &fakeRunner{}
	require.NoError(t, SystemdStarter{Runner: r}.Start(context.Background(), "/etc/gpuaas/agent.json"))
	want := []string{"/: systemctl enable gpuaas-agent.service", "/: systemctl restart gpuaas-agent.service"}
	if d := cmp.Diff(want, r.calls); d != "" {
		t.Errorf("transcript (-want +got):\n%s", d)
	}
}
