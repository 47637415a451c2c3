package server

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/gpuaas/gpuaas/coordinator/enroll"
	"github.com/gpuaas/gpuaas/coordinator/pki"
	"github.com/gpuaas/gpuaas/internal/atomicfile"
	"github.com/gpuaas/gpuaas/proto"
)

// Cluster CA rotation, the coordinator's side (proto/ca.go). The
// replicated table says which CAs are trusted and which one signs; every
// coordinator follows it within a second (syncCA): it trusts exactly the
// table's CAs on its API, Raft and peer connections, re-issues its own
// certificate from the active CA (same identity and SANs) when another
// CA signed it, and keeps the state in <data-dir>/tls/rotation.json so a
// restart (before Raft has replayed the table) trusts and presents the
// right certificates.

// RotationFile is where a coordinator keeps the rotation state it
// follows, in <data-dir>/tls.
const RotationFile = "rotation.json"

// caSyncInterval is how often syncCA compares the table with the TLS
// material in use.
const caSyncInterval = 500 * time.Millisecond

// rotationState is RotationFile.
type rotationState struct {
	Version    string   `json:"version"`
	ActiveCert string   `json:"active_cert"`
	ActiveKey  string   `json:"active_key"`
	Trusted    []string `json:"trusted"` // PEM, the active CA included
}

// LoadRotation reads dir/rotation.json: the active CA and every trusted
// CA a rotation left (ok false when there is none).
func LoadRotation(dir string) (active *pki.CA, trusted []*x509.Certificate, ok bool, err error) {
	b, err := os.ReadFile(filepath.Join(dir, RotationFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil, false, nil
	}
	if err != nil {
		return nil, nil, false, fmt.Errorf("read CA rotation state: %w", err)
	}
	var st rotationState
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, nil, false, fmt.Errorf("CA rotation state %s: %w", filepath.Join(dir, RotationFile), err)
	}
	if active, err = pki.ParseCA([]byte(st.ActiveCert), []byte(st.ActiveKey)); err != nil {
		return nil, nil, false, fmt.Errorf("CA rotation state %s: %w", filepath.Join(dir, RotationFile), err)
	}
	for _, p := range st.Trusted {
		c, err := pki.ParseCertPEM([]byte(p))
		if err != nil {
			return nil, nil, false, fmt.Errorf("CA rotation state %s: trusted CA: %w", filepath.Join(dir, RotationFile), err)
		}
		trusted = append(trusted, c)
	}
	return active, trusted, true, nil
}

// syncCA follows the rotation table until ctx ends.
func (s *Server) syncCA(ctx context.Context) {
	defer s.wg.Done()
	t := time.NewTicker(caSyncInterval)
	defer t.Stop()
	for {
		if err := s.applyCATable(); err != nil {
			s.log.Error("CA rotation: cannot follow the table", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// applyCATable makes the TLS material in use what the table says (a no-op
// while it matches).
func (s *Server) applyCATable() error {
	c := s.cfg.TLS
	cas := s.enroll.table.CAs()
	version := enroll.CABundleVersion(cas)
	cur := c.cur()
	if version == "" || version == cur.version {
		return nil
	}
	var active *pki.CA
	var trusted []*x509.Certificate
	for _, r := range cas {
		if r.State == proto.CARetired {
			continue
		}
		cert, err := pki.ParseCertPEM([]byte(r.CertPEM))
		if err != nil {
			return fmt.Errorf("CA %s: %w", r.ID, err)
		}
		trusted = append(trusted, cert)
		if r.State != proto.CAActive {
			continue
		}
		switch {
		case r.KeyPEM != "":
			if active, err = pki.ParseCA([]byte(r.CertPEM), []byte(r.KeyPEM)); err != nil {
				return fmt.Errorf("CA %s: %w", r.ID, err)
			}
		case pki.ID(cur.active.Cert) == r.ID:
			active = cur.active
		case pki.ID(c.CA.Cert) == r.ID:
			active = c.CA
		default:
			return fmt.Errorf("the active CA %s has no key in the table and is not the one this server has", r.ID)
		}
	}
	if active == nil {
		return errors.New("the rotation table has no active CA")
	}
	cert := cur.cert
	if !pki.SignedBy(cert.Leaf, active.Cert) {
		_, id, _ := pki.Identity(cert.Leaf)
		var hosts []string
		for _, ip := range cert.Leaf.IPAddresses {
			hosts = append(hosts, ip.String())
		}
		hosts = append(hosts, cert.Leaf.DNSNames...)
		nc, err := active.IssueServer(id, hosts, s.cfg.Now(), pki.ServerTTL)
		if err != nil {
			return fmt.Errorf("re-issue this server's certificate from CA %s: %w", pki.ID(active.Cert), err)
		}
		cert = &nc
		s.log.Info("CA rotation: re-issued this server's certificate from the active CA", "ca", pki.ID(active.Cert), "serial", pki.SerialHex(nc.Leaf))
	}
	l := newTLSLive(active, trusted, cert, version)
	if err := s.keepRotation(l); err != nil {
		return err
	}
	c.live.Store(l)
	var ids []string
	for _, t := range l.trusted {
		ids = append(ids, pki.ID(t))
	}
	s.log.Info("CA rotation: following the table", "version", version, "active", pki.ID(active.Cert), "trusted", ids)
	return nil
}

// keepRotation writes the state l to <data-dir>/tls/rotation.json (0600:
// it holds the active CA's key).
func (s *Server) keepRotation(l *tlsLive) error {
	keyPEM, err := pki.EncodeKeyPEM(l.active.Key)
	if err != nil {
		return err
	}
	st := rotationState{Version: l.version, ActiveCert: string(l.active.CertPEM), ActiveKey: string(keyPEM)}
	for _, t := range l.trusted {
		st.Trusted = append(st.Trusted, string(pemCert(t)))
	}
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	dir := filepath.Join(s.cfg.DataDir, "tls")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("keep CA rotation state: %w", err)
	}
	if err := atomicfile.WriteFile(filepath.Join(dir, RotationFile), b, 0o600); err != nil {
		return fmt.Errorf("keep CA rotation state: %w", err)
	}
	return nil
}

func pemCert(c *x509.Certificate) []byte {
	return pki.EncodeCertPEM(c)
}

// caRecord describes a CA for the table (without its key unless withKey).
func caRecord(ca *pki.CA, withKey bool) (proto.CARecord, error) {
	r := proto.CARecord{ID: pki.ID(ca.Cert), CertPEM: string(ca.CertPEM), Subject: ca.Cert.Subject.CommonName, NotAfter: ca.Cert.NotAfter.UTC()}
	if withKey {
		k, err := pki.EncodeKeyPEM(ca.Key)
		if err != nil {
			return r, err
		}
		r.KeyPEM = string(k)
	}
	return r, nil
}

// RotateCA introduces a new cluster CA (staged: trusted by everyone,
// signing nothing yet) and returns it.
func (s *Server) RotateCA(ctx context.Context, by string) (proto.CARecord, uint64, error) {
	if s.cfg.TLS == nil {
		return proto.CARecord{}, 0, proto.Errorf(proto.CodeInvalidArgument, "this cluster serves plain HTTP (-insecure-http): it has no CA to rotate")
	}
	now := s.cfg.Now().UTC()
	ca, err := pki.NewCA("gpuaas cluster CA "+now.Format("2006-01-02T15:04:05Z"), now, pki.CATTL)
	if err != nil {
		return proto.CARecord{}, 0, err
	}
	cur, err := caRecord(s.cfg.TLS.Active(), false)
	if err != nil {
		return proto.CARecord{}, 0, err
	}
	n, err := caRecord(ca, true)
	if err != nil {
		return proto.CARecord{}, 0, err
	}
	_, idx, err := s.Apply(ctx, proto.CAIntroduceType|proto.IgnoreUnknownTypeFlag, proto.CAIntroduceRequest{At: now, By: by, Current: cur, New: n})
	if err != nil {
		return proto.CARecord{}, idx, err
	}
	n.KeyPEM, n.State, n.IntroducedAt, n.By = "", proto.CAStaged, now, by
	return n, idx, nil
}

// ActivateCA makes the staged CA id the signing one.
func (s *Server) ActivateCA(ctx context.Context, id, by string) (uint64, error) {
	_, idx, err := s.Apply(ctx, proto.CAActivateType|proto.IgnoreUnknownTypeFlag, proto.CAActivateRequest{At: s.cfg.Now().UTC(), By: by, ID: id})
	return idx, err
}

// RetireCA stops trusting CA id everywhere.
func (s *Server) RetireCA(ctx context.Context, id, by string) (uint64, error) {
	_, idx, err := s.Apply(ctx, proto.CARetireType|proto.IgnoreUnknownTypeFlag, proto.CARetireRequest{At: s.cfg.Now().UTC(), By: by, ID: id})
	return idx, err
}
