// Package launch starts gpuaas processes on this machine for the lab and
// for end-to-end tests: coordinators on loopback with their data under one
// folder, each with its own log file, stopped together.
package launch

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gpuaas/gpuaas/coordinator/pki"
	"github.com/gpuaas/gpuaas/internal/atomicfile"
)

// The lab serves TLS: its coordinators are given the cluster CA kept in
// the lab folder, and everything that calls them (gpuaasctl, the agents,
// the launcher, the tests) trusts it. Get the lab's URLs and clients here,
// never by writing a scheme.

// CAFile is the cluster CA certificate of the lab in labDir (the key is
// ca.key beside it, mode 0600).
func CAFile(labDir string) string { return filepath.Join(labDir, "ca.pem") }

// CAKeyFile is the cluster CA's private key in labDir.
func CAKeyFile(labDir string) string { return filepath.Join(labDir, "ca.key") }

// APIURL is the base URL of a lab coordinator's API at addr.
func APIURL(addr string) string { return "https://" + addr }

// HTTPClient is an HTTP client trusting the CAs of the lab in labDir:
// its first CA (CAFile) and, after a CA rotation (gpuaasctl ca rotate),
// every CA its coordinators trust now (TrustPEM).
func HTTPClient(labDir string) (*http.Client, error) {
	b, err := TrustPEM(labDir)
	if err != nil {
		return nil, err
	}
	pool, err := pki.PoolFromPEM(b)
	if err != nil {
		return nil, fmt.Errorf("lab CA: %w", err)
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: pki.ClientConfig(pool, nil), ForceAttemptHTTP2: true,
		MaxIdleConnsPerHost: 16, IdleConnTimeout: 90 * time.Second}}, nil
}

// BundleFile is the trust bundle of the lab in labDir: TrustPEM, which
// the env files name as GPUAAS_CA_FILE and gpuaas-lab keeps current while
// it runs (WriteBundle), so clients keep working through a CA rotation.
func BundleFile(labDir string) string { return filepath.Join(labDir, "ca-bundle.pem") }

// WriteBundle writes TrustPEM to BundleFile (atomically, only when it
// changed).
func WriteBundle(labDir string) error {
	b, err := TrustPEM(labDir)
	if err != nil {
		return err
	}
	if old, err := os.ReadFile(BundleFile(labDir)); err == nil && string(old) == string(b) {
		return nil
	}
	return atomicfile.WriteFile(BundleFile(labDir), b, 0o644)
}

// TrustPEM is the PEM of every CA a client of the lab in labDir should
// trust: the lab's first CA (CAFile) and the CAs each coordinator trusts
// after a rotation (the "trusted" list of its
// data/<id>/tls/rotation.json, which the coordinator keeps as it follows
// the rotation table). A retired CA stays in it only as the lab's first
// CA: trusting it does no harm, as no coordinator presents a certificate
// of it any more.
func TrustPEM(labDir string) ([]byte, error) {
	first, err := os.ReadFile(CAFile(labDir))
	if err != nil {
		return nil, fmt.Errorf("lab CA: %w", err)
	}
	out := append([]byte(nil), first...)
	seen := map[string]bool{}
	if certs, err := pki.ParseCertsPEM(first); err == nil {
		for _, c := range certs {
			seen[pki.ID(c)] = true
		}
	}
	files, _ := filepath.Glob(filepath.Join(labDir, "data", "*", "tls", "rotation.json"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // a coordinator writing it: the others have the same list
		}
		var st struct {
			Trusted []string `json:"trusted"`
		}
		if json.Unmarshal(b, &st) != nil {
			continue
		}
		for _, p := range st.Trusted {
			certs, err := pki.ParseCertsPEM([]byte(p))
			if err != nil {
				continue
			}
			for _, c := range certs {
				if !seen[pki.ID(c)] {
					seen[pki.ID(c)] = true
					out = append(out, pki.EncodeCertPEM(c)...)
				}
			}
		}
	}
	return out, nil
}

// EnsureCA loads the lab's cluster CA from labDir, creating it on the
// first run.
func EnsureCA(labDir string) (*pki.CA, error) {
	ca, _, err := pki.LoadOrCreate(labDir, true, time.Now())
	return ca, err
}

// Proc is one child process with its log file.
type Proc struct {
	Name    string
	Args    []string
	Env     []string
	LogPath string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// Start runs the process, appending its output to LogPath.
func (p *Proc) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil && p.done != nil {
		select {
		case <-p.done:
		default:
			return fmt.Errorf("start %s: already running", p.Name)
		}
	}
	if err := os.MkdirAll(filepath.Dir(p.LogPath), 0o755); err != nil {
		return fmt.Errorf("start %s: %w", p.Name, err)
	}
	logf, err := os.OpenFile(p.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("start %s: %w", p.Name, err)
	}
	cmd := exec.Command(p.Args[0], p.Args[1:]...)
	cmd.Env = append(os.Environ(), p.Env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Own process group so a terminal's Ctrl-C reaches only the launcher,
	// which then stops children in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start %s: %w", p.Name, err)
	}
	p.cmd, p.done, p.err = cmd, make(chan struct{}), nil
	go func(done chan struct{}) {
		err := cmd.Wait()
		logf.Close()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(done)
	}(p.done)
	return nil
}

// Running reports whether the process has been started and not exited.
func (p *Proc) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Pid returns the process ID, 0 if not started.
func (p *Proc) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Wait waits for the process to exit and returns its exit error (nil for
// status 0), or ctx's error first.
func (p *Proc) Wait(ctx context.Context) error {
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	if done == nil {
		return fmt.Errorf("wait for %s: not started", p.Name)
	}
	select {
	case <-done:
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.err
	case <-ctx.Done():
		return fmt.Errorf("wait for %s: %w", p.Name, ctx.Err())
	}
}

// Kill sends SIGKILL and waits for the exit.
func (p *Proc) Kill() { p.signalAndWait(syscall.SIGKILL, 0) }

// Stop sends SIGTERM, waits up to grace, then SIGKILL.
func (p *Proc) Stop(grace time.Duration) { p.signalAndWait(syscall.SIGTERM, grace) }

func (p *Proc) signalAndWait(sig syscall.Signal, grace time.Duration) {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil || done == nil {
		return
	}
	select {
	case <-done:
		return
	default:
	}
	_ = cmd.Process.Signal(sig)
	if sig != syscall.SIGKILL {
		select {
		case <-done:
			return
		case <-time.After(grace):
			_ = cmd.Process.Signal(syscall.SIGKILL)
		}
	}
	<-done
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// FreeGossipPort returns a port on 127.0.0.1 free a moment ago for both
// TCP and UDP, as memberlist binds both on one port.
func FreeGossipPort() (int, error) {
	for range 20 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		u, err := net.ListenPacket("udp", fmt.Sprintf("127.0.0.1:%d", port))
		l.Close()
		if err == nil {
			u.Close()
			return port, nil
		}
	}
	return 0, errors.New("no port free for both TCP and UDP on 127.0.0.1 after 20 tries")
}

// Token is a bearer token with its role.
type Token struct {
	Name   string `json:"name"`
	Role   string `json:"role"`
	Secret string `json:"-"`
	SHA256 string `json:"sha256"`
}

// NewToken makes a random bearer token.
func NewToken(name, role string) (Token, error) {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return Token{}, err
	}
	return TokenOf(name, role, "gpuaas_"+hex.EncodeToString(b)), nil
}

// TokenOf is the token entry of an existing secret (a lab folder's
// tokens.secret.json keeps the secrets, the tokens file their hashes).
func TokenOf(name, role, secret string) Token {
	sum := sha256.Sum256([]byte(secret))
	return Token{Name: name, Role: role, Secret: secret, SHA256: hex.EncodeToString(sum[:])}
}

// WriteTokensFile writes the coordinators' tokens file (hashes only).
func WriteTokensFile(path string, toks []Token) error {
	b, err := json.MarshalIndent(toks, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(path, append(b, '\n'), 0o600)
}

// WaitHTTP polls url until it answers 200 with a bearer token or ctx ends.
func WaitHTTP(ctx context.Context, url, token string) error {
	return WaitHTTPWith(ctx, http.DefaultClient, url, token)
}

// WaitHTTPWith is WaitHTTP with a client (one trusting the lab's CA).
func WaitHTTPWith(ctx context.Context, hc *http.Client, url, token string) error {
	var last error
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := hc.Do(req)
		if err == nil {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(body)))
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for %s: %w (last: %v)", url, ctx.Err(), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// StopAll stops procs in reverse order.
func StopAll(procs []*Proc, grace time.Duration, log *slog.Logger) {
	for i := len(procs) - 1; i >= 0; i-- {
		if procs[i].Running() {
			log.Info("stopping", "proc", procs[i].Name, "pid", procs[i].Pid())
			procs[i].Stop(grace)
		}
	}
}

// ErrNoBinary says a gpuaas binary was not built.
var ErrNoBinary = errors.New("binary not found (run make build)")

// FindBinary looks for name next to the running executable, then in
// $GPUAAS_BIN, then on PATH.
func FindBinary(name string) (string, error) {
	var dirs []string
	if exe, err := os.Executable(); err == nil {
		dirs = append(dirs, filepath.Dir(exe))
	}
	if d := os.Getenv("GPUAAS_BIN"); d != "" {
		dirs = append(dirs, d)
	}
	for _, d := range dirs {
		p := filepath.Join(d, name)
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p, nil
		}
	}
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("%s: %w", name, ErrNoBinary)
}
