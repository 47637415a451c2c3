package maassim_test

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"net/url"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/canonical/gomaasclient/client"
	"github.com/canonical/gomaasclient/entity"
	"github.com/canonical/gomaasclient/entity/event"
	"github.com/canonical/gomaasclient/entity/node"
	gomaasapi "github.com/juju/gomaasapi/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/lab/maassim"
)

// machineAPI reaches machines/{id}/ through gomaasclient's generic
// sub-object facility, for ops its typed API lacks (set_storage_layout).
func machineAPI(c *client.Client, systemID string) client.APIClient {
	return c.Machine.(*client.Machine).APIClient.GetSubObject("machines").GetSubObject(systemID)
}

// TestGomaasclientLifecycle drives one machine through the whole GPUaaS
// onboarding and decommission path with the real gomaasclient.
func TestGomaasclientLifecycle(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var deployed []maassim.Deployed
	f := newFixture(t, func(o *maassim.Options) {
		o.OnDeployed = func(d maassim.Deployed) { mu.Lock(); deployed = append(deployed, d); mu.Unlock() }
	})
	c := f.client
	hw := maassim.DefaultHardware
	hw.Interfaces = []maassim.InterfaceSpec{{Name: "ens1f0np0", MAC: "52:54:00:00:00:02"}}
	require.NoError(t, f.sim.SetHardware("52:54:00:00:00:01", hw))

	v, err := c.Version.Get()
	require.NoError(t, err)
	assert.Equal(t, "3.4.2", v.Version)

	// Create: admin-created machines commission by default.
	m, err := c.Machines.Create(&entity.MachineCreateParams{
		Architecture: "amd64/generic", MACAddresses: []string{"52:54:00:00:00:01"},
		Hostname: "j22u15", PowerType: "ipmi",
	}, map[string]any{"power_parameters_power_address": "10.0.0.15", "power_parameters_power_user": "root",
		"power_parameters_power_pass": "calvin"})
	require.NoError(t, err)
	id := m.SystemID
	assert.Len(t, id, 6)
	assert.Equal(t, node.StatusCommissioning, m.Status)
	assert.Equal(t, "Commissioning", m.StatusName)
	assert.Equal(t, "j22u15", m.Hostname)
	require.Len(t, m.InterfaceSet, 1)
	assert.Equal(t, "52:54:00:00:00:01", m.InterfaceSet[0].MACAddress)

	pp, err := c.Machine.GetPowerParameters(id)
	require.NoError(t, err)
	assert.Equal(t, map[string]any{"power_address": "10.0.0.15", "power_user": "root", "power_pass": "calvin"}, pp)

	// Bulk power parameters: machines/?op=power_parameters&id=...
	var bulk map[string]map[string]string
	err = c.Machines.(*client.Machines).APIClient.GetSubObject("machines").Get("power_parameters",
		url.Values{"id": {id}}, func(b []byte) error { return json.Unmarshal(b, &bulk) })
	require.NoError(t, err)
	assert.Equal(t, "10.0.0.15", bulk[id]["power_address"])

	// Commissioning then testing, in virtual time.
	f.clock.Advance(maassim.DefaultDurations.Commissioning)
	f.requireStatus(t, id, maassim.StatusTesting)
	f.clock.Advance(maassim.DefaultDurations.Testing)
	f.requireStatus(t, id, maassim.StatusReady)

	// Lookups by hostname, MAC, status, id.
	for _, p := range []*entity.MachinesParams{
		{Hostname: []string{"j22u15"}}, {MACAddress: []string{"52-54-00-00-00-01"}},
		{Status: []string{"ready"}}, {ID: []string{id}},
	} {
		ms, err := c.Machines.Get(p)
		require.NoError(t, err)
		require.Len(t, ms, 1, "%+v", p)
		assert.Equal(t, id, ms[0].SystemID)
	}
	none, err := c.Machines.Get(&entity.MachinesParams{Hostname: []string{"nope"}})
	require.NoError(t, err)
	assert.Empty(t, none)

	// Tags.
	_, err = c.Tags.Create(&entity.TagParams{Name: "gpuaas-profile-slice-vm", Comment: "GPUaaS profile intent"})
	require.NoError(t, err)
	require.NoError(t, c.Tag.AddMachines("gpuaas-profile-slice-vm", []string{id}))
	tagged, err := c.Machines.Get(&entity.MachinesParams{Tags: []string{"gpuaas-profile-slice-vm"}})
	require.NoError(t, err)
	require.Len(t, tagged, 1)
	assert.Equal(t, []string{"gpuaas-profile-slice-vm"}, tagged[0].TagNames)
	byTag, err := c.Tag.GetMachines("gpuaas-profile-slice-vm")
	require.NoError(t, err)
	require.Len(t, byTag, 1)

	// Block devices: pick the BOSS device as boot disk, then flat layout with
	// root_device = its id.
	bds, err := c.BlockDevices.Get(id)
	require.NoError(t, err)
	require.Len(t, bds, 2)
	boss := bds[0]
	nvme := bds[1]
	assert.Equal(t, "Dell BOSS-N1", boss.Model)
	require.NoError(t, c.BlockDevice.SetBootDisk(id, nvme.ID))
	got, err := c.Machine.Get(id)
	require.NoError(t, err)
	assert.Equal(t, nvme.ID, got.BootDisk.ID)
	require.NoError(t, c.BlockDevice.SetBootDisk(id, boss.ID))
	var afterLayout entity.Machine
	err = machineAPI(c, id).Post("set_storage_layout", url.Values{
		"storage_layout": {"flat"}, "root_device": {strconv.Itoa(boss.ID)},
	}, func(b []byte) error { return json.Unmarshal(b, &afterLayout) })
	require.NoError(t, err)
	assert.Equal(t, boss.ID, afterLayout.BootDisk.ID)
	require.Len(t, afterLayout.BootDisk.Partitions, 2)
	assert.Equal(t, "/boot/efi", afterLayout.BootDisk.Partitions[0].FileSystem.MountPoint)
	assert.Equal(t, "/", afterLayout.BootDisk.Partitions[1].FileSystem.MountPoint)
	snap, _ := f.sim.Machine(id)
	assert.Equal(t, boss.ID, snap.RootDeviceID)
	assert.Equal(t, "flat", snap.StorageLayout)

	// Phase-2 RoCE address via link_subnet, verified by read-back.
	ifs, err := c.NetworkInterfaces.Get(id)
	require.NoError(t, err)
	require.Len(t, ifs, 2)
	require.Len(t, ifs[0].Links, 1)
	assert.Equal(t, "auto", ifs[0].Links[0].Mode)
	assert.Equal(t, "pxe", ifs[0].Links[0].Subnet.Name)
	assert.Equal(t, "ens1f0np0", ifs[1].Name)
	ni, err := c.NetworkInterface.LinkSubnet(id, ifs[1].ID, &entity.NetworkInterfaceLinkParams{
		Mode: "STATIC", Subnet: 2, IPAddress: "192.168.50.15",
	})
	require.NoError(t, err)
	require.Len(t, ni.Links, 1)
	assert.Equal(t, "192.168.50.15", ni.Links[0].IPAddress)
	assert.Equal(t, "192.168.50.0/24", ni.Links[0].Subnet.CIDR)
	back, err := c.NetworkInterface.Get(id, ifs[1].ID)
	require.NoError(t, err)
	assert.Equal(t, ni.Links, back.Links)
	// unlink + relink (what a correction of a wrong address looks like).
	un, err := c.NetworkInterface.UnlinkSubnet(id, ifs[1].ID, ni.Links[0].ID)
	require.NoError(t, err)
	assert.Empty(t, un.Links)
	ni, err = c.NetworkInterface.LinkSubnet(id, ifs[1].ID, &entity.NetworkInterfaceLinkParams{
		Mode: "STATIC", Subnet: 2, IPAddress: "192.168.50.15",
	})
	require.NoError(t, err)
	require.Len(t, ni.Links, 1, "relinked")
	assert.Equal(t, "192.168.50.15", ni.Links[0].IPAddress)
	subnets, err := c.Subnets.Get()
	require.NoError(t, err)
	require.Len(t, subnets, 2)
	assert.Equal(t, 50, subnets[1].VLAN.VID)
	sn, err := c.Subnet.Get(2)
	require.NoError(t, err)
	assert.Equal(t, "192.168.50.0/24", sn.CIDR)

	// Deploy with cloud-init user_data and hardware sync.
	userData := "#cloud-config\nruncmd:\n - [gpuaas-bootstrap, --token, s3cret-token]\n"
	dm, err := c.Machine.Deploy(id, &entity.MachineDeployParams{
		UserData: base64.StdEncoding.EncodeToString([]byte(userData)), DistroSeries: "noble", EnableHwSync: true,
	})
	require.NoError(t, err)
	assert.Equal(t, node.StatusDeploying, dm.Status)
	assert.Equal(t, "admin", dm.Owner)
	ps, err := c.Machine.GetPowerState(id)
	require.NoError(t, err)
	assert.Equal(t, "on", ps.State)
	f.clock.Advance(maassim.DefaultDurations.Deploy)
	f.requireStatus(t, id, maassim.StatusDeployed)
	mu.Lock()
	require.Len(t, deployed, 1)
	assert.Equal(t, userData, string(deployed[0].UserData))
	assert.Equal(t, "noble", deployed[0].DistroSeries)
	assert.Equal(t, []string{"10.10.0.2", "192.168.50.15"}, deployed[0].IPs, "auto IP claimed at deploy + RoCE")
	mu.Unlock()

	// Hardware sync fields appear after the first sync.
	f.clock.Advance(maassim.DefaultDurations.HwSyncDelay)
	dm, err = c.Machine.Get(id)
	require.NoError(t, err)
	assert.True(t, dm.EnableHwSync)
	assert.Equal(t, 15*60, dm.HwSyncInterval)
	assert.Equal(t, epoch.Add(maassim.DefaultDurations.Commissioning+maassim.DefaultDurations.Testing+
		maassim.DefaultDurations.Deploy+maassim.DefaultDurations.HwSyncDelay), time.Time(dm.HwLastSync))
	assert.Equal(t, time.Time(dm.HwLastSync).Add(15*time.Minute), time.Time(dm.HwNextSync))

	// Events: newest first, INFO by default; DEBUG includes status changes.
	evs, err := c.Events.Get(&entity.EventParams{ID: id})
	require.NoError(t, err)
	require.NotEmpty(t, evs.Events)
	assert.Equal(t, "Deployed", evs.Events[0].Type)
	for i := 1; i < len(evs.Events); i++ {
		assert.Greater(t, evs.Events[i-1].ID, evs.Events[i].ID)
		assert.NotEqual(t, event.DEBUG, evs.Events[i].Level)
	}
	dbg, err := c.Events.Get(&entity.EventParams{Hostname: "j22u15", Level: event.DEBUG, Limit: "1000"})
	require.NoError(t, err)
	var changes []string
	for _, e := range dbg.Events {
		if e.Type == "Node changed status" {
			assert.Equal(t, event.DEBUG, e.Level)
			changes = append([]string{e.Description}, changes...)
		}
	}
	assert.Equal(t, []string{
		"From 'New' to 'Commissioning'", "From 'Commissioning' to 'Testing'", "From 'Testing' to 'Ready'",
		"From 'Ready' to 'Allocated'", "From 'Allocated' to 'Deploying'", "From 'Deploying' to 'Deployed'",
	}, changes)

	// Power off / on of a deployed machine keeps it Deployed.
	_, err = c.Machine.PowerOff(id, &entity.MachinePowerOffParams{})
	require.NoError(t, err)
	ps, err = c.Machine.GetPowerState(id)
	require.NoError(t, err)
	assert.Equal(t, "off", ps.State)
	_, err = c.Machine.PowerOn(id, &entity.MachinePowerOnParams{})
	require.NoError(t, err)
	f.requireStatus(t, id, maassim.StatusDeployed)

	// Release with erase: Disk erasing -> Releasing -> Ready.
	rm, err := c.Machine.Release(id, &entity.MachineReleaseParams{Erase: true, QuickErase: true, Comment: "decommission"})
	require.NoError(t, err)
	assert.Equal(t, node.StatusDiskErasing, rm.Status)
	f.clock.Advance(maassim.DefaultDurations.QuickErase)
	f.requireStatus(t, id, maassim.StatusReleasing)
	f.clock.Advance(maassim.DefaultDurations.Release)
	f.requireStatus(t, id, maassim.StatusReady)
	_, err = c.Machine.PowerOff(id, &entity.MachinePowerOffParams{})
	require.NoError(t, err)

	// Update and delete.
	um, err := c.Machine.Update(id, &entity.MachineUpdateParams{Hostname: "j22u15-new"}, map[string]any{"power_parameters_power_address": "10.0.0.99"})
	require.NoError(t, err)
	assert.Equal(t, "j22u15-new", um.Hostname)
	pp, err = c.Machine.GetPowerParameters(id)
	require.NoError(t, err)
	assert.Equal(t, "10.0.0.99", pp["power_address"])
	require.NoError(t, c.Tag.RemoveMachines("gpuaas-profile-slice-vm", []string{id}))
	require.NoError(t, c.Machine.Delete(id))
	_, err = c.Machine.Get(id)
	se, ok := gomaasapi.GetServerError(err)
	require.True(t, ok, "%v", err)
	assert.Equal(t, 404, se.StatusCode)
	assert.Equal(t, "No Machine matches the given query.", se.BodyMessage)
}

func TestGomaasclientAbortBrokenFixed(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	c := f.client
	id := f.ready(t, "h1", "52:54:00:00:01:01")

	_, err := c.Machine.Deploy(id, &entity.MachineDeployParams{})
	require.NoError(t, err)
	am, err := c.Machine.Abort(id, "operator abort")
	require.NoError(t, err)
	assert.Equal(t, node.StatusAllocated, am.Status)
	f.clock.Advance(time.Hour) // the aborted deploy's timers must not fire
	f.requireStatus(t, id, maassim.StatusAllocated)

	bm, err := c.Machine.MarkBroken(id, "bad DIMM")
	require.NoError(t, err)
	assert.Equal(t, node.StatusBroken, bm.Status)
	assert.Empty(t, bm.Owner)
	fm, err := c.Machine.MarkFixed(id, "replaced")
	require.NoError(t, err)
	assert.Equal(t, node.StatusReady, fm.Status)

	_, err = c.Machine.MarkFixed(id, "")
	se, ok := gomaasapi.GetServerError(err)
	require.True(t, ok)
	assert.Equal(t, 409, se.StatusCode)
	assert.Equal(t, "Can't mark a non-broken node as 'Ready'.", se.BodyMessage)
}

// TestGomaasclientBootResourceUpload uploads images through gomaasclient's
// generic PostFiles (its BootResources.Create is "not implemented") and
// reads them back with the typed API.
func TestGomaasclientBootResourceUpload(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	api := f.client.BootResources.(*client.BootResources).APIClient.GetSubObject("boot-resources")
	content := []byte("a root filesystem tarball")
	sum := sha256.Sum256(content)
	var created entity.BootResource
	err := api.PostFiles("", url.Values{
		"name": {"custom/gpuaas-h200-host-ubuntu2404"}, "architecture": {"amd64/generic"},
		"filetype": {"tgz"}, "title": {"GPUaaS H200 host"}, "sha256": {hex.EncodeToString(sum[:])},
		"size": {strconv.Itoa(len(content))},
	}, map[string][]byte{"content": content}, func(b []byte) error { return json.Unmarshal(b, &created) })
	require.NoError(t, err)
	require.Len(t, created.Sets, 1)
	for _, set := range created.Sets {
		require.Contains(t, set.Files, "root-tgz")
		assert.Equal(t, hex.EncodeToString(sum[:]), set.Files["root-tgz"].SHA256)
	}
	err = api.PostFiles("", url.Values{"name": {"custom/disk-image"}, "architecture": {"amd64/generic"}, "filetype": {"ddgz"}},
		map[string][]byte{"content": []byte("gz disk")}, func([]byte) error { return nil })
	require.NoError(t, err)

	list, err := f.client.BootResources.Get(&entity.BootResourcesReadParams{})
	require.NoError(t, err)
	require.Len(t, list, 2)
	one, err := f.client.BootResource.Get(list[1].ID)
	require.NoError(t, err)
	for _, set := range one.Sets {
		assert.Contains(t, set.Files, "root-dd.gz")
	}
	snaps := f.sim.BootResources()
	assert.Equal(t, "tgz", snaps[0].FileType)
	assert.Equal(t, "ddgz", snaps[1].FileType)

	// A bad digest is a field error and stores nothing.
	err = api.PostFiles("", url.Values{"name": {"custom/x"}, "architecture": {"amd64/generic"}, "sha256": {"00"}},
		map[string][]byte{"content": content}, func([]byte) error { return nil })
	se, ok := gomaasapi.GetServerError(err)
	require.True(t, ok)
	assert.Equal(t, 400, se.StatusCode)
	assert.Contains(t, se.BodyMessage, `"sha256"`)
	assert.Len(t, f.sim.BootResources(), 2)

	// The uploaded image is deployable by name.
	id := f.ready(t, "h1", "52:54:00:00:02:01")
	dm, err := f.client.Machine.Deploy(id, &entity.MachineDeployParams{DistroSeries: "custom/gpuaas-h200-host-ubuntu2404"})
	require.NoError(t, err)
	assert.Equal(t, "custom", dm.OSystem)
	assert.Equal(t, "gpuaas-h200-host-ubuntu2404", dm.DistroSeries)
	f.clock.Advance(maassim.DefaultDurations.Deploy)
	f.requireStatus(t, id, maassim.StatusDeployed)

	// A dd image on the flat layout fails in curtin (seed 002).
	dd := f.ready(t, "h2", "52:54:00:00:02:02")
	_, err = f.client.Machine.Deploy(dd, &entity.MachineDeployParams{DistroSeries: "custom/disk-image"})
	require.NoError(t, err)
	f.clock.Advance(maassim.DefaultDurations.Deploy)
	f.requireStatus(t, dd, maassim.StatusFailedDeployment)
	assert.Contains(t, errorDescription(t, f, dd), "grub-install failed: ddgz image")
	require.NoError(t, f.client.BootResource.Delete(list[0].ID))
}

func TestGomaasclientDuplicateMAC(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.create(t, "a", "52:54:00:00:03:01")
	_, err := f.client.Machines.Create(&entity.MachineCreateParams{
		Architecture: "amd64/generic", MACAddresses: []string{"52:54:00:00:03:01"}, PowerType: "manual",
	}, nil)
	se, ok := gomaasapi.GetServerError(err)
	require.True(t, ok, "%v", err)
	assert.Equal(t, 400, se.StatusCode)
	assert.Equal(t, "application/json", se.Header.Get("Content-Type"))
	var fields map[string][]string
	require.NoError(t, json.Unmarshal([]byte(se.BodyMessage), &fields))
	assert.Equal(t, map[string][]string{"mac_addresses": {"MAC address 52:54:00:00:03:01 already in use on a."}}, fields)
	assert.Len(t, f.sim.Machines(), 1)
}
