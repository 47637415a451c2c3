// Package pki is the cluster's certificate authority: an ECDSA P-256 CA
// the bootstrap coordinator creates (or is given), the coordinators'
// serving and peer certificates (server role, IP and DNS SANs for the API
// and Raft addresses) and the agents' short-lived client certificates,
// signed from a CSR with the node ID in the subject and a URI SAN. The
// role and identity of a certificate are its URI SAN:
// gpuaas://server/<id> for a coordinator, gpuaas://node/<id> for an agent.
package pki

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/internal/atomicfile"
	"github.com/gpuaas/gpuaas/proto"
)

// Defaults of the certificates the CA issues.
const (
	// CATTL is the lifetime of a created CA.
	CATTL = 10 * 365 * 24 * time.Hour
	// ServerTTL is the lifetime of a coordinator's serving/peer
	// certificate (re-issued from the CA at every start).
	ServerTTL = 365 * 24 * time.Hour
	// DefaultNodeTTL is the lifetime of an agent's client certificate;
	// the agent renews it at two thirds of it.
	DefaultNodeTTL = 24 * time.Hour
	// MaxNodeTTL bounds a configured agent certificate lifetime.
	MaxNodeTTL = 30 * 24 * time.Hour
	// clockSkew backdates NotBefore so a peer whose clock is a little
	// behind accepts a fresh certificate.
	clockSkew = 5 * time.Minute
)

// Roles of a certificate, the host part of its gpuaas:// URI SAN.
const (
	RoleServer = "server"
	RoleNode   = "node"
)

// CA is the cluster CA: its certificate and private key.
type CA struct {
	Cert    *x509.Certificate
	CertPEM []byte
	Key     *ecdsa.PrivateKey
}

// NewCA creates a self-signed ECDSA P-256 CA valid from now for ttl.
func NewCA(name string, now time.Time, ttl time.Duration) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate CA key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: name, Organization: []string{"gpuaas"}},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              now.Add(ttl),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("create CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse CA certificate: %w", err)
	}
	return &CA{Cert: cert, CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), Key: key}, nil
}

// ParseCA reads a CA from its PEM certificate and PEM private key (EC or
// PKCS#8) and checks that they belong together and the certificate is a
// CA.
func ParseCA(certPEM, keyPEM []byte) (*CA, error) {
	cert, err := ParseCertPEM(certPEM)
	if err != nil {
		return nil, fmt.Errorf("CA certificate: %w", err)
	}
	if !cert.IsCA {
		return nil, fmt.Errorf("CA certificate %q is not a CA (basic constraints)", cert.Subject.CommonName)
	}
	key, err := ParseKeyPEM(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("CA key: %w", err)
	}
	pub, ok := cert.PublicKey.(*ecdsa.PublicKey)
	if !ok || !pub.Equal(key.Public()) {
		return nil, errors.New("CA key does not match the CA certificate")
	}
	return &CA{Cert: cert, CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw}), Key: key}, nil
}

// LoadCA reads a CA from a certificate file and a key file. A key file
// readable by group or others is refused.
func LoadCA(certFile, keyFile string) (*CA, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return nil, fmt.Errorf("read CA certificate: %w", err)
	}
	fi, err := os.Stat(keyFile)
	if err != nil {
		return nil, fmt.Errorf("read CA key: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("CA key %s has mode %v; it must not be readable by group or others (chmod 600)", keyFile, fi.Mode().Perm())
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, fmt.Errorf("read CA key: %w", err)
	}
	ca, err := ParseCA(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("%s, %s: %w", certFile, keyFile, err)
	}
	return ca, nil
}

// WriteFiles writes the CA certificate (0644) and key (0600).
func (ca *CA) WriteFiles(certFile, keyFile string) error {
	keyPEM, err := EncodeKeyPEM(ca.Key)
	if err != nil {
		return err
	}
	for _, f := range []string{certFile, keyFile} {
		if err := os.MkdirAll(filepath.Dir(f), 0o700); err != nil {
			return fmt.Errorf("create %s: %w", filepath.Dir(f), err)
		}
	}
	if err := atomicfile.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		return fmt.Errorf("write CA key: %w", err)
	}
	if err := atomicfile.WriteFile(certFile, ca.CertPEM, 0o644); err != nil {
		return fmt.Errorf("write CA certificate: %w", err)
	}
	return nil
}

// Files of a CA kept in a directory (LoadOrCreate).
const (
	CACertFile = "ca.pem"
	CAKeyFile  = "ca.key"
)

// LoadOrCreate loads the CA kept in dir, or, when there is none and create
// is set, creates one there. created tells which happened.
func LoadOrCreate(dir string, create bool, now time.Time) (ca *CA, created bool, err error) {
	certFile, keyFile := filepath.Join(dir, CACertFile), filepath.Join(dir, CAKeyFile)
	_, errC := os.Stat(certFile)
	_, errK := os.Stat(keyFile)
	switch {
	case errC == nil && errK == nil:
		ca, err := LoadCA(certFile, keyFile)
		return ca, false, err
	case errors.Is(errC, os.ErrNotExist) && errors.Is(errK, os.ErrNotExist):
		if !create {
			return nil, false, fmt.Errorf("no cluster CA in %s", dir)
		}
	case errC != nil && !errors.Is(errC, os.ErrNotExist):
		return nil, false, fmt.Errorf("CA certificate: %w", errC)
	case errK != nil && !errors.Is(errK, os.ErrNotExist):
		return nil, false, fmt.Errorf("CA key: %w", errK)
	default:
		return nil, false, fmt.Errorf("%s holds only one of %s and %s; restore the other or remove both", dir, CACertFile, CAKeyFile)
	}
	ca, err = NewCA("gpuaas cluster CA", now, CATTL)
	if err != nil {
		return nil, false, err
	}
	if err := ca.WriteFiles(certFile, keyFile); err != nil {
		return nil, false, err
	}
	return ca, true, nil
}

// Keep writes the CA into dir (as LoadOrCreate reads it) unless one is
// there already.
func (ca *CA) Keep(dir string) error {
	if _, err := os.Stat(filepath.Join(dir, CAKeyFile)); err == nil {
		return nil
	}
	return ca.WriteFiles(filepath.Join(dir, CACertFile), filepath.Join(dir, CAKeyFile))
}

// Pool is a certificate pool holding the CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// IdentityURI is the URI SAN naming a role and an ID.
func IdentityURI(role, id string) *url.URL {
	return &url.URL{Scheme: "gpuaas", Host: role, Path: "/" + id}
}

// Identity returns the role and ID a certificate's gpuaas:// URI SAN
// names (ok false without one).
func Identity(cert *x509.Certificate) (role, id string, ok bool) {
	for _, u := range cert.URIs {
		if u.Scheme == "gpuaas" && (u.Host == RoleServer || u.Host == RoleNode) {
			id := strings.TrimPrefix(u.Path, "/")
			if id != "" && !strings.Contains(id, "/") {
				return u.Host, id, true
			}
		}
	}
	return "", "", false
}

// IssueServer issues a coordinator's certificate for serving the API and
// for Raft and peer HTTP (server and client auth), with hosts as its
// SANs (IP addresses become IP SANs, anything else a DNS SAN).
func (ca *CA) IssueServer(id string, hosts []string, now time.Time, ttl time.Duration) (tls.Certificate, error) {
	if err := proto.ValidateID("server id", id); err != nil {
		return tls.Certificate{}, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("generate server key: %w", err)
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: "server:" + id, Organization: []string{"gpuaas"}},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		URIs:        []*url.URL{IdentityURI(RoleServer, id)},
	}
	seen := map[string]bool{}
	for _, h := range hosts {
		h = strings.TrimSpace(h)
		if h == "" || seen[h] {
			continue
		}
		seen[h] = true
		if ip := net.ParseIP(h); ip != nil {
			if !ip.IsUnspecified() {
				tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
			}
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := ca.sign(tmpl, key.Public(), now, ttl)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tlsCert(der, key)
}

// SignNodeCSR signs an agent's CSR as a client certificate for nodeID
// (also used to serve the agent's diagnostics port),
// valid for ttl: the subject is node:<id>, the URI SAN gpuaas://node/<id>
// (whatever the CSR asked for: only its key is used).
func (ca *CA) SignNodeCSR(csrPEM []byte, nodeID string, now time.Time, ttl time.Duration) (certPEM []byte, cert *x509.Certificate, err error) {
	if err := proto.ValidateID("node id", nodeID); err != nil {
		return nil, nil, err
	}
	if ttl <= 0 || ttl > MaxNodeTTL {
		return nil, nil, fmt.Errorf("node certificate lifetime %s is outside (0, %s]", ttl, MaxNodeTTL)
	}
	b, _ := pem.Decode(csrPEM)
	if b == nil || b.Type != "CERTIFICATE REQUEST" {
		return nil, nil, errors.New("CSR: no PEM CERTIFICATE REQUEST block")
	}
	csr, err := x509.ParseCertificateRequest(b.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("CSR: %w", err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, nil, fmt.Errorf("CSR signature: %w", err)
	}
	if _, ok := csr.PublicKey.(*ecdsa.PublicKey); !ok {
		return nil, nil, errors.New("CSR: the key must be ECDSA")
	}
	tmpl := &x509.Certificate{
		Subject:  pkix.Name{CommonName: "node:" + nodeID, Organization: []string{"gpuaas"}},
		KeyUsage: x509.KeyUsageDigitalSignature,
		// Client auth for the coordinators; server auth for the agent's
		// diagnostics port. It names no host, only the node (URI SAN), so
		// a client that checks host names (gpuaasctl, the API's clients)
		// never takes it for a coordinator.
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
		URIs:        []*url.URL{IdentityURI(RoleNode, nodeID)},
	}
	der, err := ca.sign(tmpl, csr.PublicKey, now, ttl)
	if err != nil {
		return nil, nil, err
	}
	cert, err = x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, fmt.Errorf("parse node certificate: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), cert, nil
}

func (ca *CA) sign(tmpl *x509.Certificate, pub crypto.PublicKey, now time.Time, ttl time.Duration) ([]byte, error) {
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	tmpl.SerialNumber = serial
	tmpl.NotBefore = now.Add(-clockSkew)
	tmpl.NotAfter = now.Add(ttl)
	if tmpl.NotAfter.After(ca.Cert.NotAfter) {
		tmpl.NotAfter = ca.Cert.NotAfter
	}
	tmpl.BasicConstraintsValid = true
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, pub, ca.Key)
	if err != nil {
		return nil, fmt.Errorf("sign certificate %s: %w", tmpl.Subject.CommonName, err)
	}
	return der, nil
}

// Verify checks that cert chains to the CA at now for the usage, and
// returns the role and ID of its URI SAN.
func Verify(pool *x509.CertPool, cert *x509.Certificate, now time.Time, usage x509.ExtKeyUsage) (role, id string, err error) {
	if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
		return "", "", fmt.Errorf("certificate %q: %w", cert.Subject.CommonName, err)
	}
	role, id, ok := Identity(cert)
	if !ok {
		return "", "", fmt.Errorf("certificate %q names no gpuaas identity (URI SAN gpuaas://server/<id> or gpuaas://node/<id>)", cert.Subject.CommonName)
	}
	return role, id, nil
}

// NewNodeKey makes an agent's key and a CSR for nodeID.
func NewNodeKey(nodeID string) (key *ecdsa.PrivateKey, csrPEM []byte, err error) {
	key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate node key: %w", err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: "node:" + nodeID},
		URIs:    []*url.URL{IdentityURI(RoleNode, nodeID)},
	}, key)
	if err != nil {
		return nil, nil, fmt.Errorf("create CSR: %w", err)
	}
	return key, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), nil
}

// ParseCertPEM parses the first certificate of a PEM block list.
func ParseCertPEM(b []byte) (*x509.Certificate, error) {
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			return nil, errors.New("no PEM CERTIFICATE block")
		}
		if blk.Type == "CERTIFICATE" {
			return x509.ParseCertificate(blk.Bytes)
		}
	}
}

// ParseKeyPEM parses an ECDSA private key (SEC 1 "EC PRIVATE KEY" or
// PKCS#8 "PRIVATE KEY").
func ParseKeyPEM(b []byte) (*ecdsa.PrivateKey, error) {
	blk, _ := pem.Decode(b)
	if blk == nil {
		return nil, errors.New("no PEM block")
	}
	switch blk.Type {
	case "EC PRIVATE KEY":
		return x509.ParseECPrivateKey(blk.Bytes)
	case "PRIVATE KEY":
		k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
		if err != nil {
			return nil, err
		}
		ek, ok := k.(*ecdsa.PrivateKey)
		if !ok {
			return nil, fmt.Errorf("PKCS#8 key is %T, not ECDSA", k)
		}
		return ek, nil
	}
	return nil, fmt.Errorf("PEM block %q is not an EC private key", blk.Type)
}

// EncodeKeyPEM encodes an ECDSA key as an "EC PRIVATE KEY" PEM block.
func EncodeKeyPEM(k *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		return nil, fmt.Errorf("encode key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}

// PoolFromPEM builds a pool from PEM certificates (a CA file).
func PoolFromPEM(b []byte) (*x509.CertPool, error) {
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(b) {
		return nil, errors.New("no PEM certificate")
	}
	return p, nil
}

// LoadPool reads a CA file into a pool.
func LoadPool(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read CA file: %w", err)
	}
	p, err := PoolFromPEM(bytes.TrimSpace(b))
	if err != nil {
		return nil, fmt.Errorf("CA file %s: %w", path, err)
	}
	return p, nil
}

func tlsCert(der []byte, key *ecdsa.PrivateKey) (tls.Certificate, error) {
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("parse certificate: %w", err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

// KeyPair builds a tls.Certificate from a PEM certificate and key.
func KeyPair(certPEM []byte, key *ecdsa.PrivateKey) (tls.Certificate, error) {
	c, err := ParseCertPEM(certPEM)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tlsCert(c.Raw, key)
}

func newSerial() (*big.Int, error) {
	s, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("certificate serial: %w", err)
	}
	return s.Add(s, big.NewInt(1)), nil
}

// SerialHex is a certificate serial as the revocation list keeps it.
func SerialHex(c *x509.Certificate) string { return c.SerialNumber.Text(16) }

// DeriveCA derives the cluster CA's key from the secret the bootstrap
// servers share (-cluster-secret-file): servers forming a cluster
// together each derive the same key, so certificates any of them issues
// chain to the CA certificate of every other (same subject, same key).
// The secret is then as sensitive as the CA key.
func DeriveCA(secret string, now time.Time) (*CA, error) {
	if len(secret) < 16 {
		return nil, errors.New("derive CA: the cluster secret is shorter than 16 characters")
	}
	var key *ecdsa.PrivateKey
	for i := byte(0); key == nil; i++ {
		raw, err := hkdf.Key(sha256.New, []byte(secret), []byte("gpuaas cluster CA v1"), "ecdsa-p256-"+string(rune('a'+i%26)), 32)
		if err != nil {
			return nil, fmt.Errorf("derive CA key: %w", err)
		}
		key, _ = ecdsa.ParseRawPrivateKey(elliptic.P256(), raw) // out of range (about 2^-32): next candidate
		if i == 255 {
			return nil, errors.New("derive CA key: no candidate in range")
		}
	}
	pub, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		return nil, fmt.Errorf("derive CA: %w", err)
	}
	sum := sha256.Sum256(pub)
	tmpl := &x509.Certificate{
		SerialNumber:          new(big.Int).SetBytes(sum[:16]),
		Subject:               pkix.Name{CommonName: "gpuaas cluster CA", Organization: []string{"gpuaas"}},
		SubjectKeyId:          sum[:20],
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              now.Add(CATTL),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("create CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse CA certificate: %w", err)
	}
	return &CA{Cert: cert, CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), Key: key}, nil
}

// ID is a CA's ID in the rotation table: the first 16 hex digits of the
// SHA-256 of its certificate.
func ID(c *x509.Certificate) string {
	sum := sha256.Sum256(c.Raw)
	return fmt.Sprintf("%x", sum[:8])
}

// SignedBy reports whether ca's key signed cert.
func SignedBy(cert, ca *x509.Certificate) bool {
	return cert.CheckSignatureFrom(ca) == nil
}

// ParseCertsPEM parses every certificate of a PEM bundle.
func ParseCertsPEM(b []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, errors.New("no PEM CERTIFICATE block")
	}
	return out, nil
}

// EncodeCertPEM encodes a certificate as a PEM block.
func EncodeCertPEM(c *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
}
