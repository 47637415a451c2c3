package enroll

import (
	"regexp"
	"sort"
	"time"

	"github.com/gpuaas/gpuaas/proto"
)

var serialRe = regexp.MustCompile(`^[0-9a-f]{1,40}$`)

// maxCertsPerNode bounds the unexpired certificates kept for one node
// (renewal every 16 h of a 24 h certificate keeps two).
const maxCertsPerNode = 64

// IssueCert records a client certificate signed for a node (the
// revocation list needs to know a node's serials). Expired records are
// forgotten.
func (t *Table) IssueCert(req proto.NodeCertIssueRequest) error {
	if err := proto.ValidateID("node ID", req.NodeID); err != nil {
		return err
	}
	if !serialRe.MatchString(req.Serial) {
		return proto.Errorf(proto.CodeInvalidArgument, "certificate serial %q is not lower-case hex", req.Serial)
	}
	if !req.NotAfter.After(req.At) {
		return proto.Errorf(proto.CodeInvalidArgument, "certificate %s expires at %s, before it is issued", req.Serial, req.NotAfter.Format(time.RFC3339))
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.creds[req.NodeID]; !ok {
		return proto.Errorf(proto.CodeIllegalTransition, "node %s has no credential; a certificate is issued only to an enrolled node", req.NodeID)
	}
	if _, ok := t.certs[req.Serial]; ok {
		return proto.Errorf(proto.CodeAlreadyExists, "certificate %s is already recorded", req.Serial)
	}
	t.pruneCertsLocked(req.At)
	n := 0
	for _, c := range t.certs {
		if c.NodeID == req.NodeID {
			n++
		}
	}
	if n >= maxCertsPerNode {
		return proto.Errorf(proto.CodeConflict, "node %s already holds %d unexpired certificates", req.NodeID, n)
	}
	t.certs[req.Serial] = &proto.NodeCert{Serial: req.Serial, NodeID: req.NodeID, IssuedAt: req.At, NotAfter: req.NotAfter, CA: req.CA}
	return nil
}

// RevokeCerts revokes one certificate of a node (req.Serial) or all of
// them; it returns how many were revoked now.
func (t *Table) RevokeCerts(req proto.NodeCertRevokeRequest) (int, error) {
	if err := proto.ValidateID("node ID", req.NodeID); err != nil {
		return 0, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if req.Serial != "" {
		c, ok := t.certs[req.Serial]
		if !ok || c.NodeID != req.NodeID {
			return 0, proto.Errorf(proto.CodeNotFound, "node %s has no unexpired certificate %s", req.NodeID, req.Serial)
		}
	}
	return t.revokeCertsLocked(req.NodeID, req.Serial, req.At), nil
}

func (t *Table) revokeCertsLocked(node, serial string, at time.Time) int {
	n := 0
	for _, c := range t.certs {
		if c.NodeID == node && (serial == "" || c.Serial == serial) && c.RevokedAt == nil {
			at := at
			c.RevokedAt = &at
			n++
		}
	}
	return n
}

func (t *Table) pruneCertsLocked(now time.Time) {
	for s, c := range t.certs {
		if now.After(c.NotAfter) {
			delete(t.certs, s)
		}
	}
}

// CertRevoked reports whether a certificate serial is on the revocation
// list. A serial the table does not know is not revoked: the CA signed it
// (the TLS handshake checked that) and its record may not have reached
// this replica yet.
func (t *Table) CertRevoked(serial string) bool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	c, ok := t.certs[serial]
	return ok && c.RevokedAt != nil
}

// Certs lists a node's unexpired certificates (all nodes' with node "").
func (t *Table) Certs(node string) []proto.NodeCert {
	t.mu.RLock()
	defer t.mu.RUnlock()
	var out []proto.NodeCert
	for _, c := range t.certs {
		if node == "" || c.NodeID == node {
			out = append(out, *c)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].IssuedAt.Before(out[j].IssuedAt) })
	return out
}
