package maassim_test

import (
	"net/url"
	"testing"

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
	_ = maassim.StatusNew
}
