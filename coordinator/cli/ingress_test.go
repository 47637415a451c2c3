package cli

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/api"
	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/proto/prototest"
)

// TestCLIIngress drives site ingress and alloc ingress add / list / rm,
// and alloc create --ingress, against a real coordinator.
func TestCLIIngress(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t)
	s := prototest.Site()
	s.Region, s.Profiles = "us-east", map[string]string{"slice": "us-east-pool"}
	s.Credentials = &proto.SealedSecret{KeyID: "k1", Nonce: make([]byte, 12), Ciphertext: make([]byte, 48)}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, _, err := c.srv.Apply(ctx, proto.SiteUpsertType, proto.SiteUpsertRequest{At: time.Now().UTC(), Site: s})
	require.NoError(t, err)

	// Without the declaration: refused with the reason.
	r := c.run(api.RoleOperator, "alloc", "create", "--gpus", "1", "--region", "us-east", "--ingress", "tcp/22")
	assert.Equal(t, ExitError, r.code)
	assert.Contains(t, r.err, "public ingress is disabled at site site-a")
	assert.Equal(t, ExitUsage, c.run(api.RoleOperator, "alloc", "create", "--gpus", "1", "--region", "us-east", "--ingress", "tcp:22").code)

	// Declare it (admin only; bad flags are usage errors).
	assert.Equal(t, ExitUsage, c.run(api.RoleAdmin, "site", "ingress", "site-a", "--address", "not-an-ip", "--allow", "22").code)
	assert.Equal(t, ExitUsage, c.run(api.RoleAdmin, "site", "ingress", "site-a", "--address", "203.0.113.10", "--allow", "22-x").code)
	assert.Equal(t, ExitError, c.run(api.RoleOperator, "site", "ingress", "site-a", "--address", "203.0.113.10", "--allow", "22").code)
	r = c.run(api.RoleAdmin, "site", "ingress", "site-a", "--address", "203.0.113.10", "--public-ports", "40000-40009", "--allow", "22", "--allow", "8000-8999", "--quota", "3").ok(t)
	requireAligned(t, r.out)
	assert.Equal(t, "203.0.113.10", field(t, r.out, "Addresses"))
	assert.Equal(t, "40000-40009", field(t, r.out, "Public ports"))
	// With no flag of its own it shows the declaration (a viewer may),
	// and changes nothing.
	before := ledgerIndex(c.srv.Store().Snapshot())
	r = c.run(api.RoleViewer, "site", "ingress", "site-a").ok(t)
	assert.Equal(t, "203.0.113.10", field(t, r.out, "Addresses"))
	assert.Equal(t, "40000-40009", field(t, r.out, "Public ports"))
	r = c.run(api.RoleViewer, "-o", "json", "site", "ingress", "site-a").ok(t)
	assert.Contains(t, r.out, `"public_ports"`)
	assert.Equal(t, before, ledgerIndex(c.srv.Store().Snapshot()))

	r = c.run(api.RoleOperator, "alloc", "create", "--gpus", "1", "--region", "us-east", "--ingress", "tcp/22").ok(t)
	assert.Equal(t, "203.0.113.10:40000 -> tcp/22 (pending)", field(t, r.out, "Ingress"))
	id := field(t, r.out, "ID")

	r = c.run(api.RoleOperator, "alloc", "ingress", "add", id, "tcp/8888").ok(t)
	requireAligned(t, r.out)
	assert.Contains(t, r.out, "203.0.113.10:40001")
	assert.Equal(t, ExitUsage, c.run(api.RoleOperator, "alloc", "ingress", "add", id).code)
	assert.Equal(t, ExitUsage, c.run(api.RoleOperator, "alloc", "ingress", "add", id, "icmp/1").code)
	r = c.run(api.RoleOperator, "alloc", "ingress", "add", id, "tcp/80")
	assert.Equal(t, ExitError, r.code)
	assert.Contains(t, r.err, "port 80 is not allowed")

	r = c.run(api.RoleViewer, "alloc", "ingress", "list", id).ok(t)
	assert.Contains(t, r.out, "tcp/22")
	assert.Contains(t, r.out, "tcp/8888")
	r = c.run(api.RoleOperator, "alloc", "ingress", "rm", id, "tcp/22").ok(t)
	assert.NotContains(t, r.out, "tcp/22 ")
	r = c.run(api.RoleOperator, "alloc", "ingress", "rm", id, "tcp/22")
	assert.Equal(t, ExitError, r.code)
	r = c.run(api.RoleOperator, "-o", "json", "alloc", "ingress", "list", id).ok(t)
	assert.Contains(t, r.out, `"public_port": 40001`)

	// Withdrawing the declaration is refused while a route is live.
	r = c.run(api.RoleAdmin, "site", "ingress", "site-a", "--disable")
	assert.Equal(t, ExitError, r.code)
	assert.Contains(t, r.err, "remove its ingress first")
	c.run(api.RoleOperator, "alloc", "ingress", "rm", id, "tcp/8888").ok(t)
	r = c.run(api.RoleAdmin, "site", "ingress", "site-a", "--disable").ok(t)
	assert.Contains(t, field(t, r.out, "Public ingress"), "disabled")
}
