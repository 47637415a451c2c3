package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// runFileName is the file a running lab keeps in its folder: the
// gpuaas-lab process, its children and how the slice host came out.
// `gpuaas-lab status` and `gpuaas-lab stop` read it from another shell.
const runFileName = "run.json"

// runInfo is run.json.
type runInfo struct {
	PID     int       `json:"pid"`
	Started time.Time `json:"started"`
	// Phase is starting (onboarding), up (summary printed) or stopping.
	Phase        string         `json:"phase"`
	SliceHost    *sliceMode     `json:"slice_host,omitempty"`
	Coordinators map[string]int `json:"coordinators"` // id -> pid
	Agents       map[string]int `json:"agents"`       // process name (agent-<host>) -> pid
}

// runRecorder writes run.json as the lab changes (agents restart with new
// PIDs) and removes it when the lab has stopped.
type runRecorder struct {
	mu   sync.Mutex
	path string
	info runInfo
}

func newRunRecorder(dir string) *runRecorder {
	return &runRecorder{path: filepath.Join(dir, runFileName), info: runInfo{PID: os.Getpid(), Started: time.Now().UTC(),
		Phase: "starting", Coordinators: map[string]int{}, Agents: map[string]int{}}}
}

// update changes the record and writes it (temp file, then rename).
func (r *runRecorder) update(fn func(*runInfo)) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	fn(&r.info)
	b, err := json.MarshalIndent(r.info, "", "  ")
	if err != nil {
		return err
	}
	tmp := r.path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, r.path); err != nil {
		return fmt.Errorf("write %s: %w", r.path, err)
	}
	return nil
}

func (r *runRecorder) remove() { _ = os.Remove(r.path) }

func readRunInfo(dir string) (runInfo, error) {
	var ri runInfo
	path := filepath.Join(dir, runFileName)
	b, err := os.ReadFile(path)
	if err != nil {
		return ri, err
	}
	if err := json.Unmarshal(b, &ri); err != nil {
		return ri, fmt.Errorf("%s: %w", path, err)
	}
	return ri, nil
}

// procAlive reports whether pid is a live (not zombie) process whose
// argv[0] base name is want ("" for any): a recycled PID is not the lab.
func procAlive(pid int, want string) bool {
	if pid <= 0 {
		return false
	}
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	// pid (comm) S ...: the state follows the last ')'.
	if i := strings.LastIndexByte(string(stat), ')'); i < 0 || i+2 >= len(stat) || stat[i+2] == 'Z' || stat[i+2] == 'X' {
		return false
	}
	if want == "" {
		return true
	}
	cmdline, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	if err != nil {
		return false
	}
	argv0, _, _ := strings.Cut(string(cmdline), "\x00")
	return filepath.Base(argv0) == want
}

// labAlive reports whether the run record's gpuaas-lab process runs.
func labAlive(ri runInfo) bool { return procAlive(ri.PID, "gpuaas-lab") }

// checkNotRunning refuses to start a second lab on the same folder.
func checkNotRunning(dir string) error {
	ri, err := readRunInfo(dir)
	if err != nil {
		return nil // none recorded (or unreadable: overwritten on start)
	}
	if ri.PID != os.Getpid() && labAlive(ri) {
		return fmt.Errorf("a lab is already running in %s (gpuaas-lab pid %d, started %s): use it, or stop it with gpuaas-lab stop -dir %s",
			dir, ri.PID, ri.Started.Local().Format(time.DateTime), dir)
	}
	return nil
}
