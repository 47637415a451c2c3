package api

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/enroll"
	"github.com/gpuaas/gpuaas/coordinator/pki"
	"github.com/gpuaas/gpuaas/coordinator/server"
	"github.com/gpuaas/gpuaas/proto"
)

// tlsAgentLedger is agentLedger with the cluster CA: the API enforces
// mutual TLS on the node routes.
type tlsAgentLedger struct {
	agentLedger
	tls *server.TLSConfig
}

func (b tlsAgentLedger) TLS() *server.TLSConfig { return b.tls }

type mtlsEnv struct {
	t    *testing.T
	ca   *pki.CA
	tab  *enroll.Table
	url  string
	cred map[string]string // node -> credential
}

// newMTLSEnv serves the API over TLS with the CA's server certificate;
// nodes j22u15 and j22u11 are enrolled.
func newMTLSEnv(t *testing.T) *mtlsEnv {
	t.Helper()
	now := time.Now().UTC()
	ca, err := pki.NewCA("api test CA", now, time.Hour)
	require.NoError(t, err)
	srvCert, err := ca.IssueServer("c1", []string{"127.0.0.1"}, now, time.Hour)
	require.NoError(t, err)
	tab := enroll.New()
	e := &mtlsEnv{t: t, ca: ca, tab: tab, cred: map[string]string{}}
	for _, node := range []string{"j22u15", "j22u11"} {
		tok, cred := enroll.NewSecret("gpb_"), enroll.NewSecret("gpn_")
		require.NoError(t, tab.Mint(proto.BootstrapTokenMintRequest{At: now, NodeID: node, TokenHash: enroll.Hash(tok), ExpiresAt: now.Add(time.Hour)}))
		_, err := tab.Enroll(proto.NodeEnrollRequest{At: now, NodeID: node, TokenHash: enroll.Hash(tok), CredentialHash: enroll.Hash(cred)})
		require.NoError(t, err)
		e.cred[node] = cred
	}
	b := tlsAgentLedger{agentLedger{newLedgerBackend(), tab}, &server.TLSConfig{CA: ca, Cert: srvCert, NodeCertTTL: time.Hour}}
	hs := httptest.NewUnstartedServer(New(b, nil, slog.New(slog.NewTextHandler(io.Discard, nil))))
	hs.TLS = pki.APIServerConfig(ca.Pool(), srvCert)
	hs.StartTLS()
	t.Cleanup(hs.Close)
	e.url = hs.URL
	return e
}

// nodeCert signs a client certificate for node and records it.
func (e *mtlsEnv) nodeCert(node string, ca *pki.CA) *tls.Certificate {
	e.t.Helper()
	key, csr, err := pki.NewNodeKey(node)
	require.NoError(e.t, err)
	certPEM, cert, err := ca.SignNodeCSR(csr, node, time.Now(), time.Hour)
	require.NoError(e.t, err)
	if ca == e.ca {
		require.NoError(e.t, e.tab.IssueCert(proto.NodeCertIssueRequest{At: time.Now().UTC(), NodeID: node, Serial: pki.SerialHex(cert), NotAfter: cert.NotAfter}))
	}
	kp, err := pki.KeyPair(certPEM, key)
	require.NoError(e.t, err)
	return &kp
}

// call sends one request with the credential and client certificate
// (either may be absent) and returns the status and body.
func (e *mtlsEnv) call(method, path, cred string, cert *tls.Certificate, body string) (int, string, error) {
	cfg := pki.ClientConfig(e.ca.Pool(), cert)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}}
	defer hc.CloseIdleConnections()
	req, err := http.NewRequest(method, e.url+path, strings.NewReader(body))
	require.NoError(e.t, err)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if cred != "" {
		req.Header.Set("Authorization", "Bearer "+cred)
	}
	res, err := hc.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b), nil
}

// TestAgentRoutesNeedTheNodesCertificate: with TLS on, a node route
// needs the node credential and a client certificate of the CA for the
// same node. A certificate for node A cannot act for node B.
func TestAgentRoutesNeedTheNodesCertificate(t *testing.T) {
	t.Parallel()
	e := newMTLSEnv(t)
	certA := e.nodeCert("j22u15", e.ca)
	revoked := e.nodeCert("j22u15", e.ca)
	serial := pki.SerialHex(revoked.Leaf)
	_, err := e.tab.RevokeCerts(proto.NodeCertRevokeRequest{At: time.Now().UTC(), NodeID: "j22u15", Serial: serial})
	require.NoError(t, err)
	other, err := pki.NewCA("another CA", time.Now(), time.Hour)
	require.NoError(t, err)
	foreign := e.nodeCert("j22u15", other)

	tests := []struct {
		name     string
		cred     string
		cert     *tls.Certificate
		want     int
		contains string
	}{
		{name: "credential and certificate of the same node", cred: e.cred["j22u15"], cert: certA, want: http.StatusOK},
		{name: "node A's certificate acting for node B", cred: e.cred["j22u11"], cert: certA, want: http.StatusForbidden, contains: "it cannot act for node j22u11"},
		{name: "credential without a certificate", cred: e.cred["j22u15"], want: http.StatusUnauthorized, contains: "client certificate"},
		{name: "certificate without a credential", cert: certA, want: http.StatusUnauthorized, contains: "Bearer"},
		{name: "revoked certificate", cred: e.cred["j22u15"], cert: revoked, want: http.StatusUnauthorized, contains: "revoked"},
		// Go's client offers no certificate the server's CA list does not
		// name; forced (GetClientCertificate), the handshake fails.
		{name: "certificate of another CA", cred: e.cred["j22u15"], cert: foreign, want: http.StatusUnauthorized, contains: "client certificate"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, body, err := e.call(http.MethodGet, "/v1/agent/slots", tc.cred, tc.cert, "")
			require.NoError(t, err)
			assert.Equal(t, tc.want, code, body)
			assert.Contains(t, body, tc.contains)
		})
	}

	t.Run("forced certificate of another CA", func(t *testing.T) {
		cfg := pki.ClientConfig(e.ca.Pool(), nil)
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return foreign, nil }
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}}
		req, err := http.NewRequest(http.MethodGet, e.url+"/v1/agent/slots", nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+e.cred["j22u15"])
		res, err := hc.Do(req)
		if err == nil {
			res.Body.Close()
		}
		require.Error(t, err)
		assert.Contains(t, err.Error(), "certificate")
	})

	// Renewal takes the credential alone and signs for the credential's
	// node, whatever the CSR names.
	_, csr, err := pki.NewNodeKey("j22u11")
	require.NoError(t, err)
	body, err := json.Marshal(proto.CertificateRequest{CSR: string(csr)})
	require.NoError(t, err)
	code, out, err := e.call(http.MethodPost, proto.AgentCertificatePath, e.cred["j22u15"], nil, string(body))
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, code, out)
	var cr proto.CertificateResponse
	require.NoError(t, json.Unmarshal([]byte(out), &cr))
	got, err := pki.ParseCertPEM([]byte(cr.Certificate))
	require.NoError(t, err)
	_, id, ok := pki.Identity(got)
	require.True(t, ok)
	assert.Equal(t, "j22u15", id)
	// A malformed CSR is refused with a clear error.
	code, out, err = e.call(http.MethodPost, proto.AgentCertificatePath, e.cred["j22u15"], nil, `{"csr":"not a csr"}`)
	require.NoError(t, err)
	assert.Equal(t, http.StatusBadRequest, code)
	assert.Contains(t, out, "CERTIFICATE REQUEST")
}

// TestPlainHTTPToTheTLSPortIsRefused: a client speaking plain HTTP to the
// API's TLS port gets a 400 and no route runs.
func TestPlainHTTPToTheTLSPortIsRefused(t *testing.T) {
	t.Parallel()
	e := newMTLSEnv(t)
	addr := strings.TrimPrefix(e.url, "https://")
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, conn.SetDeadline(time.Now().Add(5*time.Second)))
	_, err = conn.Write([]byte("GET /v1/agent/slots HTTP/1.1\r\nHost: " + addr + "\r\nAuthorization: Bearer " + e.cred["j22u15"] + "\r\n\r\n"))
	require.NoError(t, err)
	b, _ := io.ReadAll(conn)
	assert.True(t, bytes.HasPrefix(b, []byte("HTTP/1.0 400 Bad Request")), "got %q", b)
	assert.Contains(t, string(b), "HTTPS server")
	assert.NotContains(t, string(b), "[]", "no route answered")
	// The same request over http:// with net/http fails the same way.
	res, err := http.Get("http://" + addr + "/v1/agent/slots")
	require.NoError(t, err)
	res.Body.Close()
	assert.Equal(t, http.StatusBadRequest, res.StatusCode)
}

// TestAgentCertOfForwardedRequests: a follower forwarding an agent's
// request authenticates with its coordinator certificate and names the
// agent's certificate in a header; the leader believes the header only
// on a forwarded request from a coordinator certificate.
func TestAgentCertOfForwardedRequests(t *testing.T) {
	t.Parallel()
	now := time.Now()
	ca, err := pki.NewCA("forward CA", now, time.Hour)
	require.NoError(t, err)
	srv, err := ca.IssueServer("c2", []string{"127.0.0.1"}, now, time.Hour)
	require.NoError(t, err)
	_, csr, err := pki.NewNodeKey("j22u15")
	require.NoError(t, err)
	_, node, err := ca.SignNodeCSR(csr, "j22u15", now, time.Hour)
	require.NoError(t, err)
	tab := enroll.New()
	require.NoError(t, tab.Mint(proto.BootstrapTokenMintRequest{At: now, NodeID: "j22u11", TokenHash: enroll.Hash("t"), ExpiresAt: now.Add(time.Hour)}))
	_, err = tab.Enroll(proto.NodeEnrollRequest{At: now, NodeID: "j22u11", TokenHash: enroll.Hash("t"), CredentialHash: enroll.Hash("c")})
	require.NoError(t, err)
	require.NoError(t, tab.IssueCert(proto.NodeCertIssueRequest{At: now, NodeID: "j22u11", Serial: "abc", NotAfter: now.Add(time.Hour)}))
	_, err = tab.RevokeCerts(proto.NodeCertRevokeRequest{At: now, NodeID: "j22u11", Serial: "abc"})
	require.NoError(t, err)

	req := func(leaf *x509.Certificate, hdr ...string) *http.Request {
		r := httptest.NewRequest(http.MethodGet, "/v1/agent/slots", nil)
		if leaf != nil {
			r.TLS = &tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{leaf, ca.Cert}}}
		}
		for i := 0; i+1 < len(hdr); i += 2 {
			r.Header.Set(hdr[i], hdr[i+1])
		}
		return r
	}
	tests := []struct {
		name        string
		r           *http.Request
		wantNode    string
		wantPresent bool
		wantCode    proto.Code
	}{
		{name: "no TLS", r: req(nil)},
		{name: "the agent's own certificate", r: req(node), wantNode: "j22u15", wantPresent: true},
		{name: "a node certificate's header is ignored", r: req(node, proto.NodeCertHeader, "j22u11 01"), wantNode: "j22u15", wantPresent: true},
		{name: "forwarded by a coordinator", r: req(srv.Leaf, proto.ForwardedHeader, "1", proto.NodeCertHeader, "j22u15 0a"), wantNode: "j22u15", wantPresent: true},
		{name: "forwarded without an agent certificate", r: req(srv.Leaf, proto.ForwardedHeader, "1")},
		{name: "coordinator certificate not forwarding", r: req(srv.Leaf, proto.NodeCertHeader, "j22u15 0a"), wantCode: proto.CodeForbidden},
		{name: "malformed header", r: req(srv.Leaf, proto.ForwardedHeader, "1", proto.NodeCertHeader, "j22u15"), wantCode: proto.CodeInvalidArgument},
		{name: "revoked serial in the header", r: req(srv.Leaf, proto.ForwardedHeader, "1", proto.NodeCertHeader, "j22u11 abc"), wantCode: proto.CodeUnauthenticated},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, present, err := agentCert(tc.r, tab)
			if tc.wantCode != "" {
				require.Error(t, err)
				assert.Equal(t, tc.wantCode, proto.CodeOf(err))
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.wantPresent, present)
			assert.Equal(t, tc.wantNode, got)
		})
	}
	// The header a follower sends names the agent's verified certificate.
	assert.Equal(t, "j22u15 "+pki.SerialHex(node), nodeCertHeader(req(node)))
	assert.Empty(t, nodeCertHeader(req(srv.Leaf)))
}

// tlsBlobLedger is blobLedger with the cluster CA.
type tlsBlobLedger struct {
	blobLedger
	tls *server.TLSConfig
}

func (b tlsBlobLedger) TLS() *server.TLSConfig { return b.tls }

// TestBlobDownloadNeedsTheNodesCertificate: a node credential downloads an
// image blob only with a client certificate of the CA for the same node,
// like every other agent route; operator tokens need none.
func TestBlobDownloadNeedsTheNodesCertificate(t *testing.T) {
	t.Parallel()
	e, bl := newBlobEnv(t)
	data, digest := blobOf(t, 4096)
	r := e.do(RoleAdmin, http.MethodPut, "/v1/images/base/1", proto.ImageBody{Kind: proto.ImageSliceBase, Digest: digest, Size: int64(len(data))})
	require.Equal(t, http.StatusOK, r.status, string(r.body))
	r = e.do(RoleAdmin, http.MethodPut, "/v1/images/base/1/blob", data, "Content-Type", "application/octet-stream")
	require.Equal(t, http.StatusOK, r.status, string(r.body))
	credA := nodeCredential(t, bl.tab, "j22u15")
	credB := nodeCredential(t, bl.tab, "j22u11")

	now := time.Now().UTC()
	ca, err := pki.NewCA("blob test CA", now, time.Hour)
	require.NoError(t, err)
	srvCert, err := ca.IssueServer("c1", []string{"127.0.0.1"}, now, time.Hour)
	require.NoError(t, err)
	hs := httptest.NewUnstartedServer(New(tlsBlobLedger{bl, &server.TLSConfig{CA: ca, Cert: srvCert, NodeCertTTL: time.Hour}},
		nil, slog.New(slog.NewTextHandler(io.Discard, nil))))
	hs.TLS = pki.APIServerConfig(ca.Pool(), srvCert)
	hs.StartTLS()
	t.Cleanup(hs.Close)
	env := &mtlsEnv{t: t, ca: ca, tab: bl.tab, url: hs.URL}
	certA := env.nodeCert("j22u15", ca)

	tests := []struct {
		name     string
		cred     string
		cert     *tls.Certificate
		want     int
		contains string
	}{
		{name: "credential and certificate of the same node", cred: credA, cert: certA, want: http.StatusOK},
		{name: "credential without a certificate", cred: credA, want: http.StatusUnauthorized, contains: "client certificate"},
		{name: "node A's certificate with node B's credential", cred: credB, cert: certA, want: http.StatusForbidden, contains: "it cannot act for node j22u11"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, body, err := env.call(http.MethodGet, "/v1/images/base/1/blob", tc.cred, tc.cert, "")
			require.NoError(t, err)
			require.Equal(t, tc.want, code, body)
			if tc.want == http.StatusOK {
				assert.Equal(t, string(data), body)
				return
			}
			assert.Contains(t, body, tc.contains)
		})
	}
	// A hostile agent naming another node's certificate in the header a
	// coordinator sets is not believed: its own certificate counts.
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: pki.ClientConfig(ca.Pool(), certA)}}
	defer hc.CloseIdleConnections()
	req, err := http.NewRequest(http.MethodGet, hs.URL+"/v1/images/base/1/blob", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+credB)
	req.Header.Set(blobPeerHeader, "1")
	req.Header.Set(proto.NodeCertHeader, "j22u11 01")
	res, err := hc.Do(req)
	require.NoError(t, err)
	res.Body.Close()
	assert.Equal(t, http.StatusForbidden, res.StatusCode)
}
