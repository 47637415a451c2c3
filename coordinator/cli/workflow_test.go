package cli

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/api"
	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/proto/prototest"
)

func TestCLIWorkflowTimeline(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	at := time.Now().UTC()
	for _, p := range []string{"pool-slice", "pool-bm"} {
		_, _, err := c.srv.Apply(ctx, proto.PoolUpsertType, proto.PoolUpsertRequest{At: at, Pool: proto.Pool{Name: p, Region: "us-east"}})
		require.NoError(t, err)
	}
	site := prototest.Site()
	site.Region = "us-east"
	// This coordinator has no site key: the workflow cannot reach MAAS,
	// which is fine for reading its record.
	site.Credentials = &proto.SealedSecret{KeyID: "k", Nonce: make([]byte, 12), Ciphertext: make([]byte, 32)}
	_, _, err := c.srv.Apply(ctx, proto.SiteUpsertType, proto.SiteUpsertRequest{At: at, Site: site})
	require.NoError(t, err)
	_, _, err = c.srv.Apply(ctx, proto.SiteProfileUpsertType, proto.SiteProfileUpsertRequest{At: at, Profile: prototest.SiteProfile()})
	require.NoError(t, err)

	out := c.run(api.RoleAdmin, "site", "onboard", "site-a", "--profile", "slice", "--hostname", "j22u15",
		"--mac", "52:54:00:00:00:15", "--bmc", "10.0.0.15").ok(t).out
	assert.Equal(t, "onboard.site-a.j22u15", field(t, out, "ID"))
	assert.Equal(t, "site-a/slice", field(t, out, "Site/profile"))

	out = c.run(api.RoleViewer, "workflow", "show", "onboard.site-a.j22u15").ok(t).out
	for _, b := range proto.TimelineBuckets {
		assert.Contains(t, out, string(b), "every bucket is listed")
	}
	assert.Contains(t, out, "TOTAL")
	list := c.run(api.RoleViewer, "workflow", "list", "--site", "site-a").ok(t).out
	requireAligned(t, list)
	assert.Contains(t, list, "onboard.site-a.j22u15")
	r := c.run(api.RoleViewer, "workflow", "show", "onboard.site-a.nope")
	assert.Equal(t, ExitError, r.code)
	assert.True(t, strings.Contains(r.err, "not_found"), r.err)
	r = c.run(api.RoleViewer, "site", "onboard", "site-a", "--profile", "slice", "--hostname", "x", "--mac", "52:54:00:00:00:16")
	assert.Equal(t, ExitError, r.code, "viewers cannot onboard")
}
