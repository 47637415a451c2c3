package server

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/hashicorp/raft"

	"github.com/gpuaas/gpuaas/coordinator/pki"
)

// TLSConfig is a coordinator's share of the cluster CA.
type TLSConfig struct {
	// CA is the cluster CA (certificate and key: every coordinator signs
	// agent certificates when it leads).
	CA *pki.CA
	// Cert is this server's serving and peer certificate (server role,
	// issued by CA).
	Cert tls.Certificate
	// NodeCertTTL is the lifetime of the agent certificates this server
	// signs (default pki.DefaultNodeTTL).
	NodeCertTTL time.Duration
}

func (c *TLSConfig) validate() error {
	if c.CA == nil {
		return errors.New("config: TLS needs the cluster CA")
	}
	if c.Cert.Leaf == nil {
		return errors.New("config: TLS needs this server's certificate")
	}
	if _, _, err := pki.Verify(c.CA.Pool(), c.Cert.Leaf, time.Now(), x509.ExtKeyUsageServerAuth); err != nil {
		return fmt.Errorf("config: server certificate: %w", err)
	}
	if c.NodeCertTTL < 0 || c.NodeCertTTL > pki.MaxNodeTTL {
		return fmt.Errorf("config: node certificate lifetime %s is outside (0, %s]", c.NodeCertTTL, pki.MaxNodeTTL)
	}
	return nil
}

// TLS returns the server's TLS material (nil: plain, -insecure-http).
func (s *Server) TLS() *TLSConfig { return s.cfg.TLS }

// Scheme is the scheme of the coordinators' HTTP API: https, or http
// when the cluster runs without TLS.
func (s *Server) Scheme() string {
	if s.cfg.TLS == nil {
		return "http"
	}
	return "https"
}

// URL is the base URL of a peer's HTTP address.
func (s *Server) URL(httpAddr string) string { return s.Scheme() + "://" + httpAddr }

// PeerTransport is the HTTP transport for calls to other coordinators
// (join, forwarding): mutual TLS with this server's certificate, and only
// a coordinator certificate of the CA is accepted.
func (s *Server) PeerTransport() *http.Transport {
	t := &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: 90 * time.Second, ForceAttemptHTTP2: true}
	if s.cfg.TLS != nil {
		t.TLSClientConfig = pki.PeerClientConfig(s.cfg.TLS.CA.Pool(), s.cfg.TLS.Cert)
	}
	return t
}

// tlsStreamLayer is Raft's stream layer over mutual TLS: both ends
// present a coordinator certificate of the cluster CA.
type tlsStreamLayer struct {
	net.Listener
	advertise net.Addr
	client    *tls.Config
}

func newTLSStreamLayer(bind string, advertise net.Addr, c *TLSConfig) (*tlsStreamLayer, error) {
	ln, err := net.Listen("tcp", bind)
	if err != nil {
		return nil, err
	}
	if advertise == nil {
		advertise = ln.Addr()
	}
	if a, ok := advertise.(*net.TCPAddr); !ok || a.IP == nil || a.IP.IsUnspecified() {
		ln.Close()
		return nil, fmt.Errorf("raft address %s is not advertisable: set the raft advertise address", advertise)
	}
	pool := c.CA.Pool()
	return &tlsStreamLayer{
		Listener:  tls.NewListener(ln, pki.PeerServerConfig(pool, c.Cert)),
		advertise: advertise,
		client:    pki.PeerClientConfig(pool, c.Cert),
	}, nil
}

// Dial implements raft.StreamLayer.
func (l *tlsStreamLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	d := &net.Dialer{Timeout: timeout}
	conn, err := tls.DialWithDialer(d, "tcp", string(address), l.client)
	if err != nil {
		return nil, fmt.Errorf("raft dial %s: %w", address, err)
	}
	return conn, nil
}

// Addr implements net.Listener: the advertised address.
func (l *tlsStreamLayer) Addr() net.Addr { return l.advertise }
