// Package client is the agent's side of the agent↔coordinator protocol
// (proto/agent-openapi.yaml): enrollment with a bootstrap token, then the
// node-credential routes — task long-poll and updates, readiness and
// topology reports, heartbeats and the node's approved slots. It tries the
// configured coordinators in turn; a problem response becomes a
// *proto.Error with its stable code.
package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/gpuaas/gpuaas/proto"
)

// Client talks to the coordinators for one node.
type Client struct {
	urls []string
	http *http.Client

	mu         sync.Mutex
	credential string
	cert       *tls.Certificate // the node's client certificate (mutual TLS)
	roots      *x509.CertPool   // the CAs coordinators' certificates chain to (nil: system roots)
	next       int              // index of the coordinator to try first
	// unavailableWait is how long to wait before asking a coordinator
	// that answered 503 unavailable again (see do; 0: the default).
	unavailableWait time.Duration
}

// defaultUnavailableWait is how long an agent waits (plus up to as much
// jitter) before asking again a coordinator that answered "unavailable".
const defaultUnavailableWait = 500 * time.Millisecond

// New returns a client for the coordinator base URLs.
func New(urls []string, credential string) (*Client, error) {
	if len(urls) == 0 {
		return nil, errors.New("agent client: no coordinator URL")
	}
	for _, u := range urls {
		if p, err := url.Parse(u); err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
			return nil, fmt.Errorf("agent client: %q is not an http(s) URL", u)
		}
	}
	return &Client{urls: append([]string(nil), urls...), credential: credential,
		http: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2, IdleConnTimeout: 90 * time.Second}}}, nil
}

// UseTLS makes the client check the coordinators' certificates against
// pool (the cluster CA; nil: the system roots) and present the node's
// client certificate (SetCertificate) when a coordinator asks for one.
// SetRoots changes the pool later (a CA rotation).
func (c *Client) UseTLS(pool *x509.CertPool) {
	c.mu.Lock()
	c.roots = pool
	c.mu.Unlock()
	t := c.http.Transport.(*http.Transport)
	t.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12,
		// The chain and host name are verified in VerifyConnection against
		// the pool in use at each handshake.
		InsecureSkipVerify: true, //nolint:gosec // verified in VerifyConnection
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("the coordinator presented no certificate")
			}
			inter := x509.NewCertPool()
			for _, ic := range cs.PeerCertificates[1:] {
				inter.AddCert(ic)
			}
			_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: c.Roots(), Intermediates: inter,
				DNSName: cs.ServerName, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
			if err != nil {
				return fmt.Errorf("coordinator certificate: %w", err)
			}
			return nil
		},
		GetClientCertificate: func(cri *tls.CertificateRequestInfo) (*tls.Certificate, error) {
			// An expired certificate, or one of a CA the coordinator no
			// longer trusts (a retired CA), would fail the handshake: the
			// renewal route takes the credential alone.
			if cert := c.Certificate(); cert != nil && (cert.Leaf == nil || time.Now().Before(cert.Leaf.NotAfter)) && cri.SupportsCertificate(cert) == nil {
				return cert, nil
			}
			return &tls.Certificate{}, nil // none yet: enrollment and renewal need none
		}}
	t.ForceAttemptHTTP2 = true
}

// SetDialContext makes the client open its connections with dial (a
// fleet simulator runs many agents in one process and closes one agent's
// connections to simulate its death).
func (c *Client) SetDialContext(dial func(ctx context.Context, network, addr string) (net.Conn, error)) {
	c.http.Transport.(*http.Transport).DialContext = dial
}

// SetRoots replaces the CAs the coordinators' certificates are checked
// against; idle connections are closed, so the next requests check them.
func (c *Client) SetRoots(pool *x509.CertPool) {
	c.mu.Lock()
	c.roots = pool
	c.mu.Unlock()
	c.http.CloseIdleConnections()
}

// Roots returns the CAs in use (nil: the system roots).
func (c *Client) Roots() *x509.CertPool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.roots
}

// SetCertificate sets the node's client certificate. Idle connections
// (opened with the previous one, or none) are closed: the next requests
// open connections that present it.
func (c *Client) SetCertificate(cert *tls.Certificate) {
	c.mu.Lock()
	c.cert = cert
	c.mu.Unlock()
	c.http.CloseIdleConnections()
}

// Certificate returns the node's client certificate (nil: none).
func (c *Client) Certificate() *tls.Certificate {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cert
}

// SetCredential sets the node credential used by the node routes.
func (c *Client) SetCredential(cred string) {
	c.mu.Lock()
	c.credential = cred
	c.mu.Unlock()
}

// Credential returns the node credential.
func (c *Client) Credential() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.credential
}

// TransportError is a failure to reach any coordinator.
type TransportError struct{ Err error }

func (e *TransportError) Error() string { return "coordinator unreachable: " + e.Err.Error() }
func (e *TransportError) Unwrap() error { return e.Err }

// do sends one request, trying each coordinator once on a transport error
// or a 503, starting with the last one that answered.
func (c *Client) do(ctx context.Context, method, path string, auth bool, in, out any) error {
	var body []byte
	if in != nil {
		var err error
		if body, err = json.Marshal(in); err != nil {
			return fmt.Errorf("%s %s: encode: %w", method, path, err)
		}
	}
	c.mu.Lock()
	start, cred := c.next, c.credential
	c.mu.Unlock()
	var lastErr error
	retried := false
	for i := 0; i < len(c.urls); i++ {
		k := (start + i) % len(c.urls)
		req, err := http.NewRequestWithContext(ctx, method, c.urls[k]+path, bytes.NewReader(body))
		if err != nil {
			return fmt.Errorf("%s %s: %w", method, path, err)
		}
		if in != nil {
			req.Header.Set("Content-Type", "application/json")
		}
		if auth {
			req.Header.Set("Authorization", "Bearer "+cred)
		}
		resp, err := c.http.Do(req)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			lastErr = &TransportError{Err: err}
			continue
		}
		err = decode(resp, out)
		if proto.CodeOf(err) == proto.CodeUnavailable && !retried {
			// The coordinator is up but has no leader: an election, as a
			// rule, which every replica waits out alike. Ask it again
			// after a short wait before moving on: at 10,000 agents,
			// moving at once sends thousands of new TLS handshakes to the
			// other replicas in the middle of the election. A replica cut
			// off from the majority answers the same again, and then the
			// next is tried.
			retried = true
			if !sleepCtx(ctx, c.waitUnavailable()) {
				return ctx.Err()
			}
			i--
			continue
		}
		retried = false
		if proto.CodeOf(err) == proto.CodeUnavailable || proto.CodeOf(err) == proto.CodeNotLeader {
			lastErr = err
			continue
		}
		c.mu.Lock()
		c.next = k
		c.mu.Unlock()
		if err != nil {
			return fmt.Errorf("%s %s: %w", method, path, err)
		}
		return nil
	}
	return fmt.Errorf("%s %s: %w", method, path, lastErr)
}

// waitUnavailable is the wait before asking a coordinator that answered
// "unavailable" again, with up to as much jitter.
func (c *Client) waitUnavailable() time.Duration {
	d := c.unavailableWait
	if d <= 0 {
		d = defaultUnavailableWait
	}
	return d + rand.N(d)
}

// sleepCtx waits d; false when ctx ended first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func decode(resp *http.Response, out any) error {
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return &TransportError{Err: err}
	}
	if resp.StatusCode >= 300 {
		var p struct {
			Code   proto.Code `json:"code"`
			Detail string     `json:"detail"`
		}
		if json.Unmarshal(b, &p) == nil && p.Code != "" {
			return &proto.Error{Code: p.Code, Detail: p.Detail}
		}
		code := proto.CodeInternal
		if resp.StatusCode == http.StatusServiceUnavailable {
			code = proto.CodeUnavailable
		}
		return &proto.Error{Code: code, Detail: fmt.Sprintf("HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(b)))}
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("decode response: %w", err)
	}
	return nil
}

// Enroll exchanges a bootstrap token for the node credential and keeps it.
func (c *Client) Enroll(ctx context.Context, nodeID, token, hostname string) (proto.EnrollResponse, error) {
	return c.EnrollCSR(ctx, nodeID, token, hostname, "")
}

// RenewCertificate asks for a new client certificate from a CSR.
func (c *Client) RenewCertificate(ctx context.Context, csrPEM string) (proto.CertificateResponse, error) {
	var r proto.CertificateResponse
	err := c.do(ctx, http.MethodPost, proto.AgentCertificatePath, true, proto.CertificateRequest{CSR: csrPEM}, &r)
	return r, err
}

// EnrollCSR is Enroll that also asks for a client certificate from a
// CSR (PEM; "" for none).
func (c *Client) EnrollCSR(ctx context.Context, nodeID, token, hostname, csrPEM string) (proto.EnrollResponse, error) {
	var r proto.EnrollResponse
	err := c.do(ctx, http.MethodPost, proto.AgentEnrollPath, false, proto.EnrollRequest{NodeID: nodeID, BootstrapToken: token, Hostname: hostname, CSR: csrPEM}, &r)
	if err != nil {
		return r, fmt.Errorf("enroll %s: %w", nodeID, err)
	}
	c.SetCredential(r.Credential)
	return r, nil
}

// Tasks long-polls the node's pending tasks changed after index.
func (c *Client) Tasks(ctx context.Context, index uint64, wait time.Duration) (proto.AgentTasksResponse, error) {
	return c.tasks(ctx, index, wait, nil)
}

// TasksIngress is Tasks passing the node's wanted ingress digest the
// caller knows (?ingress=): the poll also ends when the node's differs,
// and the answer carries the node's (IngressDigest).
func (c *Client) TasksIngress(ctx context.Context, index uint64, wait time.Duration, digest string) (proto.AgentTasksResponse, error) {
	return c.tasks(ctx, index, wait, &digest)
}

// tasks is Tasks; with ingress set it passes ?ingress=.
func (c *Client) tasks(ctx context.Context, index uint64, wait time.Duration, ingress *string) (proto.AgentTasksResponse, error) {
	var r proto.AgentTasksResponse
	q := url.Values{}
	q.Set("index", strconv.FormatUint(index, 10))
	q.Set("wait", wait.String())
	if ingress != nil {
		q.Set("ingress", *ingress)
	}
	err := c.do(ctx, http.MethodGet, proto.AgentTasksPath+"?"+q.Encode(), true, nil, &r)
	return r, err
}

// UpdateTask reports progress or the result of a task.
func (c *Client) UpdateTask(ctx context.Context, id string, u proto.AgentTaskUpdate) error {
	if strings.ContainsAny(id, "/?#") {
		return fmt.Errorf("update task: bad task ID %q", id)
	}
	return c.do(ctx, http.MethodPost, proto.AgentTasksPath+"/"+id, true, u, nil)
}

// PutReadiness reports readiness.
func (c *Client) PutReadiness(ctx context.Context, r proto.Readiness) error {
	return c.do(ctx, http.MethodPut, proto.AgentReadinessPath, true, r, nil)
}

// PutTopology reports a candidate topology.
func (c *Client) PutTopology(ctx context.Context, t proto.CandidateTopology) error {
	return c.do(ctx, http.MethodPut, proto.AgentTopologyPath, true, t, nil)
}

// Heartbeat tells the coordinator the agent is alive and returns the live
// claims on the node.
func (c *Client) Heartbeat(ctx context.Context, req proto.HeartbeatRequest) (proto.HeartbeatResponse, error) {
	var r proto.HeartbeatResponse
	err := c.do(ctx, http.MethodPost, proto.AgentHeartbeatPath, true, req, &r)
	return r, err
}

// Slots returns the node's approved slots with their live claims.
func (c *Client) Slots(ctx context.Context) ([]proto.AgentSlot, error) {
	var r []proto.AgentSlot
	err := c.do(ctx, http.MethodGet, "/v1/agent/slots", true, nil, &r)
	return r, err
}

// GetBlob starts a download of a coordinator blob (an image's URL path,
// e.g. /v1/images/NAME/VERSION/blob) with the node credential, from
// offset on (a Range request when offset > 0). It tries each coordinator
// in turn while one is unreachable, unavailable or lacks the blob (404);
// the caller reads and closes the returned response (200, 206 or 416).
func (c *Client) GetBlob(ctx context.Context, path string, offset int64) (*http.Response, error) {
	if !strings.HasPrefix(path, "/v1/") || strings.ContainsAny(path, "?#") || strings.Contains(path, "..") {
		return nil, fmt.Errorf("get blob: %q is not a coordinator blob path", path)
	}
	c.mu.Lock()
	start, cred := c.next, c.credential
	c.mu.Unlock()
	var lastErr error
	for i := range c.urls {
		k := (start + i) % len(c.urls)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.urls[k]+path, nil)
		if err != nil {
			return nil, fmt.Errorf("get blob %s: %w", path, err)
		}
		req.Header.Set("Authorization", "Bearer "+cred)
		if offset > 0 {
			req.Header.Set("Range", "bytes="+strconv.FormatInt(offset, 10)+"-")
		}
		resp, err := c.http.Do(req)
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			lastErr = &TransportError{Err: err}
			continue
		}
		switch resp.StatusCode {
		case http.StatusOK, http.StatusPartialContent, http.StatusRequestedRangeNotSatisfiable:
			c.mu.Lock()
			c.next = k
			c.mu.Unlock()
			return resp, nil
		}
		err = decode(resp, nil)
		lastErr = fmt.Errorf("%s: %w", c.urls[k], err)
		switch proto.CodeOf(err) {
		case proto.CodeUnavailable, proto.CodeNotLeader, proto.CodeNotFound:
			continue
		}
		return nil, fmt.Errorf("get blob %s: %w", path, lastErr)
	}
	return nil, fmt.Errorf("get blob %s: %w", path, lastErr)
}

// URLs returns the coordinators' base URLs.
func (c *Client) URLs() []string { return append([]string(nil), c.urls...) }

// DialAppProxy parks a workload proxy connection on the coordinator at
// base (one of URLs).
func (c *Client) DialAppProxy(ctx context.Context, base string) (*websocket.Conn, error) {
	h := http.Header{}
	h.Set("Authorization", "Bearer "+c.Credential())
	conn, resp, err := websocket.Dial(ctx, strings.TrimRight(base, "/")+proto.AgentAppProxyPath, &websocket.DialOptions{HTTPClient: c.http, HTTPHeader: h})
	if err != nil {
		if resp != nil {
			return nil, fmt.Errorf("park an app proxy connection on %s: HTTP %d: %w", base, resp.StatusCode, err)
		}
		return nil, fmt.Errorf("park an app proxy connection on %s: %w", base, err)
	}
	return conn, nil
}

// DialConsole dials the console gateway of a session back: gateway is the
// API address the session names (host:port or a URL). When it is one of
// this client's coordinators, that coordinator's URL is used (its scheme
// and transport); otherwise a bare host:port gets the scheme of the
// agent's coordinators.
func (c *Client) DialConsole(ctx context.Context, gateway, session string) (*websocket.Conn, error) {
	if err := proto.ValidateID("console session id", session); err != nil {
		return nil, fmt.Errorf("dial console: %w", err)
	}
	base := gateway
	host := gateway
	if u, err := url.Parse(gateway); err == nil && u.Host != "" {
		host = u.Host
	} else {
		// A bare host:port: the scheme the agent uses for its
		// coordinators (https unless the cluster runs -insecure-http).
		scheme := "https"
		if len(c.urls) > 0 {
			if p, err := url.Parse(c.urls[0]); err == nil && p.Scheme != "" {
				scheme = p.Scheme
			}
		}
		base = scheme + "://" + gateway
	}
	for _, u := range c.urls {
		if p, err := url.Parse(u); err == nil && p.Host == host {
			base = strings.TrimRight(u, "/")
			break
		}
	}
	if p, err := url.Parse(base); err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
		return nil, fmt.Errorf("dial console: gateway %q is not an http(s) address", gateway)
	}
	h := http.Header{}
	h.Set("Authorization", "Bearer "+c.Credential())
	conn, resp, err := websocket.Dial(ctx, base+proto.AgentConsolePath+"/"+url.PathEscape(session), &websocket.DialOptions{HTTPClient: c.http, HTTPHeader: h})
	if err != nil {
		if resp != nil {
			return nil, fmt.Errorf("dial console gateway %s for session %s: HTTP %d: %w", base, session, resp.StatusCode, err)
		}
		return nil, &TransportError{Err: fmt.Errorf("dial console gateway %s for session %s: %w", base, session, err)}
	}
	return conn, nil
}
