// Package maassimtest starts a MAAS simulator (lab/maassim) on a loopback
// httptest server for one test, closed by t.Cleanup, and waits on machine
// statuses under either clock.
package maassimtest

import (
	"net/http/httptest"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/lab/maassim"
)

// Epoch is the virtual start time of a manual clock made by Start.
var Epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Sim is a running simulator.
type Sim struct {
	*maassim.Server
	URL    string               // MAAS base URL, "http://127.0.0.1:port/MAAS/"
	APIKey string               // a key the simulator accepts
	Clock  *maassim.ManualClock // nil when opts.Clock was not a ManualClock
}

// Start serves a simulator built from opts. A nil opts.Clock becomes a
// ManualClock reading Epoch.
func Start(t testing.TB, opts maassim.Options) *Sim {
	t.Helper()
	if opts.Clock == nil {
		opts.Clock = maassim.NewManualClock(Epoch)
	}
	if len(opts.APIKeys) == 0 {
		opts.APIKeys = []string{maassim.DefaultAPIKey}
	}
	srv := maassim.New(opts)
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)
	mc, _ := opts.Clock.(*maassim.ManualClock)
	return &Sim{Server: srv, URL: ts.URL + "/MAAS/", APIKey: opts.APIKeys[0], Clock: mc}
}

// AdvanceUntil moves a manual clock in steps until the machine reaches want,
// failing the test if it has not after max of virtual time.
func (s *Sim) AdvanceUntil(t testing.TB, systemID string, want maassim.Status, step, max time.Duration) {
	t.Helper()
	if s.Clock == nil {
		t.Fatalf("maassimtest: AdvanceUntil needs a manual clock")
	}
	for waited := time.Duration(0); ; waited += step {
		m, ok := s.Machine(systemID)
		if !ok {
			t.Fatalf("maassimtest: no machine %s", systemID)
		}
		if m.Status == want {
			return
		}
		if waited >= max {
			t.Fatalf("maassimtest: %s is %s after %s of virtual time, want %s", systemID, m.Status, waited, want)
		}
		s.Clock.Advance(step)
	}
}

// WaitStatus polls (real time) until the machine reaches want, for
// simulators running on a ScaledClock.
func (s *Sim) WaitStatus(t testing.TB, systemID string, want maassim.Status, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		m, ok := s.Machine(systemID)
		if ok && m.Status == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("maassimtest: %s is %s after %s, want %s", systemID, m.Status, timeout, want)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
