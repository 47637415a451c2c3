package maassim_test

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/canonical/gomaasclient/entity"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/lab/maassim"
)

func TestTagsAndListFilters(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	a := f.create(t, "fa", "52:54:00:00:60:01")
	b := f.create(t, "fb", "52:54:00:00:60:02")
	for _, n := range []string{"gpu", "roce"} {
		_, err := f.client.Tags.Create(&entity.TagParams{Name: n})
		require.NoError(t, err)
	}
	_, err := f.client.Tags.Create(&entity.TagParams{Name: "gpu"})
	se := serverError(t, err)
	assert.Equal(t, 400, se.StatusCode)
	assert.JSONEq(t, `{"name":["Tag with this Name already exists."]}`, se.BodyMessage)
	_, err = f.client.Tags.Create(&entity.TagParams{Name: "bad name"})
	assert.Equal(t, 400, serverError(t, err).StatusCode)

	require.NoError(t, f.client.Tag.AddMachines("gpu", []string{a, b, "unknown"}))
	require.NoError(t, f.client.Tag.AddMachines("roce", []string{a}))
	code, _, body := f.raw(t, "POST", "tags/gpu/?op=update_nodes", url.Values{"add": {a}, "remove": {b}})
	require.Equal(t, 200, code)
	assert.JSONEq(t, `{"added":0,"removed":1}`, body)

	ids := func(p *entity.MachinesParams) []string {
		ms, err := f.client.Machines.Get(p)
		require.NoError(t, err)
		var out []string
		for _, m := range ms {
			out = append(out, m.SystemID)
		}
		return out
	}
	assert.Equal(t, []string{a}, ids(&entity.MachinesParams{Tags: []string{"gpu", "roce"}}), "tags AND")
	assert.Equal(t, []string{b}, ids(&entity.MachinesParams{NotTags: []string{"gpu"}}))
	assert.Equal(t, []string{a, b}, ids(&entity.MachinesParams{Hostname: []string{"fa", "fb"}}), "hostnames OR")
	assert.Empty(t, ids(&entity.MachinesParams{Hostname: []string{"fa"}, Status: []string{"ready"}}))
	assert.Equal(t, []string{a, b}, ids(&entity.MachinesParams{Status: []string{"new"}}))
	code, _, body = f.raw(t, "GET", "machines/", url.Values{"status": {"sleepy"}})
	assert.Equal(t, 400, code)
	assert.Contains(t, body, `"status"`)

	// Deleting a tag untags machines.
	require.NoError(t, f.client.Tag.Delete("roce"))
	snap, _ := f.sim.Machine(a)
	assert.Equal(t, []string{"gpu"}, snap.Tags)
	tags, err := f.client.Tags.Get()
	require.NoError(t, err)
	require.Len(t, tags, 1)

	// Renaming onto an existing hostname is a field error.
	_, err = f.client.Machine.Update(b, &entity.MachineUpdateParams{Hostname: "fa"}, nil)
	assert.JSONEq(t, `{"hostname":["Node with this Hostname already exists."]}`, serverError(t, err).BodyMessage)
}

// TestEnlistAndAutoIP: an enlisted machine appears in New without an API
// call (auto_claim_single_new_machine finds it by status); its boot NIC's
// auto address is claimed at deploy and given back at release.
func TestEnlistAndAutoIP(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	body := `{"Hostname":"j27u15","MACs":["52:54:00:00:61:01"],"PowerParams":{"power_address":"10.0.0.27"}}`
	resp, err := http.Post(f.ts.URL+"/_sim/enlist", "application/json", strings.NewReader(body))
	require.NoError(t, err)
	var out map[string]string
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
	resp.Body.Close()
	id := out["system_id"]
	require.NotEmpty(t, id)
	_, err = f.sim.Enlist(maassim.Enlistment{MACs: []string{"52:54:00:00:61:01"}})
	assert.Error(t, err, "duplicate MAC")
	_, err = f.sim.Enlist(maassim.Enlistment{})
	assert.Error(t, err, "no MAC")
	assert.Empty(t, f.sim.Requests(nil), "enlistment is not an API request")

	news, err := f.client.Machines.Get(&entity.MachinesParams{Status: []string{"new"}})
	require.NoError(t, err)
	require.Len(t, news, 1)
	assert.Equal(t, "j27u15", news[0].Hostname)
	pp, err := f.client.Machine.GetPowerParameters(id)
	require.NoError(t, err)
	assert.Equal(t, "10.0.0.27", pp["power_address"])

	_, err = f.client.Machine.Commission(id, &entity.MachineCommissionParams{})
	require.NoError(t, err)
	f.clock.Advance(time.Hour)
	_, err = f.client.Machine.Deploy(id, &entity.MachineDeployParams{})
	require.NoError(t, err)
	m, err := f.client.Machine.Get(id)
	require.NoError(t, err)
	require.Len(t, m.IPAddresses, 1)
	assert.Equal(t, "10.10.0.2", m.IPAddresses[0].String())
	f.clock.Advance(time.Hour)
	_, err = f.client.Machine.Release(id, &entity.MachineReleaseParams{})
	require.NoError(t, err)
	f.clock.Advance(time.Hour)
	m, err = f.client.Machine.Get(id)
	require.NoError(t, err)
	assert.Empty(t, m.IPAddresses)
	assert.Equal(t, "Released", m.StatusMessage)
}

// TestStaticIPExhaustion: a full subnet is MAAS's 503 without Retry-After
// (not retryable by gomaasapi), and nothing is linked.
func TestStaticIPExhaustion(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(o *maassim.Options) {
		o.Subnets = append(o.Subnets, maassim.Subnet{ID: 3, Name: "tiny", CIDR: "172.16.0.0/30", GatewayIP: "172.16.0.1"})
	})
	a := f.ready(t, "ip-a", "52:54:00:00:62:01")
	b := f.ready(t, "ip-b", "52:54:00:00:62:02")
	link := func(id string) (int, http.Header, string) {
		ifs, err := f.client.NetworkInterfaces.Get(id)
		require.NoError(t, err)
		return f.raw(t, "POST", "nodes/"+id+"/interfaces/"+strconv.Itoa(ifs[0].ID)+"/?op=link_subnet",
			url.Values{"mode": {"static"}, "subnet": {"3"}})
	}
	code, _, body := link(a)
	require.Equal(t, 200, code, body)
	code, hdr, body := link(b)
	assert.Equal(t, 503, code)
	assert.Equal(t, "No more IPs available in subnet: 172.16.0.0/30.", body)
	assert.Empty(t, hdr.Get("Retry-After"))
	snap, _ := f.sim.Machine(b)
	for _, l := range snap.Links {
		assert.NotEqual(t, 3, l.SubnetID)
	}
}
