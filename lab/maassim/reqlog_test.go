package maassim_test

import (
	"encoding/base64"
	"encoding/json"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/canonical/gomaasclient/entity"
	"github.com/canonical/gomaasclient/entity/event"
	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/lab/maassim"
)

func TestRequestLogRedactsSecrets(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	id := f.ready(t, "secret", "52:54:00:00:40:01")
	ud := base64.StdEncoding.EncodeToString([]byte("#cloud-config\nbootstrap_token: tok-123\n"))
	_, err := f.client.Machine.Deploy(id, &entity.MachineDeployParams{UserData: ud, DistroSeries: "jammy"})
	require.NoError(t, err)

	creates := f.sim.Requests(func(r maassim.Request) bool { return r.Method == "POST" && r.Path == "/MAAS/api/2.0/machines/" })
	require.Len(t, creates, 1)
	got := creates[0].Params
	assert.Equal(t, maassim.Redacted, got.Get("power_parameters_power_pass"))
	assert.Equal(t, "10.0.0.9", got.Get("power_parameters_power_address"))
	assert.Equal(t, "secret", got.Get("hostname"))
	assert.Equal(t, id, creates[0].SystemID, "a create is logged against the machine it made")
	assert.Equal(t, 1, f.sim.Mutations(id, "create"))
	assert.Equal(t, 1, f.sim.Mutations(id, "commission"))
	assert.Equal(t, 0, f.sim.Mutations(id, "update"))

	deploys := f.sim.Requests(func(r maassim.Request) bool { return r.Op == "deploy" })
	require.Len(t, deploys, 1)
	d := deploys[0]
	if diff := cmp.Diff(url.Values{"user_data": {maassim.Redacted}, "distro_series": {"jammy"}}, d.Params); diff != "" {
		t.Errorf("deploy params (-want +got):\n%s", diff)
	}
	assert.Equal(t, "POST", d.Method)
	assert.Equal(t, id, d.SystemID)
	assert.Equal(t, 200, d.Status)
	assert.True(t, d.Applied)
	assert.Equal(t, f.clock.Now(), d.Time)
	// Nothing secret anywhere in the log.
	all, err := json.Marshal(f.sim.Requests(nil))
	require.NoError(t, err)
	for _, secret := range []string{"hunter2", ud, "tok-123", "simsecret"} {
		assert.NotContains(t, string(all), secret)
	}
	// The simulator itself keeps the decoded user-data for the lab.
	snap, _ := f.sim.Machine(id)
	assert.Equal(t, "#cloud-config\nbootstrap_token: tok-123\n", string(snap.UserData))
	// Reads are never "applied".
	for _, r := range f.sim.Requests(func(r maassim.Request) bool { return r.Method == "GET" }) {
		assert.False(t, r.Applied, r.Path)
	}
}

func TestEventsQuery(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	a := f.ready(t, "ev-a", "52:54:00:00:41:01")
	b := f.ready(t, "ev-b", "52:54:00:00:41:02")
	_, err := f.client.Machine.Deploy(a, &entity.MachineDeployParams{})
	require.NoError(t, err)
	f.clock.Advance(maassim.DefaultDurations.Deploy)

	all := f.sim.Events("")
	require.NotEmpty(t, all)
	// Filters by node and level; newest first; default level INFO.
	evs, err := f.client.Events.Get(&entity.EventParams{Hostname: "ev-b"})
	require.NoError(t, err)
	require.NotEmpty(t, evs.Events)
	for i, e := range evs.Events {
		assert.Equal(t, b, e.Node)
		assert.Contains(t, []event.LogLevel{event.INFO, event.WARNING, event.ERROR}, e.Level)
		if i > 0 {
			assert.Less(t, e.ID, evs.Events[i-1].ID)
		}
		_, err := time.Parse("Mon, 02 Jan. 2006 15:04:05", e.Created)
		assert.NoError(t, err, e.Created)
	}
	assert.Equal(t, len(evs.Events), evs.Count)

	// Paging: limit, then before= the oldest seen, then after=.
	p1, err := f.client.Events.Get(&entity.EventParams{ID: a, Level: event.DEBUG, Limit: "3"})
	require.NoError(t, err)
	require.Len(t, p1.Events, 3)
	oldest := p1.Events[2].ID
	assert.Contains(t, p1.PrevURI, "before="+strconv.Itoa(oldest))
	assert.Contains(t, p1.NextURI, "after="+strconv.Itoa(p1.Events[0].ID))
	p2, err := f.client.Events.Get(&entity.EventParams{ID: a, Level: event.DEBUG, Limit: "3", Before: strconv.Itoa(oldest)})
	require.NoError(t, err)
	require.Len(t, p2.Events, 3)
	assert.Less(t, p2.Events[0].ID, oldest)
	p3, err := f.client.Events.Get(&entity.EventParams{ID: a, Level: event.DEBUG, Limit: "2", After: strconv.Itoa(p2.Events[2].ID)})
	require.NoError(t, err)
	require.Len(t, p3.Events, 2)
	assert.Greater(t, p3.Events[1].ID, p2.Events[2].ID, "after= returns the oldest newer events")
	assert.Greater(t, p3.Events[0].ID, p3.Events[1].ID, "still newest first")

	for _, bad := range []url.Values{
		{"limit": {"1001"}}, {"level": {"LOUD"}}, {"after": {"1"}, "before": {"5"}}, {"limit": {"x"}},
	} {
		code, _, body := f.raw(t, "GET", "events/?op=query", bad)
		assert.Equal(t, 400, code, "%v: %s", bad, body)
	}
	code, _, body := f.raw(t, "GET", "events/?op=query", url.Values{"level": {"AUDIT"}})
	assert.Equal(t, 200, code)
	assert.Contains(t, body, `"count":0`)
}

func TestManualClock(t *testing.T) {
	t.Parallel()
	c := maassim.NewManualClock(epoch)
	var mu sync.Mutex
	var got []string
	rec := func(s string) func() { return func() { mu.Lock(); got = append(got, s); mu.Unlock() } }
	c.AfterFunc(3*time.Minute, rec("c"))
	c.AfterFunc(time.Minute, rec("a"))
	stop := c.AfterFunc(2*time.Minute, rec("never"))
	c.AfterFunc(2*time.Minute, func() {
		rec("b")()
		c.AfterFunc(30*time.Second, rec("b+30s")) // falls inside the same Advance
	})
	assert.True(t, stop.Stop())
	assert.False(t, stop.Stop())
	c.Advance(150 * time.Second)
	assert.Equal(t, []string{"a", "b", "b+30s"}, got)
	assert.Equal(t, epoch.Add(150*time.Second), c.Now())
	assert.Equal(t, 1, c.Pending())
	c.Advance(time.Hour)
	assert.Equal(t, []string{"a", "b", "b+30s", "c"}, got)
	assert.Equal(t, 0, c.Pending())
}

func TestScaledClock(t *testing.T) {
	t.Parallel()
	c := maassim.NewScaledClock(epoch, 60000) // a minute per millisecond
	done := make(chan time.Time, 1)
	start := time.Now()
	c.AfterFunc(10*time.Minute, func() { done <- c.Now() })
	select {
	case at := <-done:
		assert.Less(t, time.Since(start), time.Second)
		assert.False(t, at.Before(epoch.Add(10*time.Minute)))
	case <-time.After(5 * time.Second):
		t.Fatal("scaled timer did not fire")
	}
}

// TestScaledClockLifecycle runs a deploy on a fast real-time clock, the way
// the lab binary does.
func TestScaledClockLifecycle(t *testing.T) {
	t.Parallel()
	deployed := make(chan maassim.Deployed, 1)
	f := newFixture(t, func(o *maassim.Options) {
		o.Clock = maassim.NewScaledClock(epoch, 100000)
		o.OnDeployed = func(d maassim.Deployed) { deployed <- d }
	})
	id := f.create(t, "fast", "52:54:00:00:42:01")
	_, err := f.client.Machine.Commission(id, &entity.MachineCommissionParams{})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		s, _ := f.sim.Machine(id)
		return s.Status == maassim.StatusReady
	}, 5*time.Second, 5*time.Millisecond)
	_, err = f.client.Machine.Deploy(id, &entity.MachineDeployParams{UserData: base64.StdEncoding.EncodeToString([]byte("ud"))})
	require.NoError(t, err)
	select {
	case d := <-deployed:
		assert.Equal(t, id, d.SystemID)
		assert.Equal(t, "ud", string(d.UserData))
	case <-time.After(5 * time.Second):
		t.Fatal("no deployed hook")
	}
}

func TestLinkSubnetAndStorageValidation(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	id := f.ready(t, "val", "52:54:00:00:43:01")
	other := f.ready(t, "val2", "52:54:00:00:43:02")
	ifs, err := f.client.NetworkInterfaces.Get(id)
	require.NoError(t, err)
	ifPath := "nodes/" + id + "/interfaces/" + strconv.Itoa(ifs[0].ID) + "/?op=link_subnet"
	otherIfs, err := f.client.NetworkInterfaces.Get(other)
	require.NoError(t, err)
	code, _, body := f.raw(t, "POST", "nodes/"+other+"/interfaces/"+strconv.Itoa(otherIfs[0].ID)+"/?op=link_subnet",
		url.Values{"mode": {"static"}, "subnet": {"2"}, "ip_address": {"192.168.50.7"}})
	require.Equal(t, 200, code, body)

	cases := []struct {
		form  url.Values
		field string
	}{
		{url.Values{}, "mode"},
		{url.Values{"mode": {"bogus"}}, "mode"},
		{url.Values{"mode": {"static"}}, "subnet"},
		{url.Values{"mode": {"static"}, "subnet": {"99"}}, "subnet"},
		{url.Values{"mode": {"static"}, "subnet": {"2"}, "ip_address": {"10.9.9.9"}}, "ip_address"},
		{url.Values{"mode": {"static"}, "subnet": {"2"}, "ip_address": {"192.168.50.7"}}, "ip_address"},
		{url.Values{"mode": {"dhcp"}, "ip_address": {"192.168.50.8"}}, "ip_address"},
	}
	before, _ := f.sim.Machine(id)
	require.Len(t, before.Links, 1)
	assert.Equal(t, maassim.LinkSnapshot{Interface: "eth0", Mode: "auto", SubnetID: 1}, before.Links[0],
		"commissioning links the boot NIC to the PXE subnet in auto mode")
	for _, c := range cases {
		code, hdr, body := f.raw(t, "POST", ifPath, c.form)
		assert.Equal(t, 400, code, "%v: %s", c.form, body)
		assert.Equal(t, "application/json", hdr.Get("Content-Type"))
		var fields map[string][]string
		require.NoError(t, json.Unmarshal([]byte(body), &fields), body)
		assert.Contains(t, fields, c.field, "%v", c.form)
	}
	snap, _ := f.sim.Machine(id)
	assert.Equal(t, before.Links, snap.Links, "refused links change nothing")
	// static without an address allocates one; the gateway is skipped.
	code, _, body = f.raw(t, "POST", ifPath, url.Values{"mode": {"static"}, "subnet": {"pxe"}})
	require.Equal(t, 200, code, body)
	snap, _ = f.sim.Machine(id)
	require.Len(t, snap.Links, 2)
	assert.Equal(t, "10.10.0.2", snap.Links[1].IP)

	// Deployed machines refuse link changes.
	_, err = f.client.Machine.Deploy(id, &entity.MachineDeployParams{})
	require.NoError(t, err)
	f.clock.Advance(time.Hour)
	code, _, body = f.raw(t, "POST", ifPath, url.Values{"mode": {"dhcp"}})
	assert.Equal(t, 409, code)
	assert.Equal(t, "Cannot link interface because the machine is not New, Ready, Allocated, or Broken.", body)

	// Storage layout validation on a Ready machine.
	sl := "machines/" + other + "/?op=set_storage_layout"
	for _, c := range []struct {
		form  url.Values
		field string
	}{
		{url.Values{}, "storage_layout"},
		{url.Values{"storage_layout": {"zfs-magic"}}, "storage_layout"},
		{url.Values{"storage_layout": {"flat"}, "root_device": {"424242"}}, "root_device"},
		{url.Values{"storage_layout": {"flat"}, "root_size": {"lots"}}, "root_size"},
	} {
		code, _, body := f.raw(t, "POST", sl, c.form)
		assert.Equal(t, 400, code, body)
		assert.True(t, strings.HasPrefix(body, `{"`+c.field+`"`), body)
	}
	code, _, body = f.raw(t, "POST", sl, url.Values{"storage_layout": {"flat"}, "root_size": {"100G"}})
	require.Equal(t, 200, code, body)
	var m entity.Machine
	require.NoError(t, json.Unmarshal([]byte(body), &m))
	require.Len(t, m.BootDisk.Partitions, 2)
	assert.Equal(t, int64(100e9), m.BootDisk.Partitions[1].Size)
	code, _, body = f.raw(t, "POST", sl, url.Values{"storage_layout": {"bcache"}})
	assert.Equal(t, 400, code)
	assert.Contains(t, body, "Failed to configure storage layout 'bcache'")
}

type logLine struct {
	Method, Kind string
	Status       int
	Applied      bool
}

// TestRequestLogTranscript drives an onboarding through gomaasclient and
// compares the whole request log with the expected transcript.
func TestRequestLogTranscript(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	c := f.client
	no := false
	m, err := c.Machines.Create(&entity.MachineCreateParams{Architecture: "amd64/generic",
		MACAddresses: []string{"52:54:00:00:44:01"}, Commission: &no}, nil)
	require.NoError(t, err)
	id := m.SystemID
	_, err = c.Machines.Get(&entity.MachinesParams{MACAddress: []string{"52:54:00:00:44:01"}})
	require.NoError(t, err)
	_, err = c.Machine.Commission(id, &entity.MachineCommissionParams{})
	require.NoError(t, err)
	f.clock.Advance(time.Hour)
	_, err = c.Machine.Deploy(id, &entity.MachineDeployParams{})
	require.NoError(t, err)
	_, err = c.Machine.Deploy(id, &entity.MachineDeployParams{}) // second deploy: Deploying -> refused
	require.Error(t, err)
	_, err = c.Machine.Get(id)
	require.NoError(t, err)

	var got []logLine
	for _, r := range f.sim.Requests(nil) {
		got = append(got, logLine{r.Method, r.Kind(), r.Status, r.Applied})
	}
	want := []logLine{
		{"POST", "create", 200, true},
		{"GET", "read", 200, false},
		{"POST", "commission", 200, true},
		{"POST", "deploy", 200, true},
		{"POST", "deploy", 409, false},
		{"GET", "read", 200, false},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("request log (-want +got):\n%s", diff)
	}
}

// TestMultipartForm: MAAS accepts multipart bodies for any op.
func TestMultipartForm(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	id := f.ready(t, "mp", "52:54:00:00:45:01")
	api := machineAPI(f.client, id)
	err := api.PostFiles("set_storage_layout", url.Values{"storage_layout": {"blank"}},
		map[string][]byte{"unused": []byte("x")}, func([]byte) error { return nil })
	require.NoError(t, err)
	snap, _ := f.sim.Machine(id)
	assert.Equal(t, "blank", snap.StorageLayout)
	assert.Zero(t, snap.RootDeviceID)
	r := f.sim.Requests(func(r maassim.Request) bool { return r.Op == "set_storage_layout" })
	require.Len(t, r, 1)
	assert.Equal(t, "<file 1 bytes>", r[0].Params.Get("unused"))
}
