package api

// Agent client certificates: mutual TLS on the agent routes.
//
// With TLS on (the backend has the cluster CA), an agent sends a CSR when
// it enrolls and gets a short-lived client certificate for its node; it
// renews it at two thirds of its lifetime through POST
// /v1/agent/certificate. Every node route then needs both the node
// credential (bearer) and a client certificate of the CA for the same
// node: a certificate for node A cannot act for node B. Revoked serials
// (the node's credential revoked, the node decommissioned) are refused.

import (
	"net/http"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/coordinator/enroll"
	"github.com/gpuaas/gpuaas/coordinator/pki"
	"github.com/gpuaas/gpuaas/coordinator/server"
	"github.com/gpuaas/gpuaas/proto"
)

// tlsBackend is a backend with the cluster CA (*server.Server with TLS).
type tlsBackend interface {
	TLS() *server.TLSConfig
}

// clusterTLS is the backend's TLS material, nil when it serves plain HTTP.
func (a *API) clusterTLS() *server.TLSConfig {
	if b, ok := a.b.(tlsBackend); ok {
		return b.TLS()
	}
	return nil
}

// agentCert returns the node the request's verified client certificate
// speaks for (present false without one). A follower that forwards an
// agent's request authenticates with its own coordinator certificate and
// names the agent's certificate in proto.NodeCertHeader.
func agentCert(r *http.Request, tab *enroll.Table) (node string, present bool, err error) {
	if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || len(r.TLS.VerifiedChains[0]) == 0 {
		return "", false, nil
	}
	leaf := r.TLS.VerifiedChains[0][0]
	role, id, ok := pki.Identity(leaf)
	if !ok {
		return "", false, proto.Errorf(proto.CodeForbidden, "the client certificate %q names no gpuaas identity", leaf.Subject.CommonName)
	}
	serial := pki.SerialHex(leaf)
	if role == pki.RoleServer {
		if r.Header.Get(proto.ForwardedHeader) == "" && r.Header.Get(blobPeerHeader) == "" {
			return "", false, proto.Errorf(proto.CodeForbidden, "a coordinator certificate (%s) does not act for a node", id)
		}
		h := r.Header.Get(proto.NodeCertHeader)
		if h == "" {
			return "", false, nil
		}
		var ok bool
		if id, serial, ok = strings.Cut(h, " "); !ok || id == "" || serial == "" {
			return "", false, proto.Errorf(proto.CodeInvalidArgument, "%s %q is not \"<node> <serial>\"", proto.NodeCertHeader, h)
		}
	}
	if tab.CertRevoked(serial) {
		return "", false, proto.Errorf(proto.CodeUnauthenticated, "the client certificate %s of node %s is revoked; enroll again with a new bootstrap token", serial, id)
	}
	return id, true, nil
}

// nodeCertHeader is what a follower forwarding r tells the leader about
// the agent certificate it verified ("" for none). A request that a
// coordinator itself forwarded (or a replica fetching a blob for an agent)
// passes on the header that coordinator set: a replica fetching a blob
// from its peers for a forwarded download names the agent's certificate
// the first replica verified.
func nodeCertHeader(r *http.Request) string {
	if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || len(r.TLS.VerifiedChains[0]) == 0 {
		return ""
	}
	leaf := r.TLS.VerifiedChains[0][0]
	role, id, ok := pki.Identity(leaf)
	switch {
	case ok && role == pki.RoleNode:
		return id + " " + pki.SerialHex(leaf)
	case ok && role == pki.RoleServer && (r.Header.Get(proto.ForwardedHeader) != "" || r.Header.Get(blobPeerHeader) != ""):
		return r.Header.Get(proto.NodeCertHeader)
	}
	return ""
}

// checkAgentCert enforces mutual TLS on a node route the credential
// authenticated for node: the client certificate must be node's. The
// renewal route also takes the credential alone (an agent whose
// certificate expired while its host was off, or one enrolled before TLS).
func (a *API) checkAgentCert(r *http.Request, tab *enroll.Table, rt Route, node string) error {
	if a.clusterTLS() == nil {
		return nil
	}
	certNode, present, err := agentCert(r, tab)
	if err != nil {
		return err
	}
	if !present {
		if rt.Pattern == proto.AgentCertificatePath {
			return nil
		}
		return proto.Errorf(proto.CodeUnauthenticated, "agent routes need the node's client certificate of the cluster CA (mutual TLS) besides the credential; the agent gets one when it enrolls or from POST %s", proto.AgentCertificatePath)
	}
	if certNode != node {
		return proto.Errorf(proto.CodeForbidden, "the client certificate is node %s's; it cannot act for node %s", certNode, node)
	}
	return nil
}

// signedCert is a certificate signed for a node, not yet recorded.
type signedCert struct {
	node, serial, pem, ca string
	notAfter              time.Time
}

// signNodeCert signs a CSR for node; nothing is proposed (a bad CSR
// changes nothing).
func (a *API) signNodeCert(node, csr string) (signedCert, error) {
	t := a.clusterTLS()
	if t == nil {
		return signedCert{}, proto.Errorf(proto.CodeInvalidArgument, "this cluster serves plain HTTP (-insecure-http): it signs no certificates")
	}
	if len(csr) > proto.MaxCSRBytes {
		return signedCert{}, proto.Errorf(proto.CodeInvalidArgument, "csr is longer than %d bytes", proto.MaxCSRBytes)
	}
	ttl := t.NodeCertTTL
	if ttl <= 0 {
		ttl = pki.DefaultNodeTTL
	}
	active := t.Active()
	certPEM, cert, err := active.SignNodeCSR([]byte(csr), node, a.now(), ttl)
	if err != nil {
		return signedCert{}, proto.Errorf(proto.CodeInvalidArgument, "csr: %v", err)
	}
	return signedCert{node: node, serial: pki.SerialHex(cert), pem: string(certPEM), notAfter: cert.NotAfter.UTC(), ca: pki.ID(active.Cert)}, nil
}

// record enters a signed certificate in the replicated table (the
// revocation list's serials).
func (sc signedCert) record(a *API, c *call) error {
	_, idx, err := a.b.Apply(c.r.Context(), proto.NodeCertIssueType|proto.IgnoreUnknownTypeFlag, proto.NodeCertIssueRequest{
		At: a.now(), NodeID: sc.node, Serial: sc.serial, NotAfter: sc.notAfter, CA: sc.ca})
	if err != nil {
		return err
	}
	c.index = idx
	return nil
}

// agentCertificate is POST /v1/agent/certificate: a new client
// certificate for the credential's node.
func (a *API) agentCertificate(c *call) error {
	if _, err := c.query(); err != nil {
		return err
	}
	var body proto.CertificateRequest
	if err := c.decode(&body, false); err != nil {
		return err
	}
	if strings.TrimSpace(body.CSR) == "" {
		return proto.Errorf(proto.CodeInvalidArgument, "csr is required (a PEM CERTIFICATE REQUEST)")
	}
	node := c.agentNode()
	sc, err := a.signNodeCert(node, body.CSR)
	if err != nil {
		return err
	}
	if err := sc.record(a, c); err != nil {
		return err
	}
	a.log.Info("signed agent certificate", "node", node, "serial", sc.serial, "not_after", sc.notAfter)
	return c.reply(http.StatusCreated, proto.CertificateResponse{Certificate: sc.pem, NotAfter: sc.notAfter})
}
