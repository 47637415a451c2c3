package gpuhealth

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"time"

	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/hostops/command"
)

// FellOffBus reports whether the PCI function at addr answers config
// reads with all-ones (vendor 0xffff): the device dropped off the bus
// while the kernel still lists it. A function without a readable config
// file (gone, or not exposed) is not judged here.
func FellOffBus(root hostops.Root, addr string) (bool, error) {
	if err := hostops.ValidName(addr); err != nil {
		return false, err
	}
	f, err := os.Open(root.SysPath("bus/pci/devices", addr, "config"))
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("config space of %s: %w", addr, err)
	}
	defer f.Close()
	var b [2]byte
	if _, err := io.ReadFull(f, b[:]); err != nil {
		return false, fmt.Errorf("config space of %s: %w", addr, err)
	}
	return b[0] == 0xff && b[1] == 0xff, nil
}

// GPU is one GPU a scan found: its address and current driver.
type GPU struct {
	Addr   string
	Driver string
}

// Monitor judges GPU health on every Check: config space and the kernel
// log each time (cheap), nvidia-smi at most every SMIInterval, for GPUs on
// the nvidia driver only. nvidia-smi takes from a fraction of a second to
// seconds on a real host, so it runs in the background: a Check uses the
// last reading and starts the next one when it is due.
type Monitor struct {
	Root hostops.Root
	Log  *KernelLog
	// SMI is the nvidia-smi program; "" reads no telemetry.
	SMI         string
	Runner      command.Runner
	SMIInterval time.Duration
	// SMITimeout bounds one nvidia-smi reading (a hung driver).
	SMITimeout time.Duration
	Now        func() time.Time

	mu      sync.Mutex
	polled  time.Time
	tel     map[string]Telemetry
	telErr  error
	running sync.WaitGroup
	busy    bool
	missing bool // SMI is not installed: asked once
}

// NewMonitor returns a monitor of the host at root that reads the kernel
// log at root's dev/kmsg and telemetry from smi ("" for none).
func NewMonitor(root hostops.Root, smi string, interval time.Duration) *Monitor {
	return &Monitor{Root: root, Log: NewKernelLog(root.DevPath("kmsg")), SMI: smi, Runner: command.Exec{}, SMIInterval: interval,
		SMITimeout: time.Minute, Now: time.Now}
}

// Check returns the faults of the listed GPUs, by address. err reports a
// source that could not be read (the others were still judged).
func (m *Monitor) Check(ctx context.Context, gpus []GPU) (map[string][]Fault, error) {
	var errs []error
	out := map[string][]Fault{}
	if err := m.Log.Poll(); err != nil {
		errs = append(errs, err)
	}
	nvidia := false
	for _, g := range gpus {
		off, err := FellOffBus(m.Root, g.Addr)
		if err != nil {
			errs = append(errs, err)
		}
		if off {
			out[g.Addr] = append(out[g.Addr], Fault{GPU: g.Addr, Kind: FaultFellOffBus,
				Evidence: fmt.Sprintf("GPU %s fell off the bus: PCI config space reads all-ones (vendor ffff)", g.Addr)})
		}
		for _, x := range m.Log.Critical(g.Addr) {
			ev := fmt.Sprintf("GPU %s: %s in the kernel log", g.Addr, x.XID)
			if x.Count > 1 {
				ev += fmt.Sprintf(" (%d times)", x.Count)
			}
			if x.Detail != "" {
				ev += ": " + x.Detail
			}
			out[g.Addr] = append(out[g.Addr], Fault{GPU: g.Addr, Kind: FaultXID, Evidence: ev})
		}
		nvidia = nvidia || g.Driver == "nvidia"
	}
	tel, err := m.telemetry(nvidia)
	if err != nil {
		errs = append(errs, err)
	}
	for _, g := range gpus {
		if t, ok := tel[g.Addr]; ok && g.Driver == "nvidia" {
			out[g.Addr] = append(out[g.Addr], t.Faults()...)
		}
	}
	return out, errors.Join(errs...)
}

// telemetry returns the last nvidia-smi reading and starts the next one
// when it is due.
func (m *Monitor) telemetry(want bool) (map[string]Telemetry, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.missing { // said once
		err := m.telErr
		m.telErr = nil
		return nil, err
	}
	if m.SMI == "" || !want {
		return nil, nil
	}
	now := m.Now()
	if !m.busy && (m.polled.IsZero() || now.Sub(m.polled) >= m.SMIInterval) {
		m.polled, m.busy = now, true
		m.running.Add(1)
		go m.refresh()
	}
	return m.tel, m.telErr
}

// refresh takes one nvidia-smi reading.
func (m *Monitor) refresh() {
	defer m.running.Done()
	timeout := m.SMITimeout
	if timeout <= 0 {
		timeout = time.Minute
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	tel, err := m.query(ctx)
	m.mu.Lock()
	defer m.mu.Unlock()
	m.busy = false
	switch {
	case errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist):
		m.missing, m.tel, m.telErr = true, nil, fmt.Errorf("GPU telemetry off: %w", err)
	case err != nil:
		m.tel, m.telErr = nil, err // stale telemetry would hide a fault or keep a cured one
	default:
		m.tel, m.telErr = tel, nil
	}
}

// WaitTelemetry waits for a running nvidia-smi reading to finish.
func (m *Monitor) WaitTelemetry() { m.running.Wait() }

// TelemetryOff reports whether nvidia-smi was found missing (telemetry
// is then off for the monitor's life).
func (m *Monitor) TelemetryOff() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.missing
}

func (m *Monitor) query(ctx context.Context) (map[string]Telemetry, error) {
	out, err := m.Runner.Run(ctx, command.Cmd{Name: m.SMI, Args: QueryArgs()})
	if err != nil {
		return nil, fmt.Errorf("GPU telemetry: %w", err)
	}
	ts, err := ParseQuery(string(out))
	if err != nil {
		return nil, err
	}
	out, err = m.Runner.Run(ctx, command.Cmd{Name: m.SMI, Args: NVLinkArgs()})
	if err != nil {
		return nil, fmt.Errorf("GPU telemetry: %w", err)
	}
	links, err := ParseNVLink(string(out))
	if err != nil {
		return nil, err
	}
	res := make(map[string]Telemetry, len(ts))
	for _, t := range ts {
		t.NVLink = links[t.Index]
		res[t.GPU] = t
	}
	return res, nil
}
