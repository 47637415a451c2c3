package cli

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/api"
	"github.com/gpuaas/gpuaas/proto"
)

// TestCLIImagePushApproveList drives image push / approve / ls / show /
// revoke against a real coordinator and checks the stored blob.
func TestCLIImagePushApproveList(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t)
	data := make([]byte, 2<<20+11)
	_, err := rand.Read(data)
	require.NoError(t, err)
	sum := sha256.Sum256(data)
	digest := "sha256:" + hex.EncodeToString(sum[:])
	file := filepath.Join(t.TempDir(), "guest.raw")
	require.NoError(t, os.WriteFile(file, data, 0o644))

	r := c.run(api.RoleAdmin, "image", "push", file, "--name", "ubuntu-base", "--version", "24.04.1", "--kind", "slice_base", "--readiness-check", "base-ssh").ok(t)
	assert.Contains(t, r.err, digest)
	assert.Equal(t, "pending", field(t, r.out, "State"))
	assert.Equal(t, digest, field(t, r.out, "Digest"))
	require.True(t, c.srv.Blobs().Has(digest, int64(len(data))))
	stored, err := os.ReadFile(filepath.Join(c.srv.Blobs().Dir(), "sha256", proto.DigestHex(digest)))
	require.NoError(t, err)
	assert.True(t, bytes.Equal(data, stored))

	// Pushing the same file again is harmless.
	c.run(api.RoleAdmin, "image", "push", file, "--name", "ubuntu-base", "--version", "24.04.1", "--kind", "slice_base", "--readiness-check", "base-ssh").ok(t)

	// Usage mistakes exit 2; an operator may not push (exit 1, forbidden).
	assert.Equal(t, ExitUsage, c.run(api.RoleAdmin, "image", "push", file, "--name", "x", "--version", "1", "--kind", "qcow2").code)
	assert.Equal(t, ExitUsage, c.run(api.RoleAdmin, "image", "approve", "ubuntu-base").code)
	r = c.run(api.RoleOperator, "image", "push", file, "--name", "x", "--version", "1", "--kind", "slice_base")
	assert.Equal(t, ExitError, r.code)
	assert.Contains(t, r.err, "forbidden")

	r = c.run(api.RoleAdmin, "image", "approve", "ubuntu-base:24.04.1", "--note", "boot-tested", "--digest", digest).ok(t)
	assert.Equal(t, "approved", field(t, r.out, "State"))
	assert.Contains(t, field(t, r.out, "Decision"), "approved by admin-user")
	assert.Equal(t, "everywhere", field(t, r.out, "Approved for"))
	r = c.run(api.RoleAdmin, "image", "approve", "ubuntu-base:24.04.1", "--site", "nowhere")
	assert.Equal(t, ExitError, r.code)
	assert.Contains(t, r.err, "site nowhere not found")

	// A different file under the approved version is refused by the ledger.
	other := filepath.Join(t.TempDir(), "other.raw")
	require.NoError(t, os.WriteFile(other, data[:1000], 0o644))
	r = c.run(api.RoleAdmin, "image", "push", other, "--name", "ubuntu-base", "--version", "24.04.1", "--kind", "slice_base")
	assert.Equal(t, ExitError, r.code)
	assert.Contains(t, r.err, "illegal_transition")

	r = c.run(api.RoleViewer, "image", "ls").ok(t)
	requireAligned(t, r.out)
	assert.Contains(t, r.out, "ubuntu-base")
	assert.Contains(t, r.out, "approved")
	r = c.run(api.RoleViewer, "image", "show", "ubuntu-base:24.04.1").ok(t)
	assert.Equal(t, "base-ssh", field(t, r.out, "Readiness check"))

	// A slice with this image carries it to the agent; then revoke.
	c.run(api.RoleOperator, "alloc", "create", "--gpus", "1", "--region", "us-east", "--image", "ubuntu-base").ok(t)
	r = c.run(api.RoleAdmin, "image", "revoke", "ubuntu-base:24.04.1", "--note", "CVE").ok(t)
	assert.Equal(t, "revoked", field(t, r.out, "State"))
	r = c.run(api.RoleOperator, "alloc", "create", "--gpus", "1", "--region", "us-east", "--image", "ubuntu-base")
	assert.Equal(t, ExitError, r.code)
	assert.Contains(t, r.err, "no approved version")
}
