package proto

import "time"

// Agent client certificates (mutual TLS on the agent routes). The cluster
// CA signs an agent's CSR at enrollment and on renewal; every issued
// certificate is recorded in the replicated enrollment table (its serial,
// node and expiry), and revoking a node's credential revokes its
// certificates. Both commands are applied by the server's enrollment FSM
// and proposed with IgnoreUnknownTypeFlag (numbers 70-74 are this
// feature's).
const (
	NodeCertIssueType  MessageType = 70
	NodeCertRevokeType MessageType = 71
)

func init() {
	messageTypeNames[NodeCertIssueType] = "node_cert_issue"
	messageTypeNames[NodeCertRevokeType] = "node_cert_revoke"
}

// AgentCertificatePath is the agent route that signs a new client
// certificate (renewal) from a CSR.
const AgentCertificatePath = "/v1/agent/certificate"

// NodeCertHeader carries, on an agent request a follower forwards to the
// leader, the node and serial of the client certificate the follower
// verified ("<node> <serial hex>"). The leader believes it only on a
// connection authenticated with a coordinator's certificate.
const NodeCertHeader = "X-Gpuaas-Node-Cert"

// MaxCSRBytes bounds a PEM certificate request.
const MaxCSRBytes = 4096

// NodeCertIssueRequest records a certificate signed for a node.
type NodeCertIssueRequest struct {
	At       time.Time `json:"at"`
	NodeID   string    `json:"node_id"`
	Serial   string    `json:"serial"` // lower-case hex
	NotAfter time.Time `json:"not_after"`
	// CA is the ID (fingerprint) of the CA that signed it (absent for
	// certificates issued before CA rotation existed: the first CA's).
	CA string `json:"ca,omitempty"`
}

// NodeCertRevokeRequest revokes one certificate (Serial) or all of a
// node's (Serial empty).
type NodeCertRevokeRequest struct {
	At     time.Time `json:"at"`
	NodeID string    `json:"node_id"`
	Serial string    `json:"serial,omitempty"`
	Reason string    `json:"reason,omitempty"`
}

// NodeCert is one issued agent certificate as the table keeps it (until
// it expires).
type NodeCert struct {
	Serial    string     `json:"serial"`
	NodeID    string     `json:"node_id"`
	IssuedAt  time.Time  `json:"issued_at"`
	NotAfter  time.Time  `json:"not_after"`
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
	CA        string     `json:"ca,omitempty"`
}

// CertificateRequest is the body of POST /v1/agent/certificate.
type CertificateRequest struct {
	CSR string `json:"csr"` // PEM CERTIFICATE REQUEST
}

// CertificateResponse carries a signed client certificate.
type CertificateResponse struct {
	Certificate string    `json:"certificate"` // PEM
	NotAfter    time.Time `json:"not_after"`
}
