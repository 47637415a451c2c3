package slice

import (
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
)

// FailpointsEnv names the environment variable the agent reads failpoints
// from: "slice/after-clone=crash,slice/before-ssh_ready=error".
const FailpointsEnv = "GPUAAS_FAILPOINTS"

// Failpoint actions.
const (
	ActionCrash = "crash" // exit the process with status 3 at once (no cleanup)
	ActionError = "error" // return an error from the stage
)

// Failpoint names: "slice/before-<stage>" and "slice/after-<stage>" for
// every provision and release stage, and "slice/during-clone" on the first
// clone progress report.
func beforeStage(stage string) string { return "slice/before-" + stage }
func afterStage(stage string) string  { return "slice/after-" + stage }

// FailpointDuringClone fires on the clone's first progress report.
const FailpointDuringClone = "slice/during-clone"

// Failpoints is a registry of armed failpoints. The zero value has none.
type Failpoints struct {
	mu sync.Mutex
	m  map[string]string
	// Exit ends the process for ActionCrash (default os.Exit).
	Exit func(code int)
}

// ParseFailpoints parses "name=action,name=action".
func ParseFailpoints(s string) (*Failpoints, error) {
	f := &Failpoints{}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, action, ok := strings.Cut(part, "=")
		if !ok || !strings.HasPrefix(name, "slice/") || (action != ActionCrash && action != ActionError) {
			return nil, fmt.Errorf("failpoint %q: want slice/<point>=crash|error", part)
		}
		f.Set(name, action)
	}
	return f, nil
}

// FailpointsFromEnv parses $GPUAAS_FAILPOINTS.
func FailpointsFromEnv() (*Failpoints, error) { return ParseFailpoints(os.Getenv(FailpointsEnv)) }

// Set arms (action != "") or disarms a failpoint.
func (f *Failpoints) Set(name, action string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.m == nil {
		f.m = map[string]string{}
	}
	if action == "" {
		delete(f.m, name)
		return
	}
	f.m[name] = action
}

// Armed lists the armed failpoints.
func (f *Failpoints) Armed() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for k, v := range f.m {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// Hit fires the failpoint name if armed.
func (f *Failpoints) Hit(name string) error {
	if f == nil {
		return nil
	}
	f.mu.Lock()
	action := f.m[name]
	exit := f.Exit
	f.mu.Unlock()
	switch action {
	case ActionCrash:
		if exit == nil {
			exit = os.Exit
		}
		fmt.Fprintf(os.Stderr, "gpuaas failpoint %s: crash\n", name)
		exit(3)
		// A test's Exit may return (it should panic or Goexit); treat
		// that as an error so the stage still stops.
		return fmt.Errorf("failpoint %s: crash", name)
	case ActionError:
		return fmt.Errorf("failpoint %s: injected error", name)
	}
	return nil
}
