package daemon

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/pki"
	"github.com/gpuaas/gpuaas/proto"
)

// TestAgentFollowsCARotation: the agent binary's logic through a cluster
// CA rotation against a real coordinator. The heartbeat brings the bundle
// with the new CA (kept in the state directory); once the new CA is
// activated the agent renews its certificate at once and verifies the
// coordinator's re-issued certificate; after the old CA is retired its
// heartbeats keep working, and a restarted agent trusts the kept bundle
// rather than its (old) CA file.
func TestAgentFollowsCARotation(t *testing.T) {
	c := startCoord(t, "j22u15")
	base, state := hostBase(t, "j22u15"), t.TempDir()
	cfg := agentConfig(t, c, "j22u15", base, state, c.mint("j22u15", 0))
	r := startAgent(t, cfg)
	require.Eventually(t, func() bool { return r.d.client.Certificate() != nil }, 10*time.Second, 50*time.Millisecond)
	oldCA := c.ca

	var staged proto.CARecord
	code, body := c.do(http.MethodPost, "/v1/operator/ca/rotate", c.admin, struct{}{}, &staged)
	require.Equal(t, http.StatusCreated, code, body)
	newCA, err := pki.ParseCertPEM([]byte(staged.CertPEM))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return r.d.caBundleVersion() != "" }, 15*time.Second, 50*time.Millisecond, "the heartbeat brings the bundle")
	kept, err := loadCABundle(state)
	require.NoError(t, err)
	require.NotNil(t, kept)
	certs, err := pki.ParseCertsPEM([]byte(kept.PEM))
	require.NoError(t, err)
	assert.Len(t, certs, 2, "old and new CA")
	assert.True(t, pki.SignedBy(r.d.client.Certificate().Leaf, oldCA.Cert), "nothing renewed before activation")

	// The test's client trusts both from now on (the coordinator re-issues
	// its certificate from the new CA on activation).
	both, err := pki.PoolFromPEM([]byte(kept.PEM))
	require.NoError(t, err)
	c.hc = &http.Client{Transport: &http.Transport{TLSClientConfig: pki.ClientConfig(both, nil)}}
	require.Eventually(t, func() bool {
		code, _ := c.do(http.MethodPost, "/v1/operator/ca/activate", c.admin, proto.CAActionRequest{}, nil)
		return code == http.StatusOK
	}, 15*time.Second, 100*time.Millisecond)
	require.Eventually(t, func() bool { return pki.SignedBy(r.d.client.Certificate().Leaf, newCA) }, 15*time.Second, 50*time.Millisecond,
		"the agent renews from the new CA")

	require.Eventually(t, func() bool {
		code, _ := c.do(http.MethodPost, "/v1/operator/ca/retire", c.admin, proto.CAActionRequest{}, nil)
		return code == http.StatusOK
	}, 15*time.Second, 100*time.Millisecond)
	require.Eventually(t, func() bool {
		b, err := loadCABundle(state)
		if err != nil || b == nil {
			return false
		}
		certs, err := pki.ParseCertsPEM([]byte(b.PEM))
		return err == nil && len(certs) == 1 && pki.ID(certs[0]) == staged.ID
	}, 15*time.Second, 50*time.Millisecond, "the kept bundle holds the new CA only")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = r.d.client.Heartbeat(ctx, proto.HeartbeatRequest{CABundleVersion: r.d.caBundleVersion()})
	require.NoError(t, err, "heartbeats after the retirement")

	// An agent still holding a certificate of the retired CA (down through
	// the rotation) does not present it and renews with its credential.
	key, csr, err := pki.NewNodeKey("j22u15")
	require.NoError(t, err)
	stalePEM, _, err := oldCA.SignNodeCSR(csr, "j22u15", time.Now(), time.Hour)
	require.NoError(t, err)
	stale, err := pki.KeyPair(stalePEM, key)
	require.NoError(t, err)
	r.d.client.SetCertificate(&stale)
	require.NoError(t, r.d.renewCertNow(ctx))
	assert.True(t, pki.SignedBy(r.d.client.Certificate().Leaf, newCA))

	// A restarted agent trusts the kept bundle, not its CA file (the old CA).
	r.stop()
	cfg.BootstrapToken = ""
	d2, err := New(cfg, r.d.log)
	require.NoError(t, err)
	require.NoError(t, d2.setupTLS())
	assert.Equal(t, r.d.caBundleVersion(), d2.caBundleVersion())
	if _, err = d2.client.Heartbeat(ctx, proto.HeartbeatRequest{}); err != nil {
		// (the fresh daemon may not have loaded its credential yet; the
		// TLS handshake with the re-issued certificate must pass)
		assert.NotContains(t, err.Error(), "certificate")
	}
	_, err = os.Stat(filepath.Join(state, CABundleFile))
	require.NoError(t, err)
}
