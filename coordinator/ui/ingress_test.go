package ui

import (
	"context"
	"net/http"
	"net/url"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/api"
	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/proto/prototest"
)

// TestWizardPublicIngress: the network step shows public ingress
// disabled with the reason while no site of the region declares public
// addressing, and offers it (with the allowed ports) once one does; the
// review names the rules and the created slice carries them.
func TestWizardPublicIngress(t *testing.T) {
	c := newCoord(t, 1)
	op := c.user(api.RoleOperator)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s := prototest.Site()
	s.Region, s.Profiles = "us-east", map[string]string{"slice": "us-east-pool"}
	s.Credentials = &proto.SealedSecret{KeyID: "k1", Nonce: make([]byte, 12), Ciphertext: make([]byte, 48)}
	_, _, err := c.srv.Apply(ctx, proto.SiteUpsertType, proto.SiteUpsertRequest{At: time.Now().UTC(), Site: s})
	require.NoError(t, err)

	status, body, _ := op.get("/ui/launch")
	require.Equal(t, http.StatusOK, status)
	assert.Regexp(t, `class="choice disabled" id="net-public"><input type="radio" name="network" value="public" disabled> Public ingress <span class="why">site site-a declares no public addressing`, body)

	_, _, err = c.srv.Apply(ctx, proto.SiteIngressSetType, proto.SiteIngressSetRequest{At: time.Now().UTC(), Site: "site-a", Ingress: &proto.SiteIngress{
		Addresses: []string{"203.0.113.10"}, Protocols: []string{"tcp"}, AllowedPorts: []proto.PortRange{{First: 22, Last: 22}}, QuotaPerTenant: 2}})
	require.NoError(t, err)
	status, body, _ = op.get("/ui/launch")
	require.Equal(t, http.StatusOK, status)
	assert.Regexp(t, `class="choice" id="net-public"><input type="radio" name="network" value="public" >`, body)
	assert.Contains(t, body, "tcp ports 22, up to 2 per tenant")

	form := url.Values{"csrf": {op.csrf}, "region": {"us-east"}, "shape": {"slice-1"}, "network": {"public"}, "ingress": {"tcp:22"}}
	status, body, _ = op.post("/ui/launch/review", form)
	assert.Equal(t, http.StatusBadRequest, status)
	assert.Contains(t, body, "want PROTOCOL/PORT")
	form.Set("ingress", "tcp/22")
	status, body, _ = op.post("/ui/launch/review", form)
	require.Equal(t, http.StatusOK, status, body)
	assert.Contains(t, body, "public ingress tcp/22")
	key := regexp.MustCompile(`name="idempotency_key" value="([^"]+)"`).FindStringSubmatch(body)
	require.NotNil(t, key)
	form.Set("idempotency_key", key[1])
	status, _, _ = op.post("/ui/launch/create", form)
	require.Equal(t, http.StatusSeeOther, status)
	allocs := c.srv.Store().Snapshot().Allocations(stateFilter())
	require.Len(t, allocs, 1)
	require.Len(t, allocs[0].Ingress, 1)
	assert.Equal(t, "203.0.113.10:22", allocs[0].Ingress[0].Public())
}
