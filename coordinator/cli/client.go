package cli

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/coordinator/pki"
	"github.com/gpuaas/gpuaas/proto"
)

// Client calls the operator API.
type Client struct {
	Base  *url.URL // e.g. http://127.0.0.1:7300
	Token string
	HTTP  *http.Client
}

// ProblemError is an API error answer (application/problem+json).
type ProblemError struct {
	proto.Problem
	RetryAfter string // the Retry-After header, "" when absent
}

func (e *ProblemError) Error() string {
	s := fmt.Sprintf("%s (%s, HTTP %d): %s", e.Title, e.Code, e.Status, e.Detail)
	if e.RequestID != "" {
		s += " [request " + e.RequestID + "]"
	}
	return s
}

// ParseAddr accepts "host:port" (https) or an http(s) URL.
func ParseAddr(addr string) (*url.URL, error) {
	if addr == "" {
		return nil, fmt.Errorf("no API address: set --addr or GPUAAS_ADDR")
	}
	if !strings.Contains(addr, "://") {
		addr = "https://" + addr
	}
	u, err := url.Parse(addr)
	if err != nil {
		return nil, fmt.Errorf("API address %q: %w", addr, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("API address %q must be host:port or an http(s) URL", addr)
	}
	return u, nil
}

// HTTPClient is an HTTP client that trusts the CA certificates in caFile
// (the cluster CA) instead of the system roots.
func HTTPClient(caFile string) (*http.Client, error) {
	pool, err := pki.LoadPool(caFile)
	if err != nil {
		return nil, err
	}
	return &http.Client{Transport: &http.Transport{Proxy: http.ProxyFromEnvironment, TLSClientConfig: pki.ClientConfig(pool, nil),
		ForceAttemptHTTP2: true, MaxIdleConnsPerHost: 16, IdleConnTimeout: 90 * time.Second}}, nil
}

// tlsHint says what to do about the TLS errors a user meets first.
func tlsHint(err error) string {
	var ua x509.UnknownAuthorityError
	var cv *tls.CertificateVerificationError
	switch {
	case errors.As(err, &ua) || (errors.As(err, &cv) && strings.Contains(cv.Error(), "unknown authority")):
		return " (trust the cluster CA: --ca-file or GPUAAS_CA_FILE, e.g. .lab/ca-bundle.pem in the lab or <data-dir>/tls/ca.pem; after a CA rotation (gpuaasctl ca rotate|activate|retire) the current bundle: gpuaasctl ca bundle --out FILE while a trusted CA is still served, or the \"trusted\" list of a coordinator's <data-dir>/tls/rotation.json)"
	case strings.Contains(err.Error(), "server gave HTTP response to HTTPS client"):
		return " (this coordinator runs -insecure-http: use an http:// address)"
	}
	return ""
}

// NewClient is a client of the API at addr (host:port or URL) trusting
// the CA in caFile ("" : the system roots).
func NewClient(addr, token, caFile string) (*Client, error) {
	u, err := ParseAddr(addr)
	if err != nil {
		return nil, err
	}
	c := &Client{Base: u, Token: token}
	if caFile != "" {
		if c.HTTP, err = HTTPClient(caFile); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// pathEscape escapes one path segment (an ID typed by the operator).
func pathEscape(s string) string { return url.PathEscape(s) }

// Response is a successful answer.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
}

// RawBody is a request body sent as is (not JSON-encoded), e.g. a bundle.
type RawBody struct {
	ContentType string
	Data        []byte
}

// Do sends one request. body is nil, a RawBody sent as is, or a value sent as JSON. A non-2xx
// answer is returned as *ProblemError when it is a problem body, else as
// a plain error naming the status.
func (c *Client) Do(ctx context.Context, method, path string, q url.Values, body any, hdr http.Header) (*Response, error) {
	res, err := c.send(ctx, method, path, q, body, hdr)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	return answer(res, method, path)
}

// answer reads a response into a Response, or a non-2xx one into
// answerError's error.
func answer(res *http.Response, method, path string) (*Response, error) {
	b, err := io.ReadAll(io.LimitReader(res.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("%s %s: read answer: %w", method, path, err)
	}
	if res.StatusCode >= 300 {
		return nil, answerError(method, path, res, b)
	}
	return &Response{Status: res.StatusCode, Header: res.Header, Body: b}, nil
}

// Stream sends a GET and copies a 2xx answer's body to w as it arrives
// (an export of any size); errors are Do's.
func (c *Client) Stream(ctx context.Context, path string, q url.Values, w io.Writer) error {
	res, err := c.send(ctx, http.MethodGet, path, q, nil, nil)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	if res.StatusCode >= 300 {
		b, _ := io.ReadAll(io.LimitReader(res.Body, 1<<20))
		return answerError(http.MethodGet, path, res, b)
	}
	if _, err := io.Copy(w, res.Body); err != nil {
		return fmt.Errorf("GET %s: read answer: %w", path, err)
	}
	return nil
}

// answerError turns a non-2xx answer into *ProblemError or a plain error.
func answerError(method, path string, res *http.Response, b []byte) error {
	var p proto.Problem
	if strings.HasPrefix(res.Header.Get("Content-Type"), proto.ProblemContentType) && json.Unmarshal(b, &p) == nil && p.Code != "" {
		return &ProblemError{Problem: p, RetryAfter: res.Header.Get("Retry-After")}
	}
	return fmt.Errorf("%s %s: HTTP %d: %s", method, path, res.StatusCode, strings.TrimSpace(string(truncate(b, 300))))
}

// send builds and sends one request; the caller closes the body.
func (c *Client) send(ctx context.Context, method, path string, q url.Values, body any, hdr http.Header) (*http.Response, error) {
	// path is already escaped (IDs go through pathEscape).
	u := *c.Base
	raw := strings.TrimSuffix(c.Base.EscapedPath(), "/") + path
	unescaped, err := url.PathUnescape(raw)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	u.Path, u.RawPath = unescaped, raw
	if len(q) > 0 {
		u.RawQuery = q.Encode()
	}
	var rd io.Reader
	ctype := "application/json"
	if raw, ok := body.(RawBody); ok {
		rd, ctype = bytes.NewReader(raw.Data), raw.ContentType
	} else if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, fmt.Errorf("encode %s %s body: %w", method, path, err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	for k, vs := range hdr {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	if body != nil {
		req.Header.Set("Content-Type", ctype)
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("Authorization", "Bearer "+c.Token)
	res, err := c.httpClient().Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w%s", method, u.Redacted(), err, tlsHint(err))
	}
	return res, nil
}

// httpClient is c.HTTP, or http.DefaultClient without one.
func (c *Client) httpClient() *http.Client {
	if c.HTTP == nil {
		return http.DefaultClient
	}
	return c.HTTP
}

func truncate(b []byte, n int) []byte {
	if len(b) > n {
		return append(b[:n:n], "..."...)
	}
	return b
}

// decode unmarshals a response body.
func decode[T any](r *Response) (T, error) {
	var v T
	if err := json.Unmarshal(r.Body, &v); err != nil {
		return v, fmt.Errorf("decode answer: %w", err)
	}
	return v, nil
}

// IsProblem reports whether err is an API problem with code.
func IsProblem(err error, code proto.Code) bool {
	var pe *ProblemError
	return errors.As(err, &pe) && pe.Code == code
}
