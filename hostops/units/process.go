package units

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"github.com/gpuaas/gpuaas/hostops"
)

// Process is one entry of the process table.
type Process struct {
	PID   int
	Comm  string   // /proc/<pid>/comm: the executable name, at most 15 bytes
	Args  []string // /proc/<pid>/cmdline; empty for kernel threads
	State byte     // from /proc/<pid>/stat ('R', 'S', 'Z', ...); 0 if unreadable
}

// Zombie reports whether the process has exited and waits to be reaped.
func (p Process) Zombie() bool { return p.State == 'Z' || p.State == 'X' }

// commLen is the kernel's TASK_COMM_LEN minus the terminating NUL: a
// process name is truncated to it.
const commLen = 15

// maxCommFile bounds /proc/<pid>/comm, which for workqueue kworkers adds
// the workqueue's description ("kworker/0:0H-events_highpri"; the kernel
// formats it into 64 bytes).
const maxCommFile = 64

// Match selects processes: by Name (the comm, or the base name of argv[0])
// and, if Arg is set, an exact argument among argv[1:].
type Match struct {
	Name string
	Arg  string
}

func (m Match) matches(p Process) bool {
	if !m.nameMatches(p) {
		return false
	}
	if m.Arg == "" {
		return true
	}
	for _, a := range p.Args[min(1, len(p.Args)):] {
		if a == m.Arg {
			return true
		}
	}
	return false
}

func (m Match) nameMatches(p Process) bool {
	if p.Comm == m.Name {
		return true
	}
	// The comm is truncated to 15 bytes, and a process may rename
	// argv[0]: accept the base name of argv[0] too.
	if len(p.Args) > 0 && path.Base(p.Args[0]) == m.Name {
		return true
	}
	return len(m.Name) > commLen && p.Comm == m.Name[:commLen]
}

func (m Match) String() string {
	if m.Arg == "" {
		return m.Name
	}
	return m.Name + " " + m.Arg
}

// Processes reads the process table under root's /proc, sorted by PID.
// Processes that exit while being read are skipped.
func Processes(root hostops.Root) ([]Process, error) {
	entries, err := os.ReadDir(root.ProcPath())
	if err != nil {
		return nil, fmt.Errorf("read process table: %w", err)
	}
	var procs []Process
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue
		}
		p, err := readProcess(root, e.Name())
		if gone(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read process table: pid %d: %w", pid, err)
		}
		p.PID = pid
		procs = append(procs, p)
	}
	sort.Slice(procs, func(i, j int) bool { return procs[i].PID < procs[j].PID })
	return procs, nil
}

// gone reports whether err means the process exited under our feet.
func gone(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH)
}

func readProcess(root hostops.Root, pid string) (Process, error) {
	var p Process
	comm, err := os.ReadFile(root.ProcPath(pid, "comm"))
	if err != nil {
		return p, err
	}
	if p.Comm, err = parseComm(comm); err != nil {
		return p, fmt.Errorf("comm: %w", err)
	}
	cmdline, err := os.ReadFile(root.ProcPath(pid, "cmdline"))
	if err != nil {
		return p, err
	}
	p.Args = parseCmdline(cmdline)
	// stat is optional (a simulated host may not write it); when present
	// it must parse, since it tells a zombie from a live process.
	stat, err := os.ReadFile(root.ProcPath(pid, "stat"))
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return p, err
	default:
		if p.State, err = parseStatState(stat); err != nil {
			return p, fmt.Errorf("stat: %w", err)
		}
	}
	return p, nil
}

// parseComm parses /proc/<pid>/comm: the name and a newline.
func parseComm(b []byte) (string, error) {
	s := strings.TrimSuffix(string(b), "\n")
	switch {
	case s == "":
		return "", errors.New("empty")
	case len(s) > maxCommFile:
		return "", fmt.Errorf("%q is longer than %d bytes", truncate(s, 20), maxCommFile)
	case strings.ContainsAny(s, "\n\x00"):
		return "", fmt.Errorf("%q has a newline or NUL", s)
	}
	return s, nil
}

// parseCmdline splits /proc/<pid>/cmdline, NUL-separated arguments with a
// trailing NUL. A process that rewrote its title without NULs comes back
// as one argument.
func parseCmdline(b []byte) []string {
	b = bytes.TrimRight(b, "\x00")
	if len(b) == 0 {
		return nil
	}
	parts := bytes.Split(b, []byte{0})
	args := make([]string, len(parts))
	for i, a := range parts {
		args[i] = string(a)
	}
	return args
}

// parseStatState returns the state letter of /proc/<pid>/stat:
// "pid (comm) S ppid ...". The comm may hold spaces and parentheses, so the
// state follows the last ')'.
func parseStatState(b []byte) (byte, error) {
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || !strings.Contains(s[:i], " (") || len(s) < i+3 || s[i+1] != ' ' {
		return 0, fmt.Errorf("%q: want \"pid (comm) STATE ...\"", truncate(s, 60))
	}
	st := s[i+2]
	if !strings.ContainsRune("RSDZTtWXxKPI", rune(st)) {
		return 0, fmt.Errorf("unknown process state %q", st)
	}
	return st, nil
}

// FindProcesses returns the live (non-zombie) processes matching m, and
// the zombies separately.
func FindProcesses(root hostops.Root, m Match) (live, zombies []Process, err error) {
	if err := hostops.ValidName(m.Name); err != nil {
		return nil, nil, fmt.Errorf("find process: %w", err)
	}
	procs, err := Processes(root)
	if err != nil {
		return nil, nil, err
	}
	for _, p := range procs {
		if !m.matches(p) {
			continue
		}
		if p.Zombie() {
			zombies = append(zombies, p)
		} else {
			live = append(live, p)
		}
	}
	return live, zombies, nil
}

// ProcessRunning observes whether a process named name runs on the host
// at root (by comm or argv[0]'s base name).
func ProcessRunning(root hostops.Root, name string) (Evidence, error) {
	return ProcessMatching(root, Match{Name: name})
}

// ProcessMatching observes whether a process matching m runs.
func ProcessMatching(root hostops.Root, m Match) (Evidence, error) {
	ev := Evidence{Subject: "process " + m.String()}
	live, zombies, err := FindProcesses(root, m)
	if err != nil {
		return ev, err
	}
	if len(live) == 0 {
		ev.State, ev.Detail = Down, "no such process running"
		if len(zombies) > 0 {
			ev.Detail += fmt.Sprintf(" (pid %d is a zombie)", zombies[0].PID)
		}
		return ev, nil
	}
	p := live[0]
	cmd := joinArgs(p.Args)
	if cmd == "" {
		cmd = "[" + p.Comm + "]"
	}
	ev.State, ev.Detail = Up, fmt.Sprintf("pid %d: %s", p.PID, truncate(cmd, 120))
	if len(live) > 1 {
		ev.Detail += fmt.Sprintf(" (and %d more)", len(live)-1)
	}
	return ev, nil
}
