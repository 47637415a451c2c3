package maas

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/canonical/gomaasclient/client"
	"github.com/canonical/gomaasclient/entity"
	"github.com/canonical/gomaasclient/entity/event"
	"github.com/canonical/gomaasclient/entity/node"
)

// Status is a MAAS NODE_STATUS code (gomaasclient's node.Status).
type Status = node.Status

// Machine is a MAAS machine as read from machines/{id}/, with the
// error_description gomaasclient's entity leaves out.
type Machine struct {
	entity.Machine
	ErrorDescription string `json:"error_description"`
}

// UnmarshalJSON decodes both parts (entity.Machine has its own decoder,
// which would otherwise hide ErrorDescription).
func (m *Machine) UnmarshalJSON(b []byte) error {
	if err := json.Unmarshal(b, &m.Machine); err != nil {
		return err
	}
	var extra struct {
		ErrorDescription string `json:"error_description"`
	}
	if err := json.Unmarshal(b, &extra); err != nil {
		return err
	}
	m.ErrorDescription = extra.ErrorDescription
	return nil
}

// Query names a machine by one of its identities (the first set field is
// used): MAAS system_id, hostname, a MAC address, or its BMC address
// (power_parameters.power_address).
type Query struct {
	SystemID string
	Hostname string
	MAC      string
	BMC      string
}

func (q Query) String() string {
	switch {
	case q.SystemID != "":
		return "system_id " + q.SystemID
	case q.Hostname != "":
		return "hostname " + q.Hostname
	case q.MAC != "":
		return "mac " + q.MAC
	case q.BMC != "":
		return "bmc " + q.BMC
	}
	return "empty query"
}

func machineAPI(mc *client.Client, id string) client.APIClient {
	return mc.Machine.(*client.Machine).APIClient.GetSubObject("machines").GetSubObject(id)
}

// Machine reads one machine.
func (c *Client) Machine(ctx context.Context, id string) (*Machine, error) {
	if err := checkSystemID(id); err != nil {
		return nil, err
	}
	mc, err := c.api(ctx)
	if err != nil {
		return nil, err
	}
	var m Machine
	if err := machineAPI(mc, id).Get("", url.Values{}, func(b []byte) error { return json.Unmarshal(b, &m) }); err != nil {
		return nil, fmt.Errorf("read machine %s: %w", id, c.classify(err, false))
	}
	return &m, nil
}

// Resolve finds the one machine q names: nil and ErrNotFound when there
// is none, an error when several match.
func (c *Client) Resolve(ctx context.Context, q Query) (*Machine, error) {
	if q.SystemID != "" {
		return c.Machine(ctx, q.SystemID)
	}
	mc, err := c.api(ctx)
	if err != nil {
		return nil, err
	}
	var p entity.MachinesParams
	switch {
	case q.Hostname != "":
		p.Hostname = []string{q.Hostname}
	case q.MAC != "":
		p.MACAddress = []string{q.MAC}
	case q.BMC != "":
		return c.resolveBMC(ctx, mc, q.BMC)
	default:
		return nil, fmt.Errorf("resolve machine: the query names no identity")
	}
	ms, err := mc.Machines.Get(&p)
	if err != nil {
		return nil, fmt.Errorf("resolve machine by %s: %w", q, c.classify(err, false))
	}
	switch len(ms) {
	case 0:
		return nil, fmt.Errorf("resolve machine by %s: %w", q, ErrNotFound)
	case 1:
		return c.Machine(ctx, ms[0].SystemID)
	}
	return nil, fmt.Errorf("resolve machine by %s: %d machines match (%s)", q, len(ms), systemIDs(ms))
}

// systemIDPattern is what a MAAS system_id looks like (MAAS makes six
// lowercase letters and digits; any plain name is taken). A machine's ID
// becomes a path segment of later requests, so an ID a MAAS answer
// carries ("../users") must not steer them elsewhere.
var systemIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$`)

// checkSystemID refuses an ID that is not a plain system_id.
func checkSystemID(id string) error {
	if !systemIDPattern.MatchString(id) {
		return fmt.Errorf("machine system_id %q is not a MAAS system_id (letters, digits, _ and -, at most 64)", truncate(id, 80))
	}
	return nil
}

func systemIDs(ms []entity.Machine) string {
	ids := make([]string, len(ms))
	for i, m := range ms {
		ids[i] = m.SystemID
	}
	return strings.Join(ids, ", ")
}

// resolveBMC reads every machine's power address in one bulk call
// (machines/?op=power_parameters) and picks the one at bmc.
func (c *Client) resolveBMC(ctx context.Context, mc *client.Client, bmc string) (*Machine, error) {
	var bulk map[string]map[string]any
	err := mc.Machines.(*client.Machines).APIClient.GetSubObject("machines").Get("power_parameters", url.Values{},
		func(b []byte) error { return json.Unmarshal(b, &bulk) })
	if err != nil {
		return nil, fmt.Errorf("resolve machine by bmc %s: read power parameters: %w", bmc, c.classify(err, false))
	}
	var hits []string
	for id, pp := range bulk {
		if addr, _ := pp["power_address"].(string); addr == bmc {
			hits = append(hits, id)
		}
	}
	slices.Sort(hits)
	switch len(hits) {
	case 0:
		return nil, fmt.Errorf("resolve machine by bmc %s: %w", bmc, ErrNotFound)
	case 1:
		return c.Machine(ctx, hits[0])
	}
	return nil, fmt.Errorf("resolve machine by bmc %s: %d machines match (%s)", bmc, len(hits), strings.Join(hits, ", "))
}

// CreateParams describes a machine to add to MAAS.
type CreateParams struct {
	Hostname     string
	Architecture string // default amd64/generic
	MACs         []string
	PowerType    string            // e.g. ipmi, redfish
	PowerParams  map[string]string // power_address, power_user, power_pass...
	// Commission starts commissioning right away (MAAS's default for
	// admin-created machines).
	Commission bool
}

// Create adds a machine. It is not idempotent: on ErrUnknownOutcome,
// Resolve by MAC before trying again (MAAS refuses a duplicate MAC).
func (c *Client) Create(ctx context.Context, p CreateParams) (*Machine, error) {
	if len(p.MACs) == 0 {
		return nil, fmt.Errorf("create machine %s: at least one MAC address is required", p.Hostname)
	}
	mc, err := c.api(ctx)
	if err != nil {
		return nil, err
	}
	arch := p.Architecture
	if arch == "" {
		arch = "amd64/generic"
	}
	commission := p.Commission
	pp := map[string]any{}
	for k, v := range p.PowerParams {
		pp["power_parameters_"+k] = v
	}
	c.log.Info("maas create machine", "hostname", p.Hostname, "macs", p.MACs)
	m, err := mc.Machines.Create(&entity.MachineCreateParams{Hostname: p.Hostname, Architecture: arch,
		MACAddresses: p.MACs, PowerType: p.PowerType, Commission: &commission}, pp)
	if err != nil {
		return nil, fmt.Errorf("create machine %s: %w", p.Hostname, c.classify(err, true))
	}
	return c.Machine(ctx, m.SystemID)
}

// BlockDevices lists a machine's block devices.
func (c *Client) BlockDevices(ctx context.Context, id string) ([]entity.BlockDevice, error) {
	if err := checkSystemID(id); err != nil {
		return nil, err
	}
	mc, err := c.api(ctx)
	if err != nil {
		return nil, err
	}
	bds, err := mc.BlockDevices.Get(id)
	if err != nil {
		return nil, fmt.Errorf("list block devices of %s: %w", id, c.classify(err, false))
	}
	return bds, nil
}

// Interfaces lists a machine's network interfaces.
func (c *Client) Interfaces(ctx context.Context, id string) ([]entity.NetworkInterface, error) {
	if err := checkSystemID(id); err != nil {
		return nil, err
	}
	mc, err := c.api(ctx)
	if err != nil {
		return nil, err
	}
	ifs, err := mc.NetworkInterfaces.Get(id)
	if err != nil {
		return nil, fmt.Errorf("list interfaces of %s: %w", id, c.classify(err, false))
	}
	return ifs, nil
}

// PowerState queries the BMC (op=query_power_state): on, off, unknown, error.
func (c *Client) PowerState(ctx context.Context, id string) (string, error) {
	if err := checkSystemID(id); err != nil {
		return "", err
	}
	mc, err := c.api(ctx)
	if err != nil {
		return "", err
	}
	ps, err := mc.Machine.GetPowerState(id)
	if err != nil {
		return "", fmt.Errorf("query power state of %s: %w", id, c.classify(err, false))
	}
	return ps.State, nil
}

// Events returns a machine's events at level or above (DEBUG, INFO,
// WARNING, ERROR, CRITICAL), newest first; after > 0 returns only events
// with a larger ID.
func (c *Client) Events(ctx context.Context, id, level string, after int) ([]entity.Event, error) {
	if err := checkSystemID(id); err != nil {
		return nil, err
	}
	mc, err := c.api(ctx)
	if err != nil {
		return nil, err
	}
	p := &entity.EventParams{ID: id, Level: event.LogLevel(level), Limit: "1000"}
	if after > 0 {
		p.After = strconv.Itoa(after)
	}
	evs, err := mc.Events.Get(p)
	if err != nil {
		return nil, fmt.Errorf("query events of %s: %w", id, c.classify(err, false))
	}
	return evs.Events, nil
}

// EnsureTag creates tag (if missing) and adds the machine to it
// (tags/{name}/?op=update_nodes), then verifies by read-back. Adding a
// machine twice is harmless, so an unknown outcome is settled by reading.
func (c *Client) EnsureTag(ctx context.Context, id, tag, comment string) error {
	if err := checkSystemID(id); err != nil {
		return err
	}
	mc, err := c.api(ctx)
	if err != nil {
		return err
	}
	if _, err := mc.Tag.Get(tag); err != nil {
		if ce := c.classify(err, false); !isNotFound(ce) {
			return fmt.Errorf("read tag %s: %w", tag, ce)
		}
		if _, err := mc.Tags.Create(&entity.TagParams{Name: tag, Comment: comment}); err != nil {
			// A concurrent or earlier timed-out create may have made it.
			if _, gerr := mc.Tag.Get(tag); gerr != nil {
				return fmt.Errorf("create tag %s: %w", tag, c.classify(err, true))
			}
		}
	}
	m, err := c.Machine(ctx, id)
	if err != nil {
		return err
	}
	if slices.Contains(m.TagNames, tag) {
		return nil
	}
	c.log.Info("maas tag machine", "system_id", id, "tag", tag)
	werr := c.classify(mc.Tag.AddMachines(tag, []string{id}), true)
	m, err = c.Machine(ctx, id)
	if err != nil {
		return err
	}
	if !slices.Contains(m.TagNames, tag) {
		if werr != nil {
			return fmt.Errorf("tag %s with %s: %w", id, tag, werr)
		}
		return fmt.Errorf("tag %s with %s: MAAS accepted update_nodes but the machine does not carry the tag", id, tag)
	}
	return nil
}

func isNotFound(err error) bool { return errors.Is(err, ErrNotFound) }

func isUnknown(err error) bool { return errors.Is(err, ErrUnknownOutcome) }

// errMismatch explains a failed read-back after a write MAAS accepted.
var errMismatch = errors.New("MAAS accepted the write but does not show it")

func orMismatch(werr error) error {
	if werr != nil {
		return werr
	}
	return errMismatch
}

// SetBootDisk makes block device bd the machine's boot disk and verifies
// it by read-back.
func (c *Client) SetBootDisk(ctx context.Context, id string, bd int) error {
	if err := checkSystemID(id); err != nil {
		return err
	}
	m, err := c.Machine(ctx, id)
	if err != nil {
		return err
	}
	if m.BootDisk.ID == bd {
		return nil
	}
	mc, err := c.api(ctx)
	if err != nil {
		return err
	}
	c.log.Info("maas set boot disk", "system_id", id, "block_device", bd)
	werr := c.classify(mc.BlockDevice.SetBootDisk(id, bd), true)
	if werr != nil && !isUnknown(werr) {
		return fmt.Errorf("set boot disk of %s to %d: %w", id, bd, werr)
	}
	if m, err = c.Machine(ctx, id); err != nil {
		return err
	}
	if m.BootDisk.ID != bd {
		return fmt.Errorf("set boot disk of %s to %d: read-back shows %d (%w)", id, bd, m.BootDisk.ID, orMismatch(werr))
	}
	return nil
}

// SetStorageLayout applies a MAAS storage layout (flat, lvm, blank) with
// root_device = block device root, then verifies that "/" is on root.
// gomaasclient has no typed call: it goes through its sub-object API.
func (c *Client) SetStorageLayout(ctx context.Context, id, layout string, root int) error {
	if err := checkSystemID(id); err != nil {
		return err
	}
	mc, err := c.api(ctx)
	if err != nil {
		return err
	}
	c.log.Info("maas set storage layout", "system_id", id, "layout", layout, "root_device", root)
	werr := c.classify(machineAPI(mc, id).Post("set_storage_layout", url.Values{
		"storage_layout": {layout}, "root_device": {strconv.Itoa(root)},
	}, func([]byte) error { return nil }), true)
	if werr != nil && !isUnknown(werr) {
		return fmt.Errorf("set storage layout %s of %s: %w", layout, id, werr)
	}
	if layout == "blank" {
		return werr
	}
	bd, err := mc.BlockDevice.Get(id, root)
	if err != nil {
		return fmt.Errorf("verify storage layout of %s: %w", id, c.classify(err, false))
	}
	for _, p := range bd.Partitions {
		if p.FileSystem.MountPoint == "/" {
			return nil
		}
	}
	return fmt.Errorf("set storage layout %s of %s: read-back shows no / on block device %d (%w)", layout, id, root, orMismatch(werr))
}

// LinkStatic gives interface iface a static address on subnet
// (interfaces/{id}/?op=link_subnet) unless it already has it, and
// verifies by read-back. An interface holding another static address on
// that subnet is an error: the ledger and MAAS disagree.
func (c *Client) LinkStatic(ctx context.Context, id string, iface, subnet int, ip string) error {
	if err := checkSystemID(id); err != nil {
		return err
	}
	mc, err := c.api(ctx)
	if err != nil {
		return err
	}
	has := func() (bool, error) {
		ni, err := mc.NetworkInterface.Get(id, iface)
		if err != nil {
			return false, fmt.Errorf("read interface %d of %s: %w", iface, id, c.classify(err, false))
		}
		for _, l := range ni.Links {
			if l.Subnet.ID != subnet {
				continue
			}
			if l.IPAddress == ip {
				return true, nil
			}
			if strings.EqualFold(l.Mode, "static") && l.IPAddress != "" {
				return false, fmt.Errorf("interface %d of %s already has %s on subnet %d, not %s", iface, id, l.IPAddress, subnet, ip)
			}
		}
		return false, nil
	}
	ok, err := has()
	if err != nil || ok {
		return err
	}
	c.log.Info("maas link subnet", "system_id", id, "interface", iface, "subnet", subnet, "ip", ip)
	_, werr := mc.NetworkInterface.LinkSubnet(id, iface, &entity.NetworkInterfaceLinkParams{Mode: "STATIC", Subnet: subnet, IPAddress: ip})
	werr = c.classify(werr, true)
	if werr != nil && !isUnknown(werr) {
		return fmt.Errorf("link %s on interface %d of %s: %w", ip, iface, id, werr)
	}
	if ok, err = has(); err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("link %s on interface %d of %s: read-back does not show it (%w)", ip, iface, id, orMismatch(werr))
	}
	return nil
}

// PowerOff powers a machine off (no state change in MAAS).
func (c *Client) PowerOff(ctx context.Context, id string) error {
	if err := checkSystemID(id); err != nil {
		return err
	}
	mc, err := c.api(ctx)
	if err != nil {
		return err
	}
	c.log.Info("maas power off", "system_id", id)
	if _, err := mc.Machine.PowerOff(id, &entity.MachinePowerOffParams{}); err != nil {
		werr := c.classify(err, true)
		if !isUnknown(werr) {
			return fmt.Errorf("power off %s: %w", id, werr)
		}
		if st, qerr := c.PowerState(ctx, id); qerr != nil || st != "off" {
			return fmt.Errorf("power off %s: %w", id, werr)
		}
	}
	return nil
}

// encodeUserData is MAAS's user_data: base64 of the cloud-init document.
func encodeUserData(b []byte) string { return base64.StdEncoding.EncodeToString(b) }

// MachinesInStatus lists the machines in a MAAS status ("new", "ready"...).
func (c *Client) MachinesInStatus(ctx context.Context, status string) ([]entity.Machine, error) {
	mc, err := c.api(ctx)
	if err != nil {
		return nil, err
	}
	ms, err := mc.Machines.Get(&entity.MachinesParams{Status: []string{status}})
	if err != nil {
		return nil, fmt.Errorf("list machines in status %s: %w", status, c.classify(err, false))
	}
	return ms, nil
}

// SetHostname renames a machine (idempotent: a machine already named so
// is left alone) and verifies by read-back.
func (c *Client) SetHostname(ctx context.Context, id, hostname string) error {
	if err := checkSystemID(id); err != nil {
		return err
	}
	m, err := c.Machine(ctx, id)
	if err != nil {
		return err
	}
	if m.Hostname == hostname {
		return nil
	}
	mc, err := c.api(ctx)
	if err != nil {
		return err
	}
	c.log.Info("maas rename machine", "system_id", id, "from", m.Hostname, "to", hostname)
	_, werr := mc.Machine.Update(id, &entity.MachineUpdateParams{Hostname: hostname}, nil)
	if werr = c.classify(werr, true); werr != nil && !isUnknown(werr) {
		return fmt.Errorf("rename %s to %s: %w", id, hostname, werr)
	}
	if m, err = c.Machine(ctx, id); err != nil {
		return err
	}
	if m.Hostname != hostname {
		return fmt.Errorf("rename %s to %s: read-back shows %s (%w)", id, hostname, m.Hostname, orMismatch(werr))
	}
	return nil
}

// SubnetByCIDR returns the ID of the MAAS subnet with cidr.
func (c *Client) SubnetByCIDR(ctx context.Context, cidr string) (int, error) {
	mc, err := c.api(ctx)
	if err != nil {
		return 0, err
	}
	subnets, err := mc.Subnets.Get()
	if err != nil {
		return 0, fmt.Errorf("list subnets: %w", c.classify(err, false))
	}
	for _, s := range subnets {
		if s.CIDR == cidr {
			return s.ID, nil
		}
	}
	return 0, fmt.Errorf("subnet %s: %w", cidr, ErrNotFound)
}

// BootResource is one MAAS boot resource with the file types of its sets
// (tgz root filesystems are "root-tgz", full-disk images "root-dd*").
type BootResource struct {
	ID           int
	Name         string
	Architecture string
	Type         string
	FileTypes    []string
}

// BootResources lists MAAS's uploaded and synced boot resources, each
// read in full for its sets' file types.
func (c *Client) BootResources(ctx context.Context) ([]BootResource, error) {
	mc, err := c.api(ctx)
	if err != nil {
		return nil, err
	}
	api := mc.BootResources.(*client.BootResources).APIClient.GetSubObject("boot-resources")
	var list []entity.BootResource
	if err := api.Get("", url.Values{}, func(b []byte) error { return json.Unmarshal(b, &list) }); err != nil {
		return nil, fmt.Errorf("list boot resources: %w", c.classify(err, false))
	}
	out := make([]BootResource, 0, len(list))
	for _, r := range list {
		var full struct {
			Sets map[string]struct {
				Files map[string]struct {
					Filetype string `json:"filetype"`
				} `json:"files"`
			} `json:"sets"`
		}
		if err := api.GetSubObject(fmt.Sprint(r.ID)).Get("", url.Values{}, func(b []byte) error { return json.Unmarshal(b, &full) }); err != nil {
			return nil, fmt.Errorf("read boot resource %d (%s): %w", r.ID, r.Name, c.classify(err, false))
		}
		br := BootResource{ID: r.ID, Name: r.Name, Architecture: r.Architecture, Type: r.Type}
		for _, s := range full.Sets {
			for _, f := range s.Files {
				if !slices.Contains(br.FileTypes, f.Filetype) {
					br.FileTypes = append(br.FileTypes, f.Filetype)
				}
			}
		}
		slices.Sort(br.FileTypes)
		out = append(out, br)
	}
	return out, nil
}

// UploadBootResource uploads a custom image (gomaasclient's
// BootResources.Create is not implemented: this is its generic PostFiles
// call). filetype is tgz for a root filesystem, ddgz for a full disk.
func (c *Client) UploadBootResource(ctx context.Context, name, arch, filetype string, content []byte) error {
	mc, err := c.api(ctx)
	if err != nil {
		return err
	}
	sum := sha256.Sum256(content)
	api := mc.BootResources.(*client.BootResources).APIClient.GetSubObject("boot-resources")
	err = api.PostFiles("", url.Values{"name": {name}, "architecture": {arch}, "filetype": {filetype},
		"sha256": {hex.EncodeToString(sum[:])}, "size": {strconv.Itoa(len(content))}},
		map[string][]byte{"content": content}, func([]byte) error { return nil })
	if err != nil {
		return fmt.Errorf("upload boot resource %s: %w", name, c.classify(err, true))
	}
	return nil
}
