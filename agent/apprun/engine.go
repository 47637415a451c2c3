package apprun

// The part both runners share: an instance's record on the agent, the
// crun command lines, and the health gate. A runner supplies a shell on
// the machine the container runs on (the guest over SSH, or this host) and
// the way the bundle gets there.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gpuaas/gpuaas/proto"
)

// shell runs commands on the machine a container runs on.
type shell interface {
	// run runs cmd with /bin/sh -c, stdin from in (nil = none), and
	// returns its stdout; a non-zero exit is an error carrying stderr.
	run(ctx context.Context, cmd string, in io.Reader) ([]byte, error)
}

// record is what a runner keeps about an instance on the agent: enough to
// find, check and stop it after an agent restart.
type record struct {
	InstanceID   string                `json:"instance_id"`
	AllocationID string                `json:"allocation_id"`
	Container    string                `json:"container"`
	Bundle       string                `json:"bundle"` // on the machine the container runs on
	Host         string                `json:"host"`   // the address the app's ports are on
	App          string                `json:"app"`
	Image        string                `json:"image"`
	Ports        []proto.AppPort       `json:"ports,omitempty"`
	Health       *proto.AppHealthCheck `json:"health,omitempty"`
	// NetNS and Subnet are the local runner's network namespace and the
	// index of its /30.
	NetNS     string    `json:"netns,omitempty"`
	Subnet    int       `json:"subnet,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	// StartedAt is when the runtime started the container.
	StartedAt time.Time `json:"started_at,omitempty"`
}

func (r *record) endpoints() map[int]string {
	e := map[int]string{}
	for _, p := range r.Ports {
		e[p.Port] = net.JoinHostPort(r.Host, strconv.Itoa(p.Port))
	}
	return e
}

// endpointsOf is Runner.Endpoints over rs: the record alone.
func (rs *records) endpointsOf(id string) (map[int]string, error) {
	r, err := rs.get(id)
	if err != nil {
		return nil, err
	}
	return r.endpoints(), nil
}

// records keeps instance records as JSON files in a directory.
type records struct {
	dir string
	mu  sync.Mutex
	// locks serialises Start/Stop per instance.
	locks map[string]*sync.Mutex
}

func newRecords(dir string) (*records, error) {
	if dir == "" {
		return nil, errors.New("apprun: no state directory")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("apprun: state directory: %w", err)
	}
	return &records{dir: dir, locks: map[string]*sync.Mutex{}}, nil
}

func (rs *records) lock(id string) func() {
	rs.mu.Lock()
	l := rs.locks[id]
	if l == nil {
		l = &sync.Mutex{}
		rs.locks[id] = l
	}
	rs.mu.Unlock()
	l.Lock()
	return l.Unlock
}

func (rs *records) path(id string) string { return filepath.Join(rs.dir, containerName(id)+".json") }

func (rs *records) get(id string) (*record, error) {
	b, err := os.ReadFile(rs.path(id))
	if errors.Is(err, os.ErrNotExist) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("apprun: read record of %s: %w", id, err)
	}
	var r record
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("apprun: record of %s: %w", id, err)
	}
	return &r, nil
}

func (rs *records) put(r *record) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	tmp := rs.path(r.InstanceID) + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("apprun: write record of %s: %w", r.InstanceID, err)
	}
	if err := os.Rename(tmp, rs.path(r.InstanceID)); err != nil {
		return fmt.Errorf("apprun: write record of %s: %w", r.InstanceID, err)
	}
	return nil
}

func (rs *records) remove(id string) error {
	if err := os.Remove(rs.path(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("apprun: remove record of %s: %w", id, err)
	}
	return nil
}

func (rs *records) all() ([]*record, error) {
	ents, err := os.ReadDir(rs.dir)
	if err != nil {
		return nil, err
	}
	var out []*record
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(rs.dir, e.Name()))
		if err != nil {
			continue
		}
		var r record
		if json.Unmarshal(b, &r) == nil {
			out = append(out, &r)
		}
	}
	return out, nil
}

var instancePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// containerName is the runtime's container ID for an instance.
func containerName(instanceID string) string { return "gpuaas-app-" + instanceID }

// validateSpec checks what the runners rely on.
func validateSpec(s Spec) error {
	if !instancePattern.MatchString(s.InstanceID) {
		return fmt.Errorf("apprun: instance ID %q: want letters, digits, '.', '_' and '-' (at most 128)", s.InstanceID)
	}
	if s.ImagePath == "" {
		return fmt.Errorf("apprun: instance %s: no image path", s.InstanceID)
	}
	if _, err := ImageDigest(s.App.Image); err != nil {
		return fmt.Errorf("apprun: instance %s: %w", s.InstanceID, err)
	}
	for _, p := range s.App.Ports {
		if p.Port < 1 || p.Port > 65535 {
			return fmt.Errorf("apprun: instance %s: port %d out of range", s.InstanceID, p.Port)
		}
	}
	if hc := s.App.HealthCheck; hc != nil {
		found := false
		for _, p := range s.App.Ports {
			found = found || p.Port == hc.Port
		}
		if !found {
			return fmt.Errorf("apprun: instance %s: health check port %d is not one of the app's ports", s.InstanceID, hc.Port)
		}
	}
	return nil
}

// ociRuntime drives the OCI runtime (crun or runc: the same command
// line for what is used here) through a shell.
type ociRuntime struct {
	bin     string // the runtime's path on the machine it runs on
	root    string // --root ("" = the runtime's default)
	noPivot bool   // the machine's root is an initramfs: pivot_root cannot leave it
}

func (c ociRuntime) cmd(args ...string) string {
	s := c.bin
	if c.root != "" {
		s += " --root " + c.root
	}
	return s + " " + strings.Join(args, " ")
}

// containerState is `<runtime> state`'s answer.
type containerState struct {
	Status  string    `json:"status"` // created | running | stopped | paused
	Pid     int       `json:"pid"`
	Created time.Time `json:"created"`
}

// state returns the container's state, or ErrNotFound.
func (c ociRuntime) state(ctx context.Context, sh shell, name string) (containerState, error) {
	out, err := sh.run(ctx, c.cmd("state", name), nil)
	if err != nil {
		if strings.Contains(err.Error(), "does not exist") || strings.Contains(err.Error(), "No such file") {
			return containerState{}, ErrNotFound
		}
		return containerState{}, fmt.Errorf("%s state %s: %w", c.bin, name, err)
	}
	var st containerState
	if err := json.Unmarshal(out, &st); err != nil {
		return containerState{}, fmt.Errorf("%s state %s: %w: %q", c.bin, name, err, out)
	}
	return st, nil
}

// start runs the bundle detached, its output to <bundle>/output.log.
func (c ociRuntime) start(ctx context.Context, sh shell, name, bundle string) error {
	args := []string{"run", "--detach"}
	if c.noPivot {
		args = append(args, "--no-pivot")
	}
	args = append(args, "--bundle", bundle, name, "</dev/null", ">"+bundle+"/output.log", "2>&1")
	if _, err := sh.run(ctx, c.cmd(args...), nil); err != nil {
		log, _ := sh.run(ctx, "cat "+bundle+"/output.log", nil)
		return fmt.Errorf("%s run %s: %w: %s", c.bin, name, err, tail(log, 2048))
	}
	return nil
}

// remove kills and deletes the container (absent is fine).
func (c ociRuntime) remove(ctx context.Context, sh shell, name string) error {
	if _, err := c.state(ctx, sh, name); errors.Is(err, ErrNotFound) {
		return nil
	}
	if _, err := sh.run(ctx, c.cmd("delete", "--force", name), nil); err != nil {
		if strings.Contains(err.Error(), "does not exist") {
			return nil
		}
		return fmt.Errorf("%s delete %s: %w", c.bin, name, err)
	}
	return nil
}

func tail(b []byte, n int) []byte {
	b = bytes.TrimSpace(b)
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// aliveEvery is how often the health gate asks whether the container
// still runs while its probe fails.
const aliveEvery = 2 * time.Second

// defaultHealthTimeout bounds the health gate of a check without a
// timeout of its own.
const defaultHealthTimeout = 60 * time.Second

// healthy polls r's health check until it passes, the container stops,
// or the check's timeout (bounded by ctx) passes.
func healthy(ctx context.Context, r *record, alive func(context.Context) error) error {
	hc := r.Health
	if hc == nil {
		if len(r.Ports) == 0 {
			return alive(ctx)
		}
		hc = &proto.AppHealthCheck{Port: r.Ports[0].Port}
	}
	timeout := defaultHealthTimeout
	if hc.TimeoutSeconds > 0 {
		timeout = time.Duration(hc.TimeoutSeconds) * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	addr := net.JoinHostPort(r.Host, strconv.Itoa(hc.Port))
	what := "TCP connect " + addr
	if hc.Path != "" {
		what = "GET http://" + addr + hc.Path
	}
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil}}
	var last error
	checked := time.Now()
	timedOut := func() error {
		if last == nil {
			last = ctx.Err()
		}
		return fmt.Errorf("health check %s: %v after %s", what, last, timeout)
	}
	for {
		err := probe(ctx, client, addr, hc.Path)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return timedOut()
		}
		last = err
		// Whether the container still runs is asked less often than the
		// probe (in a guest it is an SSH round trip and a runtime call).
		if time.Since(checked) >= aliveEvery {
			checked = time.Now()
			if err := alive(ctx); err != nil {
				if ctx.Err() != nil {
					return timedOut()
				}
				return fmt.Errorf("health check %s: %v; and %w", what, last, err)
			}
		}
		select {
		case <-ctx.Done():
			return timedOut()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func probe(ctx context.Context, c *http.Client, addr, path string) error {
	if path == "" {
		d := net.Dialer{Timeout: 2 * time.Second}
		conn, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return err
		}
		return conn.Close()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode >= 400 {
		return fmt.Errorf("status %s", resp.Status)
	}
	return nil
}

// statusOf maps a container's state to an instance status.
func statusOf(r *record, st containerState, err error) (Status, error) {
	s := Status{InstanceID: r.InstanceID, Endpoints: r.endpoints(), StartedAt: r.StartedAt}
	if s.StartedAt.IsZero() {
		s.StartedAt = st.Created
	}
	switch {
	case errors.Is(err, ErrNotFound):
		s.State, s.Detail = StateStopped, "container "+r.Container+" is gone"
	case err != nil:
		return Status{}, err
	case st.Status == "running":
		s.State = StateRunning
	case st.Status == "created":
		s.State = StateStarting
	default:
		s.State, s.Detail = StateFailed, "container "+r.Container+" is "+st.Status+" (the app exited)"
	}
	return s, nil
}
