// Package bootstrap is gpuaas-bootstrap, the small program cloud-init runs
// on a freshly deployed host (coordinator/maasflow renders the user-data):
// it reads the rendered inputs, verifies the site CA against the digest
// the coordinator rendered, fetches the site bootstrap bundle and verifies
// its sha256, runs it, installs the agent configuration and the
// single-use bootstrap token, starts the agent (already in the image) and
// waits for its enrollment, then runs the post-deploy validation (the
// validation bundle, and with fabric_mode ib the InfiniBand ports must be
// ACTIVE). Each phase is posted to the coordinator as a node_bootstrap
// callback (started / succeeded / failed), which the onboarding workflow
// records on its timeline.
//
//	cloud-init ─▶ gpuaas-bootstrap ─▶ ping ─▶ bundle_fetch ─▶ site_bootstrap ─▶ node_bootstrap (agent.json, token, start agent)
//	                                   └─ every phase ─▶ POST /v1/bootstrap/report      ─▶ enrolled? ─▶ post_deploy_validation
//
// It is idempotent: run again on a host whose agent already holds its
// credential, it only starts the agent.
package bootstrap

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/hostops/fabric"
	"github.com/gpuaas/gpuaas/internal/atomicfile"
	"github.com/gpuaas/gpuaas/proto"
)

// Inputs are the rendered bootstrap inputs (the env file of the
// user-data).
type Inputs struct {
	CoordinatorURL      string
	NodeID              string
	Token               string
	SiteBundleRef       string
	ValidationBundleRef string
	FabricMode          proto.FabricMode
	WorkflowID          string
	CASHA256            string
}

var (
	tokenRe = regexp.MustCompile(`^gpb_[0-9a-f]{64}$`)
	hexRe   = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

// ParseEnv parses and validates the env file content (KEY=value lines).
func ParseEnv(content string) (Inputs, error) {
	vals := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(content))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok || !strings.HasPrefix(k, "GPUAAS_") {
			return Inputs{}, fmt.Errorf("bootstrap env line %d: not GPUAAS_KEY=value", n)
		}
		vals[k] = v
	}
	in := Inputs{CoordinatorURL: vals["GPUAAS_COORDINATOR"], NodeID: vals["GPUAAS_NODE_ID"], Token: vals["GPUAAS_BOOTSTRAP_TOKEN"],
		SiteBundleRef: vals["GPUAAS_SITE_BUNDLE"], ValidationBundleRef: vals["GPUAAS_VALIDATION_BUNDLE"],
		FabricMode: proto.FabricMode(vals["GPUAAS_FABRIC_MODE"]), WorkflowID: vals["GPUAAS_WORKFLOW"], CASHA256: vals["GPUAAS_SITE_CA_SHA256"]}
	return in, in.Validate()
}

// Validate checks the inputs (nothing is written before they pass).
func (in Inputs) Validate() error {
	u, err := url.Parse(in.CoordinatorURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" {
		return fmt.Errorf("bootstrap inputs: GPUAAS_COORDINATOR %q is not an http(s) base URL", in.CoordinatorURL)
	}
	if err := proto.ValidateID("GPUAAS_NODE_ID", in.NodeID); err != nil {
		return fmt.Errorf("bootstrap inputs: %w", err)
	}
	if err := hostops.ValidName(in.NodeID); err != nil {
		return fmt.Errorf("bootstrap inputs: GPUAAS_NODE_ID: %w", err)
	}
	if !tokenRe.MatchString(in.Token) {
		return fmt.Errorf("bootstrap inputs: GPUAAS_BOOTSTRAP_TOKEN is not a bootstrap token (gpb_ + 64 hex digits)")
	}
	for _, r := range []struct{ k, v string }{{"GPUAAS_SITE_BUNDLE", in.SiteBundleRef}, {"GPUAAS_VALIDATION_BUNDLE", in.ValidationBundleRef}} {
		if err := proto.ValidateBundleRef(r.k, r.v); err != nil {
			return fmt.Errorf("bootstrap inputs: %w", err)
		}
	}
	if in.FabricMode != "" && !slices.Contains(proto.FabricModes, in.FabricMode) {
		return fmt.Errorf("bootstrap inputs: GPUAAS_FABRIC_MODE %q is not ethernet, roce or ib", in.FabricMode)
	}
	if in.WorkflowID != "" {
		if err := proto.ValidateID("GPUAAS_WORKFLOW", in.WorkflowID); err != nil {
			return fmt.Errorf("bootstrap inputs: %w", err)
		}
	}
	if in.CASHA256 != "" && !hexRe.MatchString(in.CASHA256) {
		return fmt.Errorf("bootstrap inputs: GPUAAS_SITE_CA_SHA256 is not 64 hex digits")
	}
	return nil
}

// Runner runs a command (site bundles, systemctl). The fake records a
// transcript.
type Runner interface {
	Run(ctx context.Context, dir string, env []string, name string, args ...string) ([]byte, error)
}

// AgentStarter starts the node agent with the configuration file at
// configPath.
type AgentStarter interface {
	Start(ctx context.Context, configPath string) error
}

// Config configures one bootstrap run.
type Config struct {
	Inputs Inputs
	// Root is the host root: /etc/gpuaas and /sys live under it ("/" on a
	// host, the generated tree in the lab).
	Root string
	// StateDir is the agent's state directory (its credential file marks
	// the enrollment).
	StateDir string
	// WorkDir is where bundles are unpacked (default Root/var/lib/gpuaas/bootstrap).
	WorkDir string
	Runner  Runner
	Agent   AgentStarter
	// HTTPClient overrides the client (default: trusts the site CA).
	HTTPClient *http.Client
	// EnrollTimeout bounds the wait for the agent's credential (default
	// 10m); BundleTimeout bounds one bundle run (30m); Poll paces waits (1s).
	EnrollTimeout, BundleTimeout, Poll time.Duration
	Logger                             *slog.Logger
}

// Files of the host root.
const (
	EtcDir        = "etc/gpuaas"
	CAFile        = "site-ca.pem"
	AgentConfig   = "agent.json"
	TokenFileName = "bootstrap.token"
	// credentialFile is agent/daemon.CredentialFile.
	credentialFile = "credential"
)

// Bootstrap is one run.
type Bootstrap struct {
	cfg Config
	hc  *http.Client
	log *slog.Logger
}

// New checks the configuration and builds the HTTP client (trusting the
// site CA after verifying it is the one the coordinator rendered).
func New(cfg Config) (*Bootstrap, error) {
	if err := cfg.Inputs.Validate(); err != nil {
		return nil, err
	}
	if !filepath.IsAbs(cfg.Root) || !filepath.IsAbs(cfg.StateDir) {
		return nil, fmt.Errorf("bootstrap: root %q and state dir %q must be absolute", cfg.Root, cfg.StateDir)
	}
	if cfg.Runner == nil || cfg.Agent == nil {
		return nil, fmt.Errorf("bootstrap: a command runner and an agent starter are required")
	}
	if cfg.WorkDir == "" {
		cfg.WorkDir = filepath.Join(cfg.Root, "var/lib/gpuaas/bootstrap")
	}
	for d, v := range map[*time.Duration]time.Duration{&cfg.EnrollTimeout: 10 * time.Minute,
		&cfg.BundleTimeout: 30 * time.Minute, &cfg.Poll: time.Second} {
		if *d <= 0 {
			*d = v
		}
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	b := &Bootstrap{cfg: cfg, log: log.With("node", cfg.Inputs.NodeID)}
	hc, err := b.client()
	if err != nil {
		return nil, err
	}
	b.hc = hc
	return b, nil
}

func (b *Bootstrap) etc(name string) string { return filepath.Join(b.cfg.Root, EtcDir, name) }

// client verifies the CA file against the rendered digest and trusts it.
func (b *Bootstrap) client() (*http.Client, error) {
	if b.cfg.HTTPClient != nil {
		return b.cfg.HTTPClient, nil
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	ca, err := os.ReadFile(b.etc(CAFile))
	switch {
	case errors.Is(err, os.ErrNotExist):
		if b.cfg.Inputs.CASHA256 != "" {
			return nil, fmt.Errorf("site CA: %s is missing but the user-data names its digest", b.etc(CAFile))
		}
		if strings.HasPrefix(b.cfg.Inputs.CoordinatorURL, "https://") {
			return nil, fmt.Errorf("site CA: %s is missing and the coordinator is https", b.etc(CAFile))
		}
	case err != nil:
		return nil, fmt.Errorf("site CA: %w", err)
	default:
		if err := VerifyCA(ca, b.cfg.Inputs.CASHA256); err != nil {
			return nil, err
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(ca)
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}, nil
}

// VerifyCA checks a CA file: its sha256 is the rendered one and it holds
// only certificates.
func VerifyCA(ca []byte, wantSHA256 string) error {
	sum := sha256.Sum256(ca)
	if wantSHA256 != "" && hex.EncodeToString(sum[:]) != wantSHA256 {
		return fmt.Errorf("site CA: the file's sha256 %x is not the rendered %s", sum, wantSHA256)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return fmt.Errorf("site CA: no PEM certificate in the file")
	}
	return nil
}

// Report posts one callback (best effort: three tries; the bootstrap goes
// on without the coordinator hearing of it).
func (b *Bootstrap) Report(ctx context.Context, ph proto.BootstrapPhase, st proto.BootstrapStatus, detail string, ports []proto.IBPortState) {
	body, _ := json.Marshal(map[string]any{"node_id": b.cfg.Inputs.NodeID, "workflow_id": b.cfg.Inputs.WorkflowID,
		"phase": ph, "status": st, "detail": truncate(detail, 1000), "ib_ports": ports})
	u := strings.TrimSuffix(b.cfg.Inputs.CoordinatorURL, "/") + proto.BootstrapReportPath
	var last error
	for try := range 3 {
		if try > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Duration(try) * 500 * time.Millisecond):
			}
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
		if err != nil {
			last = err
			break
		}
		req.Header.Set("Authorization", "Bearer "+b.cfg.Inputs.Token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := b.hc.Do(req)
		if err != nil {
			last = err
			continue
		}
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		resp.Body.Close()
		if resp.StatusCode == http.StatusAccepted {
			return
		}
		last = fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(msg)))
		if resp.StatusCode < 500 {
			break
		}
	}
	b.log.Warn("bootstrap report not delivered", "phase", ph, "status", st, "err", last)
}

// phase runs fn between started and succeeded/failed callbacks.
func (b *Bootstrap) phase(ctx context.Context, ph proto.BootstrapPhase, fn func() (string, []proto.IBPortState, error)) error {
	b.Report(ctx, ph, proto.BootstrapStarted, "", nil)
	detail, ports, err := fn()
	if err != nil {
		b.Report(ctx, ph, proto.BootstrapFailed, err.Error(), ports)
		return fmt.Errorf("%s: %w", ph, err)
	}
	b.Report(ctx, ph, proto.BootstrapSucceeded, detail, ports)
	b.log.Info("bootstrap phase done", "phase", ph, "detail", detail)
	return nil
}

// Enrolled reports whether the agent holds its credential.
func (b *Bootstrap) Enrolled() bool {
	_, err := os.Stat(filepath.Join(b.cfg.StateDir, credentialFile))
	return err == nil
}

// Run bootstraps the node.
func (b *Bootstrap) Run(ctx context.Context) error {
	in := b.cfg.Inputs
	if b.Enrolled() {
		b.log.Info("the agent already holds its credential: starting it only")
		return b.cfg.Agent.Start(ctx, b.etc(AgentConfig))
	}
	b.Report(ctx, proto.PhaseCloudInit, proto.BootstrapStarted, "gpuaas-bootstrap started by cloud-init", nil)
	var site []byte
	if err := b.phase(ctx, proto.PhaseBundleFetch, func() (string, []proto.IBPortState, error) {
		if in.SiteBundleRef == "" {
			return "no site bootstrap bundle", nil, nil
		}
		var err error
		site, err = b.Fetch(ctx, in.SiteBundleRef)
		return fmt.Sprintf("%s: %d bytes, digest verified", in.SiteBundleRef, len(site)), nil, err
	}); err != nil {
		return err
	}
	if err := b.phase(ctx, proto.PhaseSiteBootstrap, func() (string, []proto.IBPortState, error) {
		if site == nil {
			return "no site bootstrap bundle", nil, nil
		}
		out, err := b.RunBundle(ctx, "site", site, nil)
		return lastLine(out), nil, err
	}); err != nil {
		return err
	}
	if err := b.phase(ctx, proto.PhaseNodeBootstrap, func() (string, []proto.IBPortState, error) {
		cfgPath, err := b.InstallAgentConfig()
		if err != nil {
			return "", nil, err
		}
		if err := b.cfg.Agent.Start(ctx, cfgPath); err != nil {
			return "", nil, fmt.Errorf("start agent: %w", err)
		}
		return "agent configuration and token installed; agent started", nil, nil
	}); err != nil {
		return err
	}
	if err := b.waitEnrolled(ctx); err != nil {
		b.Report(ctx, proto.PhaseNodeBootstrap, proto.BootstrapFailed, err.Error(), nil)
		return err
	}
	// The token is spent: it leaves the disk.
	if err := os.Remove(b.etc(TokenFileName)); err != nil && !errors.Is(err, os.ErrNotExist) {
		b.log.Warn("remove spent bootstrap token", "err", err)
	}
	b.log.Info("the agent enrolled; bootstrap done")
	return nil
}

// Fetch GETs a bundle with the bootstrap token and verifies its digest.
func (b *Bootstrap) Fetch(ctx context.Context, ref string) ([]byte, error) {
	u := strings.TrimSuffix(b.cfg.Inputs.CoordinatorURL, "/") + proto.BundleContentPath(ref)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, fmt.Errorf("fetch bundle %s: %w", ref, err)
	}
	req.Header.Set("Authorization", "Bearer "+b.cfg.Inputs.Token)
	resp, err := b.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("fetch bundle %s: %w", ref, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, proto.MaxBundleBytes+1))
	if err != nil {
		return nil, fmt.Errorf("fetch bundle %s: %w", ref, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("fetch bundle %s: %s: %s", ref, resp.Status, truncate(strings.TrimSpace(string(body)), 200))
	}
	if got := proto.BundleDigest(body); got != ref {
		return nil, fmt.Errorf("fetch bundle %s: digest mismatch: the content's digest is %s", ref, got)
	}
	return body, nil
}

// RunBundle runs a bundle with the node's environment (see runBundle).
func (b *Bootstrap) RunBundle(ctx context.Context, name string, content []byte, extraEnv []string) ([]byte, error) {
	in := b.cfg.Inputs
	env := append([]string{"GPUAAS_NODE_ID=" + in.NodeID, "GPUAAS_WORKFLOW=" + in.WorkflowID, "GPUAAS_FABRIC_MODE=" + string(in.FabricMode),
		"GPUAAS_COORDINATOR=" + in.CoordinatorURL, "GPUAAS_HOST_ROOT=" + b.cfg.Root,
		"GPUAAS_PROGRESS_URL=" + strings.TrimSuffix(in.CoordinatorURL, "/") + proto.BootstrapReportPath}, extraEnv...)
	return runBundle(ctx, b.cfg.Runner, filepath.Join(b.cfg.WorkDir, name), name, content, env, b.cfg.BundleTimeout)
}

// runBundle runs a bundle: a script is run as is, a gzip tar archive is
// unpacked and its top-level "run" is run, in dir (emptied first).
func runBundle(ctx context.Context, runner Runner, dir, name string, content []byte, env []string, timeout time.Duration) ([]byte, error) {
	if err := os.RemoveAll(dir); err != nil {
		return nil, fmt.Errorf("bundle %s: clear %s: %w", name, dir, err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("bundle %s: %w", name, err)
	}
	entry := filepath.Join(dir, "run")
	switch {
	case bytes.HasPrefix(content, []byte("#!")):
		if err := os.WriteFile(entry, content, 0o700); err != nil {
			return nil, fmt.Errorf("bundle %s: %w", name, err)
		}
	case bytes.HasPrefix(content, []byte{0x1f, 0x8b}):
		if err := untar(content, dir); err != nil {
			return nil, fmt.Errorf("bundle %s: %w", name, err)
		}
		if st, err := os.Stat(entry); err != nil || st.Mode()&0o100 == 0 {
			return nil, fmt.Errorf("bundle %s: the archive has no executable ./run", name)
		}
	default:
		return nil, fmt.Errorf("bundle %s: neither a script nor a gzip tar archive", name)
	}
	env = append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, env...)
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	out, err := runner.Run(rctx, dir, env, entry)
	if err != nil {
		return out, fmt.Errorf("bundle %s: %w: %s", name, err, truncate(lastLine(out), 300))
	}
	return out, nil
}

// untar unpacks regular files and directories; any other entry or a path
// leaving dir is refused.
func untar(content []byte, dir string) error {
	zr, err := gzip.NewReader(bytes.NewReader(content))
	if err != nil {
		return fmt.Errorf("gunzip: %w", err)
	}
	tr := tar.NewReader(zr)
	var total int64
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("untar: %w", err)
		}
		name := filepath.Clean(h.Name)
		if filepath.IsAbs(name) || name == ".." || strings.HasPrefix(name, "../") {
			return fmt.Errorf("untar: entry %q leaves the bundle directory", h.Name)
		}
		dst := filepath.Join(dir, name)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(dst, 0o700); err != nil {
				return err
			}
		case tar.TypeReg:
			total += h.Size
			if total > 64*proto.MaxBundleBytes {
				return fmt.Errorf("untar: unpacks to over %d bytes", 64*proto.MaxBundleBytes)
			}
			if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
				return err
			}
			f, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode)&0o700)
			if err != nil {
				return err
			}
			_, cerr := io.Copy(f, io.LimitReader(tr, h.Size))
			if err := errors.Join(cerr, f.Close()); err != nil {
				return fmt.Errorf("untar %s: %w", h.Name, err)
			}
		default:
			return fmt.Errorf("untar: entry %q is not a file or directory", h.Name)
		}
	}
}

// InstallAgentConfig writes the agent's configuration and the bootstrap
// token (0600) under Root/etc/gpuaas and returns the configuration path.
func (b *Bootstrap) InstallAgentConfig() (string, error) {
	dir := filepath.Join(b.cfg.Root, EtcDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("install agent config: %w", err)
	}
	tokPath := b.etc(TokenFileName)
	if err := atomicfile.WriteFile(tokPath, []byte(b.cfg.Inputs.Token+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("install bootstrap token: %w", err)
	}
	cfg := map[string]any{"node_id": b.cfg.Inputs.NodeID, "coordinators": []string{b.cfg.Inputs.CoordinatorURL},
		"state_dir": b.cfg.StateDir, "bootstrap_token_file": tokPath}
	if _, err := os.Stat(b.etc(CAFile)); err == nil && strings.HasPrefix(b.cfg.Inputs.CoordinatorURL, "https://") {
		// The site CA the user-data carried (the cluster CA): the agent
		// checks the coordinators against it.
		cfg["ca_file"] = b.etc(CAFile)
	}
	body, _ := json.MarshalIndent(cfg, "", "  ")
	path := b.etc(AgentConfig)
	if err := atomicfile.WriteFile(path, append(body, '\n'), 0o644); err != nil {
		return "", fmt.Errorf("install agent config: %w", err)
	}
	return path, nil
}

func (b *Bootstrap) waitEnrolled(ctx context.Context) error {
	deadline := time.Now().Add(b.cfg.EnrollTimeout)
	for !b.Enrolled() {
		if time.Now().After(deadline) {
			return fmt.Errorf("the agent did not enroll within %s (no %s)", b.cfg.EnrollTimeout, filepath.Join(b.cfg.StateDir, credentialFile))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(b.cfg.Poll):
		}
	}
	return nil
}

// Validator runs the post-deploy validation on an enrolled node (the
// agent's node.validate task): the validation bundle, then with
// fabric_mode ib a wait until every InfiniBand port is ACTIVE.
type Validator struct {
	NodeID  string
	Root    string // host root
	WorkDir string // where the bundle is unpacked
	Runner  Runner
	// Fetch returns a bundle's bytes, its digest verified.
	Fetch func(ctx context.Context, ref string) ([]byte, error)
	// IBWait bounds the wait for ACTIVE ports (default 5m), Poll paces
	// it (1s); BundleTimeout bounds the bundle (30m).
	IBWait, Poll, BundleTimeout time.Duration
}

// Run validates; the result carries the ports it read (also on failure).
func (v Validator) Run(ctx context.Context, p proto.NodeValidatePayload) (proto.NodeValidateResult, error) {
	for d, def := range map[*time.Duration]time.Duration{&v.IBWait: 5 * time.Minute, &v.Poll: time.Second, &v.BundleTimeout: 30 * time.Minute} {
		if *d <= 0 {
			*d = def
		}
	}
	var notes []string
	if p.BundleRef != "" {
		if err := proto.ValidateBundleRef("validation bundle", p.BundleRef); err != nil {
			return proto.NodeValidateResult{}, err
		}
		content, err := v.Fetch(ctx, p.BundleRef)
		if err != nil {
			return proto.NodeValidateResult{}, err
		}
		env := []string{"GPUAAS_NODE_ID=" + v.NodeID, "GPUAAS_WORKFLOW=" + p.WorkflowID, "GPUAAS_FABRIC_MODE=" + string(p.FabricMode), "GPUAAS_HOST_ROOT=" + v.Root}
		out, err := runBundle(ctx, v.Runner, filepath.Join(v.WorkDir, "validation"), "validation", content, env, v.BundleTimeout)
		if err != nil {
			return proto.NodeValidateResult{Detail: lastLine(out)}, err
		}
		notes = append(notes, "validation bundle passed: "+lastLine(out))
	}
	if p.FabricMode != proto.FabricIB {
		if len(notes) == 0 {
			notes = append(notes, "nothing to validate")
		}
		return proto.NodeValidateResult{Detail: strings.Join(notes, "; ")}, nil
	}
	root, err := hostops.NewRoot(v.Root)
	if err != nil {
		return proto.NodeValidateResult{}, err
	}
	deadline := time.Now().Add(v.IBWait)
	for {
		ports, err := ReadIBPorts(root)
		if err != nil {
			return proto.NodeValidateResult{}, err
		}
		down := NotActive(ports)
		if len(ports) > 0 && len(down) == 0 {
			notes = append(notes, fmt.Sprintf("%d InfiniBand port(s) ACTIVE", len(ports)))
			return proto.NodeValidateResult{Detail: strings.Join(notes, "; "), IBPorts: ports}, nil
		}
		if time.Now().After(deadline) {
			res := proto.NodeValidateResult{Detail: strings.Join(notes, "; "), IBPorts: ports}
			if len(ports) == 0 {
				return res, fmt.Errorf("fabric_mode ib: no InfiniBand port on the host")
			}
			return res, fmt.Errorf("fabric_mode ib: ports not ACTIVE after %s: %s", v.IBWait, strings.Join(down, ", "))
		}
		select {
		case <-ctx.Done():
			return proto.NodeValidateResult{IBPorts: ports}, ctx.Err()
		case <-time.After(v.Poll):
		}
	}
}

// ReadIBPorts reads the host's InfiniBand ports (RoCE ports, with an
// Ethernet link layer, are not the IB fabric and are left out).
func ReadIBPorts(root hostops.Root) ([]proto.IBPortState, error) {
	ps, err := fabric.ReadIBPorts(root)
	if err != nil {
		return nil, fmt.Errorf("read infiniband ports: %w", err)
	}
	var out []proto.IBPortState
	for _, p := range ps {
		if p.LinkLayer == "Ethernet" {
			continue
		}
		out = append(out, proto.IBPortState{Device: p.Device, Port: p.Port, State: p.State, PhysState: p.PhysState})
	}
	return out, nil
}

// NotActive lists the ports whose state is not ACTIVE.
func NotActive(ports []proto.IBPortState) []string {
	var down []string
	for _, p := range ports {
		if p.State != "ACTIVE" {
			down = append(down, fmt.Sprintf("%s/%d %s", p.Device, p.Port, p.State))
		}
	}
	return down
}

func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return truncate(lines[len(lines)-1], 200)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
