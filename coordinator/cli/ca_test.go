package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/api"
	"github.com/gpuaas/gpuaas/coordinator/pki"
	"github.com/gpuaas/gpuaas/proto"
)

// TestCLICARotation: gpuaasctl ca status, rotate, bundle, activate and
// retire against a real server, admin only, with clear usage errors.
func TestCLICARotation(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t)
	first := pki.ID(c.ca.Cert)

	r := c.run(api.RoleAdmin, "ca", "status").ok(t)
	assert.Contains(t, r.out, first)
	assert.Equal(t, first, field(t, r.out, "Active"))
	r = c.run(api.RoleOperator, "ca", "status")
	assert.Equal(t, ExitError, r.code, "admin only")

	// ca bundle --out replaces the file only once the bundle was read:
	// a refused read leaves it as it was.
	out := filepath.Join(t.TempDir(), "ca-bundle.pem")
	require.NoError(t, os.WriteFile(out, []byte("kept"), 0o644))
	r = c.run(api.RoleOperator, "ca", "bundle", "--out", out)
	assert.Equal(t, ExitError, r.code)
	b, err := os.ReadFile(out)
	require.NoError(t, err)
	assert.Equal(t, "kept", string(b), "a failed read never empties the file")
	c.run(api.RoleAdmin, "ca", "bundle", "--out", out).ok(t)
	b, err = os.ReadFile(out)
	require.NoError(t, err)
	certs, err := pki.ParseCertsPEM(b)
	require.NoError(t, err)
	require.Len(t, certs, 1)
	assert.Equal(t, first, pki.ID(certs[0]))

	r = c.run(api.RoleAdmin, "-o", "json", "ca", "rotate").ok(t)
	var staged proto.CARecord
	require.NoError(t, json.Unmarshal([]byte(r.out), &staged), r.out)
	assert.Equal(t, proto.CAStaged, staged.State)
	assert.Empty(t, staged.KeyPEM)
	r = c.run(api.RoleAdmin, "ca", "rotate")
	assert.Equal(t, ExitError, r.code)
	assert.Contains(t, r.err, "staged already")

	// The bundle holds both CAs once the server follows the table.
	require.Eventually(t, func() bool {
		r = c.run(api.RoleAdmin, "ca", "bundle").ok(t)
		certs, err := pki.ParseCertsPEM([]byte(r.out))
		return err == nil && len(certs) == 2
	}, 10*time.Second, 100*time.Millisecond)

	assert.Equal(t, ExitUsage, c.run(api.RoleAdmin, "ca", "activate", "not-an-id").code)
	assert.Equal(t, ExitUsage, c.run(api.RoleAdmin, "ca", "activate", "a", "b").code)
	r = c.run(api.RoleAdmin, "ca", "retire", "00000000000000ff")
	assert.Equal(t, ExitError, r.code)
	assert.Contains(t, r.err, "not in the rotation table")

	r = c.run(api.RoleAdmin, "ca", "activate").ok(t)
	assert.Contains(t, r.out, staged.ID)
	assert.Contains(t, r.out, "active")
	r = c.run(api.RoleAdmin, "ca", "retire").ok(t)
	assert.Contains(t, r.out, first)
	assert.Contains(t, r.out, "retired")

	require.Eventually(t, func() bool {
		r = c.run(api.RoleAdmin, "-o", "json", "ca", "status").ok(t)
		var st proto.CAStatus
		require.NoError(t, json.Unmarshal([]byte(r.out), &st))
		certs, err := pki.ParseCertsPEM([]byte(st.BundlePEM))
		return st.Active == staged.ID && err == nil && len(certs) == 1 && pki.ID(certs[0]) == staged.ID
	}, 10*time.Second, 100*time.Millisecond, "the bundle holds the new CA only")
	assert.False(t, strings.Contains(r.out, "PRIVATE KEY"), "no key is ever returned")

	// The three steps are audited.
	r = c.run(api.RoleAdmin, "-o", "json", "audit", "list").ok(t)
	var l proto.List[proto.AuditRecord]
	require.NoError(t, json.Unmarshal([]byte(r.out), &l))
	var routes []string
	for _, rec := range l.Items {
		if strings.HasPrefix(rec.Route, "/v1/operator/ca/") && rec.Status < 300 {
			routes = append(routes, rec.Route)
		}
	}
	assert.Equal(t, []string{"/v1/operator/ca/rotate", "/v1/operator/ca/activate", "/v1/operator/ca/retire"}, routes)
}
