package pki

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"time"
)

// MinVersion is the oldest TLS version any gpuaas endpoint speaks; Go
// negotiates 1.3 whenever both sides have it.
const MinVersion = tls.VersionTLS12

// APIServerConfig is the API listener's TLS: it serves cert and asks for
// (but does not require) a client certificate from the CA, which the
// agent routes and the peer routes then demand.
func APIServerConfig(pool *x509.CertPool, cert tls.Certificate) *tls.Config {
	return &tls.Config{
		MinVersion:   MinVersion,
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.VerifyClientCertIfGiven,
		ClientCAs:    pool,
		NextProtos:   []string{"h2", "http/1.1"},
	}
}

// ClientConfig trusts the CA (hostname verification as usual) and, when
// cert is not nil, presents it.
func ClientConfig(pool *x509.CertPool, cert *tls.Certificate) *tls.Config {
	c := &tls.Config{MinVersion: MinVersion, RootCAs: pool}
	if cert != nil {
		c.Certificates = []tls.Certificate{*cert}
	}
	return c
}

// PeerServerConfig is Raft's listener: mutual TLS, the client must
// present a coordinator (server role) certificate from the CA.
func PeerServerConfig(pool *x509.CertPool, cert tls.Certificate) *tls.Config {
	return &tls.Config{
		MinVersion:   MinVersion,
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    pool,
		VerifyPeerCertificate: func(_ [][]byte, chains [][]*x509.Certificate) error {
			if len(chains) == 0 || len(chains[0]) == 0 {
				return errors.New("no verified peer certificate")
			}
			return requireRole(chains[0][0], RoleServer)
		},
	}
}

// PeerClientConfig dials another coordinator (Raft, join, forwarding):
// it presents cert and accepts only a coordinator (server role)
// certificate from the CA. Coordinators are known by the CA and their
// role, not by host name: the addresses peers dial are whatever each
// advertises.
func PeerClientConfig(pool *x509.CertPool, cert tls.Certificate) *tls.Config {
	return &tls.Config{
		MinVersion:   MinVersion,
		Certificates: []tls.Certificate{cert},
		// The chain and role are verified below instead of the host name.
		InsecureSkipVerify:    true, //nolint:gosec // verified in VerifyPeerCertificate
		VerifyPeerCertificate: peerVerifier(func() *x509.CertPool { return pool }),
	}
}

// peerVerifier checks a peer's chain against the pool pool returns and
// requires a coordinator (server role) certificate.
func peerVerifier(pool func() *x509.CertPool) func([][]byte, [][]*x509.Certificate) error {
	return func(raw [][]byte, _ [][]*x509.Certificate) error {
		if len(raw) == 0 {
			return errors.New("the peer presented no certificate")
		}
		leaf, err := x509.ParseCertificate(raw[0])
		if err != nil {
			return fmt.Errorf("peer certificate: %w", err)
		}
		inter := x509.NewCertPool()
		for _, r := range raw[1:] {
			if c, err := x509.ParseCertificate(r); err == nil {
				inter.AddCert(c)
			}
		}
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool(), Intermediates: inter, CurrentTime: time.Now(),
			KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			return fmt.Errorf("peer certificate %q: %w", leaf.Subject.CommonName, err)
		}
		return requireRole(leaf, RoleServer)
	}
}

func requireRole(c *x509.Certificate, want string) error {
	if role, _, ok := Identity(c); !ok || role != want {
		return fmt.Errorf("certificate %q is not a %s certificate of the cluster CA", c.Subject.CommonName, want)
	}
	return nil
}

// Source is TLS material that may change while connections come and go
// (a CA rotation): the CAs to trust and this end's certificate, read at
// every handshake.
type Source interface {
	Pool() *x509.CertPool
	Certificate() *tls.Certificate
}

// APIServerConfigFrom is APIServerConfig read from src at every
// handshake.
func APIServerConfigFrom(src Source) *tls.Config {
	return &tls.Config{
		MinVersion: MinVersion,
		NextProtos: []string{"h2", "http/1.1"},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return src.Certificate(), nil
		},
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return APIServerConfig(src.Pool(), *src.Certificate()), nil
		},
	}
}

// PeerServerConfigFrom is PeerServerConfig read from src at every
// handshake.
func PeerServerConfigFrom(src Source) *tls.Config {
	return &tls.Config{
		MinVersion: MinVersion,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return src.Certificate(), nil
		},
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return PeerServerConfig(src.Pool(), *src.Certificate()), nil
		},
	}
}

// PeerClientConfigFrom is PeerClientConfig read from src at every
// handshake.
func PeerClientConfigFrom(src Source) *tls.Config {
	c := PeerClientConfig(nil, tls.Certificate{})
	c.Certificates = nil
	c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		return src.Certificate(), nil
	}
	c.VerifyPeerCertificate = peerVerifier(src.Pool)
	return c
}
