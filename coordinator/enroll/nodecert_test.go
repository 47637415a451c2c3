package enroll

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
)

func TestNodeCertRevocationList(t *testing.T) {
	at := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	tab := New()
	require.NoError(t, tab.Mint(proto.BootstrapTokenMintRequest{At: at, NodeID: "a", TokenHash: Hash("tok"), ExpiresAt: at.Add(time.Hour)}))
	_, err := tab.Enroll(proto.NodeEnrollRequest{At: at, NodeID: "a", TokenHash: Hash("tok"), CredentialHash: Hash("cred")})
	require.NoError(t, err)
	issue := func(node, serial string, life time.Duration) error {
		return tab.IssueCert(proto.NodeCertIssueRequest{At: at, NodeID: node, Serial: serial, NotAfter: at.Add(life)})
	}

	tests := []struct {
		name, node, serial string
		life               time.Duration
		wantErr            string
	}{
		{name: "recorded", node: "a", serial: "1a", life: time.Hour},
		{name: "second certificate", node: "a", serial: "2b", life: time.Hour},
		{name: "duplicate serial", node: "a", serial: "1a", life: time.Hour, wantErr: "already recorded"},
		{name: "node without a credential", node: "b", serial: "3c", life: time.Hour, wantErr: "no credential"},
		{name: "not hex", node: "a", serial: "XYZ", life: time.Hour, wantErr: "not lower-case hex"},
		{name: "expires before issued", node: "a", serial: "4d", life: -time.Minute, wantErr: "before it is issued"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := issue(tc.node, tc.serial, tc.life)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
		})
	}
	assert.False(t, tab.CertRevoked("1a"))
	assert.False(t, tab.CertRevoked("ffff"), "an unknown serial is not on the list")

	n, err := tab.RevokeCerts(proto.NodeCertRevokeRequest{At: at, NodeID: "a", Serial: "1a"})
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	assert.True(t, tab.CertRevoked("1a"))
	assert.False(t, tab.CertRevoked("2b"))
	_, err = tab.RevokeCerts(proto.NodeCertRevokeRequest{At: at, NodeID: "b", Serial: "2b"})
	require.ErrorContains(t, err, "no unexpired certificate")

	// The list survives a snapshot.
	b, err := tab.MarshalJSON()
	require.NoError(t, err)
	restored := New()
	require.NoError(t, restored.Restore(b))
	assert.True(t, restored.CertRevoked("1a"))
	assert.Len(t, restored.Certs("a"), 2)

	// Revoking the credential revokes the node's certificates.
	require.NoError(t, restored.Revoke(proto.NodeCredentialRevokeRequest{At: at, NodeID: "a"}))
	assert.True(t, restored.CertRevoked("2b"))
}
