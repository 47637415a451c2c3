package server

import (
	"bufio"
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/gpuaas/gpuaas/coordinator/enroll"
	"github.com/gpuaas/gpuaas/coordinator/pki"
	"github.com/gpuaas/gpuaas/proto"
)

// TLSConfig is a coordinator's share of the cluster CA.
type TLSConfig struct {
	// CA is the cluster CA the server starts with (certificate and key:
	// every coordinator signs agent certificates when it leads).
	CA *pki.CA
	// Cert is this server's serving and peer certificate (server role,
	// issued by CA).
	Cert tls.Certificate
	// NodeCertTTL is the lifetime of the agent certificates this server
	// signs (default pki.DefaultNodeTTL).
	NodeCertTTL time.Duration
	// Trusted are CAs trusted beside CA at start (a rotation in progress,
	// kept in <data-dir>/tls/rotation.json).
	Trusted []*x509.Certificate

	// live is the material in use: CA at start, then whatever the
	// replicated rotation table says (ca.go). Read at every handshake.
	live atomic.Pointer[tlsLive]
}

// tlsLive is the TLS material in use.
type tlsLive struct {
	active  *pki.CA             // signs agent certificates
	trusted []*x509.Certificate // every CA trusted, active first
	pool    *x509.CertPool
	cert    *tls.Certificate // this server's
	bundle  []byte           // PEM of trusted
	version string           // the rotation table's bundle version ("" before any)
}

func newTLSLive(active *pki.CA, trusted []*x509.Certificate, cert *tls.Certificate, version string) *tlsLive {
	l := &tlsLive{active: active, cert: cert, version: version, pool: x509.NewCertPool()}
	seen := map[string]bool{}
	for _, c := range append([]*x509.Certificate{active.Cert}, trusted...) {
		if id := pki.ID(c); !seen[id] {
			seen[id] = true
			l.trusted = append(l.trusted, c)
			l.pool.AddCert(c)
			l.bundle = append(l.bundle, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
		}
	}
	return l
}

func (c *TLSConfig) cur() *tlsLive {
	if l := c.live.Load(); l != nil {
		return l
	}
	cert := c.Cert
	c.live.CompareAndSwap(nil, newTLSLive(c.CA, c.Trusted, &cert, ""))
	return c.live.Load()
}

// Active is the CA that signs now.
func (c *TLSConfig) Active() *pki.CA { return c.cur().active }

// Pool holds every CA trusted now.
func (c *TLSConfig) Pool() *x509.CertPool { return c.cur().pool }

// Certificate is this server's certificate now.
func (c *TLSConfig) Certificate() *tls.Certificate { return c.cur().cert }

// BundlePEM is every CA trusted now, PEM.
func (c *TLSConfig) BundlePEM() []byte { return c.cur().bundle }

// BundleVersion is the rotation table's bundle version in use.
func (c *TLSConfig) BundleVersion() string { return c.cur().version }

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
		t.TLSClientConfig = pki.PeerClientConfigFrom(s.cfg.TLS)
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
	return &tlsStreamLayer{
		Listener:  tls.NewListener(ln, pki.PeerServerConfigFrom(c)),
		advertise: advertise,
		client:    pki.PeerClientConfigFrom(c),
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

// CAPath is the internal route that hands the cluster CA to a server
// joining with a join token (or the cluster secret) and no CA of its own.
const CAPath = "/v1/internal/ca"

// CA hand-over. The joiner does not know the CA yet, so it cannot check
// the responder's certificate; both sides instead prove they know the
// credential without sending it, bound to this very TLS connection: each
// sends HMAC-SHA256(key, label || exported keying material), key being the
// hex SHA-256 of the join token or cluster secret (what the replicated
// table keeps). A man in the middle has two TLS sessions with different
// keying material and no key, so it can neither answer nor relay.
const (
	caProofEKMLabel = "EXPORTER-gpuaas-ca-handover"
	caProofClient   = "joiner"
	caProofServer   = "cluster"
)

// CARequest is the body of POST /v1/internal/ca.
type CARequest struct {
	ServerID string `json:"server_id"`
	Proof    string `json:"proof"` // hex HMAC of caProofClient
}

// CAResponse hands over the cluster CA.
type CAResponse struct {
	CACert string `json:"ca_cert"`
	CAKey  string `json:"ca_key"`
	Proof  string `json:"proof"` // hex HMAC of caProofServer
}

// CAProof is the proof of knowing the credential whose hash is keyHash on
// the TLS connection cs, from side (caProofClient or caProofServer).
func CAProof(cs *tls.ConnectionState, keyHash, side string) (string, error) {
	ekm, err := cs.ExportKeyingMaterial(caProofEKMLabel, nil, 32)
	if err != nil {
		return "", fmt.Errorf("tls keying material: %w", err)
	}
	m := hmac.New(sha256.New, []byte(keyHash))
	m.Write([]byte(side))
	m.Write(ekm)
	return hex.EncodeToString(m.Sum(nil)), nil
}

func (s *Server) handleCA(w http.ResponseWriter, r *http.Request) {
	var req CARequest
	dec := json.NewDecoder(io.LimitReader(r.Body, 4<<10))
	dec.DisallowUnknownFields()
	refuse := func(err error) {
		s.log.Warn("CA hand-over refused", "server", req.ServerID, "remote", r.RemoteAddr, "err", err)
		writeProblem(w, err)
	}
	if err := dec.Decode(&req); err != nil {
		refuse(proto.Errorf(proto.CodeInvalidArgument, "ca request body: %v", err))
		return
	}
	if err := proto.ValidateID("server_id", req.ServerID); err != nil {
		refuse(err)
		return
	}
	if s.cfg.TLS == nil || r.TLS == nil {
		refuse(proto.Errorf(proto.CodeInvalidArgument, "this server runs without TLS (-insecure-http): it has no CA to hand over"))
		return
	}
	keys := s.fsm.joinTokenHashesFor(req.ServerID, s.cfg.Now().UTC())
	if s.cfg.ClusterSecret != "" {
		keys = append(keys, enroll.Hash(s.cfg.ClusterSecret))
	}
	var key string
	for _, k := range keys {
		want, err := CAProof(r.TLS, k, caProofClient)
		if err == nil && hmac.Equal([]byte(want), []byte(req.Proof)) {
			key = k
			break
		}
	}
	if key == "" {
		refuse(proto.Errorf(proto.CodeUnauthenticated, "the proof matches no join token for server %s nor the cluster secret", req.ServerID))
		return
	}
	proof, err := CAProof(r.TLS, key, caProofServer)
	if err != nil {
		refuse(err)
		return
	}
	active := s.cfg.TLS.Active()
	keyPEM, err := pki.EncodeKeyPEM(active.Key)
	if err != nil {
		refuse(err)
		return
	}
	s.log.Info("handed the cluster CA to a joining server", "server", req.ServerID, "remote", r.RemoteAddr)
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(CAResponse{CACert: string(active.CertPEM), CAKey: string(keyPEM), Proof: proof})
}

// FetchCA gets the cluster CA from one of addrs (the join addresses) for a
// server joining with credential (its join token, or the cluster secret),
// retrying every second until one answers or ctx ends.
func FetchCA(ctx context.Context, addrs []string, serverID, credential string, log *slog.Logger) (*pki.CA, error) {
	if len(addrs) == 0 {
		return nil, errors.New("fetch the cluster CA: no join address")
	}
	keyHash := enroll.Hash(credential)
	for {
		var errs []error
		for _, a := range addrs {
			ca, err := fetchCAFrom(ctx, a, serverID, keyHash)
			if err == nil {
				log.Info("got the cluster CA from a peer", "peer", a)
				return ca, nil
			}
			errs = append(errs, err)
			if proto.CodeOf(err) == proto.CodeUnauthenticated {
				return nil, err // a wrong token stays wrong
			}
		}
		log.Warn("fetch the cluster CA: no peer answered yet; retrying", "err", errors.Join(errs...))
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("fetch the cluster CA from %v: %w (last: %v)", addrs, ctx.Err(), errors.Join(errs...))
		case <-time.After(time.Second):
		}
	}
}

func fetchCAFrom(ctx context.Context, addr, serverID, keyHash string) (*pki.CA, error) {
	// The responder's certificate cannot be checked before the CA is
	// known: the proofs authenticate the connection, and the certificate
	// is checked against the CA received.
	d := tls.Dialer{NetDialer: &net.Dialer{Timeout: 5 * time.Second},
		Config: &tls.Config{MinVersion: pki.MinVersion, InsecureSkipVerify: true, NextProtos: []string{"http/1.1"}}} //nolint:gosec // see above
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("fetch CA from %s: %w", addr, err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	cs := conn.(*tls.Conn).ConnectionState()
	proof, err := CAProof(&cs, keyHash, caProofClient)
	if err != nil {
		return nil, err
	}
	body, err := json.Marshal(CARequest{ServerID: serverID, Proof: proof})
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "https://"+addr+CAPath, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if err := req.Write(conn); err != nil {
		return nil, fmt.Errorf("fetch CA from %s: %w", addr, err)
	}
	res, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		return nil, fmt.Errorf("fetch CA from %s: %w", addr, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, 64<<10))
	if err != nil {
		return nil, fmt.Errorf("fetch CA from %s: %w", addr, err)
	}
	if res.StatusCode != http.StatusOK {
		var p struct {
			Code   proto.Code `json:"code"`
			Detail string     `json:"detail"`
		}
		if json.Unmarshal(b, &p) == nil && p.Code != "" {
			return nil, &proto.Error{Code: p.Code, Detail: fmt.Sprintf("fetch CA from %s: %s", addr, p.Detail)}
		}
		return nil, fmt.Errorf("fetch CA from %s: %s", addr, res.Status)
	}
	var out CAResponse
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, fmt.Errorf("fetch CA from %s: %w", addr, err)
	}
	want, err := CAProof(&cs, keyHash, caProofServer)
	if err != nil {
		return nil, err
	}
	if !hmac.Equal([]byte(want), []byte(out.Proof)) {
		return nil, fmt.Errorf("fetch CA from %s: the responder does not prove knowing the credential (a man in the middle?)", addr)
	}
	ca, err := pki.ParseCA([]byte(out.CACert), []byte(out.CAKey))
	if err != nil {
		return nil, fmt.Errorf("fetch CA from %s: %w", addr, err)
	}
	if len(cs.PeerCertificates) == 0 {
		return nil, fmt.Errorf("fetch CA from %s: no server certificate", addr)
	}
	if _, _, err := pki.Verify(ca.Pool(), cs.PeerCertificates[0], time.Now(), x509.ExtKeyUsageServerAuth); err != nil {
		return nil, fmt.Errorf("fetch CA from %s: its certificate does not chain to the CA it handed over: %w", addr, err)
	}
	return ca, nil
}
