package maassim

import (
	"encoding/base64"
	"fmt"
	"net"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Hardware is what commissioning discovers on a machine.
type Hardware struct {
	CPUCount     int
	MemoryMiB    int64
	BlockDevices []BlockDeviceSpec
	// Interfaces are NICs beyond the ones the machine was created with
	// (matched by MAC); created interfaces keep their MACs.
	Interfaces []InterfaceSpec
}

// BlockDeviceSpec describes a physical disk.
type BlockDeviceSpec struct {
	Name   string // sda, nvme0n1
	Model  string
	Serial string
	Size   int64 // bytes
	Tags   []string
}

// InterfaceSpec describes a NIC.
type InterfaceSpec struct {
	Name string
	MAC  string
}

// DefaultHardware is what commissioning finds on a machine with no
// registered Hardware: a small boot SSD (a BOSS-style device) and an NVMe.
var DefaultHardware = Hardware{
	CPUCount:  32,
	MemoryMiB: 256 * 1024,
	BlockDevices: []BlockDeviceSpec{
		{Name: "sda", Model: "Dell BOSS-N1", Serial: "BOSS0001", Size: 480 * 1000 * 1000 * 1000, Tags: []string{"ssd"}},
		{Name: "nvme0n1", Model: "SAMSUNG MZWLO3T8", Serial: "S6ABNE0001", Size: 3840 * 1000 * 1000 * 1000, Tags: []string{"ssd", "nvme"}},
	},
}

const efiPartitionSize = 512 << 20

type machine struct {
	id            int
	systemID      string
	hostname      string
	description   string
	architecture  string
	status        Status
	prevStatus    Status
	owner         string
	powerType     string
	powerParams   map[string]string
	powerState    string
	osystem       string
	distroSeries  string
	userData      []byte
	enableHwSync  bool
	lastSync      time.Time
	syncInterval  time.Duration
	tags          []string
	ifaces        []*iface
	disks         []*blockDevice
	bootDiskID    int
	layout        string
	statusMessage string
	errorDesc     string
	cpuCount      int
	memoryMiB     int64
	gen           int             // bumps whenever an async operation starts or is cancelled
	timers        []*machineTimer // pending afters, run in due order (lifecycle.go)
	faults        []*Fault
	nextDevID     *int
}

type iface struct {
	id      int
	name    string
	mac     string
	enabled bool
	links   []*ifLink
}

type ifLink struct {
	id       int
	mode     string // auto, dhcp, static, link_up
	ip       string
	subnetID int
}

type blockDevice struct {
	id         int
	name       string
	model      string
	serial     string
	size       int64
	tags       []string
	partitions []*partition
}

type partition struct {
	id       int
	size     int64
	fstype   string
	mount    string
	bootable bool
}

// MachineSnapshot is a read-only copy of a simulated machine for tests and
// the lab.
type MachineSnapshot struct {
	SystemID      string
	Hostname      string
	Status        Status
	PowerState    string
	PowerType     string
	PowerParams   map[string]string
	Owner         string
	OSystem       string
	DistroSeries  string
	UserData      []byte
	EnableHwSync  bool
	LastSync      time.Time
	Tags          []string
	MACs          []string
	BootDiskID    int
	StorageLayout string
	RootDeviceID  int // disk holding "/" (0 if no layout)
	Links         []LinkSnapshot
	StatusMessage string
}

// LinkSnapshot is one interface link.
type LinkSnapshot struct {
	Interface string
	Mode      string
	IP        string
	SubnetID  int
}

func (s *Server) snapshot(m *machine) MachineSnapshot {
	out := MachineSnapshot{
		SystemID: m.systemID, Hostname: m.hostname, Status: m.status, PowerState: m.powerState,
		PowerType: m.powerType, PowerParams: map[string]string{}, Owner: m.owner,
		OSystem: m.osystem, DistroSeries: m.distroSeries, UserData: slices.Clone(m.userData),
		EnableHwSync: m.enableHwSync, LastSync: m.lastSync, Tags: slices.Clone(m.tags),
		BootDiskID: m.bootDiskID, StorageLayout: m.layout, StatusMessage: m.statusMessage,
	}
	for k, v := range m.powerParams {
		out.PowerParams[k] = v
	}
	for _, i := range m.ifaces {
		out.MACs = append(out.MACs, i.mac)
		for _, l := range i.links {
			out.Links = append(out.Links, LinkSnapshot{Interface: i.name, Mode: l.mode, IP: l.ip, SubnetID: l.subnetID})
		}
	}
	for _, d := range m.disks {
		for _, p := range d.partitions {
			if p.mount == "/" {
				out.RootDeviceID = d.id
			}
		}
	}
	return out
}

// Machine returns a snapshot of a machine.
func (s *Server) Machine(systemID string) (MachineSnapshot, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.machines[systemID]
	if !ok {
		return MachineSnapshot{}, false
	}
	return s.snapshot(m), true
}

// Machines returns snapshots of all machines in creation order.
func (s *Server) Machines() []MachineSnapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []MachineSnapshot
	for _, id := range s.order {
		out = append(out, s.snapshot(s.machines[id]))
	}
	return out
}

// SetHardware registers what commissioning will discover on the machine
// that has (or will have) the given MAC.
func (s *Server) SetHardware(mac string, hw Hardware) error {
	n, err := normalizeMAC(mac)
	if err != nil {
		return fmt.Errorf("set hardware for %q: %w", mac, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hardware[n] = hw
	return nil
}

// ForceStatus puts a machine into a status without any transition check or
// side effect (test setup only: it is how transition tests reach every
// status). It cancels any operation in flight.
func (s *Server) ForceStatus(systemID string, st Status) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.machines[systemID]
	if !ok {
		return fmt.Errorf("force status of %s: no such machine", systemID)
	}
	m.gen++
	m.status = st
	if slices.Contains(releasableStatuses, st) && m.owner == "" {
		m.owner = "admin"
	}
	return nil
}

func normalizeMAC(s string) (string, error) {
	hw, err := net.ParseMAC(strings.TrimSpace(s))
	if err != nil || len(hw) != 6 {
		return "", fmt.Errorf("'%s' is not a valid MAC address", s)
	}
	return hw.String(), nil
}

// ---------------------------------------------------------------------------
// JSON rendering (field names as MAAS's DISPLAYED_MACHINE_FIELDS)

func machineURI(id string) string { return fmt.Sprintf("%smachines/%s/", APIPrefix, id) }

func maasTime(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UTC().Format("2006-01-02T15:04:05.000")
}

func (s *Server) subnetByID(id int) *Subnet {
	for _, sn := range s.subnets {
		if sn.ID == id {
			return sn
		}
	}
	return nil
}

func (s *Server) ifaceJSON(m *machine, i *iface) map[string]any {
	links := []any{}
	var vlan any
	for _, l := range i.links {
		lj := map[string]any{"id": l.id, "mode": l.mode}
		if l.ip != "" {
			lj["ip_address"] = l.ip
		}
		if sn := s.subnetByID(l.subnetID); sn != nil {
			lj["subnet"] = subnetJSON(sn)
			vlan = vlanJSON(sn)
		}
		links = append(links, lj)
	}
	if vlan == nil && len(s.subnets) > 0 {
		vlan = vlanJSON(s.subnets[0])
	}
	return map[string]any{
		"id": i.id, "name": i.name, "type": "physical", "mac_address": i.mac,
		"enabled": i.enabled, "links": links, "vlan": vlan, "parents": []string{},
		"children": []string{}, "tags": []string{}, "params": "", "discovered": nil,
		"effective_mtu": 1500, "vendor": "Mellanox Technologies", "product": "MT2892 Family [ConnectX-6 Dx]",
		"firmware_version": "22.36.1010", "link_connected": true, "interface_speed": 100000,
		"link_speed": 100000, "numa_node": 0, "sriov_max_vf": 0, "system_id": m.systemID,
		"resource_uri": fmt.Sprintf("%snodes/%s/interfaces/%d/", APIPrefix, m.systemID, i.id),
	}
}

func blockDeviceJSON(m *machine, d *blockDevice) map[string]any {
	parts := []any{}
	var used int64
	for _, p := range d.partitions {
		used += p.size
		parts = append(parts, map[string]any{
			"id": p.id, "uuid": fmt.Sprintf("00000000-0000-4000-8000-%012d", p.id),
			"path": fmt.Sprintf("/dev/disk/by-dname/%s-part%d", d.name, p.id%1000),
			"type": "partition", "size": p.size, "bootable": p.bootable,
			"filesystem": map[string]any{"fstype": p.fstype, "label": "", "uuid": fmt.Sprintf("fs-%d", p.id), "mount_point": p.mount, "mount_options": ""},
			"used_for":   fmt.Sprintf("%s formatted filesystem mounted at %s", p.fstype, p.mount),
			"system_id":  m.systemID, "device_id": d.id, "tags": []string{},
			"resource_uri": fmt.Sprintf("%snodes/%s/blockdevices/%d/partition/%d", APIPrefix, m.systemID, d.id, p.id),
		})
	}
	usedFor := "Unused"
	var ptable any
	if len(d.partitions) > 0 {
		usedFor = fmt.Sprintf("GPT partitioned with %d partition", len(d.partitions))
		if len(d.partitions) > 1 {
			usedFor += "s"
		}
		ptable = "GPT"
	}
	return map[string]any{
		"id": d.id, "system_id": m.systemID, "name": d.name, "uuid": nil, "type": "physical",
		"path": "/dev/disk/by-dname/" + d.name, "model": d.model, "serial": d.serial,
		"id_path": fmt.Sprintf("/dev/disk/by-id/wwn-%s", strings.ToLower(d.serial)),
		"size":    d.size, "block_size": 512, "available_size": d.size - used, "used_size": used,
		"used_for": usedFor, "tags": nonNil(d.tags), "filesystem": nil, "partition_table_type": ptable,
		"partitions": parts, "firmware_version": "1.0", "storage_pool": nil, "numa_node": 0,
		"resource_uri": fmt.Sprintf("%snodes/%s/blockdevices/%d/", APIPrefix, m.systemID, d.id),
	}
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func (m *machine) bootDisk() *blockDevice {
	for _, d := range m.disks {
		if d.id == m.bootDiskID {
			return d
		}
	}
	if len(m.disks) > 0 {
		return m.disks[0]
	}
	return nil
}

func (s *Server) machineJSON(m *machine) map[string]any {
	ifs := []any{}
	var ips []string
	for _, i := range m.ifaces {
		ifs = append(ifs, s.ifaceJSON(m, i))
		for _, l := range i.links {
			if l.ip != "" {
				ips = append(ips, l.ip)
			}
		}
	}
	disks := []any{}
	var storage float64
	for _, d := range m.disks {
		disks = append(disks, blockDeviceJSON(m, d))
		storage += float64(d.size) / 1e6
	}
	var bootDisk, bootIface any
	if d := m.bootDisk(); d != nil {
		bootDisk = blockDeviceJSON(m, d)
	}
	if len(m.ifaces) > 0 {
		bootIface = s.ifaceJSON(m, m.ifaces[0])
	}
	var owner any
	if m.owner != "" {
		owner = m.owner
	}
	var syncInterval, nextSync any
	if m.enableHwSync {
		syncInterval = int(m.syncInterval / time.Second)
		if !m.lastSync.IsZero() {
			nextSync = maasTime(m.lastSync.Add(m.syncInterval))
		}
	}
	cores := []int{}
	for i := 0; i < m.cpuCount; i++ {
		cores = append(cores, i)
	}
	return map[string]any{
		"system_id": m.systemID, "hostname": m.hostname, "description": m.description,
		"hardware_uuid": fmt.Sprintf("4c4c4544-%04d-4000-8000-%012d", m.id, m.id),
		"domain": map[string]any{"authoritative": true, "ttl": nil, "resource_record_count": 0,
			"name": "maas", "id": 0, "is_default": true, "resource_uri": APIPrefix + "domains/0/"},
		"fqdn": m.hostname + ".maas", "owner": owner, "owner_data": map[string]string{},
		"locked": false, "cache_sets": []any{}, "bcaches": []any{}, "bios_boot_method": "uefi",
		"boot_interface": bootIface, "architecture": m.architecture, "min_hwe_kernel": "",
		"hwe_kernel": nil, "cpu_count": m.cpuCount, "cpu_speed": 2400, "memory": m.memoryMiB,
		"swap_size": nil, "storage": storage, "status": int(m.status), "osystem": m.osystem,
		"distro_series": m.distroSeries, "ephemeral_deploy": false, "error_description": m.errorDesc,
		"netboot": m.status != StatusDeployed, "power_type": m.powerType, "power_state": m.powerState,
		"tag_names": nonNil(m.tags), "address_ttl": nil, "ip_addresses": nonNil(ips),
		"interface_set": ifs,
		"zone":          map[string]any{"name": "default", "description": "", "id": 1, "resource_uri": APIPrefix + "zones/default/"},
		"pool":          map[string]any{"name": "default", "description": "Default pool", "id": 0, "resource_uri": APIPrefix + "resourcepool/0/"},
		"disable_ipv4":  false, "boot_disk": bootDisk, "blockdevice_set": disks,
		"physicalblockdevice_set": disks, "virtualblockdevice_set": []any{}, "volume_groups": []any{},
		"raids": []any{}, "status_action": "", "status_message": m.statusMessage,
		"status_name": m.status.String(), "node_type": 0, "node_type_name": "Machine",
		"special_filesystems": []any{}, "parent": nil, "pod": nil,
		"default_gateways": map[string]any{
			"ipv4": map[string]any{"gateway_ip": nil, "link_id": nil},
			"ipv6": map[string]any{"gateway_ip": nil, "link_id": nil},
		},
		"current_commissioning_result_id": m.id, "current_testing_result_id": m.id,
		"current_installation_result_id": m.id,
		"commissioning_status":           2, "commissioning_status_name": "Passed",
		"testing_status": 2, "testing_status_name": "Passed",
		"cpu_test_status": -1, "cpu_test_status_name": "Unknown",
		"memory_test_status": -1, "memory_test_status_name": "Unknown",
		"network_test_status": -1, "network_test_status_name": "Unknown",
		"storage_test_status": 2, "storage_test_status_name": "Passed",
		"other_test_status": -1, "other_test_status_name": "Unknown",
		"interface_test_status": -1, "interface_test_status_name": "Unknown",
		"hardware_info":     map[string]string{"system_vendor": "Dell Inc.", "system_product": "PowerEdge XE9680"},
		"numanode_set":      []any{map[string]any{"index": 0, "cores": cores, "memory": m.memoryMiB, "hugepages_set": []any{}}},
		"virtualmachine_id": nil, "workload_annotations": map[string]string{},
		"last_sync": maasTime(m.lastSync), "sync_interval": syncInterval, "next_sync": nextSync,
		"enable_hw_sync": m.enableHwSync, "enable_kernel_crash_dump": false, "is_dpu": false,
		"resource_uri": machineURI(m.systemID),
	}
}

// ---------------------------------------------------------------------------
// machines/

var validArchitectures = []string{"amd64/generic", "arm64/generic", "amd64/hwe-22.04", "amd64/ga-22.04"}

var validPowerTypes = []string{"ipmi", "redfish", "manual", "virsh", "lxd", "amt", "webhook", "openbmc", "wedge", "hmc", "proxmox"}

func invalidChoice(field, value string, choices []string) *apiError {
	q := make([]string, len(choices))
	for i, c := range choices {
		q[i] = "'" + c + "'"
	}
	return fieldError(field, "'%s' is not a valid %s.  It should be one of: %s.", value, field, strings.Join(q, ", "))
}

func (s *Server) machinesCollection(c *reqCtx) (*response, error) {
	switch {
	case c.method == http.MethodGet && c.op == "":
		return s.listMachines(c)
	case c.method == http.MethodGet && c.op == "power_parameters":
		out := map[string]map[string]string{}
		ids := c.form["id"]
		for _, id := range s.order {
			if len(ids) > 0 && !slices.Contains(ids, id) {
				continue
			}
			out[id] = s.machines[id].powerParamsCopy()
		}
		return jsonResponse(out), nil
	case c.method == http.MethodPost && c.op == "":
		return s.createMachine(c)
	case c.method == http.MethodGet || c.method == http.MethodPost:
		return nil, unknownOp(c)
	}
	return nil, methodNotAllowed()
}

func (m *machine) powerParamsCopy() map[string]string {
	out := map[string]string{}
	for k, v := range m.powerParams {
		out[k] = v
	}
	return out
}

func (s *Server) listMachines(c *reqCtx) (*response, error) {
	var macs []string
	var bad []string
	for _, raw := range c.form["mac_address"] {
		n, err := normalizeMAC(raw)
		if err != nil {
			bad = append(bad, raw)
			continue
		}
		macs = append(macs, n)
	}
	if len(bad) > 0 {
		return nil, badRequest("Invalid MAC address(es): %s", strings.Join(bad, ", "))
	}
	var statuses []Status
	for _, l := range c.form["status"] {
		st, ok := ParseStatusLabel(l)
		if !ok {
			labels := make([]string, 0, len(AllStatuses))
			for _, x := range AllStatuses {
				labels = append(labels, x.Label())
			}
			sort.Strings(labels)
			return nil, invalidChoice("status", l, labels)
		}
		statuses = append(statuses, st)
	}
	out := []any{}
	for _, id := range s.order {
		m := s.machines[id]
		if v := c.form["id"]; len(v) > 0 && !slices.Contains(v, m.systemID) {
			continue
		}
		if v := c.form["not_id"]; slices.Contains(v, m.systemID) {
			continue
		}
		if v := c.form["hostname"]; len(v) > 0 && !slices.Contains(v, m.hostname) {
			continue
		}
		if len(macs) > 0 && !slices.ContainsFunc(m.ifaces, func(i *iface) bool { return slices.Contains(macs, i.mac) }) {
			continue
		}
		if len(statuses) > 0 && !slices.Contains(statuses, m.status) {
			continue
		}
		if v := c.form["tags"]; len(v) > 0 && !containsAll(m.tags, v) {
			continue
		}
		if v := c.form["not_tags"]; len(v) > 0 && slices.ContainsFunc(v, func(t string) bool { return slices.Contains(m.tags, t) }) {
			continue
		}
		if v := c.form["arch"]; len(v) > 0 && !slices.ContainsFunc(v, func(a string) bool { return strings.HasPrefix(m.architecture, a) }) {
			continue
		}
		if v := c.form["power_state"]; len(v) > 0 && !slices.Contains(v, m.powerState) {
			continue
		}
		if v := c.form["owner"]; len(v) > 0 && !slices.Contains(v, m.owner) {
			continue
		}
		out = append(out, s.machineJSON(m))
	}
	return jsonResponse(out), nil
}

func containsAll(have, want []string) bool {
	for _, w := range want {
		if !slices.Contains(have, w) {
			return false
		}
	}
	return true
}

var petAdjectives = []string{"brave", "calm", "eager", "fancy", "gentle", "happy", "jolly", "keen", "lively", "merry", "nice", "proud", "quick", "silly", "witty"}
var petNouns = []string{"badger", "crane", "dingo", "egret", "ferret", "gecko", "heron", "ibis", "jackal", "koala", "lemur", "marmot", "newt", "otter", "puffin"}

const systemIDAlphabet = "abcdefghjkmnpqrstuvwxy3456789"

func (s *Server) newSystemID() string {
	for {
		b := make([]byte, 6)
		for i := range b {
			b[i] = systemIDAlphabet[s.rng.Intn(len(systemIDAlphabet))]
		}
		if _, dup := s.machines[string(b)]; !dup {
			return string(b)
		}
	}
}

func (s *Server) hostnameTaken(h string, except *machine) bool {
	for _, m := range s.machines {
		if m != except && m.hostname == h {
			return true
		}
	}
	return false
}

func (s *Server) macOwner(mac string) *machine {
	for _, m := range s.machines {
		for _, i := range m.ifaces {
			if i.mac == mac {
				return m
			}
		}
	}
	return nil
}

func powerParamsFrom(form map[string][]string) map[string]string {
	out := map[string]string{}
	for k, v := range form {
		if strings.HasPrefix(k, "power_parameters_") && len(v) > 0 && k != "power_parameters_skip_check" {
			out[strings.TrimPrefix(k, "power_parameters_")] = v[0]
		}
	}
	return out
}

func (s *Server) createMachine(c *reqCtx) (*response, error) {
	arch := c.get("architecture")
	if arch == "" {
		arch = "amd64/generic"
	}
	if !slices.Contains(validArchitectures, arch) {
		return nil, invalidChoice("architecture", arch, validArchitectures)
	}
	rawMACs := c.form["mac_addresses"]
	if len(rawMACs) == 0 {
		return nil, fieldError("mac_addresses", "This field is required.")
	}
	var macs []string
	for _, raw := range rawMACs {
		n, err := normalizeMAC(raw)
		if err != nil {
			return nil, fieldError("mac_addresses", "One or more MAC addresses is invalid. (%s.)", err.Error())
		}
		if o := s.macOwner(n); o != nil {
			return nil, fieldError("mac_addresses", "MAC address %s already in use on %s.", n, o.hostname)
		}
		if slices.Contains(macs, n) {
			return nil, fieldError("mac_addresses", "MAC address %s is listed more than once.", n)
		}
		macs = append(macs, n)
	}
	pt := c.get("power_type")
	if pt == "" {
		pt = "manual"
	}
	if !slices.Contains(validPowerTypes, pt) {
		return nil, fieldError("power_type", "Select a valid choice. %s is not one of the available choices.", pt)
	}
	hostname := c.get("hostname")
	if hostname != "" {
		if err := validHostname(hostname); err != nil {
			return nil, err
		}
		if s.hostnameTaken(hostname, nil) {
			return nil, fieldError("hostname", "Node with this Hostname already exists.")
		}
	}
	commission := true
	if c.has("commission") {
		v, err := c.boolParam("commission")
		if err != nil {
			return nil, err
		}
		commission = v
	}
	deployed, err := c.boolParam("deployed")
	if err != nil {
		return nil, err
	}
	if deployed {
		// MAAS: deployed=true adopts a running machine; it implies
		// commission=false.
		commission = false
	}
	m := s.newMachineLocked(hostname, c.get("description"), arch, pt, powerParamsFrom(c.form), macs)
	c.systemID = m.systemID
	if deployed {
		m.status, m.owner, m.powerState = StatusDeployed, c.user, "on"
		s.event(m, levelInfo, "Deployed", "")
	}
	if commission {
		if err := s.startCommissioning(m, c); err != nil {
			return nil, err
		}
	}
	return jsonResponse(s.machineJSON(m)), nil
}

// newMachineLocked adds a New machine with one interface per MAC (already
// validated) and a generated hostname if none is given.
func (s *Server) newMachineLocked(hostname, description, arch, powerType string, powerParams map[string]string, macs []string) *machine {
	for hostname == "" || s.hostnameTaken(hostname, nil) {
		hostname = petAdjectives[s.rng.Intn(len(petAdjectives))] + "-" + petNouns[s.rng.Intn(len(petNouns))]
	}
	s.nextID++
	devID := 0
	m := &machine{
		id: s.nextID, systemID: s.newSystemID(), hostname: hostname, description: description,
		architecture: arch, status: StatusNew, powerType: powerType, powerParams: powerParams,
		powerState: "off", cpuCount: 1, memoryMiB: 1024, nextDevID: &devID,
	}
	if powerType == "manual" {
		m.powerState = "unknown"
	}
	for n, mac := range macs {
		m.ifaces = append(m.ifaces, &iface{id: m.newDevID(), name: fmt.Sprintf("eth%d", n), mac: mac, enabled: true})
	}
	s.machines[m.systemID] = m
	s.order = append(s.order, m.systemID)
	s.event(m, levelInfo, "New", "")
	return m
}

// Enlistment is a machine that PXE-boots into MAAS by itself.
type Enlistment struct {
	Hostname     string // generated if empty
	Architecture string // default amd64/generic
	MACs         []string
	PowerType    string            // default ipmi
	PowerParams  map[string]string // power_address, power_user, ...
}

// Enlist adds a machine the way MAAS enlistment does (PXE boot of an
// unknown host): it appears in New without any API request. It returns the
// system_id.
func (s *Server) Enlist(e Enlistment) (string, error) {
	if len(e.MACs) == 0 {
		return "", fmt.Errorf("enlist %q: no MAC address", e.Hostname)
	}
	if e.Architecture == "" {
		e.Architecture = "amd64/generic"
	}
	if !slices.Contains(validArchitectures, e.Architecture) {
		return "", fmt.Errorf("enlist %q: unknown architecture %q", e.Hostname, e.Architecture)
	}
	if e.PowerType == "" {
		e.PowerType = "ipmi"
	}
	if !slices.Contains(validPowerTypes, e.PowerType) {
		return "", fmt.Errorf("enlist %q: unknown power type %q", e.Hostname, e.PowerType)
	}
	if e.Hostname != "" {
		if err := validHostname(e.Hostname); err != nil {
			return "", fmt.Errorf("enlist %q: %w", e.Hostname, err)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var macs []string
	for _, raw := range e.MACs {
		n, err := normalizeMAC(raw)
		if err != nil {
			return "", fmt.Errorf("enlist %q: %w", e.Hostname, err)
		}
		if o := s.macOwner(n); o != nil || slices.Contains(macs, n) {
			return "", fmt.Errorf("enlist %q: MAC address %s already in use", e.Hostname, n)
		}
		macs = append(macs, n)
	}
	if e.Hostname != "" && s.hostnameTaken(e.Hostname, nil) {
		return "", fmt.Errorf("enlist %q: hostname already in use", e.Hostname)
	}
	pp := map[string]string{}
	for k, v := range e.PowerParams {
		pp[k] = v
	}
	return s.newMachineLocked(e.Hostname, "", e.Architecture, e.PowerType, pp, macs).systemID, nil
}

func (m *machine) newDevID() int {
	*m.nextDevID++
	return m.id*1000 + *m.nextDevID
}

func validHostname(h string) *apiError {
	if len(h) > 63 || h == "" {
		return fieldError("hostname", "Invalid hostname: Label is too long or empty.")
	}
	for _, r := range h {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-') {
			return fieldError("hostname", "Invalid hostname: Label contains disallowed characters.")
		}
	}
	return nil
}

func (s *Server) machineResource(c *reqCtx, id string) (*response, error) {
	m, ok := s.machines[id]
	if !ok {
		return nil, notFound("Machine")
	}
	switch c.method {
	case http.MethodGet:
		switch c.op {
		case "":
			return jsonResponse(s.machineJSON(m)), nil
		case "power_parameters":
			return jsonResponse(m.powerParamsCopy()), nil
		case "query_power_state":
			return s.queryPowerState(m)
		}
		return nil, unknownOp(c)
	case http.MethodPut:
		return s.updateMachine(c, m)
	case http.MethodDelete:
		m.gen++
		delete(s.machines, id)
		s.order = slices.DeleteFunc(s.order, func(x string) bool { return x == id })
		return &response{status: http.StatusNoContent, ctype: "text/plain; charset=utf-8"}, nil
	case http.MethodPost:
		var err error
		switch c.op {
		case "commission":
			err = s.commission(c, m)
		case "deploy":
			err = s.deploy(c, m)
		case "release":
			err = s.release(c, m)
		case "power_on":
			err = s.powerOn(c, m)
		case "power_off":
			err = s.powerOff(c, m)
		case "abort":
			err = s.abort(c, m)
		case "mark_broken":
			err = s.markBroken(c, m)
		case "mark_fixed":
			err = s.markFixed(c, m)
		case "set_storage_layout":
			err = s.setStorageLayout(c, m)
		default:
			return nil, unknownOp(c)
		}
		if err != nil {
			return nil, err
		}
		return jsonResponse(s.machineJSON(m)), nil
	}
	return nil, methodNotAllowed()
}

func (s *Server) updateMachine(c *reqCtx, m *machine) (*response, error) {
	if h := c.get("hostname"); h != "" && h != m.hostname {
		if err := validHostname(h); err != nil {
			return nil, err
		}
		if s.hostnameTaken(h, m) {
			return nil, fieldError("hostname", "Node with this Hostname already exists.")
		}
		m.hostname = h
	}
	if c.has("description") {
		m.description = c.get("description")
	}
	if a := c.get("architecture"); a != "" {
		if !slices.Contains(validArchitectures, a) {
			return nil, invalidChoice("architecture", a, validArchitectures)
		}
		m.architecture = a
	}
	if pt := c.get("power_type"); pt != "" {
		if !slices.Contains(validPowerTypes, pt) {
			return nil, fieldError("power_type", "Select a valid choice. %s is not one of the available choices.", pt)
		}
		if pt != m.powerType {
			m.powerParams = map[string]string{}
		}
		m.powerType = pt
	}
	for k, v := range powerParamsFrom(c.form) {
		m.powerParams[k] = v
	}
	if v := c.get("cpu_count"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return nil, fieldError("cpu_count", "Enter a whole number.")
		}
		m.cpuCount = n
	}
	return jsonResponse(s.machineJSON(m)), nil
}

func decodeUserData(v string) ([]byte, *apiError) {
	if v == "" {
		return nil, nil
	}
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding, base64.RawStdEncoding, base64.RawURLEncoding} {
		if b, err := enc.DecodeString(v); err == nil {
			return b, nil
		}
	}
	return nil, fieldError("user_data", "user_data must be base64-encoded.")
}
