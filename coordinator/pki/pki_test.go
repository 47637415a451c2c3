package pki

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var t0 = time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)

func newCA(t *testing.T) *CA {
	t.Helper()
	ca, err := NewCA("test CA", t0, CATTL)
	require.NoError(t, err)
	return ca
}

func TestServerCertificate(t *testing.T) {
	ca, other := newCA(t), newCA(t)
	cert, err := ca.IssueServer("c1", []string{"127.0.0.1", "10.0.0.5", "coord-1.lab", "0.0.0.0", "127.0.0.1", ""}, t0, ServerTTL)
	require.NoError(t, err)
	leaf := cert.Leaf
	require.Len(t, leaf.IPAddresses, 2, "duplicates and the unspecified address are dropped")
	require.True(t, leaf.IPAddresses[0].Equal(net.ParseIP("127.0.0.1")))
	require.Equal(t, []string{"coord-1.lab"}, leaf.DNSNames)

	tests := []struct {
		name    string
		pool    *x509.CertPool
		at      time.Time
		host    string
		wantErr string
	}{
		{name: "valid", pool: ca.Pool(), at: t0.Add(time.Hour), host: "127.0.0.1"},
		{name: "dns SAN", pool: ca.Pool(), at: t0.Add(time.Hour), host: "coord-1.lab"},
		{name: "host not in SANs", pool: ca.Pool(), at: t0.Add(time.Hour), host: "10.0.0.6", wantErr: "not 10.0.0.6"},
		{name: "expired", pool: ca.Pool(), at: t0.Add(ServerTTL + time.Minute), host: "127.0.0.1", wantErr: "expired"},
		{name: "not yet valid", pool: ca.Pool(), at: t0.Add(-time.Hour), host: "127.0.0.1", wantErr: "expired or is not yet valid"},
		{name: "wrong CA", pool: other.Pool(), at: t0.Add(time.Hour), host: "127.0.0.1", wantErr: "unknown authority"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := leaf.Verify(x509.VerifyOptions{Roots: tc.pool, CurrentTime: tc.at, DNSName: tc.host})
			if tc.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tc.wantErr)
		})
	}
	role, id, ok := Identity(leaf)
	require.True(t, ok)
	require.Equal(t, RoleServer, role)
	require.Equal(t, "c1", id)
}

func TestSignNodeCSR(t *testing.T) {
	ca, other := newCA(t), newCA(t)
	_, csr, err := NewNodeKey("j27u15")
	require.NoError(t, err)
	_, otherCSR, err := NewNodeKey("j27u16") // asks for another identity
	require.NoError(t, err)

	tests := []struct {
		name     string
		csr      []byte
		node     string
		ttl      time.Duration
		verifyAt time.Time
		pool     *x509.CertPool
		wantID   string
		wantErr  string
	}{
		{name: "signed for its node", csr: csr, node: "j27u15", ttl: DefaultNodeTTL, verifyAt: t0.Add(time.Hour), pool: ca.Pool(), wantID: "j27u15"},
		{name: "the node id is the coordinator's, not the CSR's", csr: otherCSR, node: "j27u15", ttl: DefaultNodeTTL, verifyAt: t0.Add(time.Hour), pool: ca.Pool(), wantID: "j27u15"},
		{name: "expired after its lifetime", csr: csr, node: "j27u15", ttl: time.Hour, verifyAt: t0.Add(2 * time.Hour), pool: ca.Pool(), wantErr: "expired"},
		{name: "wrong CA refused", csr: csr, node: "j27u15", ttl: DefaultNodeTTL, verifyAt: t0.Add(time.Hour), pool: other.Pool(), wantErr: "unknown authority"},
		{name: "lifetime too long", csr: csr, node: "j27u15", ttl: MaxNodeTTL + time.Hour, wantErr: "outside"},
		{name: "bad node id", csr: csr, node: "a/b", ttl: DefaultNodeTTL, wantErr: "node id"},
		{name: "not a CSR", csr: ca.CertPEM, node: "j27u15", ttl: DefaultNodeTTL, wantErr: "CERTIFICATE REQUEST"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			certPEM, cert, err := ca.SignNodeCSR(tc.csr, tc.node, t0, tc.ttl)
			if err == nil {
				_, _, err = Verify(tc.pool, cert, tc.verifyAt, x509.ExtKeyUsageClientAuth)
			}
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			parsed, err := ParseCertPEM(certPEM)
			require.NoError(t, err)
			role, id, ok := Identity(parsed)
			require.True(t, ok)
			require.Equal(t, RoleNode, role)
			require.Equal(t, tc.wantID, id)
			require.Equal(t, "node:"+tc.wantID, parsed.Subject.CommonName)
			// Client auth for the coordinators, server auth for the agent's
			// diagnostics port only: it names no host, so a client that
			// checks host names never takes it for a coordinator.
			require.Equal(t, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth}, parsed.ExtKeyUsage)
			require.Empty(t, parsed.DNSNames, "a node certificate names no host")
			require.Empty(t, parsed.IPAddresses, "a node certificate names no host")
			require.Error(t, parsed.VerifyHostname("127.0.0.1"))
		})
	}
}

func TestLoadOrCreate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tls")
	_, _, err := LoadOrCreate(dir, false, t0)
	require.ErrorContains(t, err, "no cluster CA")

	ca, created, err := LoadOrCreate(dir, true, t0)
	require.NoError(t, err)
	require.True(t, created)
	fi, err := os.Stat(filepath.Join(dir, CAKeyFile))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())

	again, created, err := LoadOrCreate(dir, true, t0)
	require.NoError(t, err)
	require.False(t, created)
	require.True(t, again.Cert.Equal(ca.Cert))

	// A key readable by others is refused.
	require.NoError(t, os.Chmod(filepath.Join(dir, CAKeyFile), 0o644))
	_, _, err = LoadOrCreate(dir, true, t0)
	require.ErrorContains(t, err, "chmod 600")
	require.NoError(t, os.Chmod(filepath.Join(dir, CAKeyFile), 0o600))

	// A key of another CA is refused.
	other := newCA(t)
	otherKey, err := EncodeKeyPEM(other.Key)
	require.NoError(t, err)
	_, err = ParseCA(ca.CertPEM, otherKey)
	require.ErrorContains(t, err, "does not match")

	// Half a CA is not silently replaced.
	require.NoError(t, os.Remove(filepath.Join(dir, CACertFile)))
	_, _, err = LoadOrCreate(dir, true, t0)
	require.ErrorContains(t, err, "only one of")
}

// handshake runs one TLS handshake over a pipe and returns both errors.
func handshake(t *testing.T, server, client *tls.Config) (serr, cerr error) {
	t.Helper()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	done := make(chan error, 1)
	go func() {
		s := tls.Server(a, server)
		err := s.Handshake()
		if err == nil {
			// TLS 1.3: the client learns of a refused certificate on its
			// first read.
			_, err = s.Write([]byte{1})
		}
		s.Close()
		done <- err
	}()
	c := tls.Client(b, client)
	cerr = c.Handshake()
	if cerr == nil {
		_, cerr = c.Read(make([]byte, 1))
	}
	c.Close()
	return <-done, cerr
}

func TestPeerTLS(t *testing.T) {
	ca, other := newCA(t), newCA(t)
	now := time.Now()
	c1, err := ca.IssueServer("c1", []string{"127.0.0.1"}, now, ServerTTL)
	require.NoError(t, err)
	c2, err := ca.IssueServer("c2", []string{"127.0.0.2"}, now, ServerTTL)
	require.NoError(t, err)
	foreign, err := other.IssueServer("c9", []string{"127.0.0.1"}, now, ServerTTL)
	require.NoError(t, err)
	nodeKey, csr, err := NewNodeKey("n1")
	require.NoError(t, err)
	nodePEM, _, err := ca.SignNodeCSR(csr, "n1", now, time.Hour)
	require.NoError(t, err)
	node, err := KeyPair(nodePEM, nodeKey)
	require.NoError(t, err)

	tests := []struct {
		name    string
		client  *tls.Config
		wantErr bool
	}{
		{name: "peer with a server certificate of the CA", client: PeerClientConfig(ca.Pool(), c2)},
		{name: "no client certificate", client: &tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1"}, wantErr: true},
		{name: "server certificate of another CA", client: PeerClientConfig(ca.Pool(), foreign), wantErr: true},
		{name: "an agent's certificate is not a peer", client: PeerClientConfig(ca.Pool(), node), wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			serr, cerr := handshake(t, PeerServerConfig(ca.Pool(), c1), tc.client)
			if tc.wantErr {
				require.Error(t, serr)
				require.Error(t, cerr)
				return
			}
			require.NoError(t, serr)
			require.NoError(t, cerr)
		})
	}
	t.Run("client refuses a peer of another CA", func(t *testing.T) {
		_, cerr := handshake(t, PeerServerConfig(other.Pool(), foreign), PeerClientConfig(ca.Pool(), c2))
		require.ErrorContains(t, cerr, "unknown authority")
	})
}

// TestDeriveCA: servers sharing the cluster secret derive one CA: a
// certificate issued from one server's copy verifies against another's;
// another secret is another CA.
func TestDeriveCA(t *testing.T) {
	a, err := DeriveCA("the-shared-cluster-secret", t0)
	require.NoError(t, err)
	b, err := DeriveCA("the-shared-cluster-secret", t0.Add(time.Minute))
	require.NoError(t, err)
	c, err := DeriveCA("another-cluster-secret!!", t0)
	require.NoError(t, err)
	require.True(t, a.Key.Equal(b.Key))
	require.False(t, a.Key.Equal(c.Key))
	cert, err := b.IssueServer("c2", []string{"127.0.0.1"}, t0, ServerTTL)
	require.NoError(t, err)
	_, _, err = Verify(a.Pool(), cert.Leaf, t0.Add(time.Hour), x509.ExtKeyUsageServerAuth)
	require.NoError(t, err, "c2's certificate chains to c1's copy of the CA")
	_, _, err = Verify(c.Pool(), cert.Leaf, t0.Add(time.Hour), x509.ExtKeyUsageServerAuth)
	require.ErrorContains(t, err, "unknown authority")
	_, err = DeriveCA("short", t0)
	require.ErrorContains(t, err, "shorter than 16")
}
