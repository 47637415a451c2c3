package slice

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"
)

// expect is what the readiness checks compare the guest's answers with.
type expect struct {
	InstanceID string
	Marker     string // hex sha256, "" = unknown
	GPUs       int
}

// readinessCheck is one command the readiness gate runs over SSH.
type readinessCheck struct {
	Name    string
	Command string
	Verify  func(out string, want expect) (evidence string, err error)
}

// readinessChecks maps an image's ReadinessCheck to its checks; every
// image runs the base checks first.
var readinessChecks = map[string][]readinessCheck{
	"":     nil,
	"cuda": {cudaCheck},
}

var baseChecks = []readinessCheck{
	{
		Name:    "instance-id",
		Command: "cat /run/gpuaas/instance-id",
		Verify: func(out string, want expect) (string, error) {
			if got := strings.TrimSpace(out); got != want.InstanceID {
				return "", fmt.Errorf("guest instance-id %q, seed says %q", got, want.InstanceID)
			}
			return "ssh: instance-id " + want.InstanceID + " from the seed", nil
		},
	},
	{
		Name:    "marker",
		Command: "shasum -a 256 /disk/gpuaas/marker || sha256sum /disk/gpuaas/marker",
		Verify: func(out string, want expect) (string, error) {
			f := strings.Fields(out)
			if len(f) == 0 {
				return "", fmt.Errorf("no marker digest in %q", out)
			}
			if want.Marker == "" {
				return "ssh: marker sha256 " + f[0] + " (no catalog digest to compare)", nil
			}
			if f[0] != want.Marker {
				return "", fmt.Errorf("marker sha256 on the cloned disk is %s, image says %s", f[0], want.Marker)
			}
			return "ssh: marker sha256 " + f[0] + " matches the image", nil
		},
	},
}

// cudaCheck is the CUDA developer image's check: nvidia-smi must list
// exactly the slice's GPUs, each an H200 with every queried field known
// and a driver version. The exit status travels in the output so a failing
// nvidia-smi ("No devices were found", exit 6) fails the check at once
// instead of being retried as an unreachable guest.
var cudaCheck = readinessCheck{
	Name:    "cuda",
	Command: "nvidia-smi --query-gpu=" + strings.Join(cudaQuery, ",") + " --format=csv,noheader 2>&1; echo " + cudaExitTag + "$?",
	Verify:  verifyCUDA,
}

// cudaQuery are the fields the cuda check asks nvidia-smi for.
var cudaQuery = []string{"name", "pci.bus_id", "uuid", "driver_version", "memory.total"}

// cudaModel is the GPU every slice GPU must be (nvidia-smi's name for the
// H200 SXM; "NVIDIA H200 NVL" is accepted too).
const cudaModel = "NVIDIA H200"

// cudaExitTag prefixes the line carrying nvidia-smi's exit status.
const cudaExitTag = "gpuaas-nvidia-smi-exit="

// cudaGPU is one row of the cuda check's query.
type cudaGPU struct{ Name, BusID, UUID, Driver, Memory string }

// parseCUDA splits the cuda check's output into nvidia-smi's rows, the
// rest of its output (messages) and its exit status.
func parseCUDA(out string) (rows []cudaGPU, msg string, exit int, err error) {
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	last := strings.TrimSpace(lines[len(lines)-1])
	code, ok := strings.CutPrefix(last, cudaExitTag)
	if !ok {
		return nil, "", 0, fmt.Errorf("no exit status in the output of nvidia-smi: %q", cudaClip(out, 200))
	}
	if exit, err = strconv.Atoi(code); err != nil {
		return nil, "", 0, fmt.Errorf("nvidia-smi exit status %q", code)
	}
	lines = lines[:len(lines)-1]
	if exit != 0 {
		return nil, strings.TrimSpace(strings.Join(lines, "\n")), exit, nil
	}
	for i, l := range lines {
		if strings.TrimSpace(l) == "" {
			continue
		}
		f := strings.Split(l, ",")
		if len(f) != len(cudaQuery) {
			return nil, "", 0, fmt.Errorf("nvidia-smi line %d: %q has %d fields, want %d (%s)", i+1, l, len(f), len(cudaQuery), strings.Join(cudaQuery, ","))
		}
		for j := range f {
			f[j] = strings.TrimSpace(f[j])
		}
		rows = append(rows, cudaGPU{Name: f[0], BusID: f[1], UUID: f[2], Driver: f[3], Memory: f[4]})
	}
	return rows, "", 0, nil
}

// unknownField reports a value nvidia-smi prints for a field it could not
// read: "[N/A]", "[Unknown Error]", "[Not Supported]", "ERR!".
func unknownField(v string) bool {
	return v == "" || v == "ERR!" || strings.HasPrefix(v, "[")
}

func verifyCUDA(out string, want expect) (string, error) {
	rows, msg, exit, err := parseCUDA(out)
	if err != nil {
		return "", err
	}
	if exit != 0 {
		return "", fmt.Errorf("nvidia-smi exited %d: %s (the slice has %d GPUs)", exit, cudaClip(msg, 200), want.GPUs)
	}
	if len(rows) != want.GPUs {
		return "", fmt.Errorf("nvidia-smi lists %d GPUs, the slice has %d", len(rows), want.GPUs)
	}
	if len(rows) == 0 {
		// A slice always has a GPU; a check that expects none proves nothing.
		return "", fmt.Errorf("nvidia-smi lists no GPU")
	}
	seen := map[string]bool{}
	var desc []string
	for i, g := range rows {
		for j, v := range []string{g.Name, g.BusID, g.UUID, g.Driver, g.Memory} {
			if unknownField(v) {
				return "", fmt.Errorf("nvidia-smi GPU %d (%s): %s is %q", i, g.BusID, cudaQuery[j], v)
			}
		}
		if g.Name != cudaModel && !strings.HasPrefix(g.Name, cudaModel+" ") {
			return "", fmt.Errorf("nvidia-smi GPU %d (%s) is a %q, the slice's GPUs are %s", i, g.BusID, g.Name, cudaModel)
		}
		if !driverVersionRE.MatchString(g.Driver) {
			return "", fmt.Errorf("nvidia-smi GPU %d (%s): driver version %q", i, g.BusID, g.Driver)
		}
		if g.Driver != rows[0].Driver {
			return "", fmt.Errorf("nvidia-smi GPU %d (%s): driver %s, GPU 0 has %s", i, g.BusID, g.Driver, rows[0].Driver)
		}
		if seen[g.UUID] || seen[g.BusID] {
			return "", fmt.Errorf("nvidia-smi lists GPU %s (%s) twice", g.UUID, g.BusID)
		}
		seen[g.UUID], seen[g.BusID] = true, true
		desc = append(desc, g.Name+" "+g.BusID+" "+g.UUID+" "+g.Memory)
	}
	return fmt.Sprintf("ssh: nvidia-smi lists %d GPUs as the plan says, driver %s: %s", len(rows), rows[0].Driver, strings.Join(desc, "; ")), nil
}

var driverVersionRE = regexp.MustCompile(`^[0-9]{3}\.[0-9]{1,3}(\.[0-9]{1,3})?$`)

func cudaClip(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// checksFor returns the checks of an image's readiness check name.
func checksFor(name string) ([]readinessCheck, error) {
	extra, ok := readinessChecks[name]
	if !ok {
		return nil, fmt.Errorf("image readiness check %q is unknown", name)
	}
	return append(append([]readinessCheck(nil), baseChecks...), extra...), nil
}

// ready runs the image's checks, retrying each until the SSH deadline.
func (r *Runtime) ready(ctx context.Context, req ProvisionRequest, rec *Record, imgPath string) ([]string, error) {
	checks, err := checksFor(req.Image.ReadinessCheck)
	if err != nil {
		return nil, err
	}
	ip, _ := netip.ParseAddr(rec.IP)
	key, _, err := r.guestKey(rec)
	if err != nil {
		return nil, err
	}
	if f, ok := r.d.Guest.(forgetter); ok {
		defer f.Forget(ip)
	}
	want := expect{InstanceID: rec.InstanceID, Marker: expectedMarker(req.Image, imgPath), GPUs: len(req.Plan.Devices)}
	deadline := r.d.Now().Add(r.opts.SSHTimeout)
	var evidence []string
	for _, c := range checks {
		for {
			out, err := r.d.Guest.Run(ctx, ip, key, c.Command)
			if err == nil {
				ev, verr := c.Verify(out, want)
				if verr != nil {
					return evidence, fmt.Errorf("readiness check %s: %w", c.Name, verr)
				}
				evidence = append(evidence, ev)
				break
			}
			if r.d.Now().After(deadline) {
				return evidence, fmt.Errorf("readiness check %s: SSH to %s not answering after %s: %w", c.Name, ip, r.opts.SSHTimeout, err)
			}
			if err := sleep(ctx, max(r.opts.PollInterval, 250*time.Millisecond)); err != nil {
				return evidence, err
			}
		}
	}
	if hk, ok := r.d.Guest.(hostKeyer); ok {
		if k, ok := hk.HostKey(ip); ok {
			rec.HostKey = strings.TrimSpace(string(ssh.MarshalAuthorizedKey(k)))
			evidence = append(evidence, "ssh: guest host key "+ssh.FingerprintSHA256(k))
		}
	}
	return evidence, nil
}

// forgetter is implemented by Guests that keep connections open.
type forgetter interface{ Forget(addr netip.Addr) }

// SSHGuest runs commands on guests over SSH (port 22) with the key each
// call names (the allocation's own agent key). One connection per guest
// and key is kept open between commands (the readiness checks run
// several) until Forget or an error.
type SSHGuest struct {
	User string
	// Timeout bounds a dial and a command (default 15 s).
	Timeout time.Duration

	mu       sync.Mutex
	conns    map[guestConn]*ssh.Client
	hostKeys map[netip.Addr]ssh.PublicKey
}

// HostKey returns the host key the guest at addr presented on the last
// connection dialled to it.
func (g *SSHGuest) HostKey(addr netip.Addr) (ssh.PublicKey, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	k, ok := g.hostKeys[addr]
	return k, ok
}

// hostKeyer is implemented by Guests that record the guest's host key.
type hostKeyer interface {
	HostKey(addr netip.Addr) (ssh.PublicKey, bool)
}

// guestConn names an open connection: the guest and the key it logged in with.
type guestConn struct {
	addr netip.Addr
	key  string // SHA256 fingerprint
}

// LoadSSHKey reads an OpenSSH private key and returns its signer and its
// authorized_keys line.
func LoadSSHKey(path string) (ssh.Signer, string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, "", fmt.Errorf("agent SSH key: %w", err)
	}
	s, err := ssh.ParsePrivateKey(b)
	if err != nil {
		return nil, "", fmt.Errorf("agent SSH key %s: %w", path, err)
	}
	return s, strings.TrimSpace(string(ssh.MarshalAuthorizedKey(s.PublicKey()))) + " gpuaas-agent", nil
}

func (g *SSHGuest) timeout() time.Duration {
	if g.Timeout > 0 {
		return g.Timeout
	}
	return 15 * time.Second
}

// client returns the open connection to addr with key, dialling one if
// needed.
func (g *SSHGuest) client(ctx context.Context, addr netip.Addr, key ssh.Signer) (*ssh.Client, error) {
	if key == nil {
		return nil, fmt.Errorf("ssh %s: no key", addr)
	}
	id := guestConn{addr: addr, key: ssh.FingerprintSHA256(key.PublicKey())}
	g.mu.Lock()
	c := g.conns[id]
	g.mu.Unlock()
	if c != nil {
		return c, nil
	}
	user := g.User
	if user == "" {
		user = "root"
	}
	to := g.timeout()
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < to {
		to = max(time.Until(dl), time.Millisecond) // the handshake too ends at ctx's deadline
	}
	cfg := &ssh.ClientConfig{
		User: user, Auth: []ssh.AuthMethod{ssh.PublicKeys(key)},
		// A fresh guest makes its host key at first boot; the agent reaches
		// it over the host's own private bridge, records the key and hands
		// it to the tenant (SliceAccess.HostKeys).
		HostKeyCallback: func(_ string, _ net.Addr, k ssh.PublicKey) error {
			g.mu.Lock()
			defer g.mu.Unlock()
			if g.hostKeys == nil {
				g.hostKeys = map[netip.Addr]ssh.PublicKey{}
			}
			g.hostKeys[addr] = k
			return nil
		},
		Timeout: to,
	}
	d := net.Dialer{Timeout: to}
	conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort(addr.String(), "22"))
	if err != nil {
		return nil, fmt.Errorf("ssh %s: %w", addr, err)
	}
	_ = conn.SetDeadline(time.Now().Add(to))
	cc, chans, reqs, err := ssh.NewClientConn(conn, addr.String(), cfg)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("ssh %s: %w", addr, err)
	}
	_ = conn.SetDeadline(time.Time{})
	c = ssh.NewClient(cc, chans, reqs)
	g.mu.Lock()
	if g.conns == nil {
		g.conns = map[guestConn]*ssh.Client{}
	}
	if other := g.conns[id]; other != nil {
		// Dialled concurrently: keep the first, which may be in use.
		g.mu.Unlock()
		c.Close()
		return other, nil
	}
	g.conns[id] = c
	g.mu.Unlock()
	return c, nil
}

// Forget closes the connections to addr (with any key).
func (g *SSHGuest) Forget(addr netip.Addr) {
	g.mu.Lock()
	var cs []*ssh.Client
	for id, c := range g.conns {
		if id.addr == addr {
			cs = append(cs, c)
			delete(g.conns, id)
		}
	}
	g.mu.Unlock()
	for _, c := range cs {
		c.Close()
	}
}

// Run implements Guest.
func (g *SSHGuest) Run(ctx context.Context, addr netip.Addr, key ssh.Signer, cmd string) (string, error) {
	c, err := g.client(ctx, addr, key)
	if err != nil {
		return "", err
	}
	s, err := c.NewSession()
	if err != nil {
		g.Forget(addr)
		return "", fmt.Errorf("ssh %s: session: %w", addr, err)
	}
	defer s.Close()
	type result struct {
		out []byte
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := s.CombinedOutput(cmd)
		done <- result{out, err}
	}()
	select {
	case r := <-done:
		if r.err != nil {
			var ee *ssh.ExitError
			if !errors.As(r.err, &ee) {
				g.Forget(addr) // the connection broke, not the command
			}
			return string(r.out), fmt.Errorf("ssh %s: %q: %w: %s", addr, cmd, r.err, strings.TrimSpace(string(r.out)))
		}
		return string(r.out), nil
	case <-time.After(g.timeout()):
		g.Forget(addr)
		return "", fmt.Errorf("ssh %s: %q: no answer in %s", addr, cmd, g.timeout())
	case <-ctx.Done():
		g.Forget(addr)
		return "", ctx.Err()
	}
}
