package dhcp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/internal/atomicfile"
)

// Server supervises one dnsmasq process serving the guest subnet on one
// interface (the OVS bridge's internal port). Its files live in Dir:
// dnsmasq.conf, hosts (reservations), leases, dnsmasq.pid, dnsmasq.log.
type Server struct {
	Dir       string       // absolute state directory, e.g. /var/lib/gpuaas/dhcp
	Interface string       // e.g. ovsbr0
	Gateway   netip.Prefix // e.g. 10.77.0.1/24
	LeaseTime time.Duration
	DNS       []netip.Addr
	// Netns, when set, is the path of the network namespace dnsmasq runs
	// in (started through nsenter).
	Netns string
	// User is the user dnsmasq drops privileges to ("" = dnsmasq's own
	// default). Files in Dir are world-readable so it can re-read them.
	User string
	// Binary is the dnsmasq executable (default "dnsmasq").
	Binary string
	// Signal delivers a signal to a process (default syscall.Kill);
	// tests record it.
	Signal func(pid int, sig syscall.Signal) error
	// Root locates /proc, used to recognise a dnsmasq left running by a
	// previous agent (zero value: the real host).
	Root   hostops.Root
	Logger *slog.Logger

	mu      sync.Mutex
	proc    *proc
	adopted int // pid of a running dnsmasq found at Start
}

// DefaultDir is the server's state directory on a host.
func DefaultDir(root hostops.Root) string { return root.VarPath("lib", "gpuaas", "dhcp") }

// proc is a started dnsmasq; err is valid once done is closed.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// ConfFile, HostsFile, LeaseFile and PidFile are the server's files.
func (s *Server) ConfFile() string  { return filepath.Join(s.Dir, "dnsmasq.conf") }
func (s *Server) HostsFile() string { return filepath.Join(s.Dir, "hosts") }
func (s *Server) LeaseFile() string { return filepath.Join(s.Dir, "leases") }
func (s *Server) PidFile() string   { return filepath.Join(s.Dir, "dnsmasq.pid") }
func (s *Server) LogFile() string   { return filepath.Join(s.Dir, "dnsmasq.log") }

func (s *Server) validate() error {
	if !filepath.IsAbs(s.Dir) || filepath.Clean(s.Dir) != s.Dir {
		return fmt.Errorf("dnsmasq: state directory %q: want a clean absolute path", s.Dir)
	}
	if err := hostops.ValidName(s.Interface); err != nil || len(s.Interface) > 15 || strings.ContainsAny(s.Interface, " ,=") {
		return fmt.Errorf("dnsmasq: interface %q is not a valid interface name", s.Interface)
	}
	if s.User != "" && hostops.ValidName(s.User) != nil {
		return fmt.Errorf("dnsmasq: user %q is not a valid user name", s.User)
	}
	return validGateway(s.Gateway)
}

// Args is dnsmasq's command line (without the program name).
func (s *Server) Args() []string {
	args := []string{
		"--keep-in-foreground",
		"--conf-file=" + s.ConfFile(),
		"--port=0", // DHCP only, no DNS
		"--bind-interfaces",
		"--interface=" + s.Interface,
		"--except-interface=lo",
		"--dhcp-leasefile=" + s.LeaseFile(),
		"--pid-file=" + s.PidFile(),
		"--log-dhcp",
		"--log-facility=" + s.LogFile(),
	}
	if s.User != "" {
		args = append(args, "--user="+s.User)
	}
	return args
}

func (s *Server) command() (string, []string) {
	bin := s.Binary
	if bin == "" {
		bin = "dnsmasq"
	}
	if s.Netns != "" {
		return "nsenter", append([]string{"--net=" + s.Netns, "--", bin}, s.Args()...)
	}
	return bin, s.Args()
}

// writeFile replaces path atomically with a world-readable file.
func writeFile(path string, b []byte) error {
	return atomicfile.WriteFile(path, b, 0o644)
}

// WriteFiles writes dnsmasq.conf and the hosts file for reservations.
func (s *Server) WriteFiles(reservations []Reservation) error {
	if err := s.validate(); err != nil {
		return err
	}
	for _, r := range reservations {
		if err := Validate(s.Gateway, r); err != nil {
			return err
		}
	}
	conf, err := RenderConfig(Config{Gateway: s.Gateway, LeaseTime: s.LeaseTime, HostsFile: s.HostsFile(), DNS: s.DNS})
	if err != nil {
		return err
	}
	if err := os.MkdirAll(s.Dir, 0o755); err != nil {
		return fmt.Errorf("dnsmasq state directory: %w", err)
	}
	if err := os.Chmod(s.Dir, 0o755); err != nil {
		return fmt.Errorf("dnsmasq state directory: %w", err)
	}
	if err := writeFile(s.ConfFile(), conf); err != nil {
		return fmt.Errorf("write dnsmasq config: %w", err)
	}
	if err := writeFile(s.HostsFile(), RenderHosts(reservations)); err != nil {
		return fmt.Errorf("write dnsmasq hosts file: %w", err)
	}
	return nil
}

// Running returns the pid of the dnsmasq serving this server's files, if
// one is alive (its pid file names a live dnsmasq using that pid file).
func (s *Server) Running() (int, bool) {
	pid, err := s.pid()
	if err != nil {
		return 0, false
	}
	root := s.Root
	if root == (hostops.Root{}) {
		root = hostops.RealRoot()
	}
	cmdline, err := os.ReadFile(root.ProcPath(strconv.Itoa(pid), "cmdline"))
	if err != nil {
		return 0, false
	}
	args := strings.Split(string(cmdline), "\x00")
	if len(args) == 0 || filepath.Base(args[0]) != "dnsmasq" || !slices.Contains(args, "--pid-file="+s.PidFile()) {
		return 0, false
	}
	return pid, true
}

// Start writes the configuration for reservations and starts dnsmasq in the
// foreground as a child process; it returns once dnsmasq has written its
// pid file (it has bound the interface and is serving). A dnsmasq already
// serving the same files (left by a previous agent) is adopted instead:
// it re-reads the reservations and Stop will terminate it.
func (s *Server) Start(ctx context.Context, reservations []Reservation) error {
	if err := s.WriteFiles(reservations); err != nil {
		return err
	}
	s.mu.Lock()
	if s.proc != nil || s.adopted != 0 {
		s.mu.Unlock()
		return fmt.Errorf("dnsmasq on %s: already started", s.Interface)
	}
	if pid, ok := s.Running(); ok {
		s.adopted = pid
		s.mu.Unlock()
		if err := s.Reload(); err != nil {
			return err
		}
		s.logger().Info("dnsmasq adopted", "interface", s.Interface, "pid", pid, "reservations", len(reservations))
		return nil
	}
	_ = os.Remove(s.PidFile())
	name, args := s.command()
	cmd := exec.Command(name, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		s.mu.Unlock()
		return fmt.Errorf("start dnsmasq on %s: %w", s.Interface, err)
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	s.proc = p
	s.mu.Unlock()
	for {
		if pid, err := s.pid(); err == nil && pid == cmd.Process.Pid {
			s.logger().Info("dnsmasq started", "interface", s.Interface, "pid", pid, "reservations", len(reservations))
			return nil
		}
		select {
		case <-p.done:
			s.mu.Lock()
			s.proc = nil
			s.mu.Unlock()
			return fmt.Errorf("dnsmasq on %s exited during start: %v: %s", s.Interface, p.err, strings.TrimSpace(stderr.String()))
		case <-ctx.Done():
			_ = s.Stop()
			return fmt.Errorf("start dnsmasq on %s: %w", s.Interface, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (s *Server) logger() *slog.Logger {
	if s.Logger != nil {
		return s.Logger
	}
	return slog.Default()
}

func (s *Server) pid() (int, error) {
	b, err := os.ReadFile(s.PidFile())
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("dnsmasq pid file %s: %q is not a pid", s.PidFile(), strings.TrimSpace(string(b)))
	}
	return pid, nil
}

// Update replaces the reservations and makes dnsmasq re-read them (SIGHUP
// re-reads --dhcp-hostsfile; no restart, existing leases are kept). The
// pid comes from the pid file, so Update also works for a dnsmasq this
// Server did not start.
func (s *Server) Update(reservations []Reservation) error {
	if err := s.WriteFiles(reservations); err != nil {
		return err
	}
	return s.Reload()
}

// Reload sends SIGHUP to the running dnsmasq.
func (s *Server) Reload() error {
	pid, err := s.pid()
	if err != nil {
		return fmt.Errorf("reload dnsmasq on %s: %w", s.Interface, err)
	}
	signal := s.Signal
	if signal == nil {
		signal = syscall.Kill
	}
	if err := signal(pid, syscall.SIGHUP); err != nil {
		return fmt.Errorf("reload dnsmasq on %s (pid %d): %w", s.Interface, pid, err)
	}
	return nil
}

// Stop terminates the dnsmasq this Server started (SIGTERM, then SIGKILL
// after 5 s). Stopping a stopped server is not an error.
func (s *Server) Stop() error {
	s.mu.Lock()
	p, adopted := s.proc, s.adopted
	s.proc, s.adopted = nil, 0
	s.mu.Unlock()
	if adopted != 0 {
		return s.stopAdopted(adopted)
	}
	if p == nil {
		return nil
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	s.logger().Info("dnsmasq stopped", "interface", s.Interface)
	var ee *exec.ExitError
	if p.err != nil && !errors.As(p.err, &ee) {
		return fmt.Errorf("stop dnsmasq on %s: %w", s.Interface, p.err)
	}
	return nil
}

func (s *Server) stopAdopted(pid int) error {
	signal := s.Signal
	if signal == nil {
		signal = syscall.Kill
	}
	if err := signal(pid, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("stop dnsmasq on %s (pid %d): %w", s.Interface, pid, err)
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if _, ok := s.Running(); !ok {
			s.logger().Info("dnsmasq stopped", "interface", s.Interface, "pid", pid)
			return nil
		}
	}
	if err := signal(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("kill dnsmasq on %s (pid %d): %w", s.Interface, pid, err)
	}
	return nil
}

// Leases reads the server's lease file.
func (s *Server) Leases() ([]Lease, error) { return ReadLeases(s.LeaseFile()) }
