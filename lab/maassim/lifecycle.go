package maassim

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"
)

// ---------------------------------------------------------------------------
// Events

// Event levels as MAAS names them (maasserver/models/eventtype.py).
const (
	levelAudit    = 0
	levelDebug    = 10
	levelInfo     = 20
	levelWarning  = 30
	levelError    = 40
	levelCritical = 50
)

var levelNames = map[int]string{
	levelAudit: "AUDIT", levelDebug: "DEBUG", levelInfo: "INFO",
	levelWarning: "WARNING", levelError: "ERROR", levelCritical: "CRITICAL",
}

// Event is one node event.
type Event struct {
	ID          int
	SystemID    string
	Hostname    string
	Level       string // DEBUG, INFO, WARNING, ERROR, CRITICAL, AUDIT
	level       int
	Type        string // event type description ("Deploying", "Node changed status")
	Description string
	Created     time.Time // virtual time
	Username    string
}

func (s *Server) event(m *machine, level int, typ, desc string) {
	// MAAS shows the latest user-facing event as the machine's status_message.
	if level >= levelInfo {
		m.statusMessage = typ
		if desc != "" {
			m.statusMessage = typ + " - " + desc
		}
	}
	s.events = append(s.events, &Event{
		ID: len(s.events) + 1, SystemID: m.systemID, Hostname: m.hostname,
		Level: levelNames[level], level: level, Type: typ, Description: desc,
		Created: s.clock.Now(), Username: "admin",
	})
}

// Events returns a machine's events, oldest first ("" for all machines).
func (s *Server) Events(systemID string) []Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Event
	for _, e := range s.events {
		if systemID == "" || e.SystemID == systemID {
			out = append(out, *e)
		}
	}
	return out
}

// statusEventTypes are the INFO events MAAS records when a node enters a
// status (provisioningserver/events.py EVENT_DETAILS).
var statusEventTypes = map[Status]string{
	StatusCommissioning:       "Commissioning",
	StatusFailedCommissioning: "Failed commissioning",
	StatusTesting:             "Testing",
	StatusFailedTesting:       "Failed testing",
	StatusReady:               "Ready",
	StatusDeploying:           "Deploying",
	StatusDeployed:            "Deployed",
	StatusReleasing:           "Releasing",
	StatusRescueMode:          "Rescue mode",
}

// setStatus moves m to a new status if NODE_TRANSITIONS allows it, recording
// the DEBUG status-change event (and the INFO stage event) MAAS records.
func (s *Server) setStatus(m *machine, to Status) error {
	from := m.status
	if !CanTransition(from, to) {
		return stateViolation("Invalid transition: %s -> %s.", from, to)
	}
	if from == to {
		return nil
	}
	m.status = to
	s.log.Debug("maassim: status change", "system_id", m.systemID, "hostname", m.hostname, "from", from.String(), "to", to.String())
	s.event(m, levelDebug, "Node changed status", fmt.Sprintf("From '%s' to '%s'", from, to))
	if t, ok := statusEventTypes[to]; ok {
		s.event(m, levelInfo, t, "")
	}
	return nil
}

// ---------------------------------------------------------------------------
// Faults

// FaultKind names an injectable failure.
type FaultKind string

// Injectable faults.
const (
	// FaultDeployStuck: the machine boots the deployed OS but cloud-init
	// never reports back (the datasource case): it stays Deploying until
	// Durations.DeployTimeout, then MAAS marks it Failed deployment.
	FaultDeployStuck FaultKind = "deploy_stuck"
	// FaultCurtinFailure: curtin fails while installing; Failed deployment.
	FaultCurtinFailure FaultKind = "curtin_failure"
	// FaultCommissioningFailure: a commissioning script fails; Failed commissioning.
	FaultCommissioningFailure FaultKind = "commissioning_failure"
	// FaultTestingFailure: a hardware test fails; Failed testing.
	FaultTestingFailure FaultKind = "testing_failure"
	// FaultEraseFailure: disk erasing fails; Failed disk erasing.
	FaultEraseFailure FaultKind = "erase_failure"
	// FaultPowerUnknown: the BMC answers query_power_state with "unknown".
	FaultPowerUnknown FaultKind = "power_unknown"
	// FaultPowerError: the BMC query fails; power state "error".
	FaultPowerError FaultKind = "power_error"
	// FaultAcceptedTimeout: the request (Op) is applied, then answered with
	// 504 after Delay of real time.
	FaultAcceptedTimeout FaultKind = "accepted_timeout"
	// FaultTransientConflict: the request (Op) is refused, not applied, with
	// 409 and Retry-After (a retryable transaction conflict).
	FaultTransientConflict FaultKind = "transient_conflict"
	// FaultRackUnavailable: the request (Op) is refused, not applied, with
	// 503 and Retry-After (no rack controller reachable).
	FaultRackUnavailable FaultKind = "rack_unavailable"
	// FaultHwSyncStale: the deployed machine's hardware-sync agent stops
	// reporting; last_sync stops moving.
	FaultHwSyncStale FaultKind = "hw_sync_stale"
	// FaultDeployLostAfterAllocate: a deploy acquires the machine (Ready
	// → Allocated, or it was Allocated) and then the region fails before
	// starting the deployment, answering 504 (the outcome is unknown to
	// the client): the machine stays Allocated with no deploy in flight,
	// as after a region controller crash between the two steps of MAAS's
	// deploy handler.
	FaultDeployLostAfterAllocate FaultKind = "deploy_lost_after_allocate"
)

var faultKinds = []FaultKind{
	FaultDeployStuck, FaultCurtinFailure, FaultCommissioningFailure, FaultTestingFailure,
	FaultEraseFailure, FaultPowerUnknown, FaultPowerError, FaultAcceptedTimeout,
	FaultTransientConflict, FaultRackUnavailable, FaultHwSyncStale, FaultDeployLostAfterAllocate,
}

// Fault is one injected failure on one machine.
type Fault struct {
	Kind FaultKind
	// Op restricts request faults (accepted_timeout, transient_conflict,
	// rack_unavailable) to one op ("deploy", "release"; "update" for PUT,
	// "delete" for DELETE); empty means any mutating request.
	Op string
	// Times is how often the fault fires before it disarms; 0 means always.
	Times int
	// Delay is the real time an accepted_timeout response is held back.
	Delay time.Duration
	used  int
}

// InjectFault arms a fault on a machine.
func (s *Server) InjectFault(systemID string, f Fault) error {
	if !slices.Contains(faultKinds, f.Kind) {
		return fmt.Errorf("inject fault on %s: unknown kind %q", systemID, f.Kind)
	}
	if f.Times < 0 || f.Delay < 0 {
		return fmt.Errorf("inject fault on %s: negative times or delay", systemID)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.machines[systemID]
	if !ok {
		return fmt.Errorf("inject fault on %s: no such machine", systemID)
	}
	f.used = 0
	m.faults = append(m.faults, &f)
	return nil
}

// ClearFaults disarms every fault on a machine.
func (s *Server) ClearFaults(systemID string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m, ok := s.machines[systemID]; ok {
		m.faults = nil
	}
}

// ArmedFaults returns the kinds of the faults still armed on a machine (a
// fault with Times n leaves once it fired n times): a test sees whether
// the one it injected fired.
func (s *Server) ArmedFaults(systemID string) []FaultKind {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []FaultKind
	if m, ok := s.machines[systemID]; ok {
		for _, f := range m.faults {
			out = append(out, f.Kind)
		}
	}
	return out
}

func (s *Server) takeFault(m *machine, kind FaultKind, op string) *Fault {
	for i, f := range m.faults {
		if f.Kind != kind || (op != "" && f.Op != "" && f.Op != op) {
			continue
		}
		f.used++
		if f.Times > 0 && f.used >= f.Times {
			m.faults = append(m.faults[:i:i], m.faults[i+1:]...)
		}
		cp := *f
		return &cp
	}
	return nil
}

func (s *Server) hasFault(m *machine, kind FaultKind) bool {
	return slices.ContainsFunc(m.faults, func(f *Fault) bool { return f.Kind == kind })
}

type faultPhase int

const (
	phaseBefore faultPhase = iota
	phaseAfter
)

func requestOp(c *reqCtx) string {
	switch {
	case c.op != "":
		return c.op
	case c.method == "PUT":
		return "update"
	case c.method == "DELETE":
		return "delete"
	}
	return ""
}

// takeRequestFaultLocked finds a request-shaping fault for a request.
func (s *Server) takeRequestFaultLocked(m *machine, c *reqCtx, phase faultPhase) *Fault {
	if m == nil || c.method == "GET" {
		return nil
	}
	op := requestOp(c)
	if op == "" {
		op = "-"
	}
	if phase == phaseAfter {
		return s.takeFault(m, FaultAcceptedTimeout, op)
	}
	if f := s.takeFault(m, FaultTransientConflict, op); f != nil {
		return f
	}
	return s.takeFault(m, FaultRackUnavailable, op)
}

// ---------------------------------------------------------------------------
// Timers

// after runs fn under the lock d of virtual time from now, unless the
// machine's operation changed (gen) or the machine was deleted meanwhile.
// A machine's timers run in the order they are due: when one fires, every
// earlier one not run yet runs first (each on its own goroutine, a loaded
// machine could otherwise run a stage's "Rebooting" event after the
// "Deployed" it precedes).
func (s *Server) after(m *machine, d time.Duration, fn func()) {
	t := &machineTimer{due: s.clock.Now().Add(d), gen: m.gen, fn: fn}
	m.timers = append(m.timers, t)
	s.clock.AfterFunc(d, func() {
		s.mu.Lock()
		if s.machines[m.systemID] == m {
			s.runDue(m, t)
		}
		hooks := s.hooks
		s.hooks = nil
		s.mu.Unlock()
		for _, h := range hooks {
			h()
		}
	})
}

// machineTimer is a pending after of a machine.
type machineTimer struct {
	due time.Time
	gen int
	fn  func()
}

// runDue runs, in due order (then the order they were set), every pending
// timer of m due no later than t, t included; those of an earlier
// operation (gen) are dropped. Called with the lock held.
func (s *Server) runDue(m *machine, t *machineTimer) {
	var run, keep []*machineTimer
	for _, x := range m.timers {
		if !x.due.After(t.due) {
			run = append(run, x)
		} else {
			keep = append(keep, x)
		}
	}
	if len(run) == 0 {
		return // t ran already, with a later timer
	}
	m.timers = keep
	slices.SortStableFunc(run, func(a, b *machineTimer) int { return a.due.Compare(b.due) })
	for _, x := range run {
		if x.gen == m.gen {
			x.fn()
		}
	}
}

func (s *Server) mustStatus(m *machine, to Status) {
	if err := s.setStatus(m, to); err != nil {
		s.log.Error("maassim: lifecycle transition refused", "system_id", m.systemID, "err", err)
	}
}

// ---------------------------------------------------------------------------
// Commissioning

func (s *Server) commission(c *reqCtx, m *machine) error {
	if !CanTransition(m.status, StatusCommissioning) {
		return stateViolation("Invalid transition: %s -> %s.", m.status, StatusCommissioning)
	}
	for _, k := range []string{"enable_ssh", "skip_bmc_config", "skip_networking", "skip_storage"} {
		if _, err := c.boolParam(k); err != nil {
			return err
		}
	}
	return s.startCommissioning(m, c)
}

func (s *Server) startCommissioning(m *machine, c *reqCtx) error {
	testing := c == nil || strings.ToLower(c.get("testing_scripts")) != "none"
	if m.status != StatusCommissioning {
		m.prevStatus = m.status
	}
	if err := s.setStatus(m, StatusCommissioning); err != nil {
		return err
	}
	s.event(m, levelDebug, "User starting node commissioning", "")
	m.gen++
	m.powerState = "on"
	failComm := s.takeFault(m, FaultCommissioningFailure, "") != nil
	failTest := testing && s.takeFault(m, FaultTestingFailure, "") != nil
	d := s.opts.Durations.Commissioning
	s.after(m, d/4, func() { s.event(m, levelInfo, "Performing PXE boot", "") })
	s.after(m, d/2, func() { s.event(m, levelInfo, "Loading ephemeral", "") })
	s.after(m, 3*d/4, func() { s.event(m, levelInfo, "Gathering information", "") })
	s.after(m, d, func() {
		if failComm {
			s.event(m, levelError, "Node commissioning failure", "'maas-lshw' failed: exit status 1")
			s.mustStatus(m, StatusFailedCommissioning)
			m.powerState = "off"
			return
		}
		s.applyHardware(m)
		if !testing {
			s.mustStatus(m, StatusReady)
			m.powerState = "off"
			return
		}
		s.mustStatus(m, StatusTesting)
		s.event(m, levelInfo, "Running test", "smartctl-validate on "+m.hostname)
		s.after(m, s.opts.Durations.Testing, func() {
			m.powerState = "off"
			if failTest {
				s.event(m, levelError, "Script result", "smartctl-validate failed on "+m.hostname)
				s.mustStatus(m, StatusFailedTesting)
				return
			}
			s.mustStatus(m, StatusReady)
		})
	})
	return nil
}

func (s *Server) applyHardware(m *machine) {
	hw := DefaultHardware
	for _, i := range m.ifaces {
		if h, ok := s.hardware[i.mac]; ok {
			hw = h
			break
		}
	}
	if hw.CPUCount > 0 {
		m.cpuCount = hw.CPUCount
	}
	if hw.MemoryMiB > 0 {
		m.memoryMiB = hw.MemoryMiB
	}
	for _, spec := range hw.Interfaces {
		mac, err := normalizeMAC(spec.MAC)
		if err != nil || slices.ContainsFunc(m.ifaces, func(i *iface) bool { return i.mac == mac }) {
			continue
		}
		m.ifaces = append(m.ifaces, &iface{id: m.newDevID(), name: spec.Name, mac: mac, enabled: true})
	}
	// MAAS links the boot interface to the subnet it PXE-booted from, in
	// auto mode (the address is claimed at deploy time).
	if len(m.ifaces) > 0 && len(m.ifaces[0].links) == 0 {
		for _, sn := range s.subnets {
			if sn.VID == 0 {
				m.ifaces[0].links = append(m.ifaces[0].links, &ifLink{id: m.newDevID(), mode: "auto", subnetID: sn.ID})
				break
			}
		}
	}
	if len(m.disks) == 0 {
		for _, spec := range hw.BlockDevices {
			m.disks = append(m.disks, &blockDevice{id: m.newDevID(), name: spec.Name, model: spec.Model,
				serial: spec.Serial, size: spec.Size, tags: slices.Clone(spec.Tags)})
		}
		if len(m.disks) > 0 {
			m.bootDiskID = m.disks[0].id
			// MAAS applies the default (flat) layout after commissioning.
			_ = s.applyLayout(m, "flat", m.disks[0], 0)
		}
	}
}

// ---------------------------------------------------------------------------
// Deployment

func (s *Server) resolveSeries(osystem, series string) (string, string, *apiError) {
	if series == "" {
		series = s.opts.DefaultDistroSeries
	}
	if o, sr, ok := strings.Cut(series, "/"); ok {
		osystem, series = o, sr
	}
	if osystem == "" {
		osystem = "ubuntu"
		if slices.ContainsFunc(s.resources, func(r *bootResource) bool { return r.name == series || r.name == "custom/"+series }) {
			osystem = "custom"
		}
	}
	var choices []string
	for _, sr := range s.opts.DistroSeries {
		choices = append(choices, "ubuntu/"+sr)
	}
	for _, r := range s.resources {
		n := r.name
		if !strings.Contains(n, "/") {
			n = "custom/" + n
		}
		choices = append(choices, n)
	}
	if slices.Contains(choices, osystem+"/"+series) {
		return osystem, series, nil
	}
	return "", "", invalidChoice("distro_series", osystem+"/"+series, choices)
}

func (s *Server) deploy(c *reqCtx, m *machine) error {
	st := m.status
	if st == StatusReady {
		if m.owner != "" && m.owner != c.user {
			return stateViolation("Can't allocate a machine belonging to another user.")
		}
		st = StatusAllocated
	}
	if !listed(st, StatusDeploying) {
		return stateViolation("Can't deploy a machine that is in the '%s' state", m.status)
	}
	osys, series, err := s.resolveSeries(c.get("osystem"), c.get("distro_series"))
	if err != nil {
		return err
	}
	ud, err := decodeUserData(c.get("user_data"))
	if err != nil {
		return err
	}
	hwSync, err := c.boolParam("enable_hw_sync")
	if err != nil {
		return err
	}
	for _, k := range []string{"install_rackd", "install_kvm", "register_vmhost", "ephemeral_deploy", "bridge_all", "bridge_stp"} {
		if _, err := c.boolParam(k); err != nil {
			return err
		}
	}
	if m.status == StatusReady {
		s.mustStatus(m, StatusAllocated)
		m.owner = c.user
		s.event(m, levelDebug, "User acquiring node", "")
	}
	if s.takeFault(m, FaultDeployLostAfterAllocate, "") != nil {
		return &apiError{status: 504, msg: "gateway timeout: the region controller failed before starting the deployment", retryAfter: -1}
	}
	m.osystem, m.distroSeries, m.userData, m.enableHwSync = osys, series, ud, hwSync
	m.syncInterval = s.opts.HwSyncInterval
	m.lastSync = time.Time{}
	return s.startDeploying(m)
}

func (s *Server) startDeploying(m *machine) error {
	if err := s.setStatus(m, StatusDeploying); err != nil {
		return err
	}
	s.event(m, levelDebug, "User starting deployment", "")
	s.event(m, levelInfo, "Powering on", "")
	m.gen++
	m.powerState = "on"
	m.errorDesc = ""
	s.claimAutoIPs(m)
	stuck := s.takeFault(m, FaultDeployStuck, "") != nil
	curtin := s.takeFault(m, FaultCurtinFailure, "") != nil
	curtinMsg := "curtin command install failed"
	if ft := s.imageFileType(m); strings.HasPrefix(ft, "dd") && (m.layout == "flat" || m.layout == "lvm") {
		// Seed 002: a ddgz full-disk image reached curtin but failed at
		// GRUB/EFI because the image's root and the MAAS-made EFI partition
		// did not line up; a tgz root filesystem lets MAAS own partitioning.
		curtin = true
		curtinMsg = fmt.Sprintf("curtin: grub-install failed: %s image does not match the %s storage layout's EFI partition", ft, m.layout)
	}
	d := s.opts.Durations.Deploy
	stage := func(frac float64) time.Duration { return time.Duration(float64(d) * frac) }
	s.after(m, stage(0.05), func() { s.event(m, levelInfo, "Performing PXE boot", "") })
	s.after(m, stage(0.15), func() { s.event(m, levelInfo, "Loading ephemeral", "") })
	s.after(m, stage(0.30), func() { s.event(m, levelInfo, "Configuring storage", "") })
	s.after(m, stage(0.45), func() { s.event(m, levelInfo, "Installing OS", "") })
	if curtin {
		s.after(m, stage(0.60), func() {
			s.event(m, levelError, "Node installation failure", "Installation failed (refer to the installation log for more information).")
			m.errorDesc = curtinMsg
			s.mustStatus(m, StatusFailedDeployment)
		})
		return nil
	}
	s.after(m, stage(0.70), func() { s.event(m, levelInfo, "Configuring OS", "") })
	s.after(m, stage(0.85), func() { s.event(m, levelInfo, "Rebooting", "") })
	if stuck {
		s.after(m, stage(0.95), func() {
			s.event(m, levelDebug, "Node installation", "'cloudinit' searching for network data from DataSourceMAAS")
		})
		timeout := s.opts.Durations.DeployTimeout
		s.after(m, timeout, func() {
			if m.status != StatusDeploying {
				return
			}
			msg := fmt.Sprintf("Machine operation 'Deploying' timed out after %d minutes.", int(timeout/time.Minute))
			s.event(m, levelError, "Marking node failed", msg)
			m.errorDesc = msg
			s.mustStatus(m, StatusFailedDeployment)
		})
		return nil
	}
	s.after(m, d, func() {
		s.event(m, levelDebug, "Node installation", "'cloudinit' running modules for final")
		s.mustStatus(m, StatusDeployed)
		s.queueDeployedHook(m)
		if m.enableHwSync {
			s.after(m, s.opts.Durations.HwSyncDelay, func() { s.hwSync(m) })
		}
	})
	return nil
}

// imageFileType is the upload file type (tgz, ddgz, ...) of the custom image
// a machine is deploying, or "" for a synced Ubuntu image.
func (s *Server) imageFileType(m *machine) string {
	for _, r := range s.resources {
		if r.name == m.distroSeries || r.name == m.osystem+"/"+m.distroSeries {
			return r.sets[len(r.sets)-1].filetype
		}
	}
	return ""
}

// claimAutoIPs gives every auto link an address from its subnet, as MAAS
// does when deployment starts.
func (s *Server) claimAutoIPs(m *machine) {
	for _, i := range m.ifaces {
		for _, l := range i.links {
			if l.mode != "auto" || l.ip != "" {
				continue
			}
			sn := s.subnetByID(l.subnetID)
			if sn == nil {
				continue
			}
			if p, err := netip.ParsePrefix(sn.CIDR); err == nil {
				l.ip = s.nextFreeIP(p, sn.GatewayIP)
			}
		}
	}
}

func (s *Server) queueDeployedHook(m *machine) {
	if s.opts.OnDeployed == nil {
		return
	}
	d := Deployed{SystemID: m.systemID, Hostname: m.hostname, OSystem: m.osystem,
		DistroSeries: m.distroSeries, UserData: slices.Clone(m.userData), Time: s.clock.Now()}
	for _, i := range m.ifaces {
		d.MACs = append(d.MACs, i.mac)
		for _, l := range i.links {
			if l.ip != "" {
				d.IPs = append(d.IPs, l.ip)
			}
		}
	}
	hook := s.opts.OnDeployed
	s.hooks = append(s.hooks, func() { hook(d) })
}

func (s *Server) hwSync(m *machine) {
	if m.status != StatusDeployed || !m.enableHwSync {
		return
	}
	if !s.hasFault(m, FaultHwSyncStale) {
		m.lastSync = s.clock.Now()
	}
	s.after(m, m.syncInterval, func() { s.hwSync(m) })
}

// ---------------------------------------------------------------------------
// Release and erase

func (s *Server) release(c *reqCtx, m *machine) error {
	erase, err := c.boolParam("erase")
	if err != nil {
		return err
	}
	quick, err := c.boolParam("quick_erase")
	if err != nil {
		return err
	}
	secure, err := c.boolParam("secure_erase")
	if err != nil {
		return err
	}
	if _, err := c.boolParam("force"); err != nil {
		return err
	}
	switch {
	case m.status == StatusReleasing || m.status == StatusReady:
		// MAAS: a redundant retry; the postcondition holds.
		return nil
	case slices.Contains(releasableStatuses, m.status):
	default:
		return stateViolation("Machine cannot be released in its current state ('%s').", m.status)
	}
	s.event(m, levelDebug, "User releasing node", c.get("comment"))
	m.gen++
	if !erase {
		return s.startReleasing(m)
	}
	if err := s.setStatus(m, StatusDiskErasing); err != nil {
		return err
	}
	s.event(m, levelDebug, "User erasing disk", "")
	m.powerState = "on"
	d := s.opts.Durations.Erase
	switch {
	case quick:
		d = s.opts.Durations.QuickErase
	case secure:
		d = s.opts.Durations.SecureErase
	}
	fail := s.takeFault(m, FaultEraseFailure, "") != nil
	s.after(m, d/2, func() { s.event(m, levelInfo, "Loading ephemeral", "") })
	s.after(m, d, func() {
		if fail {
			s.event(m, levelError, "Marking node failed", "Failed to erase disks.")
			m.errorDesc = "Failed to erase disks."
			s.mustStatus(m, StatusFailedDiskErasing)
			m.powerState = "off"
			return
		}
		_ = s.startReleasing(m)
	})
	return nil
}

func (s *Server) startReleasing(m *machine) error {
	if err := s.setStatus(m, StatusReleasing); err != nil {
		return err
	}
	s.event(m, levelInfo, "Powering off", "")
	s.after(m, s.opts.Durations.Release, func() {
		m.powerState = "off"
		s.mustStatus(m, StatusReady)
		s.event(m, levelInfo, "Released", "")
		m.owner, m.osystem, m.distroSeries, m.userData = "", "", "", nil
		for _, i := range m.ifaces {
			for _, l := range i.links {
				if l.mode == "auto" {
					l.ip = ""
				}
			}
		}
		m.enableHwSync, m.lastSync, m.errorDesc = false, time.Time{}, ""
	})
	return nil
}

// ---------------------------------------------------------------------------
// Power, abort, broken/fixed

func (s *Server) powerOn(c *reqCtx, m *machine) error {
	if m.owner == "" {
		return stateViolation("Can't start node: it hasn't been allocated.")
	}
	ud, err := decodeUserData(c.get("user_data"))
	if err != nil {
		return err
	}
	if m.status == StatusAllocated {
		if ud != nil {
			m.userData = ud
		}
		if m.distroSeries == "" {
			m.osystem, m.distroSeries = "ubuntu", s.opts.DefaultDistroSeries
		}
		return s.startDeploying(m)
	}
	s.event(m, levelDebug, "User powering up node", c.get("comment"))
	s.event(m, levelInfo, "Powering on", "")
	m.powerState = "on"
	return nil
}

func (s *Server) powerOff(c *reqCtx, m *machine) error {
	s.event(m, levelDebug, "User powering down node", c.get("comment"))
	s.event(m, levelInfo, "Powering off", "")
	m.powerState = "off"
	return nil
}

func (s *Server) queryPowerState(m *machine) (*response, error) {
	switch {
	case m.powerType == "manual":
		// MAAS cannot query a manually powered machine.
		return jsonResponse(map[string]string{"state": "unknown"}), nil
	case s.takeFault(m, FaultPowerError, "") != nil:
		s.event(m, levelWarning, "Failed to query node's BMC", "Power state could not be queried: connection timed out")
		m.powerState = "error"
	case s.takeFault(m, FaultPowerUnknown, "") != nil:
		m.powerState = "unknown"
	case m.powerState == "unknown" || m.powerState == "error":
		m.powerState = "off"
		if slices.Contains([]Status{StatusDeployed, StatusDeploying, StatusCommissioning, StatusTesting, StatusDiskErasing}, m.status) {
			m.powerState = "on"
		}
	}
	return jsonResponse(map[string]string{"state": m.powerState}), nil
}

func (s *Server) abort(c *reqCtx, m *machine) error {
	var to Status
	var typ string
	switch m.status {
	case StatusDiskErasing:
		to, typ = StatusFailedDiskErasing, "Aborted disk erasing"
	case StatusCommissioning:
		to, typ = m.prevStatus, "Aborted commissioning"
	case StatusDeploying:
		to, typ = StatusAllocated, "Aborted deployment"
	case StatusTesting:
		to, typ = m.prevStatus, "Aborted testing"
	default:
		return stateViolation("Cannot abort in current state: node %s is in state %s.", m.systemID, m.status)
	}
	if !CanTransition(m.status, to) {
		to = StatusNew
	}
	if err := s.setStatus(m, to); err != nil {
		return err
	}
	m.gen++
	m.powerState = "off"
	s.event(m, levelInfo, typ, c.get("comment"))
	return nil
}

func (s *Server) markBroken(c *reqCtx, m *machine) error {
	if !CanTransition(m.status, StatusBroken) {
		return stateViolation("Invalid transition: %s -> %s.", m.status, StatusBroken)
	}
	comment := c.get("comment")
	if comment == "" {
		comment = c.get("error_description")
	}
	s.event(m, levelDebug, "User marking node broken", comment)
	m.gen++
	if err := s.setStatus(m, StatusBroken); err != nil {
		return err
	}
	m.owner = ""
	m.errorDesc = comment
	return nil
}

func (s *Server) markFixed(c *reqCtx, m *machine) error {
	if m.status != StatusBroken {
		return stateViolation("Can't mark a non-broken node as 'Ready'.")
	}
	s.event(m, levelDebug, "User marking node fixed", c.get("comment"))
	if err := s.setStatus(m, StatusReady); err != nil {
		return err
	}
	m.gen++
	m.errorDesc, m.osystem, m.distroSeries = "", "", ""
	return nil
}

// ---------------------------------------------------------------------------
// Storage

var storageLayouts = []string{"flat", "lvm", "bcache", "vmfs6", "vmfs7", "custom", "blank"}

// parseSize parses MAAS size strings: bytes, K/M/G/T suffixes, or a
// percentage of total (returned negative, in hundredths).
func parseSize(v string) (int64, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if p, ok := strings.CutSuffix(v, "%"); ok {
		f, err := strconv.ParseFloat(p, 64)
		if err != nil || f <= 0 || f > 100 {
			return 0, false
		}
		return -int64(f * 100), true
	}
	mult := int64(1)
	switch strings.ToUpper(v[len(v)-1:]) {
	case "K":
		mult = 1000
	case "M":
		mult = 1000 * 1000
	case "G":
		mult = 1000 * 1000 * 1000
	case "T":
		mult = 1000 * 1000 * 1000 * 1000
	}
	if mult != 1 {
		v = v[:len(v)-1]
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f <= 0 {
		return 0, false
	}
	return int64(f * float64(mult)), true
}

func (s *Server) setStorageLayout(c *reqCtx, m *machine) error {
	if m.status != StatusReady {
		return stateViolation("Cannot change the storage layout on a machine that is not Ready.")
	}
	layout := c.get("storage_layout")
	if layout == "" {
		return fieldError("storage_layout", "This field is required.")
	}
	if !slices.Contains(storageLayouts, layout) {
		return fieldError("storage_layout", "Select a valid choice. %s is not one of the available choices.", layout)
	}
	boot := m.bootDisk()
	if boot == nil {
		return badRequest("Machine is missing a boot disk; no storage layout can be applied.")
	}
	root := boot
	if v := c.get("root_device"); v != "" {
		var choices []string
		root = nil
		for _, d := range m.disks {
			choices = append(choices, strconv.Itoa(d.id))
			if strconv.Itoa(d.id) == v {
				root = d
			}
		}
		if root == nil {
			return invalidChoice("root_device", v, choices)
		}
	}
	for _, k := range []string{"boot_size", "root_size"} {
		if v := c.get(k); v != "" {
			if _, ok := parseSize(v); !ok {
				return fieldError(k, "Unable to parse size %s.", v)
			}
		}
	}
	var rootSize int64
	if v := c.get("root_size"); v != "" {
		rootSize, _ = parseSize(v)
	}
	switch layout {
	case "flat", "lvm", "blank":
	default:
		return badRequest("Failed to configure storage layout '%s': the simulator implements flat, lvm and blank.", layout)
	}
	return s.applyLayout(m, layout, root, rootSize)
}

// applyLayout clears every disk and lays out EFI on the boot disk and "/" on
// root (the rest of the disk, or rootSize bytes; negative = percentage).
func (s *Server) applyLayout(m *machine, layout string, root *blockDevice, rootSize int64) error {
	for _, d := range m.disks {
		d.partitions = nil
	}
	m.layout = layout
	if layout == "blank" {
		return nil
	}
	boot := m.bootDisk()
	boot.partitions = append(boot.partitions, &partition{id: m.newDevID(), size: efiPartitionSize,
		fstype: "fat32", mount: "/boot/efi", bootable: true})
	free := root.size
	for _, p := range root.partitions {
		free -= p.size
	}
	size := free
	switch {
	case rootSize > 0 && rootSize < free:
		size = rootSize
	case rootSize < 0:
		size = free * (-rootSize) / 10000
	}
	root.partitions = append(root.partitions, &partition{id: m.newDevID(), size: size, fstype: "ext4", mount: "/"})
	return nil
}

// ---------------------------------------------------------------------------
// Interface links

var linkModes = []string{"auto", "dhcp", "static", "link_up"}

func (s *Server) ipInUse(ip string) bool {
	for _, m := range s.machines {
		for _, i := range m.ifaces {
			for _, l := range i.links {
				if l.ip == ip {
					return true
				}
			}
		}
	}
	return false
}

func (s *Server) linkSubnet(c *reqCtx, m *machine, i *iface) error {
	if !slices.Contains(linkAllowedStatuses, m.status) {
		return stateViolation("Cannot link interface because the machine is not New, Ready, Allocated, or Broken.")
	}
	mode := strings.ToLower(c.get("mode"))
	if mode == "" {
		return fieldError("mode", "This field is required.")
	}
	if !slices.Contains(linkModes, mode) {
		return fieldError("mode", "Select a valid choice. %s is not one of the available choices.", c.get("mode"))
	}
	var sn *Subnet
	if v := c.get("subnet"); v != "" {
		id, err := strconv.Atoi(v)
		if err == nil {
			sn = s.subnetByID(id)
		}
		if sn == nil {
			for _, x := range s.subnets {
				if x.CIDR == v || x.Name == v {
					sn = x
				}
			}
		}
		if sn == nil {
			return fieldError("subnet", "Select a valid choice. That choice is not one of the available choices.")
		}
	}
	if (mode == "auto" || mode == "static") && sn == nil {
		return fieldError("subnet", "This field is required.")
	}
	ip := c.get("ip_address")
	if ip != "" && mode != "static" {
		return fieldError("ip_address", "IP address can only be set in static mode.")
	}
	if mode == "static" {
		prefix, err := netip.ParsePrefix(sn.CIDR)
		if err != nil {
			return badRequest("Subnet %s has an invalid CIDR.", sn.Name)
		}
		if ip != "" {
			addr, err := netip.ParseAddr(ip)
			if err != nil {
				return fieldError("ip_address", "Enter a valid IPv4 or IPv6 address.")
			}
			if !prefix.Contains(addr) {
				return fieldError("ip_address", "IP address is not in the given subnet '%s'.", sn.Name)
			}
			if s.ipInUse(addr.String()) {
				return fieldError("ip_address", "IP address is already in use.")
			}
			ip = addr.String()
		} else {
			ip = s.nextFreeIP(prefix, sn.GatewayIP)
			if ip == "" {
				// StaticIPAddressExhaustion: a plain MAASAPIException, so
				// no Retry-After (only rack/RPC trouble gets one).
				return &apiError{status: 503, msg: fmt.Sprintf("No more IPs available in subnet: %s.", sn.CIDR), retryAfter: -1}
			}
		}
	}
	if mode == "auto" || mode == "dhcp" || mode == "static" {
		i.links = slices.DeleteFunc(i.links, func(l *ifLink) bool { return l.mode == "link_up" })
	}
	l := &ifLink{id: m.newDevID(), mode: mode, ip: ip}
	if sn != nil {
		l.subnetID = sn.ID
	}
	i.links = append(i.links, l)
	return nil
}

func (s *Server) nextFreeIP(p netip.Prefix, gateway string) string {
	a := p.Masked().Addr().Next()
	for p.Contains(a) {
		if a.String() != gateway && !s.ipInUse(a.String()) && p.Contains(a.Next()) {
			return a.String()
		}
		a = a.Next()
	}
	return ""
}

func (s *Server) unlinkSubnet(c *reqCtx, m *machine, i *iface) error {
	if !slices.Contains(linkAllowedStatuses, m.status) {
		return stateViolation("Cannot unlink interface because the machine is not New, Ready, Allocated, or Broken.")
	}
	id, _ := strconv.Atoi(c.get("id"))
	n := len(i.links)
	i.links = slices.DeleteFunc(i.links, func(l *ifLink) bool { return l.id == id })
	if len(i.links) == n {
		return fieldError("id", "Select a valid choice. That choice is not one of the available choices.")
	}
	return nil
}
