package cli

import (
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/api"
)

// A rotation through gpuaasctl: generate, install, use, remove, list;
// usage mistakes exit 2, a refused step exits 1 and names why.
func TestCLIGossipKeyRotation(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t)
	gen := func() string {
		r := runEnv(nil, "operator", "gossip-key", "generate").ok(t)
		return strings.TrimSpace(r.out)
	}
	old, next := gen(), gen()
	require.NotEqual(t, old, next)

	r := c.run(api.RoleAdmin, "operator", "gossip-key", "install", "not-a-key")
	assert.Equal(t, ExitUsage, r.code, r.err)
	r = c.run(api.RoleOperator, "operator", "gossip-key", "list")
	assert.Equal(t, ExitError, r.code)
	assert.Contains(t, r.err, "forbidden")

	c.run(api.RoleAdmin, "operator", "gossip-key", "install", old).ok(t)
	c.run(api.RoleAdmin, "operator", "gossip-key", "install", next).ok(t)
	r = c.run(api.RoleAdmin, "operator", "gossip-key", "remove", old)
	assert.Equal(t, ExitError, r.code)
	assert.Contains(t, r.err, "primary")
	r = c.run(api.RoleAdmin, "operator", "gossip-key", "use", next).ok(t)
	assert.Regexp(t, regexp.QuoteMeta(next)+`\s+[0-9a-f]{8}\s+yes`, r.out)
	c.run(api.RoleAdmin, "operator", "gossip-key", "remove", "--force", old).ok(t)
	r = c.run(api.RoleAdmin, "operator", "gossip-key", "use", "--force", next).ok(t)
	r = c.run(api.RoleAdmin, "operator", "gossip-key", "list").ok(t)
	assert.NotContains(t, r.out, old)
	assert.Contains(t, r.out, next)
	assert.Equal(t, "4", field(t, r.out, "Version"))
}
