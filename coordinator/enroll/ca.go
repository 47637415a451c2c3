package enroll

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strings"

	"github.com/gpuaas/gpuaas/proto"
)

// The cluster CA rotation table (proto/ca.go). Empty until the first
// rotation: the cluster then uses the CA each coordinator started with.
// A CA moves staged -> active -> previous -> retired (a staged one may be
// retired directly: an abandoned rotation); at most one CA is staged and
// exactly one active once the table has any.

// CAs returns the rotation table, introduction order (keys included: for
// the server's own use, never the API's).
func (t *Table) CAs() []proto.CARecord {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return slices.Clone(t.cas)
}

// CABundleVersion is the version of the trust bundle: a digest of the
// trusted CAs' IDs and which one is active ("" while the table is empty).
func CABundleVersion(cas []proto.CARecord) string {
	if len(cas) == 0 {
		return ""
	}
	var b strings.Builder
	for _, c := range cas {
		if c.State != proto.CARetired {
			b.WriteString(c.ID + ":" + c.State + ";")
		}
	}
	sum := sha256.Sum256([]byte(b.String()))
	return hex.EncodeToString(sum[:8])
}

func validCARecord(what string, c proto.CARecord, needKey bool) error {
	switch {
	case !proto.CAIDPattern.MatchString(c.ID):
		return proto.Errorf(proto.CodeInvalidArgument, "%s CA id %q is not 16 lower-case hex digits", what, c.ID)
	case !strings.Contains(c.CertPEM, "BEGIN CERTIFICATE") || len(c.CertPEM) > 16<<10:
		return proto.Errorf(proto.CodeInvalidArgument, "%s CA %s: cert_pem is not a PEM certificate", what, c.ID)
	case needKey && (!strings.Contains(c.KeyPEM, "PRIVATE KEY") || len(c.KeyPEM) > 16<<10):
		return proto.Errorf(proto.CodeInvalidArgument, "%s CA %s: key_pem is not a PEM private key", what, c.ID)
	}
	return nil
}

// IntroduceCA adds a new CA as staged (trusted, not signing). The first
// rotation records req.Current as the active CA.
func (t *Table) IntroduceCA(req proto.CAIntroduceRequest) error {
	if err := validCARecord("new", req.New, true); err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, c := range t.cas {
		if c.ID == req.New.ID {
			return proto.Errorf(proto.CodeAlreadyExists, "CA %s is in the rotation table already (%s)", c.ID, c.State)
		}
		if c.State == proto.CAStaged {
			return proto.Errorf(proto.CodeConflict, "CA %s is staged already: activate or retire it first", c.ID)
		}
	}
	var add []proto.CARecord
	if len(t.cas) == 0 {
		if err := validCARecord("current", req.Current, false); err != nil {
			return err
		}
		if req.Current.ID == req.New.ID {
			return proto.Errorf(proto.CodeInvalidArgument, "the new CA is the current one")
		}
		cur := req.Current
		cur.State, cur.KeyPEM = proto.CAActive, ""
		add = append(add, cur)
	}
	n := req.New
	n.State, n.IntroducedAt, n.By, n.ActivatedAt, n.RetiredAt = proto.CAStaged, req.At, req.By, nil, nil
	t.cas = append(append(t.cas, add...), n)
	return nil
}

// ActivateCA makes the staged CA id the signing one; the active CA
// becomes previous.
func (t *Table) ActivateCA(req proto.CAActivateRequest) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	i := slices.IndexFunc(t.cas, func(c proto.CARecord) bool { return c.ID == req.ID })
	if i < 0 {
		return proto.Errorf(proto.CodeNotFound, "CA %s is not in the rotation table", req.ID)
	}
	if t.cas[i].State != proto.CAStaged {
		return proto.Errorf(proto.CodeIllegalTransition, "CA %s is %s; only a staged CA is activated", req.ID, t.cas[i].State)
	}
	at := req.At
	for j := range t.cas {
		if t.cas[j].State == proto.CAActive {
			t.cas[j].State = proto.CAPrevious
		}
	}
	t.cas[i].State, t.cas[i].ActivatedAt = proto.CAActive, &at
	return nil
}

// RetireCA retires a previous CA, or abandons a staged one: nobody trusts
// it any longer and its key is dropped.
func (t *Table) RetireCA(req proto.CARetireRequest) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	i := slices.IndexFunc(t.cas, func(c proto.CARecord) bool { return c.ID == req.ID })
	if i < 0 {
		return proto.Errorf(proto.CodeNotFound, "CA %s is not in the rotation table", req.ID)
	}
	switch t.cas[i].State {
	case proto.CAPrevious, proto.CAStaged:
	default:
		return proto.Errorf(proto.CodeIllegalTransition, "CA %s is %s; only a previous (or staged) CA is retired", req.ID, t.cas[i].State)
	}
	at := req.At
	t.cas[i].State, t.cas[i].RetiredAt, t.cas[i].KeyPEM = proto.CARetired, &at, ""
	return nil
}
