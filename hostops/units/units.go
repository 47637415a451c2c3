// Package units gathers observed evidence for the readiness gates (seed
// 002's slice-ready convergence gate): whether a daemon runs, read from the
// process table under the host root's /proc; whether a systemd unit is
// active, asked of systemctl through a Runner; whether a file exists under
// the host root. Evidence is observed, never declared: when a probe cannot
// know (no systemd as PID 1), it says Unknown and why, rather than guess.
package units

import (
	"fmt"
	"strings"
)

// State is the outcome of one probe.
type State string

// Probe outcomes.
const (
	Up      State = "up"      // running, active, present
	Down    State = "down"    // observed absent, stopped, failed
	Unknown State = "unknown" // could not be observed (and Detail says why)
)

// Evidence is one observation for a readiness gate.
type Evidence struct {
	Subject string // "process dnsmasq", "unit libvirtd.service", "file /etc/netplan/60-gpuaas-ipoib.yaml"
	State   State
	Detail  string // what was seen: "pid 412: dnsmasq --port=0 ...", "ActiveState=failed SubState=failed"
}

func (e Evidence) String() string {
	return fmt.Sprintf("%s: %s: %s", e.Subject, e.State, e.Detail)
}

// OK reports whether the evidence shows the subject up.
func (e Evidence) OK() bool { return e.State == Up }

// Blockers returns a line for every piece of evidence that is not Up, in
// order: the named blockers of a readiness report.
func Blockers(ev ...Evidence) []string {
	var out []string
	for _, e := range ev {
		if !e.OK() {
			out = append(out, e.String())
		}
	}
	return out
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

func joinArgs(args []string) string { return strings.Join(args, " ") }
